//! The on-disk tables. Keys start with the packed group id so one group's rows are contiguous.
//!
//! | table | key | value |
//! | --- | --- | --- |
//! | `raft_log` | (group, log index) | encoded Raft entry (a whole batch of events) |
//! | `raft_meta` | (group, slot) | vote, committed, purged, applied state, snapshot |
//! | `seq_index` | (group, first sequence) | (log index, first offset, enqueued ms, count) |
//! | `offset_index` | (group, first offset) | first sequence |
//! | `time_index` | (group, enqueued ms, first sequence) | () |
//! | `catalog` | name | node-level records (identity, hubs) |
//! | `wal_state` | `"generation"` | the write-ahead log generation that follows the last checkpoint |

use redb::TableDefinition;

pub(crate) const RAFT_LOG: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("raft_log");
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
