//! Leadership: each partition this node leads keeps its voters equal to its replicas'
//! current members (a wiped node's new incarnation replaces its old one, a moved replica
//! joins as a learner and is promoted) and hands leadership to the preferred replica, never
//! to a draining node.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::partition::Partition;
use tributary_controller::state::{ClusterState, HubRecord};

use super::Broker;

impl Broker {
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
}
