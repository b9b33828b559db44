use std::collections::BTreeMap;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use redb::{Database, ReadableDatabase, ReadableTable, WriteTransaction};
use tokio::sync::{mpsc, oneshot, watch};
use tributary_types::{GroupId, HubId, SendStage};

use crate::error::StorageError;
use crate::mutation::{Durability, IndexRow, MetaKey, Mutation};
use crate::tables::{
    CATALOG, LOG_LOCATION, OFFSET_INDEX, RAFT_LOG, RAFT_META, REPLAY_OFFSET, REPLAY_SEGMENT,
    SEGMENT_LIVE, SEQ_INDEX, TIME_INDEX, WAL_GENERATION, WAL_STATE,
};
use crate::wal::{Location, Position, Segments, Wal};

/// Limits of one shard. Every queue and batch is bounded.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Writes waiting for the writer thread; a full queue makes writers wait (back-pressure).
    pub queue_depth_max: usize,
    /// Writes merged into one transaction at most.
    pub batch_writes_max: usize,
    /// Bytes merged into one transaction at most.
    pub batch_bytes_max: usize,
    /// redb page cache.
    pub cache_bytes: usize,
    /// A checkpoint (a durable redb commit, after which the log's records before it need
    /// no replay) once this many bytes were logged since the last one...
    pub checkpoint_bytes: u64,
    /// ...or once this much time has passed since the last one with writes pending.
    pub checkpoint_interval: std::time::Duration,
    /// A log segment file grows to about this size before the next one starts; a segment is
    /// deleted once none of its entries is kept.
    pub segment_bytes_max: u64,
    /// With a log, how long a batch's redb commit may wait for later batches to share it
    /// when no write is queued (see [`writer_loop`]); zero commits at once.
    pub index_commit_linger: std::time::Duration,
}

impl Default for ShardConfig {
    fn default() -> Self {
        Self {
            queue_depth_max: 8192,
            batch_writes_max: 4096,
            batch_bytes_max: 32 * 1024 * 1024,
            cache_bytes: 256 * 1024 * 1024,
            checkpoint_bytes: 64 * 1024 * 1024,
            checkpoint_interval: std::time::Duration::from_secs(1),
            segment_bytes_max: 64 * 1024 * 1024,
            index_commit_linger: INDEX_COMMIT_LINGER,
        }
    }
}

/// [`ShardConfig::index_commit_linger`]'s default. A producer that waits for each send
/// makes a batch of one or two writes per fsync, and a redb commit each; sharing one among
/// the batches of a couple of milliseconds cut a node's CPU per such send by about 8%. Only
/// readability waits for it (durability is the log's, reported at the fsync).
pub const INDEX_COMMIT_LINGER: std::time::Duration = std::time::Duration::from_millis(2);

/// Counters of one shard, for tests and benchmarks.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShardStats {
    /// Batches of writes completed.
    pub commits: u64,
    pub fsyncs: u64,
    pub writes: u64,
    /// redb transactions committed for them (with a log, one may serve several batches).
    pub index_commits: u64,
}

/// Hub ids with this bit set name staging areas, never hubs (the controller numbers hubs
/// from 1 up): a snapshot being received is written under its group's staging key, with
/// the ordinary writes, until [`Mutation::InstallStaged`] moves it under the group's own.
const STAGING_HUB_BIT: u32 = 1 << 31;

/// The key a snapshot of `group` is staged under while it is received.
pub fn staging_group(group: GroupId) -> GroupId {
    GroupId::new(
        HubId(group.hub.0 | STAGING_HUB_BIT),
        group.partition,
        group.incarnation,
    )
}

/// Whether `group` is a staging key (see [`staging_group`]).
pub fn is_staging(group: GroupId) -> bool {
    group.hub.0 & STAGING_HUB_BIT != 0
}

/// Consecutive log entries of a group and the index rows of those among them that hold
/// events, read in one transaction (so retention cannot have removed one but not the
/// other): a piece of a snapshot being sent.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LogPiece {
    pub entries: Vec<(u64, Bytes)>,
    pub index: Vec<IndexRow>,
}

impl LogPiece {
    /// Stored bytes of the piece's entries.
    pub fn entry_bytes(&self) -> usize {
        self.entries.iter().map(|(_, bytes)| bytes.len()).sum()
    }
}

type Completion = Box<dyn FnOnce(Result<(), StorageError>) + Send + 'static>;

struct Write {
    mutations: Vec<Mutation>,
    durability: Durability,
    /// Runs once the write is durable: after the log's fsync, before redb makes it
    /// readable (for a shard without a log, or a batch of lazy writes only, with `done`).
    flushed: Option<Completion>,
    done: Completion,
    /// When it was queued (the `storage_queue` stage of a durable write).
    queued: Instant,
    /// Its caller waits for `done` ([`Shard::write`]): the batch holding it commits without
    /// lingering.
    awaited: bool,
}

struct Counters {
    commits: AtomicU64,
    fsyncs: AtomicU64,
    writes: AtomicU64,
    index_commits: AtomicU64,
}

/// One redb database and its single writer thread. Cheap to clone.
///
/// A failed commit (a full disk, an I/O error) fails the shard for good: redb must be closed
/// and re-opened after one, and the Raft groups whose writes failed cannot go on either. The
/// shard then refuses every write with [`StorageError::Failed`] and [`Shard::failed`]
/// resolves, so the node can stop and be restarted from what is durable (fail-stop).
#[derive(Clone)]
pub struct Shard {
    db: Arc<Database>,
    /// The log's segment files, where entries' bytes are read from (none for a shard opened
    /// on another backend: its entries are held whole in redb).
    segments: Option<Arc<Segments>>,
    tx: mpsc::Sender<Write>,
    counters: Arc<Counters>,
    failure: Arc<watch::Sender<Option<StorageError>>>,
    path: Arc<PathBuf>,
    writer: Arc<std::sync::Mutex<Option<std::thread::JoinHandle<()>>>>,
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard").field("path", &self.path).finish()
    }
}

impl Shard {
    /// Opens (or creates) the database at `path` and its log beside it (a directory of the
    /// same name, extension `segments`; see `wal.rs`), replays the log's writes that the
    /// database does not hold yet, and starts the writer thread. The thread ends when every
    /// clone of the shard is dropped.
    pub fn open(path: &Path, config: ShardConfig) -> Result<Shard, StorageError> {
        let db = Database::builder()
            .set_cache_size(config.cache_bytes)
            .create(path)
            .map_err(|e| StorageError::Io(format!("cannot open {}: {e}", path.display())))?;
        Self::start(db, path, Some(path), config)
    }

    /// As [`Shard::open`], on any redb storage backend (tests inject failing ones), without
    /// a write-ahead log: every durable write is a durable redb commit.
    pub fn open_with_backend(
        backend: impl redb::StorageBackend,
        name: &Path,
        config: ShardConfig,
    ) -> Result<Shard, StorageError> {
        let db = Database::builder()
            .set_cache_size(config.cache_bytes)
            .create_with_backend(backend)
            .map_err(|e| StorageError::Io(format!("cannot open {}: {e}", name.display())))?;
        Self::start(db, name, None, config)
    }

    fn start(
        db: Database,
        path: &Path,
        logged: Option<&Path>,
        config: ShardConfig,
    ) -> Result<Shard, StorageError> {
        let db = Arc::new(db);
        let (generation, from) = {
            // Create every table up front so readers never see a missing table.
            let txn = db.begin_write().map_err(StorageError::io)?;
            txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
            txn.open_table(LOG_LOCATION).map_err(StorageError::io)?;
            txn.open_table(SEGMENT_LIVE).map_err(StorageError::io)?;
            txn.open_table(RAFT_META).map_err(StorageError::io)?;
            txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
            txn.open_table(OFFSET_INDEX).map_err(StorageError::io)?;
            txn.open_table(TIME_INDEX).map_err(StorageError::io)?;
            txn.open_table(CATALOG).map_err(StorageError::io)?;
            let state = txn.open_table(WAL_STATE).map_err(StorageError::io)?;
            let get = |key| {
                state
                    .get(key)
                    .map(|v| v.map_or(0, |v| v.value()))
                    .map_err(StorageError::io)
            };
            let found = (
                get(WAL_GENERATION)?,
                Position {
                    segment: get(REPLAY_SEGMENT)?,
                    offset: get(REPLAY_OFFSET)?,
                },
            );
            drop(state);
            txn.commit().map_err(StorageError::io)?;
            found
        };
        let wal = match logged {
            Some(path) => Some(open_log(&db, path, generation, from, &config)?),
            None => None,
        };
        let segments = wal.as_ref().map(|logged| logged.wal.segments().clone());
        let (tx, rx) = mpsc::channel(config.queue_depth_max);
        let counters = Arc::new(Counters {
            commits: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            index_commits: AtomicU64::new(0),
        });
        let failure = Arc::new(watch::channel(None).0);
        let writer_db = db.clone();
        let writer_counters = counters.clone();
        let writer_failure = failure.clone();
        let writer = std::thread::Builder::new()
            .name("storage-writer".to_string())
            .spawn(move || writer_loop(writer_db, wal, rx, config, writer_counters, writer_failure))
            .map_err(StorageError::io)?;
        let shard = Shard {
            db,
            segments,
            tx,
            counters,
            failure,
            path: Arc::new(path.to_path_buf()),
            writer: Arc::new(std::sync::Mutex::new(Some(writer))),
        };
        shard.discard_staged()?;
        Ok(shard)
    }

    /// Deletes what snapshots left staged when the node stopped while receiving them (a
    /// staged snapshot is only ever installed by the transfer that wrote it; the leader
    /// sends the replica a new one).
    fn discard_staged(&self) -> Result<(), StorageError> {
        let staged = self.staged_groups()?;
        if staged.is_empty() {
            return Ok(());
        }
        tracing::info!(
            shard = %self.path.display(),
            snapshots = staged.len(),
            "discarding snapshots left partly received"
        );
        let write = Write {
            mutations: staged
                .into_iter()
                .map(|group| Mutation::DeleteGroup { group })
                .collect(),
            durability: Durability::Lazy,
            flushed: None,
            done: Box::new(|_| {}),
            queued: Instant::now(),
            awaited: false,
        };
        // The queue is empty: nothing else has been written yet.
        self.tx
            .try_send(write)
            .map_err(|_| StorageError::Io("the storage writer did not start".into()))
    }

    /// Whether `other` is a handle to this same shard.
    pub fn is_same(&self, other: &Shard) -> bool {
        Arc::ptr_eq(&self.db, &other.db)
    }

    /// Resolves with the first failed commit's error once the shard has failed (see
    /// [`Shard`]); pending forever while it works.
    pub async fn failed(&self) -> StorageError {
        let mut rx = self.failure.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(failure) => failure.clone().expect("waited for a failure"),
            // The sender lives as long as this shard: unreachable, but never a false alarm.
            Err(_) => std::future::pending().await,
        }
    }

    /// Closes the database once every other handle is gone: waits (up to `timeout`) for
    /// other clones to drop, lets the writer finish queued writes, and releases the file.
    pub async fn close(self, timeout: std::time::Duration) -> Result<(), StorageError> {
        let deadline = tokio::time::Instant::now() + timeout;
        while Arc::strong_count(&self.writer) > 1 {
            if tokio::time::Instant::now() >= deadline {
                return Err(StorageError::StillInUse(format!(
                    "storage shard {} is still in use after {timeout:?}",
                    self.path.display()
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let Shard { db, tx, writer, .. } = self;
        drop(tx);
        drop(db);
        let handle = writer.lock().expect("writer lock").take();
        if let Some(handle) = handle {
            tokio::task::spawn_blocking(move || handle.join())
                .await
                .map_err(StorageError::io)?
                .map_err(|_| StorageError::Io("storage writer thread panicked".into()))?;
        }
        Ok(())
    }

    /// Queues a write; `done` runs on the writer thread once the transaction holding it has
    /// committed (and, for [`Durability::Immediate`], been fsynced). Waits while the queue is full.
    pub async fn submit(
        &self,
        mutations: Vec<Mutation>,
        durability: Durability,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<(), StorageError> {
        self.queue(mutations, durability, None, Box::new(done), false)
            .await
    }

    /// As [`Shard::submit`], and `flushed` runs as soon as the write is durable in the log:
    /// after its fsync, before the redb commit that makes it readable, which `done` waits
    /// for. A caller that keeps what it wrote readable meanwhile (a Raft log's unwritten
    /// tail) can report durability a redb commit sooner. Both run once; if the write fails
    /// before it is durable, both get the error. A lazy write's `flushed` runs with `done`
    /// (nothing fsyncs it).
    pub async fn submit_flushed(
        &self,
        mutations: Vec<Mutation>,
        durability: Durability,
        flushed: impl FnOnce(Result<(), StorageError>) + Send + 'static,
        done: impl FnOnce(Result<(), StorageError>) + Send + 'static,
    ) -> Result<(), StorageError> {
        self.queue(
            mutations,
            durability,
            Some(Box::new(flushed)),
            Box::new(done),
            false,
        )
        .await
    }

    async fn queue(
        &self,
        mutations: Vec<Mutation>,
        durability: Durability,
        flushed: Option<Completion>,
        done: Completion,
        awaited: bool,
    ) -> Result<(), StorageError> {
        self.tx
            .send(Write {
                mutations,
                durability,
                flushed,
                done,
                queued: Instant::now(),
                awaited,
            })
            .await
            .map_err(|_| StorageError::Closed)
    }

    /// Writes and waits for the commit, which does not linger for later writes (a caller
    /// writing one thing after another, such as a node creating its replicas, would wait
    /// out the linger each time).
    pub async fn write(
        &self,
        mutations: Vec<Mutation>,
        durability: Durability,
    ) -> Result<(), StorageError> {
        let (tx, rx) = oneshot::channel();
        self.queue(
            mutations,
            durability,
            None,
            Box::new(move |res| {
                let _ = tx.send(res);
            }),
            true,
        )
        .await?;
        rx.await.map_err(|_| StorageError::Closed)?
    }

    pub fn stats(&self) -> ShardStats {
        ShardStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            fsyncs: self.counters.fsyncs.load(Ordering::Relaxed),
            writes: self.counters.writes.load(Ordering::Relaxed),
            index_commits: self.counters.index_commits.load(Ordering::Relaxed),
        }
    }

    // ---- reads: each runs in its own read transaction and sees every committed write ----

    /// Log entries with index in `[start, end)`, in order.
    pub fn log_entries(
        &self,
        group: GroupId,
        start: u64,
        end: u64,
    ) -> Result<Vec<(u64, Bytes)>, StorageError> {
        self.log_entries_limited(group, start, end, usize::MAX)
    }

    /// Log rows `start..end` in order, stopping after the row that brings their total size
    /// to `bytes_max` or more (so at least one row when the range holds any).
    pub fn log_entries_limited(
        &self,
        group: GroupId,
        start: u64,
        end: u64,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, StorageError> {
        if start >= end {
            return Ok(Vec::new());
        }
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        self.read_entries(&txn, group.to_u64(), start, end, bytes_max)
    }

    /// Entries `start..end` of group `g` as `txn` sees them (see
    /// [`Shard::log_entries_limited`]).
    fn read_entries(
        &self,
        txn: &redb::ReadTransaction,
        g: u64,
        start: u64,
        end: u64,
        bytes_max: usize,
    ) -> Result<Vec<(u64, Bytes)>, StorageError> {
        let mut out = Vec::new();
        if start >= end {
            return Ok(out);
        }
        // Entries held whole (no log on disk, or written by an earlier version) and entries
        // in the log, merged by index: an entry held whole that was later rewritten (by
        // compaction) lies in the log among entries still held whole. Where both hold an
        // index, the log's is the newer, as in `log_entry`.
        let whole = txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
        let mut whole_rows = whole
            .range((g, start)..(g, end))
            .map_err(StorageError::io)?;
        let located = match &self.segments {
            Some(segments) => Some((
                segments,
                txn.open_table(LOG_LOCATION).map_err(StorageError::io)?,
            )),
            None => None,
        };
        let mut located_rows = match &located {
            Some((_, table)) => Some(
                table
                    .range((g, start)..(g, end))
                    .map_err(StorageError::io)?,
            ),
            None => None,
        };
        let mut next_whole = whole_rows.next().transpose().map_err(StorageError::io)?;
        let mut next_located = match located_rows.as_mut() {
            Some(rows) => rows.next().transpose().map_err(StorageError::io)?,
            None => None,
        };
        let mut bytes = 0;
        loop {
            let whole_index = next_whole.as_ref().map(|(k, _)| k.value().1);
            let located_index = next_located.as_ref().map(|(k, _)| k.value().1);
            let from_log = match (whole_index, located_index) {
                (None, None) => break,
                (Some(w), Some(l)) => l <= w,
                (None, Some(_)) => true,
                (Some(_), None) => false,
            };
            let entry = if from_log {
                if whole_index == located_index {
                    next_whole = whole_rows.next().transpose().map_err(StorageError::io)?;
                }
                let (segments, _) = located.as_ref().expect("located rows need the log");
                let rows = located_rows.as_mut().expect("located rows need the log");
                let (k, v) = std::mem::replace(
                    &mut next_located,
                    rows.next().transpose().map_err(StorageError::io)?,
                )
                .expect("peeked above");
                (k.value().1, segments.read(location(v.value()))?)
            } else {
                let (k, v) = std::mem::replace(
                    &mut next_whole,
                    whole_rows.next().transpose().map_err(StorageError::io)?,
                )
                .expect("peeked above");
                (k.value().1, Bytes::copy_from_slice(v.value()))
            };
            bytes += entry.1.len();
            out.push(entry);
            if bytes >= bytes_max {
                break;
            }
        }
        Ok(out)
    }

    /// One log entry.
    pub fn log_entry(&self, group: GroupId, index: u64) -> Result<Option<Bytes>, StorageError> {
        let key = (group.to_u64(), index);
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        if let Some(segments) = &self.segments {
            let located = txn.open_table(LOG_LOCATION).map_err(StorageError::io)?;
            if let Some(v) = located.get(key).map_err(StorageError::io)? {
                return segments.read(location(v.value())).map(Some);
            }
        }
        let whole = txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
        Ok(whole
            .get(key)
            .map_err(StorageError::io)?
            .map(|v| Bytes::copy_from_slice(v.value())))
    }

    /// The entry with the highest index, if any.
    pub fn last_log_entry(&self, group: GroupId) -> Result<Option<(u64, Bytes)>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let mut located = None;
        if let Some(segments) = &self.segments {
            let table = txn.open_table(LOG_LOCATION).map_err(StorageError::io)?;
            let last = table
                .range((g, 0)..=(g, u64::MAX))
                .map_err(StorageError::io)?
                .next_back();
            if let Some(row) = last {
                let (k, v) = row.map_err(StorageError::io)?;
                located = Some((k.value().1, segments, location(v.value())));
            }
        }
        let whole = txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
        let last_whole = whole
            .range((g, 0)..=(g, u64::MAX))
            .map_err(StorageError::io)?
            .next_back()
            .transpose()
            .map_err(StorageError::io)?;
        // Entries held whole usually all come before those in the log, but one rewritten
        // into the log (compaction) may come before entries still held whole.
        match (located, last_whole) {
            (Some((index, segments, at)), whole)
                if whole.as_ref().is_none_or(|(k, _)| k.value().1 <= index) =>
            {
                Ok(Some((index, segments.read(at)?)))
            }
            (_, Some((k, v))) => Ok(Some((k.value().1, Bytes::copy_from_slice(v.value())))),
            (_, None) => Ok(None),
        }
    }

    /// Entries `start..end` of `group` (stopping after the one that brings their size to
    /// `bytes_max`, as [`Shard::log_entries_limited`]) and the index rows of those entries,
    /// from the row with first sequence `from_sequence` on.
    pub fn log_piece(
        &self,
        group: GroupId,
        start: u64,
        end: u64,
        from_sequence: i64,
        bytes_max: usize,
    ) -> Result<LogPiece, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let entries = self.read_entries(&txn, g, start, end, bytes_max)?;
        let mut index = Vec::new();
        if let (Some((first, _)), Some((last, _))) = (entries.first(), entries.last()) {
            let table = txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
            for row in table
                .range((g, from_sequence)..=(g, i64::MAX))
                .map_err(StorageError::io)?
            {
                let (k, v) = row.map_err(StorageError::io)?;
                let row = index_row(k.value().1, v.value());
                if row.log_index > *last {
                    break;
                }
                if row.log_index >= *first {
                    index.push(row);
                }
            }
        }
        Ok(LogPiece { entries, index })
    }

    /// The staging keys (see [`staging_group`]) that hold anything.
    pub fn staged_groups(&self) -> Result<Vec<GroupId>, StorageError> {
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let first_staged = u64::from(STAGING_HUB_BIT) << 32;
        let mut found = std::collections::BTreeSet::new();
        // One probe per staged group and table, not a walk over its rows.
        let mut probe = |next: &mut dyn FnMut(u64) -> Result<Option<u64>, StorageError>| {
            let mut from = first_staged;
            while let Some(g) = next(from)? {
                found.insert(g);
                match g.checked_add(1) {
                    Some(after) => from = after,
                    None => break,
                }
            }
            Ok::<_, StorageError>(())
        };
        let log = txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
        probe(&mut |from| {
            let mut rows = log.range((from, 0)..).map_err(StorageError::io)?;
            Ok(rows
                .next()
                .transpose()
                .map_err(StorageError::io)?
                .map(|(k, _)| k.value().0))
        })?;
        let located = txn.open_table(LOG_LOCATION).map_err(StorageError::io)?;
        probe(&mut |from| {
            let mut rows = located.range((from, 0)..).map_err(StorageError::io)?;
            Ok(rows
                .next()
                .transpose()
                .map_err(StorageError::io)?
                .map(|(k, _)| k.value().0))
        })?;
        let seq = txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
        probe(&mut |from| {
            let mut rows = seq.range((from, i64::MIN)..).map_err(StorageError::io)?;
            Ok(rows
                .next()
                .transpose()
                .map_err(StorageError::io)?
                .map(|(k, _)| k.value().0))
        })?;
        Ok(found.into_iter().map(GroupId::from_u64).collect())
    }

    /// Every group with state in this shard (Raft metadata), in id order.
    pub fn groups(&self) -> Result<Vec<GroupId>, StorageError> {
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(RAFT_META).map_err(StorageError::io)?;
        let mut groups: Vec<GroupId> = Vec::new();
        for row in table.range::<(u64, u8)>(..).map_err(StorageError::io)? {
            let (key, _) = row.map_err(StorageError::io)?;
            let group = GroupId::from_u64(key.value().0);
            if !is_staging(group) && groups.last() != Some(&group) {
                groups.push(group);
            }
        }
        Ok(groups)
    }

    pub fn meta(&self, group: GroupId, key: MetaKey) -> Result<Option<Bytes>, StorageError> {
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(RAFT_META).map_err(StorageError::io)?;
        Ok(table
            .get((group.to_u64(), key as u8))
            .map_err(StorageError::io)?
            .map(|v| Bytes::copy_from_slice(v.value())))
    }

    /// The index row of the entry holding `sequence`: the last row whose first sequence is
    /// at or before it.
    pub fn index_for_sequence(
        &self,
        group: GroupId,
        sequence: i64,
    ) -> Result<Option<IndexRow>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
        let mut range = table
            .range((g, i64::MIN)..=(g, sequence))
            .map_err(StorageError::io)?;
        match range.next_back() {
            Some(row) => {
                let (k, v) = row.map_err(StorageError::io)?;
                Ok(Some(index_row(k.value().1, v.value())))
            }
            None => Ok(None),
        }
    }

    /// The group's index rows of entries up to log index `through`, in sequence order.
    pub fn index_rows(&self, group: GroupId, through: u64) -> Result<Vec<IndexRow>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
        let mut rows = Vec::new();
        for row in table
            .range((g, i64::MIN)..=(g, i64::MAX))
            .map_err(StorageError::io)?
        {
            let (k, v) = row.map_err(StorageError::io)?;
            let row = index_row(k.value().1, v.value());
            if row.log_index > through {
                break;
            }
            rows.push(row);
        }
        Ok(rows)
    }

    /// The first index row of the group (the oldest retained entry).
    pub fn first_index(&self, group: GroupId) -> Result<Option<IndexRow>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
        let mut range = table
            .range((g, i64::MIN)..=(g, i64::MAX))
            .map_err(StorageError::io)?;
        match range.next() {
            Some(row) => {
                let (k, v) = row.map_err(StorageError::io)?;
                Ok(Some(index_row(k.value().1, v.value())))
            }
            None => Ok(None),
        }
    }

    /// The first index row of an entry after log index `log_index` (scans the rows before
    /// it: retention asks for the first row it keeps, having just passed the ones it
    /// removes).
    pub fn first_index_after(
        &self,
        group: GroupId,
        log_index: u64,
    ) -> Result<Option<IndexRow>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(SEQ_INDEX).map_err(StorageError::io)?;
        for row in table
            .range((g, i64::MIN)..=(g, i64::MAX))
            .map_err(StorageError::io)?
        {
            let (k, v) = row.map_err(StorageError::io)?;
            let row = index_row(k.value().1, v.value());
            if row.log_index > log_index {
                return Ok(Some(row));
            }
        }
        Ok(None)
    }

    /// Stored bytes of the group's log entries with index in `range`.
    pub fn log_bytes(
        &self,
        group: GroupId,
        range: std::ops::RangeInclusive<u64>,
    ) -> Result<u64, StorageError> {
        let g = group.to_u64();
        let (first, last) = (*range.start(), *range.end());
        if first > last {
            return Ok(0);
        }
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let mut bytes = 0;
        if self.segments.is_some() {
            let located = txn.open_table(LOG_LOCATION).map_err(StorageError::io)?;
            for row in located
                .range((g, first)..=(g, last))
                .map_err(StorageError::io)?
            {
                bytes += u64::from(row.map_err(StorageError::io)?.1.value().2);
            }
        }
        let whole = txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
        for row in whole
            .range((g, first)..=(g, last))
            .map_err(StorageError::io)?
        {
            bytes += row.map_err(StorageError::io)?.1.value().len() as u64;
        }
        Ok(bytes)
    }

    /// Stored size in bytes of each of the group's log rows, in index order.
    pub fn log_sizes(&self, group: GroupId) -> Result<Vec<(u64, u64)>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let mut sizes = Vec::new();
        if self.segments.is_some() {
            let located = txn.open_table(LOG_LOCATION).map_err(StorageError::io)?;
            for row in located
                .range((g, 0)..=(g, u64::MAX))
                .map_err(StorageError::io)?
            {
                let (k, v) = row.map_err(StorageError::io)?;
                sizes.push((k.value().1, u64::from(v.value().2)));
            }
        }
        let whole = txn.open_table(RAFT_LOG).map_err(StorageError::io)?;
        for row in whole
            .range((g, 0)..=(g, u64::MAX))
            .map_err(StorageError::io)?
        {
            let (k, v) = row.map_err(StorageError::io)?;
            sizes.push((k.value().1, v.value().len() as u64));
        }
        sizes.sort_unstable();
        Ok(sizes)
    }

    /// First sequence of the entry holding `offset`: the last entry starting at or before it.
    pub fn sequence_for_offset(
        &self,
        group: GroupId,
        offset: i64,
    ) -> Result<Option<i64>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(OFFSET_INDEX).map_err(StorageError::io)?;
        let mut range = table
            .range((g, i64::MIN)..=(g, offset))
            .map_err(StorageError::io)?;
        match range.next_back() {
            Some(row) => Ok(Some(row.map_err(StorageError::io)?.1.value())),
            None => Ok(None),
        }
    }

    /// First sequence of the first entry whose enqueued time is after `time_ms` (or at it,
    /// when `inclusive`).
    pub fn sequence_for_time(
        &self,
        group: GroupId,
        time_ms: i64,
        inclusive: bool,
    ) -> Result<Option<i64>, StorageError> {
        let g = group.to_u64();
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(TIME_INDEX).map_err(StorageError::io)?;
        let start = if inclusive {
            Bound::Included((g, time_ms, i64::MIN))
        } else {
            Bound::Excluded((g, time_ms, i64::MAX))
        };
        let mut range = table
            .range::<(u64, i64, i64)>((start, Bound::Included((g, i64::MAX, i64::MAX))))
            .map_err(StorageError::io)?;
        match range.next() {
            Some(row) => Ok(Some(row.map_err(StorageError::io)?.0.value().2)),
            None => Ok(None),
        }
    }

    pub fn catalog_get(&self, key: &str) -> Result<Option<Bytes>, StorageError> {
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(CATALOG).map_err(StorageError::io)?;
        Ok(table
            .get(key)
            .map_err(StorageError::io)?
            .map(|v| Bytes::copy_from_slice(v.value())))
    }

    /// Catalog records whose key starts with `prefix`, in key order.
    pub fn catalog_scan(&self, prefix: &str) -> Result<Vec<(String, Bytes)>, StorageError> {
        let txn = self.db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(CATALOG).map_err(StorageError::io)?;
        let mut out = Vec::new();
        for row in table.range(prefix..).map_err(StorageError::io)? {
            let (k, v) = row.map_err(StorageError::io)?;
            if !k.value().starts_with(prefix) {
                break;
            }
            out.push((k.value().to_string(), Bytes::copy_from_slice(v.value())));
        }
        Ok(out)
    }
}

fn index_row(first_sequence: i64, v: (u64, i64, i64, u32)) -> IndexRow {
    IndexRow {
        first_sequence,
        log_index: v.0,
        first_offset: v.1,
        enqueued_time_ms: v.2,
        event_count: v.3,
    }
}

/// The log of a shard and its checkpoint bookkeeping.
struct Checkpointed {
    wal: Wal,
    /// Rows of `log_location` pointing into each segment (as `segment_live` holds them).
    live: BTreeMap<u64, u64>,
    last: std::time::Instant,
}

/// Opens the log of the shard whose database is at `path`: replays, in one durable
/// commit, what an earlier version's single-file log still holds and the log's records
/// from the replay position on, then checkpoints (which deletes segments no longer needed).
fn open_log(
    db: &Database,
    path: &Path,
    generation: u64,
    from: Position,
    config: &ShardConfig,
) -> Result<Checkpointed, StorageError> {
    let legacy_path = path.with_extension("wal");
    let legacy = crate::wal::read_legacy(&legacy_path, generation)?;
    let dir = path.with_extension("segments");
    let (wal, replay) = Wal::open(&dir, from, config.segment_bytes_max)?;
    let replayed = legacy.len() + replay.len();
    // Zero after a clean stop: its final checkpoint left nothing to replay.
    metrics::counter!("tributary_storage_replayed_batches_total").increment(replayed as u64);
    if replayed > 0 {
        tracing::info!(
            batches = replayed,
            path = %dir.display(),
            "replaying the storage log"
        );
    }
    let txn = db.begin_write().map_err(StorageError::io)?;
    {
        let mut tables = Tables::new(&txn);
        for mutation in legacy.iter().flatten() {
            apply_mutation(&mut tables, mutation, None)?;
        }
        let mut placed = Placed::default();
        for batch in &replay {
            placed.locations = batch.locations.iter();
            for mutation in &batch.mutations {
                apply_mutation(&mut tables, mutation, Some(&mut placed))?;
            }
        }
        placed.store(&mut tables)?;
        tables
            .wal_state()?
            .remove(WAL_GENERATION)
            .map_err(StorageError::io)?;
    }
    txn.commit().map_err(StorageError::io)?;
    if !legacy.is_empty() || legacy_path.exists() {
        std::fs::remove_file(&legacy_path).map_err(|e| {
            StorageError::Io(format!("cannot remove {}: {e}", legacy_path.display()))
        })?;
    }
    let live = {
        let txn = db.begin_read().map_err(StorageError::io)?;
        let table = txn.open_table(SEGMENT_LIVE).map_err(StorageError::io)?;
        let mut live = BTreeMap::new();
        for row in table.range::<u64>(..).map_err(StorageError::io)? {
            let (k, v) = row.map_err(StorageError::io)?;
            live.insert(k.value(), v.value());
        }
        live
    };
    let on_disk = wal.segments().ids();
    if let Some((segment, rows)) = live
        .iter()
        .find(|(id, rows)| **rows > 0 && !on_disk.contains(id))
    {
        return Err(StorageError::Corrupt(format!(
            "log segment {segment} of {}, holding {rows} log entries, is missing",
            dir.display()
        )));
    }
    let mut checkpointed = Checkpointed {
        wal,
        live,
        last: std::time::Instant::now(),
    };
    checkpointed.checkpoint(db)?;
    Ok(checkpointed)
}

impl Checkpointed {
    fn due(&self, config: &ShardConfig) -> bool {
        self.wal.records() > 0
            && (self.wal.bytes() >= config.checkpoint_bytes
                || self.last.elapsed() >= config.checkpoint_interval)
    }

    /// Makes redb durable with the log's current end as the replay position, then deletes
    /// the segments before it that no row points into any more.
    fn checkpoint(&mut self, db: &Database) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let position = self.wal.position();
        let dead: Vec<u64> = self
            .wal
            .segments()
            .ids()
            .into_iter()
            .filter(|id| *id < position.segment && self.live.get(id).copied().unwrap_or(0) == 0)
            .collect();
        let mut txn = db.begin_write().map_err(StorageError::io)?;
        txn.set_durability(redb::Durability::Immediate)
            .map_err(StorageError::io)?;
        {
            let mut state = txn.open_table(WAL_STATE).map_err(StorageError::io)?;
            state
                .insert(REPLAY_SEGMENT, position.segment)
                .map_err(StorageError::io)?;
            state
                .insert(REPLAY_OFFSET, position.offset)
                .map_err(StorageError::io)?;
            let mut live = txn.open_table(SEGMENT_LIVE).map_err(StorageError::io)?;
            for id in &dead {
                live.remove(*id).map_err(StorageError::io)?;
            }
        }
        txn.commit().map_err(StorageError::io)?;
        self.wal.checkpointed();
        self.last = std::time::Instant::now();
        for id in dead {
            self.live.remove(&id);
            // Nothing points into it durably any more: a segment left behind is only
            // space, deleted at the next checkpoint.
            if let Err(err) = self.wal.delete(id) {
                tracing::warn!(%err, segment = id, "a log segment could not be deleted");
            }
        }
        metrics::gauge!("tributary_storage_segments").set(self.wal.segments().ids().len() as f64);
        metrics::histogram!("tributary_storage_checkpoint_seconds")
            .record(started.elapsed().as_secs_f64());
        Ok(())
    }
}

/// Where a batch's entries went in the log, and how many `log_location` rows each segment
/// gained or lost by the batch's writes.
#[derive(Default)]
struct Placed<'a> {
    locations: std::slice::Iter<'a, Location>,
    delta: BTreeMap<u64, i64>,
}

impl Placed<'_> {
    /// Adds the batch's changes to `segment_live`.
    fn store(&self, tables: &mut Tables<'_>) -> Result<(), StorageError> {
        let live = tables.segment_live()?;
        for (&segment, &delta) in &self.delta {
            let now = live
                .get(segment)
                .map_err(StorageError::io)?
                .map_or(0, |v| v.value());
            let next = now.checked_add_signed(delta).ok_or_else(|| {
                StorageError::Corrupt(format!(
                    "segment {segment} would hold {delta:+} rows from {now}"
                ))
            })?;
            live.insert(segment, next).map_err(StorageError::io)?;
        }
        Ok(())
    }
}

/// Batches at most whose redb commit waits for a later batch's (see [`writer_loop`]).
const DEFERRED_BATCHES_MAX: usize = 8;

fn writer_loop(
    db: Arc<Database>,
    mut wal: Option<Checkpointed>,
    mut rx: mpsc::Receiver<Write>,
    config: ShardConfig,
    counters: Arc<Counters>,
    failure: Arc<watch::Sender<Option<StorageError>>>,
) {
    let mut batch: Vec<Write> = Vec::new();
    // With a log, a batch is durable (and its `flushed` has run) once logged; its redb
    // commit only makes it readable. While more writes wait in the queue, that commit is
    // left to a later batch's (at most DEFERRED_BATCHES_MAX batches on): the writer goes on
    // to the next fsync at once, and one commit serves several batches. With the queue
    // empty it waits for the next write up to `index_commit_linger` after the oldest batch
    // it holds, then commits. The waiting writes keep their `done` here until then; readers
    // keep what they wrote readable meanwhile, as they do between `flushed` and `done`
    // anyway.
    let mut open: Option<Uncommitted> = None;
    // A write that arrived while the writer lingered: the next batch's first.
    let mut arrived: Option<Write> = None;
    // Waits with a timeout on the queue (a thread of its own has no runtime to do it).
    let lingers = wal.is_some() && !config.index_commit_linger.is_zero();
    let linger = lingers
        .then(|| {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
        })
        .and_then(|built| {
            built
                .inspect_err(|err| {
                    tracing::warn!(%err, "the storage writer commits every batch at once: it cannot wait with a timeout");
                })
                .ok()
        });
    while let Some(first) = arrived.take().or_else(|| rx.blocking_recv()) {
        let mut bytes: usize = first.mutations.iter().map(Mutation::size_bytes).sum();
        batch.push(first);
        while batch.len() < config.batch_writes_max && bytes < config.batch_bytes_max {
            match rx.try_recv() {
                Ok(write) => {
                    bytes += write
                        .mutations
                        .iter()
                        .map(Mutation::size_bytes)
                        .sum::<usize>();
                    batch.push(write);
                }
                Err(_) => break,
            }
        }
        let durable = batch.iter().any(|w| w.durability == Durability::Immediate);
        let failed_before = failure.borrow().clone();
        let started = Instant::now();
        let Some(checkpointed) = wal.as_mut() else {
            let result = match failed_before {
                Some(err) => Err(StorageError::Failed(err.to_string())),
                None => {
                    counters.index_commits.fetch_add(1, Ordering::Relaxed);
                    commit_batch(&db, &batch, durable, None)
                }
            };
            let writes = std::mem::take(&mut batch);
            Logged::new(writes, durable, started, None).finish(&result, &counters, &failure);
            continue;
        };
        // When the batch was durable in the log, before redb committed its index rows.
        let mut logged = None;
        let result = match failed_before {
            Some(err) => Err(StorageError::Failed(err.to_string())),
            // Logged (and fsynced when durable) first; redb then only makes the writes
            // readable, pointing at the entries' bytes in the log, and holds them durably
            // from the next checkpoint on.
            None => checkpointed
                .wal
                .append(batch.iter().flat_map(|w| w.mutations.iter()))
                .and_then(|locations| {
                    if durable {
                        checkpointed.wal.sync()?;
                    }
                    logged = Some(Instant::now());
                    if durable {
                        for write in &mut batch {
                            if let Some(flushed) = write.flushed.take() {
                                flushed(Ok(()));
                            }
                        }
                    }
                    let mut placed = Placed {
                        locations: locations.iter(),
                        delta: BTreeMap::new(),
                    };
                    let uncommitted = match open.take() {
                        Some(uncommitted) => uncommitted,
                        None => Uncommitted::begin(&db)?,
                    };
                    let applied = apply_batch(&uncommitted.txn, &batch, Some(&mut placed));
                    // An error leaves the transaction half done: it is dropped (rolled
                    // back) with the batches it held, which get the error too.
                    open = Some(uncommitted);
                    applied?;
                    for (segment, delta) in placed.delta {
                        let live = checkpointed.live.entry(segment).or_default();
                        *live = live.saturating_add_signed(delta);
                    }
                    Ok(())
                }),
        };
        let current = Logged::new(std::mem::take(&mut batch), durable, started, logged);
        let mut batches = open.take().map(|u| (u.txn, u.batches));
        let result = match (result, &mut batches) {
            (Ok(()), Some((_, held))) => {
                held.push(current);
                let awaited = held.iter().any(|logged| logged.awaited);
                if held.len() < DEFERRED_BATCHES_MAX {
                    let next = if rx.is_empty() {
                        // A caller waiting for its write's commit is not kept waiting.
                        linger.as_ref().filter(|_| !awaited).and_then(|runtime| {
                            let since = held[0].started;
                            let wait = config.index_commit_linger.saturating_sub(since.elapsed());
                            // The timer is made inside the runtime (its context exists
                            // only within `block_on`).
                            runtime
                                .block_on(async { tokio::time::timeout(wait, rx.recv()).await })
                                .ok()
                                .flatten()
                        })
                    } else {
                        rx.try_recv().ok()
                    };
                    if let Some(write) = next {
                        arrived = Some(write);
                        open = batches.map(|(txn, batches)| Uncommitted { txn, batches });
                        continue;
                    }
                }
                let (txn, held) = batches.expect("matched above");
                counters.index_commits.fetch_add(1, Ordering::Relaxed);
                let committed = txn.commit().map_err(StorageError::io);
                for logged in held {
                    logged.finish(&committed, &counters, &failure);
                }
                committed
            }
            (result, _) => {
                // Failed (or nothing opened a transaction): the batches held with this one
                // share its fate.
                let held = batches.map(|(_, held)| held).unwrap_or_default();
                for logged in held.into_iter().chain([current]) {
                    logged.finish(&result, &counters, &failure);
                }
                result
            }
        };
        if result.is_ok() && checkpointed.due(&config) {
            let result = checkpointed.checkpoint(&db);
            record_failure(&failure, &result);
        }
    }
    // Every handle is gone: leave redb complete, so the next open replays nothing. (Nothing
    // is left uncommitted: the queue was empty before the last batch.)
    if let Some(mut checkpointed) = wal
        && failure.borrow().is_none()
        && checkpointed.wal.records() > 0
        && let Err(err) = checkpointed.checkpoint(&db)
    {
        tracing::warn!(%err, "the final storage checkpoint failed; the next start replays the write-ahead log");
    }
}

/// redb's write transaction holding batches that are logged but not yet committed.
struct Uncommitted {
    txn: WriteTransaction,
    /// The batches it holds, whose completions wait for its commit.
    batches: Vec<Logged>,
}

impl Uncommitted {
    fn begin(db: &Database) -> Result<Self, StorageError> {
        let mut txn = db.begin_write().map_err(StorageError::io)?;
        txn.set_durability(redb::Durability::None)
            .map_err(StorageError::io)?;
        Ok(Self {
            txn,
            batches: Vec::new(),
        })
    }
}

/// A batch the writer has handled, waiting for the commit that completes it.
struct Logged {
    writes: Vec<Write>,
    durable: bool,
    started: Instant,
    /// When it was durable in the log.
    logged: Option<Instant>,
    /// A write's caller waits for the commit ([`Write::awaited`]).
    awaited: bool,
}

impl Logged {
    fn new(
        mut writes: Vec<Write>,
        durable: bool,
        started: Instant,
        logged: Option<Instant>,
    ) -> Self {
        let mut awaited = false;
        for write in &mut writes {
            // What the log and redb's transaction hold need not be kept until the commit.
            write.mutations = Vec::new();
            awaited |= write.awaited;
        }
        Self {
            writes,
            durable,
            started,
            logged,
            awaited,
        }
    }

    /// The batch's commit is over (with `result`): its metrics, and its writes' completions.
    fn finish(
        self,
        result: &Result<(), StorageError>,
        counters: &Counters,
        failure: &watch::Sender<Option<StorageError>>,
    ) {
        let Self {
            writes,
            durable,
            started,
            logged,
            ..
        } = self;
        let finished = Instant::now();
        metrics::histogram!("tributary_storage_commit_seconds", "durable" => if durable { "true" } else { "false" })
            .record(finished.duration_since(started).as_secs_f64());
        if durable && result.is_ok() {
            record_stages(&writes, started, logged, finished);
        }
        record_failure(failure, result);
        counters.commits.fetch_add(1, Ordering::Relaxed);
        counters
            .writes
            .fetch_add(writes.len() as u64, Ordering::Relaxed);
        metrics::histogram!("tributary_storage_commit_batch_writes").record(writes.len() as f64);
        if durable && result.is_ok() {
            counters.fsyncs.fetch_add(1, Ordering::Relaxed);
            metrics::counter!("tributary_storage_fsyncs_total").increment(1);
        }
        for write in writes {
            if let Some(flushed) = write.flushed {
                flushed(result.clone());
            }
            (write.done)(result.clone());
        }
    }
}

/// The shard's part of a batch's durable writes (see [`tributary_types::send_stage`]): each
/// one's wait in the queue, the batch's log append with its fsync, and its redb commit.
fn record_stages(batch: &[Write], started: Instant, logged: Option<Instant>, finished: Instant) {
    for write in batch {
        if write.durability == Durability::Immediate {
            SendStage::StorageQueue.record_between(write.queued, started);
        }
    }
    if let Some(logged) = logged {
        SendStage::StorageLogWrite.record_between(started, logged);
        SendStage::StorageIndexCommit.record_between(logged, finished);
    }
}

/// Fails the shard for good on its first failed commit (see [`Shard`]).
fn record_failure(
    failure: &watch::Sender<Option<StorageError>>,
    result: &Result<(), StorageError>,
) {
    if let Err(err) = result
        && failure.borrow().is_none()
    {
        tracing::error!(
            %err,
            "a storage commit failed: this shard refuses every further write; the node \
             must restart to recover from what is durable"
        );
        failure.send_replace(Some(err.clone()));
    }
}

fn commit_batch(
    db: &Database,
    batch: &[Write],
    durable: bool,
    placed: Option<&mut Placed<'_>>,
) -> Result<(), StorageError> {
    let mut txn = db.begin_write().map_err(StorageError::io)?;
    txn.set_durability(if durable {
        redb::Durability::Immediate
    } else {
        redb::Durability::None
    })
    .map_err(StorageError::io)?;
    apply_batch(&txn, batch, placed)?;
    txn.commit().map_err(StorageError::io)
}

/// Applies a batch's mutations (and, with a log, where its entries went) to `txn`.
fn apply_batch(
    txn: &WriteTransaction,
    batch: &[Write],
    mut placed: Option<&mut Placed<'_>>,
) -> Result<(), StorageError> {
    let mut tables = Tables::new(txn);
    for write in batch {
        for mutation in &write.mutations {
            apply_mutation(&mut tables, mutation, placed.as_deref_mut())?;
        }
    }
    if let Some(placed) = placed {
        placed.store(&mut tables)?;
    }
    Ok(())
}

/// A `log_location` row's value: (segment, offset, length).
type LocationValue = (u64, u64, u32);

fn location(v: LocationValue) -> Location {
    Location {
        segment: v.0,
        offset: v.1,
        len: v.2,
    }
}

/// A `seq_index` row's value: (log index, first offset, enqueued ms, event count).
type SeqValue = (u64, i64, i64, u32);

/// The tables of one write transaction, each opened once (on first use) and kept open
/// until the transaction commits: opening and closing a table per mutation costs as much as
/// the mutation.
struct Tables<'t> {
    txn: &'t WriteTransaction,
    log: Option<redb::Table<'t, (u64, u64), &'static [u8]>>,
    log_location: Option<redb::Table<'t, (u64, u64), LocationValue>>,
    segment_live: Option<redb::Table<'t, u64, u64>>,
    meta: Option<redb::Table<'t, (u64, u8), &'static [u8]>>,
    seq: Option<redb::Table<'t, (u64, i64), SeqValue>>,
    offset: Option<redb::Table<'t, (u64, i64), i64>>,
    time: Option<redb::Table<'t, (u64, i64, i64), ()>>,
    catalog: Option<redb::Table<'t, &'static str, &'static [u8]>>,
    wal_state: Option<redb::Table<'t, &'static str, u64>>,
}

macro_rules! table_accessor {
    ($name:ident, $def:expr, $k:ty, $v:ty) => {
        fn $name(&mut self) -> Result<&mut redb::Table<'t, $k, $v>, StorageError> {
            if self.$name.is_none() {
                self.$name = Some(self.txn.open_table($def).map_err(StorageError::io)?);
            }
            Ok(self.$name.as_mut().expect("opened above"))
        }
    };
}

impl<'t> Tables<'t> {
    fn new(txn: &'t WriteTransaction) -> Self {
        Tables {
            txn,
            log: None,
            log_location: None,
            segment_live: None,
            meta: None,
            seq: None,
            offset: None,
            time: None,
            catalog: None,
            wal_state: None,
        }
    }

    table_accessor!(log, RAFT_LOG, (u64, u64), &'static [u8]);
    table_accessor!(log_location, LOG_LOCATION, (u64, u64), LocationValue);
    table_accessor!(segment_live, SEGMENT_LIVE, u64, u64);

    /// Removes the `log_location` rows of `group` in `range`, counting them off their
    /// segments.
    fn remove_located(
        &mut self,
        group: u64,
        range: std::ops::RangeInclusive<u64>,
        placed: Option<&mut Placed<'_>>,
    ) -> Result<(), StorageError> {
        let Some(placed) = placed else {
            return Ok(());
        };
        let table = self.log_location()?;
        for row in table
            .extract_from_if((group, *range.start())..=(group, *range.end()), |_, _| true)
            .map_err(StorageError::io)?
        {
            let (_, v) = row.map_err(StorageError::io)?;
            *placed.delta.entry(v.value().0).or_default() -= 1;
        }
        Ok(())
    }
    table_accessor!(meta, RAFT_META, (u64, u8), &'static [u8]);
    table_accessor!(seq, SEQ_INDEX, (u64, i64), SeqValue);
    table_accessor!(offset, OFFSET_INDEX, (u64, i64), i64);
    table_accessor!(time, TIME_INDEX, (u64, i64, i64), ());
    table_accessor!(catalog, CATALOG, &'static str, &'static [u8]);
    table_accessor!(wal_state, WAL_STATE, &'static str, u64);
}

/// Applies one write. With `placed` (a shard with a log on disk), a log entry's row points
/// at its bytes in the log (the next of `placed.locations`) and the rows each segment gains
/// or loses are counted; without, the entry is stored whole.
fn apply_mutation(
    tables: &mut Tables<'_>,
    mutation: &Mutation,
    mut placed: Option<&mut Placed<'_>>,
) -> Result<(), StorageError> {
    match mutation {
        Mutation::PutLog {
            group,
            index,
            entry,
        } => match placed {
            Some(placed) => {
                let at = *placed
                    .locations
                    .next()
                    .expect("the log returns a location for every entry");
                let old = tables
                    .log_location()?
                    .insert((group.to_u64(), *index), (at.segment, at.offset, at.len))
                    .map_err(StorageError::io)?
                    .map(|v| v.value().0);
                if let Some(segment) = old {
                    *placed.delta.entry(segment).or_default() -= 1;
                }
                *placed.delta.entry(at.segment).or_default() += 1;
            }
            None => {
                let t = tables.log()?;
                t.insert((group.to_u64(), *index), entry.as_ref())
                    .map_err(StorageError::io)?;
            }
        },
        Mutation::TruncateLogFrom { group, from } => {
            let g = group.to_u64();
            let t = tables.log()?;
            t.retain_in((g, *from)..=(g, u64::MAX), |_, _| false)
                .map_err(StorageError::io)?;
            tables.remove_located(g, *from..=u64::MAX, placed)?;
        }
        Mutation::PurgeLogThrough { group, through } => {
            let g = group.to_u64();
            let t = tables.log()?;
            t.retain_in((g, 0)..=(g, *through), |_, _| false)
                .map_err(StorageError::io)?;
            tables.remove_located(g, 0..=*through, placed)?;
        }
        Mutation::PutMeta { group, key, value } => {
            let t = tables.meta()?;
            t.insert((group.to_u64(), *key as u8), value.as_ref())
                .map_err(StorageError::io)?;
        }
        Mutation::PutIndex { group, row } => put_index(tables, group.to_u64(), row)?,
        Mutation::TruncateIndexFrom { group, .. } | Mutation::TruncateIndexBefore { group, .. } => {
            let g = group.to_u64();
            let range = match mutation {
                Mutation::TruncateIndexFrom { from_sequence, .. } => (
                    Bound::Included((g, *from_sequence)),
                    Bound::Included((g, i64::MAX)),
                ),
                Mutation::TruncateIndexBefore {
                    before_sequence, ..
                } => (
                    Bound::Included((g, i64::MIN)),
                    Bound::Excluded((g, *before_sequence)),
                ),
                _ => unreachable!("matched above"),
            };
            let seq = tables.seq()?;
            let mut removed = Vec::new();
            for row in seq
                .extract_from_if(range, |_, _| true)
                .map_err(StorageError::io)?
            {
                let (k, v) = row.map_err(StorageError::io)?;
                removed.push((k.value().1, v.value().1, v.value().2));
            }
            for (first_sequence, first_offset, time_ms) in removed {
                tables
                    .offset()?
                    .remove((g, first_offset))
                    .map_err(StorageError::io)?;
                tables
                    .time()?
                    .remove((g, time_ms, first_sequence))
                    .map_err(StorageError::io)?;
            }
        }
        Mutation::DeleteGroup { group } => {
            if !is_staging(*group) {
                // With the group goes any snapshot of it being received.
                let staged = Mutation::DeleteGroup {
                    group: staging_group(*group),
                };
                apply_mutation(tables, &staged, placed.as_deref_mut())?;
            }
            let g = group.to_u64();
            tables
                .log()?
                .retain_in((g, 0)..=(g, u64::MAX), |_, _| false)
                .map_err(StorageError::io)?;
            tables.remove_located(g, 0..=u64::MAX, placed)?;
            tables
                .meta()?
                .retain_in((g, 0)..=(g, u8::MAX), |_, _| false)
                .map_err(StorageError::io)?;
            clear_index(tables, g)?;
        }
        Mutation::InstallStaged { group, through } => {
            let (g, staged) = (group.to_u64(), staging_group(*group).to_u64());
            // The replica's own entries the snapshot covers, and all its index rows, go...
            tables
                .log()?
                .retain_in((g, 0)..=(g, *through), |_, _| false)
                .map_err(StorageError::io)?;
            tables.remove_located(g, 0..=*through, placed)?;
            clear_index(tables, g)?;
            // ...and the staged ones take their place. Their bytes stay where they lie, so
            // no segment gains or loses a row.
            let moved: Vec<(u64, Vec<u8>)> = tables
                .log()?
                .extract_from_if((staged, 0)..=(staged, u64::MAX), |_, _| true)
                .map_err(StorageError::io)?
                .map(|row| {
                    let (k, v) = row.map_err(StorageError::io)?;
                    Ok((k.value().1, v.value().to_vec()))
                })
                .collect::<Result<_, StorageError>>()?;
            for (index, entry) in moved {
                tables
                    .log()?
                    .insert((g, index), entry.as_slice())
                    .map_err(StorageError::io)?;
            }
            let moved: Vec<(u64, LocationValue)> = tables
                .log_location()?
                .extract_from_if((staged, 0)..=(staged, u64::MAX), |_, _| true)
                .map_err(StorageError::io)?
                .map(|row| {
                    let (k, v) = row.map_err(StorageError::io)?;
                    Ok((k.value().1, v.value()))
                })
                .collect::<Result<_, StorageError>>()?;
            for (index, at) in moved {
                tables
                    .log_location()?
                    .insert((g, index), at)
                    .map_err(StorageError::io)?;
            }
            let moved: Vec<(i64, SeqValue)> = tables
                .seq()?
                .extract_from_if((staged, i64::MIN)..=(staged, i64::MAX), |_, _| true)
                .map_err(StorageError::io)?
                .map(|row| {
                    let (k, v) = row.map_err(StorageError::io)?;
                    Ok((k.value().1, v.value()))
                })
                .collect::<Result<_, StorageError>>()?;
            clear_index(tables, staged)?;
            for (first_sequence, v) in moved {
                put_index(tables, g, &index_row(first_sequence, v))?;
            }
        }
        Mutation::PutCatalog { key, value } => {
            tables
                .catalog()?
                .insert(key.as_str(), value.as_ref())
                .map_err(StorageError::io)?;
        }
        Mutation::DeleteCatalog { key } => {
            tables
                .catalog()?
                .remove(key.as_str())
                .map_err(StorageError::io)?;
        }
    }
    Ok(())
}

/// Writes one index row of group `g` (all three index tables).
fn put_index(tables: &mut Tables<'_>, g: u64, row: &IndexRow) -> Result<(), StorageError> {
    tables
        .seq()?
        .insert(
            (g, row.first_sequence),
            (
                row.log_index,
                row.first_offset,
                row.enqueued_time_ms,
                row.event_count,
            ),
        )
        .map_err(StorageError::io)?;
    tables
        .offset()?
        .insert((g, row.first_offset), row.first_sequence)
        .map_err(StorageError::io)?;
    tables
        .time()?
        .insert((g, row.enqueued_time_ms, row.first_sequence), ())
        .map_err(StorageError::io)?;
    Ok(())
}

/// Removes every index row of group `g`.
fn clear_index(tables: &mut Tables<'_>, g: u64) -> Result<(), StorageError> {
    tables
        .seq()?
        .retain_in((g, i64::MIN)..=(g, i64::MAX), |_, _| false)
        .map_err(StorageError::io)?;
    tables
        .offset()?
        .retain_in((g, i64::MIN)..=(g, i64::MAX), |_, _| false)
        .map_err(StorageError::io)?;
    tables
        .time()?
        .retain_in((g, i64::MIN, i64::MIN)..=(g, i64::MAX, i64::MAX), |_, _| {
            false
        })
        .map_err(StorageError::io)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use tributary_types::{HubId, PartitionId};

    use super::*;

    fn group(p: u16) -> GroupId {
        GroupId::new(HubId(1), PartitionId(p), 0)
    }

    fn put(p: u16, index: u64) -> Mutation {
        Mutation::PutLog {
            group: group(p),
            index,
            entry: Bytes::from(format!("entry {p}/{index}")),
        }
    }

    fn open(dir: &tempfile::TempDir) -> Shard {
        Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap()
    }

    /// What a crash leaves on disk: the files as written so far (redb holds only its last
    /// checkpoint; the rest is in the write-ahead log), copied while the shard still runs.
    fn crash_copy(from: impl AsRef<Path>) -> tempfile::TempDir {
        let from = from.as_ref();
        let to = tempfile::tempdir().unwrap();
        std::fs::copy(from.join("s.redb"), to.path().join("s.redb")).unwrap();
        std::fs::create_dir(to.path().join("s.segments")).unwrap();
        for file in std::fs::read_dir(from.join("s.segments")).unwrap() {
            let file = file.unwrap();
            std::fs::copy(
                file.path(),
                to.path().join("s.segments").join(file.file_name()),
            )
            .unwrap();
        }
        to
    }

    /// No checkpoint before the shard is dropped: every write after opening is in the log only.
    fn never_checkpointing() -> ShardConfig {
        ShardConfig {
            checkpoint_bytes: u64::MAX,
            checkpoint_interval: std::time::Duration::from_secs(3600),
            ..ShardConfig::default()
        }
    }

    fn segment_files(dir: &tempfile::TempDir) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir.path().join("s.segments"))
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        files.sort();
        files
    }

    fn indexes(shard: &Shard, p: u16) -> Vec<u64> {
        shard
            .log_entries(group(p), 0, u64::MAX)
            .unwrap()
            .into_iter()
            .map(|(index, bytes)| {
                assert_eq!(bytes, Bytes::from(format!("entry {p}/{index}")));
                index
            })
            .collect()
    }

    #[tokio::test]
    async fn durable_writes_survive_a_crash_between_checkpoints_through_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), never_checkpointing()).unwrap();
        for i in 0..20 {
            shard
                .write(vec![put((i % 4) as u16, i)], Durability::Immediate)
                .await
                .unwrap();
        }
        shard
            .write(
                vec![Mutation::TruncateLogFrom {
                    group: group(0),
                    from: 8,
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        for p in 0..4u16 {
            let expected: Vec<u64> = (0..20)
                .filter(|i| i % 4 == u64::from(p) && (p != 0 || *i < 8))
                .collect();
            assert_eq!(indexes(&recovered, p), expected, "group {p}");
        }
        // Replayed once: the recovered shard checkpointed, and opening it again (after
        // another crash) finds the same.
        let crashed_again = crash_copy(&crashed);
        let again = open(&crashed_again);
        assert_eq!(indexes(&again, 1), vec![1, 5, 9, 13, 17]);
    }

    /// A write queued while the writer logs a batch is logged and fsynced at once; the
    /// batches' redb commit waits for the queue to empty (or DEFERRED_BATCHES_MAX batches).
    /// Each write's `done` still runs only once it is readable, none is lost, and a crash
    /// meanwhile loses nothing that was flushed.
    #[tokio::test]
    async fn writes_queued_behind_a_batch_share_its_index_commit_and_survive_a_crash() {
        const WRITES: u64 = 40;
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), never_checkpointing()).unwrap();
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        // Each write's `flushed` (on the writer thread, before the writer looks at its
        // queue again) queues the next: the queue is never empty after a batch is logged.
        fn chained(
            shard: Shard,
            index: u64,
            done_tx: std::sync::mpsc::Sender<(u64, bool)>,
        ) -> Write {
            let reader = shard.clone();
            let next_done = done_tx.clone();
            Write {
                mutations: vec![put((index % 4) as u16, index)],
                durability: Durability::Immediate,
                flushed: Some(Box::new(move |result| {
                    result.unwrap();
                    if index + 1 < WRITES {
                        let next = chained(shard.clone(), index + 1, next_done);
                        assert!(shard.tx.blocking_send(next).is_ok());
                    }
                })),
                done: Box::new(move |result| {
                    result.unwrap();
                    let readable = reader
                        .log_entry(group((index % 4) as u16), index)
                        .unwrap()
                        .is_some();
                    done_tx.send((index, readable)).unwrap();
                }),
                queued: Instant::now(),
                awaited: false,
            }
        }
        let first = chained(shard.clone(), 0, done_tx);
        shard.tx.send(first).await.map_err(|_| ()).unwrap();
        let mut done = Vec::new();
        for _ in 0..WRITES {
            done.push(
                done_rx
                    .recv_timeout(std::time::Duration::from_secs(30))
                    .expect("every write completes"),
            );
        }
        let expected: Vec<(u64, bool)> = (0..WRITES).map(|i| (i, true)).collect();
        assert_eq!(done, expected, "in order, each readable when done");
        let stats = shard.stats();
        assert_eq!((stats.writes, stats.fsyncs), (WRITES, WRITES));
        assert!(
            stats.index_commits <= WRITES.div_ceil(8) + 1,
            "{} redb commits for {WRITES} batches",
            stats.index_commits
        );
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        for p in 0..4u16 {
            let expected: Vec<u64> = (0..WRITES).filter(|i| i % 4 == u64::from(p)).collect();
            assert_eq!(indexes(&recovered, p), expected, "group {p}");
        }
    }

    fn open_lingering(dir: &tempfile::TempDir, linger: std::time::Duration) -> Shard {
        let config = ShardConfig {
            index_commit_linger: linger,
            ..never_checkpointing()
        };
        Shard::open(&dir.path().join("s.redb"), config).unwrap()
    }

    /// Queues a durable write of entry `index` of group 0; the receivers hear of its
    /// `flushed` and its `done`.
    async fn submit_one(
        shard: &Shard,
        index: u64,
    ) -> (oneshot::Receiver<()>, oneshot::Receiver<Instant>) {
        let (flushed_tx, flushed_rx) = oneshot::channel();
        let (done_tx, done_rx) = oneshot::channel();
        shard
            .submit_flushed(
                vec![put(0, index)],
                Durability::Immediate,
                move |result| {
                    result.unwrap();
                    let _ = flushed_tx.send(());
                },
                move |result| {
                    result.unwrap();
                    let _ = done_tx.send(Instant::now());
                },
            )
            .await
            .unwrap();
        (flushed_rx, done_rx)
    }

    /// With nothing queued behind it, a logged batch's index commit waits up to the linger
    /// for later batches: writes that each wait for the one before to be durable (a
    /// producer waiting for each send) share one redb commit, and none is readable from
    /// redb (done) before it, though each is durable (flushed) at its own fsync.
    #[tokio::test]
    async fn batches_within_the_linger_share_one_index_commit() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open_lingering(&dir, std::time::Duration::from_secs(3600));
        let mut dones = Vec::new();
        // The first write alone: the queue stays empty behind it, so only the linger keeps
        // its commit open (a commit normally takes well under a millisecond here).
        let (flushed, mut first) = submit_one(&shard, 0).await;
        flushed.await.expect("durable at its own fsync");
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(300), &mut first)
                .await
                .is_err(),
            "a lone batch's commit lingers"
        );
        dones.push(first);
        for index in 1..DEFERRED_BATCHES_MAX as u64 - 1 {
            let (flushed, done) = submit_one(&shard, index).await;
            flushed.await.expect("durable at its own fsync");
            dones.push(done);
        }
        let stats = shard.stats();
        assert_eq!(stats.index_commits, 0, "the commit lingers: {stats:?}");
        for done in &mut dones {
            assert!(
                done.try_recv().is_err(),
                "no write is done before its commit"
            );
        }
        // The batch that fills the transaction commits it, for all of them.
        let (flushed, done) = submit_one(&shard, DEFERRED_BATCHES_MAX as u64 - 1).await;
        flushed.await.unwrap();
        dones.push(done);
        for done in dones {
            done.await.expect("done once committed");
        }
        assert_eq!(shard.stats().index_commits, 1);
        assert_eq!(
            indexes(&shard, 0),
            (0..DEFERRED_BATCHES_MAX as u64).collect::<Vec<_>>()
        );
    }

    /// A write whose caller waits for its commit (`Shard::write`: a node creating replica
    /// after replica, a vote) does not wait out the linger, and the commit it makes serves
    /// the batches lingering before it.
    #[tokio::test]
    async fn an_awaited_write_commits_without_lingering() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open_lingering(&dir, std::time::Duration::from_secs(3600));
        let (flushed, lingering) = submit_one(&shard, 0).await;
        flushed.await.unwrap();
        for index in 1..4 {
            tokio::time::timeout(
                std::time::Duration::from_secs(30),
                shard.write(vec![put(0, index)], Durability::Immediate),
            )
            .await
            .expect("an awaited write is not held for the linger")
            .unwrap();
        }
        lingering.await.expect("committed with the awaited write");
        assert_eq!(shard.stats().index_commits, 3);
        assert_eq!(indexes(&shard, 0), vec![0, 1, 2, 3]);
    }

    /// A lingering commit ends when the linger is over with nothing more to share it (not
    /// before), and when the shard closes: what it held is done and a reopened shard has it.
    #[tokio::test]
    async fn a_lingering_commit_ends_after_the_linger_or_at_close() {
        const LINGER: std::time::Duration = std::time::Duration::from_millis(50);
        let dir = tempfile::tempdir().unwrap();
        let shard = open_lingering(&dir, LINGER);
        let submitted = Instant::now();
        let (_, done) = submit_one(&shard, 0).await;
        let done_at = done.await.expect("committed once the linger is over");
        assert!(
            done_at.duration_since(submitted) >= LINGER,
            "committed before the linger was over"
        );
        assert_eq!(shard.stats().index_commits, 1);

        let dir = tempfile::tempdir().unwrap();
        let shard = open_lingering(&dir, std::time::Duration::from_secs(3600));
        let (flushed, done) = submit_one(&shard, 7).await;
        flushed.await.unwrap();
        shard
            .close(std::time::Duration::from_secs(30))
            .await
            .unwrap();
        done.await.expect("the close commits what lingered");
        let reopened = open(&dir);
        assert_eq!(indexes(&reopened, 0), vec![7]);
    }

    /// A checkpoint moves the replay position past everything written: a damaged record
    /// before it is never read again (replaying from the start would stop at the damage
    /// and cut the log there, losing the entries after it).
    #[tokio::test]
    async fn after_a_checkpoint_the_records_before_it_are_not_replayed() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShardConfig {
            checkpoint_bytes: 1,
            ..ShardConfig::default()
        };
        let shard = Shard::open(&dir.path().join("s.redb"), config).unwrap();
        shard
            .write(vec![put(0, 1)], Durability::Immediate)
            .await
            .unwrap();
        shard
            .write(vec![put(0, 2)], Durability::Lazy)
            .await
            .unwrap();
        // The checkpoint due after that write runs in the writer thread before it takes the
        // next write: once this one completes, redb holds both durably.
        shard.write(Vec::new(), Durability::Lazy).await.unwrap();
        let crashed = crash_copy(&dir);
        let segment = segment_files(&crashed)
            .into_iter()
            .find(|f| std::fs::metadata(f).unwrap().len() > 16)
            .expect("a segment with records");
        let mut contents = std::fs::read(&segment).unwrap();
        contents[16 + 4] ^= 0xff; // the first record's CRC
        std::fs::write(&segment, &contents).unwrap();
        let recovered = open(&crashed);
        assert_eq!(indexes(&recovered, 0), vec![1, 2]);
    }

    /// Segments are deleted (their disk space returned) once no log entry lies in them, at
    /// the checkpoint after the entries were purged; what is kept stays readable, also
    /// after a crash.
    #[tokio::test]
    async fn segments_are_deleted_once_none_of_their_entries_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShardConfig {
            checkpoint_bytes: 1,
            segment_bytes_max: 256,
            ..ShardConfig::default()
        };
        let shard = Shard::open(&dir.path().join("s.redb"), config.clone()).unwrap();
        for i in 1..=40 {
            shard
                .write(vec![put((i % 2) as u16, i)], Durability::Immediate)
                .await
                .unwrap();
        }
        let before = segment_files(&dir).len();
        assert!(before >= 5, "{before} segments");
        // Group 1's entries up to 30 and all of group 0 go; group 1 keeps 31..=39.
        shard
            .write(
                vec![
                    Mutation::PurgeLogThrough {
                        group: group(1),
                        through: 30,
                    },
                    Mutation::DeleteGroup { group: group(0) },
                ],
                Durability::Immediate,
            )
            .await
            .unwrap();
        // The checkpoint after the purge ran before the writer took this write.
        shard.write(Vec::new(), Durability::Lazy).await.unwrap();
        let after = segment_files(&dir).len();
        assert!(
            after < before / 2,
            "{before} segments before the purge, {after} after"
        );
        assert_eq!(indexes(&shard, 1), vec![31, 33, 35, 37, 39]);
        assert!(indexes(&shard, 0).is_empty());
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        assert_eq!(indexes(&recovered, 1), vec![31, 33, 35, 37, 39]);

        // A segment holding kept entries that goes missing is reported, not read as empty.
        drop(recovered);
        let damaged = crash_copy(&dir);
        let oldest = segment_files(&damaged).remove(0);
        std::fs::remove_file(&oldest).unwrap();
        let err = Shard::open(&damaged.path().join("s.redb"), config).unwrap_err();
        assert!(
            matches!(err, StorageError::Corrupt(ref m) if m.contains("is missing")),
            "{err}"
        );
    }

    fn staged_put(p: u16, index: u64) -> Mutation {
        Mutation::PutLog {
            group: staging_group(group(p)),
            index,
            entry: Bytes::from(format!("entry {p}/{index}")),
        }
    }

    fn row(first_sequence: i64, log_index: u64) -> IndexRow {
        IndexRow {
            first_sequence,
            log_index,
            first_offset: first_sequence * 10,
            enqueued_time_ms: 1000 + first_sequence,
            event_count: 1,
        }
    }

    fn sequences(shard: &Shard, p: u16) -> Vec<(i64, u64)> {
        shard
            .index_rows(group(p), u64::MAX)
            .unwrap()
            .into_iter()
            .map(|r| (r.first_sequence, r.log_index))
            .collect()
    }

    /// A staged snapshot replaces the replica's entries through its point and all its index
    /// rows in one step, keeps the replica's later entries, frees the segments of what it
    /// replaced, and is invisible (to reads and to `groups`) until installed.
    #[tokio::test]
    async fn a_staged_snapshot_replaces_the_replica_only_when_installed() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShardConfig {
            checkpoint_bytes: 1,
            segment_bytes_max: 256,
            ..ShardConfig::default()
        };
        let shard = Shard::open(&dir.path().join("s.redb"), config).unwrap();
        // The replica: entries 1..=10 with index rows, entry 30 past the snapshot point.
        let mut own: Vec<Mutation> = (1..=10).map(|i| put(0, i)).collect();
        own.extend((1..=10).map(|i| Mutation::PutIndex {
            group: group(0),
            row: row(i as i64, i),
        }));
        own.push(Mutation::PutMeta {
            group: group(0),
            key: MetaKey::Vote,
            value: Bytes::from_static(b"vote"),
        });
        shard.write(own, Durability::Immediate).await.unwrap();
        let segments_before = segment_files(&dir);
        shard
            .write(vec![put(0, 30)], Durability::Immediate)
            .await
            .unwrap();

        // The snapshot through 25: entries 20..=25 (sequences 100..), staged in two pieces.
        for piece in [20..=22u64, 23..=25] {
            let mut writes: Vec<Mutation> = piece.clone().map(|i| staged_put(0, i)).collect();
            writes.extend(piece.map(|i| Mutation::PutIndex {
                group: staging_group(group(0)),
                row: row(80 + i as i64, i),
            }));
            shard.write(writes, Durability::Lazy).await.unwrap();
        }
        assert_eq!(
            indexes(&shard, 0),
            [(1..=10).collect::<Vec<_>>(), vec![30]].concat()
        );
        assert_eq!(shard.groups().unwrap(), vec![group(0)]);
        assert_eq!(
            shard.staged_groups().unwrap(),
            vec![staging_group(group(0))]
        );

        shard
            .write(
                vec![Mutation::InstallStaged {
                    group: group(0),
                    through: 25,
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(indexes(&shard, 0), vec![20, 21, 22, 23, 24, 25, 30]);
        assert_eq!(
            sequences(&shard, 0),
            (20..=25).map(|i| (80 + i as i64, i)).collect::<Vec<_>>()
        );
        assert_eq!(
            shard.sequence_for_offset(group(0), 1030).unwrap(),
            Some(103)
        );
        assert_eq!(
            shard.meta(group(0), MetaKey::Vote).unwrap().unwrap(),
            "vote"
        );
        assert!(shard.staged_groups().unwrap().is_empty());
        // The replaced entries' segments are freed at the next checkpoint; the moved ones
        // are still counted where they lie: deleting the group frees every segment.
        shard
            .write(Vec::new(), Durability::Immediate)
            .await
            .unwrap();
        let after_install = segment_files(&dir);
        assert!(
            segments_before.iter().any(|s| !after_install.contains(s)),
            "no segment of the replaced entries was freed: {segments_before:?}"
        );
        shard
            .write(
                vec![Mutation::DeleteGroup { group: group(0) }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        shard
            .write(Vec::new(), Durability::Immediate)
            .await
            .unwrap();
        assert!(segment_files(&dir).len() <= 1, "{:?}", segment_files(&dir));
    }

    /// A node that stops while receiving a snapshot finds its replica as it was: what was
    /// staged is discarded when the shard opens again (after a crash too).
    #[tokio::test]
    async fn a_partly_received_snapshot_is_discarded_on_restart() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), never_checkpointing()).unwrap();
        shard
            .write(vec![put(0, 1), put(0, 2)], Durability::Immediate)
            .await
            .unwrap();
        shard
            .write(
                vec![
                    staged_put(0, 40),
                    staged_put(1, 7),
                    Mutation::PutIndex {
                        group: staging_group(group(0)),
                        row: row(5, 40),
                    },
                ],
                Durability::Immediate,
            )
            .await
            .unwrap();
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        // The discarding write is queued at open; the next write follows it.
        recovered
            .write(Vec::new(), Durability::Immediate)
            .await
            .unwrap();
        assert!(recovered.staged_groups().unwrap().is_empty());
        assert_eq!(indexes(&recovered, 0), vec![1, 2]);
        assert!(indexes(&recovered, 1).is_empty());
        assert!(sequences(&recovered, 0).is_empty());
    }

    /// A replica deleted while a snapshot of it is being received leaves nothing behind.
    #[tokio::test]
    async fn deleting_a_group_deletes_what_is_staged_for_it() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        shard
            .write(
                vec![put(0, 1), staged_put(0, 8), staged_put(1, 8)],
                Durability::Immediate,
            )
            .await
            .unwrap();
        shard
            .write(
                vec![Mutation::DeleteGroup { group: group(0) }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(
            shard.staged_groups().unwrap(),
            vec![staging_group(group(1))]
        );
        assert!(indexes(&shard, 0).is_empty());
    }

    /// The install is one write: replayed from the log after a crash, it lands whole.
    #[tokio::test]
    async fn an_install_replayed_after_a_crash_lands_whole() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), never_checkpointing()).unwrap();
        shard
            .write(
                vec![put(0, 1), staged_put(0, 5), staged_put(0, 6)],
                Durability::Lazy,
            )
            .await
            .unwrap();
        shard
            .write(
                vec![Mutation::InstallStaged {
                    group: group(0),
                    through: 6,
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(indexes(&shard, 0), vec![5, 6]);
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        recovered
            .write(Vec::new(), Durability::Immediate)
            .await
            .unwrap();
        assert_eq!(indexes(&recovered, 0), vec![5, 6]);
        assert!(recovered.staged_groups().unwrap().is_empty());
    }

    /// A piece of a snapshot: consecutive entries and exactly their index rows.
    #[tokio::test]
    async fn a_log_piece_holds_its_entries_index_rows() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let mut writes: Vec<Mutation> = (1..=6).map(|i| put(0, i)).collect();
        // Entry 3 holds no events (a membership entry, say).
        writes.extend([1u64, 2, 4, 5, 6].map(|i| Mutation::PutIndex {
            group: group(0),
            row: row(i as i64 * 2, i),
        }));
        shard.write(writes, Durability::Immediate).await.unwrap();
        let one = "entry 0/1".len();
        let piece = shard.log_piece(group(0), 2, 7, i64::MIN, 2 * one).unwrap();
        assert_eq!(
            piece.entries.iter().map(|e| e.0).collect::<Vec<_>>(),
            vec![2, 3]
        );
        assert_eq!(piece.index, vec![row(4, 2)]);
        let piece = shard.log_piece(group(0), 4, 7, 5, usize::MAX).unwrap();
        assert_eq!(piece.index, vec![row(8, 4), row(10, 5), row(12, 6)]);
        assert_eq!(piece.entry_bytes(), 3 * one);
        assert_eq!(shard.log_bytes(group(0), 2..=4).unwrap(), 3 * one as u64);
        // A snapshot with no entries to carry asks for an empty range.
        let last = piece.entries.len() as u64;
        assert_eq!(shard.log_bytes(group(0), last + 1..=last).unwrap(), 0);
    }

    /// Group `p`'s log entry `index` as compaction rewrites it.
    fn rewritten(p: u16, index: u64) -> Mutation {
        Mutation::PutLog {
            group: group(p),
            index,
            entry: Bytes::from(format!("rewritten {p}/{index}")),
        }
    }

    /// Group `p`'s entries with their bytes, in index order.
    fn entries(shard: &Shard, p: u16) -> Vec<(u64, Bytes)> {
        shard.log_entries(group(p), 0, u64::MAX).unwrap()
    }

    fn all_rewritten(p: u16, indexes: std::ops::RangeInclusive<u64>) -> Vec<(u64, Bytes)> {
        indexes
            .map(|i| (i, Bytes::from(format!("rewritten {p}/{i}"))))
            .collect()
    }

    /// Compaction writes an existing log entry again: its earlier bytes no longer count
    /// toward their segment, so a segment whose entries were all rewritten is deleted at
    /// the next checkpoint, as if they had been purged. Reads return the new bytes, also
    /// after a crash.
    #[tokio::test]
    async fn a_segment_whose_entries_were_all_rewritten_is_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShardConfig {
            checkpoint_bytes: 1,
            segment_bytes_max: 256,
            ..ShardConfig::default()
        };
        let shard = Shard::open(&dir.path().join("s.redb"), config).unwrap();
        for i in 1..=20 {
            shard
                .write(vec![put(0, i)], Durability::Immediate)
                .await
                .unwrap();
        }
        let before = segment_files(&dir);
        assert!(before.len() >= 4, "{} segments", before.len());
        shard
            .write(
                (1..=20).map(|i| rewritten(0, i)).collect(),
                Durability::Immediate,
            )
            .await
            .unwrap();
        // The checkpoint after the rewrite ran before the writer took this write.
        shard.write(Vec::new(), Durability::Lazy).await.unwrap();
        let after = segment_files(&dir);
        // Only the segment that was being written may hold a new entry.
        let kept: Vec<_> = before[..before.len() - 1]
            .iter()
            .filter(|f| after.contains(f))
            .collect();
        assert!(kept.is_empty(), "segments still there: {kept:?}");
        assert_eq!(entries(&shard, 0), all_rewritten(0, 1..=20));
        assert_eq!(
            shard.log_entry(group(0), 7).unwrap(),
            Some(Bytes::from("rewritten 0/7"))
        );
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        assert_eq!(entries(&recovered, 0), all_rewritten(0, 1..=20));
    }

    /// A rewrite replayed after a crash (redb held the entries' first locations) counts
    /// the first locations off too: the segments are deleted at the checkpoint after the
    /// replay.
    #[tokio::test]
    async fn a_rewrite_replayed_after_a_crash_releases_the_old_segments() {
        let dir = tempfile::tempdir().unwrap();
        let config = ShardConfig {
            segment_bytes_max: 256,
            ..never_checkpointing()
        };
        let shard = Shard::open(&dir.path().join("s.redb"), config.clone()).unwrap();
        for i in 1..=20 {
            shard
                .write(vec![put(0, i)], Durability::Immediate)
                .await
                .unwrap();
        }
        // Opening replays and checkpoints: redb durably points at the first bytes.
        let first = crash_copy(&dir);
        let reopened = Shard::open(&first.path().join("s.redb"), config.clone()).unwrap();
        assert_eq!(indexes(&reopened, 0), (1..=20).collect::<Vec<_>>());
        let before = segment_files(&first);
        assert!(before.len() >= 4, "{} segments", before.len());
        reopened
            .write(
                (1..=20).map(|i| rewritten(0, i)).collect(),
                Durability::Immediate,
            )
            .await
            .unwrap();
        // The rewrite is only in the log when this copy is taken.
        let second = crash_copy(&first);
        let recovered = Shard::open(&second.path().join("s.redb"), config).unwrap();
        assert_eq!(entries(&recovered, 0), all_rewritten(0, 1..=20));
        let after = segment_files(&second);
        let kept: Vec<_> = before[..before.len() - 1]
            .iter()
            .filter(|f| {
                let name = f.file_name().unwrap();
                after.iter().any(|a| a.file_name().unwrap() == name)
            })
            .collect();
        assert!(kept.is_empty(), "segments still there: {kept:?}");
        // And once more after another crash: nothing missing, nothing replayed twice.
        let third = crash_copy(&second);
        let again = open(&third);
        assert_eq!(entries(&again, 0), all_rewritten(0, 1..=20));
    }

    /// Entries of an earlier version are held whole in redb; one rewritten into the log
    /// lies among them, and reads still see every entry once, in order, with the new bytes.
    #[tokio::test]
    async fn an_entry_held_whole_can_be_rewritten_into_the_log() {
        let dir = tempfile::tempdir().unwrap();
        crate::wal::tests::write_legacy(
            &dir.path().join("s.wal"),
            0,
            &[vec![put(0, 1), put(0, 2), put(0, 3), put(0, 4)]],
        );
        let shard = Shard::open(&dir.path().join("s.redb"), never_checkpointing()).unwrap();
        shard
            .write(vec![rewritten(0, 2)], Durability::Immediate)
            .await
            .unwrap();
        let expected = |last_rewritten: bool| {
            let mut out = vec![
                (1, Bytes::from("entry 0/1")),
                (2, Bytes::from("rewritten 0/2")),
                (3, Bytes::from("entry 0/3")),
                (4, Bytes::from("entry 0/4")),
            ];
            if last_rewritten {
                out[3].1 = Bytes::from("rewritten 0/4");
            }
            out
        };
        assert_eq!(entries(&shard, 0), expected(false));
        assert_eq!(
            shard.last_log_entry(group(0)).unwrap(),
            Some((4, Bytes::from("entry 0/4")))
        );
        // Limited reads stop at the same entries whichever table holds them.
        let limited = shard
            .log_entries_limited(group(0), 1, 5, "entry 0/1".len() + 1)
            .unwrap();
        assert_eq!(limited, expected(false)[..2]);
        shard
            .write(vec![rewritten(0, 4)], Durability::Immediate)
            .await
            .unwrap();
        assert_eq!(entries(&shard, 0), expected(true));
        assert_eq!(
            shard.last_log_entry(group(0)).unwrap(),
            Some((4, Bytes::from("rewritten 0/4")))
        );
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        assert_eq!(entries(&recovered, 0), expected(true));
    }

    /// A data directory of an earlier version has a single-file log (`s.wal`) whose
    /// records redb may not hold yet: they are replayed once, and the file removed.
    #[tokio::test]
    async fn an_earlier_versions_log_is_replayed_once() {
        let dir = tempfile::tempdir().unwrap();
        // redb without any log state is at generation 0, the log that followed it.
        crate::wal::tests::write_legacy(
            &dir.path().join("s.wal"),
            0,
            &[vec![put(0, 1), put(0, 2)], vec![put(1, 1)]],
        );
        let shard = Shard::open(&dir.path().join("s.redb"), never_checkpointing()).unwrap();
        assert!(!dir.path().join("s.wal").exists());
        assert_eq!(indexes(&shard, 0), vec![1, 2]);
        shard
            .write(vec![put(0, 3)], Durability::Immediate)
            .await
            .unwrap();
        assert_eq!(indexes(&shard, 0), vec![1, 2, 3]);
        let crashed = crash_copy(&dir);
        let recovered = open(&crashed);
        assert_eq!(indexes(&recovered, 0), vec![1, 2, 3]);
        assert_eq!(indexes(&recovered, 1), vec![1]);
    }

    /// An in-memory disk that can be made full: every write and sync then fails with ENOSPC.
    #[derive(Debug, Default)]
    struct FillableDisk {
        inner: redb::backends::InMemoryBackend,
        full: Arc<std::sync::atomic::AtomicBool>,
    }

    impl FillableDisk {
        fn check(&self) -> Result<(), std::io::Error> {
            if self.full.load(Ordering::SeqCst) {
                Err(std::io::Error::from_raw_os_error(28))
            } else {
                Ok(())
            }
        }
    }

    impl redb::StorageBackend for FillableDisk {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.check()?;
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            self.check()?;
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.check()?;
            self.inner.write(offset, data)
        }
    }

    /// Found by the nemesis suite's full disk: after one failed commit redb refuses every
    /// transaction ("Previous I/O error occurred"), and the node's groups went on failing
    /// while the node looked alive. The shard must fail for good, say so, and refuse writes
    /// with an error naming the cause, so the node stops and restarts.
    #[tokio::test]
    async fn a_failed_commit_fails_the_shard_for_good() {
        let disk = FillableDisk::default();
        let full = disk.full.clone();
        let shard =
            Shard::open_with_backend(disk, Path::new("memory"), ShardConfig::default()).unwrap();
        shard
            .write(vec![put(0, 1)], Durability::Immediate)
            .await
            .unwrap();
        full.store(true, Ordering::SeqCst);
        let err = shard
            .write(vec![put(0, 2)], Durability::Immediate)
            .await
            .unwrap_err();
        assert!(matches!(err, StorageError::Io(_)), "{err}");
        let failed = tokio::time::timeout(std::time::Duration::from_secs(5), shard.failed())
            .await
            .expect("the shard reports its failure");
        assert!(failed.to_string().contains("os error 28"), "{failed}");
        // Space is back, but the shard stays failed until the node restarts.
        full.store(false, Ordering::SeqCst);
        let again = shard
            .write(vec![put(0, 3)], Durability::Immediate)
            .await
            .unwrap_err();
        assert!(matches!(again, StorageError::Failed(_)), "{again}");
        assert!(again.to_string().contains("os error 28"), "{again}");
        assert_eq!(shard.log_entry(group(0), 1).unwrap().unwrap(), "entry 0/1");
        assert_eq!(shard.log_entry(group(0), 3).unwrap(), None);
    }

    #[tokio::test]
    async fn a_working_shard_never_reports_a_failure() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        shard
            .write(vec![put(0, 1)], Durability::Immediate)
            .await
            .unwrap();
        let waited =
            tokio::time::timeout(std::time::Duration::from_millis(50), shard.failed()).await;
        assert!(waited.is_err());
    }

    /// A durable write is reported flushed once the log holds it (the fsync), before redb's
    /// commit makes it readable, and done after that commit; a crash after the flush
    /// (nothing committed to redb yet) still recovers it.
    #[tokio::test]
    async fn a_write_is_flushed_when_logged_and_done_once_readable() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let reader = shard.clone();
        let flushed_seen = seen_tx.clone();
        let crash_from = dir.path().to_path_buf();
        shard
            .submit_flushed(
                vec![put(0, 1)],
                Durability::Immediate,
                move |result| {
                    result.unwrap();
                    let readable = reader.log_entry(group(0), 1).unwrap().is_some();
                    // What is on disk at this moment, as a crash would leave it.
                    let copy = crash_copy(&crash_from);
                    flushed_seen
                        .send(("flushed", readable, Some(copy)))
                        .unwrap();
                },
                move |result| {
                    result.unwrap();
                    seen_tx.send(("done", true, None)).unwrap();
                    done_tx.send(()).unwrap();
                },
            )
            .await
            .unwrap();
        done_rx.await.unwrap();
        let (first, readable, crashed) = seen_rx.recv().unwrap();
        assert_eq!(first, "flushed", "flushed runs first");
        assert!(!readable, "flushed runs before redb's commit");
        assert_eq!(seen_rx.recv().unwrap().0, "done");
        assert!(shard.log_entry(group(0), 1).unwrap().is_some());
        let crashed = crashed.unwrap();
        let recovered = open(&crashed);
        assert_eq!(
            recovered.log_entry(group(0), 1).unwrap(),
            Some(Bytes::from("entry 0/1"))
        );
    }

    /// A lazy write is never fsynced on its own, so its `flushed` promises nothing early: it
    /// runs with `done`, once the write is readable, and no fsync happened for it.
    #[tokio::test]
    async fn a_lazy_writes_flushed_runs_with_done_once_readable() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = oneshot::channel();
        let reader = shard.clone();
        let flushed_seen = seen_tx.clone();
        shard
            .submit_flushed(
                vec![put(0, 1)],
                Durability::Lazy,
                move |result| {
                    result.unwrap();
                    let readable = reader.log_entry(group(0), 1).unwrap().is_some();
                    flushed_seen.send(("flushed", readable)).unwrap();
                },
                move |result| {
                    result.unwrap();
                    seen_tx.send(("done", true)).unwrap();
                    done_tx.send(()).unwrap();
                },
            )
            .await
            .unwrap();
        done_rx.await.unwrap();
        let (first, readable) = seen_rx.recv().unwrap();
        assert_eq!(first, "flushed");
        assert!(readable, "a lazy write's flushed waits for its commit");
        assert_eq!(seen_rx.recv().unwrap().0, "done");
        assert_eq!(shard.stats().fsyncs, 0, "nothing was fsynced for it");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_of_many_groups_share_commits() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let writes = 400u64;
        let tasks: Vec<_> = (0..writes)
            .map(|i| {
                let shard = shard.clone();
                tokio::spawn(async move {
                    shard
                        .write(vec![put((i % 16) as u16, i)], Durability::Immediate)
                        .await
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap().unwrap();
        }
        let stats = shard.stats();
        assert_eq!(stats.writes, writes);
        assert!(
            stats.fsyncs < writes,
            "group commit merges writes: {} fsyncs for {writes} writes",
            stats.fsyncs
        );
        for i in 0..writes {
            let entry = shard.log_entry(group((i % 16) as u16), i).unwrap().unwrap();
            assert_eq!(entry, Bytes::from(format!("entry {}/{i}", i % 16)));
        }
    }

    #[tokio::test]
    async fn lazy_writes_are_visible_at_once_and_kept_with_the_next_immediate_commit() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        shard
            .write(vec![put(0, 1)], Durability::Lazy)
            .await
            .unwrap();
        assert!(shard.log_entry(group(0), 1).unwrap().is_some());
        assert_eq!(shard.stats().fsyncs, 0);
        shard
            .write(vec![put(0, 2)], Durability::Immediate)
            .await
            .unwrap();
        assert_eq!(shard.stats().fsyncs, 1);
        shard
            .close(std::time::Duration::from_secs(5))
            .await
            .unwrap();
        let shard = open(&dir);
        assert!(shard.log_entry(group(0), 1).unwrap().is_some());
        assert!(shard.log_entry(group(0), 2).unwrap().is_some());
    }

    #[tokio::test]
    async fn truncate_purge_and_delete_touch_only_their_group() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let mut all = Vec::new();
        for p in 0..3 {
            for i in 1..=10 {
                all.push(put(p, i));
            }
        }
        shard.write(all, Durability::Immediate).await.unwrap();
        shard
            .write(
                vec![
                    Mutation::TruncateLogFrom {
                        group: group(0),
                        from: 8,
                    },
                    Mutation::PurgeLogThrough {
                        group: group(1),
                        through: 3,
                    },
                    Mutation::DeleteGroup { group: group(2) },
                ],
                Durability::Immediate,
            )
            .await
            .unwrap();
        let indexes = |p| {
            shard
                .log_entries(group(p), 0, 100)
                .unwrap()
                .into_iter()
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        assert_eq!(indexes(0), (1..=7).collect::<Vec<_>>());
        assert_eq!(indexes(1), (4..=10).collect::<Vec<_>>());
        assert!(indexes(2).is_empty());
        assert_eq!(shard.last_log_entry(group(0)).unwrap().unwrap().0, 7);
    }

    #[tokio::test]
    async fn groups_lists_every_group_with_metadata_until_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let meta = |p, key| Mutation::PutMeta {
            group: group(p),
            key,
            value: Bytes::from_static(b"v"),
        };
        shard
            .write(
                vec![
                    meta(2, MetaKey::Vote),
                    meta(0, MetaKey::Vote),
                    meta(0, MetaKey::Member),
                    meta(1, MetaKey::Member),
                ],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(shard.groups().unwrap(), vec![group(0), group(1), group(2)]);
        shard
            .write(
                vec![Mutation::DeleteGroup { group: group(1) }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(shard.groups().unwrap(), vec![group(0), group(2)]);
    }

    /// Writes index rows given as (first sequence, log index, first offset, time, count).
    async fn put_index_rows(shard: &Shard, g: GroupId, rows: &[(i64, u64, i64, i64, u32)]) {
        let mutations = rows
            .iter()
            .map(
                |&(first_sequence, log_index, first_offset, t, n)| Mutation::PutIndex {
                    group: g,
                    row: IndexRow {
                        first_sequence,
                        log_index,
                        first_offset,
                        enqueued_time_ms: t,
                        event_count: n,
                    },
                },
            )
            .collect();
        shard.write(mutations, Durability::Immediate).await.unwrap();
    }

    #[tokio::test]
    async fn index_lookups_find_the_entry_holding_a_position() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let g = group(0);
        put_index_rows(
            &shard,
            g,
            &[(0, 1, 0, 100, 3), (3, 2, 300, 200, 2), (5, 4, 500, 200, 1)],
        )
        .await;
        assert_eq!(
            shard.index_for_sequence(g, 4).unwrap().unwrap().log_index,
            2
        );
        assert_eq!(
            shard.index_for_sequence(g, 0).unwrap().unwrap().log_index,
            1
        );
        assert_eq!(shard.first_index(g).unwrap().unwrap().first_sequence, 0);
        assert_eq!(shard.sequence_for_offset(g, 499).unwrap(), Some(3));
        assert_eq!(shard.sequence_for_offset(g, -1).unwrap(), None);
        assert_eq!(shard.sequence_for_time(g, 100, true).unwrap(), Some(0));
        assert_eq!(shard.sequence_for_time(g, 100, false).unwrap(), Some(3));
        assert_eq!(shard.sequence_for_time(g, 200, false).unwrap(), None);
        shard
            .write(
                vec![Mutation::TruncateIndexFrom {
                    group: g,
                    from_sequence: 3,
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(
            shard
                .index_for_sequence(g, 9)
                .unwrap()
                .unwrap()
                .first_sequence,
            0
        );
        assert_eq!(shard.sequence_for_time(g, 100, false).unwrap(), None);
    }

    /// Retention removes the index rows of whole old entries: lookups then start at the
    /// first kept one.
    #[tokio::test]
    async fn index_rows_before_a_sequence_are_removed_with_their_offset_and_time_rows() {
        let dir = tempfile::tempdir().unwrap();
        let shard = open(&dir);
        let g = group(0);
        put_index_rows(
            &shard,
            g,
            &[(0, 1, 0, 100, 3), (3, 2, 300, 200, 2), (5, 4, 500, 300, 1)],
        )
        .await;
        shard
            .write(
                vec![Mutation::TruncateIndexBefore {
                    group: g,
                    before_sequence: 3,
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(shard.first_index(g).unwrap().unwrap().first_sequence, 3);
        assert_eq!(shard.index_for_sequence(g, 1).unwrap(), None);
        assert_eq!(shard.sequence_for_offset(g, 100).unwrap(), None);
        assert_eq!(shard.sequence_for_time(g, 0, true).unwrap(), Some(3));
        let kept: Vec<i64> = shard
            .index_rows(g, 3)
            .unwrap()
            .iter()
            .map(|r| r.first_sequence)
            .collect();
        assert_eq!(kept, vec![3], "rows of entries through log index 3");
    }
}
