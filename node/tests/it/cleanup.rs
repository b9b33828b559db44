//! Cleanup policies on a node whose clock the test steps: a compacted hub keeps each key's
//! latest event (tombstones until their retention), with the numbers the events were sent
//! with; a size cap removes the oldest events.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use tributary_client::{
    CleanupPolicy, EventData, EventPosition, HubOptions, ReceivedEvent, SendTarget,
};
use tributary_cluster_tests::eventually;

use crate::support::TestNode;

const WAIT: Duration = Duration::from_secs(30);

/// A node that runs retention passes often and allows short retentions.
async fn node() -> TestNode {
    TestNode::start_with(|config| {
        config.retention.interval = Duration::from_millis(100);
        config.retention.min = Duration::from_secs(1);
    })
    .await
}

/// Every event of partition 0 from the earliest, read until the partition's last one.
async fn read_all(node: &TestNode, hub: &str) -> Vec<ReceivedEvent> {
    let last = node
        .client
        .get_partition_properties(hub, "0")
        .await
        .unwrap()
        .last_enqueued_sequence_number;
    let mut stream = node
        .client
        .consumer()
        .receive(hub, "", "0", EventPosition::Earliest, 0)
        .await
        .unwrap();
    let mut out: Vec<ReceivedEvent> = Vec::new();
    while out.last().is_none_or(|e| e.sequence_number < last) {
        let batch = tokio::time::timeout(WAIT, stream.next())
            .await
            .expect("events arrive")
            .expect("stream open")
            .unwrap();
        out.extend(batch);
    }
    out
}

/// What was sent: sequence number → (key, body, offset).
type Sent = BTreeMap<i64, (Option<String>, String, String)>;

async fn send(node: &TestNode, hub: &str, key: Option<&str>, bodies: &[&str], sent: &mut Sent) {
    let target = match key {
        Some(key) => SendTarget::PartitionKey(key.to_string()),
        None => SendTarget::PartitionId("0".into()),
    };
    let response = node
        .client
        .producer()
        .send(
            hub,
            target,
            bodies.iter().map(|b| EventData::from_body(b.to_string())),
        )
        .await
        .unwrap();
    assert_eq!(response.partition_id, "0");
    for (i, body) in bodies.iter().enumerate() {
        sent.insert(
            response.first_sequence_number + i as i64,
            (
                key.map(str::to_string),
                body.to_string(),
                response.offsets[i].clone(),
            ),
        );
    }
}

/// The model: keyless events, and each key's last event unless it is a tombstone that
/// `tombstones_expired` says has gone.
fn expected(sent: &Sent, tombstones_expired: bool) -> Sent {
    let mut latest: BTreeMap<&str, i64> = BTreeMap::new();
    for (sequence, (key, _, _)) in sent {
        if let Some(key) = key {
            latest.insert(key, *sequence);
        }
    }
    sent.iter()
        .filter(|(sequence, (key, body, _))| match key {
            None => true,
            Some(key) => {
                latest[key.as_str()] == **sequence && !(body.is_empty() && tombstones_expired)
            }
        })
        .map(|(s, v)| (*s, v.clone()))
        .collect()
}

fn as_sent(events: &[ReceivedEvent]) -> Sent {
    events
        .iter()
        .map(|e| {
            (
                e.sequence_number,
                (
                    e.partition_key.clone(),
                    String::from_utf8(e.body.to_vec()).unwrap(),
                    e.offset.clone(),
                ),
            )
        })
        .collect()
}

/// Waits until reading the hub gives exactly `want`.
async fn await_contents(node: &TestNode, hub: &str, want: &Sent, what: &str) {
    eventually(WAIT, what, async || {
        let got = as_sent(&read_all(node, hub).await);
        if &got == want {
            Ok(())
        } else {
            Err(format!("read {got:?}, expected {want:?}"))
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_hub_keeps_each_keys_latest_event_with_its_numbers() {
    let mut node = node().await;
    node.client
        .create_event_hub_with_options(
            "latest",
            1,
            &HubOptions {
                cleanup_policy: Some(CleanupPolicy::Compact),
                compaction_lag: Some(Duration::from_secs(10)),
                tombstone_retention: Some(Duration::from_secs(60)),
                ..HubOptions::default()
            },
        )
        .await
        .unwrap();
    let mut sent = Sent::new();
    for round in 0..4 {
        for key in ["a", "b", "c", "d"] {
            let bodies: Vec<String> = (0..3).map(|i| format!("{key}-{round}-{i}")).collect();
            let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
            send(&node, "latest", Some(key), &bodies, &mut sent).await;
        }
        send(
            &node,
            "latest",
            None,
            &[&format!("keyless-{round}")],
            &mut sent,
        )
        .await;
    }
    // "c" ends with a tombstone; "d" is updated once more after the lag below.
    send(&node, "latest", Some("c"), &[""], &mut sent).await;
    send(&node, "latest", None, &["keyless-last"], &mut sent).await;
    let everything = sent.clone();

    // Within the lag nothing goes.
    node.clock.advance_ms(5_000);
    let got = as_sent(&read_all(&node, "latest").await);
    assert_eq!(got, everything, "nothing is compacted within the lag");

    // Past the lag: each key's latest event stays, with the numbers it was sent with.
    node.clock.advance_ms(6_000);
    send(&node, "latest", Some("d"), &["d-new"], &mut sent).await;
    // The new "d" is within the lag: it supersedes nothing yet.
    let mut want = expected(&everything, false);
    want.extend(
        sent.iter()
            .filter(|(s, _)| !everything.contains_key(s))
            .map(|(s, v)| (*s, v.clone())),
    );
    await_contents(&node, "latest", &want, "compacted past the lag").await;

    // Past the tombstone retention the tombstone goes too, and the old "d" with it.
    node.clock.advance_ms(61_000);
    let want = expected(&sent, true);
    await_contents(&node, "latest", &want, "tombstone past its retention").await;

    // Compaction is durable: the same after a restart.
    node.restart().await;
    let got = as_sent(&read_all(&node, "latest").await);
    assert_eq!(got, want, "after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_size_cap_removes_the_oldest_events() {
    const CAP: u64 = 64 * 1024;
    let node = node().await;
    node.client
        .create_event_hub_with_options(
            "capped",
            1,
            &HubOptions {
                retention_bytes_max: Some(CAP),
                ..HubOptions::default()
            },
        )
        .await
        .unwrap();
    let body = "x".repeat(4096);
    let mut sent = Sent::new();
    for _ in 0..64 {
        send(&node, "capped", None, &[&body], &mut sent).await;
    }
    // 256 KiB sent: the partition keeps what fits in the cap, the newest events (removal
    // may take more than one pass).
    let events = eventually(WAIT, format!("at most {CAP} bytes retained"), async || {
        let events = read_all(&node, "capped").await;
        let retained: u64 = events.iter().map(|e| e.body.len() as u64).sum();
        if retained <= CAP {
            Ok(events)
        } else {
            Err(format!("{retained} bytes still retained"))
        }
    })
    .await;
    let begin = node
        .client
        .get_partition_properties("capped", "0")
        .await
        .unwrap()
        .begin_sequence_number;
    assert_eq!(events[0].sequence_number, begin);
    assert_eq!(events.last().unwrap().sequence_number, 63);
    let retained: u64 = events.iter().map(|e| e.body.len() as u64).sum();
    assert!(
        retained + 2 * 4096 > CAP,
        "{retained} bytes retained: more removed than the cap needs"
    );
}

/// A counter or gauge from the node's `/metrics` (0 when absent).
async fn metric(node: &TestNode, name: &str) -> f64 {
    let addr = node.node.as_ref().unwrap().http_addr;
    let body = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    body.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.split_whitespace().last())
        .map_or(0.0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_not_captured_yet_outlive_their_retention() {
    let node = node().await;
    let dir = tempfile::tempdir().unwrap();
    // The destination cannot be created while a file stands where its parent should be.
    let blocker = dir.path().join("blocker");
    std::fs::write(&blocker, b"not a directory").unwrap();
    let destination = format!("file://{}/capture", blocker.display());
    node.client
        .create_event_hub_with_options(
            "archived",
            1,
            &HubOptions {
                retention: Some(Duration::from_secs(1)),
                capture: Some(tributary_client::CaptureOptions {
                    destination: destination.clone(),
                    window: Some(Duration::from_secs(1)),
                    window_bytes: None,
                    namespace: Some("ns".into()),
                }),
                ..HubOptions::default()
            },
        )
        .await
        .unwrap();
    let mut sent = Sent::new();
    let bodies: Vec<String> = (0..10).map(|i| format!("event-{i}")).collect();
    let bodies: Vec<&str> = bodies.iter().map(String::as_str).collect();
    send(&node, "archived", None, &bodies, &mut sent).await;
    // Well past the retention and the capture window.
    node.clock.advance_ms(10_000);

    // Capture keeps failing; retention passes run; nothing is removed.
    eventually(
        WAIT,
        "capture tried to write three times",
        async || match metric(&node, "tributary_capture_errors_total").await {
            errors if errors >= 3.0 => Ok(()),
            errors => Err(format!("{errors} capture errors")),
        },
    )
    .await;
    let passes = metric(&node, "tributary_storage_data_bytes").await;
    assert!(passes > 0.0, "a retention pass has run");
    let props = node
        .client
        .get_partition_properties("archived", "0")
        .await
        .unwrap();
    assert_eq!(
        props.begin_sequence_number, 0,
        "uncaptured events were removed"
    );
    assert_eq!(props.capture_next_sequence_number, 0);

    // The destination recovers: capture back-fills, then retention removes the events.
    std::fs::remove_file(&blocker).unwrap();
    eventually(WAIT, "every event captured, then removed", async || {
        let props = node
            .client
            .get_partition_properties("archived", "0")
            .await
            .unwrap();
        if props.capture_next_sequence_number == 10 && props.begin_sequence_number == 10 {
            Ok(())
        } else {
            Err(format!(
                "captured through {}, begin {}",
                props.capture_next_sequence_number, props.begin_sequence_number
            ))
        }
    })
    .await;
    let files: Vec<_> = walk(&blocker);
    assert_eq!(files.len(), 1, "{files:?}");
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&entry.path()));
        } else {
            out.push(entry.path());
        }
    }
    out
}
