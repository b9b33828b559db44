//! The producers of a bench run: each sends one batch at a time to its partition until the
//! deadline, timing every send.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tributary_client::{Client, ClientError, EventData, SendTarget};

/// Latencies above this (in microseconds) are recorded as this.
const LATENCY_US_MAX: u64 = 3_600_000_000;
/// Pause after a transient error when the service gave no retry-after.
const ERROR_BACKOFF: Duration = Duration::from_millis(10);

/// What to run.
pub(crate) struct Load {
    /// Connections to spread the producers over.
    pub(crate) clients: Vec<Client>,
    pub(crate) hub: String,
    pub(crate) partition_ids: Vec<String>,
    pub(crate) producers: u32,
    pub(crate) batch: Vec<EventData>,
    pub(crate) duration: Duration,
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
    let batch: Arc<[EventData]> = load.batch.into();
    let started = Instant::now();
    let deadline = started + load.duration;
    let mut tasks = JoinSet::new();
    for index in 0..load.producers as usize {
        let producer = Producer {
            client: load.clients[index % load.clients.len()].clone(),
            hub: hub.clone(),
            target: SendTarget::PartitionId(
                load.partition_ids[index % load.partition_ids.len()].clone(),
            ),
            batch: batch.clone(),
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

struct Producer {
    client: Client,
    hub: Arc<str>,
    target: SendTarget,
    batch: Arc<[EventData]>,
    deadline: Instant,
    stop: Arc<AtomicBool>,
}

struct ProducerOutcome {
    sends: u64,
    errors: u64,
    latency_us: Histogram<u64>,
}

impl Producer {
    async fn run(self) -> Result<ProducerOutcome, ClientError> {
        let producer = self.client.producer();
        let mut outcome = ProducerOutcome {
            sends: 0,
            errors: 0,
            latency_us: new_histogram(),
        };
        while Instant::now() < self.deadline && !self.stop.load(Ordering::Relaxed) {
            let sent_at = Instant::now();
            let result = producer
                .send(&self.hub, self.target.clone(), self.batch.iter().cloned())
                .await;
            match result {
                Ok(_) => {
                    let us = u64::try_from(sent_at.elapsed().as_micros()).unwrap_or(u64::MAX);
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
}

fn new_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("valid histogram bounds")
}
