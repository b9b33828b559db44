//! The controller group's state machine: applies [`Command`]s to the [`ClusterState`] and
//! publishes every new state to the node.

use std::io;
use std::sync::Arc;

use futures::{Stream, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tributary_raft::openraft_api::{
    EntryPayload, EntryResponder, RaftSnapshotBuilder, RaftStateMachine, StoredMembership,
};
use tributary_raft::{
    LogId, Proposal, ProposalResult, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, encode,
};
use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::GroupId;

use super::state::{ClusterState, Command, CommandError, Reply};
use super::store::ConsumerStore;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ControllerApplied {
    pub last_applied: Option<LogId>,
    pub membership: tributary_raft::StoredMembership,
    pub state: ClusterState,
    /// Consumer-group ownership and checkpoints.
    pub store: ConsumerStore,
}

impl ControllerApplied {
    /// Applies a command; returns its outcome and whether the cluster state changed.
    pub fn apply(&mut self, command: Command) -> (CommandResult, bool) {
        match command {
            Command::Store(command) => (
                self.store.apply(&self.state, command).map(Reply::Store),
                false,
            ),
            command => {
                let result = self.state.apply(command);
                self.store.prune(&self.state);
                (result, true)
            }
        }
    }
}

/// A controller command's outcome as carried in the Raft reply.
pub type CommandResult = Result<Reply, CommandError>;

fn invalid(err: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, err.to_string())
}

pub fn encode_command(command: &Command) -> bytes::Bytes {
    postcard::to_allocvec(command)
        .map(bytes::Bytes::from)
        .expect("commands always encode")
}

pub fn decode_result(bytes: &[u8]) -> io::Result<CommandResult> {
    postcard::from_bytes(bytes).map_err(invalid)
}

pub struct ControllerStateMachine {
    shard: Shard,
    applied: ControllerApplied,
    view: watch::Sender<Arc<ClusterState>>,
}

impl ControllerStateMachine {
    pub fn open(shard: Shard) -> io::Result<(Self, watch::Receiver<Arc<ClusterState>>)> {
        let applied: ControllerApplied = match shard.meta(GroupId::CONTROLLER, MetaKey::Applied)? {
            Some(bytes) => postcard::from_bytes(&bytes).map_err(invalid)?,
            None => ControllerApplied::default(),
        };
        let (view, rx) = watch::channel(Arc::new(applied.state.clone()));
        Ok((
            Self {
                shard,
                applied,
                view,
            },
            rx,
        ))
    }

    /// This replica's copy of the consumer store (read locally, not through the log).
    pub fn store(&self) -> &ConsumerStore {
        &self.applied.store
    }
}

impl RaftStateMachine<TypeConfig> for ControllerStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = ControllerSnapshotBuilder;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId>, tributary_raft::StoredMembership), io::Error> {
        Ok((self.applied.last_applied, self.applied.membership.clone()))
    }

    async fn apply<S>(&mut self, mut entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        let mut responders = Vec::new();
        let mut state_changed = false;
        while let Some((entry, responder)) = entries.try_next().await? {
            self.applied.last_applied = Some(entry.log_id);
            let result = match &entry.payload {
                EntryPayload::Normal(Proposal::Controller(bytes)) => {
                    let result: CommandResult = match postcard::from_bytes::<Command>(bytes) {
                        Ok(command) => {
                            let (result, changed) = self.applied.apply(command);
                            state_changed |= changed;
                            result
                        }
                        Err(e) => Err(CommandError {
                            kind: super::state::ErrorKind::InvalidArgument,
                            message: format!("undecodable controller command: {e}"),
                        }),
                    };
                    ProposalResult::Controller(encode(&result)?)
                }
                EntryPayload::Membership(membership) => {
                    self.applied.membership =
                        StoredMembership::new(Some(entry.log_id), membership.clone());
                    ProposalResult::None
                }
                // Partition proposals are never sent to the controller.
                EntryPayload::Blank
                | EntryPayload::Normal(
                    Proposal::Append(_) | Proposal::CaptureWindow(_) | Proposal::CaptureMark(_),
                ) => ProposalResult::None,
            };
            if let Some(responder) = responder {
                responders.push((responder, result));
            }
        }
        // Not written here: the applied state is stored with each snapshot point (every
        // `snapshot_entries` entries), and a restart re-applies the durable log after it.
        // Writing the whole state (every checkpoint) per batch cost O(state) per commit.
        if state_changed {
            self.view.send_replace(Arc::new(self.applied.state.clone()));
        }
        for (responder, result) in responders {
            responder.send(result);
        }
        Ok(())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        ControllerSnapshotBuilder {
            shard: self.shard.clone(),
            applied: self.applied.clone(),
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        let mut applied: ControllerApplied =
            postcard::from_bytes(snapshot.whole()?).map_err(invalid)?;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        self.applied = applied;
        store_snapshot(&self.shard, meta, snapshot.whole()?, &self.applied).await?;
        self.view.send_replace(Arc::new(self.applied.state.clone()));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let Some(bytes) = self.shard.meta(GroupId::CONTROLLER, MetaKey::Snapshot)? else {
            return Ok(None);
        };
        let (meta, payload): (SnapshotMeta, Vec<u8>) =
            postcard::from_bytes(&bytes).map_err(invalid)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: SnapshotData::new(payload),
        }))
    }
}

/// Records a snapshot point and the applied state there in one durable write: a start
/// loads that state and re-applies the log after it (entries after a snapshot point are
/// never purged).
async fn store_snapshot(
    shard: &Shard,
    meta: &SnapshotMeta,
    payload: &[u8],
    applied: &ControllerApplied,
) -> io::Result<()> {
    shard
        .write(
            vec![
                Mutation::PutMeta {
                    group: GroupId::CONTROLLER,
                    key: MetaKey::Snapshot,
                    value: encode(&(meta, payload))?,
                },
                Mutation::PutMeta {
                    group: GroupId::CONTROLLER,
                    key: MetaKey::Applied,
                    value: encode(applied)?,
                },
            ],
            Durability::Immediate,
        )
        .await?;
    Ok(())
}

/// The controller's state is small: a snapshot is the whole applied state.
pub struct ControllerSnapshotBuilder {
    shard: Shard,
    applied: ControllerApplied,
}

impl RaftSnapshotBuilder<TypeConfig> for ControllerSnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        let meta = SnapshotMeta {
            last_log_id: self.applied.last_applied,
            last_membership: self.applied.membership.clone(),
        };
        let payload = encode(&self.applied)?.to_vec();
        store_snapshot(&self.shard, &meta, &payload, &self.applied).await?;
        Ok(Snapshot {
            meta,
            snapshot: SnapshotData::new(payload),
        })
    }
}
