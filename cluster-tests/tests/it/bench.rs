//! `tributary bench` against a real node: sends succeed and share fsyncs (group commit).

use serde_json::Value;
use tributary_client::Client;
use tributary_cluster_tests::{NodeProcess, TestDir, cli_ok};

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
    let sends_per_fsync = number("sends_per_fsync");
    assert!(
        (sends_per_fsync - sends_per_second / fsyncs_per_second).abs() < 1e-6 * sends_per_fsync,
        "sends_per_fsync is sends/s ÷ fsyncs/s: {report}"
    );

    // The bench deletes the scratch hub it created.
    let client = Client::connect(&node.endpoint()).await.unwrap();
    let hubs = client.list_event_hubs().await.unwrap();
    assert!(hubs.is_empty(), "the bench's hub is gone: {hubs:?}");
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
    // 50 events per partition, a checkpoint every 10: at least one per partition.
    assert!(number("processor_checkpoints") >= 8.0, "{report}");
    assert!(
        number("balanced_seconds") > 0.0 && number("takeover_seconds") > 0.0,
        "{report}"
    );
    let client = Client::connect(&node.endpoint()).await.unwrap();
    let hubs = client.list_event_hubs().await.unwrap();
    assert!(hubs.is_empty(), "the bench's hub is gone: {hubs:?}");
}
