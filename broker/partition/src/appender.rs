//! Leader-side batching. Sends to one partition queue here; a loop proposes them as Raft
//! entries, at most [`ENTRIES_IN_FLIGHT`] uncommitted at a time. Sends that arrive while
//! that many are in flight wait, and the next entry carries all of them (up to
//! [`ENTRY_BYTES_MAX`]): under load a partition writes few large entries instead of many
//! small ones, and an idle one proposes each send at once.
//!
//! Each send stays atomic and keeps its own numbers: its events are one contiguous run of the
//! entry, so its sequence numbers and offsets follow from the entry's first ones and the
//! sends before it. Sends are proposed in the order they queued. An idempotent producer's
//! send (Event Hubs' or Kafka's) is proposed alone, since its stamp covers the whole entry:
//! the state machine then decides on that one send (store it, answer a retry with its
//! original numbers, or refuse it), and the reply of the entry is the send's own. (Merging
//! them would need entries whose refused parts stay unread: the index maps each entry's
//! events to one contiguous run of sequence numbers.)

use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot};
use tributary_raft::openraft_api::ClientWriteError;
use tributary_raft::{
    AppendBatch, AppendOutcome, Hibernation, Producer, Proposal, ProposalResult, Raft,
};
use tributary_types::{Clock, MonotonicStamp, SendStage};

use crate::group::GroupStateMachine;

/// Entries of one partition proposed and not yet applied, at most.
pub const ENTRIES_IN_FLIGHT: usize = 2;
/// Bytes of merged sends in one entry at most (a single larger send is proposed alone).
pub const ENTRY_BYTES_MAX: usize = 1024 * 1024;
/// Sends queued for the loop at most; the partition's own limit on waiting sends is lower.
const QUEUE_MAX: usize = 8192;

/// One send's events, encoded as the entry stores them.
pub struct Part {
    pub events: Bytes,
    pub event_count: u32,
    pub producer: Option<Producer>,
    /// When the send reached the partition (its `appender_wait` stage starts).
    pub since: Instant,
}

/// A send's share of its entry's result, and when that result reached the appender (the
/// send's `reply` stage starts).
pub type Answer = Result<(ProposalResult, Instant), Failure>;

/// Why a send's entry did not commit. Shared by every send of the entry, so it is cloneable.
#[derive(Debug, Clone)]
pub enum Failure {
    /// The replica is not the leader; the member id of the one it knows, if any.
    ForwardToLeader(Option<u64>),
    /// The replica stopped (it moved to another node, or the node is shutting down) before
    /// the entry was applied here: it may still be committed by the other replicas.
    Stopped,
    /// The partition failed.
    Other(String),
}

struct Queued {
    part: Part,
    reply: oneshot::Sender<Answer>,
}

/// The queue of one partition's sends; the loop ends when this is dropped.
pub struct Appender {
    tx: mpsc::Sender<Queued>,
}

impl Appender {
    /// Starts the loop proposing to `raft`, stamping each entry's enqueued time from
    /// `clock` through `stamp` (never decreasing). A sleeping group is woken (its timers
    /// restarted) before each proposal.
    pub fn start(
        raft: Raft<GroupStateMachine>,
        hibernation: Hibernation,
        stamp: Arc<Mutex<MonotonicStamp>>,
        clock: Arc<dyn Clock>,
    ) -> Appender {
        let (tx, rx) = mpsc::channel(QUEUE_MAX);
        tokio::spawn(run(raft, hibernation, rx, stamp, clock));
        Appender { tx }
    }

    /// Proposes `part` (merged with others into one entry) and waits for its entry to be
    /// applied. The result is the part's own: an `Appended` outcome names its first
    /// sequence number and offset.
    pub async fn append(&self, part: Part) -> Answer {
        let (reply, result) = oneshot::channel();
        self.tx
            .send(Queued { part, reply })
            .await
            .map_err(|_| Failure::Other("the partition is closed".into()))?;
        result
            .await
            .map_err(|_| Failure::Other("the partition closed before the send committed".into()))?
    }
}

async fn run(
    raft: Raft<GroupStateMachine>,
    hibernation: Hibernation,
    mut rx: mpsc::Receiver<Queued>,
    stamp: Arc<Mutex<MonotonicStamp>>,
    clock: Arc<dyn Clock>,
) {
    let permits = Arc::new(Semaphore::new(ENTRIES_IN_FLIGHT));
    let mut held: Option<Queued> = None;
    loop {
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("the semaphore is never closed");
        let first = match held.take() {
            Some(queued) => queued,
            None => match rx.recv().await {
                Some(queued) => queued,
                None => return,
            },
        };
        let mut batch = vec![first];
        if batch[0].part.producer.is_none() {
            let mut bytes = batch[0].part.events.len();
            while let Ok(next) = rx.try_recv() {
                if next.part.producer.is_some() || bytes + next.part.events.len() > ENTRY_BYTES_MAX
                {
                    held = Some(next);
                    break;
                }
                bytes += next.part.events.len();
                batch.push(next);
            }
        }
        hibernation.wake_for_write(&raft).await;
        propose(&raft, batch, &stamp, clock.as_ref(), permit).await;
    }
}

/// Proposes `batch` as one entry; its responder hands each send its result once it is applied.
async fn propose(
    raft: &Raft<GroupStateMachine>,
    batch: Vec<Queued>,
    stamp: &Mutex<MonotonicStamp>,
    clock: &dyn Clock,
    permit: OwnedSemaphorePermit,
) {
    let events = match batch.as_slice() {
        [only] => only.part.events.clone(),
        parts => {
            let len = parts.iter().map(|q| q.part.events.len()).sum();
            let mut events = BytesMut::with_capacity(len);
            for queued in parts {
                events.extend_from_slice(&queued.part.events);
            }
            events.freeze()
        }
    };
    let enqueued_time_ms = stamp
        .lock()
        .expect("stamp lock poisoned")
        .stamp(clock.now_ms());
    let proposal = proposal(
        AppendBatch {
            enqueued_time_ms,
            event_count: batch.iter().map(|q| q.part.event_count).sum(),
            events,
            producer: None,
        },
        batch[0].part.producer,
    );
    let proposed = Instant::now();
    // The result is split among the entry's sends where openraft reports it; a write
    // openraft drops unanswered (its group stopped, or refused it as stopped) answers them
    // `Stopped`.
    let responder = tributary_raft::WriteResponder::new(move |result, committed| {
        let answered = Instant::now();
        drop(permit);
        let result = match result {
            Some(Ok(response)) => Ok(response.data),
            Some(Err(ClientWriteError::ForwardToLeader(forward))) => {
                Err(Failure::ForwardToLeader(forward.leader_id))
            }
            Some(Err(other)) => Err(Failure::Other(other.to_string())),
            None => Err(Failure::Stopped),
        };
        let times = Times {
            proposed,
            committed: committed.unwrap_or(answered),
            answered,
        };
        split(result, batch, times);
    });
    if let Err(fatal) = raft.client_write_ff(proposal, Some(responder)).await {
        // The responder went with the refused write and answered its sends.
        tracing::debug!(%fatal, "a partition's Raft group refused a write");
    }
}

/// When an entry was handed to openraft, committed, and its result reached the appender.
#[derive(Debug, Clone, Copy)]
struct Times {
    proposed: Instant,
    committed: Instant,
    answered: Instant,
}

impl Times {
    /// Records one acknowledged send's stages in the appender (see
    /// [`tributary_types::send_stage`]).
    fn record(&self, since: Instant) {
        SendStage::AppenderWait.record_between(since, self.proposed);
        SendStage::Commit.record_between(self.proposed, self.committed);
        SendStage::Apply.record_between(self.committed, self.answered);
    }
}

/// The entry for `batch`, stamped by its (only) send's producer, if any.
pub fn proposal(batch: AppendBatch, producer: Option<Producer>) -> Proposal {
    match producer {
        None => Proposal::Append(batch),
        Some(Producer::EventHubs(stamp)) => Proposal::Append(AppendBatch {
            producer: Some(stamp),
            ..batch
        }),
        Some(Producer::Kafka(producer)) => Proposal::KafkaAppend { batch, producer },
    }
}

/// Hands each send of an entry its share of the entry's result, recording the stages of
/// each acknowledged one.
fn split(result: Result<ProposalResult, Failure>, batch: Vec<Queued>, times: Times) {
    let mut sequence_before = 0i64;
    let mut bytes_before = 0i64;
    for queued in batch {
        let own = match &result {
            Ok(ProposalResult::Appended(outcome)) => Ok(ProposalResult::Appended(AppendOutcome {
                first_sequence: outcome.first_sequence + sequence_before,
                first_offset: outcome.first_offset + bytes_before,
                enqueued_time_ms: outcome.enqueued_time_ms,
            })),
            // Results other than a plain append only come from entries of one send.
            other => other.clone(),
        };
        sequence_before += i64::from(queued.part.event_count);
        bytes_before += queued.part.events.len() as i64;
        if own.is_ok() {
            times.record(queued.part.since);
        }
        let _ = queued
            .reply
            .send(own.map(|result| (result, times.answered)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(events: &[u8], count: u32) -> (Queued, oneshot::Receiver<Answer>) {
        let (reply, rx) = oneshot::channel();
        (
            Queued {
                part: Part {
                    events: Bytes::copy_from_slice(events),
                    event_count: count,
                    producer: None,
                    since: Instant::now(),
                },
                reply,
            },
            rx,
        )
    }

    fn times() -> Times {
        let now = Instant::now();
        Times {
            proposed: now,
            committed: now,
            answered: now,
        }
    }

    #[test]
    fn each_send_of_a_merged_entry_gets_its_own_numbers() {
        let (a, mut ra) = queued(&[0; 10], 2);
        let (b, mut rb) = queued(&[0; 7], 1);
        let (c, mut rc) = queued(&[0; 5], 3);
        let outcome = AppendOutcome {
            first_sequence: 100,
            first_offset: 5000,
            enqueued_time_ms: 42,
        };
        let times = times();
        split(Ok(ProposalResult::Appended(outcome)), vec![a, b, c], times);
        let got = |rx: &mut oneshot::Receiver<Answer>| match rx.try_recv().unwrap() {
            Ok((ProposalResult::Appended(o), answered)) => {
                assert_eq!(answered, times.answered);
                (o.first_sequence, o.first_offset, o.enqueued_time_ms)
            }
            other => panic!("unexpected {other:?}"),
        };
        assert_eq!(got(&mut ra), (100, 5000, 42));
        assert_eq!(got(&mut rb), (102, 5010, 42));
        assert_eq!(got(&mut rc), (103, 5017, 42));
    }

    #[test]
    fn a_failed_entry_fails_every_send_in_it() {
        let (a, mut ra) = queued(&[0; 10], 2);
        let (b, mut rb) = queued(&[0; 7], 1);
        split(Err(Failure::ForwardToLeader(Some(3))), vec![a, b], times());
        for rx in [&mut ra, &mut rb] {
            assert!(matches!(
                rx.try_recv().unwrap(),
                Err(Failure::ForwardToLeader(Some(3)))
            ));
        }
    }
}
