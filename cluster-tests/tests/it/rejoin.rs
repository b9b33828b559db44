//! Replicas that come back: one that was down while 50,000 events arrived catches up from
//! its leader's log; a node whose data directory was wiped rejoins every group as a new
//! incarnation, rebuilt from snapshots because its leaders purged their logs past that
//! point, and becomes a voter again (the cluster then survives losing another node).

use std::time::Duration;

use tributary_client::{
    Client, ErrorReason, EventData, ReplicaSummary, SendTarget, replica_digest,
};
use tributary_cluster_tests::{LocalCluster, TestDir, eventually, http_get, test_seed};

/// How long a replica may take to catch up or be rebuilt.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(120);

/// Sends `batches` batches of `per_batch` events to one partition, four at a time.
async fn send_batches(
    client: &Client,
    hub: &str,
    partition: &str,
    batches: usize,
    per_batch: usize,
    tag: &str,
) {
    send_padded_batches(client, hub, partition, batches, per_batch, tag, 0).await
}

/// As [`send_batches`], each body padded with `pad` bytes.
async fn send_padded_batches(
    client: &Client,
    hub: &str,
    partition: &str,
    batches: usize,
    per_batch: usize,
    tag: &str,
    pad: usize,
) {
    let mut sent = 0;
    while sent < batches {
        let wave: Vec<_> = (sent..(sent + 4).min(batches))
            .map(|b| {
                let producer = client.producer();
                let events: Vec<EventData> = (0..per_batch)
                    .map(|i| {
                        EventData::from_body(format!(
                            "{tag}-{partition}-{b}-{i}{}",
                            ".".repeat(pad)
                        ))
                    })
                    .collect();
                let partition = partition.to_string();
                async move {
                    producer
                        .send(hub, SendTarget::PartitionId(partition), events)
                        .await
                }
            })
            .collect();
        let n = wave.len();
        for result in futures::future::join_all(wave).await {
            result.unwrap_or_else(|e| panic!("send to {hub}/{partition} failed: {e}"));
        }
        sent += n;
    }
}

/// The summary of what `node`'s replica of a partition holds.
async fn replica_summary(endpoint: &str, hub: &str, partition: &str) -> Option<ReplicaSummary> {
    let client = Client::connect(endpoint).await.ok()?;
    let listing = client.replica_events(hub, partition, 0, None).await.ok()?;
    Some(replica_digest(&listing.events))
}

/// Waits until every endpoint's replica of the partition lists `count` events, all
/// identical; returns the common summary.
async fn await_identical_replicas(
    endpoints: &[String],
    hub: &str,
    partition: &str,
    count: u64,
) -> ReplicaSummary {
    let what = format!("the replicas of {hub}/{partition} identical with {count} events");
    eventually(CATCH_UP_TIMEOUT, what, async || {
        let mut summaries = Vec::new();
        for endpoint in endpoints {
            summaries.push(replica_summary(endpoint, hub, partition).await);
        }
        if let Some(Some(first)) = summaries.first()
            && first.count == count
            && summaries.iter().all(|s| s.as_ref() == Some(first))
        {
            return Ok(*first);
        }
        Err(format!("{summaries:?}"))
    })
    .await
}

/// A counter from a node's /metrics (0 when it has not been counted yet).
pub(crate) async fn counter(cluster: &LocalCluster, index: usize, name: &str) -> u64 {
    let metrics = http_get(cluster.nodes[index].http_addr(), "/metrics")
        .await
        .expect("metrics answer");
    metrics
        .body
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .map_or(0, |v| v.parse::<f64>().expect("a counter value") as u64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_down_while_50k_events_arrive_catches_up_from_the_log() {
    let seed = test_seed("lagging_replica_catches_up");
    let dir = TestDir::new("lagging-replica");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    admin
        .create_replicated_event_hub("lag", 1, None, Some(3))
        .await
        .unwrap();
    let leader = cluster.partition_leader("lag", "0").await;
    // A follower, picked by the seed.
    let victim = (leader + 1 + (seed % 2) as usize) % 3;
    println!(
        "leader is node {}, stopping node {}",
        leader + 1,
        victim + 1
    );
    cluster.nodes[victim].kill9().await;

    let writer = Client::connect(&endpoints[leader]).await.unwrap();
    send_batches(&writer, "lag", "0", 500, 100, "while-down").await;
    println!("50,000 events acknowledged without node {}", victim + 1);

    cluster.nodes[victim].restart().await;
    let summary = await_identical_replicas(&endpoints, "lag", "0", 50_000).await;
    assert_eq!(summary.first_sequence_number, Some(0));
    assert_eq!(summary.last_sequence_number, Some(49_999));
    // Nothing was purged, so it caught up from the log, not from a snapshot.
    assert_eq!(
        counter(&cluster, victim, "tributary_raft_snapshots_installed_total").await,
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wiped_node_rejoins_as_a_new_incarnation_rebuilt_from_snapshots() {
    const PARTITIONS: u32 = 2;
    let seed = test_seed("wiped_node_rejoins");
    let dir = TestDir::new("wiped-node");
    // Frequent snapshot points and little log kept behind them: leaders purge their logs
    // (logically) well past what the wiped node had.
    let mut cluster = LocalCluster::start_with_env(
        dir.path(),
        3,
        &[
            ("TRIBUTARY_RAFT_SNAPSHOT_ENTRIES", "20"),
            ("TRIBUTARY_RAFT_LOG_KEEP_ENTRIES", "5"),
        ],
    )
    .await;
    let endpoints = cluster.endpoints();
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    admin
        .create_replicated_event_hub("wipe", PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let mut expected = 0u64;
    // 8 KiB events: each partition's snapshot is several pieces on the wire.
    for p in 0..PARTITIONS {
        send_padded_batches(&admin, "wipe", &p.to_string(), 60, 10, "before", 8192).await;
    }
    expected += 600;

    // Every node is a controller voter in a three-node cluster: the victim is one.
    let victim = (seed % 3) as usize;
    let other = (victim + 1) % 3;
    println!("wiping node {}", victim + 1);
    cluster.nodes[victim].wipe().await;
    let writer = Client::connect(&endpoints[other]).await.unwrap();
    for p in 0..PARTITIONS {
        send_batches(&writer, "wipe", &p.to_string(), 60, 10, "during").await;
    }
    expected += 600;

    cluster.nodes[victim].restart().await;
    for p in 0..PARTITIONS {
        let summary = await_identical_replicas(&endpoints, "wipe", &p.to_string(), expected).await;
        assert_eq!(summary.last_sequence_number, Some(expected as i64 - 1));
    }
    assert!(
        counter(&cluster, victim, "tributary_raft_snapshots_installed_total").await
            >= u64::from(PARTITIONS),
        "the wiped node's replicas were not rebuilt through snapshots"
    );
    assert!(
        counter(
            &cluster,
            victim,
            "tributary_peer_snapshot_chunks_received_total"
        )
        .await
            >= 2 * u64::from(PARTITIONS),
        "snapshots of several MiB travel in pieces"
    );
    // Streamed from the leaders' storage: every retained event's bytes came as log pieces.
    let event_bytes = u64::from(PARTITIONS) * 600 * 8192;
    let received = counter(&cluster, victim, "tributary_rebuild_bytes_received_total").await;
    assert!(
        received >= event_bytes,
        "{received} bytes of rebuilds received, fewer than the {event_bytes} bytes of events"
    );

    // The new incarnation must be a voter of every group, not just a copy: with another
    // node gone, the controller and every partition still need it for a majority. Wait
    // until the status shows every replica caught up (membership changes are done then).
    eventually(CATCH_UP_TIMEOUT, "every replica caught up", async || {
        let status = writer.cluster_status().await.unwrap();
        if status
            .partitions
            .iter()
            .all(|p| p.replicas.iter().all(|r| r.up && r.caught_up))
        {
            Ok(())
        } else {
            Err(format!("{status:?}"))
        }
    })
    .await;
    let survivor = 3 - victim - other;
    println!(
        "stopping node {}; node {} must vote now",
        other + 1,
        victim + 1
    );
    cluster.nodes[other].kill9().await;
    let client = Client::connect(&endpoints[survivor])
        .await
        .unwrap()
        .with_retry_deadline(Duration::from_secs(60));
    // The controller may have lost its leader too: retry while it elects a new one.
    let what = "a controller majority with the rejoined node (a hub created)";
    eventually(CATCH_UP_TIMEOUT, what, async || {
        match client
            .create_replicated_event_hub("after-wipe", 1, None, Some(2))
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if err.reason() == Some(ErrorReason::AlreadyExists) => Ok(()),
            Err(err) => Err(err),
        }
    })
    .await;
    for p in 0..PARTITIONS {
        send_batches(&client, "wipe", &p.to_string(), 5, 10, "after").await;
    }
    let alive = [endpoints[victim].clone(), endpoints[survivor].clone()];
    for p in 0..PARTITIONS {
        await_identical_replicas(&alive, "wipe", &p.to_string(), expected + 50).await;
    }
}
