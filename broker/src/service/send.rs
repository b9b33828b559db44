//! Publishing: validate, route to a partition, throttle, append through Raft, count.

use std::time::Instant;

use tributary_raft::Producer;
use tributary_types::{Offset, PartitionId, Rights, SendStage, SequenceNumber};

use super::Service;
use crate::auth::{Credential, Scope};
use crate::broker::Target;
use crate::error::{Error, ErrorKind};
use crate::fault::FaultHooks;
use crate::partition::codec::{self, EventRecord};

/// How long a send may still wait for its commit once the node has begun to shut down
/// (less than the shutdown's drain time).
const SHUTDOWN_SEND_GRACE: std::time::Duration = std::time::Duration::from_secs(3);

/// One publication: events stored together, atomically, in one partition.
#[derive(Debug, Clone)]
pub struct SendRequest {
    pub hub: String,
    pub target: Target,
    /// The events; with [`Target::PartitionKey`] each is stored with that key.
    pub events: Vec<EventRecord>,
    /// An idempotent producer's numbering of the send (Event Hubs' or Kafka's): a retried
    /// send is stored once. Needs [`Target::PartitionId`].
    pub producer: Option<Producer>,
}

/// Where a publication was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReply {
    pub partition: PartitionId,
    pub first_sequence: SequenceNumber,
    /// Each event's offset, in order.
    pub offsets: Vec<Offset>,
    pub enqueued_time_ms: i64,
}

impl Service {
    /// Stores a publication once a majority of its partition's replicas has it. Needs Send
    /// on the hub.
    pub async fn send(
        &self,
        credential: &Credential,
        request: SendRequest,
    ) -> Result<SendReply, Error> {
        let entered = Instant::now();
        self.check(credential, Scope::Hub(&request.hub), Rights::SEND)?;
        let _in_flight = InFlight::send();
        let broker = &self.broker;
        let hub = broker.hub(&request.hub)?;
        if request.events.is_empty() {
            return Err(Error::invalid(
                "a send needs at least one event; the batch was empty",
            ));
        }
        let mut records = request.events;
        if let Target::PartitionKey(key) = &request.target {
            for record in &mut records {
                record.partition_key = Some(key.clone());
            }
        }
        let events = codec::encode_batch(&records);
        let size_bytes = events.len();
        let max = broker.limits.publish_bytes_max;
        if size_bytes > max {
            return Err(Error::new(
                ErrorKind::MessageTooLarge,
                format!(
                    "the batch is {size_bytes} bytes; the maximum publication size is {max} bytes. Send fewer or smaller events per batch"
                ),
            ));
        }
        let body_bytes = records.iter().map(|r| r.body.len() as u64).sum();
        let event_count = records.len();
        let index = broker.route(&hub, &request.target)?;
        let producer = match (request.producer, &request.target) {
            (None, _) => None,
            (Some(Producer::Kafka(stamp)), Target::PartitionId(_)) => {
                self.kafka_producer_level()?;
                Some(Producer::Kafka(stamp))
            }
            (Some(stamp), Target::PartitionId(_)) => Some(stamp),
            _ => {
                return Err(Error::invalid(
                    "idempotent publishing needs an explicit partition id; send with a partition id or without a producer id",
                ));
            }
        };
        let partition = broker.local_partition(&hub, index)?;
        if let Err(wait) = partition.admit_ingress(
            hub.throughput_units,
            hub.partition_count,
            size_bytes,
            event_count,
        ) {
            metrics::counter!("tributary_sends_throttled_total", "hub" => hub.name.clone())
                .increment(1);
            return Err(Error::busy(
                format!(
                    "event hub '{}' is over its {} throughput unit(s) (1 MB/s or 1,000 events/s each, shared by its {} partitions). Please wait {} ms and try again, or raise its throughput units",
                    hub.name,
                    hub.throughput_units,
                    hub.partition_count,
                    wait.as_millis().max(1)
                ),
                wait,
            ));
        }
        let started = Instant::now();
        // A send still waiting when the node shuts down (its partition may have lost its
        // quorum) gives up within the shutdown's drain time, so it never holds the node up.
        let mut closing = broker.closing();
        let appended = tokio::select! {
            appended = partition.append(events, body_bytes, producer, started) => {
                appended.map_err(|e| broker.partition_error(e))?
            }
            _ = async {
                let _ = closing.wait_for(|closing| *closing).await;
                tokio::time::sleep(SHUTDOWN_SEND_GRACE).await;
            } => {
                return Err(Error::unavailable(
                    "the node shut down before the send committed; its outcome is unknown: \
                     retry on another node (an idempotent producer's retry is stored once)",
                ));
            }
        };
        FaultHooks::global().after_commit();
        let done = Instant::now();
        SendStage::FrontEnd.record_between(entered, started);
        SendStage::Reply.record_between(appended.answered, done);
        SendStage::Total.record_between(entered, done);
        metrics::histogram!("tributary_send_duration_seconds", "hub" => hub.name.clone())
            .record(done.duration_since(started).as_secs_f64());
        metrics::counter!("tributary_events_in_total", "hub" => hub.name.clone())
            .increment(event_count as u64);
        metrics::counter!("tributary_bytes_in_total", "hub" => hub.name.clone())
            .increment(size_bytes as u64);
        Ok(SendReply {
            partition: partition.group.partition,
            first_sequence: SequenceNumber(appended.first_sequence),
            offsets: appended.offsets.into_iter().map(Offset).collect(),
            enqueued_time_ms: appended.enqueued_time_ms,
        })
    }
}

/// Counts a send in `tributary_sends_in_flight` while it runs (also when its caller gives
/// up and the call is dropped).
struct InFlight;

impl InFlight {
    fn send() -> InFlight {
        metrics::gauge!("tributary_sends_in_flight").increment(1.0);
        InFlight
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        metrics::gauge!("tributary_sends_in_flight").decrement(1.0);
    }
}
