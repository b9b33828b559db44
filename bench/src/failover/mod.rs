//! `tributary bench failover`: starts a local cluster of this executable's own `serve`
//! processes, puts it under load, and kills partition leaders one at a time, measuring how
//! long each partition takes to accept writes again.

mod load;
mod probe;
mod report;
mod status;

pub use report::{FailoverReport, KillRecord};

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use tokio::time::Instant;
use tributary_client::{Client, ErrorReason, EventData};

use crate::local_cluster::{LocalCluster, finish_run, interrupted, new_run_dir};

use load::BackgroundLoad;
use probe::Prober;

/// Replicas per partition: one on each of three nodes.
const REPLICATION_FACTOR: u32 = 3;
/// Partitions per hub the bench creates (the nodes' default `--partitions-per-hub-max`).
const HUB_PARTITIONS_MAX: u32 = 1024;
/// How long a node may take from start (or restart) until `/readyz` answers 200.
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long creating the hubs may keep retrying while the controller is being elected.
const CREATE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the cluster may take to settle: every partition led, every replica caught up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);
/// A replica this many applied entries behind its leader counts as caught up (under load
/// one is rarely exactly level when the status is taken).
const SETTLE_LAG_ENTRIES_MAX: i64 = 32;
/// How long the load may take to complete its first round over all partitions.
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one cluster status call may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two status or readiness polls.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

#[derive(Debug, Clone, clap::Args)]
pub struct FailoverArgs {
    /// Leader kills to measure. Each kill SIGKILLs the node leading the next partition (in
    /// turn), measures until that partition accepts a write again, then restarts the node and
    /// waits until it is ready and caught up.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..))]
    pub kills: u32,
    /// Partition replicas each node hosts. Every partition has 3 replicas, so the cluster
    /// has partitions-per-node × nodes ÷ 3 partitions (rounded up).
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub partitions_per_node: u32,
    /// Nodes of the local cluster, 3 to 9.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(3..=9))]
    pub nodes: u32,
    /// Background producers; each sends one batch at a time to every partition in turn.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(1..))]
    pub producers: u32,
    /// Events per background send.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// Body size of each background event, in bytes.
    #[arg(long, default_value_t = 100)]
    pub event_size: usize,
    /// How often a probe send goes to the partition whose leader was killed, until one is
    /// acknowledged.
    #[arg(long, default_value = "20ms", value_parser = humantime::parse_duration)]
    pub probe_interval: Duration,
    /// A partition that does not accept a write this long after the kill counts as not
    /// recovered (and misses the targets).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub recovery_timeout: Duration,
    /// Where to put the run's directory (`tributary-bench-failover-*`, holding each node's
    /// data directory and log `node-N.log`). Default: the system's temporary directory.
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Keep the run's directory. Without it, the directory is removed after a run in which
    /// every kill recovered within the targets, and kept (its path printed) otherwise.
    #[arg(long)]
    pub keep_data: bool,
    /// A further `serve` flag for every node, repeatable, e.g. `--node-arg=--storage-shards=2`.
    #[arg(long, allow_hyphen_values = true, value_name = "FLAG")]
    pub node_arg: Vec<String>,
}

/// A partition of one of the bench's hubs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PartitionRef {
    pub(crate) event_hub: String,
    pub(crate) partition_id: String,
}

/// Runs the failover bench and prints its report on stdout: a table, or one JSON object if
/// `json`. Progress goes to stderr. The nodes are killed when it returns, also on an error
/// or an interrupt (SIGINT, SIGTERM, SIGHUP).
pub async fn run(args: FailoverArgs, json: bool) -> anyhow::Result<FailoverReport> {
    let executable = std::env::current_exe()
        .context("cannot find this executable to start the bench's nodes from")?;
    let run_dir = new_run_dir(args.data_dir.as_deref(), "failover")?;

    let mut cluster = None;
    let outcome = tokio::select! {
        outcome = bench(&args, &executable, run_dir.path(), &mut cluster) => outcome,
        signal = interrupted() => Err(anyhow!("interrupted by {signal}")),
    };
    if let Some(cluster) = cluster.as_mut() {
        cluster.stop().await;
    }

    let keep = args.keep_data || outcome.as_ref().map_or(true, |r| !r.targets_met());
    let report = finish_run(outcome, run_dir, keep, "failover", json, |report, json| {
        if json {
            report.to_json()
        } else {
            report.to_table()
        }
    })?;
    Ok(report)
}

async fn bench(
    args: &FailoverArgs,
    executable: &Path,
    dir: &Path,
    cluster_slot: &mut Option<LocalCluster>,
) -> anyhow::Result<FailoverReport> {
    let partition_count = (args.partitions_per_node * args.nodes).div_ceil(REPLICATION_FACTOR);
    eprintln!(
        "starting {} nodes of {}...",
        args.nodes,
        executable.display()
    );
    let cluster = cluster_slot.insert(
        LocalCluster::start(
            "bench failover",
            executable,
            dir,
            args.nodes,
            &args.node_arg,
            READY_TIMEOUT,
        )
        .await?,
    );
    let endpoints: Vec<String> = cluster.nodes.iter().map(|n| n.endpoint()).collect();
    let mut status_clients = Vec::with_capacity(endpoints.len());
    for endpoint in &endpoints {
        status_clients.push(Client::connect(endpoint).await?);
    }

    eprintln!("creating {partition_count} partitions with {REPLICATION_FACTOR} replicas each...");
    let (hubs, targets) = create_hubs(&status_clients[0], partition_count).await?;
    let targets: Arc<[PartitionRef]> = targets.into();
    let settle_started = Instant::now();
    wait_settled(&status_clients[0], cluster.nodes.len(), &hubs).await?;
    eprintln!(
        "every partition is led and replicated ({:.1}s)",
        settle_started.elapsed().as_secs_f64()
    );

    let body = Bytes::from(vec![b'x'; args.event_size]);
    let load = BackgroundLoad::start(
        &endpoints,
        targets.clone(),
        args.producers,
        vec![EventData::from_body(body); args.batch_size as usize],
    )
    .await?;
    wait_warm(&load, targets.len() as u64).await?;
    eprintln!(
        "load running: {} producers over {} partitions",
        args.producers,
        targets.len()
    );

    let prober = Prober::new(&endpoints).await?;
    let mut kills = Vec::with_capacity(args.kills as usize);
    for kill in 0..args.kills as usize {
        // Rotate over the partitions, spread over all of them.
        let target = &targets[kill * targets.len() / args.kills as usize % targets.len()];
        let record = kill_leader(
            cluster,
            &status_clients,
            &prober,
            &hubs,
            target,
            args,
            (kill + 1, args.kills as usize),
        )
        .await?;
        kills.push(record);
    }

    let (load_sends, load_errors) = load.stop().await;
    Ok(FailoverReport::from_measurements(report::Measurements {
        nodes: args.nodes,
        partitions: partition_count,
        replication_factor: REPLICATION_FACTOR,
        producers: args.producers,
        batch_size: args.batch_size,
        event_size_bytes: args.event_size,
        load_sends,
        load_errors,
        kills,
    }))
}

/// Kills the node leading `target`, measures until `target` accepts a write, restarts the
/// node and waits until the cluster has settled again. Prints one line.
async fn kill_leader(
    cluster: &mut LocalCluster,
    status_clients: &[Client],
    prober: &Prober,
    hubs: &[String],
    target: &PartitionRef,
    args: &FailoverArgs,
    (number, total): (usize, usize),
) -> anyhow::Result<KillRecord> {
    let victim = find_leader(cluster, &status_clients[0], target).await?;
    let survivors: Vec<String> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != victim)
        .map(|(_, n)| n.endpoint())
        .collect();
    let killed_node = cluster.nodes[victim].id;
    let pid = cluster.nodes[victim].pid().unwrap_or(0);

    cluster.kill(victim)?;
    let killed_at = Instant::now();
    let recovery = prober
        .measure(
            target,
            &survivors,
            killed_at,
            args.probe_interval,
            args.recovery_timeout,
        )
        .await;
    cluster.reap(victim).await?;
    let what = format!(
        "kill {number}/{total}: node {killed_node} (pid {pid}) led partition {} of '{}'",
        target.partition_id, target.event_hub
    );
    match &recovery {
        Ok(elapsed) => eprintln!(
            "{what}; writes accepted again after {:.3}s",
            elapsed.as_secs_f64()
        ),
        Err(error) => eprintln!(
            "{what}; NOT accepting writes {} after the kill (last probe: {error})",
            humantime::format_duration(args.recovery_timeout)
        ),
    }

    let restarted_at = Instant::now();
    cluster.restart(victim, READY_TIMEOUT).await?;
    let survivor = (victim + 1) % status_clients.len();
    wait_settled(&status_clients[survivor], cluster.nodes.len(), hubs).await?;
    let rejoin = restarted_at.elapsed();
    eprintln!(
        "    node {killed_node} restarted, ready and caught up after {:.1}s",
        rejoin.as_secs_f64()
    );
    Ok(KillRecord {
        event_hub: target.event_hub.clone(),
        partition_id: target.partition_id.clone(),
        killed_node,
        recovery_seconds: recovery.ok().map(|d| d.as_secs_f64()),
        rejoin_seconds: rejoin.as_secs_f64(),
    })
}

/// The index (into the cluster's nodes) of the node leading `target`, waiting for the
/// status to show one.
async fn find_leader(
    cluster: &LocalCluster,
    client: &Client,
    target: &PartitionRef,
) -> anyhow::Result<usize> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let status = cluster_status(client).await?;
        if let Some(addr) = status::leader_addr(&status, &target.event_hub, &target.partition_id) {
            return cluster
                .nodes
                .iter()
                .position(|n| n.client_addr() == addr)
                .ok_or_else(|| {
                    anyhow!(
                        "the leader of partition {} of '{}' is at {addr}, which is not one \
                         of the bench's nodes",
                        target.partition_id,
                        target.event_hub
                    )
                });
        }
        if Instant::now() >= deadline {
            bail!(
                "partition {} of '{}' had no leader for {}",
                target.partition_id,
                target.event_hub,
                humantime::format_duration(SETTLE_TIMEOUT)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Creates hubs with `partition_count` partitions in all (replication factor 3); returns
/// their names and partitions.
async fn create_hubs(
    client: &Client,
    partition_count: u32,
) -> anyhow::Result<(Vec<String>, Vec<PartitionRef>)> {
    let mut hubs = Vec::new();
    let mut targets = Vec::new();
    let mut remaining = partition_count;
    while remaining > 0 {
        let count = remaining.min(HUB_PARTITIONS_MAX);
        remaining -= count;
        let name = format!("failover-{:08x}", rand::random::<u32>());
        let hub = create_hub(client, &name, count).await?;
        let mut ids = hub.partition_ids;
        if ids.is_empty() {
            ids = (0..hub.partition_count).map(|p| p.to_string()).collect();
        }
        targets.extend(ids.into_iter().map(|partition_id| PartitionRef {
            event_hub: name.clone(),
            partition_id,
        }));
        hubs.push(name);
    }
    Ok((hubs, targets))
}

/// Creates one hub, retrying while the cluster is not ready for it yet.
async fn create_hub(
    client: &Client,
    name: &str,
    partitions: u32,
) -> anyhow::Result<tributary_client::EventHubProperties> {
    let deadline = Instant::now() + CREATE_TIMEOUT;
    loop {
        let error = match client
            .create_replicated_event_hub(name, partitions, None, Some(REPLICATION_FACTOR))
            .await
        {
            Ok(hub) => return Ok(hub),
            // An earlier attempt that seemed to fail went through.
            Err(error) if error.reason() == Some(ErrorReason::AlreadyExists) => {
                return Ok(client.get_event_hub(name).await?);
            }
            Err(error) => error,
        };
        if !error.is_transient() || Instant::now() >= deadline {
            return Err(error).with_context(|| {
                format!("cannot create the hub '{name}' with {partitions} partitions")
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until every node is up, every partition of `hubs` is led and every replica is
/// (close to) caught up.
async fn wait_settled(client: &Client, nodes: usize, hubs: &[String]) -> anyhow::Result<()> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let status = cluster_status(client).await?;
        let Some(reason) = status::unsettled(&status, nodes, hubs, SETTLE_LAG_ENTRIES_MAX) else {
            return Ok(());
        };
        if Instant::now() >= deadline {
            bail!(
                "the cluster did not settle within {}: {reason}",
                humantime::format_duration(SETTLE_TIMEOUT)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until the load has completed a round over all partitions.
async fn wait_warm(load: &BackgroundLoad, sends: u64) -> anyhow::Result<()> {
    let deadline = Instant::now() + WARM_UP_TIMEOUT;
    while load.sends() < sends {
        if Instant::now() >= deadline {
            bail!(
                "the background load made only {} of {sends} sends within {}",
                load.sends(),
                humantime::format_duration(WARM_UP_TIMEOUT)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    Ok(())
}

async fn cluster_status(client: &Client) -> anyhow::Result<tributary_proto::v1::ClusterStatus> {
    tokio::time::timeout(STATUS_TIMEOUT, client.cluster_status())
        .await
        .map_err(|_| {
            anyhow!(
                "{} did not answer the cluster status within {STATUS_TIMEOUT:?}",
                client.endpoint()
            )
        })?
        .with_context(|| format!("cannot read the cluster status from {}", client.endpoint()))
}
