//! `tributary bench retention`: the soak that shows a hub's disk use stays flat under
//! retention. Starts a local cluster of this executable's own `serve` processes (with a
//! `--retention-min` low enough for the chosen retention), creates a hub with that
//! retention, sends a steady paced load for well past one retention period, and samples
//! each node's data directory on disk (and its `tributary_storage_data_bytes` gauge, where
//! the node exports it). From one retention period and two retention intervals on (the
//! steady state) the disk use must stay flat; see [`report::flatness`].

mod load;
mod report;

pub use report::{DiskSample, Flatness, RetentionReport};

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::time::Instant;
use tributary_client::{Client, ErrorReason, HubOptions};

use crate::local_cluster::{LocalCluster, interrupted, keep_or_remove, new_run_dir};
use crate::metrics;
use load::{LoadCounts, LoadPlan, SteadyLoad};

/// Replicas per partition, or one per node on a smaller cluster.
const REPLICATION_FACTOR_MAX: u32 = 3;
/// Storage shards of every node: each writes one log segment at a time, the slack the
/// verdict allows for space returning a whole segment at a time.
const STORAGE_SHARDS: u64 = 1;
/// The hub the soak creates.
const HUB: &str = "soak";
/// The nodes' bounds for `--retention-min`, `--retention-interval` and `--segment-bytes`.
const NODE_RETENTION_MIN_FLOOR: Duration = Duration::from_secs(1);
const NODE_RETENTION_MIN_CEILING: Duration = Duration::from_secs(3600);
const NODE_RETENTION_INTERVAL_MIN: Duration = Duration::from_millis(100);
const NODE_RETENTION_INTERVAL_MAX: Duration = Duration::from_secs(3600);
const NODE_SEGMENT_BYTES_MIN: u64 = 64 * 1024;
const NODE_SEGMENT_BYTES_MAX: u64 = 1024 * 1024 * 1024;
/// The shortest sample interval: a sample walks every node's data directory.
const SAMPLE_INTERVAL_MIN: Duration = Duration::from_millis(100);
/// How long a node may take from start until `/readyz` answers 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long creating the hub may keep retrying, and its partitions may take to get leaders.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two attempts to create the hub or reads of the cluster status.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// Nodes of the local cluster, 1 to 9. Partitions have 3 replicas (one per node on a
    /// smaller cluster).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=9))]
    pub nodes: u32,
    /// Partitions of the hub.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub partitions: u32,
    /// The hub's retention, at least 1s. The nodes run with a `--retention-min` that allows
    /// it.
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub retention: Duration,
    /// The nodes' `--retention-interval`: how often each replica removes what its hub no
    /// longer retains (100ms to 1h).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub retention_interval: Duration,
    /// The nodes' `--segment-bytes` (65536 to 1073741824; the default is the node's).
    /// Space returns a segment at a time, so one segment per node is the least growth the
    /// verdict allows.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub segment_bytes: u64,
    /// How long to send. The disk use is judged from one retention period and two retention
    /// intervals after the start on, over at least 3 samples; a long run lasts well past
    /// one retention period.
    #[arg(long, default_value = "3h", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Events per second over all producers, each sending a batch every 100ms on a fixed
    /// schedule (a late send delays the schedule; it is not made up in a burst).
    #[arg(long, default_value_t = 1000.0, value_parser = crate::positive_rate)]
    pub rate: f64,
    /// Body size of each event, in bytes.
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..=262_144))]
    pub event_bytes: u32,
    /// Concurrent producers; they take the partitions in turn and send through the nodes in
    /// turn. A send that fails (after the client's retries) is counted and reported, and the
    /// producer goes on.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub producers: u32,
    /// How often to sample every node's data directory on disk (allocated blocks of every
    /// file in it) and its `tributary_storage_data_bytes` gauge, printing a progress line,
    /// e.g. 1m, or 2s for a quick run.
    #[arg(long, default_value = "1m", value_parser = humantime::parse_duration)]
    pub sample_interval: Duration,
    /// Where to put the run's directory (`tributary-bench-retention-*`, holding each node's
    /// data directory and log `node-N.log`); it is kept. Default: the system's temporary
    /// directory, and the run's directory is removed after a flat run (kept, its path
    /// printed, otherwise).
    #[arg(long)]
    pub dir: Option<PathBuf>,
}

/// The settings derived from the arguments, checked before anything starts.
#[derive(Debug)]
struct Plan {
    replication_factor: u32,
    steady_state_from: Duration,
    duration_min: Duration,
    node_args: Vec<String>,
}

impl RetentionArgs {
    fn plan(&self) -> anyhow::Result<Plan> {
        if self.retention < NODE_RETENTION_MIN_FLOOR {
            bail!(
                "--retention {} is below the nodes' lowest --retention-min: use 1s or more",
                humantime::format_duration(self.retention)
            );
        }
        if !(NODE_RETENTION_INTERVAL_MIN..=NODE_RETENTION_INTERVAL_MAX)
            .contains(&self.retention_interval)
        {
            bail!("--retention-interval must be between 100ms and 1h");
        }
        if !(NODE_SEGMENT_BYTES_MIN..=NODE_SEGMENT_BYTES_MAX).contains(&self.segment_bytes) {
            bail!("--segment-bytes must be between 65536 and 1073741824");
        }
        if self.sample_interval < SAMPLE_INTERVAL_MIN {
            bail!("--sample-interval must be at least 100ms");
        }
        let send_bytes =
            load::events_per_send(self.rate, self.producers).ceil() * f64::from(self.event_bytes);
        if send_bytes > load::SEND_BYTES_MAX as f64 {
            bail!(
                "--rate {} of {}-byte events needs sends of {:.0} KiB from each of {} producers \
                 (every {:?}), more than {} KiB: use more --producers",
                self.rate,
                self.event_bytes,
                send_bytes / 1024.0,
                self.producers,
                load::SEND_INTERVAL,
                load::SEND_BYTES_MAX / 1024
            );
        }
        let steady_state_from = self.retention + self.retention_interval * 2;
        let duration_min =
            steady_state_from + self.sample_interval * report::STEADY_SAMPLES_MIN as u32;
        if self.duration < duration_min {
            bail!(
                "--duration {} is too short for --retention {}: the disk use is judged from {} \
                 on (the retention and two --retention-interval), over at least {} samples \
                 (--sample-interval {}); run for at least {}",
                humantime::format_duration(self.duration),
                humantime::format_duration(self.retention),
                humantime::format_duration(steady_state_from),
                report::STEADY_SAMPLES_MIN,
                humantime::format_duration(self.sample_interval),
                humantime::format_duration(duration_min)
            );
        }
        let retention_min = self.retention.min(NODE_RETENTION_MIN_CEILING);
        let node_args = vec![
            "--retention-min".to_owned(),
            format!("{}ms", retention_min.as_millis()),
            "--retention-interval".to_owned(),
            format!("{}ms", self.retention_interval.as_millis()),
            "--segment-bytes".to_owned(),
            self.segment_bytes.to_string(),
            "--storage-shards".to_owned(),
            STORAGE_SHARDS.to_string(),
        ];
        Ok(Plan {
            replication_factor: self.nodes.min(REPLICATION_FACTOR_MAX),
            steady_state_from,
            duration_min,
            node_args,
        })
    }
}

/// Runs the soak and prints its report on stdout: a table, or one JSON object if `json`.
/// Progress goes to stderr. Fails if the disk use did not stay flat, or the run was too
/// short to tell; an interrupt (SIGINT, SIGTERM, SIGHUP) prints the curve so far. The nodes
/// are killed when it returns.
pub async fn run(args: RetentionArgs, json: bool) -> anyhow::Result<RetentionReport> {
    let plan = args.plan()?;
    let executable = std::env::current_exe()
        .context("cannot find this executable to start the soak's nodes from")?;
    let run_dir = new_run_dir(args.dir.as_deref(), "retention")?;

    let mut cluster = None;
    let mut soak = Soak::default();
    let outcome = tokio::select! {
        outcome = soak.run(&args, &plan, &executable, run_dir.path(), &mut cluster) => outcome,
        signal = interrupted() => Err(anyhow!("interrupted by {signal}")),
    };
    let counts = match soak.load.take() {
        Some(load) => load.stop().await,
        None => soak.counts,
    };
    if let Some(cluster) = cluster.as_mut() {
        cluster.stop().await;
    }

    let report = RetentionReport::from_measurements(
        report::Measurements {
            nodes: args.nodes,
            partitions: args.partitions,
            replication_factor: plan.replication_factor,
            producers: args.producers,
            retention_seconds: args.retention.as_secs_f64(),
            retention_interval_seconds: args.retention_interval.as_secs_f64(),
            segment_bytes: args.segment_bytes,
            segments_per_node: STORAGE_SHARDS,
            event_bytes: args.event_bytes as usize,
            target_events_per_second: args.rate,
            duration_seconds: args.duration.as_secs_f64(),
            steady_state_from_seconds: plan.steady_state_from.as_secs_f64(),
            duration_min_seconds: plan.duration_min.as_secs_f64(),
            events_sent: counts.events_sent,
            sends_failed: counts.sends_failed,
            events_failed: counts.events_failed,
        },
        std::mem::take(&mut soak.samples),
    );
    let keep = args.dir.is_some() || outcome.is_err() || !report.flat;
    let run_dir = keep_or_remove(run_dir, keep);
    if outcome.is_ok() || !report.samples.is_empty() {
        if json {
            println!("{}", report.to_json());
        } else {
            print!("{}", report.to_table());
        }
    }
    if let Some(dir) = &run_dir {
        eprintln!(
            "kept the nodes' data directories and logs in {}",
            dir.display()
        );
    }
    outcome.context("the retention soak failed")?;
    if !report.flat {
        bail!(
            "the retention soak's disk use is not shown flat: {}",
            report.verdict
        );
    }
    Ok(report)
}

/// What a run has measured so far, kept outside the run so an interrupt still reports it.
#[derive(Default)]
struct Soak {
    samples: Vec<DiskSample>,
    load: Option<SteadyLoad>,
    counts: LoadCounts,
}

impl Soak {
    async fn run(
        &mut self,
        args: &RetentionArgs,
        plan: &Plan,
        executable: &Path,
        dir: &Path,
        cluster_slot: &mut Option<LocalCluster>,
    ) -> anyhow::Result<()> {
        eprintln!(
            "starting {} nodes of {}...",
            args.nodes,
            executable.display()
        );
        let cluster = cluster_slot.insert(
            LocalCluster::start(
                "bench retention",
                executable,
                dir,
                args.nodes,
                &plan.node_args,
                READY_TIMEOUT,
            )
            .await?,
        );
        let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.endpoint()).collect();
        let client = Client::connect(&endpoints[0]).await?;
        let partition_ids = create_hub(&client, args, plan).await?;
        eprintln!(
            "sending {:.0} events/s of {} B from {} producers to '{HUB}' ({} partitions, \
             replication factor {}, retention {}) for {}; steady state from {} on",
            args.rate,
            args.event_bytes,
            args.producers,
            partition_ids.len(),
            plan.replication_factor,
            humantime::format_duration(args.retention),
            humantime::format_duration(args.duration),
            humantime::format_duration(plan.steady_state_from)
        );

        let start = Instant::now();
        let load = self.load.insert(
            SteadyLoad::start(
                LoadPlan {
                    endpoints: &endpoints,
                    hub: HUB,
                    partition_ids: &partition_ids,
                    producers: args.producers,
                    rate: args.rate,
                    event_bytes: args.event_bytes as usize,
                },
                start,
            )
            .await?,
        );
        let data_dirs: Vec<PathBuf> = cluster
            .nodes
            .iter()
            .map(|n| n.data_dir().to_path_buf())
            .collect();
        let metrics_urls: Vec<String> = cluster.nodes.iter().map(|n| n.metrics_url()).collect();
        for at in sample_times(args.duration, args.sample_interval) {
            tokio::time::sleep_until(start + at).await;
            cluster.check_running()?;
            let counts = load.counts();
            let sample = take_sample(start.elapsed(), counts, &data_dirs, &metrics_urls).await;
            eprintln!("{}", progress_line(&sample, plan.steady_state_from));
            self.samples.push(sample);
        }
        if let Some(load) = self.load.take() {
            self.counts = load.stop().await;
        }
        Ok(())
    }
}

/// When to sample, from the load's start: every `interval`, and at `duration`.
fn sample_times(duration: Duration, interval: Duration) -> Vec<Duration> {
    let mut times: Vec<Duration> = (0..)
        .map(|k| interval * k)
        .take_while(|at| *at < duration)
        .collect();
    times.push(duration);
    times
}

/// Creates the soak's hub, retrying while the cluster is not ready for it, and waits until
/// every partition has a leader; returns the partition ids.
async fn create_hub(
    client: &Client,
    args: &RetentionArgs,
    plan: &Plan,
) -> anyhow::Result<Vec<String>> {
    let options = HubOptions {
        retention: Some(args.retention),
        replication_factor: Some(plan.replication_factor),
        ..HubOptions::default()
    };
    let deadline = Instant::now() + CREATE_TIMEOUT;
    let hub = loop {
        let error = match client
            .create_event_hub_with_options(HUB, args.partitions, &options)
            .await
        {
            Ok(hub) => break hub,
            // An earlier attempt that seemed to fail went through.
            Err(error) if error.reason() == Some(ErrorReason::AlreadyExists) => {
                break client.get_event_hub(HUB).await?;
            }
            Err(error) => error,
        };
        if !error.is_transient() || Instant::now() >= deadline {
            return Err(error).with_context(|| {
                format!(
                    "cannot create the hub '{HUB}' with {} partitions",
                    args.partitions
                )
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    };
    let mut partition_ids = hub.partition_ids;
    if partition_ids.is_empty() {
        partition_ids = (0..hub.partition_count).map(|p| p.to_string()).collect();
    }
    loop {
        let status = client.cluster_status().await?;
        let led = status
            .partitions
            .iter()
            .filter(|p| p.event_hub == HUB && p.leader != 0)
            .count();
        if led == partition_ids.len() {
            return Ok(partition_ids);
        }
        if Instant::now() >= deadline {
            bail!(
                "only {led} of {} partitions of '{HUB}' had a leader after {}",
                partition_ids.len(),
                humantime::format_duration(CREATE_TIMEOUT)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// One sample: every node's data directory on disk and its data gauge, read concurrently.
async fn take_sample(
    elapsed: Duration,
    counts: LoadCounts,
    data_dirs: &[PathBuf],
    metrics_urls: &[String],
) -> DiskSample {
    let walks = data_dirs.iter().map(|dir| {
        let dir = dir.clone();
        async move {
            tokio::task::spawn_blocking(move || disk_bytes(&dir))
                .await
                .expect("a directory walk does not panic")
        }
    });
    let gauges = metrics_urls.iter().map(|url| async move {
        let page = metrics::http_get(url).await.ok()?;
        metrics::counter_sum(&page, metrics::DATA_BYTES_METRIC).map(|bytes| bytes as u64)
    });
    let (disk_bytes, data_bytes_gauge) = futures::future::join(
        futures::future::join_all(walks),
        futures::future::join_all(gauges),
    )
    .await;
    DiskSample {
        elapsed_seconds: elapsed.as_secs_f64(),
        events_sent: counts.events_sent,
        sends_failed: counts.sends_failed,
        total_disk_bytes: disk_bytes.iter().sum(),
        disk_bytes,
        data_bytes_gauge,
    }
}

/// Bytes the files under `dir` take on disk (allocated 512-byte blocks), recursively,
/// without following symbolic links. A file removed during the walk (a segment retention
/// deleted) counts as gone.
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut total = 0;
    for entry in entries.flatten() {
        let Ok(meta) = std::fs::symlink_metadata(entry.path()) else {
            continue;
        };
        if meta.is_dir() {
            total += disk_bytes(&entry.path());
        } else {
            total += meta.blocks() * 512;
        }
    }
    total
}

/// `[1m 0s] 60000 events sent, 0 failed sends; disk MiB: 12.1 12.1 12.0, total 36.2`.
fn progress_line(sample: &DiskSample, steady_state_from: Duration) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let elapsed = Duration::from_secs(sample.elapsed_seconds.round() as u64);
    let nodes: Vec<String> = sample
        .disk_bytes
        .iter()
        .map(|b| format!("{:.1}", *b as f64 / MIB))
        .collect();
    let gauges: Vec<u64> = sample.data_bytes_gauge.iter().flatten().copied().collect();
    let gauge = if gauges.is_empty() {
        String::new()
    } else {
        format!(
            " (data gauge {:.1} MiB)",
            gauges.iter().sum::<u64>() as f64 / MIB
        )
    };
    let phase = if sample.elapsed_seconds >= steady_state_from.as_secs_f64() {
        ", steady state"
    } else {
        ""
    };
    format!(
        "[{}] {} events sent, {} failed sends; disk MiB by node: {}, total {:.1}{gauge}{phase}",
        humantime::format_duration(elapsed),
        sample.events_sent,
        sample.sends_failed,
        nodes.join(" "),
        sample.total_disk_bytes as f64 / MIB
    )
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RetentionArgs,
    }

    fn parse(flags: &[&str]) -> RetentionArgs {
        Cli::try_parse_from(std::iter::once("retention").chain(flags.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn samples_every_interval_and_at_the_end() {
        let s = Duration::from_secs;
        assert_eq!(sample_times(s(5), s(2)), vec![s(0), s(2), s(4), s(5)]);
        assert_eq!(sample_times(s(4), s(2)), vec![s(0), s(2), s(4)]);
    }

    #[test]
    fn the_defaults_soak_a_one_hour_retention_for_three_hours() {
        let args = parse(&[]);
        let plan = args.plan().unwrap();
        assert_eq!(plan.replication_factor, 3);
        assert_eq!(plan.steady_state_from, Duration::from_secs(3660));
        assert_eq!(
            plan.node_args,
            [
                "--retention-min",
                "3600000ms",
                "--retention-interval",
                "30000ms",
                "--segment-bytes",
                "67108864",
                "--storage-shards",
                "1"
            ]
        );
    }

    #[test]
    fn a_run_too_short_for_the_retention_names_the_minimum() {
        let args = parse(&[
            "--retention",
            "4s",
            "--duration",
            "5s",
            "--sample-interval",
            "2s",
        ]);
        let error = args.plan().err().unwrap().to_string();
        assert!(
            error.contains("--duration 5s is too short for --retention 4s")
                && error.contains("run for at least 1m 10s"),
            "{error}"
        );
        let args = parse(&[
            "--retention",
            "4s",
            "--retention-interval",
            "200ms",
            "--duration",
            "11s",
            "--sample-interval",
            "2s",
            "--nodes",
            "1",
        ]);
        let plan = args.plan().unwrap();
        assert_eq!(plan.replication_factor, 1);
        assert_eq!(plan.node_args[1], "4000ms");
        assert!(parse(&["--retention", "500ms"]).plan().is_err());
        assert!(
            parse(&["--rate", "100000", "--producers", "1"])
                .plan()
                .unwrap_err()
                .to_string()
                .contains("use more --producers")
        );
    }

    #[test]
    fn disk_use_counts_allocated_blocks_recursively() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("shard-0")).unwrap();
        std::fs::write(dir.path().join("shard-0/segment"), vec![1u8; 100_000]).unwrap();
        std::fs::write(dir.path().join("meta"), b"x").unwrap();
        let bytes = disk_bytes(dir.path());
        assert!((100_000..200_000).contains(&bytes), "{bytes}");
        assert_eq!(disk_bytes(&dir.path().join("missing")), 0);
    }
}
