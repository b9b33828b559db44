//! Metadata and Produce. Metadata lists every node as a broker (its node id, its advertised
//! address for the listener asked) and each partition's leader and replicas, so clients
//! send to leaders; a send reaching another node gets NOT_LEADER_OR_FOLLOWER naming the
//! leader when clients can reach it, and is passed on to the leader through
//! `tributary-forward` otherwise (a leader without a Kafka listener, or none elected yet).

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
use tributary_broker::service::{EventRecord, KafkaProducerStamp, Producer, SendRequest, Target};

use std::collections::BTreeMap;

use crate::KafkaContext;
use crate::directory;
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
pub(crate) fn topic_id(hub_id: u64) -> uuid::Uuid {
    uuid::Uuid::from_u64_pair(0x7472_6962_7574_6172, hub_id)
}

pub async fn metadata(
    context: &KafkaContext,
    credential: &Credential,
    request: MetadataRequest,
    version: i16,
) -> MetadataResponse {
    let service = context.node.service();
    let endpoints = context
        .directory
        .get(service, directory::METADATA_AGE_MAX)
        .await;
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
    let me = context.me();
    // Every node with a listener of this kind, this one always.
    let mut brokers: BTreeMap<u64, (String, u16)> = endpoints
        .nodes
        .keys()
        .filter_map(|node| Some((*node, directory::address(&endpoints, *node, context.tls)?)))
        .collect();
    brokers.insert(me, context.advertised.clone());
    let broker_id = |node: u64| BrokerId(i32::try_from(node).unwrap_or(i32::MAX));
    let mut response = MetadataResponse::default();
    response.brokers = brokers
        .iter()
        .map(|(node, (host, port))| {
            let mut broker = MetadataResponseBroker::default();
            broker.node_id = broker_id(*node);
            broker.host = text(host);
            broker.port = i32::from(*port);
            broker
        })
        .collect();
    response.cluster_id = Some(text(&state.cluster_id));
    response.controller_id = broker_id(me);
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
                            // The leader its replicas report, when clients of this listener
                            // can reach it; else this node, which passes calls on to the
                            // leader (or waits for one to be elected).
                            let leader = endpoints
                                .leaders
                                .get(&(hub.id, p))
                                .copied()
                                .filter(|l| brokers.contains_key(l))
                                .unwrap_or(me);
                            let mut replicas: Vec<BrokerId> = hub
                                .replicas
                                .get(usize::from(p))
                                .into_iter()
                                .flatten()
                                .filter(|n| brokers.contains_key(n) && **n != leader)
                                .map(|n| broker_id(*n))
                                .collect();
                            replicas.insert(0, broker_id(leader));
                            let mut partition = MetadataResponsePartition::default();
                            partition.partition_index = i32::from(p);
                            partition.leader_id = broker_id(leader);
                            partition.leader_epoch = -1;
                            partition.isr_nodes = replicas.clone();
                            partition.replica_nodes = replicas;
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

/// Whether this node leads every partition `request` sends to: its sends are then
/// appended here, in the order they are made, rather than passed on to another node.
pub fn leads_all(context: &KafkaContext, request: &ProduceRequest) -> bool {
    let broker = context.node.service().broker();
    let state = broker.runtime().state();
    request.topic_data.iter().all(|topic| {
        let Some(hub) = state.hubs.get(topic.name.0.as_str()) else {
            return false;
        };
        topic.partition_data.iter().all(|data| {
            u16::try_from(data.index)
                .ok()
                .and_then(|index| broker.local_partition(hub, index).ok())
                .is_some_and(|partition| partition.is_leader())
        })
    })
}

/// A partition's part of a produce request, decoded: the events to send and the idempotent
/// producer's numbering of them, or why not.
type Decoded = Result<(Vec<EventRecord>, Option<KafkaProducerStamp>), (i16, String)>;

fn decode_partition(records: Option<&bytes::Bytes>, budget: &mut usize) -> Decoded {
    let Some(records) = records else {
        return Ok((Vec::new(), None));
    };
    let batches = records::decode(records, budget).map_err(|err| {
        let code = match err {
            RecordsError::Corrupt(_) => ResponseError::CorruptMessage,
            RecordsError::TooLarge(_) => ResponseError::MessageTooLarge,
            RecordsError::Transactional => ResponseError::TransactionalIdAuthorizationFailed,
        };
        (code.code(), err.to_string())
    })?;
    let producer = records::producer(&batches)
        .map_err(|err| (ResponseError::CorruptMessage.code(), err.to_string()))?;
    let events = batches
        .into_iter()
        .flat_map(|b| b.records)
        .map(records::event)
        .collect();
    Ok((events, producer))
}

/// Produce: each partition's records sent as one publication, all partitions at once.
/// `None` for acks=0, which Kafka answers with nothing. Every partition's records are
/// decoded first, within one budget for the whole request (`request_bytes_max`,
/// decompressed).
pub async fn produce(
    context: &KafkaContext,
    credential: &Credential,
    request: ProduceRequest,
) -> Option<ProduceResponse> {
    let acks = request.acks;
    let mut response = ProduceResponse::default();
    let refusal = match acks {
        -1..=1 if request.transactional_id.is_some() => Some((
            ResponseError::TransactionalIdAuthorizationFailed.code(),
            "transactions are not supported".to_string(),
        )),
        -1..=1 => None,
        _ => Some((
            ResponseError::InvalidRequiredAcks.code(),
            format!("acks={acks} (0, 1 or -1 are accepted)"),
        )),
    };
    let mut budget = context.request_bytes_max;
    let mut topics = Vec::new();
    for topic in request.topic_data {
        let hub = topic.name.0.to_string();
        let parts: Vec<(i32, Decoded)> = topic
            .partition_data
            .into_iter()
            .map(|data| {
                let decoded = match &refusal {
                    Some(refused) => Err(refused.clone()),
                    None => decode_partition(data.records.as_ref(), &mut budget),
                };
                (data.index, decoded)
            })
            .collect();
        topics.push((hub, parts));
    }
    let mut answers = Vec::new();
    for (hub, parts) in topics {
        let sends = parts.into_iter().map(|(index, decoded)| {
            let hub = hub.clone();
            async move {
                let mut answer = PartitionProduceResponse::default();
                answer.index = index;
                answer.base_offset = -1;
                answer.log_append_time_ms = -1;
                answer.log_start_offset = -1;
                let (events, producer) = match decoded {
                    Ok((events, _)) if events.is_empty() => return answer,
                    Ok(decoded) => decoded,
                    Err((code, message)) => {
                        tracing::info!(hub = %hub, partition = index, %message, "refused a Kafka produce");
                        answer.error_code = code;
                        answer.error_message = Some(text(&message));
                        return answer;
                    }
                };
                let send = SendRequest {
                    hub,
                    target: Target::PartitionId(index.to_string()),
                    events,
                    producer: producer.map(Producer::Kafka),
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
        answers.push(answer);
    }
    response.responses = answers;
    (acks != 0).then_some(response)
}
