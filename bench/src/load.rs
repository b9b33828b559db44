//! The producers of a bench run: each sends one batch at a time until the deadline, as
//! fast as replies come or on a fixed schedule (`--rate`), timing every send. With
//! `--in-flight N` a producer instead keeps up to N sends unacknowledged, timing each from
//! submission to acknowledgement: of one event each, published one by one and batched by
//! the client (Tributary's buffered producer, JetStream's asynchronous publish, an AMQP
//! delivery per event), or over AMQP of `--batch-size` events each (one Event Hubs batch
//! per delivery, several deliveries in flight on the link).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tributary_client::{
    BufferedOptions, BufferedProducer, Client, ClientError, EventData, ProducerClient, SendTarget,
};

/// Latencies above this (in microseconds) are recorded as this.
pub(crate) const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Pause after a transient error when the service gave no retry-after.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);
/// Bytes at the start of each body that carry the send time when consumers measure
/// end-to-end latency.
pub(crate) const TIMESTAMP_BYTES: usize = 8;

/// How sends pick their partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum KeyDistribution {
    /// Producer i sends to partition i mod partitions, by partition id.
    Partition,
    /// No key and no partition: the service spreads sends round robin.
    RoundRobin,
    /// Every send carries a partition key drawn uniformly from --key-count keys; the
    /// key's hash picks the partition.
    RandomKey,
}

impl KeyDistribution {
    pub fn name(self) -> &'static str {
        match self {
            KeyDistribution::Partition => "partition",
            KeyDistribution::RoundRobin => "round-robin",
            KeyDistribution::RandomKey => "random-key",
        }
    }
}

/// Where one producer's sends go: a Tributary partition, or a peer system's stream.
pub(crate) trait Sink: Send + 'static {
    /// Sends `bodies` as one request and waits for its acknowledgement.
    fn send(&mut self, bodies: Vec<Bytes>) -> impl Future<Output = Result<(), SendError>> + Send;

    /// Hands one event to the client without waiting for its acknowledgement; the returned
    /// future resolves with it.
    fn publish(&mut self, body: Bytes) -> impl Future<Output = Result<Ack, SendError>> + Send;

    /// Hands `bodies` over as one send without waiting for its acknowledgement. By default
    /// each is published and the acknowledgement is that of all; a sink whose sends can be
    /// pipelined whole (AMQP deliveries) sends them as one.
    fn submit(
        &mut self,
        mut bodies: Vec<Bytes>,
    ) -> impl Future<Output = Result<Ack, SendError>> + Send {
        async move {
            if bodies.len() == 1
                && let Some(body) = bodies.pop()
            {
                return self.publish(body).await;
            }
            let mut acks = Vec::with_capacity(bodies.len());
            for body in bodies {
                acks.push(self.publish(body).await?);
            }
            let all: Ack = Box::pin(async move {
                for ack in acks {
                    ack.await?;
                }
                Ok(())
            });
            Ok(all)
        }
    }
}

/// An event's acknowledgement to come.
pub(crate) type Ack = futures::future::BoxFuture<'static, Result<(), SendError>>;

/// Why a send failed.
pub(crate) enum SendError {
    /// Busy, not the leader, unreachable: the producer pauses (as long as the service
    /// asked, if it did) and goes on.
    Transient(Option<Duration>),
    /// Anything else stops every producer.
    Fatal(anyhow::Error),
}

/// The shape of the load, whatever it is sent to.
pub(crate) struct Shape {
    pub(crate) batch_size: u32,
    /// Sends (of `batch_size` events) each producer keeps unacknowledged; 1: one at a time.
    pub(crate) in_flight: u32,
    pub(crate) event_size: usize,
    pub(crate) duration: Duration,
    /// Events per second over all producers; `None`: as fast as replies come.
    pub(crate) rate: Option<f64>,
    /// Write the send time into the first bytes of every body (for consumers).
    pub(crate) timestamps: bool,
}

/// What all producers together did.
pub(crate) struct LoadOutcome {
    pub(crate) sends: u64,
    pub(crate) errors: u64,
    pub(crate) latency_us: Histogram<u64>,
    pub(crate) elapsed: Duration,
}

/// Runs one producer per sink until `shape.duration` has passed. A fatal error stops all
/// producers and is returned.
pub(crate) async fn run<S: Sink>(sinks: Vec<S>, shape: &Shape) -> anyhow::Result<LoadOutcome> {
    assert!(!sinks.is_empty());
    let producers = sinks.len();
    let stop = Arc::new(AtomicBool::new(false));
    let template = Bytes::from(vec![b'x'; shape.event_size]);
    let started = Instant::now();
    let deadline = started + shape.duration;
    // On a schedule, each producer sends a batch every `interval`; their first sends are
    // spread over one interval so the load is even, not in bursts.
    let interval = shape
        .rate
        .map(|rate| Duration::from_secs_f64(producers as f64 * f64::from(shape.batch_size) / rate));
    let mut tasks = JoinSet::new();
    for (index, sink) in sinks.into_iter().enumerate() {
        let first = interval.map_or(started, |interval| {
            started + interval.mul_f64(index as f64 / producers as f64)
        });
        let producer = Producer {
            sink,
            template: template.clone(),
            batch_size: shape.batch_size as usize,
            in_flight: shape.in_flight as usize,
            timestamps: shape.timestamps,
            schedule: interval.map(|interval| (first, interval)),
            deadline,
            stop: stop.clone(),
        };
        tasks.spawn(producer.run());
    }
    let mut total = LoadOutcome {
        sends: 0,
        errors: 0,
        latency_us: new_histogram(),
        elapsed: Duration::ZERO,
    };
    let mut first_error = None;
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("a producer task panicked") {
            Ok(outcome) => {
                total.sends += outcome.sends;
                total.errors += outcome.errors;
                total
                    .latency_us
                    .add(&outcome.latency_us)
                    .expect("histograms with equal bounds merge");
            }
            Err(error) => {
                stop.store(true, Ordering::Relaxed);
                first_error.get_or_insert(error);
            }
        }
    }
    total.elapsed = started.elapsed();
    match first_error {
        Some(error) => Err(error),
        None => Ok(total),
    }
}

/// A Tributary producer's sends: one partition, the service's choice, or random keys.
pub(crate) struct TributarySink {
    producer: ProducerClient,
    /// Batches published events (with --in-flight above 1).
    buffered: BufferedProducer,
    hub: Arc<str>,
    target: Target,
}

impl TributarySink {
    /// The sink of producer `index` of a bench over `partition_ids`.
    pub(crate) fn new(
        client: &Client,
        hub: Arc<str>,
        partition_ids: &[String],
        index: usize,
        keys: KeyDistribution,
        key_count: u32,
    ) -> TributarySink {
        let target = match keys {
            KeyDistribution::Partition => Target::Fixed(SendTarget::PartitionId(
                partition_ids[index % partition_ids.len()].clone(),
            )),
            KeyDistribution::RoundRobin => Target::Fixed(SendTarget::Any),
            KeyDistribution::RandomKey => Target::RandomKey {
                rng: Box::new(StdRng::seed_from_u64(index as u64)),
                count: key_count.max(1),
            },
        };
        TributarySink {
            producer: client.producer(),
            buffered: client.buffered_producer(BufferedOptions::default()),
            hub,
            target,
        }
    }
}

impl Sink for TributarySink {
    async fn send(&mut self, bodies: Vec<Bytes>) -> Result<(), SendError> {
        let events = bodies.into_iter().map(EventData::from_body);
        match self
            .producer
            .send(&self.hub, self.target.next(), events)
            .await
        {
            Ok(_) => Ok(()),
            Err(error) => Err(send_error(error)),
        }
    }

    async fn publish(&mut self, body: Bytes) -> Result<Ack, SendError> {
        let delivery = self
            .buffered
            .enqueue(&self.hub, self.target.next(), EventData::from_body(body))
            .await
            .map_err(send_error)?;
        Ok(Box::pin(async move {
            delivery.await.map(|_| ()).map_err(send_error)
        }))
    }
}

fn send_error(error: ClientError) -> SendError {
    if error.is_transient() {
        SendError::Transient(error.retry_after())
    } else {
        SendError::Fatal(error.into())
    }
}

enum Target {
    Fixed(SendTarget),
    RandomKey { rng: Box<StdRng>, count: u32 },
}

impl Target {
    fn next(&mut self) -> SendTarget {
        match self {
            Target::Fixed(target) => target.clone(),
            Target::RandomKey { rng, count } => {
                SendTarget::PartitionKey(format!("key-{}", rng.random_range(0..*count)))
            }
        }
    }
}

struct Producer<S> {
    sink: S,
    template: Bytes,
    batch_size: usize,
    in_flight: usize,
    timestamps: bool,
    /// The first send's time and the interval between sends; `None`: back to back.
    schedule: Option<(Instant, Duration)>,
    deadline: Instant,
    stop: Arc<AtomicBool>,
}

struct ProducerOutcome {
    sends: u64,
    errors: u64,
    latency_us: Histogram<u64>,
}

impl<S: Sink> Producer<S> {
    async fn run(self) -> anyhow::Result<ProducerOutcome> {
        if self.in_flight > 1 {
            self.run_pipelined().await
        } else {
            self.run_sequential().await
        }
    }

    async fn run_sequential(mut self) -> anyhow::Result<ProducerOutcome> {
        let mut outcome = ProducerOutcome {
            sends: 0,
            errors: 0,
            latency_us: new_histogram(),
        };
        let mut next = self.schedule.map(|(first, _)| first);
        while !self.stop.load(Ordering::Relaxed) {
            // On a schedule, latency counts from when the send was due, so a send held up
            // by a slow one before it is not measured as fast (no coordinated omission).
            let due = match (&mut next, self.schedule) {
                (Some(next), Some((_, interval))) => {
                    let due = *next;
                    *next += interval;
                    if due >= self.deadline {
                        break;
                    }
                    tokio::time::sleep_until(due).await;
                    due
                }
                _ => Instant::now(),
            };
            if due >= self.deadline {
                break;
            }
            let bodies = self.bodies();
            match self.sink.send(bodies).await {
                Ok(()) => {
                    let us = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
                    outcome
                        .latency_us
                        .saturating_record(us.clamp(1, LATENCY_US_MAX));
                    outcome.sends += 1;
                }
                Err(SendError::Transient(retry_after)) => {
                    outcome.errors += 1;
                    let pause = retry_after.unwrap_or(ERROR_BACKOFF);
                    tokio::time::sleep_until((Instant::now() + pause).min(self.deadline)).await;
                }
                Err(SendError::Fatal(error)) => return Err(error),
            }
        }
        Ok(outcome)
    }

    /// Submits sends (of `batch_size` events, one by default) without waiting, keeping up to
    /// `in_flight` unacknowledged; each send's latency runs from when it was due (or
    /// submitted) to its acknowledgement.
    async fn run_pipelined(mut self) -> anyhow::Result<ProducerOutcome> {
        let mut outcome = ProducerOutcome {
            sends: 0,
            errors: 0,
            latency_us: new_histogram(),
        };
        let mut acks = FuturesUnordered::new();
        let mut next = self.schedule.map(|(first, _)| first);
        let mut publishing = true;
        loop {
            if self.stop.load(Ordering::Relaxed) {
                break;
            }
            let may_publish = publishing && acks.len() < self.in_flight;
            let due_at = next;
            let due = async move {
                if let Some(due) = due_at {
                    tokio::time::sleep_until(due).await;
                }
            };
            tokio::select! {
                biased;
                Some((due, acked)) = acks.next(), if !acks.is_empty() => match acked {
                    Ok(()) => {
                        // Named: inference cannot see through the select to the pushed futures.
                        let due: Instant = due;
                        let us = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
                        outcome.latency_us.saturating_record(us.clamp(1, LATENCY_US_MAX));
                        outcome.sends += 1;
                    }
                    Err(SendError::Transient(_)) => outcome.errors += 1,
                    Err(SendError::Fatal(error)) => return Err(error),
                },
                () = due, if may_publish => {
                    let due = match (&mut next, self.schedule) {
                        (Some(next), Some((_, interval))) => {
                            let due = *next;
                            *next += interval;
                            due
                        }
                        _ => Instant::now(),
                    };
                    if due >= self.deadline {
                        publishing = false;
                        continue;
                    }
                    match self.sink.submit(self.bodies()).await {
                        Ok(ack) => acks.push(async move { (due, ack.await) }),
                        Err(SendError::Transient(retry_after)) => {
                            outcome.errors += 1;
                            let pause = retry_after.unwrap_or(ERROR_BACKOFF);
                            tokio::time::sleep_until((Instant::now() + pause).min(self.deadline))
                                .await;
                        }
                        Err(SendError::Fatal(error)) => return Err(error),
                    }
                }
                else => break,
            }
        }
        Ok(outcome)
    }

    /// The bodies of one send.
    fn bodies(&self) -> Vec<Bytes> {
        vec![self.body(); self.batch_size]
    }

    /// One body: the shared template, or with timestamps a copy that starts with the send
    /// time.
    fn body(&self) -> Bytes {
        if self.timestamps {
            let mut body = BytesMut::from(&self.template[..]);
            body[..TIMESTAMP_BYTES].copy_from_slice(&unix_micros().to_le_bytes());
            body.freeze()
        } else {
            self.template.clone()
        }
    }
}

/// Microseconds since the Unix epoch by this machine's clock.
pub(crate) fn unix_micros() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

pub(crate) fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}
