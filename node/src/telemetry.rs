//! Gauges sampled on a timer rather than updated where things happen: each partition
//! replica's Raft state, the controller's cluster-wide counts and the consumer groups'
//! checkpoints. See README "Monitoring" for who reports what.
//!
//! Cluster-wide gauges (`tributary_partitions_under_replicated`,
//! `tributary_partitions_unavailable`, `tributary_nodes_up`) are set by the controller
//! leader only; every other node sets them to 0, so a sum over nodes is the cluster's count.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::type_config::async_runtime::WatchReceiver;
use tributary_broker::status::ClusterStatus;
use tributary_raft::member_node;
use tributary_types::GroupId;

use tributary_broker::Broker;

/// How often the gauges are sampled.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);

/// The cluster-wide counts the controller leader reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ClusterCounts {
    /// Partitions with fewer up, caught-up voters than their replication factor.
    pub under_replicated: u32,
    /// Partitions without a leader that answers: they take no sends and serve no reads.
    pub unavailable: u32,
    pub nodes_up: u32,
}

/// The counts in a cluster status report.
pub fn cluster_counts(status: &ClusterStatus) -> ClusterCounts {
    let up: HashSet<u64> = status.nodes.iter().filter(|n| n.up).map(|n| n.id).collect();
    ClusterCounts {
        under_replicated: status.under_replicated,
        unavailable: status
            .partitions
            .iter()
            .filter(|p| p.leader == 0 || !up.contains(&p.leader))
            .count() as u32,
        nodes_up: up.len() as u32,
    }
}

/// Samples until the node shuts down.
pub async fn run(broker: Arc<Broker>) {
    let mut closing = broker.closing();
    let mut ticker = tokio::time::interval(SAMPLE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sampler = Sampler::default();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = closing.wait_for(|c| *c) => return,
        }
        sampler.sample_partitions(&broker);
        sample_controller(&broker).await;
        sample_checkpoints(&broker).await;
    }
}

/// What the previous sample saw, to count leadership changes and to zero the gauges of
/// replicas that have left this node.
#[derive(Default)]
struct Sampler {
    leaders: HashMap<GroupId, Option<u64>>,
    labels: HashMap<GroupId, (String, String)>,
}

impl Sampler {
    fn sample_partitions(&mut self, broker: &Broker) {
        let state = broker.runtime().state();
        let mut seen = HashSet::new();
        for partition in broker.local_partitions() {
            let group = partition.group;
            let Some(hub) = state.hub_by_id(group.hub) else {
                continue;
            };
            let labels = [
                ("hub", hub.name.clone()),
                ("partition", group.partition.0.to_string()),
            ];
            let metrics = partition.raft().metrics();
            let m = metrics.borrow_watched();
            let leader = m.current_leader.map(|l| member_node(l).0);
            let is_leader = m.current_leader.is_some() && m.current_leader == Some(m.id);
            let last_log = m.last_log_index.unwrap_or(0);
            // How far the furthest-behind follower's stored log trails the leader's.
            let lag = m
                .replication
                .iter()
                .flatten()
                .filter(|(member, _)| **member != m.id)
                .map(|(_, matched)| last_log.saturating_sub(matched.map_or(0, |l| l.index)))
                .max()
                .unwrap_or(0);
            let term = m.current_term;
            drop(m);
            metrics::gauge!("tributary_raft_leader", &labels).set(u8::from(is_leader));
            metrics::gauge!("tributary_raft_term", &labels).set(term as f64);
            metrics::gauge!("tributary_raft_follower_lag_max_entries", &labels).set(if is_leader {
                lag as f64
            } else {
                0.0
            });
            metrics::gauge!("tributary_partition_last_sequence", &labels)
                .set((partition.progress().next_sequence - 1) as f64);
            let before = self.leaders.insert(group, leader);
            if is_leader && before.is_some_and(|b| b != leader) {
                metrics::counter!("tributary_raft_leadership_changes_total", &labels).increment(1);
            }
            self.labels
                .insert(group, (labels[0].1.clone(), labels[1].1.clone()));
            seen.insert(group);
        }
        // A replica that moved away or was deleted no longer leads here.
        self.leaders.retain(|group, _| seen.contains(group));
        let gone: Vec<GroupId> = self
            .labels
            .keys()
            .filter(|g| !seen.contains(g))
            .copied()
            .collect();
        for group in gone {
            if let Some((hub, partition)) = self.labels.remove(&group) {
                let labels = [("hub", hub), ("partition", partition)];
                metrics::gauge!("tributary_raft_leader", &labels).set(0.0);
                metrics::gauge!("tributary_raft_follower_lag_max_entries", &labels).set(0.0);
            }
        }
    }
}

async fn sample_controller(broker: &Broker) {
    let leader = broker.runtime().is_controller_leader();
    metrics::gauge!("tributary_controller_leader").set(u8::from(leader));
    let counts = if leader {
        cluster_counts(&tributary_broker::status::cluster_status(broker).await)
    } else {
        ClusterCounts::default()
    };
    metrics::gauge!("tributary_partitions_under_replicated").set(counts.under_replicated);
    metrics::gauge!("tributary_partitions_unavailable").set(counts.unavailable);
    metrics::gauge!("tributary_nodes_up").set(counts.nodes_up);
}

/// Every controller voter reports the checkpoints of its replica of the store.
async fn sample_checkpoints(broker: &Broker) {
    let Some(checkpoints) = broker.runtime().checkpoint_sequences().await else {
        return;
    };
    let state = broker.runtime().state();
    for (hub, group, partition, sequence) in checkpoints {
        let Some(hub) = state.hub_by_id(hub) else {
            continue;
        };
        metrics::gauge!(
            "tributary_consumer_group_checkpoint_sequence",
            "hub" => hub.name.clone(),
            "consumer_group" => group,
            "partition" => partition.to_string()
        )
        .set(sequence as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, up: bool) -> tributary_broker::status::NodeStatus {
        tributary_broker::status::NodeStatus {
            id,
            up,
            ..Default::default()
        }
    }

    fn partition(id: u32, leader: u64) -> tributary_broker::status::PartitionStatus {
        tributary_broker::status::PartitionStatus {
            event_hub: "h".into(),
            partition_id: id.to_string(),
            leader,
            replicas: Vec::new(),
        }
    }

    #[test]
    fn partitions_without_a_leader_or_with_a_down_leader_are_unavailable() {
        let status = ClusterStatus {
            under_replicated: 2,
            nodes: vec![node(1, true), node(2, true), node(3, false)],
            partitions: vec![
                partition(0, 1),
                partition(1, 0),
                partition(2, 3),
                partition(3, 2),
            ],
            ..Default::default()
        };
        assert_eq!(
            cluster_counts(&status),
            ClusterCounts {
                under_replicated: 2,
                unavailable: 2,
                nodes_up: 2,
            }
        );
    }
}
