//! A receive stream whose partition leader is SIGKILLed mid-stream, while sends continue, is
//! resumed by the SDK on the new leader after the last event it delivered.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::mpsc;
use tributary_client::{
    Client, ClientError, EventData, EventPosition, ReceiveStream, ReceivedEvent,
};
use tributary_cluster_tests::{LocalCluster, TestDir, eventually, test_seed};

const HUB: &str = "events";
const PARTITION: &str = "0";
/// Sends that keep going after the kill, so the resumed stream has new events to deliver.
const SENDS_AFTER_KILL: usize = 60;
/// How long the receiver may take to deliver every acknowledged event.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// One batch as the receiver saw it, with the node that served it.
type Delivery = (Result<Vec<ReceivedEvent>, ClientError>, String);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_stream_resumes_on_the_new_leader_without_gap_or_duplicate() {
    let seed = test_seed("receive_failover");
    let dir = TestDir::new("receive-failover");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    Client::connect(&endpoints[0])
        .await
        .unwrap()
        .create_replicated_event_hub(HUB, 1, None, Some(3))
        .await
        .unwrap();
    let leader = cluster.partition_leader(HUB, PARTITION).await;
    let survivor = &endpoints[(leader + 1) % 3];

    // The reader's stream is served by the partition leader.
    let reader = Client::connect(survivor).await.unwrap();
    let stream = reader
        .consumer()
        .receive(HUB, "", PARTITION, EventPosition::Earliest, 0)
        .await
        .unwrap();
    let (receiver, mut delivered) = forward(stream);

    // Idempotent sends, so that retries across the kill store every event once.
    let killed = Arc::new(AtomicBool::new(false));
    let sender = tokio::spawn(send_until_after_kill(
        Client::connect(survivor).await.unwrap(),
        killed.clone(),
    ));

    let kill_after_events = 10 + (seed % 40) as usize;
    let mut events: Vec<ReceivedEvent> = Vec::new();
    let mut served_by: Vec<String> = Vec::new();
    while events.len() < kill_after_events {
        receive_batch(&mut delivered, &mut events, &mut served_by).await;
    }
    cluster.nodes[leader].kill9().await;
    killed.store(true, Ordering::SeqCst);
    let acknowledged = sender.await.expect("the sender finishes");

    while events.len() < acknowledged.len() {
        receive_batch(&mut delivered, &mut events, &mut served_by).await;
    }
    let sequences: Vec<i64> = events.iter().map(|e| e.sequence_number).collect();
    assert_eq!(
        sequences,
        (0..acknowledged.len() as i64).collect::<Vec<_>>(),
        "sequence numbers must run without gap or duplicate (seed {seed})"
    );
    let bodies: Vec<String> = events
        .iter()
        .map(|e| String::from_utf8(e.body.to_vec()).unwrap())
        .collect();
    assert_eq!(
        bodies, acknowledged,
        "every acknowledged event, once, in order (seed {seed})"
    );
    // The stream really moved: it was served by the killed leader, and is now served by
    // another node.
    assert_eq!(served_by.first(), Some(&endpoints[leader]));
    assert_ne!(served_by.last(), Some(&endpoints[leader]));
    let properties = reader
        .get_partition_properties(HUB, PARTITION)
        .await
        .unwrap();
    assert_eq!(
        properties.last_enqueued_sequence_number,
        acknowledged.len() as i64 - 1,
        "nothing beyond the acknowledged events was stored"
    );
    receiver.abort();
}

/// Sends one event at a time until `SENDS_AFTER_KILL` sends after `killed` was set;
/// returns the acknowledged bodies in order.
async fn send_until_after_kill(client: Client, killed: Arc<AtomicBool>) -> Vec<String> {
    let producer = client.idempotent_producer();
    let mut acknowledged = Vec::new();
    let mut after_kill = 0;
    while after_kill < SENDS_AFTER_KILL {
        if killed.load(Ordering::SeqCst) {
            after_kill += 1;
        }
        let body = format!("e{}", acknowledged.len());
        producer
            .send(HUB, PARTITION, [EventData::from_body(body.clone())])
            .await
            .unwrap_or_else(|e| panic!("send {body}: {e}"));
        acknowledged.push(body);
    }
    acknowledged
}

/// Forwards the stream's batches, each with the node that served it, until the first error.
fn forward(mut stream: ReceiveStream) -> (tokio::task::JoinHandle<()>, mpsc::Receiver<Delivery>) {
    let (deliveries, delivered) = mpsc::channel::<Delivery>(16);
    let receiver = tokio::spawn(async move {
        while let Some(batch) = stream.next().await {
            let failed = batch.is_err();
            let endpoint = stream.endpoint().to_owned();
            if deliveries.send((batch, endpoint)).await.is_err() || failed {
                return;
            }
        }
    });
    (receiver, delivered)
}

/// Waits for the receiver's next batch; a stream error fails the test.
async fn receive_batch(
    delivered: &mut mpsc::Receiver<Delivery>,
    events: &mut Vec<ReceivedEvent>,
    served_by: &mut Vec<String>,
) {
    let (batch, endpoint) = tokio::time::timeout(RECEIVE_TIMEOUT, delivered.recv())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no events for {RECEIVE_TIMEOUT:?} after {} events",
                events.len()
            )
        })
        .expect("the receive stream stays open");
    let batch = batch.unwrap_or_else(|e| {
        panic!(
            "the receive stream failed after {} events: {e}",
            events.len()
        )
    });
    events.extend(batch);
    if served_by.last() != Some(&endpoint) {
        served_by.push(endpoint);
    }
}

/// A receive stream whose partition replica moves off the node serving it (the node is
/// decommissioned) is resumed where the partition is now: the stream on the removed replica
/// ends instead of waiting for events that never reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_stream_resumes_when_its_replica_moves_away() {
    const MOVE_TIMEOUT: Duration = Duration::from_secs(60);
    const SENDS: usize = 20;
    let dir = TestDir::new("receive-moved");
    let cluster = LocalCluster::start(dir.path(), 4).await;
    let endpoints = cluster.endpoints();
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    admin
        .create_replicated_event_hub(HUB, 1, None, Some(3))
        .await
        .unwrap();
    let leader = cluster.partition_leader(HUB, PARTITION).await;
    let leader_id = leader as u64 + 1;
    let other = &endpoints[(leader + 1) % endpoints.len()];

    let reader = Client::connect(other).await.unwrap();
    let stream = reader
        .consumer()
        .receive(HUB, "", PARTITION, EventPosition::Earliest, 0)
        .await
        .unwrap();
    let (receiver, mut delivered) = forward(stream);
    let producer = Client::connect(other).await.unwrap().idempotent_producer();
    let mut acknowledged = Vec::new();
    let mut events: Vec<ReceivedEvent> = Vec::new();
    let mut served_by: Vec<String> = Vec::new();
    let send = |n: usize, acknowledged: &mut Vec<String>| {
        let producer = producer.clone();
        let bodies: Vec<String> = (acknowledged.len()..acknowledged.len() + n)
            .map(|i| format!("e{i}"))
            .collect();
        acknowledged.extend(bodies.clone());
        async move {
            for body in bodies {
                producer
                    .send(HUB, PARTITION, [EventData::from_body(body.clone())])
                    .await
                    .unwrap_or_else(|e| panic!("send {body}: {e}"));
            }
        }
    };
    send(SENDS, &mut acknowledged).await;
    while events.len() < acknowledged.len() {
        receive_batch(&mut delivered, &mut events, &mut served_by).await;
    }
    assert_eq!(served_by, vec![endpoints[leader].clone()]);

    // Every replica leaves the serving node.
    admin.decommission_node(leader_id, true).await.unwrap();
    let what = format!("every replica moved off node {leader_id}, and a leader");
    eventually(MOVE_TIMEOUT, what, async || {
        let status = admin.cluster_status().await.unwrap();
        let partition = status
            .partitions
            .iter()
            .find(|p| p.event_hub == HUB)
            .unwrap();
        if partition.replicas.iter().all(|r| r.node != leader_id) && partition.leader != 0 {
            Ok(())
        } else {
            Err(format!("{partition:?}"))
        }
    })
    .await;

    send(SENDS, &mut acknowledged).await;
    while events.len() < acknowledged.len() {
        receive_batch(&mut delivered, &mut events, &mut served_by).await;
    }
    let bodies: Vec<String> = events
        .iter()
        .map(|e| String::from_utf8(e.body.to_vec()).unwrap())
        .collect();
    assert_eq!(bodies, acknowledged, "every event once, in order");
    assert_ne!(
        served_by.last(),
        Some(&endpoints[leader]),
        "the stream moved with the partition: {served_by:?}"
    );
    receiver.abort();
}
