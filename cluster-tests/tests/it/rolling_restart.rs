//! A rolling restart (each node in turn: `tributary drain` as a preStop hook runs it, stop,
//! start, wait until the cluster is healthy) under continuous sends from a retrying
//! idempotent producer: no send fails, and every acknowledged event is stored once, at the
//! sequence number its acknowledgement gave. The drain ends by itself when the node starts
//! again: nobody undrains it, yet its leaders return.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tributary_client::{Client, EventData, EventPosition};
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok, eventually, http_get};
use tributary_proto::v1::ClusterStatus;

const HUB: &str = "rolling";
pub(crate) const PARTITIONS: u32 = 4;
/// Events per send.
const BATCH_EVENTS: usize = 3;
/// An upper bound on the producer's sends, so a stuck stop flag cannot loop for ever.
const SENDS_MAX: u64 = 1_000_000;
/// How long the cluster may take to reach a state the test waits for.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The file a node drained for a restart keeps in its data directory until it starts again.
const DRAIN_MARKER: &str = "drained-for-restart";
/// Sends the producer must complete in each phase, so every phase runs under load.
const SENDS_PER_PHASE: u64 = 10;

/// What the producer was told for one acknowledged send.
pub(crate) struct Acknowledged {
    partition: u32,
    first_sequence_number: i64,
    bodies: Vec<String>,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_under_continuous_sends_fails_no_send_and_loses_nothing() {
    let dir = TestDir::new("rolling-restart");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    admin
        .create_replicated_event_hub(HUB, PARTITIONS, None, Some(3))
        .await
        .unwrap();
    await_status(
        &admin,
        "every partition led by its preferred replica",
        healthy,
    )
    .await;

    // The producer knows all three nodes, so no stopped node is a single point of failure;
    // the SDK retries transient failures (leader moved, node gone) itself.
    let client = Client::connect_any(&endpoints).await.unwrap();
    let producer = ContinuousProducer::start(&client, HUB, PARTITIONS);
    let await_sends = |what: String| producer.await_sends(what);
    await_sends("before the restarts".into()).await;

    let started = Instant::now();
    for index in 0..cluster.nodes.len() {
        let id = index as u64 + 1;
        // Ask a node that stays up about the cluster.
        let admin = Client::connect(&endpoints[(index + 1) % endpoints.len()])
            .await
            .unwrap();
        // As the chart's preStop hook: on the node's machine, through its HTTP port.
        let http_addr = cluster.nodes[index].http_addr().to_string();
        let report = cli_ok(
            &endpoints[index],
            &[
                "drain",
                "--http-addr",
                &http_addr,
                "--timeout",
                "30s",
                "--output",
                "json",
            ],
        )
        .await;
        let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
        assert_eq!(report["node_id"], id, "{report}");
        assert_eq!(report["drained"], true, "{report}");
        assert_eq!(report["ends_at_restart"], true, "{report}");
        assert_eq!(report["leaders_movable"], 0, "{report}");
        assert_eq!(report["controller_leader"], false, "{report}");
        await_status(&admin, &format!("node {id} drained"), |status| {
            drained(status, id)
        })
        .await;
        let ready = http_get(cluster.nodes[index].http_addr(), "/readyz")
            .await
            .unwrap();
        assert_eq!(ready.status, 503, "a drained node is not ready: {ready:?}");
        let marker = cluster.nodes[index].data_dir().join(DRAIN_MARKER);
        assert!(marker.exists(), "the drain leaves {}", marker.display());
        await_sends(format!("with node {id} drained")).await;

        let exit = cluster.nodes[index].terminate().await;
        assert!(exit.success(), "node {id} did not stop cleanly: {exit}");
        await_sends(format!("with node {id} stopped")).await;

        cluster.nodes[index].restart().await;
        // No undrain: the node ends its drain itself once it has started.
        await_status(&admin, &format!("cluster healthy after node {id}"), healthy).await;
        let what = format!("{} removed by the restarted node", marker.display());
        eventually(SETTLE_TIMEOUT, what, async || {
            if marker.exists() {
                Err("still there")
            } else {
                Ok(())
            }
        })
        .await;
        await_sends(format!("after node {id} returned")).await;
        println!(
            "node {id} restarted; {:?} since the first drain",
            started.elapsed()
        );
    }

    let acknowledged = producer.finish(started).await;
    assert_exactly_acknowledged(&client, HUB, PARTITIONS, &acknowledged).await;
}

/// A producer sending batches round the partitions of a hub without pause, through the
/// SDK's idempotent producer (which retries transient failures itself), until finished.
pub(crate) struct ContinuousProducer {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<Vec<Acknowledged>>,
}

impl ContinuousProducer {
    pub(crate) fn start(client: &Client, hub: &'static str, partitions: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let task = tokio::spawn({
            let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
            let producer = client.idempotent_producer();
            async move {
                let mut acknowledged = Vec::new();
                let mut send = 0u64;
                while !stop.load(Ordering::Relaxed) && send < SENDS_MAX {
                    let partition = (send % u64::from(partitions)) as u32;
                    let bodies: Vec<String> =
                        (0..BATCH_EVENTS).map(|e| format!("s{send}-e{e}")).collect();
                    let events = bodies.iter().map(|b| EventData::from_body(b.clone()));
                    match producer.send(hub, &partition.to_string(), events).await {
                        Ok(response) => {
                            acknowledged.push(Acknowledged {
                                partition,
                                first_sequence_number: response.first_sequence_number,
                                bodies,
                            });
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(err) => {
                            eprintln!("send {send} to partition {partition} failed: {err}");
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    send += 1;
                }
                acknowledged
            }
        });
        Self {
            stop,
            sent,
            failed,
            task,
        }
    }

    /// Waits until the producer has completed `SENDS_PER_PHASE` more sends.
    pub(crate) async fn await_sends(&self, what: String) {
        let target = self.sent.load(Ordering::Relaxed) + SENDS_PER_PHASE;
        let what = format!("{target} sends {what} (the producer is stuck otherwise)");
        eventually(SETTLE_TIMEOUT, what, async || {
            match self.sent.load(Ordering::Relaxed) {
                done if done >= target => Ok(()),
                done => Err(format!("{done} sends")),
            }
        })
        .await;
    }

    /// Stops the producer; asserts that no send failed and returns the acknowledged ones.
    pub(crate) async fn finish(self, started: Instant) -> Vec<Acknowledged> {
        self.stop.store(true, Ordering::Relaxed);
        let acknowledged = self.task.await.unwrap();
        let failed = self.failed.load(Ordering::Relaxed);
        println!(
            "{} sends acknowledged, {failed} failed, in {:?}",
            acknowledged.len(),
            started.elapsed()
        );
        assert_eq!(failed, 0, "a retrying producer saw failed sends");
        acknowledged
    }
}

/// Idempotent sends: each partition holds exactly the acknowledged events, each at the
/// sequence number its acknowledgement gave.
pub(crate) async fn assert_exactly_acknowledged(
    client: &Client,
    hub: &str,
    partitions: u32,
    acknowledged: &[Acknowledged],
) {
    let mut expected: BTreeMap<u32, BTreeMap<i64, String>> = BTreeMap::new();
    for send in acknowledged {
        let partition = expected.entry(send.partition).or_default();
        for (i, body) in send.bodies.iter().enumerate() {
            let sequence = send.first_sequence_number + i as i64;
            let earlier = partition.insert(sequence, body.clone());
            assert!(
                earlier.is_none(),
                "sequence {sequence} of partition {} was acknowledged twice: {earlier:?} and {body}",
                send.partition
            );
        }
    }
    for partition in 0..partitions {
        let expected = expected.remove(&partition).unwrap_or_default();
        let stored = read_partition(client, hub, partition).await;
        assert_eq!(
            stored.len(),
            expected.len(),
            "partition {partition} must hold exactly the acknowledged events"
        );
        for (sequence, body) in &expected {
            assert_eq!(
                stored.get(sequence),
                Some(body),
                "partition {partition} sequence {sequence}"
            );
        }
    }
}

/// Every event of `partition` from the earliest through the last enqueued, by sequence
/// number.
async fn read_partition(client: &Client, hub: &str, partition: u32) -> BTreeMap<i64, String> {
    let partition_id = partition.to_string();
    let last = client
        .get_partition_properties(hub, &partition_id)
        .await
        .unwrap()
        .last_enqueued_sequence_number;
    let mut events = BTreeMap::new();
    if last < 0 {
        return events;
    }
    let mut stream = client
        .consumer()
        .receive(hub, "", &partition_id, EventPosition::Earliest, 0)
        .await
        .unwrap();
    while events.last_key_value().is_none_or(|(s, _)| *s < last) {
        let batch = tokio::time::timeout(SETTLE_TIMEOUT, stream.next())
            .await
            .expect("events arrive")
            .expect("the stream stays open")
            .unwrap();
        for event in batch {
            let body = String::from_utf8(event.body.to_vec()).unwrap();
            let earlier = events.insert(event.sequence_number, body);
            assert!(
                earlier.is_none(),
                "sequence {} read twice",
                event.sequence_number
            );
        }
    }
    events
}

/// Node `id` is marked draining and no partition is led by it (each has another leader).
fn drained(status: &ClusterStatus, id: u64) -> bool {
    status
        .nodes
        .iter()
        .any(|n| n.id == id && n.draining && n.leaders == 0)
        && status
            .partitions
            .iter()
            .all(|p| p.leader != 0 && p.leader != id)
}

/// Every node up and not draining, no partition under-replicated, and every partition led
/// by its preferred (first) replica, where leadership settles.
pub(crate) fn healthy(status: &ClusterStatus) -> bool {
    status.nodes.iter().all(|n| n.up && !n.draining)
        && status.under_replicated == 0
        && status.partitions.len() == PARTITIONS as usize
        && status
            .partitions
            .iter()
            .all(|p| p.replicas.first().is_some_and(|r| r.node == p.leader))
}

/// Polls the cluster status (through `admin`) until `done` holds.
pub(crate) async fn await_status(
    admin: &Client,
    what: &str,
    done: impl Fn(&ClusterStatus) -> bool,
) {
    let started = Instant::now();
    eventually(SETTLE_TIMEOUT, what, async || {
        match admin.cluster_status().await {
            Ok(status) if done(&status) => Ok(()),
            status => Err(format!("{status:?}")),
        }
    })
    .await;
    println!("{what} after {:?}", started.elapsed());
}
