//! `tributary bench checkpoints`: how many checkpoints per second the cluster's checkpoint
//! store sustains, how fast event processors drain a backlog while checkpointing, and how
//! long load balancing takes (processors starting together, and one leaving).
//!
//! Three phases against --endpoint, on a scratch hub deleted afterwards:
//! 1. store: one writer per processor, each checkpointing its share of the partitions in
//!    turn as fast as the store acknowledges, for --duration;
//! 2. processors: a backlog of --events-per-partition events per partition, drained by
//!    --processors event processors checkpointing every --checkpoint-every events of a
//!    partition; reports the time until the processors are balanced and until the backlog
//!    is processed;
//! 3. rebalance: one processor stops gracefully; the time until the others own its
//!    partitions.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use hdrhistogram::Histogram;
use serde::Serialize;
use tokio::time::Instant;
use tributary_client::processor::{
    EventHandler, EventProcessor, EventProcessorOptions, LoadBalancingStrategy, PartitionContext,
    RunningProcessor,
};
use tributary_client::{CheckpointStore, Client, EventData, ReceivedEvent, SendTarget};

use crate::report::LatencyReport;

const GROUP: &str = "bench";
/// Events per send while loading the backlog.
const LOAD_BATCH: usize = 100;
/// Longest wait for a phase to finish.
const PHASE_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, Clone, clap::Args)]
pub struct CheckpointsArgs {
    /// Partitions of the scratch hub.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub partitions: u32,
    /// Event processors (and store writers in the first phase).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..))]
    pub processors: u32,
    /// Processors checkpoint a partition after every this many of its events.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
    pub checkpoint_every: u64,
    /// Backlog per partition for the processors to drain.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..))]
    pub events_per_partition: u64,
    /// Body size of each event, in bytes.
    #[arg(long, default_value_t = 256)]
    pub event_size: usize,
    /// How long the store phase writes checkpoints, e.g. 10s.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// The processors' load-balancing interval (ownership expires after three).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    pub load_balancing_interval: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckpointsReport {
    pub hub: String,
    pub partitions: u32,
    pub processors: u32,
    pub checkpoint_every: u64,
    /// Phase 1: checkpoints acknowledged per second by the store.
    pub store_checkpoints_per_second: f64,
    pub store_latency_ms: LatencyReport,
    /// Phase 2: from the processors' start until each owns its share (within one).
    pub balanced_seconds: f64,
    pub balanced_intervals: f64,
    /// From the processors' start until every event was processed.
    pub drain_seconds: f64,
    /// The backlog's events, and how many were delivered to handlers (more than the
    /// backlog when partitions changed hands before a checkpoint).
    pub events_processed: u64,
    pub events_delivered: u64,
    /// Backlog events processed per second.
    pub events_per_second: f64,
    /// Checkpoints the processors wrote while draining, and per second of draining.
    pub processor_checkpoints: u64,
    pub processor_checkpoints_per_second: f64,
    /// Phase 3: from one processor's graceful stop until the others own its partitions.
    pub takeover_seconds: f64,
    pub takeover_intervals: f64,
}

struct Counter {
    /// Events delivered, re-deliveries after a hand-off included.
    events: Arc<AtomicU64>,
    checkpoints: Arc<AtomicU64>,
    every: u64,
    since: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Per partition, the highest sequence number processed (shared by all processors).
    highest: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>>,
}

#[tributary_client::async_trait]
impl EventHandler for Counter {
    async fn process_events(&self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        let Some(last) = events.last() else { return };
        self.events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        {
            let mut highest = self.highest.lock().expect("counter lock");
            let top = highest.entry(context.partition_id.clone()).or_insert(-1);
            *top = (*top).max(last.sequence_number);
        }
        let due = {
            let mut since = self.since.lock().expect("counter lock");
            let n = since.entry(context.partition_id.clone()).or_default();
            *n += events.len() as u64;
            if *n >= self.every {
                *n = 0;
                true
            } else {
                false
            }
        };
        if due && context.checkpoint(last).await.is_ok() {
            self.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
    }
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) -> anyhow::Result<Duration> {
    let started = Instant::now();
    while !done() {
        if started.elapsed() > PHASE_TIMEOUT {
            anyhow::bail!("{what} did not happen within {PHASE_TIMEOUT:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(started.elapsed())
}

/// Each processor owns its share within one (`floor` or `ceil` of partitions / count) and
/// together they own every partition once.
fn balanced(processors: &[RunningProcessor], partitions: u32) -> bool {
    let count = processors.len() as u32;
    let (low, high) = (partitions / count, partitions.div_ceil(count));
    let sets: Vec<BTreeSet<String>> = processors.iter().map(|p| p.owned_partitions()).collect();
    let union: BTreeSet<&String> = sets.iter().flatten().collect();
    union.len() == partitions as usize
        && sets.iter().map(BTreeSet::len).sum::<usize>() == partitions as usize
        && sets
            .iter()
            .all(|s| (low..=high).contains(&(s.len() as u32)))
}

pub async fn run(
    endpoint: &str,
    args: CheckpointsArgs,
    json: bool,
) -> anyhow::Result<CheckpointsReport> {
    let client = Client::connect(endpoint).await?;
    let hub = format!("bench-checkpoints-{:08x}", rand::random::<u32>());
    client
        .create_event_hub(&hub, args.partitions, None)
        .await
        .context("cannot create the scratch hub")?;
    client.create_consumer_group(&hub, GROUP).await?;
    let result = phases(&client, &hub, &args).await;
    if let Err(err) = client.delete_event_hub(&hub).await {
        eprintln!("could not delete the scratch hub '{hub}': {err}");
    }
    let report = result?;
    if json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report));
    }
    Ok(report)
}

async fn phases(
    client: &Client,
    hub: &str,
    args: &CheckpointsArgs,
) -> anyhow::Result<CheckpointsReport> {
    // Phase 1: the store alone.
    eprintln!(
        "phase 1: {} writers checkpointing {} partitions for {}...",
        args.processors,
        args.partitions,
        humantime::format_duration(args.duration)
    );
    let started = Instant::now();
    let mut writers = Vec::new();
    for w in 0..args.processors {
        let store = client.checkpoint_store();
        let hub = hub.to_string();
        let partitions: Vec<u32> = (w..args.partitions)
            .step_by(args.processors as usize)
            .collect();
        let duration = args.duration;
        writers.push(tokio::spawn(async move {
            let mut histogram =
                Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram");
            let mut seq = 0i64;
            while started.elapsed() < duration {
                for &p in &partitions {
                    let at = Instant::now();
                    store
                        .update_checkpoint(&hub, GROUP, &p.to_string(), seq, seq, None)
                        .await?;
                    histogram.saturating_record(at.elapsed().as_micros() as u64);
                }
                seq += 1;
            }
            Ok::<_, tributary_client::ClientError>(histogram)
        }));
    }
    let mut store_latency =
        Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("histogram");
    for writer in writers {
        store_latency.add(writer.await??)?;
    }
    let store_seconds = started.elapsed().as_secs_f64();
    let store_checkpoints_per_second = store_latency.len() as f64 / store_seconds;

    // Phase 2: a backlog for the processors, starting from the beginning.
    eprintln!(
        "phase 2: loading {} events per partition...",
        args.events_per_partition
    );
    let body = bytes::Bytes::from(vec![b'x'; args.event_size]);
    let producer = client.producer();
    for p in 0..args.partitions {
        let mut left = args.events_per_partition;
        while left > 0 {
            let n = left.min(LOAD_BATCH as u64);
            let events = vec![EventData::from_body(body.clone()); n as usize];
            producer
                .send(hub, SendTarget::PartitionId(p.to_string()), events)
                .await?;
            left -= n;
        }
    }
    // Forget phase 1's checkpoints (they point into the backlog).
    client.delete_consumer_group(hub, GROUP).await?;
    client.create_consumer_group(hub, GROUP).await?;
    let total = u64::from(args.partitions) * args.events_per_partition;
    let events = Arc::new(AtomicU64::new(0));
    let checkpoints = Arc::new(AtomicU64::new(0));
    let highest: Arc<std::sync::Mutex<std::collections::HashMap<String, i64>>> = Default::default();
    eprintln!(
        "phase 2: {} processors draining {total} events...",
        args.processors
    );
    let started = Instant::now();
    let mut processors = Vec::new();
    for i in 0..args.processors {
        let handler = Arc::new(Counter {
            events: events.clone(),
            checkpoints: checkpoints.clone(),
            every: args.checkpoint_every,
            since: Default::default(),
            highest: highest.clone(),
        });
        let options = EventProcessorOptions {
            owner_id: format!("bench-{i}"),
            strategy: LoadBalancingStrategy::Greedy,
            load_balancing_interval: args.load_balancing_interval,
            ownership_expiration: args.load_balancing_interval * 3,
            ..EventProcessorOptions::default()
        };
        processors.push(
            EventProcessor::new(client, hub, GROUP, handler, options)
                .start()
                .await?,
        );
    }
    wait_until("balancing", || balanced(&processors, args.partitions)).await?;
    let balanced_seconds = started.elapsed().as_secs_f64();
    let last = args.events_per_partition as i64 - 1;
    wait_until("draining the backlog", || {
        let highest = highest.lock().expect("counter lock");
        highest.len() == args.partitions as usize && highest.values().all(|&h| h >= last)
    })
    .await?;
    let drain_seconds = started.elapsed().as_secs_f64();
    let events_delivered = events.load(Ordering::Relaxed);
    let written = checkpoints.load(Ordering::Relaxed);

    // Phase 3: one processor leaves.
    eprintln!("phase 3: one processor stops...");
    let leaving = processors.pop().expect("at least two processors");
    let left_partitions = leaving.owned_partitions();
    let stopped = Instant::now();
    leaving.stop().await;
    wait_until("the takeover", || {
        let owned: BTreeSet<String> = processors
            .iter()
            .flat_map(|p| p.owned_partitions())
            .collect();
        left_partitions.is_subset(&owned)
    })
    .await?;
    let takeover_seconds = stopped.elapsed().as_secs_f64();
    for p in processors {
        p.stop().await;
    }
    let interval = args.load_balancing_interval.as_secs_f64();
    Ok(CheckpointsReport {
        hub: hub.to_string(),
        partitions: args.partitions,
        processors: args.processors,
        checkpoint_every: args.checkpoint_every,
        store_checkpoints_per_second,
        store_latency_ms: LatencyReport::of(&store_latency),
        balanced_seconds,
        balanced_intervals: balanced_seconds / interval,
        drain_seconds,
        events_processed: total,
        events_delivered,
        events_per_second: total as f64 / drain_seconds,
        processor_checkpoints: written,
        processor_checkpoints_per_second: written as f64 / drain_seconds,
        takeover_seconds,
        takeover_intervals: takeover_seconds / interval,
    })
}

fn table(r: &CheckpointsReport) -> String {
    let rows = [
        (
            "partitions / processors",
            format!("{} / {}", r.partitions, r.processors),
        ),
        (
            "store: checkpoints/s",
            format!("{:.0}", r.store_checkpoints_per_second),
        ),
        (
            "store: latency p50 / p99 / max",
            format!(
                "{:.2} / {:.2} / {:.2} ms",
                r.store_latency_ms.p50, r.store_latency_ms.p99, r.store_latency_ms.max
            ),
        ),
        (
            "processors: balanced after",
            format!(
                "{:.2} s ({:.1} intervals)",
                r.balanced_seconds, r.balanced_intervals
            ),
        ),
        (
            "processors: events/s while draining",
            format!(
                "{:.0} ({} events in {:.2} s; {} deliveries)",
                r.events_per_second, r.events_processed, r.drain_seconds, r.events_delivered
            ),
        ),
        (
            "processors: checkpoints/s (every N events)",
            format!(
                "{:.1} (N = {})",
                r.processor_checkpoints_per_second, r.checkpoint_every
            ),
        ),
        (
            "rebalance: takeover after a graceful stop",
            format!(
                "{:.2} s ({:.1} intervals)",
                r.takeover_seconds, r.takeover_intervals
            ),
        ),
    ];
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:<width$}  {v}\n"))
        .collect()
}
