//! Tributary's wrapper around openraft: the one type configuration every group uses, the
//! redb-backed log store, and the network router shared by all groups of a node. An
//! openraft alpha bump should touch this crate only.

mod coalesce;
#[cfg(test)]
mod golden_tests;
mod host;
mod log_store;
mod member;
mod membership;
mod network;
mod peer_failures;
pub mod peer_key;
mod peer_service;
pub mod quiet;
pub mod rebuild;
mod session;
pub mod snapshot_stream;
mod types;

pub use coalesce::{BATCH_MESSAGES_MAX, COALESCE_WINDOW, Coalescer};
pub use host::{GroupHost, HostError};
pub use log_store::{LogStore, decode, decode_entry, decode_entry_shared, encode, encode_entry};
pub use member::{NODE_ID_MAX, describe_member, member_id, member_incarnation, member_node};
pub use membership::{PROMOTE_LAG_MAX, VoterChange, reconcile_voters, transfer_leadership};
pub use network::{
    Connector, NetworkFactory, PEER_CONNECTION_WINDOW_BYTES, PEER_MESSAGE_BYTES_MAX,
    PEER_STREAM_WINDOW_BYTES, PeerRouter, TcpConnector, peer_endpoint,
};
pub use peer_service::{PeerCaller, PeerService};
pub use quiet::Hibernation;
pub use snapshot_stream::SNAPSHOT_PIECE_BYTES;
pub use types::{
    AppendBatch, AppendOutcome, CONTROLLER_LOG_KEEP_ENTRIES, CaptureRange, Entry,
    KafkaProducerStamp, LogId, Producer, ProducerStamp, Proposal, ProposalResult, Raft,
    RaftSettings, Snapshot, SnapshotData, SnapshotMeta, StoredMembership, StoredSnapshot,
    TypeConfig, WriteResponder, controller_config_with, group_config, group_config_with,
};

/// Re-exports of openraft items the node needs, so it names them through this crate.
pub mod openraft_api {
    pub use openraft::ReadPolicy;
    pub use openraft::error::{
        ClientWriteError, ForwardToLeader, LinearizableReadError, RaftError,
    };
    pub use openraft::storage::{EntryResponder, RaftStateMachine};
    pub use openraft::{BasicNode, EntryPayload, RaftSnapshotBuilder, StoredMembership};

    /// The storage type error openraft's test suite reports.
    pub type StorageError = openraft::StorageError<crate::TypeConfig>;

    /// openraft's conformance suite for storage implementations.
    pub mod testing {
        pub use openraft::entry::RaftEntry;
        pub use openraft::testing::log::{StoreBuilder, Suite};
        pub use openraft::testing::{log_id, membership_ent};
    }
}
