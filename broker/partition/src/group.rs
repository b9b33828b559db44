//! One state-machine type for every group a node runs, so one host and one peer transport
//! serve partitions and the controller alike.

use std::io;

use futures::Stream;
use tributary_raft::openraft_api::{EntryResponder, RaftSnapshotBuilder, RaftStateMachine};
use tributary_raft::{LogId, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig};

use crate::state_machine::{PartitionStateMachine, SnapshotBuilder};
use tributary_controller::state_machine::{ControllerSnapshotBuilder, ControllerStateMachine};

pub enum GroupStateMachine {
    Partition(PartitionStateMachine),
    Controller(ControllerStateMachine),
}

pub enum GroupSnapshotBuilder {
    Partition(SnapshotBuilder),
    Controller(ControllerSnapshotBuilder),
}

impl RaftSnapshotBuilder<TypeConfig> for GroupSnapshotBuilder {
    type SnapshotData = SnapshotData;

    async fn build_snapshot(&mut self) -> Result<Snapshot, io::Error> {
        match self {
            GroupSnapshotBuilder::Partition(b) => b.build_snapshot().await,
            GroupSnapshotBuilder::Controller(b) => b.build_snapshot().await,
        }
    }
}

impl RaftStateMachine<TypeConfig> for GroupStateMachine {
    type SnapshotData = SnapshotData;
    type SnapshotBuilder = GroupSnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), io::Error> {
        match self {
            GroupStateMachine::Partition(sm) => sm.applied_state().await,
            GroupStateMachine::Controller(sm) => sm.applied_state().await,
        }
    }

    async fn apply<S>(&mut self, entries: S) -> Result<(), io::Error>
    where
        S: Stream<Item = Result<EntryResponder<TypeConfig>, io::Error>> + Unpin + Send,
    {
        match self {
            GroupStateMachine::Partition(sm) => sm.apply(entries).await,
            GroupStateMachine::Controller(sm) => sm.apply(entries).await,
        }
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        match self {
            GroupStateMachine::Partition(sm) => {
                GroupSnapshotBuilder::Partition(sm.get_snapshot_builder().await)
            }
            GroupStateMachine::Controller(sm) => {
                GroupSnapshotBuilder::Controller(sm.get_snapshot_builder().await)
            }
        }
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: SnapshotData,
    ) -> Result<(), io::Error> {
        match self {
            GroupStateMachine::Partition(sm) => sm.install_snapshot(meta, snapshot).await,
            GroupStateMachine::Controller(sm) => sm.install_snapshot(meta, snapshot).await,
        }
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, io::Error> {
        match self {
            GroupStateMachine::Partition(sm) => sm.get_current_snapshot().await,
            GroupStateMachine::Controller(sm) => sm.get_current_snapshot().await,
        }
    }
}
