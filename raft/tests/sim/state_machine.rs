//! A state machine for the simulation: it keeps every applied entry in memory, shared with
//! the checker, which compares replicas entry by entry.

use std::io;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::{Stream, TryStreamExt};
use serde::{Deserialize, Serialize};
use tributary_raft::openraft_api::{
    EntryPayload, EntryResponder, RaftSnapshotBuilder, RaftStateMachine,
};
use tributary_raft::{
    AppendOutcome, Entry, LogId, Proposal, ProposalResult, Snapshot, SnapshotData, SnapshotMeta,
    StoredMembership, TypeConfig,
};

/// What an entry carried, reduced to what replicas must agree on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Payload {
    Blank,
    Membership(openraft::Membership<u64, openraft::BasicNode>),
    Append(Bytes),
    Controller(Bytes),
    Capture(Proposal),
}

/// One entry as a replica saw it: in its state machine or in its stored log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    pub log_id: LogId,
    pub payload: Payload,
}

impl Record {
    pub fn of(entry: &Entry) -> Self {
        let payload = match &entry.payload {
            EntryPayload::Blank => Payload::Blank,
            EntryPayload::Normal(Proposal::Append(batch) | Proposal::KafkaAppend { batch, .. }) => {
                Payload::Append(batch.events.clone())
            }
            EntryPayload::Normal(Proposal::Controller(command)) => {
                Payload::Controller(command.clone())
            }
            EntryPayload::Normal(
                capture @ (Proposal::CaptureWindow(_) | Proposal::CaptureMark(_)),
            ) => Payload::Capture(capture.clone()),
            EntryPayload::Membership(membership) => Payload::Membership(membership.clone()),
        };
        Self {
            log_id: entry.log_id,
            payload,
        }
    }
}

/// Everything a replica applied, in order. The checker reads it between simulation steps.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Applied {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub records: Vec<Record>,
    /// Events applied so far: the sequence number the next appended event gets.
    pub next_sequence: i64,
}

/// The checker's handle on one replica's applied state.
pub type SharedApplied = Arc<Mutex<Applied>>;

/// The last snapshot built or installed: its meta and serialized [`Applied`].
type SnapshotSlot = Arc<Mutex<Option<(SnapshotMeta, Vec<u8>)>>>;

pub struct MemStateMachine {
    applied: SharedApplied,
    snapshot: SnapshotSlot,
}

impl MemStateMachine {
    pub fn new() -> (Self, SharedApplied) {
        let applied = SharedApplied::default();
        let machine = Self {
            applied: applied.clone(),
            snapshot: SnapshotSlot::default(),
        };
        (machine, applied)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, Applied> {
        self.applied.lock().expect("applied lock")
    }
}

fn invalid(err: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err.to_string())
}

impl RaftStateMachine<TypeConfig> for MemStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        let state = self.state();
        Ok((state.last_applied, state.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        while let Some((entry, responder)) = entries.try_next().await? {
            let result = {
                let mut state = self.state();
                state.last_applied = Some(entry.log_id);
                let result = match &entry.payload {
                    EntryPayload::Blank
                    | EntryPayload::Normal(
                        Proposal::Controller(_)
                        | Proposal::CaptureWindow(_)
                        | Proposal::CaptureMark(_),
                    ) => ProposalResult::None,
                    EntryPayload::Normal(
                        Proposal::Append(batch) | Proposal::KafkaAppend { batch, .. },
                    ) => {
                        let outcome = AppendOutcome {
                            first_sequence: state.next_sequence,
                            first_offset: 0,
                            enqueued_time_ms: batch.enqueued_time_ms,
                        };
                        state.next_sequence += i64::from(batch.event_count);
                        ProposalResult::Appended(outcome)
                    }
                    EntryPayload::Membership(membership) => {
                        state.membership =
                            StoredMembership::new(Some(entry.log_id), membership.clone());
                        ProposalResult::None
                    }
                };
                state.records.push(Record::of(&entry));
                result
            };
            if let Some(responder) = responder {
                responder.send(result);
            }
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        SnapshotBuilder {
            applied: self.state().clone(),
            slot: self.snapshot.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let bytes = snapshot.whole()?.to_vec();
        let mut installed: Applied = postcard::from_bytes(&bytes).map_err(invalid)?;
        installed.last_applied = meta.last_log_id;
        installed.membership = meta.last_membership.clone();
        *self.state() = installed;
        *self.snapshot.lock().expect("snapshot lock") = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let slot = self.snapshot.lock().expect("snapshot lock");
        Ok(slot.as_ref().map(|(meta, bytes)| Snapshot {
            meta: meta.clone(),
            snapshot: SnapshotData::new(bytes.clone()),
        }))
    }
}

/// Snapshots the whole applied state as of when the builder was made.
pub struct SnapshotBuilder {
    applied: Applied,
    slot: SnapshotSlot,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let meta = SnapshotMeta {
            last_log_id: self.applied.last_applied,
            last_membership: self.applied.membership.clone(),
        };
        let bytes = postcard::to_allocvec(&self.applied).map_err(invalid)?;
        *self.slot.lock().expect("snapshot lock") = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: SnapshotData::new(bytes),
        })
    }
}
