//! Continuous load for cluster tests: producers sending unique events and one consumer per
//! partition, with a ledger of every acknowledgement; and the check afterwards that every
//! replica of every partition holds the identical, gap-free events, every acknowledged
//! event where its ack put it and everything a consumer saw.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tributary_client::{
    Client, EventData, EventPosition, ReceivedEvent, ReplicaEvent, SendTarget, body_checksum,
};
use tributary_cluster_tests::{LocalCluster, eventually};

/// Events per batch at most.
const BATCH_EVENTS_MAX: usize = 4;
/// How long one send may take, retries included, before the producer gives up on it and
/// tries another node (a frozen node never answers).
const SEND_TIMEOUT: Duration = Duration::from_secs(4);
/// How long the SDK keeps retrying a send inside [`SEND_TIMEOUT`].
const SEND_RETRY_DEADLINE: Duration = Duration::from_secs(3);
/// Before a producer or consumer tries again after a failure.
const RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Events per receive response.
const RECEIVE_BATCH_EVENTS: u32 = 300;
/// Waiting for acknowledgements, a leader, a catch-up or converged replicas.
pub(crate) const STEP_TIMEOUT: Duration = Duration::from_secs(60);
/// Producers and consumers stop this long after being told to at most.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// An acknowledged batch, as its reply described it.
#[derive(Debug, Clone)]
pub(crate) struct Ack {
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
pub(crate) struct Outcome {
    pub(crate) acks: Vec<Ack>,
    pub(crate) failed_sends: u64,
    /// Per partition, what its consumer saw, in order.
    pub(crate) seen: Vec<Vec<ReplicaEvent>>,
}

/// Producers sending continuously and one consumer per partition, until stopped.
pub(crate) struct Load {
    ledger: Arc<Mutex<Ledger>>,
    stop: watch::Sender<bool>,
    producers: Vec<JoinHandle<Result<(), String>>>,
    consumers: Vec<JoinHandle<Result<Vec<ReplicaEvent>, String>>>,
}

impl Load {
    pub(crate) fn start(
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

    pub(crate) fn acked_total(&self) -> u64 {
        self.acked_per_partition().iter().sum()
    }

    pub(crate) fn acked_per_partition(&self) -> Vec<u64> {
        self.ledger.lock().unwrap().acked_per_partition.clone()
    }

    /// Failed sends so far, and why the latest failed.
    pub(crate) fn failures(&self) -> String {
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
    pub(crate) async fn wait_for_acks(&self, count: u64, when: &str) {
        let target = self.acked_total() + count;
        eventually(
            STEP_TIMEOUT,
            format!("{count} acknowledged events {when}"),
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
    pub(crate) async fn wait_for_acks_to(&self, partitions: &[usize], when: &str) {
        let before = &self.acked_per_partition();
        eventually(
            STEP_TIMEOUT,
            format!("a new acknowledged event in partitions {partitions:?} {when}"),
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
    pub(crate) async fn stop(self) -> Outcome {
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

pub(crate) async fn connect(endpoint: &str) -> Client {
    Client::connect(endpoint)
        .await
        .expect("node endpoints are valid")
        .with_retry_deadline(SEND_RETRY_DEADLINE)
}

/// Once every replica of every partition has applied the same number of events: the
/// replicas are identical, gap-free from 0, every acknowledged event is where its ack said,
/// and every event a consumer saw is there. Returns a summary.
pub(crate) async fn verify(
    cluster: &LocalCluster,
    hub: &str,
    partitions: u32,
    outcome: &Outcome,
) -> String {
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
        "{hub}: {stored} events stored in {partitions} partitions, identical on all replicas; \
         {acked} acknowledged events all in place; consumers saw {seen_total}, all still there"
    )
}

/// The nodes holding a replica of `hub`/`partition`, as the cluster status (asked of a
/// running node) says, once no replica of it is moving.
async fn replica_nodes(
    cluster: &LocalCluster,
    hub: &str,
    partition: u32,
) -> Result<Vec<u64>, String> {
    let node = cluster
        .nodes
        .iter()
        .find(|n| n.pid().is_some() && !n.is_paused())
        .ok_or("no running node to ask")?;
    let status = Client::connect(&node.endpoint())
        .await
        .map_err(|e| e.to_string())?
        .cluster_status()
        .await
        .map_err(|e| e.to_string())?;
    let id = partition.to_string();
    if status
        .moves
        .iter()
        .any(|m| m.event_hub == hub && m.partition_id == id)
    {
        return Err(format!("a replica of {hub}/{partition} is still moving"));
    }
    status
        .partitions
        .iter()
        .find(|p| p.event_hub == hub && p.partition_id == id)
        .map(|p| p.replicas.iter().map(|r| r.node).collect())
        .ok_or_else(|| format!("{hub}/{partition} is not in the cluster status"))
}

/// Lists the partition on every node holding a replica until all replicas have applied the same events and
/// returns that list. A replica may lag behind; replicas that disagree on an event are a
/// failure at once.
pub(crate) async fn converged_replicas(
    cluster: &LocalCluster,
    hub: &str,
    partition: u32,
) -> Vec<ReplicaEvent> {
    let partition_id = &partition.to_string();
    eventually(
        STEP_TIMEOUT,
        format!("the replicas of {hub}/{partition} converged"),
        move || async move {
            let holders = replica_nodes(cluster, hub, partition).await?;
            let mut lists = Vec::new();
            for node in holders.iter().map(|id| &cluster.nodes[*id as usize - 1]) {
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
pub(crate) fn check_numbering(partition: usize, events: &[ReplicaEvent]) {
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
