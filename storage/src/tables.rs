//! The on-disk tables. Keys start with the packed group id so one group's rows are contiguous.
//!
//! | table | key | value |
//! | --- | --- | --- |
//! | `log_location` | (group, log index) | where the entry's bytes lie in the shard's log: (segment, offset, length) |
//! | `segment_live` | segment id | how many `log_location` rows point into the segment |
//! | `raft_log` | (group, log index) | an encoded Raft entry held whole (shards without a log on disk, and entries of earlier versions) |
//! | `raft_meta` | (group, slot) | vote, committed, purged, applied state, snapshot |
//! | `seq_index` | (group, first sequence) | (log index, first offset, enqueued ms, count) |
//! | `offset_index` | (group, first offset) | first sequence |
//! | `time_index` | (group, enqueued ms, first sequence) | () |
//! | `catalog` | name | node-level records (identity, hubs) |
//! | `wal_state` | `"replay_segment"`, `"replay_offset"` | where the log's records not yet durable in redb begin (`"generation"`: the single-file log of earlier versions) |

use redb::TableDefinition;

pub(crate) const RAFT_LOG: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("raft_log");
pub(crate) const LOG_LOCATION: TableDefinition<(u64, u64), (u64, u64, u32)> =
    TableDefinition::new("log_location");
pub(crate) const SEGMENT_LIVE: TableDefinition<u64, u64> = TableDefinition::new("segment_live");
pub(crate) const RAFT_META: TableDefinition<(u64, u8), &[u8]> = TableDefinition::new("raft_meta");
pub(crate) const SEQ_INDEX: TableDefinition<(u64, i64), (u64, i64, i64, u32)> =
    TableDefinition::new("seq_index");
pub(crate) const OFFSET_INDEX: TableDefinition<(u64, i64), i64> =
    TableDefinition::new("offset_index");
pub(crate) const TIME_INDEX: TableDefinition<(u64, i64, i64), ()> =
    TableDefinition::new("time_index");
pub(crate) const CATALOG: TableDefinition<&str, &[u8]> = TableDefinition::new("catalog");
pub(crate) const WAL_STATE: TableDefinition<&str, u64> = TableDefinition::new("wal_state");
pub(crate) const WAL_GENERATION: &str = "generation";
pub(crate) const REPLAY_SEGMENT: &str = "replay_segment";
pub(crate) const REPLAY_OFFSET: &str = "replay_offset";
