use bytes::Bytes;
use tributary_types::GroupId;

/// Whether a write must be on disk before it is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fsynced before the completion fires (Raft log appends, votes).
    Immediate,
    /// Visible to readers at once, made durable by the next immediate commit. Used for state
    /// that can be rebuilt from the durable log after a crash (applied index, partition index).
    Lazy,
}

/// Per-group metadata slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum MetaKey {
    Vote = 1,
    Committed = 2,
    Purged = 3,
    /// The state machine's applied position and counters.
    Applied = 4,
    /// The latest snapshot's metadata and payload.
    Snapshot = 5,
    /// The Raft member id this replica runs as (node and data incarnation).
    Member = 6,
    /// The version of the controller state whose view assigned this replica to its node
    /// (an 8-byte big-endian integer): the node drops the replica only on a view at least
    /// as new.
    AssignedAt = 7,
    /// The partition state at the latest snapshot's point (sent with the snapshot, so a
    /// replica rebuilt from it needs none of the entries before the retained ones).
    SnapshotState = 8,
}

/// One row of a partition's sparse index: one row per Raft entry (a batch of events), never
/// one per event. On the wire (snapshot pieces) its fields go in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexRow {
    pub first_sequence: i64,
    pub log_index: u64,
    pub first_offset: i64,
    pub enqueued_time_ms: i64,
    pub event_count: u32,
}

/// One change inside a write transaction.
#[derive(Debug, Clone)]
pub enum Mutation {
    PutLog {
        group: GroupId,
        index: u64,
        entry: Bytes,
    },
    /// Removes log entries with index >= `from`.
    TruncateLogFrom {
        group: GroupId,
        from: u64,
    },
    /// Removes log entries with index <= `through`.
    PurgeLogThrough {
        group: GroupId,
        through: u64,
    },
    PutMeta {
        group: GroupId,
        key: MetaKey,
        value: Bytes,
    },
    PutIndex {
        group: GroupId,
        row: IndexRow,
    },
    /// Removes every index row with first sequence >= `from`.
    TruncateIndexFrom {
        group: GroupId,
        from_sequence: i64,
    },
    /// Removes every index row with first sequence < `before` (retention).
    TruncateIndexBefore {
        group: GroupId,
        before_sequence: i64,
    },
    /// Removes everything stored for the group.
    DeleteGroup {
        group: GroupId,
    },
    /// Installs the snapshot staged under the group's staging key (see
    /// [`crate::staging_group`]): the group's log entries up to `through` and all its index
    /// rows are replaced by the staged ones, which move under the group's key (their bytes
    /// stay where they lie). One transaction: a crash leaves the replica as it was before
    /// or as the snapshot made it, never a mix.
    InstallStaged {
        group: GroupId,
        through: u64,
    },
    PutCatalog {
        key: String,
        value: Bytes,
    },
    DeleteCatalog {
        key: String,
    },
}

impl Mutation {
    /// Approximate bytes this mutation writes; bounds the size of one transaction.
    pub fn size_bytes(&self) -> usize {
        match self {
            Mutation::PutLog { entry, .. } => entry.len() + 16,
            Mutation::PutMeta { value, .. } => value.len() + 9,
            Mutation::PutCatalog { key, value } => key.len() + value.len(),
            _ => 32,
        }
    }
}
