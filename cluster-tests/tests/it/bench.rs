//! `tributary bench` against a real node: sends succeed and share fsyncs (group commit).

use std::time::Duration;

use serde_json::Value;
use tributary_client::Client;
use tributary_cluster_tests::{
    NodeProcess, TestDir, cli_ok, describe_output, output_within, tributary_command,
};

#[tokio::test]
async fn bench_shows_group_commit() {
    let dir = TestDir::new("bench_shows_group_commit");
    let node = NodeProcess::start(&dir.path().join("node")).await;
    let stdout = cli_ok(
        &node.endpoint(),
        &[
            "bench",
            "--partitions",
            "16",
            "--producers",
            "64",
            "--duration",
            "3s",
            "--metrics-url",
            &node.metrics_url(),
            "--output",
            "json",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("bench --output json prints one JSON object ({e}): {stdout}"));
    eprintln!("bench report: {report}");

    let number = |field: &str| {
        report[field]
            .as_f64()
            .unwrap_or_else(|| panic!("'{field}' is a number: {report}"))
    };
    assert!(number("events_sent") > 0.0, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    let sends_per_second = number("sends_per_second");
    let fsyncs_per_second = number("fsyncs_per_second");
    assert!(
        fsyncs_per_second > 0.0,
        "acknowledged sends were fsynced: {report}"
    );
    assert!(
        sends_per_second >= 2.0 * fsyncs_per_second,
        "group commit: 64 concurrent producers share fsyncs, so sends/s ({sends_per_second:.0}) \
         is at least twice fsyncs/s ({fsyncs_per_second:.0}): {report}"
    );
    // The node's own CPU and memory, from its process metrics.
    let node_usage = &report["nodes"][0];
    assert!(
        node_usage["cpu_percent"]
            .as_f64()
            .is_some_and(|cpu| cpu > 0.0)
            && node_usage["resident_mib"]
                .as_f64()
                .is_some_and(|mib| mib > 1.0),
        "the node's CPU and memory are reported: {report}"
    );
    let sends_per_fsync = number("sends_per_fsync");
    assert!(
        (sends_per_fsync - sends_per_second / fsyncs_per_second).abs() < 1e-6 * sends_per_fsync,
        "sends_per_fsync is sends/s ÷ fsyncs/s: {report}"
    );

    // The bench deletes the scratch hub it created.
    let client = Client::connect(&node.endpoint()).await.unwrap();
    let hubs = client.list_event_hubs().await.unwrap();
    assert!(hubs.is_empty(), "the bench's hub is gone: {hubs:?}");

    // At a fixed rate, with keyed sends and consumers: the schedule bounds what is sent,
    // every event sent is delivered and timed end to end, and a CSV row is appended.
    let csv = dir.path().join("runs.csv");
    let stdout = cli_ok(
        &node.endpoint(),
        &[
            "bench",
            "--partitions",
            "4",
            "--replication-factor",
            "1",
            "--producers",
            "4",
            "--rate",
            "200",
            "--duration",
            "2s",
            "--key-distribution",
            "random-key",
            "--consumers",
            "2",
            "--csv",
            csv.to_str().unwrap(),
            "--output",
            "json",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("bench --output json prints one JSON object ({e}): {stdout}"));
    eprintln!("bench report at a rate: {report}");
    let sent = report["events_sent"].as_u64().unwrap();
    // 4 producers, each one send every 20 ms for 2 s: at most 400 (one more each at the
    // start of its schedule).
    assert!(
        sent > 0 && sent <= 404,
        "the rate bounds the sends: {report}"
    );
    assert_eq!(report["events_received"], sent, "{report}");
    assert_eq!(report["replication_factor"], 1, "{report}");
    assert_eq!(report["key_distribution"], "random-key", "{report}");
    assert_eq!(report["target_events_per_second"], 200.0, "{report}");
    let e2e = &report["end_to_end_latency_ms"];
    assert!(
        e2e["p50"].as_f64().unwrap() > 0.0
            && e2e["p99"].as_f64().unwrap() >= e2e["p50"].as_f64().unwrap(),
        "end-to-end latency is measured: {report}"
    );
    let rows = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = rows.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one row: {rows}");
    assert!(
        lines[0].starts_with("hub,partitions,replication_factor"),
        "{rows}"
    );

    // Pipelined: each producer publishes events one by one, keeping up to 64 unacknowledged
    // (the SDK's buffered producer batches them); every event is delivered and timed.
    let stdout = cli_ok(
        &node.endpoint(),
        &[
            "bench",
            "--partitions",
            "2",
            "--replication-factor",
            "1",
            "--producers",
            "4",
            "--in-flight",
            "64",
            "--duration",
            "2s",
            "--consumers",
            "1",
            "--output",
            "json",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("bench --output json prints one JSON object ({e}): {stdout}"));
    eprintln!("pipelined bench report: {report}");
    let sent = report["events_sent"].as_u64().unwrap();
    assert!(sent > 0, "{report}");
    assert_eq!(report["errors"], 0, "{report}");
    assert_eq!(report["in_flight"], 64, "{report}");
    assert_eq!(report["events_received"], sent, "{report}");
    let output = tributary_cluster_tests::cli(
        &node.endpoint(),
        &["bench", "--in-flight", "8", "--batch-size", "2"],
    )
    .await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--in-flight 8") && stderr.contains("--batch-size"),
        "{stderr}"
    );

    // Consumers need room for the send time in each body: a clear error, nothing sent.
    let output = tributary_cluster_tests::cli(
        &node.endpoint(),
        &[
            "bench",
            "--consumers",
            "1",
            "--event-size",
            "4",
            "--duration",
            "1s",
        ],
    )
    .await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--event-size 8 or more"), "{stderr}");

    // Idle partitions: every one gets a leader, the node's idle CPU and memory are
    // reported, and the hub is gone afterwards.
    let stdout = cli_ok(
        &node.endpoint(),
        &[
            "bench",
            "idle",
            "--partitions",
            "20",
            "--settle",
            "0s",
            "--measure",
            "1s",
            "--metrics-url",
            &node.metrics_url(),
            "--output",
            "json",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("bench idle --output json prints one JSON object ({e}): {stdout}")
    });
    eprintln!("bench idle report: {report}");
    assert!(
        report["all_led_seconds"].as_f64().unwrap() > 0.0,
        "{report}"
    );
    assert_eq!(report["replicas_per_node"][0][1], 20, "{report}");
    assert!(
        report["nodes"][0]["resident_mib"].as_f64().unwrap() > 1.0
            && report["nodes"][0]["cpu_percent"].as_f64().is_some(),
        "{report}"
    );
    let hubs = client.list_event_hubs().await.unwrap();
    assert!(hubs.is_empty(), "the idle bench's hub is gone: {hubs:?}");
}

/// `tributary bench checkpoints` on a small scale: every phase reports, the backlog is
/// drained, the processors checkpointed and rebalanced.
#[tokio::test]
async fn bench_checkpoints_reports_every_phase() {
    let dir = TestDir::new("bench_checkpoints");
    let node = NodeProcess::start(&dir.path().join("node")).await;
    let stdout = cli_ok(
        &node.endpoint(),
        &[
            "bench",
            "checkpoints",
            "--partitions",
            "8",
            "--processors",
            "2",
            "--checkpoint-every",
            "10",
            "--events-per-partition",
            "50",
            "--duration",
            "1s",
            "--load-balancing-interval",
            "500ms",
            "--output",
            "json",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("one JSON object ({e}): {stdout}"));
    eprintln!("bench checkpoints report: {report}");
    let number = |field: &str| {
        report[field]
            .as_f64()
            .unwrap_or_else(|| panic!("'{field}' is a number: {report}"))
    };
    assert!(number("store_checkpoints_per_second") > 0.0, "{report}");
    let latency = &report["store_latency_ms"];
    let p50 = latency["p50"].as_f64().unwrap();
    assert!(
        p50 > 0.0 && p50 <= latency["max"].as_f64().unwrap(),
        "store latency is measured: {report}"
    );
    assert_eq!(number("events_processed"), 8.0 * 50.0, "{report}");
    // 50 events per partition, a checkpoint every 10: processors checkpoint (usually once
    // per partition; fewer succeed when a partition changes owner while its backlog drains:
    // the old owner's checkpoint is then refused, and the new one reads the events again).
    assert!(number("processor_checkpoints") >= 1.0, "{report}");
    assert!(number("events_delivered") >= 8.0 * 50.0, "{report}");
    assert!(
        number("balanced_seconds") > 0.0 && number("takeover_seconds") > 0.0,
        "{report}"
    );
    let client = Client::connect(&node.endpoint()).await.unwrap();
    let hubs = client.list_event_hubs().await.unwrap();
    assert!(hubs.is_empty(), "the bench's hub is gone: {hubs:?}");
}

/// The quick soak takes about 30 s.
const BENCH_RETENTION_TIMEOUT: Duration = Duration::from_secs(120);

/// `tributary bench retention` on a small scale: its own one-node cluster, a hub with a 4 s
/// retention under a steady load for 28 s. The curve is sampled, the disk use stays flat
/// once the first events have expired, and it stays far below what was sent: retention
/// removed the expired events and returned their space.
#[tokio::test]
async fn bench_retention_shows_flat_disk_use() {
    let dir = TestDir::new("bench_retention");
    let mut command = tributary_command();
    command
        .args([
            "bench",
            "retention",
            "--retention",
            "4s",
            "--retention-interval",
            "200ms",
            "--segment-bytes",
            "262144",
            "--duration",
            "28s",
            "--sample-interval",
            "2s",
            "--rate",
            "300",
            "--event-bytes",
            "1024",
            "--partitions",
            "1",
            "--nodes",
            "1",
            "--output",
            "json",
            "--dir",
        ])
        .arg(dir.path());
    let output = output_within(command, BENCH_RETENTION_TIMEOUT).await;
    let described = describe_output(&output);
    eprintln!("bench retention: {described}");
    assert!(
        output.status.success(),
        "bench retention failed: {described}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("bench retention --output json prints one JSON object ({e}): {described}")
    });

    // A sample every 2 s and one at the end, each with the node's disk use; from 4.4 s on
    // (the retention and two retention intervals) they are the steady state.
    let samples = report["samples"].as_array().expect("a curve of samples");
    assert_eq!(samples.len(), 15, "{report}");
    for sample in samples {
        assert_eq!(
            sample["disk_bytes"].as_array().unwrap().len(),
            1,
            "{report}"
        );
    }
    let steady_from = report["steady_state_from_seconds"].as_f64().unwrap();
    assert!((steady_from - 4.4).abs() < 1e-9, "{report}");
    assert!(report["steady_samples"].as_u64().unwrap() >= 10, "{report}");
    assert_eq!(report["flat"], true, "{report}");
    assert!(
        report["verdict"].as_str().unwrap().starts_with("flat: "),
        "{report}"
    );

    // Most of what was sent is gone from the disk.
    let bytes_sent = report["bytes_sent"].as_u64().unwrap();
    let events_sent = report["events_sent"].as_u64().unwrap();
    assert!(
        events_sent > 300 * 28 / 2,
        "the load ran at a good part of its rate: {report}"
    );
    let steady_peak = report["total_flatness"]["last_third_max_bytes"]
        .as_u64()
        .unwrap();
    assert!(
        steady_peak > 0 && steady_peak < bytes_sent / 2,
        "retention removed the expired events: the disk peaks at {steady_peak} bytes in the \
         steady state, {bytes_sent} bytes were sent: {report}"
    );
}
