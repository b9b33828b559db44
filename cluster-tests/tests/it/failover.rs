//! Leader failover in a three-node cluster of real processes, under continuous sends:
//! partition leaders killed with SIGKILL and restarted, round after round, and a leader
//! frozen with SIGSTOP past the election timeout, then continued. Checked through each node's
//! own replica (`Diagnostics.ReplicaEvents`): every acknowledged event is where its ack put
//! it, sequence numbers are gap-free, all replicas of a partition hold the identical events,
//! and nothing a consumer saw vanished.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tributary_client::{
    Client, EventData, EventPosition, ReceivedEvent, ReplicaEvent, SendTarget, body_checksum,
    replica_digest,
};
use tributary_cluster_tests::{LocalCluster, NodeProcess, TestDir, cli, cli_ok, test_seed};

/// Kill-and-restart rounds of the SIGKILL test.
const KILL_ROUNDS: usize = 10;
const KILL_HUB: &str = "failover";
const KILL_PARTITIONS: u32 = 12;
/// Partitions 0..HOT get most explicit sends; the busiest partitions are measured, not
/// assumed, but these make sure some stand out.
const HOT_PARTITIONS: u32 = 4;
/// The busiest partitions of a round whose leaders decide which node is killed.
const BUSIEST_PARTITIONS: usize = 4;
const KILL_PRODUCERS: u64 = 4;

const PAUSE_HUB: &str = "paused";
const PAUSE_PARTITIONS: u32 = 3;
const PAUSE_PRODUCERS: u64 = 3;
/// The paused partition; most sends go to it.
const PAUSED_PARTITION: &str = "0";
/// How long the leader stays frozen: well past the longest election timeout (1600 ms).
const PAUSE: Duration = Duration::from_secs(4);

/// Events per batch at most, and distinct partition keys the producers use.
const BATCH_EVENTS_MAX: usize = 4;
const PARTITION_KEYS: u32 = 40;
/// How long one send may take, retries included, before the producer gives up on it and
/// tries another node (a frozen node never answers).
const SEND_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the SDK keeps retrying a send inside [`SEND_TIMEOUT`].
const SEND_RETRY_DEADLINE: Duration = Duration::from_secs(3);
/// Before a producer or consumer tries again after a failure.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Events per receive response.
const RECEIVE_BATCH_EVENTS: u32 = 300;
/// Acknowledged events that must arrive between the steps of a round: the cluster keeps
/// serving.
const ACKS_PER_STEP: u64 = 40;
/// Waiting for acknowledgements, a leader, a catch-up or converged replicas.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Producers and consumers stop this long after being told to at most.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// Item 2 of the failover issue: the node leading most of the busiest partitions is killed
/// with SIGKILL and restarted, ten times, while producers and consumers keep going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leaders_lose_nothing_and_replicas_stay_identical() {
    let seed = test_seed("killed_leaders_lose_nothing_and_replicas_stay_identical");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = TestDir::new("failover-kill");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    Client::connect(&endpoints[0])
        .await
        .unwrap()
        .create_replicated_event_hub(KILL_HUB, KILL_PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let load = Load::start(
        &endpoints,
        KILL_HUB,
        KILL_PARTITIONS,
        KILL_PRODUCERS,
        |rng| {
            if rng.random_bool(0.6) {
                SendTarget::PartitionId(rng.random_range(0..HOT_PARTITIONS).to_string())
            } else if rng.random_bool(0.5) {
                SendTarget::PartitionId(rng.random_range(0..KILL_PARTITIONS).to_string())
            } else {
                SendTarget::PartitionKey(format!("key-{}", rng.random_range(0..PARTITION_KEYS)))
            }
        },
        &mut rng,
    );
    let started = Instant::now();
    let mut counted = load.acked_per_partition();
    for round in 1..=KILL_ROUNDS {
        load.wait_for_acks(ACKS_PER_STEP, "before the kill").await;
        let now = load.acked_per_partition();
        let busiest = busiest_partitions(&counted, &now);
        counted = now;
        let leaders = partition_leaders(&cluster, KILL_HUB, None).await;
        let victim = leading_most(&leaders, &busiest);
        eprintln!(
            "round {round}: busiest partitions {busiest:?}, leaders {leaders:?}: killing node {} \
             ({:.1}s so far)",
            victim + 1,
            started.elapsed().as_secs_f64()
        );
        cluster.nodes[victim].kill9().await;
        let killed_at = Instant::now();
        // Sends go on, and the partitions the victim led get new leaders that accept them.
        let led: Vec<usize> = (0..leaders.len())
            .filter(|p| leaders[*p] == victim as u64 + 1)
            .collect();
        load.wait_for_acks_to(&led, "after the kill, to the partitions the victim led")
            .await;
        let failed_over_ms = killed_at.elapsed().as_millis();
        let restarting_at = Instant::now();
        cluster.nodes[victim].restart().await;
        let restart_ms = restarting_at.elapsed().as_millis();
        let catching_up_at = Instant::now();
        let caught_up = wait_caught_up(&cluster, victim, KILL_HUB, KILL_PARTITIONS).await;
        eprintln!(
            "round {round}: sends to its partitions resumed {failed_over_ms} ms after the kill; \
             restart took {restart_ms} ms, catching up {} ms",
            catching_up_at.elapsed().as_millis()
        );
        eprintln!(
            "round {round}: node {} back and caught up with {caught_up} events; {} acked, {}",
            victim + 1,
            load.acked_total(),
            load.failures()
        );
    }
    load.wait_for_acks(ACKS_PER_STEP, "after the last round")
        .await;
    let outcome = load.stop().await;
    let report = verify(&cluster, KILL_HUB, KILL_PARTITIONS, &outcome).await;
    assert_all_running(&mut cluster);
    eprintln!(
        "{report}; {} sends failed during failovers; {:.1}s in all",
        outcome.failed_sends,
        started.elapsed().as_secs_f64()
    );
}

/// Item 3 of the failover issue: a partition leader frozen with SIGSTOP past the election
/// timeout is replaced, steps down once continued, and nothing acknowledged is lost or
/// numbered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_steps_down_and_loses_nothing() {
    let seed = test_seed("a_paused_leader_steps_down_and_loses_nothing");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = TestDir::new("failover-pause");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    Client::connect(&endpoints[0])
        .await
        .unwrap()
        .create_replicated_event_hub(PAUSE_HUB, PAUSE_PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let load = Load::start(
        &endpoints,
        PAUSE_HUB,
        PAUSE_PARTITIONS,
        PAUSE_PRODUCERS,
        |rng| {
            if rng.random_bool(0.7) {
                SendTarget::PartitionId(PAUSED_PARTITION.to_owned())
            } else {
                SendTarget::PartitionId(rng.random_range(0..PAUSE_PARTITIONS).to_string())
            }
        },
        &mut rng,
    );
    load.wait_for_acks(ACKS_PER_STEP, "before the pause").await;
    let partition: usize = PAUSED_PARTITION.parse().unwrap();
    let old_leader = partition_leaders(&cluster, PAUSE_HUB, None).await[partition];
    let paused = usize::try_from(old_leader - 1).unwrap();
    eprintln!("pausing node {old_leader}, the leader of partition {PAUSED_PARTITION}");
    cluster.nodes[paused].pause();
    let paused_at = Instant::now();

    // Another node is elected (a higher term) and takes sends while the old leader sleeps.
    let cluster_ref = &cluster;
    let new_leader = wait_for(
        "another leader of the paused node's partition",
        move || async move {
            let leader = partition_leaders(cluster_ref, PAUSE_HUB, Some(paused)).await[partition];
            if leader != old_leader {
                Ok(leader)
            } else {
                Err(format!("node {leader} still reported as the leader"))
            }
        },
    )
    .await;
    eprintln!(
        "node {new_leader} leads partition {PAUSED_PARTITION} {:.1}s into the pause",
        paused_at.elapsed().as_secs_f64()
    );
    load.wait_for_acks_to(&[partition], "during the pause")
        .await;
    assert!(
        cluster.nodes[paused].is_paused(),
        "node {old_leader} is still paused"
    );
    // The deliberate part: the old leader stays frozen for the whole pause.
    tokio::time::sleep_until(paused_at + PAUSE).await;
    cluster.nodes[paused].resume();
    eprintln!(
        "resumed node {old_leader} after {:.1}s",
        paused_at.elapsed().as_secs_f64()
    );

    // Continued, the old leader learns of the newer term and steps down: its own replica says
    // so. It must not lead again while the new leader runs.
    let old_client = &Client::connect(&endpoints[paused]).await.unwrap();
    let resumed_at = Instant::now();
    wait_for("the resumed leader to step down", move || async move {
        match old_client
            .replica_events_page(PAUSE_HUB, PAUSED_PARTITION, i64::MAX, 1)
            .await
        {
            Ok(page) if !page.is_leader => Ok(()),
            Ok(_) => Err(format!("node {old_leader} still says it leads")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await;
    eprintln!(
        "node {old_leader} stepped down {} ms after it was resumed",
        resumed_at.elapsed().as_millis()
    );
    let leaders = partition_leaders(&cluster, PAUSE_HUB, None).await;
    assert_ne!(
        leaders[partition], old_leader,
        "the resumed node leads partition {PAUSED_PARTITION} again: {leaders:?}"
    );
    load.wait_for_acks(ACKS_PER_STEP, "after the resume").await;

    let outcome = load.stop().await;
    let report = verify(&cluster, PAUSE_HUB, PAUSE_PARTITIONS, &outcome).await;
    eprintln!("{report}; {} sends failed", outcome.failed_sends);
    assert_cli_summaries_agree(&cluster, PAUSE_HUB, PAUSED_PARTITION).await;
    assert_all_running(&mut cluster);
}

/// `tributary debug replica-events` against each node prints the same summary as the SDK
/// computes, and refuses what it cannot list with a message a person can act on.
async fn assert_cli_summaries_agree(cluster: &LocalCluster, hub: &str, partition: &str) {
    let args = [
        "debug",
        "replica-events",
        "--hub",
        hub,
        "--partition",
        partition,
    ];
    let mut digests = Vec::new();
    for node in &cluster.nodes {
        let listing = Client::connect(&node.endpoint())
            .await
            .unwrap()
            .replica_events(hub, partition, 0, None)
            .await
            .unwrap();
        let expected = replica_digest(&listing.events);
        let text = cli_ok(&node.endpoint(), &[&args[..], &["--summary"]].concat()).await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "--summary prints one line: {text}");
        let summary: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        let summary = &summary["summary"];
        assert_eq!(summary["count"], expected.count, "{text}");
        assert_eq!(
            summary["last_sequence"],
            expected.last_sequence_number.unwrap(),
            "{text}"
        );
        assert_eq!(
            summary["digest"],
            format!("{:016x}", expected.digest),
            "{text}"
        );
        digests.push(summary["digest"].clone());
    }
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "replica digests differ between nodes: {digests:?}"
    );

    // Listing events: one JSON line per event, then the summary.
    let endpoint = cluster.nodes[0].endpoint();
    let text = cli_ok(
        &endpoint,
        &[&args[..], &["--from-sequence", "2", "--limit", "3"]].concat(),
    )
    .await;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (i, line) in lines[..3].iter().enumerate() {
        assert_eq!(line["sequence"], 2 + i as i64, "{text}");
        assert!(line["body_checksum"].as_str().unwrap().len() == 8, "{text}");
        assert!(line["offset"].is_string(), "{text}");
        assert!(line["enqueued_time"].is_string(), "{text}");
    }
    assert_eq!(lines[3]["summary"]["count"], 3, "{text}");

    let missing = cli(
        &endpoint,
        &[
            "debug",
            "replica-events",
            "--hub",
            "nope",
            "--partition",
            "0",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(stderr.contains("'nope'"), "{stderr}");
    let out_of_range = cli(&endpoint, &[&args[..4], &["--partition", "99"]].concat()).await;
    let stderr = String::from_utf8_lossy(&out_of_range.stderr);
    assert!(!out_of_range.status.success());
    assert!(stderr.contains("99"), "{stderr}");

    // A node without a replica says where the replicas are.
    let client = Client::connect(&endpoint).await.unwrap();
    client
        .create_replicated_event_hub("single", 1, None, Some(1))
        .await
        .unwrap();
    let holder = partition_leaders(cluster, "single", None).await[0];
    let other = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i as u64 + 1 != holder)
        .map(|(_, n)| n.endpoint())
        .unwrap();
    let output = cli(
        &other,
        &[
            "debug",
            "replica-events",
            "--hub",
            "single",
            "--partition",
            "0",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("holds no replica") && stderr.contains(&format!("[{holder}]")),
        "{stderr}"
    );
}

/// An acknowledged batch, as its reply described it.
#[derive(Debug, Clone)]
struct Ack {
    partition: usize,
    first_sequence: i64,
    offsets: Vec<String>,
    enqueued_time_ms: i64,
    key: Option<String>,
    bodies: Vec<Vec<u8>>,
}

#[derive(Debug, Default)]
struct Ledger {
    acks: Vec<Ack>,
    acked_per_partition: Vec<u64>,
    failed_sends: u64,
    /// Why the latest failed send failed.
    last_failure: String,
}

/// What producers and consumers did, once stopped.
struct Outcome {
    acks: Vec<Ack>,
    failed_sends: u64,
    /// Per partition, what its consumer saw, in order.
    seen: Vec<Vec<ReplicaEvent>>,
}

/// Producers sending continuously and one consumer per partition, until stopped.
struct Load {
    ledger: Arc<Mutex<Ledger>>,
    stop: watch::Sender<bool>,
    producers: Vec<JoinHandle<Result<(), String>>>,
    consumers: Vec<JoinHandle<Result<Vec<ReplicaEvent>, String>>>,
}

impl Load {
    fn start(
        endpoints: &[String],
        hub: &'static str,
        partitions: u32,
        producers: u64,
        target: fn(&mut StdRng) -> SendTarget,
        rng: &mut StdRng,
    ) -> Load {
        let ledger = Arc::new(Mutex::new(Ledger {
            acked_per_partition: vec![0; partitions as usize],
            ..Ledger::default()
        }));
        let (stop, stopped) = watch::channel(false);
        let producers = (0..producers)
            .map(|id| {
                tokio::spawn(produce(
                    endpoints.to_vec(),
                    hub,
                    id,
                    rng.random(),
                    target,
                    ledger.clone(),
                    stopped.clone(),
                ))
            })
            .collect();
        let consumers = (0..partitions)
            .map(|p| {
                tokio::spawn(consume(
                    endpoints.to_vec(),
                    hub,
                    p as usize,
                    stopped.clone(),
                ))
            })
            .collect();
        Load {
            ledger,
            stop,
            producers,
            consumers,
        }
    }

    fn acked_total(&self) -> u64 {
        self.acked_per_partition().iter().sum()
    }

    fn acked_per_partition(&self) -> Vec<u64> {
        self.ledger.lock().unwrap().acked_per_partition.clone()
    }

    /// Failed sends so far, and why the latest failed.
    fn failures(&self) -> String {
        let ledger = self.ledger.lock().unwrap();
        match ledger.failed_sends {
            0 => "no send failed so far".to_owned(),
            n => format!(
                "{n} sends failed so far (the latest: {})",
                ledger.last_failure
            ),
        }
    }

    /// Waits until `count` more events are acknowledged.
    async fn wait_for_acks(&self, count: u64, when: &str) {
        let target = self.acked_total() + count;
        wait_for(
            &format!("{count} acknowledged events {when}"),
            move || async move {
                let acked = self.acked_total();
                if acked >= target {
                    Ok(())
                } else {
                    Err(format!("{acked} of {target} acknowledged"))
                }
            },
        )
        .await;
    }

    /// Waits until each of `partitions` has acknowledged another event.
    async fn wait_for_acks_to(&self, partitions: &[usize], when: &str) {
        let before = &self.acked_per_partition();
        wait_for(
            &format!("a new acknowledged event in partitions {partitions:?} {when}"),
            move || async move {
                let now = self.acked_per_partition();
                let waiting: Vec<usize> = partitions
                    .iter()
                    .copied()
                    .filter(|p| now[*p] <= before[*p])
                    .collect();
                if waiting.is_empty() {
                    Ok(())
                } else {
                    Err(format!("still waiting for partitions {waiting:?}"))
                }
            },
        )
        .await;
    }

    /// Stops producers and consumers and returns what they did; panics if one of them found
    /// a problem.
    async fn stop(self) -> Outcome {
        self.stop.send_replace(true);
        for producer in self.producers {
            let result = tokio::time::timeout(STOP_TIMEOUT, producer)
                .await
                .expect("producers stop")
                .expect("producer tasks do not panic");
            if let Err(problem) = result {
                panic!("a producer: {problem}");
            }
        }
        let mut seen = Vec::new();
        for (partition, consumer) in self.consumers.into_iter().enumerate() {
            let result = tokio::time::timeout(STOP_TIMEOUT, consumer)
                .await
                .expect("consumers stop")
                .expect("consumer tasks do not panic");
            match result {
                Ok(events) => seen.push(events),
                Err(problem) => panic!("the consumer of partition {partition}: {problem}"),
            }
        }
        let ledger = std::mem::take(&mut *self.ledger.lock().unwrap());
        Outcome {
            acks: ledger.acks,
            failed_sends: ledger.failed_sends,
            seen,
        }
    }
}

/// Sends batches of unique events until stopped, moving to another node after a failure. A
/// failed send counts as failed (it may or may not have been stored); only errors that
/// cannot come from a failover are problems.
async fn produce(
    endpoints: Vec<String>,
    hub: &'static str,
    producer: u64,
    seed: u64,
    target: fn(&mut StdRng) -> SendTarget,
    ledger: Arc<Mutex<Ledger>>,
    stopped: watch::Receiver<bool>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut node = producer as usize % endpoints.len();
    let mut client = connect(&endpoints[node]).await;
    let mut batch = 0u64;
    while !*stopped.borrow() {
        batch += 1;
        let target = target(&mut rng);
        let len = rng.random_range(1..=BATCH_EVENTS_MAX);
        let bodies: Vec<Vec<u8>> = (0..len)
            .map(|i| {
                let padding = "x".repeat(rng.random_range(0..32));
                format!("producer {producer} batch {batch} event {i} {padding}").into_bytes()
            })
            .collect();
        let key = match &target {
            SendTarget::PartitionKey(key) => Some(key.clone()),
            _ => None,
        };
        let events = bodies.iter().map(|b| EventData::from_body(b.clone()));
        let sender = client.producer();
        let sent = tokio::time::timeout(SEND_TIMEOUT, sender.send(hub, target, events));
        let error = match sent.await {
            Ok(Ok(reply)) => {
                let partition: usize = reply
                    .partition_id
                    .parse()
                    .map_err(|_| format!("reply names partition {:?}", reply.partition_id))?;
                if reply.offsets.len() != len || reply.first_sequence_number < 0 {
                    return Err(format!("a reply that does not fit its batch: {reply:?}"));
                }
                let mut ledger = ledger.lock().unwrap();
                ledger.acked_per_partition[partition] += len as u64;
                ledger.acks.push(Ack {
                    partition,
                    first_sequence: reply.first_sequence_number,
                    offsets: reply.offsets,
                    enqueued_time_ms: reply.enqueued_time_ms,
                    key,
                    bodies,
                });
                continue;
            }
            Ok(Err(error)) if error.is_transient() => error.to_string(),
            Ok(Err(error)) => return Err(format!("a send failed for good: {error}")),
            Err(_elapsed) => format!("no reply within {SEND_TIMEOUT:?}"),
        };
        {
            let mut ledger = ledger.lock().unwrap();
            ledger.failed_sends += 1;
            ledger.last_failure = error;
        }
        node = (node + 1) % endpoints.len();
        client = connect(&endpoints[node]).await;
        tokio::time::sleep(RETRY_PAUSE).await;
    }
    Ok(())
}

/// Reads one partition from the start until stopped, reconnecting (to the next node) after
/// a broken stream, and returns every event seen. Sequence numbers must arrive gap-free.
async fn consume(
    endpoints: Vec<String>,
    hub: &'static str,
    partition: usize,
    mut stopped: watch::Receiver<bool>,
) -> Result<Vec<ReplicaEvent>, String> {
    let partition_id = partition.to_string();
    let mut seen: Vec<ReplicaEvent> = Vec::new();
    let mut node = partition % endpoints.len();
    loop {
        let client = connect(&endpoints[node]).await;
        node = (node + 1) % endpoints.len();
        let position = EventPosition::SequenceNumber {
            sequence_number: seen.len() as i64,
            inclusive: true,
        };
        let reader = client.consumer();
        let opening = reader.receive(hub, "", &partition_id, position, RECEIVE_BATCH_EVENTS);
        let opened = tokio::select! {
            opened = tokio::time::timeout(SEND_TIMEOUT, opening) => opened,
            _ = stopped.wait_for(|stop| *stop) => return Ok(seen),
        };
        let mut stream = match opened {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) if !error.is_transient() => {
                return Err(format!(
                    "after seeing {} events, reading on from there failed: {error}",
                    seen.len()
                ));
            }
            Ok(Err(_)) | Err(_) => {
                tokio::time::sleep(RETRY_PAUSE).await;
                continue;
            }
        };
        loop {
            let next = tokio::select! {
                next = stream.next() => next,
                _ = stopped.wait_for(|stop| *stop) => return Ok(seen),
            };
            match next {
                Some(Ok(batch)) => {
                    for event in batch {
                        if event.sequence_number != seen.len() as i64 {
                            return Err(format!(
                                "expected sequence number {} next, got {event:?}",
                                seen.len()
                            ));
                        }
                        seen.push(as_listed(&event));
                    }
                }
                Some(Err(error)) if !error.is_transient() => {
                    return Err(format!(
                        "the stream failed after {} events: {error}",
                        seen.len()
                    ));
                }
                Some(Err(_)) | None => break,
            }
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// A received event as a replica listing shows it.
fn as_listed(event: &ReceivedEvent) -> ReplicaEvent {
    ReplicaEvent {
        sequence_number: event.sequence_number,
        offset: event.offset.clone(),
        enqueued_time_ms: event.enqueued_time_ms,
        partition_key: event.partition_key.clone().unwrap_or_default(),
        body_checksum: body_checksum(&event.body),
        body_bytes: u32::try_from(event.body.len()).unwrap(),
    }
}

async fn connect(endpoint: &str) -> Client {
    Client::connect(endpoint)
        .await
        .expect("node endpoints are valid")
        .with_retry_deadline(SEND_RETRY_DEADLINE)
}

/// Polls `check` until it gives a value; panics with its last complaint after
/// [`STEP_TIMEOUT`].
async fn wait_for<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + STEP_TIMEOUT;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(state) => assert!(
                Instant::now() < deadline,
                "waited {STEP_TIMEOUT:?} for {what}: {state}"
            ),
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// The partitions with the most events acknowledged between two counts, busiest first.
fn busiest_partitions(before: &[u64], now: &[u64]) -> Vec<usize> {
    let mut partitions: Vec<usize> = (0..now.len()).collect();
    partitions.sort_by_key(|p| (std::cmp::Reverse(now[*p] - before[*p]), *p));
    partitions.truncate(BUSIEST_PARTITIONS);
    partitions
}

/// The index of the node that leads most of `busiest` (then most partitions overall; then
/// the lowest id).
fn leading_most(leaders: &[u64], busiest: &[usize]) -> usize {
    let busy_led = |node: u64| busiest.iter().filter(|p| leaders[**p] == node).count();
    let all_led = |node: u64| leaders.iter().filter(|l| **l == node).count();
    let node = (1..=3u64)
        .max_by_key(|node| (busy_led(*node), all_led(*node), std::cmp::Reverse(*node)))
        .expect("three nodes");
    usize::try_from(node - 1).unwrap()
}

/// The leader of every partition of `hub`, in partition order, as the cluster status
/// (asked of a running node other than `skip`) reports it; waits until each has one.
async fn partition_leaders(cluster: &LocalCluster, hub: &str, skip: Option<usize>) -> Vec<u64> {
    wait_for(
        &format!("a leader for every partition of {hub}"),
        move || async move {
            let mut last = String::from("no running node to ask");
            for (i, node) in cluster.nodes.iter().enumerate() {
                if Some(i) == skip || node.pid().is_none() || node.is_paused() {
                    continue;
                }
                let status = match Client::connect(&node.endpoint())
                    .await
                    .unwrap()
                    .cluster_status()
                    .await
                {
                    Ok(status) => status,
                    Err(e) => {
                        last = e.to_string();
                        continue;
                    }
                };
                let mut leaders: BTreeMap<u32, u64> = BTreeMap::new();
                for p in status.partitions.iter().filter(|p| p.event_hub == hub) {
                    leaders.insert(p.partition_id.parse().unwrap(), p.leader);
                }
                if !leaders.is_empty() && leaders.values().all(|l| *l != 0) {
                    return Ok(leaders.into_values().collect());
                }
                last = format!("leaders {leaders:?}");
            }
            Err(last)
        },
    )
    .await
}

/// Waits until the restarted node's replica of every partition has applied at least what
/// the other replicas had when it came back; returns how many events that is in all.
async fn wait_caught_up(
    cluster: &LocalCluster,
    restarted: usize,
    hub: &str,
    partitions: u32,
) -> i64 {
    let mut targets = Vec::new();
    for p in 0..partitions {
        let mut target = 0;
        for (i, node) in cluster.nodes.iter().enumerate() {
            if i != restarted {
                let endpoint = &node.endpoint();
                let next = wait_for("the other replicas' progress", move || {
                    next_sequence(endpoint, hub, p)
                })
                .await;
                target = target.max(next);
            }
        }
        targets.push(target);
    }
    let endpoint = &cluster.nodes[restarted].endpoint();
    for (p, target) in (0..partitions).zip(&targets) {
        wait_for(
            &format!("the restarted node's replica of partition {p} to catch up to {target}"),
            move || async move {
                let next = next_sequence(endpoint, hub, p).await?;
                if next >= *target {
                    Ok(())
                } else {
                    Err(format!("at {next}"))
                }
            },
        )
        .await;
    }
    targets.iter().sum()
}

/// The sequence number the node's replica will give its next applied event.
async fn next_sequence(endpoint: &str, hub: &str, partition: u32) -> Result<i64, String> {
    let client = Client::connect(endpoint).await.map_err(|e| e.to_string())?;
    client
        .replica_events_page(hub, &partition.to_string(), i64::MAX, 1)
        .await
        .map(|page| page.next_sequence_number)
        .map_err(|e| e.to_string())
}

/// Once every replica of every partition has applied the same number of events: the
/// replicas are identical, gap-free from 0, every acknowledged event is where its ack said,
/// and every event a consumer saw is there. Returns a summary.
async fn verify(cluster: &LocalCluster, hub: &str, partitions: u32, outcome: &Outcome) -> String {
    let mut lists = Vec::new();
    for p in 0..partitions {
        lists.push(converged_replicas(cluster, hub, p).await);
    }
    for (p, events) in lists.iter().enumerate() {
        check_numbering(p, events);
    }
    for ack in &outcome.acks {
        let events = &lists[ack.partition];
        for (i, body) in ack.bodies.iter().enumerate() {
            let sequence = ack.first_sequence + i as i64;
            let expected = ReplicaEvent {
                sequence_number: sequence,
                offset: ack.offsets[i].clone(),
                enqueued_time_ms: ack.enqueued_time_ms,
                partition_key: ack.key.clone().unwrap_or_default(),
                body_checksum: body_checksum(body),
                body_bytes: u32::try_from(body.len()).unwrap(),
            };
            let found = usize::try_from(sequence).ok().and_then(|s| events.get(s));
            assert_eq!(
                found,
                Some(&expected),
                "partition {}: acknowledged event {i} of batch {ack:?} is not where its ack put it",
                ack.partition
            );
        }
    }
    let mut seen_total = 0;
    for (p, seen) in outcome.seen.iter().enumerate() {
        seen_total += seen.len();
        assert!(
            seen.len() <= lists[p].len(),
            "partition {p}: a consumer saw {} events, the replicas hold {}",
            seen.len(),
            lists[p].len()
        );
        if let Some(i) = (0..seen.len()).find(|i| seen[*i] != lists[p][*i]) {
            panic!(
                "partition {p}: a consumer saw {:?}, the replicas now hold {:?} there",
                seen[i], lists[p][i]
            );
        }
    }
    let stored: usize = lists.iter().map(Vec::len).sum();
    let acked: usize = outcome.acks.iter().map(|a| a.bodies.len()).sum();
    format!(
        "{hub}: {stored} events stored in {partitions} partitions, identical on all 3 replicas; \
         {acked} acknowledged events all in place; consumers saw {seen_total}, all still there"
    )
}

/// Lists the partition on every node until all replicas have applied the same events and
/// returns that list. A replica may lag behind; replicas that disagree on an event are a
/// failure at once.
async fn converged_replicas(
    cluster: &LocalCluster,
    hub: &str,
    partition: u32,
) -> Vec<ReplicaEvent> {
    let partition_id = &partition.to_string();
    wait_for(
        &format!("the replicas of {hub}/{partition} to converge"),
        move || async move {
            let mut lists = Vec::new();
            for node in &cluster.nodes {
                let client = Client::connect(&node.endpoint()).await.unwrap();
                let listing = client
                    .replica_events(hub, partition_id, 0, None)
                    .await
                    .map_err(|e| format!("listing on {}: {e}", node.endpoint()))?;
                lists.push((listing.node, listing.events));
            }
            let (longest_node, longest) = lists
                .iter()
                .max_by_key(|(_, events)| events.len())
                .expect("three replicas");
            for (node, events) in &lists {
                if let Some(i) = (0..events.len()).find(|i| events[*i] != longest[*i]) {
                    panic!(
                        "{hub}/{partition}: replicas disagree at sequence number {i}: node {node} \
                     holds {:?}, node {longest_node} holds {:?}",
                        events[i], longest[i]
                    );
                }
            }
            let lengths: Vec<(u64, usize)> = lists.iter().map(|(n, e)| (*n, e.len())).collect();
            if lengths.iter().all(|(_, len)| *len == longest.len()) {
                Ok(longest.clone())
            } else {
                Err(format!("events per node: {lengths:?}"))
            }
        },
    )
    .await
}

/// Sequence numbers 0, 1, 2, ... without gaps; offsets grow; enqueued times never decrease.
fn check_numbering(partition: usize, events: &[ReplicaEvent]) {
    for (i, pair) in events.windows(2).enumerate() {
        let (a, b) = (&pair[0], &pair[1]);
        let offset = |e: &ReplicaEvent| e.offset.parse::<i64>().unwrap();
        assert!(
            offset(b) > offset(a) && b.enqueued_time_ms >= a.enqueued_time_ms,
            "partition {partition}: event {} does not follow event {i}: {a:?} then {b:?}",
            i + 1
        );
    }
    for (i, event) in events.iter().enumerate() {
        assert_eq!(
            event.sequence_number, i as i64,
            "partition {partition}: sequence numbers are not gap-free from 0"
        );
    }
}

fn assert_all_running(cluster: &mut LocalCluster) {
    for node in &mut cluster.nodes {
        NodeProcess::assert_running(node);
    }
}
