//! What the bench reads off the partition's replicas: from the cluster status, who leads
//! and whether the replicas (or the rebuilt one) are caught up; from each node's own
//! replica (`debug replica-events --summary`), what it holds; and the waits built on them.

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use tokio::time::Instant;
use tributary_client::{Client, ReplicaSummary, replica_digest};
use tributary_proto::v1::{ClusterStatus, PartitionStatus};

use super::{HUB, PARTITION, POLL_INTERVAL, REPLICATION_FACTOR};

/// How long the partition may take to have every replica up and caught up.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long retention may take to remove the earliest events once the fill is done.
const CUT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the replicas may take to read identical once the sends have stopped (each
/// replica applies retention on its own clock).
pub(crate) const IDENTICAL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long one cluster status call may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between two readings of every replica (each lists the whole partition).
const IDENTICAL_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// What one node's replica holds: the summary `debug replica-events --summary` prints,
/// and the bytes of its event bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaContents {
    pub(crate) summary: ReplicaSummary,
    pub(crate) body_bytes: u64,
}

/// Reads the replica of `partition_id` of `hub` on the node `client` connects to (never
/// redirected to another node).
pub(crate) async fn contents(
    client: &Client,
    hub: &str,
    partition_id: &str,
) -> Result<ReplicaContents, String> {
    let listing = client
        .replica_events(hub, partition_id, 0, None)
        .await
        .map_err(|error| format!("{}: {error}", client.endpoint()))?;
    Ok(ReplicaContents {
        summary: replica_digest(&listing.events),
        body_bytes: listing.events.iter().map(|e| u64::from(e.body_bytes)).sum(),
    })
}

/// The common contents when every node's replica read the same and holds events; why not
/// otherwise.
pub(crate) fn identical(
    contents: &[Result<ReplicaContents, String>],
) -> Result<ReplicaContents, String> {
    let Some(Ok(first)) = contents.first() else {
        return Err(describe(contents));
    };
    if first.summary.count > 0 && contents.iter().all(|c| c.as_ref() == Ok(first)) {
        Ok(*first)
    } else {
        Err(describe(contents))
    }
}

/// `node 1: 16058 events 1219..=17276 digest 0x…; node 2: …`.
pub(crate) fn describe(contents: &[Result<ReplicaContents, String>]) -> String {
    contents
        .iter()
        .enumerate()
        .map(|(index, c)| match c {
            Ok(c) => format!(
                "node {}: {} events {}..={} digest {:#018x}",
                index + 1,
                c.summary.count,
                c.summary.first_sequence_number.unwrap_or(-1),
                c.summary.last_sequence_number.unwrap_or(-1),
                c.summary.digest
            ),
            Err(error) => format!("node {}: unreadable ({error})", index + 1),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn partition<'a>(
    status: &'a ClusterStatus,
    hub: &str,
    partition_id: &str,
) -> Result<&'a PartitionStatus, String> {
    status
        .partitions
        .iter()
        .find(|p| p.event_hub == hub && p.partition_id == partition_id)
        .ok_or_else(|| format!("the status shows no partition {partition_id} of '{hub}' yet"))
}

/// The node leading the partition, once every one of its `replicas` replicas is up and
/// caught up; why not yet otherwise.
pub(crate) fn settled(
    status: &ClusterStatus,
    hub: &str,
    partition_id: &str,
    replicas: usize,
) -> Result<u64, String> {
    let partition = partition(status, hub, partition_id)?;
    if partition.leader == 0 {
        return Err(format!("partition {partition_id} of '{hub}' has no leader"));
    }
    let ready = partition
        .replicas
        .iter()
        .filter(|r| r.up && r.caught_up)
        .count();
    if ready < replicas {
        return Err(format!(
            "{ready} of {replicas} replicas of partition {partition_id} of '{hub}' are up and \
             caught up: {:?}",
            partition.replicas
        ));
    }
    Ok(partition.leader)
}

/// The replica furthest behind the partition's leader: its node and how many applied
/// entries it lags (0 when every replica is level); why unknown otherwise.
pub(crate) fn furthest_behind(
    status: &ClusterStatus,
    hub: &str,
    partition_id: &str,
) -> Result<(u64, i64), String> {
    let partition = partition(status, hub, partition_id)?;
    let Some(leader) = partition
        .replicas
        .iter()
        .find(|r| partition.leader != 0 && r.node == partition.leader)
    else {
        return Err(format!("partition {partition_id} of '{hub}' has no leader"));
    };
    Ok(partition
        .replicas
        .iter()
        .map(|r| (r.node, leader.last_applied_index - r.last_applied_index))
        .max_by_key(|(_, lag)| *lag)
        .unwrap_or((leader.node, 0)))
}

/// Whether the replica on node `rebuilt` is rebuilt: led by another node, up, a voter
/// caught up with its leader, and holding applied entries; why not yet otherwise.
pub(crate) fn rebuilt(
    status: &ClusterStatus,
    hub: &str,
    partition_id: &str,
    rebuilt: u64,
) -> Result<(), String> {
    let partition = partition(status, hub, partition_id)?;
    if partition.leader == 0 || partition.leader == rebuilt {
        return Err(format!(
            "partition {partition_id} of '{hub}' is led by {} (not another node)",
            partition.leader
        ));
    }
    let Some(replica) = partition.replicas.iter().find(|r| r.node == rebuilt) else {
        return Err(format!("node {rebuilt} holds no replica of it yet"));
    };
    if replica.up && replica.caught_up && replica.last_applied_index >= 0 {
        Ok(())
    } else {
        Err(format!(
            "node {rebuilt}'s replica is not caught up yet: {replica:?}"
        ))
    }
}

/// Waits until the partition is led and every replica is up and caught up; returns the
/// leading node's id.
pub(crate) async fn await_settled(client: &Client) -> anyhow::Result<u64> {
    let deadline = Instant::now() + SETTLE_TIMEOUT;
    loop {
        let last = match cluster_status(client).await {
            Ok(status) => match settled(&status, HUB, PARTITION, REPLICATION_FACTOR as usize) {
                Ok(leader) => return Ok(leader),
                Err(why) => why,
            },
            Err(error) => format!("{error:#}"),
        };
        if Instant::now() >= deadline {
            bail!(
                "the partition did not settle within {}: {last}",
                humantime::format_duration(SETTLE_TIMEOUT)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until retention has removed the partition's earliest events (its first retained
/// sequence number is above 0).
pub(crate) async fn await_cut(client: &Client) -> anyhow::Result<()> {
    let deadline = Instant::now() + CUT_TIMEOUT;
    loop {
        let last = match client.get_partition_properties(HUB, PARTITION).await {
            Ok(properties) if properties.begin_sequence_number > 0 => return Ok(()),
            Ok(properties) => format!(
                "it begins at sequence number {}",
                properties.begin_sequence_number
            ),
            Err(error) => error.to_string(),
        };
        if Instant::now() >= deadline {
            bail!(
                "retention did not remove the earliest events of partition {PARTITION} of \
                 '{HUB}' within {}: {last}",
                humantime::format_duration(CUT_TIMEOUT)
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// Waits until every node's replica reads the same events; returns them, or the last
/// reading once [`IDENTICAL_TIMEOUT`] has passed.
pub(crate) async fn await_identical(clients: &[Client]) -> Result<ReplicaContents, String> {
    let deadline = Instant::now() + IDENTICAL_TIMEOUT;
    loop {
        let reads = clients
            .iter()
            .map(|client| contents(client, HUB, PARTITION));
        let contents = futures::future::join_all(reads).await;
        let last = match identical(&contents) {
            Ok(common) => return Ok(common),
            Err(last) => last,
        };
        if Instant::now() >= deadline {
            return Err(last);
        }
        tokio::time::sleep(IDENTICAL_POLL_INTERVAL).await;
    }
}

pub(crate) async fn cluster_status(
    client: &Client,
) -> anyhow::Result<tributary_proto::v1::ClusterStatus> {
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

#[cfg(test)]
mod tests {
    use tributary_proto::v1::ReplicaStatus;

    use super::*;

    fn replica(node: u64, up: bool, caught_up: bool, last_applied_index: i64) -> ReplicaStatus {
        ReplicaStatus {
            node,
            up,
            caught_up,
            last_applied_index,
            ..Default::default()
        }
    }

    fn status(leader: u64, replicas: Vec<ReplicaStatus>) -> ClusterStatus {
        ClusterStatus {
            partitions: vec![PartitionStatus {
                event_hub: "rebuild".into(),
                partition_id: "0".into(),
                leader,
                replicas,
            }],
            ..Default::default()
        }
    }

    fn level() -> Vec<ReplicaStatus> {
        (1..=3).map(|n| replica(n, true, true, 500)).collect()
    }

    #[test]
    fn settled_once_every_replica_is_up_and_caught_up() {
        assert_eq!(settled(&status(2, level()), "rebuild", "0", 3), Ok(2));
        assert!(settled(&status(0, level()), "rebuild", "0", 3).is_err());
        let mut behind = level();
        behind[2].caught_up = false;
        assert!(
            settled(&status(1, behind), "rebuild", "0", 3)
                .unwrap_err()
                .starts_with("2 of 3 replicas")
        );
        assert!(settled(&status(1, level()), "other", "0", 3).is_err());
    }

    #[test]
    fn rebuilt_once_the_wiped_replica_is_a_caught_up_voter_again() {
        assert_eq!(rebuilt(&status(1, level()), "rebuild", "0", 3), Ok(()));
        let mut down = level();
        down[2] = replica(3, false, true, 500);
        assert!(rebuilt(&status(1, down), "rebuild", "0", 3).is_err());
        let mut empty = level();
        empty[2] = replica(3, true, true, -1);
        assert!(
            rebuilt(&status(1, empty), "rebuild", "0", 3).is_err(),
            "a replica that has applied nothing is not rebuilt"
        );
        assert!(
            rebuilt(&status(3, level()), "rebuild", "0", 3).is_err(),
            "it leads: no other node to compare with"
        );
        let two = level().into_iter().take(2).collect();
        assert!(rebuilt(&status(1, two), "rebuild", "0", 3).is_err());
    }

    #[test]
    fn the_furthest_behind_is_measured_from_the_leaders_applied_index() {
        let mut replicas = level();
        replicas[0].last_applied_index = 480;
        replicas[2].last_applied_index = 460;
        assert_eq!(
            furthest_behind(&status(2, replicas), "rebuild", "0"),
            Ok((3, 40))
        );
        assert_eq!(
            furthest_behind(&status(1, level()), "rebuild", "0").map(|(_, lag)| lag),
            Ok(0)
        );
        assert!(furthest_behind(&status(0, level()), "rebuild", "0").is_err());
    }

    fn contents(count: u64, digest: u64) -> Result<ReplicaContents, String> {
        Ok(ReplicaContents {
            summary: ReplicaSummary {
                count,
                first_sequence_number: Some(10),
                last_sequence_number: Some(10 + count as i64 - 1),
                digest,
            },
            body_bytes: count * 100,
        })
    }

    #[test]
    fn identical_only_when_every_replica_reads_the_same_events() {
        let same = [contents(5, 7), contents(5, 7), contents(5, 7)];
        assert_eq!(identical(&same), same[0].clone());
        let differ = [contents(5, 7), contents(5, 8), contents(5, 7)];
        let why = identical(&differ).unwrap_err();
        assert!(
            why.contains("node 2: 5 events 10..=14 digest 0x0000000000000008"),
            "{why}"
        );
        let unreadable = [contents(5, 7), Err("refused".into()), contents(5, 7)];
        assert!(
            identical(&unreadable)
                .unwrap_err()
                .contains("node 2: unreadable (refused)")
        );
        assert!(
            identical(&[contents(0, 1), contents(0, 1)]).is_err(),
            "empty"
        );
    }
}
