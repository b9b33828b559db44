use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use openraft::OptionalSend;
use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::GroupId;

use crate::types::TypeConfig;

/// One group's Raft log and vote, stored in a shared storage shard. Appends of all groups in
/// the shard are committed together (group commit); openraft's flush callback fires after
/// the fsync.
///
/// `append` only queues the write: openraft's core goes on (accepting sends, replicating)
/// while the shard commits, so a group has several appends in flight, each sharing an
/// fsync with every other group's. Entries queued but not yet committed are kept in memory
/// (`pending`) and served from there, so they are readable as soon as `append` returns, as
/// openraft requires.
#[derive(Debug, Clone)]
pub struct LogStore {
    group: GroupId,
    shard: Shard,
    /// First index openraft may read: one past the purged index. Purging keeps the rows
    /// (they are the partition's data) but hides them from openraft.
    first_readable: Arc<AtomicU64>,
    /// Appended entries whose write has not committed yet, by index. Shared with the log
    /// readers (clones of this store).
    pending: Arc<Mutex<BTreeMap<u64, EntryOf<TypeConfig>>>>,
}

impl LogStore {
    pub fn new(group: GroupId, shard: Shard) -> io::Result<Self> {
        let mut store = Self {
            group,
            shard,
            first_readable: Arc::new(AtomicU64::new(0)),
            pending: Arc::default(),
        };
        let purged: Option<LogIdOf<TypeConfig>> = store.read_meta(MetaKey::Purged)?;
        store.first_readable = Arc::new(AtomicU64::new(purged.map_or(0, |id| id.index() + 1)));
        Ok(store)
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: MetaKey) -> io::Result<Option<T>> {
        match self.shard.meta(self.group, key)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }
}

/// Encodes a stored value (entries, votes, state-machine state) the one way storage uses.
pub fn encode<T: serde::Serialize>(value: &T) -> io::Result<Bytes> {
    postcard::to_allocvec(value)
        .map(Bytes::from)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

/// Decodes a value written by [`encode`].
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    postcard::from_bytes(bytes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

fn bounds(range: &impl RangeBounds<u64>) -> (u64, u64) {
    let start = match range.start_bound() {
        Bound::Included(x) => *x,
        Bound::Excluded(x) => x.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(x) => x.saturating_add(1),
        Bound::Excluded(x) => *x,
        Bound::Unbounded => u64::MAX,
    };
    (start, end)
}

/// Stored bytes of log entries replication puts in one message, about (see
/// [`LogStore::entries_limited`]).
pub const REPLICATION_BYTES_MAX: usize = 16 * 1024 * 1024;

impl LogStore {
    /// Entries `start..end` from storage, stopping after the one that brings their stored
    /// size to `bytes_max` (at least one); queued entries follow only when the stored ones
    /// stayed under it (they are few: a group's appends in flight).
    fn entries_limited(
        &self,
        start: u64,
        end: u64,
        bytes_max: usize,
    ) -> io::Result<Vec<EntryOf<TypeConfig>>> {
        let start = start.max(self.first_readable.load(Ordering::Acquire));
        if start >= end {
            return Ok(Vec::new());
        }
        // Copy the queued entries first: one whose write commits meanwhile leaves `pending`
        // only after it is in storage, so every index is found in one place or the other.
        let queued: Vec<EntryOf<TypeConfig>> = self
            .pending
            .lock()
            .expect("pending lock")
            .range(start..end)
            .map(|(_, entry)| entry.clone())
            .collect();
        if queued.first().is_some_and(|entry| entry.index() == start) {
            return Ok(queued);
        }
        let stored_end = queued.first().map_or(end, |entry| entry.index());
        let rows = self
            .shard
            .log_entries_limited(self.group, start, stored_end, bytes_max)?;
        let complete = rows.iter().map(|(_, bytes)| bytes.len()).sum::<usize>() < bytes_max;
        let mut entries = rows
            .iter()
            .map(|(_, bytes)| decode(bytes))
            .collect::<io::Result<Vec<EntryOf<TypeConfig>>>>()?;
        if complete {
            entries.extend(queued);
        }
        Ok(entries)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<EntryOf<TypeConfig>>, io::Error> {
        let (start, end) = bounds(&range);
        self.entries_limited(start, end, usize::MAX)
    }

    /// What replication sends in one AppendEntries: entries from `start`, at most about
    /// [`REPLICATION_BYTES_MAX`] of them (openraft also caps their count), so a far-behind
    /// follower never gets a message near the transport's limit and one group's large
    /// entries do not hold up the others' on the shared connection for long.
    async fn limited_get_log_entries(
        &mut self,
        start: u64,
        end: u64,
    ) -> Result<Vec<EntryOf<TypeConfig>>, io::Error> {
        self.entries_limited(start, end, REPLICATION_BYTES_MAX)
    }

    async fn read_vote(&mut self) -> Result<Option<VoteOf<TypeConfig>>, io::Error> {
        self.read_meta(MetaKey::Vote)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, io::Error> {
        let last_purged_log_id: Option<LogIdOf<TypeConfig>> = self.read_meta(MetaKey::Purged)?;
        let queued = self
            .pending
            .lock()
            .expect("pending lock")
            .last_key_value()
            .map(|(_, entry)| entry.log_id());
        let last = match (queued, self.shard.last_log_entry(self.group)?) {
            (Some(queued), _) => Some(queued),
            (None, Some((_, bytes))) => Some(decode::<EntryOf<TypeConfig>>(&bytes)?.log_id()),
            (None, None) => None,
        };
        // Rows at or below the purge point are kept as data but are not part of the log.
        let last_log_id = match (last, last_purged_log_id) {
            (Some(last), Some(purged)) if last.index() <= purged.index() => Some(purged),
            (last, purged) => last.or(purged),
        };
        Ok(LogState {
            last_log_id,
            last_purged_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &VoteOf<TypeConfig>) -> Result<(), io::Error> {
        let value = encode(vote)?;
        self.shard
            .write(
                vec![Mutation::PutMeta {
                    group: self.group,
                    key: MetaKey::Vote,
                    value,
                }],
                Durability::Immediate,
            )
            .await?;
        Ok(())
    }

    async fn save_committed(
        &mut self,
        committed: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        // A hint for faster recovery; losing it only means re-committing after restart.
        let value = encode(&committed)?;
        self.shard
            .submit(
                vec![Mutation::PutMeta {
                    group: self.group,
                    key: MetaKey::Committed,
                    value,
                }],
                Durability::Lazy,
                |_| {},
            )
            .await?;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogIdOf<TypeConfig>>, io::Error> {
        Ok(self
            .read_meta::<Option<LogIdOf<TypeConfig>>>(MetaKey::Committed)?
            .flatten())
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: IOFlushed<TypeConfig>,
    ) -> Result<(), io::Error>
    where
        I: IntoIterator<Item = EntryOf<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut mutations = Vec::new();
        let mut ids = Vec::new();
        {
            let mut pending = self.pending.lock().expect("pending lock");
            for entry in entries {
                mutations.push(Mutation::PutLog {
                    group: self.group,
                    index: entry.index(),
                    entry: encode(&entry)?,
                });
                ids.push(entry.log_id());
                pending.insert(entry.index(), entry);
            }
        }
        // Queue the write (shared with every other group's in the shard's next commit) and
        // return: the entries are readable from `pending` meanwhile. Once the commit is
        // durable they are readable from storage, leave `pending`, and openraft hears of
        // the flush.
        let pending = self.pending.clone();
        self.shard
            .submit(mutations, Durability::Immediate, move |result| {
                if result.is_ok() {
                    let mut pending = pending.lock().expect("pending lock");
                    for id in ids {
                        // Unless a truncation replaced it meanwhile.
                        if pending.get(&id.index()).is_some_and(|e| e.log_id() == id) {
                            pending.remove(&id.index());
                        }
                    }
                }
                callback.io_completed(result.map_err(io::Error::from));
            })
            .await?;
        Ok(())
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        // Queued entries from `from` on go now; the truncation is queued behind their
        // writes, so storage ends up without them too.
        drop(self.pending.lock().expect("pending lock").split_off(&from));
        self.shard
            .write(
                vec![Mutation::TruncateLogFrom {
                    group: self.group,
                    from,
                }],
                Durability::Immediate,
            )
            .await?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogIdOf<TypeConfig>) -> Result<(), io::Error> {
        // The log is the partition's data: purging only moves the pointer. Retention removes
        // old rows once every event in them has expired.
        let value = encode(&log_id)?;
        self.shard
            .write(
                vec![Mutation::PutMeta {
                    group: self.group,
                    key: MetaKey::Purged,
                    value,
                }],
                Durability::Immediate,
            )
            .await?;
        self.first_readable
            .fetch_max(log_id.index() + 1, Ordering::AcqRel);
        Ok(())
    }
}

/// Decodes a stored log row back into a Raft entry; the node reads committed events this way.
pub fn decode_entry(bytes: &[u8]) -> io::Result<EntryOf<TypeConfig>> {
    decode(bytes)
}

/// Encodes a Raft entry the way the log store stores it.
pub fn encode_entry(entry: &EntryOf<TypeConfig>) -> io::Result<Bytes> {
    encode(entry)
}

#[cfg(test)]
mod tests {
    use openraft::entry::RaftEntry as _;
    use openraft::storage::RaftLogReader as _;
    use tributary_storage::{Shard, ShardConfig};
    use tributary_types::{HubId, PartitionId};

    use super::*;
    use crate::types::{AppendBatch, Proposal};

    fn entry(index: u64, bytes: usize) -> EntryOf<TypeConfig> {
        use openraft::vote::RaftLeaderIdExt as _;
        let leader = openraft::alias::LeaderIdOf::<TypeConfig>::new_committed(1, 1);
        let log_id = LogIdOf::<TypeConfig>::new(leader, index);
        EntryOf::<TypeConfig>::new_normal(
            log_id,
            Proposal::Append(AppendBatch {
                enqueued_time_ms: 0,
                event_count: 1,
                events: Bytes::from(vec![7u8; bytes]),
                producer: None,
            }),
        )
    }

    #[tokio::test]
    async fn replication_reads_stop_at_the_byte_bound_and_never_come_back_empty() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
        let group = GroupId::new(HubId(1), PartitionId(0), 0);
        let rows = (1..=20)
            .map(|index| Mutation::PutLog {
                group,
                index,
                entry: encode(&entry(index, 1024 * 1024)).unwrap(),
            })
            .collect();
        shard.write(rows, Durability::Immediate).await.unwrap();
        let mut store = LogStore::new(group, shard).unwrap();

        let indexes = |entries: Vec<EntryOf<TypeConfig>>| -> Vec<u64> {
            entries.iter().map(|e| e.index()).collect()
        };
        // About 3 MiB: the entry that reaches the bound is the last one.
        let limited = store.entries_limited(1, 21, 3 * 1024 * 1024).unwrap();
        assert_eq!(indexes(limited), vec![1, 2, 3]);
        // A bound below one entry still returns that entry: replication always progresses.
        assert_eq!(indexes(store.entries_limited(4, 21, 1).unwrap()), vec![4]);
        // Under the bound, the whole range.
        assert_eq!(
            indexes(store.entries_limited(5, 9, 16 * 1024 * 1024).unwrap()),
            vec![5, 6, 7, 8]
        );
        // What openraft's replication asks for: 16 MiB, so the 16th entry of just over
        // 1 MiB ends the message.
        assert_eq!(
            indexes(store.limited_get_log_entries(1, 21).await.unwrap()),
            (1..=16).collect::<Vec<u64>>()
        );
    }
}
