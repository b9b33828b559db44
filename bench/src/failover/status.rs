//! Decisions the failover bench takes from a cluster status: who leads a partition, and
//! whether the cluster has settled after a restart.

use tributary_proto::v1::ClusterStatus;

/// The client address of the node that leads `partition_id` of `hub`, if one is known.
pub(crate) fn leader_addr<'a>(
    status: &'a ClusterStatus,
    hub: &str,
    partition_id: &str,
) -> Option<&'a str> {
    let partition = status
        .partitions
        .iter()
        .find(|p| p.event_hub == hub && p.partition_id == partition_id)?;
    if partition.leader == 0 {
        return None;
    }
    status
        .nodes
        .iter()
        .find(|n| n.id == partition.leader)
        .map(|n| n.client_addr.as_str())
}

/// Why the cluster is not yet ready for the next kill, or `None` when it is: all `nodes`
/// nodes are up, every partition of `hubs` has a leader, and each of its replicas is up and
/// caught up, or at most `lag_entries_max` entries behind its leader's applied index (under
/// load a replica is rarely exactly level at the moment the status is taken).
pub(crate) fn unsettled(
    status: &ClusterStatus,
    nodes: usize,
    hubs: &[String],
    lag_entries_max: i64,
) -> Option<String> {
    let up = status.nodes.iter().filter(|n| n.up).count();
    if up < nodes {
        return Some(format!("{up} of {nodes} nodes are up"));
    }
    let mut partitions = 0;
    for partition in status
        .partitions
        .iter()
        .filter(|p| hubs.contains(&p.event_hub))
    {
        partitions += 1;
        let name = format!(
            "partition {} of '{}'",
            partition.partition_id, partition.event_hub
        );
        let Some(leader) = partition
            .replicas
            .iter()
            .find(|r| partition.leader != 0 && r.node == partition.leader)
        else {
            return Some(format!("{name} has no leader"));
        };
        for replica in &partition.replicas {
            let lag = leader.last_applied_index - replica.last_applied_index;
            if !replica.up {
                return Some(format!(
                    "{name}: the replica on node {} is down",
                    replica.node
                ));
            }
            if !replica.caught_up && lag > lag_entries_max {
                return Some(format!(
                    "{name}: the replica on node {} is {lag} entries behind",
                    replica.node
                ));
            }
        }
    }
    if partitions == 0 {
        return Some("the status shows no partitions of the bench's hubs yet".into());
    }
    None
}

#[cfg(test)]
mod tests {
    use tributary_proto::v1::{NodeStatus, PartitionStatus, ReplicaStatus};

    use super::*;

    fn node(id: u64, up: bool) -> NodeStatus {
        NodeStatus {
            id,
            client_addr: format!("127.0.0.1:{}", 7000 + id),
            peer_addr: String::new(),
            up,
            controller_voter: true,
            ..Default::default()
        }
    }

    fn replica(node: u64, caught_up: bool, last_applied_index: i64) -> ReplicaStatus {
        ReplicaStatus {
            node,
            up: true,
            caught_up,
            last_applied_index,
            ..Default::default()
        }
    }

    fn status(leader: u64, replicas: Vec<ReplicaStatus>) -> ClusterStatus {
        ClusterStatus {
            moves: Vec::new(),
            under_replicated: 0,
            cluster_id: "c".into(),
            controller_leader: 1,
            feature_level: 2,
            feature_release: "0.2.0".into(),
            nodes: vec![node(1, true), node(2, true), node(3, true)],
            partitions: vec![
                PartitionStatus {
                    event_hub: "other".into(),
                    partition_id: "0".into(),
                    leader: 0,
                    replicas: vec![],
                },
                PartitionStatus {
                    event_hub: "h".into(),
                    partition_id: "0".into(),
                    leader,
                    replicas,
                },
            ],
        }
    }

    fn level() -> Vec<ReplicaStatus> {
        vec![
            replica(1, true, 10),
            replica(2, true, 10),
            replica(3, true, 10),
        ]
    }

    #[test]
    fn finds_the_leaders_client_address() {
        let s = status(2, level());
        assert_eq!(leader_addr(&s, "h", "0"), Some("127.0.0.1:7002"));
        assert_eq!(leader_addr(&s, "h", "1"), None);
        assert_eq!(leader_addr(&s, "other", "0"), None, "no leader known");
    }

    #[test]
    fn settled_only_with_every_node_up_leaders_and_replicas_close_behind() {
        let hubs = ["h".to_string()];
        assert_eq!(unsettled(&status(2, level()), 3, &hubs, 8), None);

        let mut one_down = status(2, level());
        one_down.nodes[2].up = false;
        assert_eq!(
            unsettled(&one_down, 3, &hubs, 8).as_deref(),
            Some("2 of 3 nodes are up")
        );

        let leaderless = status(0, level());
        assert!(
            unsettled(&leaderless, 3, &hubs, 8)
                .unwrap()
                .contains("no leader")
        );

        let slightly_behind = vec![
            replica(1, true, 10),
            replica(2, true, 10),
            replica(3, false, 2),
        ];
        assert_eq!(unsettled(&status(1, slightly_behind), 3, &hubs, 8), None);
        let far_behind = vec![
            replica(1, true, 10),
            replica(2, true, 10),
            replica(3, false, 1),
        ];
        assert!(
            unsettled(&status(1, far_behind), 3, &hubs, 8)
                .unwrap()
                .contains("node 3 is 9 entries behind")
        );

        assert!(
            unsettled(&status(2, level()), 3, &["missing".to_string()], 8)
                .unwrap()
                .contains("no partitions")
        );
    }
}
