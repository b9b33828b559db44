//! Prometheus's own tools against what we expose: `promtool check metrics` on a live node's
//! `/metrics`, `promtool` on the alert rules and their unit tests, and a real `prometheus`
//! server that scrapes a three-node cluster, with our rules loaded, and sees a stopped node's
//! partitions counted as under-replicated.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::AsyncWriteExt;
use tributary_client::{CheckpointStore, Client, EventData, EventPosition, SendTarget};
use tributary_cluster_tests::prometheus_tools::{PrometheusServer, prometheus_tools};
use tributary_cluster_tests::{
    LocalCluster, NodeProcess, TestDir, describe_output, eventually, http_get, output_within,
    poll_until, workspace_dir,
};

/// Longest a series or a query result may take to appear.
const METRICS_TIMEOUT: Duration = Duration::from_secs(60);
const PROMTOOL_TIMEOUT: Duration = Duration::from_secs(60);

/// Series that must be in the exposition once the node has seen traffic: per-hub labels,
/// histograms with buckets, per-partition Raft gauges, controller and consumer gauges.
const EXPECTED_SERIES: &[&str] = &[
    "tributary_events_in_total{hub=\"metered\"}",
    "tributary_bytes_out_total{hub=\"metered\"}",
    "tributary_send_duration_seconds_bucket{hub=\"metered\",le=",
    "tributary_receive_duration_seconds_bucket{hub=\"metered\",le=",
    "tributary_storage_commit_batch_writes_bucket{le=",
    "tributary_raft_leader{hub=\"metered\",partition=\"0\"} 1",
    "tributary_raft_term{hub=\"metered\",partition=\"0\"}",
    "tributary_controller_leader 1",
    "tributary_partitions_under_replicated 0",
    "tributary_nodes_up 1",
    "tributary_consumer_group_checkpoint_sequence{hub=\"metered\",consumer_group=\"$Default\",partition=\"0\"} 2",
    "tributary_build_info{version=",
    "# HELP tributary_partitions_under_replicated ",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn promtool_accepts_a_live_nodes_metrics() {
    let Some((promtool, _)) = prometheus_tools() else {
        return;
    };
    let dir = TestDir::new("promtool-metrics");
    let node = NodeProcess::start(&dir.path().join("n1")).await;
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client.create_event_hub("metered", 1, None).await.unwrap();
    let events: Vec<EventData> = (0..3)
        .map(|i| EventData::from_body(format!("e{i}")))
        .collect();
    client
        .producer()
        .send("metered", SendTarget::PartitionId("0".into()), events)
        .await
        .unwrap();
    let mut stream = client
        .consumer()
        .receive("metered", "$Default", "0", EventPosition::Earliest, 0)
        .await
        .unwrap();
    let batch = tokio::time::timeout(METRICS_TIMEOUT, stream.next())
        .await
        .expect("events arrive")
        .expect("stream open")
        .unwrap();
    assert!(!batch.is_empty());
    client
        .checkpoint_store()
        .update_checkpoint("metered", "$Default", "0", 2, 2, None)
        .await
        .unwrap();

    let body = metrics_with(&node, EXPECTED_SERIES).await;
    let mut check = tokio::process::Command::new(&promtool);
    check
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = check.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(body.as_bytes()).await.unwrap();
    drop(stdin);
    let output = tokio::time::timeout(PROMTOOL_TIMEOUT, child.wait_with_output())
        .await
        .expect("promtool check metrics finishes")
        .unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics refused the exposition: {}",
        describe_output(&output)
    );
}

/// The node's `/metrics` once it holds every one of `expected` (polled with a deadline:
/// some gauges are sampled every few seconds).
async fn metrics_with(node: &NodeProcess, expected: &[&str]) -> String {
    let what = format!("/metrics with {expected:?}");
    eventually(METRICS_TIMEOUT, what, async || {
        let body = http_get(node.http_addr(), "/metrics").await.unwrap().body;
        let missing: Vec<&&str> = expected.iter().filter(|s| !body.contains(**s)).collect();
        if missing.is_empty() {
            Ok(body)
        } else {
            Err(format!("lacking {missing:?}:\n{body}"))
        }
    })
    .await
}

fn rules_dir() -> std::path::PathBuf {
    workspace_dir().join("deploy/prometheus")
}

async fn promtool(promtool: &Path, args: &[&str]) {
    let mut command = tokio::process::Command::new(promtool);
    command.args(args).current_dir(rules_dir());
    let output = output_within(command, PROMTOOL_TIMEOUT).await;
    assert!(
        output.status.success(),
        "promtool {args:?} failed: {}",
        describe_output(&output)
    );
}

#[tokio::test]
async fn alert_rules_are_valid_and_their_unit_tests_pass() {
    let Some((path, _)) = prometheus_tools() else {
        return;
    };
    promtool(&path, &["check", "rules", "tributary-alerts.yml"]).await;
    promtool(&path, &["test", "rules", "tributary-alerts.test.yml"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_consumer_lag_and_under_replication_when_a_node_stops() {
    let Some((_, prometheus)) = prometheus_tools() else {
        return;
    };
    let dir = TestDir::new("prometheus-scrape");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("scraped", 3, None, Some(3))
        .await
        .unwrap();
    let targets: Vec<String> = cluster
        .nodes
        .iter()
        .map(|n| n.http_addr().to_string())
        .collect();
    let rules = rules_dir().join("tributary-alerts.yml");
    let server = PrometheusServer::start(
        &prometheus,
        &dir.path().join("prometheus"),
        &targets,
        &[rules],
    )
    .await;

    // The consumer-lag recording rule joins the real series: 5 events, checkpointed at 1.
    let events: Vec<EventData> = (0..5)
        .map(|i| EventData::from_body(format!("e{i}")))
        .collect();
    client
        .producer()
        .send("scraped", SendTarget::PartitionId("0".into()), events)
        .await
        .unwrap();
    client
        .checkpoint_store()
        .update_checkpoint("scraped", "$Default", "0", 1, 1, None)
        .await
        .unwrap();
    wait_for_query(
        &server,
        "tributary:consumer_group_lag_events{hub=\"scraped\",consumer_group=\"$Default\",partition=\"0\"}",
        |v| v == 3.0,
    )
    .await;

    let under_replicated = "sum(tributary_partitions_under_replicated)";
    // All three nodes scraped, the controller leader among them, and nothing missing.
    wait_for_query(&server, "sum(up{job=\"tributary\"})", |v| v == 3.0).await;
    wait_for_query(&server, "sum(tributary_controller_leader)", |v| v == 1.0).await;
    wait_for_query(
        &server,
        "sum(tributary_raft_leader{hub=\"scraped\"})",
        |v| v == 3.0,
    )
    .await;
    wait_for_query(&server, under_replicated, |v| v == 0.0).await;

    // Stop a node that is not the controller leader, so the count keeps its reporter.
    let leader = client.cluster_status().await.unwrap().controller_leader as usize;
    let victim = (0..3).find(|i| i + 1 != leader).unwrap();
    cluster.nodes[victim].terminate().await;
    wait_for_query(&server, under_replicated, |v| v > 0.0).await;
    wait_for_query(&server, "sum(up{job=\"tributary\"})", |v| v == 2.0).await;
    // The node-down alert, loaded from our rules, is pending for the stopped node (it fires
    // after a minute).
    let stopped = &targets[victim];
    wait_for_query(
        &server,
        &format!("ALERTS{{alertname=\"TributaryNodeDown\",instance=\"{stopped}\"}}"),
        |v| v == 1.0,
    )
    .await;
}

/// Polls an instant query until its single value satisfies `wanted`; panics with the last
/// answer at the deadline.
async fn wait_for_query(server: &PrometheusServer, promql: &str, wanted: impl Fn(f64) -> bool) {
    let answered = poll_until(METRICS_TIMEOUT, async || {
        let answer = server.query(promql).await;
        match answer.as_deref() {
            Ok([value]) if wanted(*value) => Ok(()),
            _ => Err(format!("{answer:?}")),
        }
    })
    .await;
    if let Err(timed_out) = answered {
        panic!(
            "{promql} at the wanted value: {timed_out}\nprometheus log:\n{}",
            server.log()
        );
    }
}
