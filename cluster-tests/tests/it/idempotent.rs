//! Exactly-once sends across a failover: a partition leader dies after its send was committed
//! but before the reply (the crash-after-commit fault hook), and the idempotent producer's
//! retry on the new leader is stored once and answered with the original numbers.

use std::os::unix::process::ExitStatusExt as _;
use std::time::Duration;

use futures::StreamExt;
use tributary_client::{
    Client, ClientError, EventData, EventPosition, IdempotentProducer, SendTarget,
};
use tributary_cluster_tests::{LocalCluster, NodeProcess, TestDir, http_post};

const HUB: &str = "orders";
const PARTITION: &str = "0";
/// Events per batch.
const BATCH_EVENTS: usize = 3;
const FAULT_HOOKS: [(&str, &str); 1] = [("TRIBUTARY_FAULT_HOOKS", "1")];
const CRASH_AFTER_COMMIT: &str = "/debug/faults/crash-after-commit";
/// SIGABRT: how a node the hook crashed exits.
const SIGABRT: i32 = 6;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_retried_after_its_leader_died_between_commit_and_reply_is_stored_once() {
    let dir = TestDir::new("idempotent-retry");
    let mut cluster = LocalCluster::start_with_env(dir.path(), 3, &FAULT_HOOKS).await;
    let endpoints = cluster.endpoints();
    Client::connect(&endpoints[0])
        .await
        .unwrap()
        .create_replicated_event_hub(HUB, 1, None, Some(3))
        .await
        .unwrap();
    let leader = cluster.partition_leader(HUB, PARTITION).await;
    // The producer's first node survives, so its retries have somewhere to start from.
    let client = Client::connect(&endpoints[(leader + 1) % 3]).await.unwrap();
    let producer = client.idempotent_producer();
    let mut expected: Vec<String> = Vec::new();
    for batch in 0..3 {
        send_batch(&producer, batch, &mut expected).await;
    }

    // The leader commits the next batch and dies before it replies; the producer retries
    // the same batch (same producer sequence) on the new leader.
    arm_crash_after_commit(&cluster.nodes[leader]).await;
    send_batch(&producer, 3, &mut expected).await;
    assert_aborted_by_the_hook(&mut cluster.nodes[leader]).await;
    // Numbering continues after the retried batch.
    send_batch(&producer, 4, &mut expected).await;
    assert_eq!(read_partition(&client, expected.len()).await, expected);

    // The premise: the hook fires after the commit. A plain send straight to the armed
    // leader, without retries, gets no reply, yet its event is stored.
    cluster.nodes[leader].restart().await;
    let leader = cluster.partition_leader(HUB, PARTITION).await;
    let direct = Client::connect(&endpoints[leader])
        .await
        .unwrap()
        .with_retry_deadline(Duration::ZERO);
    arm_crash_after_commit(&cluster.nodes[leader]).await;
    let unanswered = direct
        .producer()
        .send(
            HUB,
            SendTarget::PartitionId(PARTITION.into()),
            [EventData::from_body("unanswered")],
        )
        .await;
    assert!(
        matches!(unanswered, Err(ClientError::Transport { .. })),
        "the dying leader must not answer the send: {unanswered:?}"
    );
    assert_aborted_by_the_hook(&mut cluster.nodes[leader]).await;
    expected.push("unanswered".into());
    let survivor = Client::connect(&endpoints[(leader + 1) % 3]).await.unwrap();
    assert_eq!(read_partition(&survivor, expected.len()).await, expected);
}

/// Sends batch `batch` through the idempotent producer and checks it got the next numbers.
async fn send_batch(producer: &IdempotentProducer, batch: usize, expected: &mut Vec<String>) {
    let bodies: Vec<String> = (0..BATCH_EVENTS)
        .map(|i| format!("b{batch}-e{i}"))
        .collect();
    let sent = producer
        .send(
            HUB,
            PARTITION,
            bodies.iter().map(|b| EventData::from_body(b.clone())),
        )
        .await
        .unwrap_or_else(|e| panic!("send of batch {batch}: {e}"));
    assert_eq!(
        sent.first_sequence_number,
        expected.len() as i64,
        "batch {batch} must get the numbers it was stored with, right after the batch before"
    );
    expected.extend(bodies);
}

async fn arm_crash_after_commit(node: &NodeProcess) {
    let response = http_post(node.http_addr(), CRASH_AFTER_COMMIT)
        .await
        .unwrap();
    assert_eq!(response.status, 200, "{}", response.body);
}

async fn assert_aborted_by_the_hook(node: &mut NodeProcess) {
    let status = node.wait_for_exit().await;
    assert_eq!(
        status.signal(),
        Some(SIGABRT),
        "the node must have died from the fault hook: {status}"
    );
}

/// Every event of the partition, read from the start; checks that there are no more than
/// `count` and that sequence numbers run 0, 1, 2, ... without gaps.
async fn read_partition(client: &Client, count: usize) -> Vec<String> {
    let properties = client
        .get_partition_properties(HUB, PARTITION)
        .await
        .unwrap();
    assert_eq!(
        properties.last_enqueued_sequence_number,
        count as i64 - 1,
        "the partition holds exactly the sent events"
    );
    let mut stream = client
        .consumer()
        .receive(HUB, "", PARTITION, EventPosition::Earliest, 0)
        .await
        .unwrap();
    let mut events = Vec::new();
    while events.len() < count {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("events arrive")
            .expect("the stream stays open")
            .unwrap();
        events.extend(batch);
    }
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence_number).collect();
    assert_eq!(sequences, (0..count as i64).collect::<Vec<_>>());
    events
        .iter()
        .map(|e| String::from_utf8(e.body.to_vec()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_hooks_cannot_be_armed_unless_enabled() {
    let dir = TestDir::new("fault-hooks-off");
    let node = NodeProcess::start(&dir.path().join("node")).await;
    let response = http_post(node.http_addr(), CRASH_AFTER_COMMIT)
        .await
        .unwrap();
    assert_eq!(response.status, 404, "{}", response.body);
    assert!(
        response.body.contains("TRIBUTARY_FAULT_HOOKS=1"),
        "{}",
        response.body
    );
    // And nothing was armed: a send is answered.
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client.create_event_hub(HUB, 1, None).await.unwrap();
    client
        .producer()
        .send(HUB, SendTarget::Any, [EventData::from_body("x")])
        .await
        .unwrap();
}
