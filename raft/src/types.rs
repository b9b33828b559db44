use std::io::Cursor;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tributary_types::GroupId;

/// A batch of events proposed by the partition leader: one Raft entry. The events are stored
/// exactly as encoded here; applying the entry only indexes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendBatch {
    /// Stamped once by the leader when it proposes.
    pub enqueued_time_ms: i64,
    pub event_count: u32,
    /// The encoded events (see the node's event codec).
    #[serde(deserialize_with = "tributary_types::format::shared_bytes::deserialize")]
    pub events: Bytes,
    /// Set by idempotent producers: the batch is applied once per (producer, sequence).
    pub producer: Option<ProducerStamp>,
}

/// An idempotent producer's numbering of a batch within one partition: `sequence` is the
/// producer's number for the batch's first event; the next batch starts at
/// `sequence + event_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerStamp {
    pub producer_id: u64,
    pub sequence: i64,
}

/// A Kafka idempotent producer's numbering of a record batch within one partition
/// (KIP-98): its producer id and epoch, and the sequence of the batch's first record (the
/// next batch starts `event_count` later, wrapping to 0 after `i32::MAX`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaProducerStamp {
    pub producer_id: i64,
    pub epoch: i16,
    pub base_sequence: i32,
}

/// The producer numbering a send carries: Event Hubs' (AMQP and gRPC idempotent
/// publishing) or Kafka's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Producer {
    EventHubs(ProducerStamp),
    Kafka(KafkaProducerStamp),
}

/// What a group's log carries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Proposal {
    /// A partition's batch of events.
    Append(AppendBatch),
    /// A controller command, encoded by the node.
    Controller(Bytes),
    /// Capture claims the window of a partition's events from `from_sequence` (its capture
    /// point) to `next_sequence` (exclusive) for one file named after `file_time_ms`. Applied
    /// only at the current capture point with no window claimed, so a claim fixes what the
    /// file holds before anyone writes it: every leader writes the same events to the same
    /// path.
    CaptureWindow(CaptureRange),
    /// Capture's progress after a file was written (or events before capture was enabled
    /// were skipped): the capture point moves to `next_sequence`. Applied only at the current
    /// capture point, and only for the claimed window when one is claimed; a mark from a
    /// deposed leader is ignored.
    CaptureMark(CaptureRange),
    /// A Kafka idempotent producer's batch (`batch.producer` is `None`): stored unless a
    /// duplicate of one of the producer's last batches, out of sequence, or of a stale
    /// epoch (see the partition state machine). Appended at feature level 2: proposed only
    /// once the cluster runs it.
    KafkaAppend {
        batch: AppendBatch,
        producer: KafkaProducerStamp,
    },
}

/// A run of a partition's events for Capture: sequence numbers `from_sequence` to
/// `next_sequence` (exclusive; some may be gone to retention or compaction), and the time
/// (milliseconds since the Unix epoch, whole seconds) that names its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureRange {
    pub from_sequence: i64,
    pub next_sequence: i64,
    pub file_time_ms: i64,
}

/// Numbers assigned when an append entry is applied: the same on every replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppendOutcome {
    pub first_sequence: i64,
    pub first_offset: i64,
    pub enqueued_time_ms: i64,
}

impl Proposal {
    /// The events of an append entry, of either kind.
    pub fn append_batch(&self) -> Option<&AppendBatch> {
        match self {
            Proposal::Append(batch) | Proposal::KafkaAppend { batch, .. } => Some(batch),
            _ => None,
        }
    }

    /// This append entry with its events replaced (compaction keeps the entry's kind).
    pub fn with_events(&self, events: Bytes) -> Option<Proposal> {
        let batch = |b: &AppendBatch| AppendBatch {
            events,
            ..b.clone()
        };
        match self {
            Proposal::Append(b) => Some(Proposal::Append(batch(b))),
            Proposal::KafkaAppend { batch: b, producer } => Some(Proposal::KafkaAppend {
                batch: batch(b),
                producer: *producer,
            }),
            _ => None,
        }
    }
}

impl std::fmt::Display for Proposal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Proposal::Append(batch) => write!(
                f,
                "append({} events, {} bytes, t={})",
                batch.event_count,
                batch.events.len(),
                batch.enqueued_time_ms
            ),
            Proposal::Controller(command) => write!(f, "controller({} bytes)", command.len()),
            Proposal::CaptureWindow(range) => write!(
                f,
                "capture-window({}..{}, t={})",
                range.from_sequence, range.next_sequence, range.file_time_ms
            ),
            Proposal::CaptureMark(range) => write!(
                f,
                "capture-mark({}..{}, t={})",
                range.from_sequence, range.next_sequence, range.file_time_ms
            ),
            Proposal::KafkaAppend { batch, producer } => write!(
                f,
                "kafka-append({} events, {} bytes, t={}, producer {} epoch {} sequence {})",
                batch.event_count,
                batch.events.len(),
                batch.enqueued_time_ms,
                producer.producer_id,
                producer.epoch,
                producer.base_sequence
            ),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProposalResult {
    /// Blank and membership entries, and proposals sent to the wrong kind of group.
    None,
    Appended(AppendOutcome),
    /// A retried batch of an idempotent producer: stored once already, with this outcome.
    Duplicate(AppendOutcome),
    /// An idempotent producer's batch that skips sequence numbers: not stored.
    OutOfOrder {
        expected: i64,
        received: i64,
    },
    /// A controller command's reply, encoded by the node.
    Controller(Bytes),
    /// A capture claim or mark: `applied` is false when it did not start at the capture
    /// point (a deposed leader's, or a repeat), and the state was left alone;
    /// `next_sequence` is the capture point after the entry.
    Capture {
        applied: bool,
        next_sequence: i64,
    },
    /// A Kafka producer's batch of an epoch older than the partition last saw from it: not
    /// stored (feature level 2).
    StaleProducerEpoch {
        current: i16,
        received: i16,
    },
    /// A Kafka producer's batch continuing a sequence this partition has no state for (it
    /// was never seen here, or forgotten): not stored (feature level 2).
    UnknownProducer {
        producer_id: i64,
    },
}

/// The type configuration shared by every Raft group of a node (partitions and the
/// controller), so one transport serves them all. Written out rather than declared with
/// `declare_raft_types!` (which cannot name a generic responder): openraft's defaults but
/// for the data, the node and the responder.
#[derive(Debug, Clone, Copy, Default, Eq, PartialEq, Ord, PartialOrd)]
pub struct TypeConfig {}

impl openraft::RaftTypeConfig for TypeConfig {
    type D = Proposal;
    type R = ProposalResult;
    type NodeId = u64;
    type Node = openraft::BasicNode;
    type Term = u64;
    type LeaderId = openraft::impls::leader_id_adv::LeaderId<Self::Term, Self::NodeId>;
    type Vote = openraft::impls::Vote<Self::LeaderId>;
    type Payload = openraft::EntryPayload<Self::D, Self::NodeId, Self::Node>;
    type Entry =
        openraft::Entry<<Self::LeaderId as openraft::vote::RaftLeaderId>::Committed, Self::Payload>;
    type Responder<T>
        = CallbackResponder<T>
    where
        T: openraft::OptionalSend + 'static;
    type Batch<T>
        = openraft::impls::InlineBatch<T>
    where
        T: openraft::OptionalSend + 'static;
    type AsyncRuntime = openraft::impls::TokioRuntime;
    type ErrorSource = openraft::impls::BoxedErrorSource;
}

/// Hands a client write's result to whoever proposed it (`Raft::client_write_ff`).
pub type WriteResponder = CallbackResponder<openraft::raft::ClientWriteResult<TypeConfig>>;

/// What a [`CallbackResponder`] calls: the write's result (`None` when openraft dropped
/// the write unanswered: the group stopped) and when it was committed, if it was.
pub type WriteCallback<T> = Box<dyn FnOnce(Option<T>, Option<Instant>) + Send>;

/// A responder that calls a function where openraft reports the write's result, with when
/// it reported the commit: no task waiting on channels between openraft and the proposer
/// (a task and two channels per entry were a measurable share of a waiting producer's CPU).
/// The function runs once, on openraft's task, so it must be quick.
pub struct CallbackResponder<T> {
    committed: Option<Instant>,
    complete: Option<WriteCallback<T>>,
}

impl<T> CallbackResponder<T> {
    pub fn new(complete: impl FnOnce(Option<T>, Option<Instant>) + Send + 'static) -> Self {
        Self {
            committed: None,
            complete: Some(Box::new(complete)),
        }
    }
}

impl<T: openraft::OptionalSend + 'static> openraft::raft::responder::Responder<TypeConfig, T>
    for CallbackResponder<T>
{
    fn on_commit(&mut self, _log_id: openraft::type_config::alias::LogIdOf<TypeConfig>) {
        self.committed = Some(Instant::now());
    }

    fn on_complete(mut self, result: T) {
        if let Some(complete) = self.complete.take() {
            complete(Some(result), self.committed);
        }
    }
}

impl<T> Drop for CallbackResponder<T> {
    fn drop(&mut self) {
        if let Some(complete) = self.complete.take() {
            complete(None, self.committed);
        }
    }
}

/// A snapshot's data as openraft hands it between a state machine and the transport.
#[derive(Debug)]
pub enum SnapshotData {
    /// The whole payload in memory: the controller's state (small), and partitions'
    /// snapshots from senders that send them whole.
    Whole(Cursor<Vec<u8>>),
    /// A partition's: its state at the snapshot's point, and its retained log through that
    /// point, which stays in storage and travels in bounded pieces.
    Stored(StoredSnapshot),
}

impl SnapshotData {
    /// A payload held whole.
    pub fn new(bytes: Vec<u8>) -> Self {
        SnapshotData::Whole(Cursor::new(bytes))
    }

    /// The payload of a snapshot held whole; an error for one whose log is in storage (which
    /// only partitions make).
    pub fn whole(&self) -> std::io::Result<&[u8]> {
        match self {
            SnapshotData::Whole(bytes) => Ok(bytes.get_ref()),
            SnapshotData::Stored(stored) => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "a snapshot of {} with its log in storage where one held whole was expected",
                    stored.rows_of
                ),
            )),
        }
    }
}

/// A snapshot whose log stays in storage (see [`SnapshotData::Stored`]).
#[derive(Debug, Clone)]
pub struct StoredSnapshot {
    /// The state machine's state at the snapshot's point, as it encodes it.
    pub state: Bytes,
    /// The shard holding the log entries.
    pub shard: tributary_storage::Shard,
    /// Whose rows they are: the group's own on the sender, its staging key (see
    /// [`tributary_storage::staging_group`]) on a receiver.
    pub rows_of: GroupId,
    /// The first entry carried (the first holding retained events); every entry from it
    /// through the snapshot's last log index travels, with its index row.
    pub first_log: u64,
    /// Stored bytes of those entries (for progress reports).
    pub bytes: u64,
}

/// A group's Raft handle, generic over its state machine.
pub type Raft<SM> = openraft::Raft<TypeConfig, SM>;

/// openraft settings for one group, chosen for hundreds of groups per node:
///
/// - Heartbeats every 150 ms (the tick fires every 13/64 of that, about 30 ms), and not at
///   all to a follower that acknowledged replication within the last 100 ms, so busy groups
///   send no separate heartbeats. 100 + 150 + one tick (30) stays below the shortest
///   election timeout (400 ms), as openraft requires. Heartbeats of all groups to one node
///   share batches (`coalesce.rs`), so hundreds of groups cost a few RPCs per interval.
/// - Election timeout 400–800 ms. In openraft a follower grants no vote and starts no
///   election while its leader's lease (= the maximum election timeout) runs, and its own
///   timer fires a random 400–800 ms after that: a dead leader is replaced about
///   800 + 530 ms after its last message (the first of two followers' random timeouts),
///   1.6 s at worst, which meets the failover target (median ≤ 1.5 s, max ≤ 3 s; Redpanda
///   takes about 1.5 s, Kafka's controller-driven failover longer). 2–5 heartbeats are
///   missed before anyone stands, so a busy node rarely causes spurious elections; pre-vote
///   stops a replica that was cut off from disrupting the group when it comes back.
/// - Bounded per-group channels (1,024 requests): a node with many groups must not reserve
///   openraft's default 65,536-entry queues for each.
/// - Snapshots only record a point in the log (the log is the partition's data, so building
///   one copies nothing); see [`RaftSettings`] for how often, and how much log stays
///   readable for replicas catching up.
pub fn group_config(cluster_name: &str) -> Arc<openraft::Config> {
    group_config_with(cluster_name, &RaftSettings::default())
}

/// Snapshot and log settings of every group on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RaftSettings {
    /// A snapshot point is recorded after this many entries.
    pub snapshot_entries: u64,
    /// Entries before the latest snapshot point that stay readable for replicas catching
    /// up; a replica further behind (or one that lost its data) is rebuilt from a snapshot,
    /// which carries the whole retained log. Entries are never deleted by this (the log is
    /// the data; retention deletes it).
    pub log_keep_entries: u64,
    /// The node's budget for replica rebuilds, sent and received together (0: unlimited).
    pub rebuild_bytes_per_second: u64,
}

impl Default for RaftSettings {
    fn default() -> Self {
        Self {
            snapshot_entries: 10_000,
            log_keep_entries: 1_000_000,
            rebuild_bytes_per_second: crate::rebuild::REBUILD_BYTES_PER_SECOND_DEFAULT,
        }
    }
}

/// [`group_config`] with explicit snapshot and log settings.
pub fn group_config_with(cluster_name: &str, settings: &RaftSettings) -> Arc<openraft::Config> {
    let config = openraft::Config {
        cluster_name: cluster_name.to_string(),
        heartbeat_interval: 150,
        heartbeat_min_interval: Some(100),
        election_timeout_min: 400,
        election_timeout_max: 800,
        enable_pre_vote: Some(true),
        api_channel_size: Some(1024),
        notification_channel_size: Some(1024),
        state_machine_channel_size: Some(256),
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(settings.snapshot_entries.max(1)),
        max_in_snapshot_log_to_keep: settings.log_keep_entries,
        max_payload_entries: 1024,
        enable_tick: true,
        ..Default::default()
    };
    Arc::new(config.validate().expect("static raft config is valid"))
}

/// Entries before the controller's latest snapshot that stay in its log. Its snapshot is
/// its whole (small) state, so a voter further behind is sent that instead, and its purged
/// entries are deleted (see `LogStore::purge`).
pub const CONTROLLER_LOG_KEEP_ENTRIES: u64 = 1_000;

/// The controller group's configuration: [`group_config_with`], keeping at most
/// [`CONTROLLER_LOG_KEEP_ENTRIES`] entries behind the snapshot.
pub fn controller_config_with(
    cluster_name: &str,
    settings: &RaftSettings,
) -> Arc<openraft::Config> {
    group_config_with(
        cluster_name,
        &RaftSettings {
            log_keep_entries: settings.log_keep_entries.min(CONTROLLER_LOG_KEEP_ENTRIES),
            ..*settings
        },
    )
}

pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
pub type Snapshot = openraft::alias::SnapshotOf<TypeConfig, SnapshotData>;
pub type Entry = openraft::alias::EntryOf<TypeConfig>;

#[cfg(test)]
mod tests {
    #[test]
    fn compaction_keeps_an_append_entrys_kind() {
        use super::*;
        let batch = AppendBatch {
            enqueued_time_ms: 5,
            event_count: 2,
            events: Bytes::from_static(b"before"),
            producer: None,
        };
        let producer = KafkaProducerStamp {
            producer_id: 9,
            epoch: 1,
            base_sequence: 40,
        };
        let kafka = Proposal::KafkaAppend {
            batch: batch.clone(),
            producer,
        };
        let compacted = kafka.with_events(Bytes::from_static(b"after")).unwrap();
        assert_eq!(
            compacted,
            Proposal::KafkaAppend {
                batch: AppendBatch {
                    events: Bytes::from_static(b"after"),
                    ..batch.clone()
                },
                producer,
            }
        );
        assert_eq!(compacted.append_batch().unwrap().events, "after");
        assert!(matches!(
            Proposal::Append(batch).with_events(Bytes::new()),
            Some(Proposal::Append(_))
        ));
        assert_eq!(Proposal::Controller(Bytes::new()).append_batch(), None);
        assert_eq!(
            Proposal::Controller(Bytes::new()).with_events(Bytes::new()),
            None
        );
    }

    #[test]
    fn group_config_is_valid() {
        let config = super::group_config("t");
        assert!(config.heartbeat_interval < config.election_timeout_min);
    }

    /// The responder calls its function once: with the result and the commit's time when
    /// openraft answers, with nothing when openraft drops it unanswered (a stopped group),
    /// so no proposer waits for ever.
    #[test]
    fn a_callback_responder_answers_once_answered_or_dropped() {
        use openraft::raft::responder::Responder;
        use std::sync::{Arc, Mutex};
        type Seen = Arc<Mutex<Vec<(Option<u32>, bool)>>>;
        fn responder(seen: &Seen) -> super::CallbackResponder<u32> {
            let seen = seen.clone();
            super::CallbackResponder::new(move |result, committed| {
                seen.lock().unwrap().push((result, committed.is_some()));
            })
        }
        let seen = Seen::default();
        let mut answered = responder(&seen);
        answered.on_commit(openraft::testing::log_id::<super::TypeConfig>(1, 1, 7));
        answered.on_complete(5);
        responder(&seen).on_complete(6);
        drop(responder(&seen));
        assert_eq!(
            *seen.lock().unwrap(),
            vec![(Some(5), true), (Some(6), false), (None, false)]
        );
    }
}
