//! A buffered producer: the application hands over events one at a time and gets a future
//! per event; the producer packs them into batches per partition and sends each batch as one
//! request (like Event Hubs' `EventHubBufferedProducerClient` or Kafka's producer with
//! `linger.ms`).
//!
//! Batching is adaptive: a partition's queue sends what it holds as soon as it may (after
//! the optional linger), and while its sends are in flight new events pile up and leave
//! together in the next batch. A lone event therefore waits for nothing, and under load
//! batches grow until they fill the round trip.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message as _;
use tokio::sync::{Notify, Semaphore, mpsc, oneshot};
use tributary_proto::v1 as proto;

use crate::ClientError;
use crate::producer::{ProducerClient, SendTarget};

/// Largest batch the producer makes by default, counted as the events' encoded size plus
/// [`EVENT_OVERHEAD_BYTES`] each: under the service's default 1 MiB publication limit.
pub const BATCH_BYTES_MAX_DEFAULT: usize = 960 * 1024;
/// What the service's batch encoding adds to each event beyond its protobuf size (numbers,
/// time, lengths), as an upper bound.
const EVENT_OVERHEAD_BYTES: usize = 64;
/// How long a partition's queue lives without events before its task ends.
const QUEUE_IDLE: Duration = Duration::from_secs(30);

/// How a [`BufferedProducer`] batches.
#[derive(Debug, Clone)]
pub struct BufferedOptions {
    /// How long the first event of a batch waits for more before the batch goes (Kafka's
    /// `linger.ms`). Zero (the default): a batch goes as soon as the queue may send.
    pub max_wait: Duration,
    /// Most events waiting per partition queue; beyond, [`BufferedProducer::enqueue`]
    /// waits (backpressure).
    pub max_buffered_events_per_partition: usize,
    /// Sends in flight per partition queue. One (the default) keeps events in the order they
    /// were enqueued even across retries; more raise throughput to a distant node but a
    /// retried batch may land after a later one.
    pub max_concurrent_sends_per_partition: usize,
    /// Most events in one batch.
    pub max_batch_events: usize,
    /// Largest batch, see [`BATCH_BYTES_MAX_DEFAULT`].
    pub max_batch_bytes: usize,
}

impl Default for BufferedOptions {
    fn default() -> Self {
        BufferedOptions {
            max_wait: Duration::ZERO,
            max_buffered_events_per_partition: 1500,
            max_concurrent_sends_per_partition: 1,
            max_batch_events: 1000,
            max_batch_bytes: BATCH_BYTES_MAX_DEFAULT,
        }
    }
}

/// Where an event was stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Delivery {
    pub partition_id: Arc<str>,
    pub sequence_number: i64,
    pub offset: String,
    pub enqueued_time_ms: i64,
    /// Events in the request that carried this one.
    pub batch_events: usize,
}

/// The outcome of one enqueued event: resolves once its batch is acknowledged (the event is
/// stored on a majority of its partition's replicas) or failed.
pub type DeliveryFuture = futures::future::BoxFuture<'static, Result<Delivery, ClientError>>;

type Waiter = oneshot::Sender<Result<Delivery, ClientError>>;

/// One event waiting in a queue.
struct Pending {
    event: proto::EventData,
    bytes: usize,
    waiter: Waiter,
}

/// A queue's identity: the hub and the target, as sends name them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct QueueKey {
    event_hub: String,
    target: TargetKey,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TargetKey {
    Any,
    Partition(String),
    Key(String),
}

struct Inner {
    producer: ProducerClient,
    options: BufferedOptions,
    queues: Mutex<HashMap<QueueKey, mpsc::Sender<Pending>>>,
    /// Events enqueued and not yet delivered or failed.
    outstanding: AtomicU64,
    settled: Notify,
}

/// Sends events in batches it makes itself. Cheap to clone; clones share the queues.
///
/// Events with the same target (partition id, partition key, or none) are sent in the
/// order they were enqueued. Without idempotence, a batch retried after a failover may be
/// stored twice (at-least-once), as with [`ProducerClient::send`].
#[derive(Clone)]
pub struct BufferedProducer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for BufferedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BufferedProducer")
            .field("options", &self.inner.options)
            .field(
                "outstanding",
                &self.inner.outstanding.load(Ordering::Relaxed),
            )
            .finish()
    }
}

impl BufferedProducer {
    pub(crate) fn new(producer: ProducerClient, options: BufferedOptions) -> Self {
        BufferedProducer {
            inner: Arc::new(Inner {
                producer,
                options,
                queues: Mutex::new(HashMap::new()),
                outstanding: AtomicU64::new(0),
                settled: Notify::new(),
            }),
        }
    }

    /// Queues `event` for `event_hub` and returns once it is queued (waiting while the
    /// target's queue is full). The returned future resolves when the event's batch is
    /// acknowledged; dropping it does not cancel the send.
    pub async fn enqueue(
        &self,
        event_hub: &str,
        target: SendTarget,
        event: impl Into<proto::EventData>,
    ) -> Result<DeliveryFuture, ClientError> {
        crate::client::require_name("event hub name", event_hub)?;
        let target = match target {
            SendTarget::Any => TargetKey::Any,
            SendTarget::PartitionId(id) => {
                crate::client::require_name("partition id", &id)?;
                TargetKey::Partition(id)
            }
            SendTarget::PartitionKey(key) => TargetKey::Key(key),
        };
        let key = QueueKey {
            event_hub: event_hub.to_owned(),
            target,
        };
        let event = event.into();
        let bytes = event.encoded_len() + EVENT_OVERHEAD_BYTES;
        if bytes > self.inner.options.max_batch_bytes {
            return Err(ClientError::InvalidArgument(format!(
                "the event is {bytes} bytes with its framing; a batch holds at most {} bytes",
                self.inner.options.max_batch_bytes
            )));
        }
        let (waiter, delivered) = oneshot::channel();
        let mut pending = Pending {
            event,
            bytes,
            waiter,
        };
        // Counted before it is queued (its delivery may come before this task runs again),
        // and uncounted if this call is dropped while waiting for room in the queue.
        self.inner.outstanding.fetch_add(1, Ordering::SeqCst);
        let mut counted = Counted {
            inner: &self.inner,
            queued: false,
        };
        loop {
            let queue = self.queue(&key);
            match queue.send(pending).await {
                Ok(()) => {
                    counted.queued = true;
                    break;
                }
                // The queue's task ended (idle) between our lookup and the send: take a
                // new queue.
                Err(mpsc::error::SendError(back)) => {
                    pending = back;
                    let mut queues = self.inner.queues.lock().expect("queues lock");
                    if queues.get(&key).is_some_and(|q| q.same_channel(&queue)) {
                        queues.remove(&key);
                    }
                }
            }
        }
        Ok(Box::pin(async move {
            delivered.await.unwrap_or_else(|_| {
                Err(ClientError::InvalidArgument(
                    "the buffered producer stopped before the event was sent".into(),
                ))
            })
        }))
    }

    /// Waits until every event enqueued so far is acknowledged or failed.
    pub async fn flush(&self) {
        loop {
            let settled = self.inner.settled.notified();
            if self.inner.outstanding.load(Ordering::SeqCst) == 0 {
                return;
            }
            settled.await;
        }
    }

    /// Events enqueued and not yet acknowledged or failed.
    pub fn outstanding(&self) -> u64 {
        self.inner.outstanding.load(Ordering::SeqCst)
    }

    fn queue(&self, key: &QueueKey) -> mpsc::Sender<Pending> {
        let mut queues = self.inner.queues.lock().expect("queues lock");
        if let Some(queue) = queues.get(key) {
            return queue.clone();
        }
        let (tx, rx) = mpsc::channel(self.inner.options.max_buffered_events_per_partition.max(1));
        queues.insert(key.clone(), tx.clone());
        tokio::spawn(run_queue(self.inner.clone(), key.clone(), tx.clone(), rx));
        tx
    }
}

/// An enqueued event counted as outstanding; uncounted on drop unless it was queued.
struct Counted<'a> {
    inner: &'a Inner,
    queued: bool,
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        if !self.queued {
            settle(self.inner, 1);
        }
    }
}

/// Takes `count` events off the outstanding ones, waking flushes when none are left.
fn settle(inner: &Inner, count: u64) {
    if inner.outstanding.fetch_sub(count, Ordering::SeqCst) == count {
        inner.settled.notify_waiters();
    }
}

/// One queue's task: takes what is queued, up to a batch, sends it, and delivers each
/// event's outcome; ends after [`QUEUE_IDLE`] without events.
async fn run_queue(
    inner: Arc<Inner>,
    key: QueueKey,
    me: mpsc::Sender<Pending>,
    mut rx: mpsc::Receiver<Pending>,
) {
    let options = &inner.options;
    let sends = Arc::new(Semaphore::new(
        options.max_concurrent_sends_per_partition.max(1),
    ));
    let mut carry: Option<Pending> = None;
    loop {
        let first = match carry.take() {
            Some(first) => first,
            None => match tokio::time::timeout(QUEUE_IDLE, rx.recv()).await {
                Ok(Some(first)) => first,
                Ok(None) => return,
                Err(_idle) => {
                    // Leave the map only if nothing arrived meanwhile; an enqueue holding
                    // our sender after that finds the channel closed and makes a new queue.
                    let left = {
                        let mut queues = inner.queues.lock().expect("queues lock");
                        let idle = rx.is_empty();
                        if idle {
                            if queues.get(&key).is_some_and(|q| q.same_channel(&me)) {
                                queues.remove(&key);
                            }
                            rx.close();
                        }
                        idle
                    };
                    if !left {
                        continue;
                    }
                    // Events sent between the check and the close are still delivered.
                    while let Ok(pending) = rx.try_recv() {
                        carry_one(&inner, &key, vec![pending]).await;
                    }
                    return;
                }
            },
        };
        let permit = sends
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let mut batch = vec![];
        let mut bytes = first.bytes;
        batch.push(first);
        let linger = tokio::time::sleep(options.max_wait);
        tokio::pin!(linger);
        let mut lingering = !options.max_wait.is_zero();
        while batch.len() < options.max_batch_events {
            let next = match rx.try_recv() {
                Ok(next) => next,
                Err(_) if lingering => tokio::select! {
                    next = rx.recv() => match next {
                        Some(next) => next,
                        None => break,
                    },
                    _ = &mut linger => {
                        lingering = false;
                        continue;
                    }
                },
                Err(_) => break,
            };
            if bytes + next.bytes > options.max_batch_bytes {
                carry = Some(next);
                break;
            }
            bytes += next.bytes;
            batch.push(next);
        }
        let inner = inner.clone();
        let key = key.clone();
        let send = async move {
            carry_one(&inner, &key, batch).await;
            drop(permit);
        };
        if options.max_concurrent_sends_per_partition <= 1 {
            send.await;
        } else {
            tokio::spawn(send);
        }
    }
}

/// Sends one batch and delivers its outcome to each of its events.
async fn carry_one(inner: &Inner, key: &QueueKey, batch: Vec<Pending>) {
    let count = batch.len() as u64;
    let batch_events = batch.len();
    let (events, waiters): (Vec<_>, Vec<_>) =
        batch.into_iter().map(|p| (p.event, p.waiter)).unzip();
    let target = match &key.target {
        TargetKey::Any => SendTarget::Any,
        TargetKey::Partition(id) => SendTarget::PartitionId(id.clone()),
        TargetKey::Key(k) => SendTarget::PartitionKey(k.clone()),
    };
    match inner.producer.send(&key.event_hub, target, events).await {
        Ok(reply) => {
            let partition: Arc<str> = reply.partition_id.into();
            let mut offsets = reply.offsets.into_iter();
            for (i, waiter) in waiters.into_iter().enumerate() {
                let _ = waiter.send(Ok(Delivery {
                    partition_id: partition.clone(),
                    sequence_number: reply.first_sequence_number + i as i64,
                    offset: offsets.next().unwrap_or_default(),
                    enqueued_time_ms: reply.enqueued_time_ms,
                    batch_events,
                }));
            }
        }
        Err(error) => {
            for waiter in waiters {
                let _ = waiter.send(Err(error.clone()));
            }
        }
    }
    settle(inner, count);
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn an_enqueue_dropped_while_waiting_for_room_is_not_counted() {
        // A node that accepts connections and never answers: sends hang.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let held = tokio::spawn(async move {
            let mut connections = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                connections.push(socket);
            }
        });
        let client = crate::Client::connect(&format!("http://{addr}"))
            .await
            .unwrap();
        let producer = client.buffered_producer(BufferedOptions {
            max_buffered_events_per_partition: 1,
            ..BufferedOptions::default()
        });
        let target = || SendTarget::PartitionId("0".into());
        // The first is taken into a send that hangs, the second fills the queue.
        let _first = producer
            .enqueue("hub", target(), crate::EventData::from_body("1"))
            .await
            .unwrap();
        let _second = tokio::time::timeout(
            Duration::from_secs(5),
            producer.enqueue("hub", target(), crate::EventData::from_body("2")),
        )
        .await
        .expect("room for one queued event")
        .unwrap();
        // The third waits for room; its caller gives up.
        let third = tokio::time::timeout(
            Duration::from_millis(200),
            producer.enqueue("hub", target(), crate::EventData::from_body("3")),
        )
        .await;
        assert!(third.is_err(), "the queue had room for a third event");
        assert_eq!(
            producer.outstanding(),
            2,
            "the abandoned event is still counted"
        );
        held.abort();
    }
}
