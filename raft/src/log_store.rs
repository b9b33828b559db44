use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use openraft::OptionalSend;
use openraft::alias::{EntryOf, LogIdOf, VoteOf};
use openraft::entry::RaftEntry;
use openraft::storage::{IOFlushed, LogState, RaftLogReader, RaftLogStorage};
use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::format;
use tributary_types::{GroupId, SendStage};

use crate::types::TypeConfig;

/// One group's Raft log and vote, stored in a shared storage shard. Appends of all groups in
/// the shard are committed together (group commit); openraft's flush callback fires after
/// the fsync.
///
/// `append` only queues the write: openraft's core goes on (accepting sends, replicating)
/// while the shard commits, so a group has several appends in flight, each sharing an
/// fsync with every other group's. Appended entries are kept in memory (`tail`) and served
/// from there: while their write is queued (openraft requires them readable as soon as
/// `append` returns), and on until the state machine has read them to apply, so neither
/// applying nor replicating to a follower that keeps up reads them back from storage.
#[derive(Debug, Clone)]
pub struct LogStore {
    group: GroupId,
    shard: Shard,
    /// First index openraft may read: one past the purged index. Purging keeps the rows
    /// (they are the partition's data) but hides them from openraft.
    first_readable: Arc<AtomicU64>,
    /// The newest appended entries. Shared with the log readers (clones of this store).
    tail: Arc<Mutex<Tail>>,
    /// This replica's member id, which tells the leader's own entries from those it
    /// receives; `None`: writes are not timed.
    member: Option<u64>,
    /// When the committed log id was last saved, and how often it is saved at most
    /// ([`COMMITTED_SAVE_INTERVAL`]).
    committed_saved: Option<std::time::Instant>,
    committed_save_interval: std::time::Duration,
}

/// openraft saves the committed log id after every commit. It is a hint: a restarted
/// replica applies its log up to it before it hears from a leader, and any earlier value is
/// as correct (what is missing is applied once a leader says it is committed). A group saves
/// it at most this often, sparing a busy group a storage write on every commit (one of the
/// three writes each send cost every replica: the entry, this, the state machine's).
pub const COMMITTED_SAVE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(100);

/// Bytes of entries already written that a group keeps in memory at most, waiting for the
/// state machine to apply them (a slow state machine then reads the older ones from storage).
pub const TAIL_WRITTEN_BYTES_MAX: usize = 4 * 1024 * 1024;

/// A group's newest entries: every entry whose write is still queued, and written ones not
/// yet applied (within [`TAIL_WRITTEN_BYTES_MAX`]). Entries leave from the front only once
/// written, so every index is in storage, here, or both.
#[derive(Debug, Default)]
struct Tail {
    entries: BTreeMap<u64, Held>,
    /// Stored bytes of the held entries already written.
    written_bytes: usize,
    /// Entries up to this index were handed to the state machine.
    applied: Option<u64>,
}

#[derive(Debug)]
struct Held {
    entry: EntryOf<TypeConfig>,
    /// Its stored size.
    bytes: usize,
    written: bool,
}

impl Tail {
    /// Drops written entries from the front: those applied, and the oldest beyond the bound.
    fn trim(&mut self) {
        while let Some(first) = self.entries.first_entry() {
            let held = first.get();
            let applied = self.applied.is_some_and(|applied| *first.key() <= applied);
            if !held.written || !(applied || self.written_bytes > TAIL_WRITTEN_BYTES_MAX) {
                break;
            }
            self.written_bytes -= held.bytes;
            first.remove();
        }
    }

    /// Held entries `start..end` with their stored sizes.
    fn range(&self, start: u64, end: u64) -> Vec<(u64, usize, EntryOf<TypeConfig>)> {
        self.entries
            .range(start..end)
            .map(|(index, held)| (*index, held.bytes, held.entry.clone()))
            .collect()
    }
}

impl LogStore {
    pub fn new(group: GroupId, shard: Shard) -> io::Result<Self> {
        let mut store = Self {
            group,
            shard,
            first_readable: Arc::new(AtomicU64::new(0)),
            tail: Arc::default(),
            member: None,
            committed_saved: None,
            committed_save_interval: COMMITTED_SAVE_INTERVAL,
        };
        let purged: Option<LogIdOf<TypeConfig>> = store.read_meta(MetaKey::Purged)?;
        store.first_readable = Arc::new(AtomicU64::new(purged.map_or(0, |id| id.index() + 1)));
        Ok(store)
    }

    /// The store of member `member`'s replica: its writes are timed, as the leader's
    /// (`leader_log_write`) or a follower's (`follower_write`), for a partition's group.
    pub fn for_member(mut self, member: u64) -> Self {
        self.member = Some(member);
        self
    }

    /// The stage appending `entry` (and those after it) is timed as, if any: entries this
    /// replica proposed are the leader's writes, others a follower's.
    fn write_stage(&self, entry: &EntryOf<TypeConfig>) -> Option<SendStage> {
        let member = self.member.filter(|_| self.group != GroupId::CONTROLLER)?;
        Some(if entry.log_id.leader_id.node_id == member {
            SendStage::LeaderLogWrite
        } else {
            SendStage::FollowerWrite
        })
    }

    fn read_meta<T: serde::de::DeserializeOwned>(&self, key: MetaKey) -> io::Result<Option<T>> {
        match self.shard.meta(self.group, key)? {
            Some(bytes) => Ok(Some(decode(&bytes)?)),
            None => Ok(None),
        }
    }
}

/// Encodes a stored value or peer message (entries, votes, state-machine state, Raft
/// messages) the one way storage and the peer port use: in the format the cluster reads
/// ([`tributary_types::format`]).
pub fn encode<T: serde::Serialize>(value: &T) -> io::Result<Bytes> {
    Ok(Bytes::from(format::encode(value)?))
}

/// Decodes a value written by [`encode`] in any format this release reads.
pub fn decode<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> io::Result<T> {
    Ok(format::decode(bytes)?)
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
    /// Entries `start..end`, from the tail where it holds them and from storage otherwise,
    /// stopping after the one that brings their stored size to `bytes_max` (at least one).
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
        // Copy the held entries first: one leaves the tail only after it is in storage, so
        // every index is found in one place or the other. What the tail lacks (older
        // entries, or a gap a snapshot left) comes from storage.
        let held = self.tail.lock().expect("tail lock").range(start, end);
        let mut held = held.into_iter().peekable();
        let mut entries = Vec::new();
        let mut bytes = 0;
        let mut next = start;
        while next < end && bytes < bytes_max {
            if let Some((index, size, entry)) = held.next_if(|(index, ..)| *index == next) {
                bytes += size;
                entries.push(entry);
                next = index + 1;
                continue;
            }
            let stop = held.peek().map_or(end, |(index, ..)| *index);
            let rows = self
                .shard
                .log_entries_limited(self.group, next, stop, bytes_max - bytes)?;
            for (_, row) in &rows {
                bytes += row.len();
                entries.push(decode(row)?);
            }
            // Storage had all it holds of `next..stop` (unless the bound stopped it): the
            // held entries, if any, come next.
            next = stop;
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

    /// What the state machine applies: read like any range, after which the held entries
    /// up to its end have served their last purpose in memory.
    async fn entries_stream<RB>(
        &mut self,
        range: RB,
    ) -> impl futures::Stream<Item = Result<EntryOf<TypeConfig>, io::Error>> + OptionalSend
    where
        RB: RangeBounds<u64> + Clone + Debug + OptionalSend,
    {
        let (start, end) = bounds(&range);
        let read = self.entries_limited(start, end, usize::MAX);
        if let Ok(entries) = &read
            && let Some(last) = entries.last()
        {
            let mut tail = self.tail.lock().expect("tail lock");
            tail.applied = tail.applied.max(Some(last.index()));
            tail.trim();
        }
        let items: Vec<Result<EntryOf<TypeConfig>, io::Error>> = match read {
            Ok(entries) => entries.into_iter().map(Ok).collect(),
            Err(err) => vec![Err(err)],
        };
        futures::stream::iter(items)
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
            .tail
            .lock()
            .expect("tail lock")
            .entries
            .last_key_value()
            .map(|(_, held)| held.entry.log_id());
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
        if self
            .committed_saved
            .is_some_and(|at| at.elapsed() < self.committed_save_interval)
        {
            return Ok(());
        }
        self.committed_saved = Some(std::time::Instant::now());
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
        let since = Instant::now();
        let mut stage = None;
        let mut mutations = Vec::new();
        let mut ids = Vec::new();
        {
            let mut tail = self.tail.lock().expect("tail lock");
            for entry in entries {
                if ids.is_empty() {
                    stage = self.write_stage(&entry);
                }
                let encoded = encode(&entry)?;
                let bytes = encoded.len();
                mutations.push(Mutation::PutLog {
                    group: self.group,
                    index: entry.index(),
                    entry: encoded,
                });
                ids.push(entry.log_id());
                let replaced = tail.entries.insert(
                    entry.index(),
                    Held {
                        entry,
                        bytes,
                        written: false,
                    },
                );
                if let Some(old) = replaced
                    && old.written
                {
                    tail.written_bytes -= old.bytes;
                }
            }
        }
        // Queue the write (shared with every other group's in the shard's next commit) and
        // return: the entries are readable from the tail meanwhile. Openraft hears of the
        // flush once the shard's log has them durably; once redb has committed them too
        // they are readable from storage and may leave the tail.
        let tail = self.tail.clone();
        let flushed = move |result: Result<(), tributary_storage::StorageError>| {
            if result.is_ok()
                && let Some(stage) = stage
            {
                stage.record_since(since);
            }
            callback.io_completed(result.map_err(io::Error::from));
        };
        self.shard
            .submit_flushed(mutations, Durability::Immediate, flushed, move |result| {
                if result.is_ok() {
                    let mut tail = tail.lock().expect("tail lock");
                    let mut written = 0;
                    for id in ids {
                        // Unless a truncation replaced it meanwhile.
                        if let Some(held) = tail.entries.get_mut(&id.index())
                            && held.entry.log_id() == id
                            && !held.written
                        {
                            held.written = true;
                            written += held.bytes;
                        }
                    }
                    tail.written_bytes += written;
                    tail.trim();
                }
            })
            .await?;
        Ok(())
    }

    async fn truncate_after(
        &mut self,
        last_log_id: Option<LogIdOf<TypeConfig>>,
    ) -> Result<(), io::Error> {
        let from = last_log_id.map_or(0, |id| id.index() + 1);
        // Held entries from `from` on go now; the truncation is queued behind their writes,
        // so storage ends up without them too.
        {
            let mut tail = self.tail.lock().expect("tail lock");
            let dropped = tail.entries.split_off(&from);
            let written: usize = dropped
                .values()
                .filter(|held| held.written)
                .map(|held| held.bytes)
                .sum();
            tail.written_bytes -= written;
            if tail.applied.is_some_and(|applied| applied >= from) {
                tail.applied = from.checked_sub(1);
            }
        }
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
        // A partition's log is its data: purging only moves the pointer, and retention
        // removes old rows once every event in them has expired. The controller's snapshot
        // is its whole state, so its purged rows go (they would otherwise keep every
        // segment file they lie in, and checkpoints write controller entries all the time).
        // The rows go in the same write as the pointer, after the applied state the
        // snapshot covers (the shard applies writes in order, so a crash keeps a prefix).
        let value = encode(&log_id)?;
        let mut mutations = vec![Mutation::PutMeta {
            group: self.group,
            key: MetaKey::Purged,
            value,
        }];
        if self.group == GroupId::CONTROLLER {
            mutations.push(Mutation::PurgeLogThrough {
                group: self.group,
                through: log_id.index(),
            });
        }
        self.shard.write(mutations, Durability::Immediate).await?;
        self.first_readable
            .fetch_max(log_id.index() + 1, Ordering::AcqRel);
        Ok(())
    }
}

/// Decodes a stored log row back into a Raft entry; the node reads committed events this way.
pub fn decode_entry(bytes: &[u8]) -> io::Result<EntryOf<TypeConfig>> {
    decode(bytes)
}

/// [`decode_entry`], with the entry's events sharing `bytes`' buffer instead of copied.
pub fn decode_entry_shared(bytes: &Bytes) -> io::Result<EntryOf<TypeConfig>> {
    Ok(format::decode_shared(bytes)?)
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

    fn body_bytes(entry: &EntryOf<TypeConfig>) -> usize {
        match &entry.payload {
            openraft::EntryPayload::Normal(Proposal::Append(batch)) => batch.events.len(),
            other => panic!("not an append: {other:?}"),
        }
    }

    /// The committed log id is saved at most once per interval: commits in between are
    /// not written, and the first after the interval is.
    #[tokio::test]
    async fn the_committed_log_id_is_saved_at_most_once_per_interval() {
        use openraft::storage::RaftLogStorage as _;
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
        let group = GroupId::new(HubId(1), PartitionId(0), 0);
        let mut store = LogStore::new(group, shard.clone()).unwrap();
        store.committed_save_interval = std::time::Duration::from_secs(3600);
        let id = |index: u64| Some(entry(index, 1).log_id);
        // An awaited write commits what was queued before it: the saves are readable.
        let readable = async || {
            shard
                .write(Vec::new(), Durability::Immediate)
                .await
                .unwrap()
        };
        for index in 1..=50 {
            store.save_committed(id(index)).await.unwrap();
        }
        readable().await;
        assert_eq!(store.read_committed().await.unwrap(), id(1));
        store.committed_save_interval = std::time::Duration::ZERO;
        store.save_committed(id(51)).await.unwrap();
        readable().await;
        assert_eq!(store.read_committed().await.unwrap(), id(51));
    }

    async fn append(store: &mut LogStore, entries: Vec<EntryOf<TypeConfig>>) {
        use openraft::type_config::async_runtime::Oneshot as _;
        let (tx, rx) = openraft::alias::OneshotOf::<TypeConfig>::channel();
        store.append(entries, IOFlushed::signal(tx)).await.unwrap();
        rx.await.unwrap().unwrap();
    }

    /// Appended entries stay in memory after their write until the state machine has read
    /// them, so applying and replicating do not read them back; then storage serves them.
    #[tokio::test]
    async fn entries_are_read_from_memory_until_applied_then_from_storage() {
        use futures::StreamExt as _;
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
        let group = GroupId::new(HubId(1), PartitionId(0), 0);
        let mut store = LogStore::new(group, shard.clone()).unwrap();
        append(&mut store, (1..=4).map(|i| entry(i, 10)).collect()).await;
        // Storage holds them now. Mark its copies (20-byte bodies): only a read from
        // storage returns those.
        let marked = (1..=4)
            .map(|index| Mutation::PutLog {
                group,
                index,
                entry: encode(&entry(index, 20)).unwrap(),
            })
            .collect();
        shard.write(marked, Durability::Immediate).await.unwrap();
        let sizes = |entries: Vec<EntryOf<TypeConfig>>| -> Vec<usize> {
            entries.iter().map(body_bytes).collect()
        };
        assert_eq!(
            sizes(store.try_get_log_entries(1..5).await.unwrap()),
            vec![10, 10, 10, 10]
        );
        // The state machine applies 1 and 2.
        let applied: Vec<_> = store.entries_stream(1..3).await.collect().await;
        assert_eq!(applied.len(), 2);
        assert_eq!(
            sizes(store.try_get_log_entries(1..5).await.unwrap()),
            vec![20, 20, 10, 10]
        );
        // Held entries older than a gap (a snapshot installed past them) still read in
        // order with what storage holds between.
        append(&mut store, vec![entry(6, 10)]).await;
        shard
            .write(
                vec![Mutation::PutLog {
                    group,
                    index: 5,
                    entry: encode(&entry(5, 20)).unwrap(),
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        let all = store.try_get_log_entries(1..7).await.unwrap();
        assert_eq!(indexes_of(&all), (1..=6).collect::<Vec<u64>>());
        assert_eq!(sizes(all), vec![20, 20, 10, 10, 20, 10]);
    }

    /// Written entries the state machine does not take are held within a bound: the
    /// oldest go first, and are then read from storage.
    #[tokio::test]
    async fn written_entries_are_held_within_a_bound() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
        let group = GroupId::new(HubId(1), PartitionId(0), 0);
        let mut store = LogStore::new(group, shard).unwrap();
        let entry_bytes = 1024 * 1024;
        let count = (TAIL_WRITTEN_BYTES_MAX / entry_bytes) as u64 + 4;
        for index in 1..=count {
            append(&mut store, vec![entry(index, entry_bytes)]).await;
        }
        {
            let tail = store.tail.lock().unwrap();
            assert!(tail.written_bytes <= TAIL_WRITTEN_BYTES_MAX);
            assert_eq!(tail.entries.keys().next_back(), Some(&count));
            assert!(*tail.entries.keys().next().unwrap() > 1);
        }
        let all = store.try_get_log_entries(1..count + 1).await.unwrap();
        assert_eq!(indexes_of(&all), (1..=count).collect::<Vec<u64>>());
    }

    /// Purging a partition's log hides its rows from openraft and keeps them (they are the
    /// partition's data); purging the controller's deletes them (its snapshot is its state).
    #[tokio::test]
    async fn purge_deletes_only_the_controllers_rows() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
        let partition = GroupId::new(HubId(1), PartitionId(0), 0);
        for group in [partition, GroupId::CONTROLLER] {
            let mut store = LogStore::new(group, shard.clone()).unwrap();
            append(&mut store, (1..=6).map(|i| entry(i, 10)).collect()).await;
            let purged = entry(4, 10).log_id;
            store.purge(purged).await.unwrap();
            let state = store.get_log_state().await.unwrap();
            assert_eq!(state.last_purged_log_id, Some(purged));
            assert_eq!(
                indexes_of(&store.try_get_log_entries(5..7).await.unwrap()),
                [5, 6]
            );
            let stored: Vec<u64> = shard
                .log_sizes(group)
                .unwrap()
                .into_iter()
                .map(|(index, _)| index)
                .collect();
            if group == GroupId::CONTROLLER {
                assert_eq!(stored, [5, 6], "the controller's purged rows are deleted");
            } else {
                assert_eq!(stored, [1, 2, 3, 4, 5, 6], "a partition's rows are kept");
            }
        }
    }

    fn indexes_of(entries: &[EntryOf<TypeConfig>]) -> Vec<u64> {
        entries.iter().map(|e| e.index()).collect()
    }
}
