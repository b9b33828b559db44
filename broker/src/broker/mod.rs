//! The node's view of hubs and the partitions it hosts. Split by job:
//! `replicas` starts and drops local replicas to match the cluster state, `leadership`
//! keeps each led partition's voters and leader where placement wants them, `routing`
//! finds the replica a call goes to (or the NOT_LEADER naming the node to ask). The
//! [`Service`](crate::Service) is the API over it.

mod leadership;
mod replicas;
mod routing;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tributary_storage::Shard;
use tributary_types::{Clock, GroupId, NodeId, PartitionId};

use crate::cluster::ClusterRuntime;
use crate::error::Error;
use crate::partition::Partition;
use tributary_controller::state::{ClusterState, Command, HubRecord, hub_not_found};

/// How long a management call waits for this node's view to show its effect.
const VIEW_WAIT: Duration = Duration::from_secs(10);

/// Limits the broker enforces; validated once at startup.
#[derive(Debug, Clone)]
pub struct BrokerLimits {
    pub partitions_per_hub_max: u16,
    pub publish_bytes_max: usize,
    /// The shortest retention a hub may be given (the operator's floor).
    pub retention_min: Duration,
}

/// Where a send goes.
#[derive(Debug, Clone)]
pub enum Target {
    Any,
    PartitionId(String),
    PartitionKey(String),
}

pub struct Broker {
    runtime: Arc<ClusterRuntime>,
    shards: Vec<Shard>,
    clock: Arc<dyn Clock>,
    pub limits: BrokerLimits,
    /// Partition replicas hosted on this node.
    partitions: RwLock<HashMap<GroupId, Arc<Partition>>>,
    round_robin: AtomicU64,
    /// Counts finished reconciliation passes, so callers can await local replicas.
    reconciled: tokio::sync::watch::Sender<u64>,
    /// Reconciliation runs one pass at a time.
    reconcile: tokio::sync::Mutex<()>,
    /// Set once the stored groups no longer assigned here have been dropped (first pass).
    swept: std::sync::atomic::AtomicBool,
    /// Set when the node shuts down: open reader streams end so the server can drain.
    closing: tokio::sync::watch::Sender<bool>,
    /// The node's Kafka listeners as clients reach them, told to every node asking.
    kafka_addrs: std::sync::OnceLock<KafkaAddrs>,
}

/// A node's Kafka listeners as clients are told to reach them (`host:port`), if on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KafkaAddrs {
    pub plain: Option<String>,
    pub tls: Option<String>,
}

impl Broker {
    pub fn new(
        runtime: Arc<ClusterRuntime>,
        shards: Vec<Shard>,
        clock: Arc<dyn Clock>,
        limits: BrokerLimits,
    ) -> Arc<Broker> {
        assert!(!shards.is_empty(), "a node has at least one storage shard");
        Arc::new(Broker {
            runtime,
            shards,
            clock,
            limits,
            partitions: RwLock::new(HashMap::new()),
            round_robin: AtomicU64::new(0),
            reconciled: tokio::sync::watch::channel(0).0,
            reconcile: tokio::sync::Mutex::new(()),
            swept: std::sync::atomic::AtomicBool::new(false),
            closing: tokio::sync::watch::channel(false).0,
            kafka_addrs: std::sync::OnceLock::new(),
        })
    }

    /// Records the node's advertised Kafka addresses (once, before its listeners open).
    pub fn set_kafka_addrs(&self, addrs: KafkaAddrs) {
        let _ = self.kafka_addrs.set(addrs);
    }

    pub fn kafka_addrs(&self) -> &KafkaAddrs {
        static NONE: KafkaAddrs = KafkaAddrs {
            plain: None,
            tls: None,
        };
        self.kafka_addrs.get().unwrap_or(&NONE)
    }

    /// Whether the first reconciliation pass is done: assigned replicas started, stored
    /// replicas no longer assigned dropped. Until then the node receives no replica moves,
    /// so a stale copy is never taken for a new one.
    pub fn is_ready(&self) -> bool {
        self.swept.load(Ordering::Relaxed)
    }

    /// The node's clock, in ms since the epoch.
    pub fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    pub fn runtime(&self) -> &Arc<ClusterRuntime> {
        &self.runtime
    }

    fn node_id(&self) -> NodeId {
        NodeId(self.runtime.me.id)
    }

    fn shard_for(&self, group: GroupId) -> Shard {
        let key = u64::from(group.hub.0) + u64::from(group.partition.0);
        self.shards[(key % self.shards.len() as u64) as usize].clone()
    }

    /// Drains a node (its leaders move away) or lets leaders return to it.
    pub async fn set_draining(&self, node: u64, draining: bool) -> Result<(), Error> {
        self.runtime
            .propose(Command::SetDraining { node, draining })
            .await?;
        self.await_view(|s| s.nodes.get(&node).is_some_and(|n| n.draining == draining))
            .await;
        Ok(())
    }

    pub fn hub(&self, name: &str) -> Result<HubRecord, Error> {
        self.runtime
            .state()
            .hubs
            .get(name)
            .cloned()
            .ok_or_else(|| Error::not_found(hub_not_found(name).message))
    }

    pub fn hub_records(&self) -> Vec<HubRecord> {
        self.runtime.state().hubs.values().cloned().collect()
    }

    pub fn local_partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions
            .read()
            .expect("partitions lock")
            .values()
            .cloned()
            .collect()
    }

    /// Waits until this node's view satisfies `done`, so a caller sees its own change.
    pub(crate) async fn await_view(&self, done: impl Fn(&ClusterState) -> bool) {
        let mut view = self.runtime.view();
        let _ = tokio::time::timeout(VIEW_WAIT, view.wait_for(|s| done(s))).await;
    }

    /// right after creation does not bounce.
    pub(crate) async fn await_local_replicas(&self, hub: &HubRecord) {
        let me = self.node_id().0;
        let groups: Vec<GroupId> = hub
            .replicas
            .iter()
            .enumerate()
            .filter(|(_, replicas)| replicas.contains(&me))
            .map(|(p, _)| GroupId::new(hub.id, PartitionId(p as u16), 0))
            .collect();
        let deadline = tokio::time::Instant::now() + VIEW_WAIT;
        let mut passes = self.reconciled.subscribe();
        let started = |_: &u64| {
            let partitions = self.partitions.read().expect("partitions lock");
            groups.iter().all(|g| partitions.contains_key(g))
        };
        if tokio::time::timeout_at(deadline, passes.wait_for(started))
            .await
            .is_err()
        {
            return;
        }
        for group in &groups {
            let partition = self
                .partitions
                .read()
                .expect("partitions lock")
                .get(group)
                .cloned();
            if let Some(partition) = partition {
                partition.wait_for_any_leader(deadline).await;
            }
        }
    }

    /// Ends every open reader stream (they never end on their own).
    pub fn close_readers(&self) {
        self.closing.send_replace(true);
    }

    /// Becomes true when reader streams must end.
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Stops every group this node runs.
    pub async fn shutdown(&self) {
        let stopped: Vec<_> = self
            .partitions
            .write()
            .expect("partitions lock")
            .drain()
            .map(|(_, partition)| partition)
            .collect();
        for partition in stopped {
            partition.mark_stopped();
        }
        self.runtime.host().stop_all().await;
    }
}
