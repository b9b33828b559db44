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
    LogId, Proposal, ProposalResult, Snapshot, SnapshotData, SnapshotMeta, TypeConfig, decode,
    encode,
};
use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::GroupId;
use tributary_types::format;

use super::state::{ClusterFeature, ClusterState, Command, CommandError, Reply};
use super::store::{ConsumerStore, StoreCommand, producer_id_block};

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
            Command::Store(StoreCommand::AllocateProducerIds) => {
                let log_index = self.last_applied.map_or(0, |id| id.index);
                let block = producer_id_block(log_index).ok_or_else(|| CommandError {
                    kind: super::state::ErrorKind::QuotaExceeded,
                    message: format!(
                        "no Kafka producer ids are left (controller log index {log_index})"
                    ),
                });
                (block.map(Reply::Store), false)
            }
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

/// Encodes a controller command, in the format the cluster reads.
pub fn encode_command(command: &Command) -> bytes::Bytes {
    format::encode(command)
        .map(bytes::Bytes::from)
        .expect("commands always encode")
}

/// Decodes a controller command of any format this release reads.
pub fn decode_command(bytes: &[u8]) -> Result<Command, format::FormatError> {
    format::decode(bytes)
}

/// Encodes a command's outcome for its proposer, in the format the cluster reads.
pub fn encode_result(result: &CommandResult) -> bytes::Bytes {
    format::encode(result)
        .map(bytes::Bytes::from)
        .expect("command results always encode")
}

pub fn decode_result(bytes: &[u8]) -> io::Result<CommandResult> {
    Ok(format::decode(bytes)?)
}

/// Encodes the controller's applied state (snapshots, the stored state). Format 1 (release
/// 0.1.0's) is [`ControllerApplied`] alone; format 2 adds the feature level after it, then
/// the checkpoint store's raw Blob API metadata and the Kafka groups' committed offsets
/// when there are any (a state without them encodes as before they existed). The
/// format is the one the process writes, or the one the state's own feature level allows
/// (the command that raised it has been applied here, so every node reads that format).
pub fn encode_applied(applied: &ControllerApplied) -> io::Result<Vec<u8>> {
    let format = format::write_format().max(format::format_for_level(applied.state.feature.level));
    Ok(match format {
        format::FORMAT_LEGACY => format::encode_as(format, applied)?,
        _ => {
            let bytes = format::encode_as(format, &(applied, &applied.state.feature))?;
            // The Blob API's raw metadata, then the Kafka groups' offsets, follow when there
            // are any (see `decode_applied`): the metadata (possibly empty) comes first
            // whenever offsets follow.
            let blob_metadata = applied.store.blob_metadata();
            let kafka_offsets = applied.store.kafka_offsets();
            let postcard_error = |e: postcard::Error| format::FormatError::Postcard(e.to_string());
            let mut bytes = bytes;
            if !blob_metadata.is_empty() || !kafka_offsets.is_empty() {
                bytes = postcard::to_extend(blob_metadata, bytes).map_err(postcard_error)?;
            }
            if !kafka_offsets.is_empty() {
                bytes = postcard::to_extend(kafka_offsets, bytes).map_err(postcard_error)?;
            }
            bytes
        }
    })
}

/// Decodes what [`encode_applied`] wrote, in any format this release reads.
pub fn decode_applied(bytes: &[u8]) -> io::Result<ControllerApplied> {
    let (version, payload) = format::split(bytes)?;
    Ok(match version {
        format::FORMAT_LEGACY => format::decode_payload(payload)?,
        _ => {
            let ((mut applied, feature), rest): ((ControllerApplied, ClusterFeature), &[u8]) =
                postcard::take_from_bytes(payload)
                    .map_err(|e| format::FormatError::Postcard(e.to_string()))?;
            applied.state.feature = feature;
            // Format 2 may end here, or carry the Blob API's raw metadata after, then the
            // Kafka groups' offsets.
            let postcard_error = |e: postcard::Error| format::FormatError::Postcard(e.to_string());
            if !rest.is_empty() {
                let (metadata, rest) = postcard::take_from_bytes(rest).map_err(postcard_error)?;
                applied.store.set_blob_metadata(metadata);
                if !rest.is_empty() {
                    applied
                        .store
                        .set_kafka_offsets(format::decode_payload(rest)?);
                }
            }
            applied
        }
    })
}

pub struct ControllerStateMachine {
    shard: Shard,
    applied: ControllerApplied,
    view: watch::Sender<Arc<ClusterState>>,
}

impl ControllerStateMachine {
    pub fn open(shard: Shard) -> io::Result<(Self, watch::Receiver<Arc<ClusterState>>)> {
        let applied: ControllerApplied = match shard.meta(GroupId::CONTROLLER, MetaKey::Applied)? {
            Some(bytes) => decode_applied(&bytes)?,
            None => ControllerApplied::default(),
        };
        format::follow_cluster_level(applied.state.feature.level);
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
                    let result: CommandResult = match decode_command(bytes) {
                        Ok(command) => {
                            let (result, changed) = self.applied.apply(command);
                            // Once the level is raised here, what this node writes (this
                            // state's snapshots first) may use its formats.
                            format::follow_cluster_level(self.applied.state.feature.level);
                            state_changed |= changed;
                            result
                        }
                        Err(e) => Err(CommandError {
                            kind: super::state::ErrorKind::InvalidArgument,
                            message: format!("undecodable controller command: {e}"),
                        }),
                    };
                    ProposalResult::Controller(encode_result(&result))
                }
                EntryPayload::Membership(membership) => {
                    self.applied.membership =
                        StoredMembership::new(Some(entry.log_id), membership.clone());
                    ProposalResult::None
                }
                // Partition proposals are never sent to the controller.
                EntryPayload::Blank
                | EntryPayload::Normal(
                    Proposal::Append(_)
                    | Proposal::CaptureWindow(_)
                    | Proposal::CaptureMark(_)
                    | Proposal::KafkaAppend { .. },
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
        let mut applied = decode_applied(snapshot.whole()?)?;
        applied.last_applied = meta.last_log_id;
        applied.membership = meta.last_membership.clone();
        self.applied = applied;
        format::follow_cluster_level(self.applied.state.feature.level);
        store_snapshot(&self.shard, meta, snapshot.whole()?, &self.applied).await?;
        self.view.send_replace(Arc::new(self.applied.state.clone()));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        let Some(bytes) = self.shard.meta(GroupId::CONTROLLER, MetaKey::Snapshot)? else {
            return Ok(None);
        };
        let (meta, payload): (SnapshotMeta, Vec<u8>) = decode(&bytes)?;
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
                    value: encode_applied(applied)?.into(),
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
        let payload = encode_applied(&self.applied)?;
        store_snapshot(&self.shard, &meta, &payload, &self.applied).await?;
        Ok(Snapshot {
            meta,
            snapshot: SnapshotData::new(payload),
        })
    }
}
