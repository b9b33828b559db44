//! The simulated cluster: three turmoil hosts, each with its own storage shard, a
//! [`GroupHost`] running every group, and the peer server on turmoil TCP.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use tributary_raft::Raft;
use tributary_storage::{Shard, ShardConfig};
use tributary_types::{GroupId, HubId, NodeId, PartitionId};

use crate::net;
use crate::state_machine::{MemStateMachine, SharedApplied};

/// The simulated hosts; host `HOSTS[i]` is node `i + 1`.
pub const HOSTS: [&str; 3] = ["n1", "n2", "n3"];

/// Groups every host runs, all with the three nodes as voters. Every host initializes
/// every group with those same voters at once, as every founding replica of a new
/// partition does in the node (`HubRecord::founders`): the checker's election safety and
/// log matching cover that concurrent initialization in every run.
pub const GROUP_COUNT: u16 = 3;

pub fn groups() -> Vec<GroupId> {
    (0..GROUP_COUNT)
        .map(|p| GroupId::new(HubId(1), PartitionId(p), 0))
        .collect()
}

pub fn node_of(host_index: usize) -> u64 {
    host_index as u64 + 1
}

pub fn host_of(node: u64) -> usize {
    node as usize - 1
}

/// One replica of one group, as the client and the checker see it.
#[derive(Clone)]
pub struct Replica {
    pub node: u64,
    pub group: GroupId,
    pub raft: Raft<MemStateMachine>,
    pub applied: SharedApplied,
    pub shard: Shard,
}

/// Replicas register here as their hosts start them.
pub type Registry = Arc<Mutex<Vec<Replica>>>;

/// A small page cache: the simulation's logs are a few megabytes.
const SHARD_CACHE_BYTES: usize = 8 * 1024 * 1024;

/// Adds the three hosts to `sim`. Each opens its shard under `dir` now; the hosts start
/// their groups on their first simulation step.
pub fn add_hosts(sim: &mut turmoil::Sim<'_>, dir: &Path, registry: &Registry) {
    let members: BTreeMap<NodeId, String> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, host)| (NodeId(node_of(i)), net::peer_addr(host)))
        .collect();
    for (i, host) in HOSTS.iter().enumerate() {
        let node = node_of(i);
        let config = ShardConfig {
            cache_bytes: SHARD_CACHE_BYTES,
            ..ShardConfig::default()
        };
        // The shard's writer is an OS thread outside turmoil's control, so how many ticks
        // an append takes depends on wall-clock speed: runs are seeded, not fully
        // deterministic.
        let shard = Shard::open(&dir.join(format!("{host}.redb")), config).expect("open shard");
        let registry = registry.clone();
        let members = members.clone();
        sim.host(*host, move || {
            run_host(node, shard.clone(), members.clone(), registry.clone())
        });
    }
}

/// Adds the three hosts to `sim`, each with a shard under `dir` opened now, running
/// `run(node, shard, members, shared)` (members: every node's id and peer address).
pub fn add_each_host<S, F, Fut>(sim: &mut turmoil::Sim<'_>, dir: &Path, shared: &S, run: F)
where
    S: Clone + 'static,
    F: Fn(u64, Shard, BTreeMap<u64, String>, S) -> Fut + Clone + 'static,
    Fut: std::future::Future<Output = turmoil::Result> + 'static,
{
    let members: BTreeMap<u64, String> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, host)| (node_of(i), net::peer_addr(host)))
        .collect();
    for (i, host) in HOSTS.iter().enumerate() {
        let node = node_of(i);
        let shard = Shard::open(&dir.join(format!("{host}.redb")), ShardConfig::default())
            .expect("open shard");
        let shared = shared.clone();
        let members = members.clone();
        let run = run.clone();
        sim.host(*host, move || {
            run(node, shard.clone(), members.clone(), shared.clone())
        });
    }
}

async fn run_host(
    node: u64,
    shard: Shard,
    members: BTreeMap<NodeId, String>,
    registry: Registry,
) -> turmoil::Result {
    let members: BTreeMap<u64, String> = members.iter().map(|(id, a)| (id.0, a.clone())).collect();
    let (host, server) = net::start_host(node, &members);
    for group in groups() {
        let (machine, applied) = MemStateMachine::new();
        let raft = host
            .start(group, node, shard.clone(), machine, members.clone())
            .await?;
        registry.lock().expect("registry lock").push(Replica {
            node,
            group,
            raft,
            applied,
            shard: shard.clone(),
        });
    }
    server.await?.map_err(|e| e.to_string())?;
    Ok(())
}
