//! The CLI from the README's first five minutes, against a real node, across a restart.

use std::time::{Duration, SystemTime};

use serde_json::Value;
use tributary_cluster_tests::{NodeProcess, TestDir, cli, cli_ok, describe_output};

/// How far the enqueued time of a fresh event may be from this machine's clock.
const CLOCK_SLACK: Duration = Duration::from_secs(300);

#[tokio::test]
async fn cli_end_to_end() {
    let dir = TestDir::new("cli_end_to_end");
    let mut node = NodeProcess::start(&dir.path().join("node")).await;
    let endpoint = node.endpoint();
    let endpoint = endpoint.as_str();

    let created = cli_ok(endpoint, &["hub", "create", "orders", "--partitions", "4"]).await;
    assert!(created.contains("created event hub 'orders'"), "{created}");

    // Key "a" hashes to partition 0 of 4 with Event Hubs' lookup3 hash.
    let sent = json(
        &cli_ok(
            endpoint,
            &[
                "send",
                "orders",
                "--body",
                "hello",
                "--partition-key",
                "a",
                "--output",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(sent["partition"], "0", "{sent}");
    assert_eq!(sent["sequence_number"], 0, "{sent}");
    assert_eq!(sent["offset"], "0", "{sent}");

    let bulk = json(
        &cli_ok(
            endpoint,
            &[
                "send",
                "orders",
                "--count",
                "200",
                "--size",
                "64",
                "--batch-size",
                "20",
                "--output",
                "json",
            ],
        )
        .await,
    );
    assert_eq!(bulk["events"], 200, "{bulk}");
    assert_eq!(bulk["batches"], 10, "{bulk}");

    let shown = json(&cli_ok(endpoint, &["hub", "show", "orders", "--output", "json"]).await);
    assert_eq!(shown["name"], "orders", "{shown}");
    assert_eq!(shown["partition_count"], 4, "{shown}");
    assert_eq!(event_count(&shown), 201, "{shown}");

    let received = cli_ok(
        endpoint,
        &[
            "receive",
            "orders",
            "--partition",
            "0",
            "--count",
            "1",
            "--output",
            "json",
        ],
    )
    .await;
    let lines: Vec<&str> = received.lines().collect();
    assert_eq!(lines.len(), 1, "one event, one line: {received}");
    let event = json(lines[0]);
    assert_eq!(event["body"], "hello", "{event}");
    assert_eq!(event["sequence_number"], 0, "{event}");
    assert_eq!(event["offset"], "0", "{event}");
    assert_eq!(event["partition_key"], "a", "{event}");
    assert_eq!(event["partition"], "0", "{event}");
    assert_eq!(
        event["enqueued_time"], sent["enqueued_time"],
        "{event} vs {sent}"
    );
    assert_recent_rfc3339(&event["enqueued_time"]);

    let listed = cli_ok(endpoint, &["hub", "list"]).await;
    assert!(
        listed.lines().any(|line| {
            let cells: Vec<&str> = line.split_whitespace().collect();
            cells.first() == Some(&"orders") && cells.get(1) == Some(&"4")
        }),
        "hub list shows orders with 4 partitions:\n{listed}"
    );

    let group = cli_ok(endpoint, &["group", "create", "orders", "g1"]).await;
    assert!(group.contains("'g1'"), "{group}");
    assert_eq!(group_names(endpoint).await, ["$Default", "g1"]);

    // A clean stop keeps everything: hubs, events and groups.
    let status = node.terminate().await;
    assert_eq!(
        status.code(),
        Some(0),
        "SIGTERM must stop the node cleanly: {status}"
    );
    node.restart().await;
    let endpoint = node.endpoint();
    let endpoint = endpoint.as_str();
    let shown_again = json(&cli_ok(endpoint, &["hub", "show", "orders", "--output", "json"]).await);
    assert_eq!(shown_again, shown, "hub and partitions after the restart");
    let received_again = cli_ok(
        endpoint,
        &[
            "receive",
            "orders",
            "--partition",
            "0",
            "--count",
            "1",
            "--output",
            "json",
        ],
    )
    .await;
    assert_eq!(
        received_again, received,
        "the first event after the restart"
    );
    assert_eq!(group_names(endpoint).await, ["$Default", "g1"]);

    let deleted = cli_ok(endpoint, &["hub", "delete", "orders"]).await;
    assert!(deleted.contains("deleted event hub 'orders'"), "{deleted}");
    assert_hub_missing(endpoint).await;

    // Deleted stays deleted across a restart.
    let status = node.terminate().await;
    assert_eq!(status.code(), Some(0), "{status}");
    node.restart().await;
    assert_hub_missing(&node.endpoint()).await;
    let hubs = json(&cli_ok(&node.endpoint(), &["hub", "list", "--output", "json"]).await);
    assert_eq!(
        hubs,
        serde_json::json!([]),
        "no hubs after deleting the only one"
    );
}

fn json(text: &str) -> Value {
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// Events in a hub, from `hub show --output json`: the sum of (last sequence number + 1).
fn event_count(shown: &Value) -> i64 {
    let partitions = shown["partitions"].as_array().expect("partitions array");
    assert_eq!(partitions.len(), 4, "{shown}");
    partitions
        .iter()
        .map(|p| {
            p["last_enqueued_sequence_number"]
                .as_i64()
                .expect("numeric last sequence number")
                + 1
        })
        .sum()
}

async fn group_names(endpoint: &str) -> Vec<String> {
    let groups = json(&cli_ok(endpoint, &["group", "list", "orders", "--output", "json"]).await);
    groups
        .as_array()
        .expect("group list is an array")
        .iter()
        .map(|g| g["name"].as_str().expect("group name").to_owned())
        .collect()
}

async fn assert_hub_missing(endpoint: &str) {
    let output = cli(endpoint, &["hub", "show", "orders"]).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    let stderr = String::from_utf8_lossy(&output.stderr).to_lowercase();
    assert!(
        stderr.contains("'orders'") && (stderr.contains("not found") || stderr.contains("exist")),
        "the error says the hub does not exist: {}",
        describe_output(&output)
    );
}

fn assert_recent_rfc3339(value: &Value) {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("time is a string: {value}"));
    let time =
        humantime::parse_rfc3339(text).unwrap_or_else(|e| panic!("'{text}' is not RFC 3339: {e}"));
    let now = SystemTime::now();
    let distance = now
        .duration_since(time)
        .or_else(|_| time.duration_since(now))
        .unwrap_or_default();
    assert!(distance < CLOCK_SLACK, "'{text}' is far from now");
}
