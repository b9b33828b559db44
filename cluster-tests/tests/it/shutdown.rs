//! A clean stop is quick and complete: with authorization on (the default), SIGTERM stops a
//! node within a second or two, every storage shard is closed with its final checkpoint, and
//! the next start replays nothing.

use std::time::{Duration, Instant};

use tributary_client::{Client, ConnectOptions, EventData, SendTarget};
use tributary_cluster_tests::{
    LocalCluster, NodeProcess, TestDir, http_get, root_connection_string,
};

/// How long a stop may take: far below the 5 s a shard still in use would cost.
const STOP_WITHIN: Duration = Duration::from_secs(2);

/// The value of an unlabelled counter in a `/metrics` page.
fn counter(page: &str, name: &str) -> Option<u64> {
    page.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn sigterm_with_authorization_on_stops_at_once_and_closes_every_shard() {
    let dir = TestDir::new("shutdown_clean");
    let data_dir = dir.path().join("node");
    // `--auth sas` is the default; the test harness turns it off unless asked.
    let mut node = NodeProcess::start_with_args(&data_dir, &["--auth", "sas"]).await;
    let node_endpoint = node.endpoint();
    let root = root_connection_string(&data_dir).await;
    // The node's client port is plain text.
    let connect = async || {
        let options = ConnectOptions {
            endpoint: Some(node_endpoint.clone()),
            ..ConnectOptions::default()
        };
        Client::from_connection_string_with(&root, options)
            .await
            .unwrap()
    };
    let client = connect().await;
    client.create_event_hub("kept", 2, None).await.unwrap();
    for i in 0..20 {
        client
            .producer()
            .send(
                "kept",
                SendTarget::PartitionId((i % 2).to_string()),
                [EventData::from_body(format!("event {i}"))],
            )
            .await
            .unwrap();
    }

    terminates_cleanly(&mut node).await;

    node.restart().await;
    let metrics = http_get(node.http_addr(), "/metrics").await.unwrap();
    assert_eq!(
        counter(&metrics.body, "tributary_storage_replayed_batches_total"),
        Some(0),
        "a clean stop leaves nothing to replay: {}",
        metrics
            .body
            .lines()
            .filter(|l| l.contains("replayed"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let client = connect().await;
    for partition in ["0", "1"] {
        let properties = client
            .get_partition_properties("kept", partition)
            .await
            .unwrap();
        assert_eq!(
            properties.last_enqueued_sequence_number, 9,
            "partition {partition} keeps its ten events"
        );
    }
}

/// A node of a cluster stops as quickly: its peers hold replication sessions open to its
/// peer port (one long-lived stream each), and its shutdown ends them instead of waiting
/// for them (a graceful shutdown waits for every open stream until its drain timeout).
#[tokio::test]
async fn sigterm_stops_a_node_with_replication_sessions_into_it_at_once() {
    let dir = TestDir::new("shutdown_sessions");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("replicated", 6, None, Some(3))
        .await
        .unwrap();
    for i in 0..30 {
        client
            .producer()
            .send(
                "replicated",
                SendTarget::PartitionId((i % 6).to_string()),
                [EventData::from_body(format!("event {i}"))],
            )
            .await
            .unwrap();
    }
    // The node to stop follows partition 0, led elsewhere: the leader's node holds a
    // session to it.
    let leader = cluster.partition_leader("replicated", "0").await;
    let stopped = (0..3).find(|n| *n != leader).expect("three nodes");
    let sessions = http_get(cluster.nodes[leader].http_addr(), "/metrics")
        .await
        .unwrap();
    assert!(
        counter(&sessions.body, "tributary_peer_sessions_opened_total").is_some_and(|n| n > 0),
        "the leader opened no replication session"
    );
    terminates_cleanly(&mut cluster.nodes[stopped]).await;
}

/// SIGTERM stops `node` with exit code 0 within [`STOP_WITHIN`], with no call cut off at
/// the drain timeout and every storage shard closed.
async fn terminates_cleanly(node: &mut NodeProcess) {
    let started = Instant::now();
    let status = node.terminate().await;
    let took = started.elapsed();
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert_eq!(status.code(), Some(0), "{status}; log:\n{log}");
    assert!(
        took < STOP_WITHIN,
        "SIGTERM took {took:?} to stop the node; log:\n{log}"
    );
    for (unclean, what) in [
        ("cut off", "calls were cut off at the drain timeout"),
        (
            "still in use",
            "a storage shard was still in use at shutdown",
        ),
    ] {
        assert!(!log.contains(unclean), "{what}; log:\n{log}");
    }
}

#[test]
fn counters_are_read_by_exact_name() {
    let page = "# HELP x\ntributary_storage_replayed_batches_total 7\nother_total 1\n";
    assert_eq!(
        counter(page, "tributary_storage_replayed_batches_total"),
        Some(7)
    );
    assert_eq!(counter(page, "tributary_storage_replayed"), None);
}
