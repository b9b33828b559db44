//! Local replicas follow the cluster state: the replicas assigned here start (a new group's
//! founders initialize it), those no longer assigned are dropped, and on the first pass the
//! stored groups no longer assigned are swept.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::{GroupId, PartitionId};

use crate::group::GroupStateMachine;
use crate::partition::{Partition, PartitionError};
use tributary_controller::state::{ClusterState, HubRecord, NodeRecord};
use tributary_raft::{GroupHost, member_incarnation, member_node};

use super::Broker;

impl Broker {
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
    use tributary_controller::state::{Command, ReplicaMove, test_cluster};

    fn create(state: &mut ClusterState) -> HubRecord {
        tributary_controller::state::test_create_hub(state, 1, 3)
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
