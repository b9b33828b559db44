//! Fetch and ListOffsets: events read from each partition's leader (through
//! `tributary-forward`), as record batches whose offsets are the events' sequence numbers.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::future::join_all;
use futures::stream::FuturesUnordered;
use kafka_protocol::error::ResponseError;
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::messages::BrokerId;
use kafka_protocol::messages::fetch_request::FetchRequest as KafkaFetch;
use kafka_protocol::messages::fetch_response::{
    FetchResponse, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::list_offsets_request::ListOffsetsRequest;
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use tributary_broker::auth::Credential;
use tributary_broker::error::Error;
use tributary_broker::service::{FetchBatch, FetchRequest, Property, ReadEvent};

use crate::KafkaContext;
use crate::handlers::error_code;
use crate::records::{KAFKA_KEY_PROPERTY, KAFKA_TIMESTAMP_PROPERTY};

/// Events per partition per fetch at most.
const FETCH_EVENTS_MAX: usize = 4096;

/// One partition of a fetch: where to read, and its answer once read.
struct Wanted {
    topic: usize,
    hub: String,
    partition: i32,
    from: i64,
    max_bytes: usize,
}

async fn fetch_one(
    context: &KafkaContext,
    credential: &Credential,
    wanted: &Wanted,
    wait: Duration,
) -> Result<FetchBatch, Error> {
    let request = FetchRequest {
        hub: wanted.hub.clone(),
        partition_id: wanted.partition.to_string(),
        from_sequence: wanted.from,
        from_time_ms: None,
        max_events: FETCH_EVENTS_MAX,
        max_bytes: wanted.max_bytes,
        wait,
    };
    context.node.fetch(credential, request).await
}

/// Fetch: every partition read at once; when none has an event, waits up to max_wait_ms
/// for the first to get one (a long poll), then answers with what each has.
pub async fn fetch(
    context: &KafkaContext,
    credential: &Credential,
    request: KafkaFetch,
) -> FetchResponse {
    let mut wanted = Vec::new();
    let mut response = FetchResponse::default();
    for (t, topic) in request.topics.iter().enumerate() {
        let mut answer = FetchableTopicResponse::default();
        answer.topic = topic.topic.clone();
        answer.topic_id = topic.topic_id;
        response.responses.push(answer);
        for partition in &topic.partitions {
            wanted.push(Wanted {
                topic: t,
                hub: topic.topic.0.to_string(),
                partition: partition.partition,
                from: partition.fetch_offset,
                max_bytes: usize::try_from(partition.partition_max_bytes.max(1)).unwrap_or(1),
            });
        }
    }
    let read_all = || {
        join_all(
            wanted
                .iter()
                .map(|w| fetch_one(context, credential, w, Duration::ZERO)),
        )
    };
    let mut results = read_all().await;
    let empty = results
        .iter()
        .all(|r| matches!(r, Ok(batch) if batch.events.is_empty()));
    if empty && request.max_wait_ms > 0 && !wanted.is_empty() {
        let wait = Duration::from_millis(u64::try_from(request.max_wait_ms).unwrap_or(0));
        let mut waiting: FuturesUnordered<_> = wanted
            .iter()
            .map(|w| fetch_one(context, credential, w, wait))
            .collect();
        // The first partition to get an event (or every wait over) ends the poll.
        while let Some(result) = waiting.next().await {
            if matches!(result, Ok(batch) if !batch.events.is_empty()) {
                drop(waiting);
                results = read_all().await;
                break;
            }
        }
    }
    for (wanted, result) in wanted.iter().zip(results) {
        let mut data = PartitionData::default();
        data.partition_index = wanted.partition;
        data.preferred_read_replica = BrokerId(-1);
        data.aborted_transactions = Some(Vec::new());
        match result {
            Err(err) => {
                data.error_code = error_code(&err);
                data.high_watermark = -1;
                data.last_stable_offset = -1;
                data.log_start_offset = -1;
            }
            Ok(batch) => {
                data.high_watermark = batch.next_sequence;
                data.last_stable_offset = batch.next_sequence;
                data.log_start_offset = batch.begin_sequence;
                if batch.out_of_range(wanted.from) {
                    data.error_code = ResponseError::OffsetOutOfRange.code();
                } else if !batch.events.is_empty() {
                    data.records = Some(encode(&batch.events));
                }
            }
        }
        response.responses[wanted.topic].partitions.push(data);
    }
    response
}

/// Events as one record batch (magic 2, uncompressed), offsets their sequence numbers.
pub fn encode(events: &[ReadEvent]) -> Bytes {
    let records: Vec<Record> = events.iter().map(record).collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        records.iter(),
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )
    .expect("an uncompressed batch encodes");
    buf.freeze()
}

/// An event as a Kafka record: its partition key (or a key that was not UTF-8) as the key,
/// the body as the value, its Kafka producer's timestamp (else the time it was enqueued) as
/// the timestamp, the other properties as headers (as text, bytes as they are).
fn record(event: &ReadEvent) -> Record {
    let mut key = event.record.partition_key.clone().map(Bytes::from);
    let mut timestamp = event.enqueued_time_ms;
    let mut headers = IndexMap::new();
    for (name, value) in event.record.clone().shown_properties() {
        let bytes = match value {
            Property::Bytes(bytes) if name == KAFKA_KEY_PROPERTY => {
                key = Some(bytes);
                continue;
            }
            Property::TimestampMs(time) if name == KAFKA_TIMESTAMP_PROPERTY => {
                timestamp = time;
                continue;
            }
            Property::Bytes(bytes) => bytes,
            Property::String(text) => Bytes::from(text),
            Property::Int64(n) | Property::TimestampMs(n) => Bytes::from(n.to_string()),
            Property::Double(d) => Bytes::from(d.to_string()),
            Property::Bool(b) => Bytes::from(b.to_string()),
        };
        headers.insert(StrBytes::from_string(name), Some(bytes));
    }
    Record {
        transactional: false,
        control: false,
        delete_horizon: false,
        partition_leader_epoch: -1,
        producer_id: -1,
        producer_epoch: -1,
        timestamp_type: TimestampType::Creation,
        offset: event.sequence,
        sequence: -1,
        timestamp,
        key,
        value: Some(event.record.body.clone()),
        headers,
    }
}

/// ListOffsets: -2 the first retained sequence number, -1 the next one, -3 the last one
/// (the latest timestamp), any other
/// time the first event enqueued at or after it (-1 when there is none yet). Events' times
/// here are the times the cluster enqueued them, as Event Hubs' positions by time.
pub async fn list_offsets(
    context: &KafkaContext,
    credential: &Credential,
    request: ListOffsetsRequest,
) -> ListOffsetsResponse {
    let mut response = ListOffsetsResponse::default();
    for topic in request.topics {
        let hub = topic.name.0.to_string();
        let answers = topic.partitions.into_iter().map(|partition| {
            let hub = hub.clone();
            async move {
                let mut answer = ListOffsetsPartitionResponse::default();
                answer.partition_index = partition.partition_index;
                answer.timestamp = -1;
                answer.leader_epoch = -1;
                answer.offset = -1;
                let found = match partition.timestamp {
                    time @ (-3..=-1) => context
                        .node
                        .partition_properties(
                            credential,
                            &hub,
                            &partition.partition_index.to_string(),
                        )
                        .await
                        .map(|p| match time {
                            -2 => (p.begin_sequence.0, -1),
                            -1 => (p.last_enqueued_sequence.0 + 1, -1),
                            // The record with the highest timestamp: the last one enqueued.
                            _ if p.last_enqueued_sequence.0 < 0 => (-1, -1),
                            _ => (p.last_enqueued_sequence.0, p.last_enqueued_time_ms),
                        }),
                    time if time >= 0 => {
                        let wanted = Wanted {
                            topic: 0,
                            hub: hub.clone(),
                            partition: partition.partition_index,
                            from: 0,
                            max_bytes: 1,
                        };
                        at_time(context, credential, &wanted, time).await
                    }
                    time => {
                        answer.error_code = ResponseError::InvalidRequest.code();
                        tracing::debug!(time, "ListOffsets with an unknown special time");
                        return answer;
                    }
                };
                match found {
                    Ok((offset, timestamp)) => {
                        (answer.offset, answer.timestamp) = (offset, timestamp)
                    }
                    Err(err) => answer.error_code = error_code(&err),
                }
                answer
            }
        });
        let mut answer = ListOffsetsTopicResponse::default();
        answer.name = topic.name.clone();
        answer.partitions = join_all(answers).await;
        response.topics.push(answer);
    }
    response
}

/// The first event enqueued at or after `time_ms`: its sequence number and time, or -1 and
/// -1 when there is none yet.
async fn at_time(
    context: &KafkaContext,
    credential: &Credential,
    wanted: &Wanted,
    time_ms: i64,
) -> Result<(i64, i64), Error> {
    let request = FetchRequest {
        hub: wanted.hub.clone(),
        partition_id: wanted.partition.to_string(),
        from_sequence: 0,
        from_time_ms: Some(time_ms),
        max_events: 1,
        max_bytes: 1,
        wait: Duration::ZERO,
    };
    let batch = context.node.fetch(credential, request).await?;
    Ok(batch
        .events
        .first()
        .map_or((-1, -1), |e| (e.sequence, e.enqueued_time_ms)))
}
