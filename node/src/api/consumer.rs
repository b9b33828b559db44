use std::sync::Arc;

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tributary_types::Rights;

use crate::api::auth::{Auth, Scope};
use tributary_proto::v1 as pb;
use tributary_proto::v1::consumer_server::Consumer;
use tributary_types::limits::{RECEIVE_BATCH_EVENTS_DEFAULT, RECEIVE_BATCH_EVENTS_MAX};

use crate::api::convert;
use crate::api::error::ApiError;
use crate::broker::Broker;
use crate::controller::state::HubRecord;
use crate::partition::Partition;
use crate::readers::{ReaderSlot, Readers};

/// Batches buffered per reader stream before the reader waits for the client.
const RECEIVE_STREAM_BATCHES_MAX: usize = 2;

pub struct ConsumerService {
    pub broker: Arc<Broker>,
    pub readers: Arc<Readers>,
    pub auth: Auth,
}

impl ConsumerService {
    /// The hub, consumer group (empty: $Default), partition index and this node's leading
    /// replica a request names.
    async fn locate<'a>(
        &self,
        event_hub: &str,
        consumer_group: &'a str,
        partition_id: &str,
    ) -> Result<(HubRecord, &'a str, u16, Arc<Partition>), ApiError> {
        let hub = self.broker.hub(event_hub)?;
        let group = convert::consumer_group(consumer_group);
        self.broker.check_consumer_group(&hub, group)?;
        let index = self.broker.partition_index(&hub, partition_id)?;
        let partition = self.broker.leader_partition(&hub, index).await?;
        Ok((hub, group, index, partition))
    }
}

#[tonic::async_trait]
impl Consumer for ConsumerService {
    type ReceiveStream = ReceiverStream<Result<pb::ReceiveResponse, Status>>;

    async fn get_partition_readers(
        &self,
        request: Request<pb::GetPartitionReadersRequest>,
    ) -> Result<Response<pb::PartitionReaders>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::NONE,
        )?;
        let req = request.into_inner();
        let (hub, group, index, partition) = self
            .locate(&req.event_hub, &req.consumer_group, &req.partition_id)
            .await?;
        let readers = self
            .readers
            .connected(&(hub.id, group.to_string(), index))
            .into_iter()
            .map(|r| pb::ConnectedReader {
                name: r.name,
                owner_level: r.owner_level,
            })
            .collect();
        Ok(Response::new(pb::PartitionReaders {
            properties: Some(convert::partition_properties(
                &req.event_hub,
                &req.partition_id,
                &partition.settled_progress().await,
                &partition.capture_progress(),
            )),
            readers,
        }))
    }

    async fn receive(
        &self,
        request: Request<pb::ReceiveRequest>,
    ) -> Result<Response<Self::ReceiveStream>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::LISTEN,
        )?;
        let req = request.into_inner();
        let (hub, group, index, partition) = self
            .locate(&req.event_hub, &req.consumer_group, &req.partition_id)
            .await?;
        let max_batch = match req.max_batch {
            0 => RECEIVE_BATCH_EVENTS_DEFAULT,
            n if n > RECEIVE_BATCH_EVENTS_MAX => {
                return Err(ApiError::invalid(format!(
                    "max_batch {n} is over the limit of {RECEIVE_BATCH_EVENTS_MAX} events"
                ))
                .into());
            }
            n => n,
        } as usize;
        let position = convert::position(req.position)?;
        let start = partition.resolve(position).map_err(ApiError::from)?;
        let slot = self.readers.attach(
            (hub.id, group.to_string(), index),
            &req.reader_name,
            req.owner_level,
        )?;
        let (tx, rx) = mpsc::channel(RECEIVE_STREAM_BATCHES_MAX);
        let closing = self.broker.closing();
        // A replica that stops here moved to another node (the reader reconnects there) or
        // its hub was deleted.
        let closed = {
            let (broker, hub_name) = (self.broker.clone(), hub.name.clone());
            move || match broker.hub(&hub_name) {
                Ok(hub) => broker.partition_moved(&hub, index),
                Err(_) => ApiError::not_found(format!(
                    "the partition was closed: event hub '{hub_name}' was deleted"
                )),
            }
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
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// Sends committed events from `next` on; when caught up, waits for the next commit.
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

async fn stream_events(
    read: Read,
    tx: mpsc::Sender<Result<pb::ReceiveResponse, Status>>,
    mut closing: tokio::sync::watch::Receiver<bool>,
    egress_limit: impl Fn() -> (u32, u16),
    closed: impl Fn() -> ApiError,
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
            let _ = tx.send(Err(displaced.into())).await;
            return;
        }
        progress.mark_unchanged();
        let started = std::time::Instant::now();
        let events = match partition.read(next, max_batch) {
            Ok(events) => events,
            Err(err) => {
                let _ = tx.send(Err(ApiError::from(err).into())).await;
                return;
            }
        };
        if let Some(last) = events.last() {
            next = last.sequence + 1;
            let last_enqueued = partition.progress().next_sequence - 1;
            let count = events.len() as u64;
            let bytes: usize = events.iter().map(|e| e.record.body.len()).sum();
            let response = pb::ReceiveResponse {
                events: events.into_iter().map(convert::received_event).collect(),
                last_enqueued_sequence_number: last_enqueued,
            };
            if tx.send(Ok(response)).await.is_err() {
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
                    let _ = tx.send(Err(closed().into())).await;
                    return;
                }
            }
            _ = tx.closed() => return,
            // The replica stopped here (it moved, or was re-created): the reader resumes
            // where the partition is now.
            _ = partition.stopped() => {
                let _ = tx.send(Err(closed().into())).await;
                return;
            }
            displaced = &mut slot.displaced => {
                if let Ok(displaced) = displaced {
                    let _ = tx.send(Err(displaced.into())).await;
                }
                return;
            }
            _ = async { closing.wait_for(|closing| *closing).await.map(|_| ()) } => {
                let _ = tx
                    .send(Err(ApiError::new(
                        tributary_proto::ErrorReason::Unavailable,
                        "the node is shutting down; reconnect to continue reading",
                    )
                    .into()))
                    .await;
                return;
            }
        }
    }
}
