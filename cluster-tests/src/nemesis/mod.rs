//! The nemesis suite: a workload with a recorded history runs against nodes in containers
//! while faults are injected (seeded, one at a time, each healed before the next), then every
//! fault is healed, the partitions are read back and the checker judges the history.
//!
//! `cargo run -p tributary-cluster-tests --bin nemesis -- --help` (or `scripts/nemesis`)
//! runs it; the short suite is part of `scripts/test`.

pub mod checker;
pub mod faults;
pub mod history;
pub mod report;
pub mod workload;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use rand::Rng as _;
use rand::SeedableRng as _;
use rand::rngs::StdRng;
use tokio::time::Instant;
use tributary_client::{Client, EventPosition, replica_digest};

use crate::containers::{ContainerCluster, ContainerClusterSpec, NodeState};
use crate::eventually::poll_until;
use checker::{Bounds, CheckReport};
use faults::{NemesisKind, Undo};
use history::{FaultRecord, FinalPartition, History, Millis};
use workload::{
    MANAGED_GROUP_PREFIX, MANAGED_HUB_PREFIX, Recorder, Workload, WorkloadConfig, probe_send,
};

/// The workload's hub.
pub const HUB: &str = "nemesis";
/// Longest a previous processor may go on after the next owner started: a displaced owner
/// learns it at its next round, but one cut off from the checkpoint store only stops when
/// its ownership could expire (its last renewal plus the expiration), plus the batch in hand.
pub const HANDOFF_MAX: Duration =
    workload::PROCESSOR_EXPIRATION.saturating_add(Duration::from_secs(1));
/// Longest from a fault's heal to full availability.
pub const RECOVERY_MAX: Duration = Duration::from_secs(45);
/// How long the producers get to finish the batches they are retrying at the end.
const PRODUCER_DRAIN: Duration = Duration::from_secs(60);
/// How long replicas get to converge at the end.
const CONVERGE_WAIT: Duration = Duration::from_secs(120);
/// Each node's data volume when the disk nemesis runs.
const DATA_LIMIT_BYTES: u64 = 256 << 20;

/// One run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub image: String,
    pub nodes: usize,
    /// The nemeses to pick from (at random, one fault at a time).
    pub nemeses: Vec<NemesisKind>,
    /// How long faults are injected.
    pub time: Duration,
    pub seed: u64,
    pub run_dir: PathBuf,
    pub partitions: u32,
    /// Quiet time before each fault: from, to.
    pub quiet: (Duration, Duration),
    /// How long a fault stays: from, to.
    pub hold: (Duration, Duration),
    pub workload: WorkloadConfig,
}

impl RunConfig {
    /// The defaults for a run of `nemeses` for `time`.
    pub fn new(nemeses: Vec<NemesisKind>, time: Duration, seed: u64, run_dir: PathBuf) -> Self {
        RunConfig {
            image: crate::containers::IMAGE_DEFAULT.into(),
            nodes: 5,
            nemeses,
            time,
            seed,
            run_dir,
            partitions: 6,
            quiet: (Duration::from_secs(2), Duration::from_secs(5)),
            hold: (Duration::from_secs(4), Duration::from_secs(12)),
            workload: WorkloadConfig {
                hub: HUB.into(),
                partitions: 6,
                producers: 3,
                batch_max: 4,
                padding: 64,
                send_pause: Duration::from_millis(60),
                processors: 2,
                management: true,
                operations: true,
            },
        }
    }
}

/// What a run found.
#[derive(Debug, Clone)]
pub struct RunReport {
    pub seed: u64,
    pub nemeses: Vec<NemesisKind>,
    pub elapsed: Duration,
    pub check: CheckReport,
    /// Nodes that exited without the nemesis stopping them, and problems of the harness
    /// itself (a fault that could not be injected, a node that did not come back).
    pub incidents: Vec<String>,
    pub run_dir: PathBuf,
}

impl RunReport {
    /// The run's nemeses, comma-separated.
    pub fn nemesis_names(&self) -> String {
        let names: Vec<&str> = self.nemeses.iter().map(|k| k.name()).collect();
        names.join(",")
    }

    /// No checker violation and no node that died by itself.
    pub fn passed(&self) -> bool {
        self.check.is_valid() && self.incidents.is_empty()
    }
}

/// Starts the cluster and the workload, injects faults for `config.time`, heals, reads back
/// and checks.
pub async fn run(config: RunConfig) -> anyhow::Result<RunReport> {
    let started = Instant::now();
    std::fs::create_dir_all(&config.run_dir)
        .with_context(|| format!("cannot create {}", config.run_dir.display()))?;
    let names: Vec<&str> = config.nemeses.iter().map(|k| k.name()).collect();
    eprintln!(
        "nemesis run: seed {} (replay with --seed {}), nemeses {}, {:?} of faults, {} nodes, \
         files in {}",
        config.seed,
        config.seed,
        names.join(","),
        config.time,
        config.nodes,
        config.run_dir.display()
    );
    let mut rng = StdRng::seed_from_u64(config.seed);
    let spec = ContainerClusterSpec {
        image: config.image.clone(),
        nodes: config.nodes,
        run_dir: config.run_dir.clone(),
        data_limit_bytes: config
            .nemeses
            .contains(&NemesisKind::Disk)
            .then_some(DATA_LIMIT_BYTES),
        extra_args: vec![
            // A wiped or long-stopped node is not declared dead during a run.
            "--node-dead-timeout".into(),
            "10m".into(),
        ],
    };
    let mut cluster = ContainerCluster::start(spec).await?;
    eprintln!("cluster of {} nodes ready", cluster.len());
    let recorder = Recorder::new();
    let mut workload = Workload::start(
        recorder.clone(),
        config.workload.clone(),
        cluster.endpoints(),
        rng.random(),
    )
    .await?;
    let mut incidents = Vec::new();
    let result = inject_faults(&config, &mut cluster, &recorder, &mut rng, &mut incidents).await;
    if let Err(err) = &result {
        incidents.push(format!("the nemesis stopped early: {err:#}"));
    }
    eprintln!("faults over: healing everything and letting the workload finish");
    let end = Instant::now();
    let step = |what: &str| eprintln!("{:>7.1}s into the end: {what}", end.elapsed().as_secs_f64());
    heal_all(&mut cluster, &mut incidents).await;
    step("every node healed and ready (or reported)");
    workload.stop_producers(PRODUCER_DRAIN).await;
    step("producers stopped");
    workload.stop_others().await;
    step("management, operations and processors stopped");
    let finals = read_back(&cluster, &config.workload, &mut incidents).await;
    step("partitions read back");
    let ends: BTreeMap<String, i64> = finals
        .iter()
        .map(|f| {
            (
                f.partition.clone(),
                f.events.last().map_or(-1, |e| e.sequence),
            )
        })
        .collect();
    workload.stop_readers(&ends, Duration::from_secs(30)).await;
    step("readers stopped");
    let (final_hubs, final_groups) = managed_names(&cluster).await;
    if final_hubs.is_none() || final_groups.is_none() {
        incidents.push("the hubs and consumer groups could not be listed at the end".into());
    }
    for (node, status) in cluster.crashed().await {
        incidents.push(format!("node {node} exited by itself ({status})"));
    }
    let mut history = recorder.take();
    history.finals = finals;
    history.final_hubs = final_hubs;
    history.final_groups = final_groups;
    save_history(&config, &history);
    let logs = cluster.save_logs().await;
    let check = checker::check(
        &history,
        Bounds {
            handoff_max_ms: HANDOFF_MAX.as_millis() as u64,
            recovery_max_ms: RECOVERY_MAX.as_millis() as u64,
        },
    );
    eprintln!(
        "node logs: {}",
        logs.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(RunReport {
        seed: config.seed,
        nemeses: config.nemeses.clone(),
        elapsed: started.elapsed(),
        check,
        incidents,
        run_dir: config.run_dir.clone(),
    })
}

/// The fault loop: quiet, inject, hold, heal, wait for recovery; until `config.time` passes.
async fn inject_faults(
    config: &RunConfig,
    cluster: &mut ContainerCluster,
    recorder: &Arc<Recorder>,
    rng: &mut StdRng,
    incidents: &mut Vec<String>,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + config.time;
    let probe_numbers = Arc::new(AtomicU64::new(0));
    while Instant::now() < deadline {
        tokio::time::sleep(between(rng, config.quiet)).await;
        if Instant::now() >= deadline {
            break;
        }
        let kind = config.nemeses[rng.random_range(0..config.nemeses.len())];
        let injected_ms = recorder.now_ms();
        let injected = match faults::inject(kind, cluster, &config.workload.hub, rng).await {
            Ok(injected) => injected,
            Err(err) => {
                incidents.push(format!("{}: could not inject: {err:#}", kind.name()));
                heal_all(cluster, incidents).await;
                continue;
            }
        };
        eprintln!(
            "{:>7.1}s {}: {}",
            injected_ms as f64 / 1000.0,
            kind.name(),
            injected.description
        );
        let index = recorder.with(|h| {
            h.faults.push(FaultRecord {
                kind: kind.name().into(),
                description: injected.description.clone(),
                injected_ms,
                healed_ms: None,
                recovered_ms: None,
            });
            h.faults.len() - 1
        });
        if !matches!(injected.undo, Undo::Nothing) {
            tokio::time::sleep(between(rng, config.hold)).await;
        }
        if let Err(err) = faults::undo(cluster, &injected.undo).await {
            incidents.push(format!("{}: could not heal: {err:#}", kind.name()));
        }
        // A node that died by itself meanwhile is an incident; start it so the run goes on.
        for (node, status) in cluster.crashed().await {
            incidents.push(format!(
                "node {node} exited by itself during '{}' ({status})",
                injected.description
            ));
            if let Some(i) = cluster.index_of(node) {
                let _ = cluster.kill(i).await;
                let _ = cluster.start_node(i).await;
            }
        }
        let healed_ms = recorder.now_ms();
        recorder.with(|h| h.faults[index].healed_ms = Some(healed_ms));
        let recovered_ms = wait_available(cluster, recorder, config, &probe_numbers).await;
        recorder.with(|h| h.faults[index].recovered_ms = recovered_ms);
        match recovered_ms {
            Some(at) => eprintln!(
                "{:>7.1}s healed; fully available {} ms later",
                healed_ms as f64 / 1000.0,
                at - healed_ms
            ),
            None => eprintln!(
                "{:>7.1}s healed; NOT available again within {RECOVERY_MAX:?}",
                healed_ms as f64 / 1000.0
            ),
        }
    }
    Ok(())
}

fn between(rng: &mut StdRng, (from, to): (Duration, Duration)) -> Duration {
    if to <= from {
        return from;
    }
    Duration::from_millis(rng.random_range(from.as_millis() as u64..=to.as_millis() as u64))
}

/// Waits until every partition acknowledges a probe send started now, and management and
/// the checkpoint store answer; returns when, or `None` after [`RECOVERY_MAX`] (plus a
/// margin, so a late recovery is measured rather than cut off).
async fn wait_available(
    cluster: &ContainerCluster,
    recorder: &Arc<Recorder>,
    config: &RunConfig,
    numbers: &Arc<AtomicU64>,
) -> Option<Millis> {
    let deadline = Instant::now() + RECOVERY_MAX * 2;
    let hub = config.workload.hub.as_str();
    let mut probes = Vec::new();
    for partition in 0..config.workload.partitions {
        let client = workload::connect_from(&cluster.endpoints(), partition as usize)
            .await
            .ok()?;
        let recorder = recorder.clone();
        let numbers = numbers.clone();
        let hub = hub.to_owned();
        probes.push(tokio::spawn(async move {
            probe_send(&recorder, &client, &hub, partition, &numbers, deadline).await
        }));
    }
    let mut latest = 0;
    for probe in probes {
        latest = latest.max(probe.await.ok()??);
    }
    // Management and the checkpoint store, through any node.
    poll_until(deadline, async || {
        for i in 0..cluster.len() {
            let Ok(client) = Client::connect(&cluster.endpoint(i)).await else {
                continue;
            };
            let calls = async {
                client.list_event_hubs().await?;
                use tributary_client::CheckpointStore as _;
                client
                    .checkpoint_store()
                    .list_ownership(hub, workload::PROCESSOR_GROUP)
                    .await?;
                Ok::<_, tributary_client::ClientError>(())
            };
            if let Ok(Ok(())) = tokio::time::timeout(Duration::from_secs(5), calls).await {
                return Ok(());
            }
        }
        Err(())
    })
    .await
    .ok()?;
    Some(latest.max(recorder.now_ms()))
}

/// Undoes everything: network healed, slow links and disks freed, paused nodes continued,
/// stopped nodes started, and waits until every node is ready.
async fn heal_all(cluster: &mut ContainerCluster, incidents: &mut Vec<String>) {
    if let Err(err) = cluster.heal_network().await {
        incidents.push(format!("heal the network: {err:#}"));
    }
    for i in 0..cluster.len() {
        let _ = cluster.unslow(i).await;
        let _ = cluster.free_disk(i);
        let result = match cluster.state(i) {
            NodeState::Paused => cluster.resume(i).await,
            NodeState::Stopped => cluster.start_node(i).await,
            NodeState::Running if !cluster.is_running(i).await => {
                let _ = cluster.kill(i).await;
                cluster.start_node(i).await
            }
            NodeState::Running => Ok(()),
        };
        if let Err(err) = result {
            incidents.push(format!("restart node {}: {err:#}", cluster.node_id(i)));
        }
    }
    for i in 0..cluster.len() {
        if let Err(err) = cluster.wait_ready(i, Duration::from_secs(180)).await {
            incidents.push(format!(
                "node {} after healing: {err:#}",
                cluster.node_id(i)
            ));
        }
    }
}

/// Every partition read from its beginning through its leader, and a digest of each
/// replica, once the replicas have converged (or [`CONVERGE_WAIT`] passed).
async fn read_back(
    cluster: &ContainerCluster,
    config: &WorkloadConfig,
    incidents: &mut Vec<String>,
) -> Vec<FinalPartition> {
    if !faults::wait_all_caught_up(cluster, CONVERGE_WAIT).await {
        incidents.push(format!(
            "replicas were not all caught up {CONVERGE_WAIT:?} after healing"
        ));
    }
    let mut finals = Vec::new();
    for partition in 0..config.partitions {
        let partition = partition.to_string();
        let (events, replicas) = loop_until_converged(cluster, &config.hub, &partition).await;
        let events = match events {
            Ok(events) => events,
            Err(err) => {
                incidents.push(format!("read back partition {partition}: {err:#}"));
                Vec::new()
            }
        };
        finals.push(FinalPartition {
            partition,
            events,
            replicas,
        });
    }
    finals
}

type ReplicaDigests = BTreeMap<u64, (String, u64)>;

/// The partition's events through its leader and each replica's digest, retried until the
/// digests agree with each other and with the read (or a while passed).
async fn loop_until_converged(
    cluster: &ContainerCluster,
    hub: &str,
    partition: &str,
) -> (anyhow::Result<Vec<history::Delivered>>, ReplicaDigests) {
    let converged = poll_until(Duration::from_secs(60), async || {
        let events = read_partition(cluster, hub, partition).await;
        let replicas = replica_digests(cluster, hub, partition).await;
        let count = events.as_ref().map_or(u64::MAX, |e| e.len() as u64);
        let agreed = !replicas.is_empty()
            && replicas
                .values()
                .all(|r| r == replicas.values().next().expect("not empty") && r.1 == count);
        if agreed {
            Ok((events, replicas))
        } else {
            Err((events, replicas))
        }
    })
    .await;
    // Not converged in time: the last look, for the checker to judge.
    converged.unwrap_or_else(|timed_out| timed_out.last)
}

async fn read_partition(
    cluster: &ContainerCluster,
    hub: &str,
    partition: &str,
) -> anyhow::Result<Vec<history::Delivered>> {
    let client = Client::connect(&cluster.endpoint(0)).await?;
    let properties = client.get_partition_properties(hub, partition).await?;
    let last = properties.last_enqueued_sequence_number;
    let mut events = Vec::new();
    if last < 0 {
        return Ok(events);
    }
    let mut stream = client
        .consumer()
        .receive(hub, "$Default", partition, EventPosition::Earliest, 300)
        .await?;
    while events
        .last()
        .is_none_or(|e: &history::Delivered| e.sequence < last)
    {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .context("the final read stalled")?
            .context("the final read ended early")??;
        events.extend(batch.iter().map(workload::delivered));
    }
    Ok(events)
}

async fn replica_digests(cluster: &ContainerCluster, hub: &str, partition: &str) -> ReplicaDigests {
    let mut digests = BTreeMap::new();
    let Some(status) = faults::status(cluster).await else {
        return digests;
    };
    let Some(replicas) = status
        .partitions
        .iter()
        .find(|p| p.event_hub == hub && p.partition_id == partition)
        .map(|p| p.replicas.iter().map(|r| r.node).collect::<Vec<_>>())
    else {
        return digests;
    };
    for node in replicas {
        let Some(i) = cluster.index_of(node) else {
            continue;
        };
        let Ok(client) = Client::connect(&cluster.endpoint(i)).await else {
            continue;
        };
        let listing = tokio::time::timeout(
            Duration::from_secs(30),
            client.replica_events(hub, partition, 0, None),
        )
        .await;
        let summary = match listing {
            Ok(Ok(listing)) => replica_digest(&listing.events),
            Ok(Err(err)) => {
                digests.insert(node, (format!("error: {err}"), 0));
                continue;
            }
            Err(_) => {
                digests.insert(node, ("error: timed out".into(), 0));
                continue;
            }
        };
        digests.insert(node, (format!("{:016x}", summary.digest), summary.count));
    }
    digests
}

type NameSet = std::collections::BTreeSet<String>;

/// The managed hubs and consumer groups that exist now, through any node that answers
/// (tried for a while); `None` for a listing no node gave.
async fn managed_names(cluster: &ContainerCluster) -> (Option<NameSet>, Option<NameSet>) {
    let mut hubs = None;
    let mut groups = None;
    // Given up after a while: what was listed by then.
    let _ = poll_until(Duration::from_secs(60), async || {
        for i in 0..cluster.len() {
            let Ok(client) = Client::connect(&cluster.endpoint(i)).await else {
                continue;
            };
            if hubs.is_none()
                && let Ok(Ok(list)) =
                    tokio::time::timeout(Duration::from_secs(10), client.list_event_hubs()).await
            {
                hubs = Some(
                    list.into_iter()
                        .map(|h| h.name)
                        .filter(|n| n.starts_with(MANAGED_HUB_PREFIX))
                        .collect(),
                );
            }
            if groups.is_none()
                && let Ok(Ok(list)) =
                    tokio::time::timeout(Duration::from_secs(10), client.list_consumer_groups(HUB))
                        .await
            {
                groups = Some(
                    list.into_iter()
                        .map(|g| g.name)
                        .filter(|n| n.starts_with(MANAGED_GROUP_PREFIX))
                        .collect(),
                );
            }
            if hubs.is_some() && groups.is_some() {
                return Ok(());
            }
        }
        Err(())
    })
    .await;
    (hubs, groups)
}

/// The history as JSON in the run directory, for a closer look.
fn save_history(config: &RunConfig, history: &History) {
    let path = config.run_dir.join("history.json");
    if let Ok(json) = serde_json::to_vec(history) {
        let _ = std::fs::write(path, json);
    }
}
