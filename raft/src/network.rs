use std::future::Future;

use openraft::OptionalSend;
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory, GroupRouter};
use tributary_types::GroupId;

use crate::types::{SnapshotData, TypeConfig};

/// Routes the Raft messages of every group on this node to peer nodes over one shared
/// transport. A single-node cluster has no peers: every group is its only voter, so nothing
/// is ever sent, and a message to an unknown node reports it unreachable.
#[derive(Debug, Clone, Default)]
pub struct PeerRouter {}

fn unreachable(target: u64) -> Unreachable<TypeConfig> {
    Unreachable::new(&std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!("no peer transport to node {target}"),
    ))
}

impl GroupRouter<TypeConfig, GroupId> for PeerRouter {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: u64,
        _group: GroupId,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(unreachable(target)))
    }

    async fn vote(
        &self,
        target: u64,
        _group: GroupId,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(unreachable(target)))
    }

    async fn pre_vote(
        &self,
        target: u64,
        _group: GroupId,
        _rpc: VoteRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Err(RPCError::Unreachable(unreachable(target)))
    }

    async fn full_snapshot(
        &self,
        target: u64,
        _group: GroupId,
        _vote: VoteOf<TypeConfig>,
        _snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        _cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        Err(StreamingError::Unreachable(unreachable(target)))
    }
}

/// The per-group network factory openraft asks for: the shared router bound to a group.
pub type NetworkFactory = GroupNetworkFactory<PeerRouter, GroupId>;

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = GroupNetworkAdapter<TypeConfig, GroupId, PeerRouter>;

    async fn new_client(&mut self, target: u64, _node: &openraft::BasicNode) -> Self::Network {
        GroupNetworkAdapter::new(self.factory.clone(), target, self.group_id)
    }
}
