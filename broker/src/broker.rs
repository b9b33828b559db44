//! The node's view of hubs and the partitions it hosts: management goes to the controller,
//! sends and reads go to the local partition replica (or get NOT_LEADER naming the node to
//! ask). gRPC handlers only decode, call this, and map errors.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::{
    Clock, DEFAULT_CONSUMER_GROUP, GroupId, NodeId, PartitionId, partition_for_key,
};

use crate::cluster::ClusterRuntime;
use crate::error::{Error, ErrorKind};
use crate::group::GroupStateMachine;
use crate::partition::{Partition, PartitionError};
use tributary_controller::state::{ClusterState, Command, HubRecord, NodeRecord, hub_not_found};
use tributary_raft::{GroupHost, member_incarnation, member_node};

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
        })
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

    /// Follows the cluster state and starts or stops local replicas to match it, until
    /// the node shuts down.
    pub async fn run_reconciler(self: Arc<Self>) {
        let runtime = self.runtime.clone();
        tokio::select! {
            _ = self.reconcile_forever() => {}
            _ = runtime.stopped() => {}
        }
    }

    async fn reconcile_forever(&self) {
        let mut view = self.runtime.view();
        loop {
            let state = view.borrow_and_update().clone();
            if let Err(err) = self.reconcile(&state).await {
                tracing::warn!(%err, "reconciling local replicas failed; will retry");
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
            self.reconciled.send_modify(|passes| *passes += 1);
            if view.changed().await.is_err() {
                return;
            }
        }
    }

    /// One pass: start the replicas assigned here, drop those of deleted hubs.
    pub async fn reconcile(&self, state: &ClusterState) -> Result<(), PartitionError> {
        let _guard = self.reconcile.lock().await;
        let me = self.node_id().0;
        // Replicas run as this incarnation's members: wait until the controller has
        // registered it.
        let Some(me_record) = state
            .nodes
            .get(&me)
            .filter(|n| n.data_id == self.runtime.me.data_id)
        else {
            return Ok(());
        };
        let mut wanted: HashSet<GroupId> = HashSet::new();
        for hub in state.hubs.values() {
            for (p, replicas) in hub.replicas.iter().enumerate() {
                let index = p as u16;
                // A replica moving here starts empty and waits for the partition's leader
                // to add it.
                let moving_here = state.move_of(hub.id, index).is_some_and(|m| m.to == me);
                if !replicas.contains(&me) && !moving_here {
                    continue;
                }
                let group = GroupId::new(hub.id, PartitionId(index), 0);
                wanted.insert(group);
                let member =
                    tributary_raft::member_id(me, hub.member_incarnation(index, me_record));
                let running = self
                    .partitions
                    .read()
                    .expect("partitions lock")
                    .get(&group)
                    .map(|partition| partition.member());
                let stored = match running {
                    Some(running) => Some(running),
                    None => {
                        GroupHost::<GroupStateMachine>::stored_member(&self.shard_for(group), group)
                            .map_err(|e| PartitionError::Storage(e.to_string()))?
                    }
                };
                use std::cmp::Ordering::{Equal, Less};
                match stored.map(|s| member_incarnation(s).cmp(&member_incarnation(member))) {
                    None | Some(Equal) => {}
                    // An earlier life of this replica (it moved away, or a move here was
                    // rolled back, and now it is added again as a new member): its copy
                    // goes, and the new member starts empty.
                    Some(Less)
                        if self
                            .drop_replica(
                                group,
                                state.version,
                                "an earlier life of this replica, now re-added as a new member",
                            )
                            .await? => {}
                    // This view is older than the one the replica was made from (or than
                    // the one that assigned the earlier life): wait for a newer one.
                    Some(_) => continue,
                }
                if running == Some(member) {
                    continue;
                }
                if stored != Some(member) {
                    // A new replica: remember which view made it, so that no older view
                    // (a lagging controller replica's, after a restart) ever drops it.
                    self.shard_for(group)
                        .write(
                            vec![Mutation::PutMeta {
                                group,
                                key: MetaKey::AssignedAt,
                                value: state.version.to_be_bytes().to_vec().into(),
                            }],
                            Durability::Immediate,
                        )
                        .await
                        .map_err(|e| PartitionError::Storage(e.to_string()))?;
                }
                let members = founding_members(state, hub, index, me_record, member);
                // A new group's preferred replica initializes (and so campaigns) at once, the
                // other founders only if no leader has reached them after a while, so a new
                // hub's leaders start spread as placement chose (each founder campaigns as
                // soon as it initializes, and the first to start would win).
                let preferred = hub.replicas.get(usize::from(index)).and_then(|r| r.first())
                    == Some(&me_record.id);
                let init_delay = if preferred {
                    std::time::Duration::ZERO
                } else {
                    FOUNDER_INIT_DELAY
                };
                let partition = Partition::open(
                    self.runtime.host(),
                    group,
                    member,
                    self.shard_for(group),
                    members,
                    init_delay,
                    self.clock.clone(),
                )
                .await?;
                let replaced = self
                    .partitions
                    .write()
                    .expect("partitions lock")
                    .insert(group, Arc::new(partition));
                if let Some(replaced) = replaced {
                    replaced.mark_stopped();
                }
            }
        }
        let gone: Vec<GroupId> = self
            .partitions
            .read()
            .expect("partitions lock")
            .keys()
            .filter(|g| !wanted.contains(g))
            .copied()
            .collect();
        for group in gone {
            self.drop_replica(group, state.version, "no longer assigned to this node")
                .await?;
        }
        if !self.swept.load(Ordering::Relaxed)
            && self.drop_stale_replicas(&wanted, state.version).await?
        {
            self.swept.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Stops a local replica (if it runs) and deletes its stored state, when `view_version`
    /// is at least the version of the view that assigned it here. An older view (a lagging
    /// controller replica's) may not show an assignment the node has already acted on:
    /// dropping on it would throw away a log the partition's leader counts as stored.
    /// Returns whether it dropped the replica.
    async fn drop_replica(
        &self,
        group: GroupId,
        view_version: u64,
        why: &str,
    ) -> Result<bool, PartitionError> {
        let assigned_at = assigned_at(&self.shard_for(group), group)?;
        if assigned_at > view_version {
            tracing::debug!(%group, assigned_at, view_version, "not dropping a replica on an older view");
            return Ok(false);
        }
        let running = self
            .partitions
            .write()
            .expect("partitions lock")
            .remove(&group);
        if let Some(partition) = running {
            partition.mark_stopped();
            self.runtime.host().stop(group).await;
        }
        self.shard_for(group)
            .write(vec![Mutation::DeleteGroup { group }], Durability::Immediate)
            .await
            .map_err(|e| PartitionError::Storage(e.to_string()))?;
        tracing::info!(%group, why, "replica removed");
        Ok(true)
    }

    /// Drops the stored replicas this node holds but is no longer assigned: while it was
    /// away (dead past the timeout, or stopped during a decommission) the placement
    /// controller re-created them elsewhere and removed this node from their groups.
    async fn drop_stale_replicas(
        &self,
        wanted: &HashSet<GroupId>,
        view_version: u64,
    ) -> Result<bool, PartitionError> {
        let storage = |e: tributary_storage::StorageError| PartitionError::Storage(e.to_string());
        let mut all = true;
        for shard in &self.shards {
            for group in shard.groups().map_err(storage)? {
                // Hub id 0 is the controller group.
                if group.hub.0 == 0 || wanted.contains(&group) {
                    continue;
                }
                // Assigned by a newer view than this one: look again on a newer view.
                if assigned_at(shard, group)? > view_version {
                    all = false;
                    continue;
                }
                shard
                    .write(vec![Mutation::DeleteGroup { group }], Durability::Immediate)
                    .await
                    .map_err(storage)?;
                metrics::counter!("tributary_stale_replicas_dropped_total").increment(1);
                tracing::info!(%group, "stale replica dropped: no longer assigned to this node");
            }
        }
        Ok(all)
    }

    /// Keeps the voters of the partitions this node leads equal to their replicas' current
    /// members: a replica whose node lost its data is replaced by its new incarnation
    /// (added as a learner, caught up from the log or a snapshot, then promoted).
    pub async fn run_membership_reconciler(self: Arc<Self>) {
        let runtime = self.runtime.clone();
        tokio::select! {
            _ = self.reconcile_members_forever() => {}
            _ = runtime.stopped() => {}
        }
    }

    async fn reconcile_members_forever(&self) {
        let mut view = self.runtime.view();
        loop {
            let state = view.borrow_and_update().clone();
            let busy = self.reconcile_members(&state).await;
            // Leadership changes are not in the view: look again now and then.
            let wait = if busy {
                Duration::from_millis(200)
            } else {
                Duration::from_secs(2)
            };
            let _ = tokio::time::timeout(wait, view.changed()).await;
        }
    }

    /// One pass; returns whether some group is still changing.
    async fn reconcile_members(&self, state: &ClusterState) -> bool {
        let hubs: HashMap<_, _> = state.hubs.values().map(|h| (h.id, h)).collect();
        let mut busy = false;
        for partition in self.local_partitions() {
            if !partition.is_leader() {
                continue;
            }
            let Some(hub) = hubs.get(&partition.group.hub) else {
                continue;
            };
            let index = partition.group.partition.0;
            let Some(replicas) = hub.replicas.get(usize::from(index)) else {
                continue;
            };
            // A replica move under way: the voters become its target (the new replica
            // joins as a learner, catches up, and replaces the old one in one change).
            let target = state.move_of(hub.id, index).map(|m| m.target(replicas));
            let Some(desired) = target
                .as_deref()
                .unwrap_or(replicas)
                .iter()
                .map(|r| {
                    let peer = state.nodes.get(r)?.peer_addr.clone();
                    Some((state.replica_member(hub, index, *r)?, peer))
                })
                .collect::<Option<BTreeMap<u64, String>>>()
            else {
                continue;
            };
            // A leader whose own replica moves away hands leadership to a remaining voter
            // first, so the partition does not pause for an election when it leaves.
            if let Some(target) = &target
                && !target.contains(&self.node_id().0)
            {
                let others: Vec<u64> = target
                    .iter()
                    .filter(|n| replicas.contains(n))
                    .filter_map(|n| state.replica_member(hub, index, *n))
                    .collect();
                if let Ok(Some(to)) = tributary_raft::transfer_leadership(
                    partition.raft(),
                    partition.hibernation(),
                    partition.member(),
                    &others,
                )
                .await
                {
                    tracing::info!(group = %partition.group, to = %tributary_raft::describe_member(to), "handing leadership over before this replica moves away");
                    busy = true;
                    continue;
                }
            }
            match tributary_raft::reconcile_voters(
                partition.raft(),
                partition.hibernation(),
                partition.member(),
                &desired,
            )
            .await
            {
                Ok(tributary_raft::VoterChange::Nothing) => {
                    if self.move_leadership(state, hub, &partition, replicas).await {
                        busy = true;
                    }
                }
                Ok(change) => {
                    tracing::info!(group = %partition.group, ?change, "partition voters changing");
                    busy = true;
                }
                Err(err) => {
                    tracing::warn!(group = %partition.group, %err, "changing partition voters failed; will retry");
                    busy = true;
                }
            }
        }
        busy
    }

    /// Leadership goes to the partition's preferred replica (the first; placement spreads
    /// them evenly), and never stays on a draining node: a draining leader hands over to
    /// the first caught-up replica that is not draining. Returns whether it handed over.
    async fn move_leadership(
        &self,
        state: &ClusterState,
        hub: &HubRecord,
        partition: &Partition,
        replicas: &[u64],
    ) -> bool {
        let draining = |n: &u64| state.nodes.get(n).is_none_or(|r| r.draining);
        let me = self.node_id().0;
        let candidates: Vec<u64> = if draining(&me) {
            replicas.iter().filter(|n| !draining(n)).copied().collect()
        } else {
            replicas
                .first()
                .filter(|preferred| **preferred != me && !draining(preferred))
                .into_iter()
                .copied()
                .collect()
        };
        let index = partition.group.partition.0;
        let members: Vec<u64> = candidates
            .iter()
            .filter_map(|n| state.replica_member(hub, index, *n))
            .collect();
        if members.is_empty() {
            return false;
        }
        match tributary_raft::transfer_leadership(
            partition.raft(),
            partition.hibernation(),
            partition.member(),
            &members,
        )
        .await
        {
            Ok(Some(to)) => {
                tracing::info!(group = %partition.group, to = %tributary_raft::describe_member(to), "handing partition leadership over");
                true
            }
            // Not caught up yet: look again soon.
            Ok(None) => partition.is_leader(),
            Err(err) => {
                tracing::warn!(group = %partition.group, %err, "leadership transfer failed");
                true
            }
        }
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

    /// The partition index a send goes to.
    pub fn route(&self, hub: &HubRecord, target: &Target) -> Result<u16, Error> {
        let count = hub.partition_count;
        match target {
            Target::Any => {
                Ok((self.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(count)) as u16)
            }
            Target::PartitionKey(key) => Ok(partition_for_key(key, count)),
            Target::PartitionId(id) => self.partition_index(hub, id),
        }
    }

    pub fn partition_index(&self, hub: &HubRecord, partition_id: &str) -> Result<u16, Error> {
        let count = hub.partition_count;
        partition_id
            .parse::<u16>()
            .ok()
            .filter(|p| *p < count && partition_id == p.to_string())
            .ok_or_else(|| {
                Error::not_found(format!(
                    "partition '{partition_id}' does not exist in event hub '{}'; valid partition ids are 0 to {}",
                    hub.name,
                    count - 1
                ))
            })
    }

    /// This node's replica of a partition. A node without one answers NOT_LEADER naming the
    /// partition's preferred leader, so clients can go there.
    pub fn local_partition(&self, hub: &HubRecord, index: u16) -> Result<Arc<Partition>, Error> {
        let group = GroupId::new(hub.id, PartitionId(index), 0);
        if let Some(partition) = self.partitions.read().expect("partitions lock").get(&group) {
            return Ok(partition.clone());
        }
        let replicas = &hub.replicas[usize::from(index)];
        if replicas.contains(&self.node_id().0) {
            return Err(Error::busy(
                "the partition is starting on this node. Please wait 1 seconds and try again",
                Duration::from_secs(1),
            ));
        }
        Err(self.not_leader(
            replicas.first().copied().map(NodeId),
            format!(
                "partition {index} of event hub '{}' has no replica on node {}; its replicas are on nodes {replicas:?}",
                hub.name,
                self.node_id()
            ),
        ))
    }

    /// Why a partition replica on this node stopped while its hub remains: it moved to
    /// other nodes. NOT_LEADER naming the partition's preferred leader, so clients go on
    /// there.
    pub fn partition_moved(&self, hub: &HubRecord, index: u16) -> Error {
        let replicas = hub
            .replicas
            .get(usize::from(index))
            .cloned()
            .unwrap_or_default();
        self.not_leader(
            replicas.first().copied().map(NodeId),
            format!(
                "partition {index} of event hub '{}' no longer has a replica on node {}; its replicas are on nodes {replicas:?}",
                hub.name,
                self.node_id()
            ),
        )
    }

    /// The leader replica of a partition, caught up with everything committed: reads are
    /// served from it.
    pub async fn leader_partition(
        &self,
        hub: &HubRecord,
        index: u16,
    ) -> Result<Arc<Partition>, Error> {
        let partition = self.local_partition(hub, index)?;
        partition
            .ensure_caught_up()
            .await
            .map_err(|e| self.partition_error(e))?;
        Ok(partition)
    }

    /// NOT_LEADER naming the node to ask and its client address: the one place this
    /// error is made.
    fn not_leader(&self, leader: Option<NodeId>, message: String) -> Error {
        let client_addr = leader.and_then(|l| {
            self.runtime
                .state()
                .nodes
                .get(&l.0)
                .map(|n| n.client_addr.clone())
        });
        Error::new(
            ErrorKind::NotLeader {
                node: leader,
                client_addr,
            },
            message,
        )
    }

    /// Maps a partition error, naming the leader's client address for NOT_LEADER.
    pub fn partition_error(&self, err: PartitionError) -> Error {
        match err {
            PartitionError::NotLeader { leader } => self.not_leader(
                leader,
                match leader {
                    Some(l) => format!("this node does not lead the partition; node {l} does"),
                    None => "this node does not lead the partition and no leader is known yet"
                        .to_string(),
                },
            ),
            other => Error::from(other),
        }
    }

    pub fn check_consumer_group(&self, hub: &HubRecord, name: &str) -> Result<(), Error> {
        if hub.consumer_groups.contains_key(name) || name == DEFAULT_CONSUMER_GROUP {
            Ok(())
        } else {
            Err(Error::not_found(format!(
                "consumer group '{name}' does not exist in event hub '{}'",
                hub.name
            )))
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

/// The version of the view that assigned a stored replica here (0: not recorded).
fn assigned_at(shard: &Shard, group: GroupId) -> Result<u64, PartitionError> {
    let bytes = shard
        .meta(group, MetaKey::AssignedAt)
        .map_err(|e| PartitionError::Storage(e.to_string()))?;
    Ok(bytes
        .and_then(|b| <[u8; 8]>::try_from(b.as_ref()).ok())
        .map_or(0, u64::from_be_bytes))
}

/// How long a founding replica that is not preferred waits before it initializes a new
/// group (and may campaign): past the election timeout's maximum (800 ms), so the preferred
/// replica has had a second try when peers had not started the group at its first.
const FOUNDER_INIT_DELAY: std::time::Duration = std::time::Duration::from_millis(1000);

/// The members this node's replica (`member`) initializes a partition's new group with;
/// empty when it must wait for a leader to bring it in.
///
/// Every replica a group was created with initializes it, with the same founding members
/// (openraft allows several nodes to initialize with the same membership), so it starts
/// once a majority of them runs, whichever replica is preferred by then. A hub older than
/// this node's data existed before it: its groups run elsewhere and bring this replica in
/// as a new member; so does a group that has moved, or one moving here.
fn founding_members(
    state: &ClusterState,
    hub: &HubRecord,
    index: u16,
    me: &NodeRecord,
    member: u64,
) -> BTreeMap<u64, String> {
    let new_group = hub.created_version > me.incarnation_version
        && !hub.moved.contains(&index)
        && state.move_of(hub.id, index).is_none_or(|m| m.to != me.id);
    if !new_group {
        return BTreeMap::new();
    }
    let peer = |node: u64| state.nodes.get(&node).map(|n| n.peer_addr.clone());
    match hub.founders.get(usize::from(index)) {
        Some(founders) if founders.contains(&member) => founders
            .iter()
            .filter_map(|m| Some((*m, peer(member_node(*m).0)?)))
            .collect(),
        Some(_) => BTreeMap::new(),
        // A hub recorded before founders were: its first replica initializes.
        None => match hub.replicas.get(usize::from(index)) {
            Some(replicas) if replicas.first() == Some(&me.id) => replicas
                .iter()
                .filter_map(|r| Some((state.replica_member(hub, index, *r)?, peer(*r)?)))
                .collect(),
            _ => BTreeMap::new(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_controller::state::{NewHub, ReplicaMove, Reply, test_cluster};

    fn create(state: &mut ClusterState) -> HubRecord {
        let Ok(Reply::Hub(hub)) = state.apply(Command::CreateHub(NewHub {
            name: "h".into(),
            partition_count: 1,
            retention_ms: 3_600_000,
            replication_factor: Some(3),
            partitions_max: 1024,
            now_ms: 0,
            down_nodes: Vec::new(),
            throughput_units: 0,
            settings: Default::default(),
        })) else {
            panic!("hub created");
        };
        hub
    }

    /// What each of nodes 1..=4 would initialize partition 0 of hub "h" with.
    fn inits(state: &ClusterState) -> Vec<BTreeMap<u64, String>> {
        let hub = &state.hubs["h"];
        (1..=4)
            .map(|n| {
                let me = &state.nodes[&n];
                let member = state.replica_member(hub, 0, n).unwrap();
                founding_members(state, hub, 0, me, member)
            })
            .collect()
    }

    #[test]
    fn every_founding_replica_initializes_with_the_same_members() {
        let mut state = test_cluster(4);
        let hub = create(&mut state);
        let replicas = hub.replicas[0].clone();
        let founders: BTreeMap<u64, String> = replicas
            .iter()
            .map(|n| (tributary_raft::member_id(*n, 0), format!("p{n}")))
            .collect();
        let check = |state: &ClusterState| {
            for (i, init) in inits(state).into_iter().enumerate() {
                let node = i as u64 + 1;
                if replicas.contains(&node) {
                    assert_eq!(init, founders, "founding replica on node {node}");
                } else {
                    assert!(init.is_empty(), "node {node} holds no founding replica");
                }
            }
        };
        check(&state);
        // The preferred leader changes before the group has started: the same founders,
        // and the first replica now is no different from the others.
        state
            .apply(Command::SetPreferredLeaders(vec![(hub.id, 0, replicas[2])]))
            .unwrap();
        assert_eq!(state.hubs["h"].replicas[0][0], replicas[2]);
        check(&state);
    }

    #[test]
    fn replicas_of_running_groups_wait_to_be_brought_in() {
        let mut state = test_cluster(4);
        let hub = create(&mut state);
        let spare = (1..=4).find(|n| !hub.replicas[0].contains(n)).unwrap();
        // A move under way: its target waits for the leader.
        state
            .apply(Command::StartMoves(vec![ReplicaMove {
                hub: hub.id,
                partition: 0,
                from: Some(hub.replicas[0][0]),
                to: spare,
                started_ms: 0,
            }]))
            .unwrap();
        assert!(inits(&state)[spare as usize - 1].is_empty());
        // Once the partition has moved, no replica initializes it any more.
        state
            .apply(Command::FinishMove {
                hub: hub.id,
                partition: 0,
                to: spare,
            })
            .unwrap();
        assert!(inits(&state).iter().all(BTreeMap::is_empty));

        // A founder whose node lost its data since is a new member, not a founder.
        let mut state = test_cluster(4);
        let hub = create(&mut state);
        let wiped = hub.replicas[0][1];
        let mut record = state.nodes[&wiped].clone();
        record.data_id += 1;
        state.apply(Command::RegisterNode(record)).unwrap();
        assert!(inits(&state)[wiped as usize - 1].is_empty());
        assert!(!inits(&state)[hub.replicas[0][0] as usize - 1].is_empty());
    }
}
