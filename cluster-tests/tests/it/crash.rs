//! Crash safety: SIGKILL the node at seeded random moments while producers send, restart
//! it, and check that every acknowledged batch survived with the numbers it was given, that
//! every batch is all-or-nothing, and that numbering continues without gaps or duplicates.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt as _;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom as _;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;
use tributary_client::{
    Client, ErrorReason, EventData, EventPosition, PartitionProperties, ReceivedEvent,
    SendResponse, SendTarget,
};
use tributary_cluster_tests::{NodeProcess, TestDir, test_seed};

const HUB: &str = "crash";
const PARTITIONS: u32 = 2;
/// Crash points: one SIGKILL per round.
const ROUNDS: u32 = 24;
const PRODUCERS_PER_ROUND: u32 = 4;
/// Producer ids are `round * PRODUCER_IDS_PER_ROUND + n`; the last one of each round sends
/// the batches that check numbering continues after the restart.
const PRODUCER_IDS_PER_ROUND: u32 = 1000;
const CONTINUATION_PRODUCER: u32 = PRODUCER_IDS_PER_ROUND - 1;
const BATCH_EVENTS_MAX: usize = 10;
/// Bounds each producer's loop; far above what fits before the kill.
const BATCHES_PER_PRODUCER_MAX: u32 = 100_000;
/// Random extra body bytes, so offsets (byte positions) vary between events.
const BODY_PADDING_BYTES_MAX: usize = 48;
/// When the kill comes, counted from the start of the round's producers.
const KILL_DELAY_MS_MIN: u64 = 20;
const KILL_DELAY_MS_MAX: u64 = 300;
/// Acknowledged batches per round that are also read back from their own sequence number.
const SAMPLED_READS_PER_ROUND_MAX: usize = 16;
/// The longest pause after a SERVER_BUSY reply (the node's retry-after, capped).
const BUSY_PAUSE_MAX: Duration = Duration::from_millis(500);
/// Sends of the batch that checks numbering continues, while the node answers SERVER_BUSY.
const CONTINUATION_ATTEMPTS_MAX: u32 = 20;
/// How long reading a range of events, or producers noticing the kill, may take.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
const PRODUCERS_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Events asked for per receive response.
const RECEIVE_BATCH_EVENTS: u32 = 300;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct BatchId {
    producer: u32,
    batch: u32,
}

/// A batch as sent.
#[derive(Debug, Clone)]
struct Batch {
    partition: String,
    bodies: Vec<Bytes>,
}

/// Every batch ever attempted and the replies to those that were acknowledged.
#[derive(Default)]
struct History {
    batches: HashMap<BatchId, Batch>,
    /// Which batch and index each body belongs to (bodies are unique).
    body_owner: HashMap<Bytes, (BatchId, usize)>,
    acks: HashMap<BatchId, SendResponse>,
    /// Sends refused with SERVER_BUSY.
    busy_replies: usize,
    /// Whether an unacknowledged batch was found after the crash that interrupted it; it
    /// must stay that way after every later crash.
    unacked_outcome: HashMap<BatchId, bool>,
}

impl History {
    fn attempt(&mut self, id: BatchId, batch: Batch) {
        for (index, body) in batch.bodies.iter().enumerate() {
            let previous = self.body_owner.insert(body.clone(), (id, index));
            assert!(previous.is_none(), "bodies are unique");
        }
        let previous = self.batches.insert(id, batch);
        assert!(previous.is_none(), "batch ids are unique");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_safety_under_sigkill() {
    let seed = test_seed("crash_safety_under_sigkill");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = TestDir::new("crash_safety_under_sigkill");
    let mut node = NodeProcess::start(&dir.path().join("node")).await;
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client
        .create_event_hub(HUB, PARTITIONS, None)
        .await
        .unwrap();
    let history = Arc::new(Mutex::new(History::default()));
    let started = Instant::now();

    for round in 0..ROUNDS {
        // Producers see the kill as an error at once instead of retrying into the restart:
        // the test accounts for every batch in flight at the crash itself.
        let client = Client::connect(&node.endpoint())
            .await
            .unwrap()
            .with_retry_deadline(Duration::ZERO);
        let killed = Arc::new(AtomicBool::new(false));
        let producers: Vec<_> = (0..PRODUCERS_PER_ROUND)
            .map(|p| {
                tokio::spawn(produce(
                    client.clone(),
                    round * PRODUCER_IDS_PER_ROUND + p,
                    rng.random(),
                    killed.clone(),
                    history.clone(),
                ))
            })
            .collect();
        // The crash point is the test's input: a seeded delay, not a condition to await.
        let delay_ms = rng.random_range(KILL_DELAY_MS_MIN..=KILL_DELAY_MS_MAX);
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        killed.store(true, Ordering::SeqCst);
        // Panics with the log if the node had already exited (then producers failed too).
        node.kill9().await;
        for producer in producers {
            let outcome = tokio::time::timeout(PRODUCERS_STOP_TIMEOUT, producer)
                .await
                .expect("producers notice the kill")
                .expect("producer task does not panic");
            if let Err(problem) = outcome {
                panic!("round {round} (seed {seed}): {problem}");
            }
        }

        node.restart().await;
        let client = Client::connect(&node.endpoint()).await.unwrap();
        let report = match verify(&client, &history, round, &mut rng).await {
            Ok(report) => report,
            Err(problem) => {
                node.assert_running();
                panic!("round {round} (seed {seed}): {problem}");
            }
        };
        eprintln!(
            "round {round}: killed after {delay_ms} ms; {report}; {:.1}s so far",
            started.elapsed().as_secs_f64()
        );
        // Numbering continues right after the recovered events.
        if let Err(problem) = continue_numbering(&client, &history, round).await {
            node.assert_running();
            panic!("round {round} (seed {seed}): {problem}");
        }
    }
}

/// Sends batches of 1..=10 events to random partitions until a send fails after the kill.
/// A failure before the kill is an error.
async fn produce(
    client: Client,
    producer: u32,
    seed: u64,
    killed: Arc<AtomicBool>,
    history: Arc<Mutex<History>>,
) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let sender = client.producer();
    for batch in 0..BATCHES_PER_PRODUCER_MAX {
        let id = BatchId { producer, batch };
        let partition = rng.random_range(0..PARTITIONS).to_string();
        let len = rng.random_range(1..=BATCH_EVENTS_MAX);
        let bodies: Vec<Bytes> = (0..len)
            .map(|index| event_body(id, index, len, rng.random_range(0..=BODY_PADDING_BYTES_MAX)))
            .collect();
        history.lock().unwrap().attempt(
            id,
            Batch {
                partition: partition.clone(),
                bodies: bodies.clone(),
            },
        );
        let events = bodies.into_iter().map(EventData::from_body);
        match sender
            .send(HUB, SendTarget::PartitionId(partition.clone()), events)
            .await
        {
            Ok(response) => {
                if response.partition_id != partition
                    || response.offsets.len() != len
                    || response.first_sequence_number < 0
                {
                    return Err(format!(
                        "batch {id:?} of {len} events to partition {partition} got {response:?}"
                    ));
                }
                history.lock().unwrap().acks.insert(id, response);
            }
            Err(_) if killed.load(Ordering::SeqCst) => return Ok(()),
            Err(error) if error.reason() == Some(ErrorReason::ServerBusy) => {
                // An operating condition, not a crash-safety failure: the batch stays
                // unacknowledged (present or absent are both allowed) and the producer goes
                // on after the pause the node asked for.
                history.lock().unwrap().busy_replies += 1;
                let pause = error
                    .retry_after()
                    .unwrap_or(BUSY_PAUSE_MAX)
                    .min(BUSY_PAUSE_MAX);
                tokio::time::sleep(pause).await;
            }
            Err(error) => {
                return Err(format!("batch {id:?} failed before the kill: {error}"));
            }
        }
    }
    Err(format!(
        "producer {producer} sent {BATCHES_PER_PRODUCER_MAX} batches without being stopped"
    ))
}

/// Unique, self-describing, of varying length.
fn event_body(id: BatchId, index: usize, len: usize, padding: usize) -> Bytes {
    let mut body = format!("p{}-b{}-e{index}-of{len}-", id.producer, id.batch).into_bytes();
    body.resize(body.len() + padding, b'.');
    body.into()
}

/// Reads every partition from the start and checks it against the history: gap-free
/// numbering, growing offsets, non-decreasing times, whole batches only, every acknowledged
/// batch where its reply said. Then reads some of this round's acknowledged batches from
/// their own sequence number. Returns a summary.
async fn verify(
    client: &Client,
    history: &Arc<Mutex<History>>,
    round: u32,
    rng: &mut StdRng,
) -> Result<String, String> {
    let before = all_partition_properties(client).await?;
    let mut partitions = Vec::new();
    for properties in &before {
        let partition = properties.partition_id.clone();
        if properties.begin_sequence_number != 0 {
            return Err(format!(
                "partition {partition} lost its start: {properties:?}"
            ));
        }
        let count = usize::try_from(properties.last_enqueued_sequence_number + 1)
            .map_err(|_| format!("bad properties {properties:?}"))?;
        let events = read(client, &partition, EventPosition::Earliest, count).await?;
        if let Some(last) = events.last()
            && (last.offset != properties.last_enqueued_offset
                || last.enqueued_time_ms != properties.last_enqueued_time_ms)
        {
            return Err(format!(
                "partition {partition}: last event {last:?} disagrees with {properties:?}"
            ));
        }
        partitions.push((partition, events));
    }
    // Nothing sends now, so the partitions must not change. If they do, the node said it was
    // ready (and served reads) before applying everything committed before the crash; the
    // checks below would then blame individual batches.
    let after = all_partition_properties(client).await?;
    let last_numbers = |all: &[PartitionProperties]| -> Vec<i64> {
        all.iter()
            .map(|p| p.last_enqueued_sequence_number)
            .collect()
    };
    let (before, after) = (last_numbers(&before), last_numbers(&after));
    if after != before {
        return Err(format!(
            "without any send, the partitions' last sequence numbers went from {before:?} \
             right after /readyz answered 200 to {after:?}: the node served reads before it \
             had applied every entry committed before the crash"
        ));
    }

    let checked = check_history(&mut history.lock().unwrap(), &partitions, round)?;
    let sampled: Vec<_> = checked
        .this_round
        .choose_multiple(rng, SAMPLED_READS_PER_ROUND_MAX)
        .collect();
    for (id, response, batch) in &sampled {
        let position = EventPosition::SequenceNumber {
            sequence_number: response.first_sequence_number,
            inclusive: true,
        };
        let events = read(client, &batch.partition, position, batch.bodies.len()).await?;
        check_acknowledged(*id, response, batch, &events)?;
    }

    let sizes: Vec<String> = partitions
        .iter()
        .map(|(p, events)| format!("partition {p}: {} events", events.len()))
        .collect();
    Ok(format!(
        "{} batches acknowledged this round ({} in all, {} read back by sequence number), \
         unacknowledged (in flight at the kill, or refused busy: {} so far): {} recovered, \
         {} lost; {}",
        checked.this_round.len(),
        checked.acked,
        sampled.len(),
        checked.busy_replies,
        checked.kept,
        checked.lost,
        sizes.join(", ")
    ))
}

/// What [`check_history`] found.
struct Checked {
    /// Acknowledged batches, all present.
    acked: usize,
    /// Batches unacknowledged this round that were recovered, and that were lost.
    kept: usize,
    lost: usize,
    /// SERVER_BUSY replies so far.
    busy_replies: usize,
    /// This round's acknowledged batches.
    this_round: Vec<(BatchId, SendResponse, Batch)>,
}

/// Checks the partitions, read from the start, against everything ever sent: see
/// [`check_partition`]; every acknowledged batch is present, and every unacknowledged batch
/// stays present or absent as it was after the crash that interrupted it.
fn check_history(
    history: &mut History,
    partitions: &[(String, Vec<ReceivedEvent>)],
    round: u32,
) -> Result<Checked, String> {
    let mut present = HashMap::new();
    for (partition, events) in partitions {
        check_partition(partition, events, history, &mut present)?;
    }
    if let Some((id, response)) = history
        .acks
        .iter()
        .find(|(id, _)| !present.contains_key(id))
    {
        return Err(format!(
            "acknowledged batch {id:?} ({response:?}) is missing"
        ));
    }
    let (mut kept, mut lost) = (0, 0);
    let unacked: Vec<BatchId> = history
        .batches
        .keys()
        .filter(|id| !history.acks.contains_key(id))
        .copied()
        .collect();
    for id in unacked {
        let found = present.contains_key(&id);
        match history.unacked_outcome.get(&id) {
            Some(&before) if before != found => {
                let now = match present.get(&id) {
                    Some((partition, seq)) => {
                        format!("present in partition {partition} from sequence number {seq}")
                    }
                    None => "absent".to_owned(),
                };
                return Err(format!(
                    "unacknowledged batch {id:?} was {} after the crash that interrupted it, \
                     now {now}; the partitions now:\n{}",
                    if before { "present" } else { "absent" },
                    describe_partitions(partitions, history),
                ));
            }
            Some(_) => {}
            None => {
                history.unacked_outcome.insert(id, found);
                if found {
                    kept += 1;
                } else {
                    lost += 1;
                }
            }
        }
    }
    let mut this_round: Vec<_> = history
        .acks
        .iter()
        .filter(|(id, _)| id.producer / PRODUCER_IDS_PER_ROUND == round)
        .map(|(id, response)| (*id, response.clone(), history.batches[id].clone()))
        .collect();
    // In id order, so the seeded sample does not depend on hash order.
    this_round.sort_by_key(|(id, _, _)| *id);
    Ok(Checked {
        acked: history.acks.len(),
        kept,
        lost,
        busy_replies: history.busy_replies,
        this_round,
    })
}

/// The properties of every partition, in partition order. Only called once the node said it
/// was ready, so a refusal is an error too.
async fn all_partition_properties(client: &Client) -> Result<Vec<PartitionProperties>, String> {
    let mut all = Vec::new();
    for p in 0..PARTITIONS {
        let properties = client
            .get_partition_properties(HUB, &p.to_string())
            .await
            .map_err(|e| format!("partition {p} properties (after /readyz answered 200): {e}"))?;
        all.push(properties);
    }
    Ok(all)
}

/// The batches of each partition in order, one line each, for failure messages.
fn describe_partitions(partitions: &[(String, Vec<ReceivedEvent>)], history: &History) -> String {
    let mut text = String::new();
    for (partition, events) in partitions {
        let mut previous = None;
        for event in events {
            let owner = history.body_owner.get(&event.body).map(|(id, _)| *id);
            if owner != previous {
                let acked = owner.and_then(|id| history.acks.get(&id));
                text.push_str(&format!(
                    "  partition {partition} seq {} enqueued {}: {}{}\n",
                    event.sequence_number,
                    event.enqueued_time_ms,
                    owner.map_or_else(|| "unknown".to_owned(), |id| format!("{id:?}")),
                    acked.map_or_else(
                        || " (unacknowledged)".to_owned(),
                        |r| format!(" (acknowledged at seq {})", r.first_sequence_number)
                    ),
                ));
            }
            previous = owner;
        }
    }
    text
}

/// One partition read from the start: numbering, offsets, times, and whole batches.
fn check_partition(
    partition: &str,
    events: &[ReceivedEvent],
    history: &History,
    present: &mut HashMap<BatchId, (String, i64)>,
) -> Result<(), String> {
    let mut i = 0;
    let mut previous: Option<&ReceivedEvent> = None;
    for (position, event) in events.iter().enumerate() {
        let here = || format!("partition {partition}, event {event:?}");
        if event.sequence_number != position as i64 {
            return Err(format!("{}: expected sequence number {position}", here()));
        }
        let offset: i64 = event
            .offset
            .parse()
            .map_err(|_| format!("{}: offset is not a number", here()))?;
        if let Some(previous) = previous {
            let previous_offset: i64 = previous.offset.parse().unwrap_or(i64::MAX);
            if offset <= previous_offset {
                return Err(format!(
                    "{}: offset does not grow after {previous:?}",
                    here()
                ));
            }
            if event.enqueued_time_ms < previous.enqueued_time_ms {
                return Err(format!(
                    "{}: enqueued time decreases after {previous:?}",
                    here()
                ));
            }
        } else if offset != 0 {
            return Err(format!("{}: the first offset is not 0", here()));
        }
        previous = Some(event);
    }

    // Whole batches, each once, each in the partition it was sent to.
    while i < events.len() {
        let event = &events[i];
        let Some(&(id, index)) = history.body_owner.get(&event.body) else {
            return Err(format!("partition {partition}: unknown event {event:?}"));
        };
        let batch = &history.batches[&id];
        if index != 0 {
            return Err(format!(
                "partition {partition}: batch {id:?} starts at its event {index} (seq {})",
                event.sequence_number
            ));
        }
        if batch.partition != partition {
            return Err(format!(
                "batch {id:?} sent to partition {} found in partition {partition}",
                batch.partition
            ));
        }
        if present
            .insert(id, (partition.to_owned(), event.sequence_number))
            .is_some()
        {
            return Err(format!(
                "partition {partition}: batch {id:?} appears twice (again at seq {})",
                event.sequence_number
            ));
        }
        let run = events
            .get(i..i + batch.bodies.len())
            .unwrap_or(&events[i..]);
        let bodies: Vec<&Bytes> = run.iter().map(|e| &e.body).collect();
        if bodies != batch.bodies.iter().collect::<Vec<_>>() {
            return Err(format!(
                "partition {partition}: batch {id:?} of {} events is not whole and contiguous \
                 from seq {}: found {bodies:?}",
                batch.bodies.len(),
                event.sequence_number
            ));
        }
        if let Some(response) = history.acks.get(&id) {
            check_acknowledged(id, response, batch, run)?;
        }
        i += batch.bodies.len();
    }
    Ok(())
}

/// `events` are exactly the acknowledged batch, with the numbers its reply gave.
fn check_acknowledged(
    id: BatchId,
    response: &SendResponse,
    batch: &Batch,
    events: &[ReceivedEvent],
) -> Result<(), String> {
    let matches = events.len() == batch.bodies.len()
        && events.iter().enumerate().all(|(i, event)| {
            event.body == batch.bodies[i]
                && event.sequence_number == response.first_sequence_number + i as i64
                && event.offset == response.offsets[i]
                && event.enqueued_time_ms == response.enqueued_time_ms
        });
    if matches {
        Ok(())
    } else {
        Err(format!(
            "acknowledged batch {id:?} to partition {} replied {response:?} but reads back as \
             {events:?}",
            batch.partition
        ))
    }
}

/// One more batch per partition gets the next sequence number after the recovered events.
async fn continue_numbering(
    client: &Client,
    history: &Arc<Mutex<History>>,
    round: u32,
) -> Result<(), String> {
    for p in 0..PARTITIONS {
        let partition = p.to_string();
        let mut attempt = 0;
        let (id, properties, response) = loop {
            let properties = client
                .get_partition_properties(HUB, &partition)
                .await
                .map_err(|e| format!("partition {partition} properties: {e}"))?;
            // A fresh batch per attempt keeps every body unique.
            let id = BatchId {
                producer: round * PRODUCER_IDS_PER_ROUND + CONTINUATION_PRODUCER,
                batch: attempt * PARTITIONS + p,
            };
            let bodies = vec![event_body(id, 0, 1, 0)];
            history.lock().unwrap().attempt(
                id,
                Batch {
                    partition: partition.clone(),
                    bodies: bodies.clone(),
                },
            );
            let events = bodies.into_iter().map(EventData::from_body);
            match client
                .producer()
                .send(HUB, SendTarget::PartitionId(partition.clone()), events)
                .await
            {
                Ok(response) => break (id, properties, response),
                Err(error)
                    if error.reason() == Some(ErrorReason::ServerBusy)
                        && attempt + 1 < CONTINUATION_ATTEMPTS_MAX =>
                {
                    history.lock().unwrap().busy_replies += 1;
                    let pause = error
                        .retry_after()
                        .unwrap_or(BUSY_PAUSE_MAX)
                        .min(BUSY_PAUSE_MAX);
                    tokio::time::sleep(pause).await;
                    attempt += 1;
                }
                Err(error) => {
                    return Err(format!(
                        "send after the restart to partition {partition}: {error}"
                    ));
                }
            }
        };
        let expected = properties.last_enqueued_sequence_number + 1;
        if response.first_sequence_number != expected {
            return Err(format!(
                "partition {partition}: after the restart the next send got sequence number {}, \
                 expected {expected}",
                response.first_sequence_number
            ));
        }
        if response.enqueued_time_ms < properties.last_enqueued_time_ms {
            return Err(format!(
                "partition {partition}: enqueued time went back after the restart: {} < {}",
                response.enqueued_time_ms, properties.last_enqueued_time_ms
            ));
        }
        history.lock().unwrap().acks.insert(id, response);
    }
    Ok(())
}

/// Exactly `count` events from `position`.
async fn read(
    client: &Client,
    partition: &str,
    position: EventPosition,
    count: usize,
) -> Result<Vec<ReceivedEvent>, String> {
    let mut events = Vec::with_capacity(count);
    if count == 0 {
        return Ok(events);
    }
    let reading = async {
        let mut stream = client
            .consumer()
            .receive(HUB, "", partition, position, RECEIVE_BATCH_EVENTS)
            .await
            .map_err(|e| format!("receive from partition {partition} at {position}: {e}"))?;
        while events.len() < count {
            match stream.next().await {
                Some(Ok(batch)) => events.extend(batch),
                Some(Err(e)) => {
                    return Err(format!(
                        "receive from partition {partition} at {position}: {e}"
                    ));
                }
                None => break,
            }
        }
        Ok(())
    };
    match tokio::time::timeout(READ_TIMEOUT, reading).await {
        Ok(result) => result?,
        Err(_elapsed) => {}
    }
    if events.len() < count {
        return Err(format!(
            "partition {partition} from {position}: read {} of {count} events within {READ_TIMEOUT:?}",
            events.len()
        ));
    }
    events.truncate(count);
    Ok(events)
}
