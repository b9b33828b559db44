//! The producers of a bench run: each sends one batch at a time until the deadline, as
//! fast as replies come or on a fixed schedule (`--rate`), timing every send.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tributary_client::{Client, ClientError, EventData, SendTarget};

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

/// What to run.
pub(crate) struct Load {
    /// Connections to spread the producers over.
    pub(crate) clients: Vec<Client>,
    pub(crate) hub: String,
    pub(crate) partition_ids: Vec<String>,
    pub(crate) producers: u32,
    pub(crate) batch_size: u32,
    pub(crate) event_size: usize,
    pub(crate) duration: Duration,
    /// Events per second over all producers; `None`: as fast as replies come.
    pub(crate) rate: Option<f64>,
    pub(crate) keys: KeyDistribution,
    pub(crate) key_count: u32,
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

/// Runs every producer until `load.duration` has passed. A non-transient error stops all
/// producers and is returned.
pub(crate) async fn run(load: Load) -> Result<LoadOutcome, ClientError> {
    assert!(!load.clients.is_empty() && !load.partition_ids.is_empty());
    let stop = Arc::new(AtomicBool::new(false));
    let hub: Arc<str> = load.hub.into();
    let template = Bytes::from(vec![b'x'; load.event_size]);
    let started = Instant::now();
    let deadline = started + load.duration;
    // On a schedule, each producer sends a batch every `interval`; their first sends are
    // spread over one interval so the load is even, not in bursts.
    let interval = load.rate.map(|rate| {
        Duration::from_secs_f64(f64::from(load.producers) * f64::from(load.batch_size) / rate)
    });
    let mut tasks = JoinSet::new();
    for index in 0..load.producers as usize {
        let target = match load.keys {
            KeyDistribution::Partition => Target::Fixed(SendTarget::PartitionId(
                load.partition_ids[index % load.partition_ids.len()].clone(),
            )),
            KeyDistribution::RoundRobin => Target::Fixed(SendTarget::Any),
            KeyDistribution::RandomKey => Target::RandomKey {
                rng: Box::new(StdRng::seed_from_u64(index as u64)),
                count: load.key_count.max(1),
            },
        };
        let first = interval.map_or(started, |interval| {
            started + interval.mul_f64(index as f64 / f64::from(load.producers))
        });
        let producer = Producer {
            client: load.clients[index % load.clients.len()].clone(),
            hub: hub.clone(),
            target,
            template: template.clone(),
            batch_size: load.batch_size as usize,
            timestamps: load.timestamps,
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

struct Producer {
    client: Client,
    hub: Arc<str>,
    target: Target,
    template: Bytes,
    batch_size: usize,
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

impl Producer {
    async fn run(mut self) -> Result<ProducerOutcome, ClientError> {
        let producer = self.client.producer();
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
            let batch = self.batch();
            let result = producer.send(&self.hub, self.target.next(), batch).await;
            match result {
                Ok(_) => {
                    let us = u64::try_from(due.elapsed().as_micros()).unwrap_or(u64::MAX);
                    outcome
                        .latency_us
                        .saturating_record(us.clamp(1, LATENCY_US_MAX));
                    outcome.sends += 1;
                }
                Err(error) if error.is_transient() => {
                    outcome.errors += 1;
                    let pause = error.retry_after().unwrap_or(ERROR_BACKOFF);
                    tokio::time::sleep_until((Instant::now() + pause).min(self.deadline)).await;
                }
                Err(error) => return Err(error),
            }
        }
        Ok(outcome)
    }

    /// The events of one send: the shared template body, or with timestamps a copy that
    /// starts with the send time.
    fn batch(&self) -> Vec<EventData> {
        let body = if self.timestamps {
            let mut body = BytesMut::from(&self.template[..]);
            body[..TIMESTAMP_BYTES].copy_from_slice(&unix_micros().to_le_bytes());
            body.freeze()
        } else {
            self.template.clone()
        };
        vec![EventData::from_body(body); self.batch_size]
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
