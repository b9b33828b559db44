//! Issue 31, "done when" item 2: a partition's leader is killed (SIGKILL) while
//! confluent-kafka (librdkafka 2.16, `enable.idempotence=true`, `acks=all`) produces 50,000
//! records to it. Batches in flight when the leader dies are retried by the client, through
//! whichever node it reaches next (every node is a bootstrap server); the partition's state
//! machine knows each producer's last batches on every replica, so a retried batch that was
//! committed before the kill is answered with its original offset instead of being stored
//! again. Every acknowledged record is read back exactly once, in order, at the offset the
//! client was told.

use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value as Json, json};
use tributary_client::{Client, ConnectOptions, EventPosition, ReceivedEvent};
use tributary_cluster_tests::eventually;

use super::kafka_produce::{ROOT_KEY, connection_string, run_python, start};

const HUB: &str = "idempotent";
const RECORDS: u64 = 50_000;
/// The leader is killed once this many records are stored.
const KILL_AFTER: i64 = 10_000;

async fn client_of(endpoint: String) -> Client {
    Client::from_connection_string_with(
        &connection_string(ROOT_KEY),
        ConnectOptions {
            endpoint: Some(endpoint),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap()
}

/// The node (1-based id) leading `partition` of `HUB`, as `client`'s node reports it.
async fn leader_of(client: &Client, partition: &str) -> u64 {
    eventually(
        Duration::from_secs(30),
        format!("a leader of partition {partition}"),
        async || {
            let status = client.cluster_status().await.map_err(|e| e.to_string())?;
            status
                .partitions
                .iter()
                .find(|p| p.event_hub == HUB && p.partition_id == partition && p.leader != 0)
                .map(|p| p.leader)
                .ok_or_else(|| "no leader reported yet".to_string())
        },
    )
    .await
}

/// Every event of `partition`, from the first.
async fn read_partition(client: &Client, partition: &str) -> Vec<ReceivedEvent> {
    let last = client
        .get_partition_properties(HUB, partition)
        .await
        .unwrap()
        .last_enqueued_sequence_number;
    let mut events = Vec::new();
    if last < 0 {
        return events;
    }
    let mut stream = client
        .consumer()
        .receive(HUB, "$Default", partition, EventPosition::Earliest, 1000)
        .await
        .unwrap();
    while (events.len() as i64) <= last {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("events within 30 s")
            .expect("the stream goes on")
            .unwrap();
        events.extend(batch);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_neither_loses_nor_duplicates_idempotent_records() {
    let Some((_dir, mut cluster, root, _kcat, venv)) = start("kafka-idempotent").await else {
        return;
    };
    root.create_event_hub(HUB, 1, None).await.unwrap();
    let victim = leader_of(&root, "0").await;
    let victim_index = usize::try_from(victim - 1).unwrap();
    let survivor = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i != victim_index)
        .map(|(_, node)| node.endpoint())
        .unwrap();
    let watcher = client_of(survivor).await;
    let ports: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|node| node.kafka_addr().port())
        .collect();
    let settings = json!({
        "scenario": "idempotent",
        "kafka_ports": ports,
        "connection_string": connection_string(ROOT_KEY),
        "topic": HUB,
        "partition": 0,
        "count": RECORDS,
        "chunk": 500,
        "pause_s": 0.02,
        "message_timeout_ms": 90_000,
        "flush_s": 100,
    });
    let producing = tokio::spawn(async move { run_python(&venv, settings).await });

    // The kill, once part of the records is stored and the rest still to come.
    let stored_at_kill = eventually(
        Duration::from_secs(60),
        format!("{KILL_AFTER} records stored before the kill"),
        async || {
            let last = watcher
                .get_partition_properties(HUB, "0")
                .await
                .map_err(|e| e.to_string())?
                .last_enqueued_sequence_number;
            if last + 1 >= KILL_AFTER {
                Ok(last + 1)
            } else {
                Err(format!("{} stored", last + 1))
            }
        },
    )
    .await;
    eprintln!(
        "killing node {victim}, the leader of partition 0, with {stored_at_kill} records stored"
    );
    cluster.nodes[victim_index].kill9().await;
    assert!(
        stored_at_kill < RECORDS as i64,
        "the producer finished before the kill; pace it more slowly"
    );

    let summary: Json = producing.await.unwrap();
    assert_eq!(summary["fatal"], json!([]), "fatal producer errors");
    assert_eq!(summary["left"], json!(0), "records still queued at the end");
    assert_eq!(
        summary["failed"],
        json!([]),
        "records the client gave up on"
    );
    let acked: Vec<(u64, i64)> = summary["acked"]
        .as_array()
        .unwrap()
        .iter()
        .map(|pair| (pair[0].as_u64().unwrap(), pair[1].as_i64().unwrap()))
        .collect();
    assert_eq!(acked.len() as u64, RECORDS, "every record acknowledged");

    // Read back through a surviving node: each record once, in the order produced, at the
    // offset its acknowledgement named.
    let events = read_partition(&watcher, "0").await;
    let stored: Vec<u64> = events
        .iter()
        .map(|e| String::from_utf8_lossy(&e.body).parse::<u64>().unwrap())
        .collect();
    let mut sorted = stored.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), stored.len(), "a record stored twice");
    assert_eq!(
        stored,
        (0..RECORDS).collect::<Vec<u64>>(),
        "the records stored, in order"
    );
    for (record, offset) in acked {
        assert_eq!(
            events[usize::try_from(offset).unwrap()].sequence_number,
            offset
        );
        assert_eq!(
            stored[usize::try_from(offset).unwrap()],
            record,
            "record {record} acknowledged at offset {offset}"
        );
    }
}
