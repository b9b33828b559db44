//! Issue 31, "done when" item 2: a partition's leader is killed while confluent-kafka
//! (librdkafka 2.16, `enable.idempotence=true`, `acks=all`) produces 50,000 records to it.
//! Batches in flight when the leader dies are retried by the client, through whichever node
//! it reaches next (every node is a bootstrap server); the partition's state machine knows
//! each producer's last batches on every replica, so a retried batch that was committed
//! before the leader died is answered with its original offset instead of being stored
//! again. Every acknowledged record is read back exactly once, in order, at the offset the
//! client was told.
//!
//! Killed with SIGKILL, the leader rarely dies in the moment between a commit and its
//! reply; the crash-after-commit fault hook kills it exactly there, so the second test
//! fails if retries are stored twice.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use futures::StreamExt;
use serde_json::{Value as Json, json};
use tributary_client::{Client, ConnectOptions, EventPosition, ReceivedEvent};
use tributary_cluster_tests::{eventually, http_post};

use super::kafka_produce::{ROOT_KEY, connection_string, run_python, start_with_env};

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

/// How the partition's leader dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Death {
    /// SIGKILL, wherever it is.
    Killed,
    /// SIGABRT from the crash-after-commit fault hook: right after a send commits, before
    /// its reply.
    AfterCommit,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leader_neither_loses_nor_duplicates_idempotent_records() {
    produce_through_a_leader_death("kafka-idempotent-kill", Death::Killed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_leader_died_before_replying_is_stored_once() {
    produce_through_a_leader_death("kafka-idempotent-crash", Death::AfterCommit).await;
}

async fn produce_through_a_leader_death(name: &str, death: Death) {
    let env: &[(&str, &str)] = match death {
        Death::Killed => &[],
        Death::AfterCommit => &[("TRIBUTARY_FAULT_HOOKS", "1")],
    };
    let Some((_dir, mut cluster, root, _kcat, venv)) = start_with_env(name, env).await else {
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
    let node = &mut cluster.nodes[victim_index];
    match death {
        Death::Killed => {
            eprintln!(
                "killing node {victim}, the leader of partition 0, with {stored_at_kill} records stored"
            );
            node.kill9().await;
        }
        Death::AfterCommit => {
            eprintln!(
                "arming node {victim}, the leader of partition 0, to crash after its next commit, with {stored_at_kill} records stored"
            );
            let armed = http_post(node.http_addr(), "/debug/faults/crash-after-commit")
                .await
                .unwrap();
            assert_eq!(armed.status, 200, "{}", armed.body);
            let status = node.wait_for_exit().await;
            assert_eq!(
                status.signal(),
                Some(6),
                "died from the hook (SIGABRT): {status}"
            );
        }
    }
    assert!(
        stored_at_kill < RECORDS as i64,
        "the producer finished before the leader died; pace it more slowly"
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

/// kafka-python 3 turns idempotence on by default (WIRE-PROTOCOLS C2): its producer gets an
/// id through InitProducerId and its records are stored once each, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_produces_idempotently_by_default() {
    kafka_python_idempotent("kafka-python-idempotent", 0).await;
}

/// While the controller cannot give out producer ids (electing a leader, or a cluster not
/// yet at feature level 2), InitProducerId fails; kafka-python asks again and then produces
/// as usual. Answered COORDINATOR_NOT_AVAILABLE, it went looking for a transaction
/// coordinator instead, with a null key, and never got an id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_python_gets_its_producer_id_after_transient_refusals() {
    kafka_python_idempotent("kafka-python-refused-ids", 2).await;
}

/// kafka-python's default producer sends numbered records to partition 0 after every node
/// refused its first `refusals` producer-id requests (the fault hook).
async fn kafka_python_idempotent(name: &str, refusals: u32) {
    let env: &[(&str, &str)] = if refusals > 0 {
        &[("TRIBUTARY_FAULT_HOOKS", "1")]
    } else {
        &[]
    };
    let Some((_dir, cluster, root, _kcat, venv)) = start_with_env(name, env).await else {
        return;
    };
    root.create_event_hub(HUB, 1, None).await.unwrap();
    if refusals > 0 {
        let path = format!("/debug/faults/refuse-producer-ids?count={refusals}");
        for node in &cluster.nodes {
            let armed = http_post(node.http_addr(), &path).await.unwrap();
            assert_eq!(armed.status, 200, "{}", armed.body);
        }
    }
    let count = 300u64;
    let summary = run_python(
        &venv,
        json!({
            "scenario": "kafka_python_idempotent",
            "kafka_ports": [cluster.nodes[1].kafka_addr().port()],
            "connection_string": connection_string(ROOT_KEY),
            "topic": HUB,
            "partition": 0,
            "count": count,
        }),
    )
    .await;
    assert_eq!(summary["errors"], json!([]), "{summary}");
    assert_eq!(summary["idempotent"], json!(true), "{summary}");
    let acked = summary["acked"].as_array().unwrap();
    assert_eq!(acked.len() as u64, count, "{summary}");
    for pair in acked {
        assert_eq!(pair[0], pair[1], "record {} at offset {}", pair[0], pair[1]);
    }
    let stored: Vec<u64> = read_partition(&root, "0")
        .await
        .iter()
        .map(|e| String::from_utf8_lossy(&e.body).parse::<u64>().unwrap())
        .collect();
    assert_eq!(stored, (0..count).collect::<Vec<u64>>());
    if refusals > 0 {
        let refused: usize = cluster
            .nodes
            .iter()
            .map(|node| {
                std::fs::read_to_string(node.log_path())
                    .unwrap_or_default()
                    .matches("refused by a fault hook")
                    .count()
            })
            .sum();
        assert!(
            refused >= 1,
            "no producer-id request was refused: the test did not exercise the retry"
        );
    }
}
