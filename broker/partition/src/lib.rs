//! A partition: one Raft group whose log is the partition's data (`tributary-partition`, the
//! broker's `partition` module): its state machine (events, indexes, idempotent producers,
//! retention and compaction), its appender, positions and the event codec.

pub mod group;

pub mod appender;
pub mod codec;
pub mod compaction;
#[cfg(test)]
mod golden_tests;
pub mod kafka_producers;
pub mod position;
pub mod retention;
pub mod state_machine;
/// Throughput-unit token buckets (in `tributary-types`: they know nothing of partitions).
pub use tributary_types::throttle;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use tributary_raft::openraft_api::{
    ClientWriteError, LinearizableReadError, RaftError, ReadPolicy,
};
use tributary_raft::{
    GroupHost, Hibernation, Producer, Proposal, ProposalResult, Raft, decode_entry_shared,
    member_node,
};
use tributary_storage::Shard;
use tributary_types::limits::RECEIVE_BATCH_BYTES_MAX;
use tributary_types::{Clock, GroupId, MonotonicStamp, NodeId};

use codec::EventRecord;
use position::{Lookup, Position, PositionError};
use state_machine::{CaptureProgress, PartitionStateMachine, Progress};

use crate::group::GroupStateMachine;

/// Sends waiting in one partition at most; more are refused with "server busy".
pub const PARTITION_INFLIGHT_SENDS_MAX: usize = 4096;
/// How long a send waits for a leader to be elected (after a restart) before giving up.
const LEADER_WAIT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum PartitionError {
    #[error("this node is not the partition's leader")]
    NotLeader { leader: Option<NodeId> },
    #[error("too many sends are waiting for this partition")]
    Busy,
    #[error("the partition has no leader yet; try again shortly")]
    NoLeader,
    #[error("the partition is closed")]
    Closed,
    #[error("{0}")]
    Position(#[from] PositionError),
    #[error("storage failure: {0}")]
    Storage(String),
    #[error(
        "out of order: the producer's batch has sequence number {received}, but this partition expects {expected} next"
    )]
    OutOfOrder { expected: i64, received: i64 },
    #[error(
        "the producer's epoch {received} is older than its epoch {current} this partition has seen: another instance of the producer replaced it"
    )]
    StaleProducerEpoch { current: i16, received: i16 },
    #[error(
        "this partition has no state for producer {producer_id} (never seen here, or forgotten): start its sequence again at 0"
    )]
    UnknownProducer { producer_id: i64 },
}

/// What a committed append was assigned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Appended {
    pub first_sequence: i64,
    pub offsets: Vec<i64>,
    pub enqueued_time_ms: i64,
    /// When the entry's result reached the appender: the send's `reply` stage starts (see
    /// [`tributary_types::send_stage`]).
    pub answered: std::time::Instant,
}

/// A committed event as read back.
#[derive(Debug, Clone, PartialEq)]
pub struct ReadEvent {
    pub sequence: i64,
    pub offset: i64,
    pub enqueued_time_ms: i64,
    pub record: EventRecord,
}

pub struct Partition {
    pub group: GroupId,
    node_id: NodeId,
    /// This replica's Raft member id (node and data incarnation).
    member: u64,
    raft: Raft<GroupStateMachine>,
    /// Whether the group's timers are stopped; woken before a write or membership change.
    hibernation: Hibernation,
    progress: watch::Receiver<Progress>,
    /// The published progress's sender: retention moves its begin sequence.
    progress_sender: Arc<watch::Sender<Progress>>,
    /// Where compaction last ran.
    compaction_mark: Mutex<retention::CompactionMark>,
    /// The log index through which applied entries are readable.
    visible: watch::Receiver<u64>,
    /// Capture's committed progress.
    capture: watch::Receiver<CaptureProgress>,
    shard: Shard,
    /// The appender's stamp, for the deliberately broken build's own proposals.
    #[cfg(feature = "fault-ack-before-commit")]
    stamp: Arc<Mutex<MonotonicStamp>>,
    appender: appender::Appender,
    clock: Arc<dyn Clock>,
    inflight: Semaphore,
    read_calls: AtomicU64,
    /// The leader term in which this replica has applied everything committed before it
    /// became leader (0: none yet). Reads are served only then.
    caught_up_term: AtomicU64,
    /// This partition's share of its hub's throughput units, in and out.
    ingress: Mutex<throttle::Throttle>,
    egress: Mutex<throttle::Throttle>,
    traffic: Traffic,
    /// Set when this node stops the replica (moved away, re-created, node shutting down).
    /// Open reader streams hold the replica, and with it the sender of its progress, so
    /// they would otherwise wait for events that never come here.
    stopped: watch::Sender<bool>,
}

/// A partition replica's traffic since it started (event bodies; appends count on the
/// replica that led them).
#[derive(Debug, Default)]
pub struct Traffic {
    pub bytes_in: AtomicU64,
    pub events_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub events_out: AtomicU64,
}

fn body_bytes<'a>(records: impl IntoIterator<Item = &'a EventRecord>) -> u64 {
    records.into_iter().map(|r| r.body.len() as u64).sum()
}

impl std::fmt::Debug for Partition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Partition")
            .field("group", &self.group)
            .finish()
    }
}

fn storage(err: impl std::fmt::Display) -> PartitionError {
    PartitionError::Storage(err.to_string())
}

impl Partition {
    /// Starts the partition's Raft group on `host` as member `member`. `initial_members`
    /// (member id → peer address) initializes a group that has never run; other replicas
    /// start empty and are brought in by the leader. A founding replica initializes only
    /// after `init_delay` (see [`tributary_raft::GroupHost::start_founding`]).
    pub async fn open(
        host: &GroupHost<GroupStateMachine>,
        group: GroupId,
        member: u64,
        shard: Shard,
        initial_members: BTreeMap<u64, String>,
        init_delay: std::time::Duration,
        clock: Arc<dyn Clock>,
    ) -> Result<Partition, PartitionError> {
        let (state_machine, progress) =
            PartitionStateMachine::open(group, shard.clone()).map_err(storage)?;
        let visible = state_machine.visible();
        let capture = state_machine.capture_progress();
        let progress_sender = state_machine.progress_sender();
        let node_id = host.node_id();
        let raft = host
            .start_founding(
                group,
                member,
                shard.clone(),
                GroupStateMachine::Partition(state_machine),
                initial_members,
                init_delay,
            )
            .await
            .map_err(storage)?;
        let floor = progress.borrow().last_time_ms;
        let stamp = Arc::new(Mutex::new(MonotonicStamp::new(floor)));
        let hibernation = host.hibernation(group).unwrap_or_default();
        let appender = appender::Appender::start(
            raft.clone(),
            hibernation.clone(),
            stamp.clone(),
            clock.clone(),
        );
        Ok(Partition {
            group,
            node_id,
            member,
            raft,
            hibernation,
            progress,
            progress_sender,
            compaction_mark: Mutex::default(),
            visible,
            capture,
            shard,
            #[cfg(feature = "fault-ack-before-commit")]
            stamp,
            appender,
            clock,
            inflight: Semaphore::new(PARTITION_INFLIGHT_SENDS_MAX),
            read_calls: AtomicU64::new(0),
            caught_up_term: AtomicU64::new(0),
            ingress: Mutex::new(throttle::Throttle::new()),
            egress: Mutex::new(throttle::Throttle::new()),
            traffic: Traffic::default(),
            stopped: watch::channel(false).0,
        })
    }

    /// Marks the replica stopped on this node: reader streams on it end (their clients
    /// resume where the partition is now).
    pub fn mark_stopped(&self) {
        self.stopped.send_replace(true);
    }

    /// Resolves once [`Partition::mark_stopped`] has been called.
    pub async fn stopped(&self) {
        let mut stopped = self.stopped.subscribe();
        let _ = stopped.wait_for(|s| *s).await;
    }

    /// The node believed to lead this partition, if any.
    pub fn leader(&self) -> Option<NodeId> {
        use openraft::type_config::async_runtime::WatchReceiver;
        self.raft
            .metrics()
            .borrow_watched()
            .current_leader
            .map(member_node)
    }

    /// This replica's Raft member id.
    pub fn member(&self) -> u64 {
        self.member
    }

    /// The Raft handle, for membership changes.
    pub fn raft(&self) -> &Raft<GroupStateMachine> {
        &self.raft
    }

    /// The group's sleep switch: membership changes wake it first.
    pub fn hibernation(&self) -> &Hibernation {
        &self.hibernation
    }

    /// Makes sure this replica leads and has applied every entry committed before its
    /// leadership, so reads see every acknowledged event. After a restart the durable log is
    /// re-applied in the background; until then reads would miss acknowledged events.
    pub async fn ensure_caught_up(&self) -> Result<(), PartitionError> {
        let term = {
            use openraft::type_config::async_runtime::WatchReceiver;
            let metrics = self.raft.metrics();
            let metrics = metrics.borrow_watched();
            if metrics.current_leader != Some(self.member) {
                return Err(match metrics.current_leader {
                    Some(leader) => PartitionError::NotLeader {
                        leader: Some(member_node(leader)),
                    },
                    None => PartitionError::NoLeader,
                });
            }
            metrics.current_term
        };
        if self.caught_up_term.load(Ordering::Acquire) == term {
            return Ok(());
        }
        match tokio::time::timeout(
            LEADER_WAIT,
            self.raft.ensure_linearizable(ReadPolicy::ReadIndex),
        )
        .await
        {
            Ok(Ok(read)) => {
                // Applied is not yet readable: wait for the index rows too.
                let mut visible = self.visible.clone();
                if visible
                    .wait_for(|index| *index >= read.index())
                    .await
                    .is_err()
                {
                    return Err(PartitionError::Closed);
                }
                self.caught_up_term.store(term, Ordering::Release);
                Ok(())
            }
            Ok(Err(RaftError::APIError(LinearizableReadError::ForwardToLeader(forward)))) => {
                Err(PartitionError::NotLeader {
                    leader: forward.leader_id.map(member_node),
                })
            }
            Ok(Err(_)) | Err(_) => Err(PartitionError::NoLeader),
        }
    }

    /// Waits (until `deadline`) for the group to know a leader.
    pub async fn wait_for_any_leader(&self, deadline: tokio::time::Instant) {
        let timeout = deadline.saturating_duration_since(tokio::time::Instant::now());
        let _ = self
            .raft
            .wait(Some(timeout))
            .metrics(|m| m.current_leader.is_some(), "partition leader known")
            .await;
    }

    /// Admits a send of `bytes` and `events` within the partition's share of its hub's
    /// throughput units (0: unthrottled), or says how long to wait.
    pub fn admit_ingress(
        &self,
        throughput_units: u32,
        partition_count: u16,
        bytes: usize,
        events: usize,
    ) -> Result<(), Duration> {
        let Some((bytes_per_s, events_per_s)) = throttle::partition_share(
            throughput_units,
            partition_count,
            throttle::INGRESS_BYTES_PER_TU,
            throttle::INGRESS_EVENTS_PER_TU,
        ) else {
            return Ok(());
        };
        self.ingress.lock().expect("throttle lock").admit(
            self.clock.now_ms(),
            bytes_per_s,
            events_per_s,
            bytes as f64,
            events as f64,
        )
    }

    /// Records `bytes` and `events` delivered to a reader and returns how long the reader
    /// should pause to stay within the partition's share of its hub's egress rate.
    pub fn egress_wait(
        &self,
        throughput_units: u32,
        partition_count: u16,
        bytes: usize,
        events: usize,
    ) -> Duration {
        let Some((bytes_per_s, events_per_s)) = throttle::partition_share(
            throughput_units,
            partition_count,
            throttle::EGRESS_BYTES_PER_TU,
            throttle::EGRESS_EVENTS_PER_TU,
        ) else {
            return Duration::ZERO;
        };
        self.egress.lock().expect("throttle lock").consume(
            self.clock.now_ms(),
            bytes_per_s,
            events_per_s,
            bytes as f64,
            events as f64,
        )
    }

    /// Whether this node leads the partition.
    pub fn is_leader(&self) -> bool {
        self.leader() == Some(self.node_id)
    }

    pub fn progress(&self) -> Progress {
        *self.progress.borrow()
    }

    /// The progress once everything this replica has applied so far is readable: a sender
    /// hears of its numbers a moment before readers see the event, so whoever asks after a
    /// send's acknowledgement sees it here.
    pub async fn settled_progress(&self) -> Progress {
        let applied = {
            use openraft::type_config::async_runtime::WatchReceiver;
            let metrics = self.raft.metrics();
            let last_applied = metrics.borrow_watched().last_applied;
            last_applied.map_or(0, |id| id.index)
        };
        let mut visible = self.visible.clone();
        // Closed only when the partition stops; the progress so far is all there is then.
        let _ = visible.wait_for(|index| *index >= applied).await;
        self.progress()
    }

    /// How far Capture has written this partition's events, as this replica has applied it.
    /// Events from `next_sequence` on are not in any written capture file yet: while the
    /// hub captures, retention must keep them
    /// (`begin <= capture_progress().next_sequence`).
    pub fn capture_progress(&self) -> CaptureProgress {
        *self.capture.borrow()
    }

    /// Follows Capture's progress on this replica.
    pub fn subscribe_capture(&self) -> watch::Receiver<CaptureProgress> {
        self.capture.clone()
    }

    /// Proposes a capture claim or mark ([`Proposal::CaptureWindow`],
    /// [`Proposal::CaptureMark`]) and returns, once it is applied, whether it applied and the
    /// capture point after it.
    pub async fn propose_capture(&self, proposal: Proposal) -> Result<(bool, i64), PartitionError> {
        debug_assert!(matches!(
            proposal,
            Proposal::CaptureWindow(_) | Proposal::CaptureMark(_)
        ));
        self.hibernation.wake_for_write(&self.raft).await;
        match self.raft.client_write(proposal).await {
            Ok(response) => match response.data {
                ProposalResult::Capture {
                    applied,
                    next_sequence,
                } => {
                    // Readers of the capture progress see the entry once it is stored.
                    let mut visible = self.visible.clone();
                    let index = response.log_id.index;
                    let _ = visible.wait_for(|applied| *applied >= index).await;
                    Ok((applied, next_sequence))
                }
                other => Err(storage(format!(
                    "capture entry applied with an unexpected result {other:?}"
                ))),
            },
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                Err(PartitionError::NotLeader {
                    leader: forward.leader_id.map(member_node),
                })
            }
            Err(err) => Err(storage(err)),
        }
    }

    /// Follows the partition's committed progress; the sender closes when the partition does.
    pub fn subscribe(&self) -> watch::Receiver<Progress> {
        self.progress.clone()
    }

    /// Appends a batch encoded with [`codec::encode_batch`], whose event bodies hold
    /// `body_bytes` bytes, atomically (its events are one contiguous run of one Raft entry);
    /// returns once it is committed and applied. `since` is when the send reached the
    /// partition, where its `appender_wait` stage starts.
    pub async fn append(
        &self,
        events: bytes::Bytes,
        body_bytes: u64,
        producer: Option<Producer>,
        since: std::time::Instant,
    ) -> Result<Appended, PartitionError> {
        let _permit = self
            .inflight
            .try_acquire()
            .map_err(|_| PartitionError::Busy)?;
        let positions = codec::frame_positions(&events).map_err(storage)?;
        let event_count = positions.len() as u32;
        #[cfg(feature = "fault-ack-before-commit")]
        {
            let enqueued_time_ms = {
                let mut stamp = self.stamp.lock().expect("stamp lock poisoned");
                stamp.stamp(self.clock.now_ms())
            };
            let proposal = appender::proposal(
                tributary_raft::AppendBatch {
                    enqueued_time_ms,
                    event_count,
                    events: events.clone(),
                    producer: None,
                },
                producer,
            );
            if let Some(guessed) = self.ack_before_commit(&proposal, &positions).await {
                return Ok(guessed);
            }
        }
        let part = || appender::Part {
            events: events.clone(),
            event_count,
            producer,
            since,
        };
        let result = match self.appender.append(part()).await {
            Err(appender::Failure::ForwardToLeader(None)) => {
                // Just restarted: wait for the election, then try once more.
                self.wait_for_leader().await?;
                self.appender.append(part()).await
            }
            other => other,
        };
        let (result, answered) = result.map_err(|failure| match failure {
            appender::Failure::ForwardToLeader(leader) => PartitionError::NotLeader {
                leader: leader.map(member_node),
            },
            appender::Failure::Stopped => PartitionError::Closed,
            appender::Failure::Other(message) => PartitionError::Storage(message),
        })?;
        if let ProposalResult::Appended(_) = &result {
            self.traffic
                .events_in
                .fetch_add(u64::from(event_count), Ordering::Relaxed);
            self.traffic
                .bytes_in
                .fetch_add(body_bytes, Ordering::Relaxed);
        }
        match result {
            ProposalResult::OutOfOrder { expected, received } => {
                Err(PartitionError::OutOfOrder { expected, received })
            }
            ProposalResult::StaleProducerEpoch { current, received } => {
                Err(PartitionError::StaleProducerEpoch { current, received })
            }
            ProposalResult::UnknownProducer { producer_id } => {
                Err(PartitionError::UnknownProducer { producer_id })
            }
            ProposalResult::Appended(outcome) | ProposalResult::Duplicate(outcome) => {
                Ok(Appended {
                    first_sequence: outcome.first_sequence,
                    offsets: positions
                        .iter()
                        .map(|p| outcome.first_offset + *p as i64)
                        .collect(),
                    enqueued_time_ms: outcome.enqueued_time_ms,
                    answered,
                })
            }
            ProposalResult::None
            | ProposalResult::Controller(_)
            | ProposalResult::Capture { .. } => {
                Err(storage("append entry applied without a result"))
            }
        }
    }

    /// The deliberately broken build the nemesis suite must catch (cargo feature
    /// `fault-ack-before-commit`, never shipped): a send whose entry has not committed within
    /// a moment is acknowledged anyway, with numbers guessed from the applied progress, while
    /// the proposal goes on in the background. An isolated leader thus acknowledges events
    /// that the majority never stores.
    #[cfg(feature = "fault-ack-before-commit")]
    async fn ack_before_commit(
        &self,
        proposal: &Proposal,
        positions: &[usize],
    ) -> Option<Appended> {
        const COMMIT_PATIENCE: Duration = Duration::from_millis(100);
        let leading = {
            use openraft::type_config::async_runtime::WatchReceiver;
            let metrics = self.raft.metrics();
            let leader = metrics.borrow_watched().current_leader;
            leader == Some(self.member)
        };
        if !leading {
            return None;
        }
        let raft = self.raft.clone();
        let proposal = proposal.clone();
        let write = tokio::spawn(async move { raft.client_write(proposal).await });
        tokio::time::sleep(COMMIT_PATIENCE).await;
        if write.is_finished() {
            return None;
        }
        let progress = self.progress();
        tracing::warn!("fault-ack-before-commit: acknowledging a send before it committed");
        Some(Appended {
            first_sequence: progress.next_sequence,
            offsets: positions
                .iter()
                .map(|p| progress.next_offset + *p as i64)
                .collect(),
            enqueued_time_ms: progress.last_time_ms,
            answered: std::time::Instant::now(),
        })
    }

    async fn wait_for_leader(&self) -> Result<(), PartitionError> {
        let metrics = self
            .raft
            .wait(Some(LEADER_WAIT))
            .metrics(|m| m.current_leader.is_some(), "partition leader elected")
            .await
            .map_err(|_| PartitionError::NoLeader)?;
        match metrics.current_leader {
            Some(leader) if leader == self.member => Ok(()),
            leader => Err(PartitionError::NotLeader {
                leader: leader.map(member_node),
            }),
        }
    }

    pub fn resolve(&self, position: Position) -> Result<i64, PartitionError> {
        let progress = self.progress();
        Ok(position::resolve(position, &progress, self)?)
    }

    /// Committed events from sequence `from`, at most `max_events`, ending with the one whose
    /// body brings their bodies' size to [`RECEIVE_BATCH_BYTES_MAX`] (so at least one),
    /// never past the commit point the caller saw.
    pub fn read(&self, from: i64, max_events: usize) -> Result<Vec<ReadEvent>, PartitionError> {
        self.read_calls.fetch_add(1, Ordering::Relaxed);
        let progress = self.progress();
        let mut out = Vec::new();
        let mut bytes = 0;
        let mut sequence = from.max(progress.begin_sequence);
        while sequence < progress.next_sequence
            && out.len() < max_events
            && bytes < RECEIVE_BATCH_BYTES_MAX
        {
            let row = self
                .shard
                .index_for_sequence(self.group, sequence)
                .map_err(storage)?;
            let events = match row.map(|row| (row, self.entry_events(row.log_index))) {
                Some((row, Ok(events))) => (row, events),
                missing => {
                    // Retention may have removed the entry since `progress` was read: go on
                    // from the new beginning.
                    let begin = self.progress().begin_sequence;
                    if begin > sequence {
                        sequence = begin;
                        continue;
                    }
                    match missing {
                        Some((_, Err(err))) => return Err(err),
                        _ => break,
                    }
                }
            };
            let (row, events) = events;
            for event in events {
                let event_sequence = row.first_sequence + i64::from(event.index);
                if event_sequence < sequence {
                    continue;
                }
                if out.len() >= max_events || bytes >= RECEIVE_BATCH_BYTES_MAX {
                    break;
                }
                bytes += event.record.body.len();
                out.push(ReadEvent {
                    sequence: event_sequence,
                    offset: row.first_offset + event.position as i64,
                    enqueued_time_ms: row.enqueued_time_ms,
                    record: event.record,
                });
            }
            // The entry's events are all read unless a limit stopped the loop above (which
            // ends the outer loop too); compaction may have removed the entry's last events,
            // so the next read starts after the entry, not after the last event read.
            sequence = row.first_sequence + i64::from(row.event_count);
        }
        self.traffic
            .events_out
            .fetch_add(out.len() as u64, Ordering::Relaxed);
        self.traffic
            .bytes_out
            .fetch_add(body_bytes(out.iter().map(|e| &e.record)), Ordering::Relaxed);
        Ok(out)
    }

    fn entry_events(&self, log_index: u64) -> Result<Vec<codec::DecodedEvent>, PartitionError> {
        let bytes = self
            .shard
            .log_entry(self.group, log_index)
            .map_err(storage)?
            .ok_or_else(|| {
                storage(format!(
                    "log entry {log_index} of {} is missing",
                    self.group
                ))
            })?;
        let entry = decode_entry_shared(&bytes).map_err(storage)?;
        let batch = match &entry.payload {
            tributary_raft::openraft_api::EntryPayload::Normal(proposal) => proposal.append_batch(),
            _ => None,
        };
        match batch {
            Some(batch) => codec::decode_batch_shared(&batch.events).map_err(storage),
            None => Err(storage(format!(
                "index points at a non-event entry {log_index} of {}",
                self.group
            ))),
        }
    }

    /// Traffic through this replica since it started.
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }

    /// How many times readers have read this partition's storage; shows that a caught-up
    /// reader waits for commits instead of polling.
    pub fn read_calls(&self) -> u64 {
        self.read_calls.load(Ordering::Relaxed)
    }
}

impl Lookup for Partition {
    fn sequence_at_offset(&self, offset: i64, inclusive: bool) -> Result<Option<i64>, String> {
        let Some(first_sequence) = self
            .shard
            .sequence_for_offset(self.group, offset)
            .map_err(|e| e.to_string())?
        else {
            // Before the first retained event: start there.
            let progress = self.progress();
            return Ok((!progress.is_empty()).then_some(progress.begin_sequence));
        };
        let row = self
            .shard
            .index_for_sequence(self.group, first_sequence)
            .map_err(|e| e.to_string())?
            .ok_or("offset index without sequence index row")?;
        let events = self
            .entry_events(row.log_index)
            .map_err(|e| e.to_string())?;
        for event in &events {
            let event_offset = row.first_offset + event.position as i64;
            if event_offset > offset || (inclusive && event_offset == offset) {
                return Ok(Some(row.first_sequence + i64::from(event.index)));
            }
        }
        let after = row.first_sequence + i64::from(row.event_count);
        Ok((after < self.progress().next_sequence).then_some(after))
    }

    fn sequence_at_time(&self, time_ms: i64, inclusive: bool) -> Result<Option<i64>, String> {
        self.shard
            .sequence_for_time(self.group, time_ms, inclusive)
            .map_err(|e| e.to_string())
    }
}
