//! The nemeses: faults injected into a [`ContainerCluster`] and undone again.

use std::time::Duration;

use rand::Rng as _;
use rand::rngs::StdRng;
use rand::seq::SliceRandom as _;
use tributary_client::Client;

use crate::containers::{ContainerCluster, NodeState, STORAGE_FAILED_EXIT_CODE};
use crate::eventually::poll_until;

/// Every fault the suite can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum NemesisKind {
    /// SIGKILL a node (often a leader), then start it again.
    Kill,
    /// SIGSTOP a node past the election timeout, then SIGCONT.
    Pause,
    /// Network partitions: majority/minority, an isolated partition leader, a bridge, or a
    /// one-way cut.
    Partition,
    /// A slow node: every packet it sends delayed by hundreds of milliseconds.
    Slow,
    /// The controller leader cut off from the other nodes.
    Controller,
    /// A node's data volume filled to the last byte, then freed.
    Disk,
    /// Every node drained, stopped and started again, one at a time.
    Rolling,
    /// A node's data directory wiped; it rejoins empty.
    Wipe,
}

impl NemesisKind {
    pub const ALL: [NemesisKind; 8] = [
        NemesisKind::Kill,
        NemesisKind::Pause,
        NemesisKind::Partition,
        NemesisKind::Slow,
        NemesisKind::Controller,
        NemesisKind::Disk,
        NemesisKind::Rolling,
        NemesisKind::Wipe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Partition => "partition",
            NemesisKind::Slow => "slow",
            NemesisKind::Controller => "controller",
            NemesisKind::Disk => "disk",
            NemesisKind::Rolling => "rolling",
            NemesisKind::Wipe => "wipe",
        }
    }
}

/// What must be done to undo an injected fault.
#[derive(Debug)]
pub enum Undo {
    Start(usize),
    Resume(usize),
    HealNetwork,
    Unslow(Vec<usize>),
    FreeDisk(usize),
    /// The fault undid itself (a rolling restart).
    Nothing,
}

/// An injected fault: what was done, and how to undo it.
#[derive(Debug)]
pub struct Injected {
    pub description: String,
    pub undo: Undo,
}

/// How long a slow node's packets are delayed, ± jitter.
const SLOW_DELAY: Duration = Duration::from_millis(300);
const SLOW_JITTER: Duration = Duration::from_millis(100);
/// How long a drained node may take to hand its leaders over in a rolling restart.
const DRAIN_WAIT: Duration = Duration::from_secs(20);
/// How long a restarted node may take to be ready.
const READY_WAIT: Duration = Duration::from_secs(120);
/// How long to wait for every replica to be caught up before wiping a node (wiping a second
/// replica before the first is rebuilt would lose a majority's data, which no broker can
/// survive).
const CAUGHT_UP_WAIT: Duration = Duration::from_secs(120);

/// The cluster status from the first node that answers.
pub async fn status(cluster: &ContainerCluster) -> Option<tributary_proto::v1::ClusterStatus> {
    for i in 0..cluster.len() {
        if cluster.state(i) != NodeState::Running {
            continue;
        }
        let Ok(client) = Client::connect(&cluster.endpoint(i)).await else {
            continue;
        };
        if let Ok(Ok(status)) =
            tokio::time::timeout(Duration::from_secs(5), client.cluster_status()).await
        {
            return Some(status);
        }
    }
    None
}

/// The node index leading a random partition of `hub`, if one is known.
async fn some_partition_leader(
    cluster: &ContainerCluster,
    hub: &str,
    rng: &mut StdRng,
) -> Option<(usize, String)> {
    let status = status(cluster).await?;
    let leaders: Vec<(u64, String)> = status
        .partitions
        .iter()
        .filter(|p| p.event_hub == hub && p.leader != 0)
        .map(|p| (p.leader, p.partition_id.clone()))
        .collect();
    let (leader, partition) = leaders.get(rng.random_range(0..leaders.len().max(1)))?;
    Some((cluster.index_of(*leader)?, partition.clone()))
}

fn running(cluster: &ContainerCluster) -> Vec<usize> {
    (0..cluster.len())
        .filter(|i| cluster.state(*i) == NodeState::Running)
        .collect()
}

/// A victim: half the time a partition leader of `hub`, else any running node.
async fn victim(cluster: &ContainerCluster, hub: &str, rng: &mut StdRng) -> (usize, String) {
    if rng.random_bool(0.5)
        && let Some((i, partition)) = some_partition_leader(cluster, hub, rng).await
    {
        return (i, format!("leader of {hub}/{partition}"));
    }
    let nodes = running(cluster);
    (nodes[rng.random_range(0..nodes.len())], "a node".into())
}

/// Injects one fault of `kind`.
pub async fn inject(
    kind: NemesisKind,
    cluster: &mut ContainerCluster,
    hub: &str,
    rng: &mut StdRng,
) -> anyhow::Result<Injected> {
    match kind {
        NemesisKind::Kill => {
            let (i, what) = victim(cluster, hub, rng).await;
            cluster.kill(i).await?;
            Ok(Injected {
                description: format!("SIGKILL node {} ({what})", cluster.node_id(i)),
                undo: Undo::Start(i),
            })
        }
        NemesisKind::Pause => {
            let (i, what) = victim(cluster, hub, rng).await;
            cluster.pause(i).await?;
            Ok(Injected {
                description: format!("SIGSTOP node {} ({what})", cluster.node_id(i)),
                undo: Undo::Resume(i),
            })
        }
        NemesisKind::Partition => partition(cluster, hub, rng).await,
        NemesisKind::Slow => {
            let mut nodes = running(cluster);
            nodes.shuffle(rng);
            let count = if nodes.len() > 3 && rng.random_bool(0.5) {
                2
            } else {
                1
            };
            let slowed: Vec<usize> = nodes.into_iter().take(count).collect();
            let mut shaping = String::new();
            for &i in &slowed {
                shaping = cluster.slow(i, SLOW_DELAY, SLOW_JITTER).await?;
            }
            Ok(Injected {
                description: format!(
                    "packets from nodes {} slowed ({shaping})",
                    ids(cluster, &slowed)
                ),
                undo: Undo::Unslow(slowed),
            })
        }
        NemesisKind::Controller => {
            let leader = status(cluster)
                .await
                .and_then(|s| cluster.index_of(s.controller_leader));
            let i = match leader {
                Some(i) => i,
                None => running(cluster)[0],
            };
            let others: Vec<usize> = (0..cluster.len()).filter(|j| *j != i).collect();
            cluster.partition(&[i], &others).await?;
            Ok(Injected {
                description: format!(
                    "controller leader node {} cut off from the others{}",
                    cluster.node_id(i),
                    if leader.is_none() {
                        " (leader unknown: first node)"
                    } else {
                        ""
                    }
                ),
                undo: Undo::HealNetwork,
            })
        }
        NemesisKind::Disk => {
            let (i, what) = victim(cluster, hub, rng).await;
            let filled = cluster.fill_disk(i)?;
            Ok(Injected {
                description: format!(
                    "data volume of node {} ({what}) filled with {} MiB",
                    cluster.node_id(i),
                    filled >> 20
                ),
                undo: Undo::FreeDisk(i),
            })
        }
        NemesisKind::Rolling => {
            rolling_restart(cluster).await?;
            Ok(Injected {
                description: "rolling restart: each node drained, stopped, started, undrained"
                    .into(),
                undo: Undo::Nothing,
            })
        }
        NemesisKind::Wipe => {
            let caught_up = wait_all_caught_up(cluster, CAUGHT_UP_WAIT).await;
            let (i, what) = victim(cluster, hub, rng).await;
            cluster.wipe(i).await?;
            Ok(Injected {
                description: format!(
                    "node {} ({what}) killed and its data directory wiped{}",
                    cluster.node_id(i),
                    if caught_up {
                        ""
                    } else {
                        " (WARNING: replicas were not all caught up before)"
                    }
                ),
                undo: Undo::Start(i),
            })
        }
    }
}

fn ids(cluster: &ContainerCluster, nodes: &[usize]) -> String {
    nodes
        .iter()
        .map(|i| cluster.node_id(*i).to_string())
        .collect::<Vec<_>>()
        .join(",")
}

async fn partition(
    cluster: &mut ContainerCluster,
    hub: &str,
    rng: &mut StdRng,
) -> anyhow::Result<Injected> {
    let n = cluster.len();
    let mut nodes: Vec<usize> = (0..n).collect();
    nodes.shuffle(rng);
    let description = match rng.random_range(0..4) {
        0 => {
            let (minority, majority) = nodes.split_at(n / 2);
            cluster.partition(minority, majority).await?;
            format!(
                "majority {{{}}} / minority {{{}}}",
                ids(cluster, majority),
                ids(cluster, minority)
            )
        }
        1 => {
            let (i, what) = match some_partition_leader(cluster, hub, rng).await {
                Some((i, partition)) => (i, format!("leader of {hub}/{partition}")),
                None => (nodes[0], "a node".into()),
            };
            let others: Vec<usize> = (0..n).filter(|j| *j != i).collect();
            cluster.partition(&[i], &others).await?;
            format!("node {} ({what}) isolated", cluster.node_id(i))
        }
        2 => {
            // Two halves that only the bridge node sees both of.
            let bridge = nodes[0];
            let rest = &nodes[1..];
            let (left, right) = rest.split_at(rest.len() / 2);
            cluster.partition(left, right).await?;
            format!(
                "bridge: {{{}}} and {{{}}} apart, node {} sees both",
                ids(cluster, left),
                ids(cluster, right),
                cluster.node_id(bridge)
            )
        }
        _ => {
            let i = nodes[0];
            let inbound = rng.random_bool(0.5);
            for j in (0..n).filter(|j| *j != i) {
                if inbound {
                    cluster.cut(j, i).await?;
                } else {
                    cluster.cut(i, j).await?;
                }
            }
            format!(
                "one-way: node {} {} the others",
                cluster.node_id(i),
                if inbound {
                    "hears nothing from"
                } else {
                    "is not heard by"
                }
            )
        }
    };
    Ok(Injected {
        description,
        undo: Undo::HealNetwork,
    })
}

/// Undoes an injected fault (and restarts any node that exited by itself meanwhile).
pub async fn undo(cluster: &mut ContainerCluster, undo: &Undo) -> anyhow::Result<()> {
    match undo {
        Undo::Start(i) => cluster.start_node(*i).await?,
        Undo::Resume(i) => cluster.resume(*i).await?,
        Undo::HealNetwork => cluster.heal_network().await?,
        Undo::Unslow(nodes) => {
            for &i in nodes {
                cluster.unslow(i).await?;
            }
        }
        Undo::FreeDisk(i) => {
            cluster.free_disk(*i)?;
            // A node whose storage failed stops itself (fail-stop) and is started again by its
            // supervisor once there is space: this harness plays the supervisor.
            if cluster.state(*i) == NodeState::Running
                && cluster.exit_code(*i).await == Some(STORAGE_FAILED_EXIT_CODE)
            {
                eprintln!(
                    "         node {} had stopped itself when its disk filled (storage failed); \
                     starting it again",
                    cluster.node_id(*i)
                );
                cluster.kill(*i).await?;
                cluster.start_node(*i).await?;
            }
        }
        Undo::Nothing => {}
    }
    Ok(())
}

/// Each node in turn: drained (its leaders move away), stopped with SIGTERM, started,
/// awaited until ready, undrained.
async fn rolling_restart(cluster: &mut ContainerCluster) -> anyhow::Result<()> {
    for i in 0..cluster.len() {
        let id = cluster.node_id(i);
        let other = cluster.endpoint((i + 1) % cluster.len());
        let client = Client::connect(&other).await?;
        client.drain_node(id, true).await?;
        // Stopped after DRAIN_WAIT even if it still leads something.
        let _ = poll_until(DRAIN_WAIT, async || {
            let leads = status(cluster)
                .await
                .is_none_or(|s| s.partitions.iter().any(|p| p.leader == id));
            if leads { Err(()) } else { Ok(()) }
        })
        .await;
        cluster.stop(i).await?;
        cluster.start_node(i).await?;
        cluster.wait_ready(i, READY_WAIT).await?;
        client.drain_node(id, false).await?;
    }
    Ok(())
}

/// Waits until the cluster status shows no under-replicated partition and every node up.
pub async fn wait_all_caught_up(cluster: &ContainerCluster, timeout: Duration) -> bool {
    poll_until(timeout, async || match status(cluster).await {
        Some(status)
            if status.under_replicated == 0
                && status.nodes.iter().all(|n| n.up)
                && status.moves.is_empty() =>
        {
            Ok(())
        }
        _ => Err(()),
    })
    .await
    .is_ok()
}
