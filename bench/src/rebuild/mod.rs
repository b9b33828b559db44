//! `tributary bench rebuild`: starts a local cluster of this executable's own `serve`
//! processes, fills a one-partition hub past a retention cut, then wipes a follower's data
//! directory and measures its rebuild from a snapshot: how long it takes, the resident
//! memory of the leader and of the node being rebuilt, and the latency of paced sends to
//! the partition before and during it. With `--kill-mid-install` a second rebuild follows,
//! whose node is SIGKILLed part-way through the install and restarted. After each rebuild
//! the three replicas must hold identical events.

mod fill;
mod measure;
mod memory;
mod replicas;
mod report;
mod sends;

pub use report::{RebuildRecord, RebuildReport, SendWindow};

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::time::Instant;
use tributary_client::{Client, ErrorReason, HubOptions};

use crate::local_cluster::{LocalCluster, finish_run, interrupted, new_run_dir};
use fill::FillPlan;
use measure::Bench;
use memory::MemorySampler;
use replicas::{IDENTICAL_TIMEOUT, ReplicaContents, await_cut, await_identical, await_settled};

/// The hub the bench creates, and its one partition.
const HUB: &str = "rebuild";
const PARTITION: &str = "0";
/// Nodes of the local cluster; the partition has a replica on each.
const NODES: u32 = 3;
const REPLICATION_FACTOR: u32 = 3;
/// The nodes' Raft setting: frequent snapshot points, so many are taken during a rebuild.
/// (A wiped replica must be rebuilt from a snapshot whatever the log kept behind them:
/// retention has removed the front of the log.)
const RAFT_SNAPSHOT_ENTRIES: u64 = 100;
/// How often the nodes apply retention: soon after the fill passes the hub's cap.
const RETENTION_INTERVAL: &str = "1s";
/// `--gigabytes` are 10^9 bytes, at most this many.
const BYTES_PER_GIGABYTE: f64 = 1e9;
const GIGABYTES_MAX: f64 = 1000.0;
/// With `--kill-mid-install`, the node is killed once it has received this share of the
/// partition's bytes without having installed the snapshot.
const KILL_AT_RECEIVED_SHARE: f64 = 0.3;
/// How long a node may take from start (or restart) until `/readyz` answers 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long creating the hub may keep retrying while the controller is being elected.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// Pause between two looks at the cluster status, a node's metrics or the partition.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How often a rebuild under way prints where it is.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(10);
/// The nodes' counters the bench reads.
const RECEIVED_METRIC: &str = "tributary_rebuild_bytes_received_total";
const SENT_METRIC: &str = "tributary_rebuild_bytes_sent_total";
const INSTALLED_METRIC: &str = "tributary_raft_snapshots_installed_total";

#[derive(Debug, Clone, clap::Args)]
pub struct RebuildArgs {
    /// The partition's retained size to rebuild, in GB (10^9 bytes of event bodies). The
    /// hub gets a retention cap a little above it and the fill sends a little more, so
    /// retention has removed the earliest events before the rebuild.
    #[arg(long, default_value_t = 4.0, value_parser = gigabytes)]
    pub gigabytes: f64,
    /// Body size of each event of the fill, in bytes (1 to 262144); each send carries as
    /// many as fit in 256 KiB, 4 sends in flight, and the fill waits whenever a follower
    /// falls more than 16 sends behind.
    #[arg(long, default_value_t = 65536,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(fill::SEND_BYTES_MAX)))]
    pub event_bytes: u32,
    /// After the undisturbed rebuild, wipe the node again and SIGKILL it once it has
    /// received 30% of the partition's bytes (its `tributary_rebuild_bytes_received_total`)
    /// while it has installed no snapshot yet (`tributary_raft_snapshots_installed_total`
    /// 0); restart it and measure until it has finished.
    #[arg(long)]
    pub kill_mid_install: bool,
    /// Passed to every node as `--rebuild-bytes-per-second`: the bandwidth all rebuilds
    /// one node sends or receives share. Without it, the nodes' default.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub rebuild_bytes_per_second: Option<u64>,
    /// Paced sends per second (one 100-byte event each) to the partition, from before each
    /// wipe until the rebuild is done. A failed send is counted and retried.
    #[arg(long, default_value_t = 20.0, value_parser = crate::positive_rate)]
    pub sends_per_second: f64,
    /// The nodes' `--raft-log-keep-entries`: entries behind the latest snapshot point a
    /// leader keeps as log. A replica that has installed a snapshot catches up from the log
    /// after its point, so this must exceed the entries the partition takes during one
    /// install (each paced send is one): below that, the rebuilt node is sent snapshot
    /// after snapshot and never catches up.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub raft_log_keep_entries: u64,
    /// How long the paced sends and the nodes' memory are measured before each wipe.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub baseline: Duration,
    /// How long one rebuild may take, from the wiped node's restart until its replica is
    /// caught up (through a kill and restart with --kill-mid-install).
    #[arg(long, default_value = "20m", value_parser = humantime::parse_duration)]
    pub rebuild_timeout: Duration,
    /// Where to put the run's directory (`tributary-bench-rebuild-*`, holding each node's
    /// data directory and log `node-N.log`). Default: the system's temporary directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the run's directory. Without it, the directory is removed after a run whose
    /// replicas ended identical, and kept (its path printed) otherwise.
    #[arg(long)]
    pub keep_data: bool,
    /// A further `serve` flag for every node, repeatable, e.g. `--node-arg=--storage-shards=2`.
    #[arg(long, allow_hyphen_values = true, value_name = "FLAG")]
    pub node_arg: Vec<String>,
}

fn gigabytes(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(gb) if gb.is_finite() && gb > 0.0 && gb <= GIGABYTES_MAX => Ok(gb),
        _ => Err(format!(
            "'{text}' is not a size: give GB (10^9 bytes), above 0 and at most {GIGABYTES_MAX}"
        )),
    }
}

/// The settings derived from the arguments.
#[derive(Debug)]
struct Plan {
    fill: FillPlan,
    node_args: Vec<String>,
}

impl RebuildArgs {
    fn plan(&self) -> Plan {
        let retained_bytes_min = (self.gigabytes * BYTES_PER_GIGABYTE).ceil() as u64;
        let mut node_args = vec![
            "--raft-snapshot-entries".to_owned(),
            RAFT_SNAPSHOT_ENTRIES.to_string(),
            "--raft-log-keep-entries".to_owned(),
            self.raft_log_keep_entries.to_string(),
            "--retention-interval".to_owned(),
            RETENTION_INTERVAL.to_owned(),
        ];
        // Only when asked: a node without the flag refuses it.
        if let Some(rate) = self.rebuild_bytes_per_second {
            node_args.extend(["--rebuild-bytes-per-second".to_owned(), rate.to_string()]);
        }
        node_args.extend(self.node_arg.iter().cloned());
        Plan {
            fill: FillPlan::new(retained_bytes_min, self.event_bytes),
            node_args,
        }
    }
}

/// Runs the rebuild bench and prints its report on stdout: a table, or one JSON object if
/// `json`. Progress goes to stderr. Fails if the replicas did not end identical. The nodes
/// are killed when it returns, also on an error or an interrupt (SIGINT, SIGTERM, SIGHUP).
pub async fn run(args: RebuildArgs, json: bool) -> anyhow::Result<RebuildReport> {
    let plan = args.plan();
    let executable = std::env::current_exe()
        .context("cannot find this executable to start the bench's nodes from")?;
    let run_dir = new_run_dir(args.data_dir.as_deref(), "rebuild")?;

    let mut cluster = None;
    let outcome = tokio::select! {
        outcome = bench(&args, &plan, &executable, run_dir.path(), &mut cluster) => outcome,
        signal = interrupted() => Err(anyhow!("interrupted by {signal}")),
    };
    if let Some(cluster) = cluster.as_mut() {
        cluster.stop().await;
    }

    let keep = args.keep_data || outcome.as_ref().map_or(true, |r| !r.replicas_identical);
    let report = finish_run(outcome, run_dir, keep, "rebuild", json, |report, json| {
        if json {
            report.to_json()
        } else {
            report.to_table()
        }
    })?;
    if !report.replicas_identical {
        bail!("the replicas did not end identical after a rebuild (see the table)");
    }
    Ok(report)
}

async fn bench(
    args: &RebuildArgs,
    plan: &Plan,
    executable: &Path,
    dir: &Path,
    cluster_slot: &mut Option<LocalCluster>,
) -> anyhow::Result<RebuildReport> {
    eprintln!("starting {NODES} nodes of {}...", executable.display());
    let cluster = cluster_slot.insert(
        LocalCluster::start(
            "bench rebuild",
            executable,
            dir,
            NODES,
            &plan.node_args,
            READY_TIMEOUT,
        )
        .await?,
    );
    let mut clients = Vec::with_capacity(cluster.nodes.len());
    for node in &cluster.nodes {
        clients.push(Client::connect(&node.endpoint()).await?);
    }
    create_hub(&clients[0], plan.fill.retention_bytes_max).await?;
    let leader = node_index(cluster, await_settled(&clients[0]).await?)?;
    let sampler = MemorySampler::start(cluster.nodes.iter().map(|n| n.pid()).collect());
    let filled = fill_partition(&clients, leader, &sampler, &plan.fill).await?;
    let partition = filled.contents;

    let mut bench = Bench {
        args,
        cluster,
        clients,
        sampler,
        partition_bytes: partition.body_bytes,
    };
    let kinds: &[bool] = if args.kill_mid_install {
        &[false, true]
    } else {
        &[false]
    };
    let mut rebuilds = Vec::with_capacity(kinds.len());
    for (index, kill) in kinds.iter().enumerate() {
        let record = bench.rebuild(index + 1, *kill).await?;
        let identical = record.replicas_identical;
        rebuilds.push(record);
        if !identical {
            break;
        }
    }

    Ok(RebuildReport::from_measurements(report::Measurements {
        nodes: NODES,
        replication_factor: REPLICATION_FACTOR,
        raft_snapshot_entries: RAFT_SNAPSHOT_ENTRIES,
        raft_log_keep_entries: args.raft_log_keep_entries,
        rebuild_bytes_per_second: args.rebuild_bytes_per_second,
        event_bytes: plan.fill.event_bytes,
        requested_bytes: plan.fill.retained_bytes_min,
        retention_bytes_max: plan.fill.retention_bytes_max,
        load_events: plan.fill.events(),
        load_bytes: plan.fill.bytes(),
        load_seconds: filled.seconds,
        partition_bytes: partition.body_bytes,
        partition_events: partition.summary.count,
        begin_sequence_number: partition.summary.first_sequence_number.unwrap_or(-1),
        load_rss_mib: filled.rss_mib,
        sends_per_second: args.sends_per_second,
        rebuilds,
    }))
}

/// The fill: how long it took, each node's highest resident memory meanwhile, and what
/// the partition holds after the retention cut.
struct Filled {
    seconds: f64,
    rss_mib: Vec<Option<f64>>,
    contents: ReplicaContents,
}

/// Fills the partition (led by the node at `leader`) past the retention cut, waits for
/// the cut and for every replica to read the same, and checks the requested bytes stayed.
async fn fill_partition(
    clients: &[Client],
    leader: usize,
    sampler: &MemorySampler,
    plan: &FillPlan,
) -> anyhow::Result<Filled> {
    eprintln!(
        "filling partition {PARTITION} of '{HUB}' with {} events of {} B ({:.3} GB, {} per \
         send; retention cap {:.3} GB)...",
        plan.events(),
        plan.event_bytes,
        plan.bytes() as f64 / 1e9,
        plan.events_per_send,
        plan.retention_bytes_max as f64 / 1e9
    );
    sampler.take_max();
    let time = fill::fill(&clients[leader], HUB, PARTITION, plan).await?;
    let rss_mib = sampler.take_max().into_iter().map(report::to_mib).collect();
    await_cut(&clients[leader]).await?;
    let contents = await_identical(clients).await.map_err(|last| {
        anyhow!(
            "the replicas did not read identical within {} after the fill; last seen: {last}",
            humantime::format_duration(IDENTICAL_TIMEOUT)
        )
    })?;
    if contents.body_bytes < plan.retained_bytes_min {
        bail!(
            "the partition retains {} bytes of events, fewer than the {} asked for",
            contents.body_bytes,
            plan.retained_bytes_min
        );
    }
    eprintln!(
        "the partition retains {:.3} GB in {} events, from sequence number {} on",
        contents.body_bytes as f64 / 1e9,
        contents.summary.count,
        contents.summary.first_sequence_number.unwrap_or(-1)
    );
    Ok(Filled {
        seconds: time.as_secs_f64(),
        rss_mib,
        contents,
    })
}

/// The index (into the cluster's nodes) of node `id`.
fn node_index(cluster: &LocalCluster, id: u64) -> anyhow::Result<usize> {
    cluster
        .nodes
        .iter()
        .position(|n| n.id == id)
        .ok_or_else(|| anyhow!("node {id} is not one of the bench's nodes"))
}

/// Creates the hub, retrying while the cluster is not ready for it yet.
async fn create_hub(client: &Client, retention_bytes_max: u64) -> anyhow::Result<()> {
    let options = HubOptions {
        replication_factor: Some(REPLICATION_FACTOR),
        retention_bytes_max: Some(retention_bytes_max),
        ..HubOptions::default()
    };
    let deadline = Instant::now() + CREATE_TIMEOUT;
    loop {
        let error = match client.create_event_hub_with_options(HUB, 1, &options).await {
            // An earlier attempt that seemed to fail went through.
            Ok(_) => return Ok(()),
            Err(error) if error.reason() == Some(ErrorReason::AlreadyExists) => return Ok(()),
            Err(error) => error,
        };
        if !error.is_transient() || Instant::now() >= deadline {
            return Err(error).with_context(|| format!("cannot create the hub '{HUB}'"));
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: RebuildArgs,
    }

    fn parse(flags: &[&str]) -> Result<RebuildArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("rebuild").chain(flags.iter().copied()))
            .map(|cli| cli.args)
    }

    #[test]
    fn the_nodes_get_the_rebuild_budget_only_when_asked() {
        let plan = parse(&[]).unwrap().plan();
        assert_eq!(
            plan.node_args,
            [
                "--raft-snapshot-entries",
                "100",
                "--raft-log-keep-entries",
                "10000",
                "--retention-interval",
                "1s"
            ]
        );
        assert_eq!(plan.fill.retained_bytes_min, 4_000_000_000);
        assert_eq!(plan.fill.event_bytes, 65536);
        let plan = parse(&[
            "--gigabytes",
            "1.05",
            "--rebuild-bytes-per-second",
            "52428800",
            "--node-arg=--storage-shards=2",
        ])
        .unwrap()
        .plan();
        assert_eq!(
            plan.node_args[6..],
            [
                "--rebuild-bytes-per-second",
                "52428800",
                "--storage-shards=2"
            ]
        );
        assert_eq!(plan.fill.retained_bytes_min, 1_050_000_000);
    }

    #[test]
    fn sizes_out_of_range_are_refused() {
        for flags in [
            &["--gigabytes", "0"][..],
            &["--gigabytes", "-1"],
            &["--gigabytes", "NaN"],
            &["--gigabytes", "5000"],
            &["--event-bytes", "0"],
            &["--event-bytes", "262145"],
            &["--rebuild-bytes-per-second", "0"],
            &["--sends-per-second", "0"],
        ] {
            assert!(parse(flags).is_err(), "{flags:?}");
        }
        assert!(parse(&["--event-bytes", "262144"]).is_ok());
    }
}
