//! DescribeConfigs (a topic's retention and size limits, as its event hub has them) and
//! CreateTopics (an event hub, for a credential with Manage on the namespace). Topic
//! configuration cannot be changed over Kafka (no AlterConfigs): every entry is read-only.

use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreateTopicsRequest};
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicResult, CreateTopicsResponse,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsRequest;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResponse, DescribeConfigsResult,
};
use kafka_protocol::protocol::StrBytes;
use tributary_broker::auth::Credential;
use tributary_broker::error::{Error, ErrorKind};
use tributary_broker::service::{
    CleanupPolicy, HubRecord, HubSettingsRequest, NewHubRequest, Service,
};

use crate::KafkaContext;
use crate::handlers::topic_id;

/// Kafka's resource type for topics (DescribeConfigs).
const RESOURCE_TOPIC: i8 = 2;
/// Config sources: set for this topic, or the cluster's default.
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;
/// Config types (DescribeConfigs v3+).
const TYPE_STRING: i8 = 2;
const TYPE_INT: i8 = 3;
const TYPE_LONG: i8 = 5;
const TYPE_LIST: i8 = 7;
/// Partitions a topic gets when CreateTopics leaves the count to the broker.
const PARTITIONS_DEFAULT: u32 = 4;

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_owned())
}

fn policy_name(policy: CleanupPolicy) -> &'static str {
    match policy {
        CleanupPolicy::Delete => "delete",
        CleanupPolicy::Compact => "compact",
        CleanupPolicy::DeleteOrCompact => "compact,delete",
    }
}

/// A topic's configuration entries: (name, value, source, type).
fn topic_configs(hub: &HubRecord, publish_bytes_max: usize) -> Vec<(&'static str, String, i8, i8)> {
    let retention_bytes = match hub.settings.retention_bytes_max {
        0 => -1,
        bytes => i64::try_from(bytes).unwrap_or(i64::MAX),
    };
    vec![
        (
            "retention.ms",
            hub.retention_ms.to_string(),
            SOURCE_TOPIC,
            TYPE_LONG,
        ),
        (
            "retention.bytes",
            retention_bytes.to_string(),
            SOURCE_TOPIC,
            TYPE_LONG,
        ),
        (
            "cleanup.policy",
            policy_name(hub.settings.cleanup_policy).to_string(),
            SOURCE_TOPIC,
            TYPE_LIST,
        ),
        (
            "max.message.bytes",
            publish_bytes_max.to_string(),
            SOURCE_DEFAULT,
            TYPE_INT,
        ),
        (
            "message.timestamp.type",
            "CreateTime".to_string(),
            SOURCE_DEFAULT,
            TYPE_STRING,
        ),
    ]
}

pub fn describe_configs(
    context: &KafkaContext,
    credential: &Credential,
    request: DescribeConfigsRequest,
) -> DescribeConfigsResponse {
    let service = context.node.service();
    let state = service.broker().runtime().state();
    let publish_bytes_max = service.broker().limits.publish_bytes_max;
    let mut response = DescribeConfigsResponse::default();
    response.results = request
        .resources
        .into_iter()
        .map(|resource| {
            let mut result = DescribeConfigsResult::default();
            result.resource_type = resource.resource_type;
            result.resource_name = resource.resource_name.clone();
            if resource.resource_type != RESOURCE_TOPIC {
                // Broker settings are the node's command line, not Kafka configs: none.
                return result;
            }
            let name = resource.resource_name.to_string();
            let hub = match state.hubs.get(&name) {
                Some(_) if service.granted_rights(credential, &name).is_err() => {
                    result.error_code = ResponseError::TopicAuthorizationFailed.code();
                    return result;
                }
                Some(hub) => hub,
                None => {
                    result.error_code = ResponseError::UnknownTopicOrPartition.code();
                    result.error_message = Some(text(&format!("no event hub named '{name}'")));
                    return result;
                }
            };
            let wanted = |key: &str| {
                resource
                    .configuration_keys
                    .as_ref()
                    .is_none_or(|keys| keys.is_empty() || keys.iter().any(|k| &**k == key))
            };
            result.configs = topic_configs(hub, publish_bytes_max)
                .into_iter()
                .filter(|(key, ..)| wanted(key))
                .map(|(key, value, source, kind)| {
                    let mut entry = DescribeConfigsResourceResult::default();
                    entry.name = text(key);
                    entry.value = Some(text(&value));
                    entry.read_only = true;
                    entry.config_source = source;
                    entry.config_type = kind;
                    entry
                })
                .collect();
            result
        })
        .collect();
    response
}

/// A CreateTopics topic as the event hub to create, or the Kafka error refusing it.
fn new_hub(topic: &CreatableTopic) -> Result<NewHubRequest, (ResponseError, String)> {
    let name = topic.name.0.to_string();
    let partition_count = match topic.num_partitions {
        -1 => PARTITIONS_DEFAULT,
        n if n > 0 => u32::try_from(n).unwrap_or(u32::MAX),
        n => {
            return Err((
                ResponseError::InvalidPartitions,
                format!("{n} partitions: give 1 or more (or -1 for {PARTITIONS_DEFAULT})"),
            ));
        }
    };
    let replication_factor = match topic.replication_factor {
        -1 => None,
        n => Some(u8::try_from(n).ok().filter(|n| *n > 0).ok_or_else(|| {
            (
                ResponseError::InvalidReplicationFactor,
                format!("a replication factor of {n}"),
            )
        })?),
    };
    if !topic.assignments.is_empty() {
        return Err((
            ResponseError::InvalidReplicaAssignment,
            "replica assignments are made by the cluster's placement: give a partition count \
             and replication factor instead"
                .to_string(),
        ));
    }
    let mut request = NewHubRequest {
        name,
        partition_count,
        replication_factor,
        ..NewHubRequest::default()
    };
    let mut settings = HubSettingsRequest::default();
    for config in &topic.configs {
        let value = config.value.as_deref().unwrap_or("");
        let invalid = |why: &str| {
            (
                ResponseError::InvalidConfig,
                format!("{}={value}: {why}", &*config.name),
            )
        };
        match &*config.name {
            "retention.ms" => {
                let ms: u64 = value
                    .parse()
                    .map_err(|_| invalid("milliseconds, 0 or more"))?;
                request.retention = Some(Duration::from_millis(ms));
            }
            "retention.bytes" => {
                let bytes: i64 = value.parse().map_err(|_| invalid("bytes, or -1"))?;
                settings.retention_bytes_max = u64::try_from(bytes).unwrap_or(0);
            }
            "cleanup.policy" => {
                let mut parts: Vec<&str> = value.split(',').map(str::trim).collect();
                parts.sort_unstable();
                settings.cleanup_policy = match parts.as_slice() {
                    ["delete"] => CleanupPolicy::Delete,
                    ["compact"] => CleanupPolicy::Compact,
                    ["compact", "delete"] => CleanupPolicy::DeleteOrCompact,
                    _ => return Err(invalid("delete, compact, or compact,delete")),
                };
            }
            _ => {
                return Err(invalid(
                    "not a setting event hubs have (retention.ms, retention.bytes and \
                     cleanup.policy are)",
                ));
            }
        }
    }
    request.settings = settings;
    Ok(request)
}

fn create_error(error: &Error) -> ResponseError {
    match error.kind {
        ErrorKind::AlreadyExists => ResponseError::TopicAlreadyExists,
        ErrorKind::Unauthenticated | ErrorKind::Unauthorized => {
            ResponseError::TopicAuthorizationFailed
        }
        ErrorKind::InvalidArgument => ResponseError::InvalidRequest,
        ErrorKind::QuotaExceeded => ResponseError::PolicyViolation,
        _ => ResponseError::UnknownServerError,
    }
}

pub async fn create_topics(
    service: &Service,
    credential: &Credential,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
    let mut response = CreateTopicsResponse::default();
    for topic in request.topics {
        let mut result = CreatableTopicResult::default();
        result.name = topic.name.clone();
        result.num_partitions = -1;
        result.replication_factor = -1;
        result.configs = Some(Vec::new());
        let created = match new_hub(&topic) {
            Err(refused) => Err(refused),
            Ok(_) if request.validate_only => {
                result.num_partitions = topic.num_partitions;
                result.replication_factor = topic.replication_factor;
                Ok(None)
            }
            Ok(hub) => service
                .create_hub(credential, hub)
                .await
                .map(Some)
                .map_err(|err| (create_error(&err), err.message)),
        };
        match created {
            Ok(Some(hub)) => {
                result.topic_id = topic_id(u64::from(hub.id.0));
                result.num_partitions = i32::from(hub.partition_count);
                result.replication_factor = i16::from(hub.replication_factor);
            }
            Ok(None) => {}
            Err((code, message)) => {
                tracing::info!(topic = %topic.name.0, %message, "refused a Kafka CreateTopics");
                result.error_code = code.code();
                result.error_message = Some(text(&message));
            }
        }
        response.topics.push(result);
    }
    response
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::create_topics_request::CreatableTopicConfig;

    fn topic(partitions: i32, replication: i16, configs: &[(&str, &str)]) -> CreatableTopic {
        let mut topic = CreatableTopic::default();
        topic.name = TopicName(text("orders"));
        topic.num_partitions = partitions;
        topic.replication_factor = replication;
        topic.configs = configs
            .iter()
            .map(|(name, value)| {
                let mut config = CreatableTopicConfig::default();
                config.name = text(name);
                config.value = Some(text(value));
                config
            })
            .collect();
        topic
    }

    #[test]
    fn topics_become_hub_requests_and_what_hubs_lack_is_refused() {
        let hub = new_hub(&topic(
            8,
            3,
            &[
                ("retention.ms", "7200000"),
                ("cleanup.policy", "delete,compact"),
            ],
        ))
        .unwrap();
        assert_eq!(
            (hub.partition_count, hub.replication_factor, hub.retention),
            (8, Some(3), Some(Duration::from_secs(7200)))
        );
        assert_eq!(hub.settings.cleanup_policy, CleanupPolicy::DeleteOrCompact);
        let defaults = new_hub(&topic(-1, -1, &[])).unwrap();
        assert_eq!(
            (defaults.partition_count, defaults.replication_factor),
            (PARTITIONS_DEFAULT, None)
        );
        let refused = |t: CreatableTopic| new_hub(&t).unwrap_err().0;
        assert_eq!(refused(topic(0, 3, &[])), ResponseError::InvalidPartitions);
        assert_eq!(
            refused(topic(4, 0, &[])),
            ResponseError::InvalidReplicationFactor
        );
        assert_eq!(
            refused(topic(4, 3, &[("min.insync.replicas", "2")])),
            ResponseError::InvalidConfig
        );
        assert_eq!(
            refused(topic(4, 3, &[("cleanup.policy", "forever")])),
            ResponseError::InvalidConfig
        );
    }
}
