//! Durable structures. A node has a few storage shards; each is a log of segment files, one
//! redb database and one writer thread that merges the writes of every Raft group it holds
//! into one batch: one record and one fsync in the log (group commit), then one redb
//! transaction without an fsync; redb is made durable at checkpoints (`wal.rs`). Entries'
//! bytes stay in the log; redb holds where they lie. This crate knows nothing of Raft or
//! gRPC: it stores opaque log entries, group metadata and the partition index, keyed by
//! [`GroupId`].
//!
//! [`GroupId`]: tributary_types::GroupId

mod error;
mod mutation;
mod shard;
mod tables;
mod wal;

pub use error::StorageError;
pub use mutation::{Durability, IndexRow, MetaKey, Mutation};
pub use shard::{
    INDEX_COMMIT_LINGER, LogPiece, Shard, ShardConfig, ShardStats, is_staging, staging_group,
};
