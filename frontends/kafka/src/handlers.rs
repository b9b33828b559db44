//! Metadata and Produce. The node is the cluster's one broker as clients see it (Event
//! Hubs' model): every partition is led "here", and sends go to the partition's leader
//! through `tributary-forward`.

use futures::future::join_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::metadata_response::{
    MetadataResponse, MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::produce_request::ProduceRequest;
use kafka_protocol::messages::produce_response::{
    PartitionProduceResponse, ProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{BrokerId, TopicName};
use kafka_protocol::protocol::StrBytes;
use tributary_broker::auth::Credential;
use tributary_broker::error::{Error, ErrorKind};
use tributary_broker::service::{Producer, SendRequest, Target};

use crate::KafkaContext;
use crate::records::{self, RecordsError};

/// A broker error as Kafka's code.
pub fn error_code(error: &Error) -> i16 {
    let error = match error.kind {
        ErrorKind::NotFound => ResponseError::UnknownTopicOrPartition,
        ErrorKind::Unauthenticated | ErrorKind::Unauthorized => {
            ResponseError::TopicAuthorizationFailed
        }
        ErrorKind::MessageTooLarge => ResponseError::MessageTooLarge,
        ErrorKind::OutOfOrderSequence => ResponseError::OutOfOrderSequenceNumber,
        ErrorKind::InvalidProducerEpoch => ResponseError::InvalidProducerEpoch,
        ErrorKind::UnknownProducer => ResponseError::UnknownProducerId,
        ErrorKind::InvalidArgument => ResponseError::InvalidRequest,
        ErrorKind::NotLeader { .. } | ErrorKind::Unavailable => ResponseError::NotLeaderOrFollower,
        ErrorKind::ServerBusy { .. } | ErrorKind::QuotaExceeded => {
            ResponseError::ThrottlingQuotaExceeded
        }
        _ => ResponseError::UnknownServerError,
    };
    error.code()
}

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_owned())
}

/// A stable topic id for a hub.
fn topic_id(hub_id: u64) -> uuid::Uuid {
    uuid::Uuid::from_u64_pair(0x7472_6962_7574_6172, hub_id)
}

pub fn metadata(
    context: &KafkaContext,
    credential: &Credential,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let service = context.node.service();
    let state = service.broker().runtime().state();
    let visible = |hub: &str| service.granted_rights(credential, hub).is_ok();
    let wanted: Vec<String> = match &request.topics {
        None => state
            .hubs
            .keys()
            .filter(|hub| visible(hub))
            .cloned()
            .collect(),
        // Version 0 asks for every topic with an empty list (later ones with none).
        Some(topics) if topics.is_empty() && version == 0 => state
            .hubs
            .keys()
            .filter(|hub| visible(hub))
            .cloned()
            .collect(),
        Some(topics) => topics
            .iter()
            .filter_map(|t| t.name.as_ref().map(|n| n.0.to_string()))
            .collect(),
    };
    let node = BrokerId(context.node_id);
    let mut response = MetadataResponse::default();
    let mut broker = MetadataResponseBroker::default();
    broker.node_id = node;
    broker.host = text(&context.advertised.0);
    broker.port = i32::from(context.advertised.1);
    response.brokers = vec![broker];
    response.cluster_id = Some(text(&state.cluster_id));
    response.controller_id = node;
    response.topics = wanted
        .into_iter()
        .map(|name| {
            let mut topic = MetadataResponseTopic::default();
            topic.name = Some(TopicName(text(&name)));
            match state.hubs.get(&name) {
                None => topic.error_code = ResponseError::UnknownTopicOrPartition.code(),
                Some(_) if !visible(&name) => {
                    topic.error_code = ResponseError::TopicAuthorizationFailed.code()
                }
                Some(hub) => {
                    topic.topic_id = topic_id(u64::from(hub.id.0));
                    topic.partitions = (0..hub.partition_count)
                        .map(|p| {
                            let mut partition = MetadataResponsePartition::default();
                            partition.partition_index = i32::from(p);
                            partition.leader_id = node;
                            partition.leader_epoch = -1;
                            partition.replica_nodes = vec![node];
                            partition.isr_nodes = vec![node];
                            partition
                        })
                        .collect();
                }
            }
            topic
        })
        .collect();
    response
}

/// Produce: each partition's records sent as one publication, all partitions at once.
/// `None` for acks=0, which Kafka answers with nothing.
pub async fn produce(
    context: &KafkaContext,
    credential: &Credential,
    request: ProduceRequest,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let mut response = ProduceResponse::default();
    let refusal = match acks {
        -1..=1 if request.transactional_id.is_some() => {
            Some(ResponseError::TransactionalIdAuthorizationFailed.code())
        }
        -1..=1 => None,
        _ => Some(ResponseError::InvalidRequiredAcks.code()),
    };
    let mut topics = Vec::new();
    for topic in request.topic_data {
        let hub = topic.name.0.to_string();
        let sends = topic.partition_data.into_iter().map(|data| {
            let hub = hub.clone();
            async move {
                let mut answer = PartitionProduceResponse::default();
                answer.index = data.index;
                answer.base_offset = -1;
                answer.log_append_time_ms = -1;
                answer.log_start_offset = -1;
                if let Some(code) = refusal {
                    answer.error_code = code;
                    return answer;
                }
                let decoded = match data.records.as_ref().map(records::decode) {
                    None => return answer,
                    Some(decoded) => decoded,
                };
                let decoded = match decoded {
                    Ok(decoded) if decoded.records.is_empty() => return answer,
                    Ok(decoded) => decoded,
                    Err(err) => {
                        tracing::info!(?err, hub = %hub, partition = data.index, "refused a Kafka produce");
                        answer.error_code = match err {
                            RecordsError::Corrupt(_) => ResponseError::CorruptMessage.code(),
                            RecordsError::Transactional => {
                                ResponseError::TransactionalIdAuthorizationFailed.code()
                            }
                        };
                        answer.error_message = Some(text(&format!("{err:?}")));
                        return answer;
                    }
                };
                let send = SendRequest {
                    hub,
                    target: Target::PartitionId(data.index.to_string()),
                    events: decoded.records.into_iter().map(records::event).collect(),
                    producer: decoded.producer.map(Producer::Kafka),
                };
                match context.node.send(credential, send).await {
                    Ok(reply) => answer.base_offset = reply.first_sequence.0,
                    Err(err) => {
                        answer.error_code = error_code(&err);
                        answer.error_message = Some(text(&err.message));
                    }
                }
                answer
            }
        });
        let mut answer = TopicProduceResponse::default();
        answer.name = TopicName(text(&hub));
        answer.partition_responses = join_all(sends).await;
        topics.push(answer);
    }
    response.responses = topics;
    (acks != 0).then_some(response)
}
