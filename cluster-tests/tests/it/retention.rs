//! Retention on a three-node cluster: events past the hub's retention leave every replica,
//! the begin sequence number moves, readers positioned before it start at the first retained
//! event, a replica killed after removing entries restarts with the same beginning, a wiped
//! replica is rebuilt from what is retained, and the data directories shrink on disk.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tributary_client::{Client, EventData, EventPosition, HubChanges, SendTarget};
use tributary_cluster_tests::{LocalCluster, TestDir, eventually, http_get};

const HUB: &str = "expiring";
/// Events sent before retention is shortened: 4,000 of 2 KiB, about 8 MiB per replica.
const OLD_BATCHES: usize = 400;
const PER_BATCH: usize = 10;
const OLD_EVENTS: i64 = (OLD_BATCHES * PER_BATCH) as i64;
const BODY_BYTES: usize = 2048;
const TIMEOUT: Duration = Duration::from_secs(90);

/// Bytes the files under `dir` take on disk.
fn disk_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += disk_bytes(&entry.path());
        } else {
            total += meta.blocks() * 512;
        }
    }
    total
}

async fn send_batch(client: &Client, tag: &str, batch: usize) {
    let events: Vec<EventData> = (0..PER_BATCH)
        .map(|i| {
            let mut body = format!("{tag}-{batch}-{i}-").into_bytes();
            body.resize(BODY_BYTES, b'.');
            EventData::from_body(body)
        })
        .collect();
    client
        .producer()
        .send(HUB, SendTarget::PartitionId("0".into()), events)
        .await
        .unwrap_or_else(|e| panic!("send {tag} {batch} failed: {e}"));
}

/// Each node's replica: (begin sequence number, first listed sequence number).
async fn replica_heads(endpoints: &[String]) -> Vec<Option<(i64, Option<i64>)>> {
    let mut heads = Vec::new();
    for endpoint in endpoints {
        let head = match Client::connect(endpoint).await {
            Ok(client) => client
                .replica_events_page(HUB, "0", 0, 1)
                .await
                .ok()
                .map(|page| {
                    (
                        page.begin_sequence_number,
                        page.events.first().map(|e| e.sequence_number),
                    )
                }),
            Err(_) => None,
        };
        heads.push(head);
    }
    heads
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_past_retention_leave_every_replica_and_the_disk() {
    let dir = TestDir::new("retention");
    let mut cluster = LocalCluster::start_with_env(
        dir.path(),
        3,
        &[
            ("TRIBUTARY_RETENTION_MIN", "1s"),
            ("TRIBUTARY_RETENTION_INTERVAL", "200ms"),
            // Small segments: space returns a segment at a time.
            ("TRIBUTARY_SEGMENT_BYTES", "1048576"),
        ],
    )
    .await;
    let endpoints = cluster.endpoints();
    let client = Client::connect(&endpoints[0]).await.unwrap();
    client
        .create_replicated_event_hub(HUB, 1, Some(Duration::from_secs(3600)), Some(3))
        .await
        .unwrap();
    for batch in 0..OLD_BATCHES {
        send_batch(&client, "old", batch).await;
    }
    let before: Vec<u64> = cluster
        .nodes
        .iter()
        .map(|n| disk_bytes(n.data_dir()))
        .collect();
    println!("data directories with {OLD_EVENTS} old events: {before:?} bytes");

    // New events keep arriving while retention is 3 s: the old ones expire, these stay
    // (at least the newest).
    let sending = Arc::new(AtomicBool::new(true));
    let sender = {
        let client = client.clone();
        let sending = sending.clone();
        tokio::spawn(async move {
            let mut batch = 0;
            while sending.load(Ordering::Relaxed) {
                send_batch(&client, "new", batch).await;
                batch += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            batch
        })
    };
    let hub = client
        .update_event_hub(
            HUB,
            &HubChanges {
                retention: Some(Duration::from_secs(3)),
                ..HubChanges::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(hub.retention_ms, 3000);

    // Every replica drops the old events: its begin sequence number and its first event
    // move past them.
    let heads = eventually(
        TIMEOUT,
        "the old events gone from every replica",
        async || {
            let heads = replica_heads(&endpoints).await;
            if heads.iter().all(|h| {
                h.is_some_and(|(begin, first)| {
                    begin >= OLD_EVENTS && first.is_none_or(|f| f >= begin)
                })
            }) {
                Ok(heads)
            } else {
                Err(format!("replica heads {heads:?}"))
            }
        },
    )
    .await;
    println!("replica heads once the old events expired: {heads:?}");

    // A reader positioned before the begin (sequence 0, and the earliest position) starts
    // at the first retained event.
    for position in [
        EventPosition::SequenceNumber {
            sequence_number: 0,
            inclusive: true,
        },
        EventPosition::Earliest,
    ] {
        let begin = client
            .get_partition_properties(HUB, "0")
            .await
            .unwrap()
            .begin_sequence_number;
        assert!(begin >= OLD_EVENTS, "begin {begin}");
        let mut stream = client
            .consumer()
            .receive(HUB, "$Default", "0", position, 10)
            .await
            .unwrap();
        let batch = stream.next().await.expect("a batch").expect("events");
        let first = batch.first().expect("at least one event").sequence_number;
        assert!(
            first >= begin && first >= OLD_EVENTS,
            "a read from {position:?} began at {first}, before the begin {begin}"
        );
    }

    // Keep what is there now: retention back to an hour, sends stopped.
    sending.store(false, Ordering::Relaxed);
    let new_batches = sender.await.unwrap();
    client
        .update_event_hub(
            HUB,
            &HubChanges {
                retention: Some(Duration::from_secs(3600)),
                ..HubChanges::default()
            },
        )
        .await
        .unwrap();
    println!("{new_batches} new batches sent");

    // The space the old events took went back to the operating system on every node: space
    // returns a whole segment at a time, and the segment holding the last old events and
    // the first new ones stays, so a node gets back between about half and two thirds of
    // the expired bytes; at least 40 % is asked (without retention nothing comes back).
    let old_bytes = (OLD_EVENTS as u64) * BODY_BYTES as u64;
    let returned_min = old_bytes * 2 / 5;
    let what = format!(
        "data directories shrunk by 40 % of the expired events' {old_bytes} bytes from {before:?}"
    );
    let after = eventually(TIMEOUT, what, async || {
        let after: Vec<u64> = cluster
            .nodes
            .iter()
            .map(|n| disk_bytes(n.data_dir()))
            .collect();
        let shrunk = before
            .iter()
            .zip(&after)
            .all(|(b, a)| *a + returned_min < *b);
        if shrunk {
            Ok(after)
        } else {
            Err(format!("{after:?} bytes"))
        }
    })
    .await;
    println!("data directories after retention: {after:?} bytes (before: {before:?})");

    // The nodes report their data's size and their filesystem's free space.
    let what = "storage gauges present, with the data size shrunk";
    eventually(TIMEOUT, what, async || {
        let metrics = http_get(cluster.nodes[0].http_addr(), "/metrics")
            .await
            .expect("metrics answer")
            .body;
        let gauge = |name: &str| {
            metrics
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().last())
                .and_then(|v| v.parse::<f64>().ok())
        };
        let data = gauge("tributary_storage_data_bytes");
        let free = gauge("tributary_storage_disk_free_bytes");
        if let (Some(data), Some(free)) = (data, free)
            && data > 0.0
            && (data as u64) + returned_min < before[0]
        {
            assert!(free > 0.0);
            return Ok(());
        }
        Err(format!("data {data:?}, free {free:?}"))
    })
    .await;

    // A replica killed after removing entries comes back with the same beginning: the
    // removal and the applied state it relies on are durable together.
    let expected = replica_heads(&endpoints).await;
    let begin = expected[0].expect("node 1 answers").0;
    cluster.nodes[1].kill9().await;
    cluster.nodes[1].restart().await;
    let what = format!("node 2 restarted with the head {:?}", expected[1]);
    eventually(TIMEOUT, what, async || {
        let heads = replica_heads(&endpoints).await;
        if heads[1] == expected[1] {
            Ok(())
        } else {
            Err(format!("{:?}", heads[1]))
        }
    })
    .await;

    // A replica whose data is wiped is rebuilt from what is retained, and matches the
    // others.
    let victim = 2;
    cluster.nodes[victim].wipe().await;
    cluster.nodes[victim].restart().await;
    let what = "the wiped replica rebuilt to match node 1";
    let rebuilt = eventually(TIMEOUT, what, async || {
        let client = Client::connect(&endpoints[victim]).await;
        let listing = match client {
            Ok(client) => client.replica_events(HUB, "0", 0, None).await.ok(),
            Err(_) => None,
        };
        let reference = Client::connect(&endpoints[0])
            .await
            .unwrap()
            .replica_events(HUB, "0", 0, None)
            .await
            .unwrap();
        if let Some(listing) = listing
            && listing.begin_sequence_number == reference.begin_sequence_number
            && tributary_client::replica_digest(&listing.events)
                == tributary_client::replica_digest(&reference.events)
        {
            return Ok(listing);
        }
        Err(format!(
            "node 1 begins at {}",
            reference.begin_sequence_number
        ))
    })
    .await;
    assert_eq!(rebuilt.begin_sequence_number, begin);
    assert!(!rebuilt.events.is_empty());
    assert!(rebuilt.events[0].sequence_number >= OLD_EVENTS);
}
