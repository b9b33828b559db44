//! Reading: partition properties, the connected readers, and streams of committed events
//! from a position under Event Hubs' reader rules (owner levels, five plain readers).

use std::sync::Arc;

use tokio::sync::mpsc;
use tributary_controller::state::HubRecord;
use tributary_types::limits::{RECEIVE_BATCH_EVENTS_DEFAULT, RECEIVE_BATCH_EVENTS_MAX};
use tributary_types::{Offset, PartitionId, Rights, SequenceNumber};

use super::{Service, consumer_group};
use crate::auth::{Credential, Scope};
use crate::error::Error;
use crate::partition::position::Position;
use crate::partition::{Partition, ReadEvent};
use crate::readers::{ConnectedReader, ReaderSlot};

/// Batches buffered per reader stream before the reader waits for its client.
const READ_STREAM_BATCHES_MAX: usize = 2;

/// A partition's numbers as Event Hubs reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionProperties {
    pub hub: String,
    pub partition: PartitionId,
    pub begin_sequence: SequenceNumber,
    /// -1 when nothing was ever stored.
    pub last_enqueued_sequence: SequenceNumber,
    pub last_enqueued_offset: Offset,
    pub last_enqueued_time_ms: i64,
    pub is_empty: bool,
    /// Where capture goes on from (the next sequence number not yet in a file).
    pub capture_next_sequence: SequenceNumber,
}

/// A partition's properties and the readers connected to it for one consumer group.
#[derive(Debug, Clone)]
pub struct PartitionReaders {
    pub properties: PartitionProperties,
    pub readers: Vec<ConnectedReader>,
}

/// A reader: where in which partition it starts and how it identifies itself.
#[derive(Debug, Clone)]
pub struct ReadRequest {
    pub hub: String,
    /// Empty means `$Default`.
    pub consumer_group: String,
    pub partition_id: String,
    pub position: Position,
    /// Events per batch at most; 0 means the default.
    pub max_batch: u32,
    pub reader_name: String,
    /// An owner level (epoch): displaces readers of a lower or equal level.
    pub owner_level: Option<i64>,
}

impl ReadRequest {
    /// What a reader reads within its hub: its consumer group's partition, which a token
    /// for the hub or for the consumer group covers.
    pub fn entity_path(&self) -> String {
        format!(
            "consumergroups/{}/partitions/{}",
            consumer_group(&self.consumer_group),
            self.partition_id
        )
    }
}

/// Events read, with the partition's last enqueued sequence number when they were read.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    pub events: Vec<ReadEvent>,
    pub last_enqueued_sequence: SequenceNumber,
    pub last_enqueued_offset: Offset,
    pub last_enqueued_time_ms: i64,
}

/// A reader's events, in order, batch by batch; it ends with an error saying why (the
/// reader was displaced, the replica moved, the node shuts down) or when dropped.
pub type ReadStream = mpsc::Receiver<Result<ReadBatch, Error>>;

impl Service {
    /// The hub, consumer group, partition index and this node's leading replica, caught up
    /// with everything committed.
    async fn locate<'a>(
        &self,
        hub: &str,
        group: &'a str,
        partition_id: &str,
    ) -> Result<(HubRecord, &'a str, u16, Arc<Partition>), Error> {
        let hub = self.broker.hub(hub)?;
        let group = consumer_group(group);
        self.broker.check_consumer_group(&hub, group)?;
        let index = self.broker.partition_index(&hub, partition_id)?;
        let partition = self.broker.leader_partition(&hub, index).await?;
        Ok((hub, group, index, partition))
    }

    /// A partition's properties, read from its leader. Needs any valid credential for the
    /// hub.
    pub async fn partition_properties(
        &self,
        credential: &Credential,
        hub: &str,
        partition_id: &str,
    ) -> Result<PartitionProperties, Error> {
        self.check(credential, Scope::Hub(hub), Rights::NONE)?;
        let record = self.broker.hub(hub)?;
        let index = self.broker.partition_index(&record, partition_id)?;
        let partition = self.broker.leader_partition(&record, index).await?;
        Ok(properties(hub, &partition).await)
    }

    /// The readers connected to a consumer group's partition, and its properties.
    pub async fn partition_readers(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
        partition_id: &str,
    ) -> Result<PartitionReaders, Error> {
        self.check(credential, Scope::Hub(hub), Rights::NONE)?;
        let (record, group, index, partition) = self.locate(hub, group, partition_id).await?;
        Ok(PartitionReaders {
            readers: self
                .readers
                .connected(&(record.id, group.to_string(), index)),
            properties: properties(hub, &partition).await,
        })
    }

    /// Opens a reader: committed events from its position on, as they arrive. Needs Listen
    /// on the hub.
    pub async fn read(
        &self,
        credential: &Credential,
        request: ReadRequest,
    ) -> Result<ReadStream, Error> {
        let path = request.entity_path();
        self.check(
            credential,
            Scope::HubPath(&request.hub, &path),
            Rights::LISTEN,
        )?;
        let (hub, group, index, partition) = self
            .locate(&request.hub, &request.consumer_group, &request.partition_id)
            .await?;
        let max_batch = match request.max_batch {
            0 => RECEIVE_BATCH_EVENTS_DEFAULT,
            n if n > RECEIVE_BATCH_EVENTS_MAX => {
                return Err(Error::invalid(format!(
                    "max_batch {n} is over the limit of {RECEIVE_BATCH_EVENTS_MAX} events"
                )));
            }
            n => n,
        } as usize;
        let start = partition
            .resolve(request.position)
            .map_err(|e| self.broker.partition_error(e))?;
        let slot = self.readers.attach(
            (hub.id, group.to_string(), index),
            &request.reader_name,
            request.owner_level,
        )?;
        let (tx, rx) = mpsc::channel(READ_STREAM_BATCHES_MAX);
        let closing = self.broker.closing();
        // A replica that stops here moved to another node (the reader reconnects there) or
        // its hub was deleted.
        let closed = {
            let (broker, hub_name) = (self.broker.clone(), hub.name.clone());
            move || match broker.hub(&hub_name) {
                Ok(hub) => broker.partition_moved(&hub, index),
                Err(_) => Error::not_found(format!(
                    "the partition was closed: event hub '{hub_name}' was deleted"
                )),
            }
        };
        let failed = {
            let broker = self.broker.clone();
            move |err| broker.partition_error(err)
        };
        let traffic = HubTraffic::of(&hub.name);
        let broker = self.broker.clone();
        let hub_name = hub.name.clone();
        // Egress is slowed to the hub's throughput units, never refused; TU changes apply
        // to open readers.
        let egress_limit = move || {
            broker
                .hub(&hub_name)
                .map_or((0, 1), |h| (h.throughput_units, h.partition_count))
        };
        tokio::spawn(stream_events(
            Read {
                partition,
                slot,
                next: start,
                max_batch,
                traffic,
            },
            tx,
            closing,
            egress_limit,
            closed,
            failed,
        ));
        Ok(rx)
    }
}

/// A partition's properties once everything acknowledged is visible.
async fn properties(hub: &str, partition: &Partition) -> PartitionProperties {
    let p = partition.settled_progress().await;
    let capture = partition.capture_progress();
    PartitionProperties {
        hub: hub.to_string(),
        partition: partition.group.partition,
        begin_sequence: SequenceNumber(p.begin_sequence),
        last_enqueued_sequence: SequenceNumber(if p.next_sequence == 0 {
            -1
        } else {
            p.next_sequence - 1
        }),
        last_enqueued_offset: Offset(p.last_offset),
        last_enqueued_time_ms: p.last_time_ms,
        is_empty: p.is_empty(),
        capture_next_sequence: SequenceNumber(capture.next_sequence),
    }
}

/// One reader's stream: its partition, its slot among the partition's readers, where it
/// is, and how much it takes per batch.
struct Read {
    partition: Arc<Partition>,
    slot: ReaderSlot,
    next: i64,
    max_batch: usize,
    traffic: HubTraffic,
}

/// The hub's outgoing traffic counters and read latency, labelled once per reader.
struct HubTraffic {
    events_out: metrics::Counter,
    bytes_out: metrics::Counter,
    receive_duration: metrics::Histogram,
}

impl HubTraffic {
    fn of(hub: &str) -> HubTraffic {
        HubTraffic {
            events_out: metrics::counter!("tributary_events_out_total", "hub" => hub.to_string()),
            bytes_out: metrics::counter!("tributary_bytes_out_total", "hub" => hub.to_string()),
            receive_duration: metrics::histogram!(
                "tributary_receive_duration_seconds",
                "hub" => hub.to_string()
            ),
        }
    }
}

/// Sends committed events from `next` on; when caught up, waits for the next commit.
async fn stream_events(
    read: Read,
    tx: mpsc::Sender<Result<ReadBatch, Error>>,
    mut closing: tokio::sync::watch::Receiver<bool>,
    egress_limit: impl Fn() -> (u32, u16),
    closed: impl Fn() -> Error,
    failed: impl Fn(crate::partition::PartitionError) -> Error,
) {
    let Read {
        partition,
        mut slot,
        mut next,
        max_batch,
        traffic,
    } = read;
    let mut progress = partition.subscribe();
    loop {
        if let Ok(displaced) = slot.displaced.try_recv() {
            let _ = tx.send(Err(displaced)).await;
            return;
        }
        progress.mark_unchanged();
        let started = std::time::Instant::now();
        let events = match partition.read(next, max_batch) {
            Ok(events) => events,
            Err(err) => {
                let _ = tx.send(Err(failed(err))).await;
                return;
            }
        };
        if let Some(last) = events.last() {
            next = last.sequence + 1;
            let progress_now = partition.progress();
            let count = events.len() as u64;
            let bytes: usize = events.iter().map(|e| e.record.body.len()).sum();
            let batch = ReadBatch {
                events,
                last_enqueued_sequence: SequenceNumber(progress_now.next_sequence - 1),
                last_enqueued_offset: Offset(progress_now.last_offset),
                last_enqueued_time_ms: progress_now.last_time_ms,
            };
            if tx.send(Ok(batch)).await.is_err() {
                return;
            }
            traffic
                .receive_duration
                .record(started.elapsed().as_secs_f64());
            traffic.events_out.increment(count);
            traffic.bytes_out.increment(bytes as u64);
            let (throughput_units, partitions) = egress_limit();
            let wait = partition.egress_wait(throughput_units, partitions, bytes, count as usize);
            if !wait.is_zero() {
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = closing.wait_for(|c| *c) => {}
                }
            }
            continue;
        }
        tokio::select! {
            changed = progress.changed() => {
                if changed.is_err() {
                    let _ = tx.send(Err(closed())).await;
                    return;
                }
            }
            _ = tx.closed() => return,
            // The replica stopped here (it moved, or was re-created): the reader resumes
            // where the partition is now.
            _ = partition.stopped() => {
                let _ = tx.send(Err(closed())).await;
                return;
            }
            displaced = &mut slot.displaced => {
                if let Ok(displaced) = displaced {
                    let _ = tx.send(Err(displaced)).await;
                }
                return;
            }
            _ = async { closing.wait_for(|closing| *closing).await.map(|_| ()) } => {
                let _ = tx
                    .send(Err(Error::unavailable(
                        "the node is shutting down; reconnect to continue reading",
                    )))
                    .await;
                return;
            }
        }
    }
}
