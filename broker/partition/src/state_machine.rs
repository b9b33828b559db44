//! The partition state machine. The Raft log is the partition's data: applying an entry only
//! assigns sequence numbers and offsets and records one sparse index row per entry; event
//! bytes are never copied.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tributary_raft::openraft_api::{
    EntryPayload, EntryResponder, RaftSnapshotBuilder, RaftStateMachine, StoredMembership,
};
use tributary_raft::snapshot_stream;
use tributary_raft::{
    AppendOutcome, CaptureRange, KafkaProducerStamp, ProducerStamp, Proposal, ProposalResult,
    SnapshotData, StoredSnapshot, TypeConfig, decode, decode_entry, encode,
};
use tributary_raft::{
    LogId as LogIdT, Snapshot as SnapshotT, SnapshotMeta as SnapshotMetaT,
    StoredMembership as MembershipT,
};
use tributary_storage::{Durability, IndexRow, MetaKey, Mutation, Shard, staging_group};
use tributary_types::GroupId;
use tributary_types::format;

use super::codec;
use super::kafka_producers::{KafkaCheck, KafkaProducers};

/// Durable applied state of a partition, written with the index rows it describes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppliedState {
    pub last_applied: Option<LogIdT>,
    pub membership: MembershipT,
    pub progress: Progress,
    /// Idempotent producers' last batch, by producer id.
    pub producers: BTreeMap<u64, ProducerState>,
    /// How far Capture has written the partition's events.
    pub capture: CaptureProgress,
    /// Kafka idempotent producers (feature level 2). Not part of this type's own encoding,
    /// which release 0.1.0 fixed: the encoded state carries them after the rest, only when
    /// there are any ([`encode_applied`]), so a state without any encodes as before.
    #[serde(skip)]
    pub kafka_producers: KafkaProducers,
}

/// [`AppliedState`] as versions before Capture wrote it; read when the current form does not
/// decode.
#[derive(Debug, Deserialize)]
struct AppliedStateV1 {
    last_applied: Option<LogIdT>,
    membership: MembershipT,
    progress: Progress,
    producers: BTreeMap<u64, ProducerState>,
}

impl From<AppliedStateV1> for AppliedState {
    fn from(old: AppliedStateV1) -> Self {
        AppliedState {
            last_applied: old.last_applied,
            membership: old.membership,
            progress: old.progress,
            producers: old.producers,
            capture: CaptureProgress::default(),
            kafka_producers: KafkaProducers::default(),
        }
    }
}

/// Reads an applied state of any format: format 1 (release 0.1.0 and earlier) holds the
/// current form or the form before Capture; format 2 the current form.
pub(crate) fn decode_applied(bytes: &[u8]) -> io::Result<AppliedState> {
    let (version, bytes) = format::split(bytes)?;
    if version > format::FORMAT_LEGACY {
        let (mut state, rest): (AppliedState, &[u8]) =
            postcard::take_from_bytes(bytes).map_err(invalid)?;
        // Format 2 may end here, or carry Kafka producers after (see `encode_applied`).
        if !rest.is_empty() {
            state.kafka_producers = format::decode_payload(rest)?;
        }
        return Ok(state);
    }
    match postcard::from_bytes::<AppliedState>(bytes) {
        Ok(state) => Ok(state),
        // The form before Capture, only if it is the whole value: a longer one is a state
        // this release cannot read, not one to read in part.
        Err(err) => match postcard::take_from_bytes::<AppliedStateV1>(bytes) {
            Ok((old, [])) => Ok(AppliedState::from(old)),
            _ => Err(invalid(err)),
        },
    }
}

/// Encodes an applied state (stored, and sent in snapshots): in the format the process
/// writes, with its Kafka producers after the rest when there are any. Those exist only
/// once entries of feature level 2 were applied, so every replica reads format 2 by then,
/// and such a state is always written in it.
pub fn encode_applied(state: &AppliedState) -> io::Result<bytes::Bytes> {
    if state.kafka_producers.is_empty() {
        return encode(state);
    }
    let bytes = format::encode_as(KAFKA_PRODUCERS_FORMAT.max(format::write_format()), state)?;
    postcard::to_extend(&state.kafka_producers, bytes)
        .map(bytes::Bytes::from)
        .map_err(invalid)
}

/// The format that introduced Kafka producers' state.
const KAFKA_PRODUCERS_FORMAT: u8 = 2;

/// How far Capture has written a partition's events. Part of the applied state, so it is
/// decided by the log, travels in snapshots, and every new leader goes on from it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureProgress {
    /// Every event before this sequence number is in a written capture file, or was
    /// enqueued before capture was enabled. Retention must keep the events from here on
    /// while the hub captures.
    pub next_sequence: i64,
    /// The time naming the last file written; `None` before the first.
    pub last_file_time_ms: Option<i64>,
    /// The window claimed for the next file and not yet marked written: it starts at
    /// `next_sequence`, and any leader writes exactly it next.
    pub claimed: Option<CaptureRange>,
}

impl CaptureProgress {
    /// Claims `range` for the next file: only at the capture point, with no other window
    /// claimed, for a non-empty range within the partition's events (`end_sequence`).
    pub fn claim(&mut self, range: CaptureRange, end_sequence: i64) -> bool {
        let fits = range.from_sequence == self.next_sequence
            && self.claimed.is_none()
            && range.from_sequence < range.next_sequence
            && range.next_sequence <= end_sequence
            && self
                .last_file_time_ms
                .is_none_or(|last| range.file_time_ms > last);
        if fits {
            self.claimed = Some(range);
        }
        fits
    }

    /// Moves the capture point past `range`: the claimed window once its file is written,
    /// or (with no window claimed) events skipped without a file. Anything else is a
    /// deposed leader's mark, or a repeat, and changes nothing.
    pub fn mark(&mut self, range: CaptureRange, end_sequence: i64) -> bool {
        let fits = range.from_sequence == self.next_sequence
            && range.from_sequence <= range.next_sequence
            && range.next_sequence <= end_sequence
            && self.claimed.is_none_or(|claimed| claimed == range);
        if !fits {
            return false;
        }
        self.next_sequence = range.next_sequence;
        if self.claimed.take().is_some() {
            self.last_file_time_ms = Some(range.file_time_ms);
        }
        true
    }
}

/// Idempotent producers remembered per partition; the least recently active is forgotten
/// beyond this (its retries then look new, as after Event Hubs' producer state expires).
pub const PRODUCERS_PER_PARTITION_MAX: usize = 10_000;

/// What a partition remembers of an idempotent producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProducerState {
    /// The producer sequence of its last stored batch, and that batch's outcome: a retry of
    /// it gets the same reply.
    pub last_sequence: i64,
    pub last_outcome: AppendOutcome,
    /// The sequence its next batch must carry.
    pub next_sequence: i64,
    /// Log index of the last batch, for forgetting the least recently active.
    pub last_log_index: u64,
}

/// What readers of a partition need to know about its committed events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Progress {
    /// First retained sequence number.
    pub begin_sequence: i64,
    /// The sequence number the next event will get.
    pub next_sequence: i64,
    /// The offset the next event will get.
    pub next_offset: i64,
    /// Offset of the last event, -1 when empty.
    pub last_offset: i64,
    /// Enqueued time of the last event; 0 when empty. Never decreases.
    pub last_time_ms: i64,
}

impl Default for Progress {
    fn default() -> Self {
        Self {
            begin_sequence: 0,
            next_sequence: 0,
            next_offset: 0,
            last_offset: -1,
            last_time_ms: 0,
        }
    }
}

impl Progress {
    pub fn is_empty(&self) -> bool {
        self.next_sequence == self.begin_sequence
    }
}

/// A snapshot payload held whole, as earlier versions send it: the partition's state at the
/// snapshot point, and its retained log through that point with the entries' index rows.
/// (This version sends the same content streamed from storage, [`SnapshotData::Stored`].)
/// The receiver stores them as they are, so it has exactly the numbering, index and
/// producer state the sender had at that point, however many of the earliest entries
/// retention has removed.
#[derive(Debug)]
struct SnapshotPayload {
    state: AppliedState,
    /// Index rows: (first sequence, log index, first offset, enqueued ms, event count).
    index: Vec<(i64, u64, i64, i64, u32)>,
    log: Vec<(u64, bytes::Bytes)>,
}

/// A snapshot payload as sent: the form versions before Capture sent, with the capture
/// progress after it, so each version reads what the other sends (an older one ignores the
/// trailing bytes; a newer one finds them missing and starts capture at the beginning).
#[derive(Deserialize)]
struct SnapshotPayloadWire<State> {
    state: State,
    index: Vec<(i64, u64, i64, i64, u32)>,
    log: Vec<(u64, bytes::Bytes)>,
}

/// [`SnapshotPayloadWire`] as written (by earlier versions; tests write it to play one),
/// borrowing what it writes.
#[cfg(test)]
#[derive(Serialize)]
struct SnapshotPayloadRef<'a> {
    state: AppliedStateV1Ref<'a>,
    index: &'a [(i64, u64, i64, i64, u32)],
    log: &'a [(u64, bytes::Bytes)],
}

/// The fields of [`AppliedState`] before Capture, as written.
#[cfg(test)]
#[derive(Serialize)]
struct AppliedStateV1Ref<'a> {
    last_applied: &'a Option<LogIdT>,
    membership: &'a MembershipT,
    progress: &'a Progress,
    producers: &'a BTreeMap<u64, ProducerState>,
}

impl SnapshotPayload {
    #[cfg(test)]
    fn encode(&self) -> io::Result<Vec<u8>> {
        let state = AppliedStateV1Ref {
            last_applied: &self.state.last_applied,
            membership: &self.state.membership,
            progress: &self.state.progress,
            producers: &self.state.producers,
        };
        let wire = (
            SnapshotPayloadRef {
                state,
                index: &self.index,
                log: &self.log,
            },
            self.state.capture,
        );
        postcard::to_allocvec(&wire).map_err(invalid)
    }

    /// Whole snapshots were sent only by releases before 0.1.0's streamed ones: format 1.
    fn decode(bytes: &[u8]) -> io::Result<SnapshotPayload> {
        let (_, bytes) = format::split(bytes)?;
        let (wire, capture) =
            match postcard::from_bytes::<(SnapshotPayloadWire<AppliedStateV1>, CaptureProgress)>(
                bytes,
            ) {
                Ok(decoded) => decoded,
                Err(_) => (
                    postcard::from_bytes::<SnapshotPayloadWire<AppliedStateV1>>(bytes)
                        .map_err(invalid)?,
                    CaptureProgress::default(),
                ),
            };
        let mut state = AppliedState::from(wire.state);
        state.capture = capture;
        Ok(SnapshotPayload {
            state,
            index: wire.index,
            log: wire.log,
        })
    }
}

pub struct PartitionStateMachine {
    group: GroupId,
    shard: Shard,
    state: AppliedState,
    progress: Arc<watch::Sender<Progress>>,
    /// Capture's committed progress, published with the applied state.
    capture: Arc<watch::Sender<CaptureProgress>>,
    /// The log index through which applied entries are readable (index rows committed).
    visible: Arc<watch::Sender<u64>>,
}

impl PartitionStateMachine {
    /// Loads the applied state from storage; the returned receiver follows every commit.
    pub fn open(group: GroupId, shard: Shard) -> io::Result<(Self, watch::Receiver<Progress>)> {
        let state: AppliedState = match shard.meta(group, MetaKey::Applied)? {
            Some(bytes) => decode_applied(&bytes)?,
            None => AppliedState::default(),
        };
        let mut published = state.progress;
        published.begin_sequence = retained_begin(group, &shard, &state)?;
        let (progress, rx) = watch::channel(published);
        Ok((
            Self {
                group,
                shard,
                progress: Arc::new(progress),
                capture: Arc::new(watch::channel(state.capture).0),
                visible: Arc::new(watch::channel(state.last_applied.map_or(0, |id| id.index)).0),
                state,
            },
            rx,
        ))
    }
}

impl PartitionStateMachine {
    /// Follows the log index through which applied entries are readable: openraft counts an
    /// entry applied a moment before its index rows are committed.
    pub fn visible(&self) -> watch::Receiver<u64> {
        self.visible.subscribe()
    }

    /// Follows Capture's committed progress (published once the entries that moved it are
    /// stored).
    pub fn capture_progress(&self) -> watch::Receiver<CaptureProgress> {
        self.capture.subscribe()
    }

    /// The sender of the published progress, for retention to move the begin sequence.
    pub fn progress_sender(&self) -> Arc<watch::Sender<Progress>> {
        self.progress.clone()
    }
}

/// The first sequence number the partition still holds: the first retained index row's, or
/// the next one to be assigned when retention has removed every event (or none came yet).
/// Retention owns the begin sequence: the applied state's `begin_sequence` is not used.
fn retained_begin(group: GroupId, shard: &Shard, state: &AppliedState) -> io::Result<i64> {
    Ok(shard
        .first_index(group)?
        .map_or(state.progress.next_sequence, |row| row.first_sequence))
}

/// Publishes applied progress; the begin sequence is retention's and never moves back.
fn publish(sender: &watch::Sender<Progress>, applied: Progress) {
    sender.send_modify(|published| {
        let begin = published.begin_sequence;
        *published = applied;
        published.begin_sequence = begin;
    });
}

impl AppliedState {
    /// Applies a normal entry's proposal; returns its result and the index row to store.
    fn apply_proposal(
        &mut self,
        log_index: u64,
        proposal: &Proposal,
    ) -> io::Result<(ProposalResult, Option<IndexRow>)> {
        let end_sequence = self.progress.next_sequence;
        let capture = |applied: bool, capture: &CaptureProgress| ProposalResult::Capture {
            applied,
            next_sequence: capture.next_sequence,
        };
        Ok(match proposal {
            Proposal::Append(batch) => self.apply_append(log_index, batch)?,
            // Never proposed to a partition; ignored so every replica stays identical.
            Proposal::Controller(_) => (ProposalResult::None, None),
            Proposal::CaptureWindow(range) => {
                let applied = self.capture.claim(*range, end_sequence);
                (capture(applied, &self.capture), None)
            }
            Proposal::CaptureMark(range) => {
                let applied = self.capture.mark(*range, end_sequence);
                (capture(applied, &self.capture), None)
            }
            Proposal::KafkaAppend { batch, producer } => {
                self.apply_kafka_append(log_index, batch, *producer)?
            }
        })
    }

    /// Applies a Kafka producer's batch: stored if it is the producer's next one, else
    /// recognized as a retry of one of its last batches, or refused (see
    /// [`KafkaProducers::check`]).
    fn apply_kafka_append(
        &mut self,
        log_index: u64,
        batch: &tributary_raft::AppendBatch,
        stamp: KafkaProducerStamp,
    ) -> io::Result<(ProposalResult, Option<IndexRow>)> {
        let refused = match self.kafka_producers.check(stamp, batch.event_count) {
            KafkaCheck::Append => None,
            KafkaCheck::Duplicate(outcome) => Some(ProposalResult::Duplicate(outcome)),
            KafkaCheck::OutOfOrder { expected, received } => {
                Some(ProposalResult::OutOfOrder { expected, received })
            }
            KafkaCheck::StaleEpoch { current, received } => {
                Some(ProposalResult::StaleProducerEpoch { current, received })
            }
            KafkaCheck::UnknownProducer => Some(ProposalResult::UnknownProducer {
                producer_id: stamp.producer_id,
            }),
        };
        if let Some(result) = refused {
            return Ok((result, None));
        }
        let (result, row) = self.append_events(log_index, batch)?;
        if let ProposalResult::Appended(outcome) = &result {
            self.kafka_producers
                .record(stamp, batch.event_count, *outcome, log_index);
        }
        Ok((result, row))
    }

    /// Applies an append entry: assigns sequence numbers and offsets, or recognizes an
    /// idempotent producer's retry or gap. Returns the index row to store, if any.
    fn apply_append(
        &mut self,
        log_index: u64,
        batch: &tributary_raft::AppendBatch,
    ) -> io::Result<(ProposalResult, Option<IndexRow>)> {
        if let Some(stamp) = batch.producer
            && let Some(known) = self.producers.get(&stamp.producer_id)
        {
            if stamp.sequence == known.last_sequence {
                return Ok((ProposalResult::Duplicate(known.last_outcome), None));
            }
            if stamp.sequence != known.next_sequence {
                return Ok((
                    ProposalResult::OutOfOrder {
                        expected: known.next_sequence,
                        received: stamp.sequence,
                    },
                    None,
                ));
            }
        }
        let (result, row) = self.append_events(log_index, batch)?;
        if let (Some(stamp), ProposalResult::Appended(outcome)) = (batch.producer, &result) {
            self.remember_producer(stamp, *outcome, i64::from(batch.event_count), log_index);
        }
        Ok((result, row))
    }

    fn remember_producer(
        &mut self,
        stamp: ProducerStamp,
        outcome: AppendOutcome,
        count: i64,
        log_index: u64,
    ) {
        let producers = &mut self.producers;
        producers.insert(
            stamp.producer_id,
            ProducerState {
                last_sequence: stamp.sequence,
                last_outcome: outcome,
                next_sequence: stamp.sequence + count,
                last_log_index: log_index,
            },
        );
        if producers.len() > PRODUCERS_PER_PARTITION_MAX {
            let oldest = producers
                .iter()
                .min_by_key(|(_, p)| p.last_log_index)
                .map(|(id, _)| *id)
                .expect("not empty");
            producers.remove(&oldest);
        }
    }

    fn append_events(
        &mut self,
        log_index: u64,
        batch: &tributary_raft::AppendBatch,
    ) -> io::Result<(ProposalResult, Option<IndexRow>)> {
        let p = &mut self.progress;
        let time_ms = batch.enqueued_time_ms.max(p.last_time_ms);
        let positions = codec::frame_positions(&batch.events).map_err(invalid)?;
        let Some(&last_position) = positions.last() else {
            return Ok((ProposalResult::None, None));
        };
        let row = IndexRow {
            first_sequence: p.next_sequence,
            log_index,
            first_offset: p.next_offset,
            enqueued_time_ms: time_ms,
            event_count: positions.len() as u32,
        };
        let outcome = AppendOutcome {
            first_sequence: p.next_sequence,
            first_offset: p.next_offset,
            enqueued_time_ms: time_ms,
        };
        p.last_offset = p.next_offset + last_position as i64;
        p.next_offset += batch.events.len() as i64;
        p.next_sequence += positions.len() as i64;
        p.last_time_ms = time_ms;
        Ok((ProposalResult::Appended(outcome), Some(row)))
    }
}

fn invalid(err: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err.to_string())
}

impl RaftStateMachine<TypeConfig> for PartitionStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogIdT>, MembershipT), io::Error> {
        Ok((self.state.last_applied, self.state.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        let mut mutations = Vec::new();
        let mut responders = Vec::new();
        while let Some((entry, responder)) = entries.try_next().await? {
            self.state.last_applied = Some(entry.log_id);
            let result = match &entry.payload {
                EntryPayload::Blank => ProposalResult::None,
                EntryPayload::Normal(proposal) => {
                    let (result, row) = self.state.apply_proposal(entry.log_id.index, proposal)?;
                    if let Some(row) = row {
                        mutations.push(Mutation::PutIndex {
                            group: self.group,
                            row,
                        });
                    }
                    result
                }
                EntryPayload::Membership(membership) => {
                    self.state.membership =
                        StoredMembership::new(Some(entry.log_id), membership.clone());
                    ProposalResult::None
                }
            };
            if let Some(responder) = responder {
                responders.push((responder, result));
            }
        }
        mutations.push(Mutation::PutMeta {
            group: self.group,
            key: MetaKey::Applied,
            value: encode_applied(&self.state)?,
        });
        // Lazy: the index and applied state can be rebuilt from the durable log, which
        // openraft re-applies after a crash. Queued, not awaited: the next entries are
        // applied while this commits. Senders learn their numbers now (they are decided);
        // readers learn of the new events once the index rows are readable (the log rows
        // they point to were queued earlier in the same shard, so they are readable by then
        // too).
        let progress = self.progress.clone();
        let applied = self.state.progress;
        let capture = self.capture.clone();
        let applied_capture = self.state.capture;
        let visible = self.visible.clone();
        let applied_index = self.state.last_applied.map_or(0, |id| id.index);
        self.shard
            .submit(mutations, Durability::Lazy, move |result| {
                if result.is_ok() {
                    publish(&progress, applied);
                    capture.send_if_modified(|published| {
                        let changed = *published != applied_capture;
                        *published = applied_capture;
                        changed
                    });
                    visible.send_replace(applied_index);
                }
            })
            .await?;
        for (responder, result) in responders {
            responder.send(result);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            group: self.group,
            shard: self.shard.clone(),
            state: self.state.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMetaT,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        match snapshot {
            SnapshotData::Stored(stored) => self.install_stored(meta, stored).await,
            SnapshotData::Whole(bytes) => self.install_whole(meta, bytes.get_ref()).await,
        }
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<SnapshotT>, io::Error> {
        let Some(bytes) = self.shard.meta(self.group, MetaKey::Snapshot)? else {
            return Ok(None);
        };
        let meta: SnapshotMetaT = decode(&bytes)?;
        // The log is the data: the snapshot is its point, the state there, and the log
        // through it, which stays in storage and is read piece by piece as it is sent.
        let stored = stored_snapshot(self.group, &self.shard, &meta)?;
        Ok(Some(SnapshotT {
            meta,
            snapshot: SnapshotData::Stored(stored),
        }))
    }
}

impl PartitionStateMachine {
    /// Installs a snapshot whose log is in storage: one received piece by piece is staged
    /// in this replica's shard, and replaces the replica in one write.
    async fn install_stored(
        &mut self,
        meta: &SnapshotMetaT,
        stored: StoredSnapshot,
    ) -> Result<(), io::Error> {
        let last_index = meta.last_log_id.map_or(0, |id| id.index);
        let state = decode_applied(&stored.state)?;
        let here = stored.shard.is_same(&self.shard);
        if here && stored.rows_of == self.group {
            // This replica's own snapshot: its log is already in place.
            return self.finish_install(meta, state, Vec::new()).await;
        }
        if !here || stored.rows_of != staging_group(self.group) {
            // Another state machine's (openraft lets any be installed; its conformance
            // suite does): staged here first, piece by piece, as a peer would send it.
            snapshot_stream::stage_copy(&stored, last_index, self.shard.clone(), self.group)
                .await?;
        }
        let install = Mutation::InstallStaged {
            group: self.group,
            through: last_index,
        };
        self.finish_install(meta, state, vec![install]).await
    }

    /// Installs a snapshot received whole (from a sender of an earlier version).
    async fn install_whole(&mut self, meta: &SnapshotMetaT, bytes: &[u8]) -> Result<(), io::Error> {
        let payload = SnapshotPayload::decode(bytes)?;
        let last_index = meta.last_log_id.map_or(0, |id| id.index);
        let beyond = payload
            .log
            .iter()
            .map(|(index, _)| *index)
            .chain(payload.index.iter().map(|row| row.1))
            .find(|index| *index > last_index);
        if let Some(index) = beyond {
            return Err(invalid(format!(
                "snapshot through index {last_index} carries entry {index}"
            )));
        }
        let mut mutations = vec![
            Mutation::TruncateIndexFrom {
                group: self.group,
                from_sequence: i64::MIN,
            },
            Mutation::PurgeLogThrough {
                group: self.group,
                through: last_index,
            },
        ];
        mutations.extend(payload.index.iter().map(|row| Mutation::PutIndex {
            group: self.group,
            row: IndexRow {
                first_sequence: row.0,
                log_index: row.1,
                first_offset: row.2,
                enqueued_time_ms: row.3,
                event_count: row.4,
            },
        }));
        mutations.extend(
            payload
                .log
                .into_iter()
                .map(|(index, entry)| Mutation::PutLog {
                    group: self.group,
                    index,
                    entry,
                }),
        );
        self.finish_install(meta, payload.state, mutations).await
    }

    /// Writes `mutations` (which put the snapshot's log and index in place) with the state
    /// at the snapshot's point, durably in one write, and publishes it.
    async fn finish_install(
        &mut self,
        meta: &SnapshotMetaT,
        mut state: AppliedState,
        mut mutations: Vec<Mutation>,
    ) -> Result<(), io::Error> {
        let last_index = meta.last_log_id.map_or(0, |id| id.index);
        state.last_applied = meta.last_log_id;
        state.membership = meta.last_membership.clone();
        mutations.push(Mutation::PutMeta {
            group: self.group,
            key: MetaKey::Applied,
            value: encode_applied(&state)?,
        });
        mutations.push(Mutation::PutMeta {
            group: self.group,
            key: MetaKey::Snapshot,
            value: encode(meta)?,
        });
        mutations.push(Mutation::PutMeta {
            group: self.group,
            key: MetaKey::SnapshotState,
            value: encode_applied(&state)?,
        });
        self.shard.write(mutations, Durability::Immediate).await?;
        let mut published = state.progress;
        published.begin_sequence = retained_begin(self.group, &self.shard, &state)?;
        self.state = state;
        self.progress.send_replace(published);
        self.capture.send_replace(self.state.capture);
        self.visible.send_replace(last_index);
        metrics::counter!("tributary_raft_snapshots_installed_total").increment(1);
        tracing::info!(
            group = %self.group,
            through = last_index,
            next_sequence = self.state.progress.next_sequence,
            "replica rebuilt from a snapshot"
        );
        Ok(())
    }
}

/// The snapshot recorded by `meta`, its log left in storage: from the first entry holding
/// retained events through the snapshot's point.
fn stored_snapshot(
    group: GroupId,
    shard: &Shard,
    meta: &SnapshotMetaT,
) -> io::Result<StoredSnapshot> {
    let last_index = meta.last_log_id.map_or(0, |id| id.index);
    let state = match shard.meta(group, MetaKey::SnapshotState)? {
        Some(bytes) => decode_applied(&bytes)?,
        // Recorded by an earlier version, which kept no state with its snapshots and never
        // removed entries: the state at the point is the whole log's, replayed.
        None => replayed_state(group, shard, last_index)?,
    };
    // Earlier entries are blank or membership entries, which the snapshot's meta covers.
    let first_log = shard
        .first_index(group)?
        .map_or(last_index + 1, |row| row.log_index.min(last_index + 1));
    let bytes = shard.log_bytes(group, first_log..=last_index)?;
    Ok(StoredSnapshot {
        state: encode_applied(&state)?,
        shard: shard.clone(),
        rows_of: group,
        first_log,
        bytes,
    })
}

/// The state after applying the log from its start through `last_index`, read a piece at a
/// time.
fn replayed_state(group: GroupId, shard: &Shard, last_index: u64) -> io::Result<AppliedState> {
    let mut state = AppliedState::default();
    let mut next = 0;
    while next <= last_index {
        let entries = shard.log_entries_limited(
            group,
            next,
            last_index + 1,
            tributary_raft::SNAPSHOT_PIECE_BYTES,
        )?;
        let Some((last, _)) = entries.last() else {
            break;
        };
        next = last + 1;
        for (index, bytes) in &entries {
            if let EntryPayload::Normal(proposal) = decode_entry(bytes)?.payload {
                state.apply_proposal(*index, &proposal)?;
            }
        }
    }
    Ok(state)
}

/// Builds a snapshot of the state as of when the builder was created.
pub struct SnapshotBuilder {
    group: GroupId,
    shard: Shard,
    state: AppliedState,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<SnapshotT, io::Error> {
        let meta = SnapshotMetaT {
            last_log_id: self.state.last_applied,
            last_membership: self.state.membership.clone(),
        };
        // Cheap: only the snapshot point and the state there are recorded. The log up to it
        // is the data, and the payload is read from it when a replica needs it.
        self.shard
            .write(
                vec![
                    Mutation::PutMeta {
                        group: self.group,
                        key: MetaKey::Snapshot,
                        value: encode(&meta)?,
                    },
                    Mutation::PutMeta {
                        group: self.group,
                        key: MetaKey::SnapshotState,
                        value: encode_applied(&self.state)?,
                    },
                ],
                Durability::Immediate,
            )
            .await?;
        Ok(SnapshotT {
            meta,
            snapshot: SnapshotData::new(Vec::new()),
        })
    }
}

#[cfg(test)]
#[path = "state_machine_kafka_tests.rs"]
mod kafka_tests;

#[cfg(test)]
mod tests {
    use tributary_raft::LogStore;
    use tributary_raft::openraft_api::testing::{StoreBuilder, Suite};
    use tributary_storage::ShardConfig;
    use tributary_types::{HubId, PartitionId};

    use super::*;

    struct Builder;

    impl StoreBuilder<TypeConfig, LogStore, PartitionStateMachine, tempfile::TempDir> for Builder {
        async fn build(
            &self,
        ) -> Result<
            (tempfile::TempDir, LogStore, PartitionStateMachine),
            tributary_raft::openraft_api::StorageError,
        > {
            let dir = tempfile::tempdir().unwrap();
            let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
            let group = GroupId::new(HubId(1), PartitionId(0), 0);
            let log = LogStore::new(group, shard.clone()).unwrap();
            let (sm, _) = PartitionStateMachine::open(group, shard).unwrap();
            Ok((dir, log, sm))
        }
    }

    /// Stores `entries` as `group`'s log rows in `shard`, as the log store would.
    pub(super) async fn store_entries(
        shard: &Shard,
        group: GroupId,
        entries: &[tributary_raft::Entry],
    ) {
        let rows = entries
            .iter()
            .map(|e| Mutation::PutLog {
                group,
                index: e.log_id.index,
                entry: tributary_raft::encode_entry(e).unwrap(),
            })
            .collect();
        shard.write(rows, Durability::Immediate).await.unwrap();
    }

    pub(super) fn stream(
        entries: Vec<tributary_raft::Entry>,
    ) -> impl Stream<Item = io::Result<EntryResponder<TypeConfig>>> + Unpin + Send {
        futures::stream::iter(entries.into_iter().map(|e| Ok((e, None))))
    }

    pub(super) fn batch(bodies: &[&str], time_ms: i64) -> Proposal {
        let records: Vec<_> = bodies
            .iter()
            .map(|b| codec::EventRecord {
                partition_key: None,
                properties: vec![],
                body: bytes::Bytes::from(b.to_string()),
            })
            .collect();
        Proposal::Append(tributary_raft::AppendBatch {
            enqueued_time_ms: time_ms,
            event_count: records.len() as u32,
            events: codec::encode_batch(&records),
            producer: None,
        })
    }

    #[tokio::test]
    async fn snapshot_rebuilds_a_replica_that_has_nothing() {
        use tributary_raft::openraft_api::testing::{RaftEntry, log_id, membership_ent};
        let group = GroupId::new(HubId(3), PartitionId(1), 0);
        let dir = tempfile::tempdir().unwrap();
        let source = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
        let target = Shard::open(&dir.path().join("b.redb"), ShardConfig::default()).unwrap();
        let entries = vec![
            membership_ent::<TypeConfig>(1, 1, 1, vec![[1u64].into()]),
            tributary_raft::Entry::new_normal(
                log_id::<TypeConfig>(1, 1, 2),
                batch(&["a", "b"], 10),
            ),
            tributary_raft::Entry::new_normal(
                log_id::<TypeConfig>(1, 1, 3),
                batch(&["c", "d", "e"], 5),
            ),
        ];
        store_entries(&source, group, &entries).await;
        let (mut sm, _) = PartitionStateMachine::open(group, source.clone()).unwrap();
        sm.apply(stream(entries)).await.unwrap();
        let progress = sm.state.progress;
        assert_eq!(progress.next_sequence, 5);
        assert_eq!(progress.last_time_ms, 10, "times never decrease");

        let built = sm
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(snapshot.meta, built.meta);
        let (mut replica, _) = PartitionStateMachine::open(group, target.clone()).unwrap();
        replica
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        assert_eq!(replica.state.progress, progress);
        // The snapshot carries the retained event entries (membership travels in its meta).
        assert_eq!(
            target.log_entries(group, 0, 10).unwrap(),
            source.log_entries(group, 2, 10).unwrap()
        );
        for sequence in 0..5 {
            assert_eq!(
                target.index_for_sequence(group, sequence).unwrap(),
                source.index_for_sequence(group, sequence).unwrap()
            );
        }
        // Installed state is durable: a restart of the replica finds it.
        let (reopened, progress_rx) = PartitionStateMachine::open(group, target).unwrap();
        assert_eq!(*progress_rx.borrow(), progress);
        assert_eq!(reopened.state.last_applied, snapshot.meta.last_log_id);
    }

    fn producer_batch(producer_id: u64, sequence: i64, body: &str) -> Proposal {
        let Proposal::Append(mut batch) = batch(&[body], 1) else {
            unreachable!()
        };
        batch.producer = Some(ProducerStamp {
            producer_id,
            sequence,
        });
        Proposal::Append(batch)
    }

    /// A snapshot describes the state at its own point, even when it is sent after more
    /// entries were applied: a replica that installs it and then receives the later entries
    /// ends exactly like the sender (an idempotent producer's later batch is not mistaken
    /// for a retry).
    #[tokio::test]
    async fn a_snapshot_sent_later_still_describes_its_own_point() {
        use tributary_raft::openraft_api::testing::{RaftEntry, log_id, membership_ent};
        let group = GroupId::new(HubId(4), PartitionId(0), 0);
        let dir = tempfile::tempdir().unwrap();
        let source = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
        let target = Shard::open(&dir.path().join("b.redb"), ShardConfig::default()).unwrap();
        let entry = |index: u64, proposal: Proposal| {
            tributary_raft::Entry::new_normal(log_id::<TypeConfig>(1, 1, index), proposal)
        };
        let early = vec![
            membership_ent::<TypeConfig>(1, 1, 1, vec![[1u64].into()]),
            entry(2, producer_batch(7, 0, "a")),
            entry(3, producer_batch(7, 1, "b")),
        ];
        let late = vec![
            entry(4, producer_batch(7, 2, "c")),
            entry(5, producer_batch(7, 2, "c")), // a retry: stored once
            entry(6, batch(&["d"], 2)),
        ];
        store_entries(&source, group, &early).await;
        let (mut sm, _) = PartitionStateMachine::open(group, source.clone()).unwrap();
        sm.apply(stream(early)).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        store_entries(&source, group, &late).await;
        sm.apply(stream(late.clone())).await.unwrap();

        // Sent only now, after the later entries were applied.
        let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(snapshot.meta.last_log_id.unwrap().index, 3);
        let (mut replica, _) = PartitionStateMachine::open(group, target.clone()).unwrap();
        replica
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        store_entries(&target, group, &late).await;
        replica.apply(stream(late)).await.unwrap();
        // Applied entries' index rows are readable a moment later.
        for visible in [sm.visible(), replica.visible()] {
            let mut visible = visible;
            visible.wait_for(|index| *index >= 6).await.unwrap();
        }
        assert_eq!(replica.state.progress, sm.state.progress);
        assert_eq!(replica.state.progress.next_sequence, 4);
        assert_eq!(replica.state.producers, sm.state.producers);
        for sequence in 0..4 {
            assert_eq!(
                target.index_for_sequence(group, sequence).unwrap(),
                source.index_for_sequence(group, sequence).unwrap()
            );
        }
    }

    /// A snapshot carries the state at its point: a replica rebuilt from it numbers events
    /// exactly as the sender, even when the sender no longer has its earliest entries (as
    /// after retention), and it holds only what the sender kept.
    #[tokio::test]
    async fn a_snapshot_needs_none_of_the_entries_retention_removed() {
        use tributary_raft::openraft_api::testing::{RaftEntry, log_id, membership_ent};
        let group = GroupId::new(HubId(5), PartitionId(0), 0);
        let dir = tempfile::tempdir().unwrap();
        let source = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
        let target = Shard::open(&dir.path().join("b.redb"), ShardConfig::default()).unwrap();
        let entries = vec![
            membership_ent::<TypeConfig>(1, 1, 1, vec![[1u64].into()]),
            tributary_raft::Entry::new_normal(
                log_id::<TypeConfig>(1, 1, 2),
                producer_batch(9, 0, "a"),
            ),
            tributary_raft::Entry::new_normal(log_id::<TypeConfig>(1, 1, 3), batch(&["b", "c"], 5)),
        ];
        store_entries(&source, group, &entries).await;
        let (mut sm, _) = PartitionStateMachine::open(group, source.clone()).unwrap();
        sm.apply(stream(entries)).await.unwrap();
        sm.visible().wait_for(|index| *index >= 3).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        // The first event entry (sequence 0) goes, as retention removes it.
        source
            .write(
                vec![
                    Mutation::PurgeLogThrough { group, through: 2 },
                    Mutation::TruncateIndexBefore {
                        group,
                        before_sequence: 1,
                    },
                ],
                Durability::Immediate,
            )
            .await
            .unwrap();

        let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
        let (mut replica, _) = PartitionStateMachine::open(group, target.clone()).unwrap();
        replica
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        assert_eq!(replica.state.progress, sm.state.progress);
        assert_eq!(replica.state.progress.next_sequence, 3);
        assert_eq!(replica.state.producers, sm.state.producers);
        assert_eq!(
            target.log_entries(group, 0, 10).unwrap(),
            source.log_entries(group, 0, 10).unwrap()
        );
        assert_eq!(target.index_for_sequence(group, 0).unwrap(), None);
        assert_eq!(
            target.index_for_sequence(group, 2).unwrap(),
            source.index_for_sequence(group, 2).unwrap()
        );
    }

    fn range(from_sequence: i64, next_sequence: i64, file_time_ms: i64) -> CaptureRange {
        CaptureRange {
            from_sequence,
            next_sequence,
            file_time_ms,
        }
    }

    /// Applies `proposals` as entries from index `first_index` and returns their results.
    async fn apply_all(
        sm: &mut PartitionStateMachine,
        shard: &Shard,
        group: GroupId,
        first_index: u64,
        proposals: Vec<Proposal>,
    ) -> Vec<ProposalResult> {
        use tributary_raft::openraft_api::testing::{RaftEntry, log_id};
        let entries: Vec<_> = proposals
            .into_iter()
            .enumerate()
            .map(|(i, proposal)| {
                tributary_raft::Entry::new_normal(
                    log_id::<TypeConfig>(1, 1, first_index + i as u64),
                    proposal,
                )
            })
            .collect();
        store_entries(shard, group, &entries).await;
        let mut results = Vec::new();
        for entry in entries {
            // The result the entry gets, from the state before it; applying it must
            // reach the same state.
            let mut expected = sm.state.clone();
            let EntryPayload::Normal(proposal) = &entry.payload else {
                unreachable!()
            };
            let (result, _) = expected
                .apply_proposal(entry.log_id.index, proposal)
                .unwrap();
            expected.last_applied = Some(entry.log_id);
            sm.apply(stream(vec![entry])).await.unwrap();
            assert_eq!(sm.state, expected);
            results.push(result);
        }
        results
    }

    fn outcome(applied: bool, next_sequence: i64) -> ProposalResult {
        ProposalResult::Capture {
            applied,
            next_sequence,
        }
    }

    /// A claim or mark applies only at the committed capture point: a deposed leader's
    /// (or a repeated) one changes nothing, and a claimed window is the only one a mark can
    /// complete.
    #[tokio::test]
    async fn capture_moves_only_from_the_current_point() {
        let group = GroupId::new(HubId(6), PartitionId(0), 0);
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
        let (mut sm, _) = PartitionStateMachine::open(group, shard.clone()).unwrap();
        let mut capture = sm.capture_progress();
        let results = apply_all(
            &mut sm,
            &shard,
            group,
            1,
            vec![
                batch(&["a", "b", "c", "d", "e"], 1000),
                // Skips events before capture was enabled: no claim needed.
                Proposal::CaptureMark(range(0, 2, 0)),
                // The same mark again (a retry, or a deposed leader's): ignored.
                Proposal::CaptureMark(range(0, 2, 0)),
                // Not at the capture point.
                Proposal::CaptureWindow(range(1, 4, 5000)),
                // Past the partition's events.
                Proposal::CaptureWindow(range(2, 6, 5000)),
                Proposal::CaptureWindow(range(2, 4, 5000)),
                // Another claim while one is open (a deposed leader's): ignored.
                Proposal::CaptureWindow(range(2, 5, 5000)),
                // A mark of another window than the claimed one: ignored.
                Proposal::CaptureMark(range(2, 5, 5000)),
                Proposal::CaptureMark(range(2, 4, 5000)),
                // The next file must be named after a later time.
                Proposal::CaptureWindow(range(4, 5, 5000)),
                Proposal::CaptureWindow(range(4, 5, 6000)),
            ],
        )
        .await;
        assert_eq!(
            results[1..],
            [
                outcome(true, 2),
                outcome(false, 2),
                outcome(false, 2),
                outcome(false, 2),
                outcome(true, 2),
                outcome(false, 2),
                outcome(false, 2),
                outcome(true, 4),
                outcome(false, 4),
                outcome(true, 4),
            ]
        );
        let expected = CaptureProgress {
            next_sequence: 4,
            last_file_time_ms: Some(5000),
            claimed: Some(range(4, 5, 6000)),
        };
        assert_eq!(sm.state.capture, expected);
        // Published once stored, and found again after a restart.
        capture.wait_for(|c| *c == expected).await.unwrap();
        drop(sm);
        let (reopened, _) = PartitionStateMachine::open(group, shard).unwrap();
        assert_eq!(reopened.state.capture, expected);
        assert_eq!(*reopened.capture_progress().borrow(), expected);
    }

    /// Capture progress travels in snapshots, so a replica rebuilt from one (and then
    /// leading) goes on from the same point, with the same claimed window.
    #[tokio::test]
    async fn capture_progress_survives_snapshot_install() {
        let group = GroupId::new(HubId(7), PartitionId(2), 0);
        let dir = tempfile::tempdir().unwrap();
        let source = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
        let target = Shard::open(&dir.path().join("b.redb"), ShardConfig::default()).unwrap();
        let (mut sm, _) = PartitionStateMachine::open(group, source.clone()).unwrap();
        apply_all(
            &mut sm,
            &source,
            group,
            1,
            vec![
                batch(&["a", "b", "c"], 1000),
                Proposal::CaptureWindow(range(0, 2, 1000)),
                Proposal::CaptureMark(range(0, 2, 1000)),
                Proposal::CaptureWindow(range(2, 3, 2000)),
            ],
        )
        .await;
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let snapshot = sm.get_current_snapshot().await.unwrap().unwrap();
        let (mut replica, mut capture) = PartitionStateMachine::open(group, target.clone())
            .map(|(r, _)| {
                let capture = r.capture_progress();
                (r, capture)
            })
            .unwrap();
        replica
            .install_snapshot(&snapshot.meta, snapshot.snapshot)
            .await
            .unwrap();
        let expected = CaptureProgress {
            next_sequence: 2,
            last_file_time_ms: Some(1000),
            claimed: Some(range(2, 3, 2000)),
        };
        assert_eq!(replica.state.capture, expected);
        assert_eq!(*capture.borrow_and_update(), expected);
        drop(replica);
        let (reopened, _) = PartitionStateMachine::open(group, target).unwrap();
        assert_eq!(reopened.state.capture, expected);
    }

    /// States and snapshot payloads written before Capture existed still decode, with
    /// nothing captured.
    #[test]
    fn state_from_before_capture_still_decodes() {
        #[derive(Serialize)]
        struct OldState {
            last_applied: Option<LogIdT>,
            membership: MembershipT,
            progress: Progress,
            producers: BTreeMap<u64, ProducerState>,
        }
        #[derive(Serialize)]
        struct OldPayload {
            state: OldState,
            index: Vec<(i64, u64, i64, i64, u32)>,
            log: Vec<(u64, bytes::Bytes)>,
        }
        let progress = Progress {
            begin_sequence: 0,
            next_sequence: 7,
            next_offset: 700,
            last_offset: 600,
            last_time_ms: 99,
        };
        let old = OldState {
            last_applied: None,
            membership: MembershipT::default(),
            progress,
            producers: BTreeMap::new(),
        };
        let state = decode_applied(&postcard::to_allocvec(&old).unwrap()).unwrap();
        assert_eq!(state.progress, progress);
        assert_eq!(state.capture, CaptureProgress::default());

        let index = vec![(0, 2, 0, 99, 7)];
        let log = vec![(2, bytes::Bytes::from_static(b"entry"))];
        let payload = OldPayload {
            state: old,
            index: index.clone(),
            log: log.clone(),
        };
        let decoded = SnapshotPayload::decode(&postcard::to_allocvec(&payload).unwrap()).unwrap();
        assert_eq!(decoded.state.progress, progress);
        assert_eq!(decoded.state.capture, CaptureProgress::default());
        assert_eq!((decoded.index, decoded.log), (index.clone(), log.clone()));

        // And the current form round-trips, capture included.
        let mut current = AppliedState {
            progress,
            ..AppliedState::default()
        };
        current.capture.next_sequence = 3;
        current.capture.claimed = Some(range(3, 5, 1000));
        let bytes = SnapshotPayload {
            state: current.clone(),
            index,
            log,
        }
        .encode()
        .unwrap();
        assert_eq!(SnapshotPayload::decode(&bytes).unwrap().state, current);
        let bytes = postcard::to_allocvec(&current).unwrap();
        assert_eq!(decode_applied(&bytes).unwrap(), current);
    }

    /// openraft's own conformance suite for log storage and state machines.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn openraft_storage_suite() {
        Suite::test_all(Builder).await.unwrap();
    }
}
