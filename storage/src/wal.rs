//! The shard's log: a directory of append-only segment files that is both the write-ahead
//! log and the home of every Raft entry's bytes. Every batch of writes is appended as one
//! record (and fsynced when it holds a durable write) before it is committed to redb
//! *without* an fsync; redb is made durable only at checkpoints. redb keeps, for each log
//! entry, only where its bytes lie in a segment ([`Location`]), never the bytes themselves.
//!
//! Why: a durable redb commit rewrites every B-tree page the batch touched, about 60
//! scattered 4 KiB pages per group commit with 16 busy partitions, and redb's copy-on-write
//! pages made a node write about three bytes to its database for every byte of events
//! (plus the log's own copy). Now an entry's bytes are written once, sequentially, with the
//! batch they arrived in; redb's rows are a few dozen bytes per entry.
//!
//! Layout: files `<id>.seg` (id a zero-padded u64, increasing). Each starts with a 16-byte
//! header (`MAGIC`, then the id as u64 little-endian), then records
//! `[u32 length][u32 CRC-32 of the payload][payload]`. A segment is closed (fsynced) when
//! the next would grow past its size limit, so only the newest segment can end in a torn
//! record. redb stores the replay position ([`Position`]): the records from there on may
//! be missing from redb's durable state and are replayed on open, up to the first
//! incomplete or corrupt one (a prefix of the batches, including every batch whose fsync
//! completed). A segment no log row points into any more, and older than the replay
//! position, is deleted at a checkpoint.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::{Buf, BufMut, Bytes};
use tributary_types::GroupId;

use crate::error::StorageError;
use crate::mutation::{IndexRow, MetaKey, Mutation};

const MAGIC: &[u8; 8] = b"TRBSEG01";
/// The magic of the single-file log of earlier versions (`<shard>.wal`), replayed once.
const LEGACY_MAGIC: &[u8; 8] = b"TRBWAL01";
const HEADER_BYTES: u64 = 16;
const RECORD_HEADER_BYTES: usize = 8;
/// The active segment's disk space is reserved this far ahead of its records, so that an
/// append writes into blocks the file already has and never changes its size (see
/// [`ZERO_AHEAD_BYTES`] for what is left to the first write into reserved blocks).
/// An append that grows the file also commits the new size and block map through the
/// filesystem's journal, several times the data flush (measured on ext4: 0.4 to 1.5 ms
/// against 0.2 ms per small record). The unwritten tail reads as zeros, which ends replay like a
/// torn record; a segment is cut back to its records when it is closed.
const PREALLOCATE_BYTES: u64 = 8 * 1024 * 1024;
/// Reserved blocks are still "unwritten" to the filesystem (ext4, XFS): the first fdatasync
/// after data lands in them commits their conversion through the journal, which costs as
/// much as the data flush again or more. A record that reaches past the blocks already
/// written (and is smaller than [`ZERO_AHEAD_RECORD_MAX`]) therefore writes zeros after
/// itself, at least this many bytes and at least [`ZERO_AHEAD_RECORDS`] times its own
/// size: the next fsync converts them all at once, and
/// the fsyncs of the records that follow within them flush data alone. Measured on this
/// project's ext4 test machine: 4 KiB write + fdatasync 0.36-0.42 ms into reserved blocks,
/// 0.20-0.29 ms into written ones; 1 MiB blocks with `dd oflag=dsync` 411 MB/s into reserved
/// blocks, 1.4 GB/s into written ones, while zeros written in one go and fsynced once go at
/// 1.3 GB/s.
const ZERO_AHEAD_BYTES: usize = 512 * 1024;
/// A record past the written blocks writes zeros for this many records of its size ahead.
const ZERO_AHEAD_RECORDS: u64 = 4;
/// Records at least this large write no zeros ahead: the block conversion their fsync
/// pays is small beside their own bytes, while zeros for the records after them would
/// nearly double what reaches the disk (measured with 16 partitions of 64 KiB events on
/// one node: records of about 7 MB, each fifth followed by 28 MB of zeros, held the log
/// to half of what `dd oflag=dsync bs=1M` writes).
const ZERO_AHEAD_RECORD_MAX: u64 = 256 * 1024;
static ZEROS: [u8; ZERO_AHEAD_BYTES] = [0; ZERO_AHEAD_BYTES];
/// Log bytes left in the OS page cache behind the newest fsynced record: readers that keep
/// up (consumers at the tail) find what they read there, and the pages before are let go
/// (`POSIX_FADV_DONTNEED`), so the log's cache stays this size per shard instead of
/// growing with every byte written. Beside bounded memory, writing into pages the cache
/// just let go is much cheaper than into fresh ones where the kernel must find new memory
/// (measured on this project's test machine, 1 GiB with `dd oflag=dsync bs=1M`: 217-305
/// MB/s, and 760-908 MB/s with `oflag=dsync,nocache`, which lets go of each block).
const CACHED_BEHIND_BYTES: u64 = 64 * 1024 * 1024;
/// Entries of at least this many bytes are written from where they lie instead of being
/// copied into their record's buffer (see [`Wal::append`]).
const ENTRY_INLINE_MAX: usize = 4096;
/// Records larger than this are written (and handed to the disk) in pieces of about this
/// size (see [`Wal::append`]).
const STREAM_PIECE_BYTES: usize = 1024 * 1024;
/// The most slices one vectored write takes (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;
/// Pages are let go in steps of at least this many bytes (a system call each).
const UNCACHE_STEP_BYTES: u64 = 4 * 1024 * 1024;

/// Where one log entry's bytes lie.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) segment: u64,
    pub(crate) offset: u64,
    pub(crate) len: u32,
}

/// A point in the log: segment id and byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub(crate) struct Position {
    pub(crate) segment: u64,
    pub(crate) offset: u64,
}

/// One batch found on replay: its writes and, in order, where each `PutLog` entry's bytes lie.
pub(crate) struct Replayed {
    pub(crate) mutations: Vec<Mutation>,
    pub(crate) locations: Vec<Location>,
}

/// Segment files readers keep open at most (the newest are the ones read most); a shard of
/// many segments would otherwise run into the process's limit on open files.
pub(crate) const OPEN_SEGMENTS_MAX: usize = 64;

/// The segments of a log, shared by the writer (which adds and deletes them) and readers,
/// with read handles to the recently read ones.
#[derive(Debug)]
pub(crate) struct Segments {
    dir: PathBuf,
    ids: RwLock<BTreeSet<u64>>,
    open: Mutex<BTreeMap<u64, Arc<File>>>,
}

impl Segments {
    /// A read handle to segment `id`, opened if none is.
    fn file(&self, id: u64) -> Result<Arc<File>, StorageError> {
        if let Some(file) = self.open.lock().expect("segments lock").get(&id) {
            return Ok(file.clone());
        }
        if !self.ids.read().expect("segments lock").contains(&id) {
            return Err(StorageError::Io(format!(
                "segment {id} of {} is gone (its entries were purged)",
                self.dir.display()
            )));
        }
        let file = Arc::new(File::open(self.path(id)).map_err(|e| {
            StorageError::Io(format!(
                "cannot open segment {id} of {}: {e}",
                self.dir.display()
            ))
        })?);
        let mut open = self.open.lock().expect("segments lock");
        while open.len() >= OPEN_SEGMENTS_MAX {
            // The oldest first: readers mostly follow the newest.
            open.pop_first();
        }
        open.insert(id, file.clone());
        Ok(file)
    }

    /// Reads one entry's bytes.
    pub(crate) fn read(&self, location: Location) -> Result<Bytes, StorageError> {
        let file = self.file(location.segment)?;
        let mut bytes = vec![0; location.len as usize];
        file.read_exact_at(&mut bytes, location.offset)
            .map_err(|e| {
                StorageError::Io(format!(
                    "reading segment {} of {}: {e}",
                    location.segment,
                    self.dir.display()
                ))
            })?;
        Ok(Bytes::from(bytes))
    }

    /// Ids of the segments on disk, in order.
    pub(crate) fn ids(&self) -> Vec<u64> {
        self.ids
            .read()
            .expect("segments lock")
            .iter()
            .copied()
            .collect()
    }

    /// Forgets a segment about to be deleted.
    fn remove(&self, id: u64) {
        self.ids.write().expect("segments lock").remove(&id);
        self.open.lock().expect("segments lock").remove(&id);
    }

    fn path(&self, id: u64) -> PathBuf {
        segment_path(&self.dir, id)
    }
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

/// The writer's side of the log: appends records to the newest segment.
pub(crate) struct Wal {
    segments: Arc<Segments>,
    active: Arc<File>,
    active_id: u64,
    /// Bytes in the active segment (header included): where the next record goes.
    active_len: u64,
    /// Whether segments reserve their space ahead of appends (not on tmpfs, nor once
    /// `fallocate` failed).
    reserving: bool,
    /// Bytes of the active segment reserved on disk ([`PREALLOCATE_BYTES`] ahead).
    allocated: u64,
    /// Bytes of the active segment written, with records or with zeros ahead of them
    /// ([`ZERO_AHEAD_BYTES`]): appends within them need no block conversion.
    written: u64,
    /// Whether log pages behind [`CACHED_BEHIND_BYTES`] are let go (not on tmpfs, where
    /// the pages are the data).
    uncaching: bool,
    /// Bytes at the start of the active segment whose pages were let go.
    uncached: u64,
    /// The segment before the active one while its end is still within
    /// [`CACHED_BEHIND_BYTES`] of the newest record: (file, bytes let go, length).
    previous: Option<(Arc<File>, u64, u64)>,
    segment_bytes_max: u64,
    /// Records and bytes appended since the last checkpoint.
    records: u64,
    bytes: u64,
    buf: Vec<u8>,
    /// Where, relative to the record, each `PutLog` entry of the record being built lies.
    entries: Vec<(u64, u32)>,
    /// The record being written, in order: `buf` up to each position, then the entry
    /// written from where it lies (`None`: the end).
    pieces: Vec<(usize, Option<Bytes>)>,
}

impl Wal {
    /// Opens (or creates) the log in `dir` and returns the batches from `from` on, to replay
    /// on top of redb. Appends go to a new segment, so the caller's next checkpoint should
    /// record [`Wal::position`] as the replay position.
    pub(crate) fn open(
        dir: &Path,
        from: Position,
        segment_bytes_max: u64,
    ) -> Result<(Wal, Vec<Replayed>), StorageError> {
        let io = |what: &str, e: std::io::Error| {
            StorageError::Io(format!("{what} {}: {e}", dir.display()))
        };
        std::fs::create_dir_all(dir).map_err(|e| io("cannot create", e))?;
        let mut ids = Vec::new();
        for item in std::fs::read_dir(dir).map_err(|e| io("cannot list", e))? {
            let name = item.map_err(|e| io("cannot list", e))?.file_name();
            let id = name
                .to_str()
                .and_then(|n| n.strip_suffix(".seg"))
                .and_then(|n| n.parse::<u64>().ok());
            if let Some(id) = id {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        let mut kept = BTreeSet::new();
        let mut replay = Vec::new();
        let mut torn = false;
        for id in ids {
            let path = segment_path(dir, id);
            if torn {
                // After a torn or corrupt record nothing was durable: drop what follows.
                std::fs::remove_file(&path).map_err(|e| io("cannot remove a segment of", e))?;
                continue;
            }
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io("cannot open a segment of", e))?;
            if id >= from.segment {
                let start = if id == from.segment {
                    from.offset.max(HEADER_BYTES)
                } else {
                    HEADER_BYTES
                };
                let mut contents = Vec::new();
                file.read_to_end(&mut contents)
                    .map_err(|e| io("cannot read a segment of", e))?;
                if parse_header(&contents, MAGIC) != Some(id) {
                    // Torn while being created: it holds no record.
                    torn = true;
                    drop(file);
                    std::fs::remove_file(&path).map_err(|e| io("cannot remove a segment of", e))?;
                    continue;
                }
                let body = contents.get(start as usize..).unwrap_or_default();
                let (batches, used) = parse_records(body, id, start);
                replay.extend(batches);
                let valid = start + used as u64;
                if valid < contents.len() as u64 {
                    torn = true;
                    file.set_len(valid)
                        .map_err(|e| io("cannot cut a torn segment of", e))?;
                }
            }
            kept.insert(id);
        }
        // Never reuse the replay position's segment id, even if its file is gone.
        let next = kept
            .iter()
            .next_back()
            .map_or(1, |id| id + 1)
            .max(from.segment + 1);
        let segments = Arc::new(Segments {
            dir: dir.to_path_buf(),
            ids: RwLock::new(kept),
            open: Mutex::new(BTreeMap::new()),
        });
        let (active, active_len) = create_segment(&segments, next)?;
        let wal = Wal {
            segments,
            active,
            active_id: next,
            active_len,
            // Nothing to gain where the log lives in memory, and memory to lose.
            reserving: !in_memory(dir),
            allocated: active_len,
            written: active_len,
            uncaching: !in_memory(dir),
            uncached: 0,
            previous: None,
            segment_bytes_max,
            records: 0,
            bytes: 0,
            buf: Vec::new(),
            entries: Vec::new(),
            pieces: Vec::new(),
        };
        Ok((wal, replay))
    }

    pub(crate) fn segments(&self) -> &Arc<Segments> {
        &self.segments
    }

    /// Appends one batch of writes as one record (not yet fsynced); returns where each
    /// `PutLog` entry's bytes lie, in order.
    ///
    /// Entries of [`ENTRY_INLINE_MAX`] bytes or more are not copied into the record's
    /// buffer: the record goes out in one vectored write from the buffer (headers, small
    /// writes) and the entries where they lie. A record larger than [`STREAM_PIECE_BYTES`]
    /// is written in pieces of about that size, the disk handed each piece as soon as it is
    /// written ([`start_writeback`]), so the disk writes while the next piece is copied and
    /// the fsync after it waits for the last piece only; its header (length and CRC) goes
    /// last. Until the header is written the record reads as torn and ends replay.
    pub(crate) fn append<'a>(
        &mut self,
        mutations: impl Iterator<Item = &'a Mutation>,
    ) -> Result<Vec<Location>, StorageError> {
        self.buf.clear();
        self.entries.clear();
        self.pieces.clear();
        self.buf.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
        let mut count = 0u32;
        let count_at = self.buf.len();
        self.buf.put_u32_le(0);
        // Bytes of the record written from the entries themselves so far.
        let mut referenced = 0u64;
        for mutation in mutations {
            match mutation {
                Mutation::PutLog {
                    group,
                    index,
                    entry,
                } if entry.len() >= ENTRY_INLINE_MAX => {
                    put_log_head(&mut self.buf, *group, *index, entry.len());
                    self.entries
                        .push((self.buf.len() as u64 + referenced, entry.len() as u32));
                    self.pieces.push((self.buf.len(), Some(entry.clone())));
                    referenced += entry.len() as u64;
                }
                _ => {
                    if let Some((offset, len)) = encode(mutation, &mut self.buf) {
                        self.entries.push((offset + referenced, len));
                    }
                }
            }
            count += 1;
        }
        self.buf[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        self.pieces.push((self.buf.len(), None));
        let record_len = self.buf.len() as u64 + referenced;
        if self.active_len > HEADER_BYTES && self.active_len + record_len > self.segment_bytes_max {
            self.roll()?;
        }
        let at = self.active_len;
        let mut zeros = self.zero_target(at, record_len);
        if !self.reserve(zeros.unwrap_or(at + record_len)) {
            // Nothing reserved (or reserving failed just now): nothing to convert, nor
            // anywhere to write zeros without growing the file.
            zeros = None;
        }
        let written = write_record(&self.active, at, &mut self.buf, &self.pieces);
        // The entries' bytes are the caller's: hold on to none of them.
        self.pieces.clear();
        written.map_err(|e| self.error("write", e))?;
        self.active_len += record_len;
        self.zero_ahead(self.active_len, zeros)?;
        self.records += 1;
        self.bytes += record_len;
        let segment = self.active_id;
        Ok(self
            .entries
            .iter()
            .map(|&(offset, len)| Location {
                segment,
                offset: at + offset,
                len,
            })
            .collect())
    }

    /// Makes every appended record durable, then lets go of the cached pages more than
    /// [`CACHED_BEHIND_BYTES`] behind the newest.
    pub(crate) fn sync(&mut self) -> Result<(), StorageError> {
        self.active
            .sync_data()
            .map_err(|e| self.error("fsync", e))?;
        self.uncache();
        Ok(())
    }

    /// Lets go of the log's pages more than [`CACHED_BEHIND_BYTES`] behind the end of the
    /// active segment, once at least [`UNCACHE_STEP_BYTES`] of them are due. Only after an
    /// fsync, so the pages are clean (the kernel keeps dirty ones anyway). Best effort.
    fn uncache(&mut self) {
        if !self.uncaching {
            return;
        }
        let end = self.active_len;
        if let Some((file, from, len)) = &mut self.previous {
            let keep_from = len.saturating_sub(CACHED_BEHIND_BYTES.saturating_sub(end));
            if keep_from == *len || keep_from >= *from + UNCACHE_STEP_BYTES {
                let_go(file, *from, keep_from);
                *from = keep_from;
            }
            if *from >= *len {
                self.previous = None;
            }
        }
        let keep_from = end.saturating_sub(CACHED_BEHIND_BYTES);
        if keep_from >= self.uncached + UNCACHE_STEP_BYTES {
            let_go(&self.active, self.uncached, keep_from);
            self.uncached = keep_from;
        }
    }

    /// Where the next record goes.
    pub(crate) fn position(&self) -> Position {
        Position {
            segment: self.active_id,
            offset: self.active_len,
        }
    }

    /// A checkpoint made everything appended so far durable in redb.
    pub(crate) fn checkpointed(&mut self) {
        self.records = 0;
        self.bytes = 0;
    }

    /// Deletes a segment no longer needed (nothing points into it, and it is older than
    /// the replay position).
    pub(crate) fn delete(&self, id: u64) -> Result<(), StorageError> {
        assert!(id < self.active_id, "the active segment is never deleted");
        self.segments.remove(id);
        match std::fs::remove_file(self.segments.path(id)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(self.error("delete a segment", e)),
        }
    }

    /// Bytes of records since the last checkpoint.
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Records since the last checkpoint.
    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    /// Closes the active segment (fsynced, so only the newest segment can be torn) and
    /// starts the next.
    fn roll(&mut self) -> Result<(), StorageError> {
        if self.allocated > self.active_len {
            // Only the newest segment may end in zeros: replay stops there, and drops
            // every later segment as written after a torn record.
            self.active
                .set_len(self.active_len)
                .map_err(|e| self.error("cut the reserved tail", e))?;
        }
        self.sync()?;
        let next = self.active_id + 1;
        let (active, len) = create_segment(&self.segments, next)?;
        if let Some((file, from, end)) = self.previous.take() {
            // Segments smaller than the cached window: the one before goes entirely.
            let_go(&file, from, end);
        }
        if self.uncaching {
            let closed = std::mem::replace(&mut self.active, active);
            self.previous = Some((closed, self.uncached, self.active_len));
        } else {
            self.active = active;
        }
        self.uncached = 0;
        self.active_id = next;
        self.active_len = len;
        self.allocated = len;
        self.written = len;
        Ok(())
    }

    /// Reserves the active segment's blocks through `end`, and [`PREALLOCATE_BYTES`] beyond
    /// (not past the segment's size limit unless one record is larger). Best effort: on a
    /// filesystem without `fallocate` appends grow the file, as they would anyway. Whether
    /// the blocks through `end` are reserved.
    fn reserve(&mut self, end: u64) -> bool {
        if !self.reserving {
            return false;
        }
        if end <= self.allocated {
            return true;
        }
        let target = (end + PREALLOCATE_BYTES).min(self.segment_bytes_max.max(end));
        match preallocate(&self.active, self.allocated, target - self.allocated) {
            Ok(()) => {
                self.allocated = target;
                true
            }
            Err(err) => {
                tracing::debug!(%err, segment = self.active_id, "cannot reserve log segment space; appending without");
                // Do not ask again.
                self.reserving = false;
                false
            }
        }
    }

    /// Before an append of `len` bytes at `at`: where zeros should follow it, when it reaches
    /// past the blocks already written ([`ZERO_AHEAD_BYTES`]); never past the segment's size
    /// limit. The caller reserves that far before writing.
    fn zero_target(&self, at: u64, len: u64) -> Option<u64> {
        let end = at + len;
        if !self.reserving || end <= self.written || len >= ZERO_AHEAD_RECORD_MAX {
            return None;
        }
        let ahead = (ZERO_AHEAD_BYTES as u64).max(len * ZERO_AHEAD_RECORDS);
        let target = (end + ahead).min(self.segment_bytes_max);
        (target > end).then_some(target)
    }

    /// After an append ending at `end`: writes zeros from there through `target` (reserved
    /// space, so the file's size does not change).
    fn zero_ahead(&mut self, end: u64, target: Option<u64>) -> Result<(), StorageError> {
        if let Some(target) = target {
            let mut at = end;
            while at < target {
                let len = (target - at).min(ZERO_AHEAD_BYTES as u64) as usize;
                self.active
                    .write_all_at(&ZEROS[..len], at)
                    .map_err(|e| self.error("write zeros ahead", e))?;
                at += len as u64;
            }
        }
        self.written = self.written.max(target.unwrap_or(end));
        Ok(())
    }

    fn error(&self, what: &str, err: std::io::Error) -> StorageError {
        StorageError::Io(format!(
            "log segment {} of {}: {what} failed: {err}",
            self.active_id,
            self.segments.dir.display()
        ))
    }
}

/// Lets the kernel drop `file`'s cached pages in `from..to` (best effort: a failure only
/// leaves them cached).
#[cfg(target_os = "linux")]
fn let_go(file: &File, from: u64, to: u64) {
    if to <= from {
        return;
    }
    if let Err(err) = nix::fcntl::posix_fadvise(
        file,
        from as i64,
        (to - from) as i64,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    ) {
        tracing::debug!(%err, "cannot let go of cached log pages");
    }
}

#[cfg(not(target_os = "linux"))]
fn let_go(_file: &File, _from: u64, _to: u64) {}

/// Whether `dir` is on a memory-backed filesystem (tmpfs), where reserving blocks only
/// takes memory: its fsync flushes nothing.
#[cfg(target_os = "linux")]
fn in_memory(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

#[cfg(not(target_os = "linux"))]
fn in_memory(_dir: &Path) -> bool {
    false
}

#[cfg(target_os = "linux")]
fn preallocate(file: &File, offset: u64, len: u64) -> std::io::Result<()> {
    nix::fcntl::fallocate(
        file,
        nix::fcntl::FallocateFlags::empty(),
        offset as i64,
        len as i64,
    )
    .map_err(std::io::Error::from)
}

#[cfg(not(target_os = "linux"))]
fn preallocate(_file: &File, _offset: u64, _len: u64) -> std::io::Result<()> {
    Err(std::io::Error::from(std::io::ErrorKind::Unsupported))
}

/// Creates segment `id` with its header, durably (file and directory entry).
fn create_segment(segments: &Segments, id: u64) -> Result<(Arc<File>, u64), StorageError> {
    let path = segments.path(id);
    let io = |what: &str, e: std::io::Error| {
        StorageError::Io(format!("cannot {what} {}: {e}", path.display()))
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .map_err(|e| io("create", e))?;
    let mut header = Vec::with_capacity(HEADER_BYTES as usize);
    header.extend_from_slice(MAGIC);
    header.put_u64_le(id);
    file.write_all_at(&header, 0).map_err(|e| io("write", e))?;
    file.sync_data().map_err(|e| io("fsync", e))?;
    File::open(&segments.dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| io("fsync the directory of", e))?;
    let file = Arc::new(file);
    segments.ids.write().expect("segments lock").insert(id);
    Ok((file, HEADER_BYTES))
}

/// The batches of an earlier version's single-file log (`<shard>.wal`) still to replay:
/// those of `generation`, the log that followed redb's last checkpoint. Their entries go
/// to redb whole (the file is removed afterwards).
pub(crate) fn read_legacy(
    path: &Path,
    generation: u64,
) -> Result<Vec<Vec<Mutation>>, StorageError> {
    let contents = match std::fs::read(path) {
        Ok(contents) => contents,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(StorageError::Io(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    };
    if parse_header(&contents, LEGACY_MAGIC) != Some(generation) {
        // Empty, torn while being reset, or already contained in redb.
        return Ok(Vec::new());
    }
    let (batches, _) = parse_records(&contents[HEADER_BYTES as usize..], 0, 0);
    Ok(batches.into_iter().map(|b| b.mutations).collect())
}

fn parse_header(contents: &[u8], magic: &[u8; 8]) -> Option<u64> {
    let header = contents.get(..HEADER_BYTES as usize)?;
    if &header[..8] != magic {
        return None;
    }
    Some(u64::from_le_bytes(
        header[8..16].try_into().expect("8 bytes"),
    ))
}

/// The complete records at the start of `body` (which starts at byte `start` of segment
/// `segment`), decoded, and how many bytes they take; stops at the first incomplete,
/// corrupt or undecodable one.
fn parse_records(body: &[u8], segment: u64, start: u64) -> (Vec<Replayed>, usize) {
    let mut batches = Vec::new();
    let mut used = 0;
    while body.len() - used >= RECORD_HEADER_BYTES {
        let rest = &body[used..];
        let len = u32::from_le_bytes(rest[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(rest[4..8].try_into().expect("4 bytes"));
        let Some(payload) = rest.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Some((mutations, entries)) = decode_batch(payload) else {
            break;
        };
        let payload_at = start + (used + RECORD_HEADER_BYTES) as u64;
        batches.push(Replayed {
            mutations,
            locations: entries
                .into_iter()
                .map(|(offset, len)| Location {
                    segment,
                    offset: payload_at + offset,
                    len,
                })
                .collect(),
        });
        used += RECORD_HEADER_BYTES + len;
    }
    (batches, used)
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.put_u32_le(bytes.len() as u32);
    out.extend_from_slice(bytes);
}

/// A `PutLog` write up to its entry's bytes, which follow it.
fn put_log_head(out: &mut Vec<u8>, group: GroupId, index: u64, len: usize) {
    out.put_u8(1);
    out.put_u64_le(group.to_u64());
    out.put_u64_le(index);
    out.put_u32_le(len as u32);
}

/// Writes a record at `at`: `buf` (its header's 8 bytes left for this function to fill)
/// interleaved with the entries of `pieces` (see [`Wal::append`]).
fn write_record(
    file: &File,
    at: u64,
    buf: &mut [u8],
    pieces: &[(usize, Option<Bytes>)],
) -> std::io::Result<()> {
    let payload_len: usize = buf.len() - RECORD_HEADER_BYTES
        + pieces
            .iter()
            .flat_map(|(_, e)| e)
            .map(Bytes::len)
            .sum::<usize>();
    let header = |crc: u32| {
        let mut header = [0u8; RECORD_HEADER_BYTES];
        header[0..4].copy_from_slice(&(payload_len as u32).to_le_bytes());
        header[4..8].copy_from_slice(&crc.to_le_bytes());
        header
    };
    // The header's bytes apart from the payload's, so both can be borrowed at once.
    let (head, after_head) = buf.split_at_mut(RECORD_HEADER_BYTES);
    let payload = payload_slices(after_head, pieces);
    let mut crc = crc32fast::Hasher::new();
    // At most 1 MiB with every referenced entry at least 4 KiB: about 512 slices, within
    // IOV_MAX for the single write.
    if payload_len + RECORD_HEADER_BYTES <= STREAM_PIECE_BYTES {
        for slice in &payload {
            crc.update(slice);
        }
        head.copy_from_slice(&header(crc.finalize()));
        let mut all = vec![std::io::IoSlice::new(head)];
        all.extend(payload.into_iter().map(std::io::IoSlice::new));
        return write_all_vectored_at(file, &mut all, at);
    }
    let mut offset = at + RECORD_HEADER_BYTES as u64;
    let mut rest = &payload[..];
    while !rest.is_empty() {
        // Slices up to about STREAM_PIECE_BYTES (and the system's limit on their number).
        let mut take = 0;
        let mut bytes = 0;
        while take < rest.len() && take < IOV_MAX && bytes < STREAM_PIECE_BYTES {
            bytes += rest[take].len();
            take += 1;
        }
        let mut piece: Vec<std::io::IoSlice<'_>> = rest[..take]
            .iter()
            .map(|s| std::io::IoSlice::new(s))
            .collect();
        for slice in &rest[..take] {
            crc.update(slice);
        }
        write_all_vectored_at(file, &mut piece, offset)?;
        start_writeback(file, offset, bytes as u64);
        offset += bytes as u64;
        rest = &rest[take..];
    }
    file.write_all_at(&header(crc.finalize()), at)
}

/// A record's payload as slices in order: `payload` (the record's buffer after its header)
/// up to each piece's position (counted in the whole buffer), then the piece's entry.
fn payload_slices<'a>(payload: &'a [u8], pieces: &'a [(usize, Option<Bytes>)]) -> Vec<&'a [u8]> {
    let mut slices = Vec::with_capacity(pieces.len() * 2);
    let mut from = 0;
    for (to, entry) in pieces {
        let to = to - RECORD_HEADER_BYTES;
        if to > from {
            slices.push(&payload[from..to]);
        }
        from = to;
        if let Some(entry) = entry {
            slices.push(&entry[..]);
        }
    }
    slices
}

/// Writes every byte of `slices` at `at`, however many calls it takes.
fn write_all_vectored_at(
    file: &File,
    mut slices: &mut [std::io::IoSlice<'_>],
    mut at: u64,
) -> std::io::Result<()> {
    while !slices.is_empty() {
        let written = nix::sys::uio::pwritev(file, slices, at as i64)?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        at += written as u64;
        std::io::IoSlice::advance_slices(&mut slices, written);
    }
    Ok(())
}

/// Asks the kernel to start writing `file`'s dirty pages in `from..from + len` to disk
/// without waiting for them (the fsync after waits for whatever is left). Linux starts
/// that writeback for `POSIX_FADV_DONTNEED` before dropping the range's clean pages, and
/// pages just written are dirty, so they stay cached (`sync_file_range` would say it
/// directly but is not offered without `unsafe`). Best effort.
#[cfg(target_os = "linux")]
fn start_writeback(file: &File, from: u64, len: u64) {
    if let Err(err) = nix::fcntl::posix_fadvise(
        file,
        from as i64,
        len as i64,
        nix::fcntl::PosixFadviseAdvice::POSIX_FADV_DONTNEED,
    ) {
        tracing::debug!(%err, "cannot start writing log pages back");
    }
}

#[cfg(not(target_os = "linux"))]
fn start_writeback(_file: &File, _from: u64, _len: u64) {}

/// Encodes one write; for a `PutLog`, returns where in `out` its entry's bytes went.
fn encode(mutation: &Mutation, out: &mut Vec<u8>) -> Option<(u64, u32)> {
    match mutation {
        Mutation::PutLog {
            group,
            index,
            entry,
        } => {
            put_log_head(out, *group, *index, entry.len());
            out.extend_from_slice(entry);
            return Some(((out.len() - entry.len()) as u64, entry.len() as u32));
        }
        Mutation::TruncateLogFrom { group, from } => {
            out.put_u8(2);
            out.put_u64_le(group.to_u64());
            out.put_u64_le(*from);
        }
        Mutation::PurgeLogThrough { group, through } => {
            out.put_u8(3);
            out.put_u64_le(group.to_u64());
            out.put_u64_le(*through);
        }
        Mutation::PutMeta { group, key, value } => {
            out.put_u8(4);
            out.put_u64_le(group.to_u64());
            out.put_u8(*key as u8);
            put_bytes(out, value);
        }
        Mutation::PutIndex { group, row } => {
            out.put_u8(5);
            out.put_u64_le(group.to_u64());
            out.put_i64_le(row.first_sequence);
            out.put_u64_le(row.log_index);
            out.put_i64_le(row.first_offset);
            out.put_i64_le(row.enqueued_time_ms);
            out.put_u32_le(row.event_count);
        }
        Mutation::TruncateIndexFrom {
            group,
            from_sequence,
        } => {
            out.put_u8(6);
            out.put_u64_le(group.to_u64());
            out.put_i64_le(*from_sequence);
        }
        Mutation::TruncateIndexBefore {
            group,
            before_sequence,
        } => {
            out.put_u8(10);
            out.put_u64_le(group.to_u64());
            out.put_i64_le(*before_sequence);
        }
        Mutation::DeleteGroup { group } => {
            out.put_u8(7);
            out.put_u64_le(group.to_u64());
        }
        Mutation::InstallStaged { group, through } => {
            out.put_u8(11);
            out.put_u64_le(group.to_u64());
            out.put_u64_le(*through);
        }
        Mutation::PutCatalog { key, value } => {
            out.put_u8(8);
            put_bytes(out, key.as_bytes());
            put_bytes(out, value);
        }
        Mutation::DeleteCatalog { key } => {
            out.put_u8(9);
            put_bytes(out, key.as_bytes());
        }
    }
    None
}

fn meta_key(byte: u8) -> Option<MetaKey> {
    Some(match byte {
        1 => MetaKey::Vote,
        2 => MetaKey::Committed,
        3 => MetaKey::Purged,
        4 => MetaKey::Applied,
        5 => MetaKey::Snapshot,
        6 => MetaKey::Member,
        7 => MetaKey::AssignedAt,
        8 => MetaKey::SnapshotState,
        _ => return None,
    })
}

/// A reader over one record's payload that fails softly (`None`) on truncation.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn need(&self, n: usize) -> Option<()> {
        (self.0.remaining() >= n).then_some(())
    }
    fn u8(&mut self) -> Option<u8> {
        self.need(1)?;
        Some(self.0.get_u8())
    }
    fn u32(&mut self) -> Option<u32> {
        self.need(4)?;
        Some(self.0.get_u32_le())
    }
    fn u64(&mut self) -> Option<u64> {
        self.need(8)?;
        Some(self.0.get_u64_le())
    }
    fn i64(&mut self) -> Option<i64> {
        self.need(8)?;
        Some(self.0.get_i64_le())
    }
    fn group(&mut self) -> Option<GroupId> {
        self.u64().map(GroupId::from_u64)
    }
    fn bytes(&mut self) -> Option<Bytes> {
        let len = self.u32()? as usize;
        self.need(len)?;
        let bytes = Bytes::copy_from_slice(&self.0[..len]);
        self.0.advance(len);
        Some(bytes)
    }
    fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
}

/// One record's writes and, for each `PutLog`, where in `payload` its entry's bytes lie.
type Decoded = (Vec<Mutation>, Vec<(u64, u32)>);

fn decode_batch(payload: &[u8]) -> Option<Decoded> {
    let mut r = Reader(payload);
    let count = r.u32()?;
    let mut batch = Vec::with_capacity(count.min(1 << 16) as usize);
    let mut entries = Vec::new();
    for _ in 0..count {
        let mutation = match r.u8()? {
            1 => {
                let group = r.group()?;
                let index = r.u64()?;
                let entry = r.bytes()?;
                let at = payload.len() - r.0.remaining() - entry.len();
                entries.push((at as u64, entry.len() as u32));
                Mutation::PutLog {
                    group,
                    index,
                    entry,
                }
            }
            2 => Mutation::TruncateLogFrom {
                group: r.group()?,
                from: r.u64()?,
            },
            3 => Mutation::PurgeLogThrough {
                group: r.group()?,
                through: r.u64()?,
            },
            4 => Mutation::PutMeta {
                group: r.group()?,
                key: meta_key(r.u8()?)?,
                value: r.bytes()?,
            },
            5 => Mutation::PutIndex {
                group: r.group()?,
                row: IndexRow {
                    first_sequence: r.i64()?,
                    log_index: r.u64()?,
                    first_offset: r.i64()?,
                    enqueued_time_ms: r.i64()?,
                    event_count: r.u32()?,
                },
            },
            6 => Mutation::TruncateIndexFrom {
                group: r.group()?,
                from_sequence: r.i64()?,
            },
            7 => Mutation::DeleteGroup { group: r.group()? },
            11 => Mutation::InstallStaged {
                group: r.group()?,
                through: r.u64()?,
            },
            10 => Mutation::TruncateIndexBefore {
                group: r.group()?,
                before_sequence: r.i64()?,
            },
            8 => Mutation::PutCatalog {
                key: r.string()?,
                value: r.bytes()?,
            },
            9 => Mutation::DeleteCatalog { key: r.string()? },
            _ => return None,
        };
        batch.push(mutation);
    }
    r.0.is_empty().then_some((batch, entries))
}

#[cfg(test)]
pub(crate) mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Writes a single-file log as earlier versions did.
    pub(crate) fn write_legacy(path: &Path, generation: u64, batches: &[Vec<Mutation>]) {
        let mut out = Vec::new();
        out.extend_from_slice(LEGACY_MAGIC);
        out.put_u64_le(generation);
        for batch in batches {
            let mut payload = Vec::new();
            payload.put_u32_le(batch.len() as u32);
            for mutation in batch {
                encode(mutation, &mut payload);
            }
            out.put_u32_le(payload.len() as u32);
            out.put_u32_le(crc32fast::hash(&payload));
            out.extend_from_slice(&payload);
        }
        std::fs::write(path, out).unwrap();
    }

    /// A batch holding every kind of write, each field set.
    fn every_mutation() -> Vec<Mutation> {
        let group = GroupId::from_u64(0x0000_0007_0003_0002);
        let mut batch = vec![
            Mutation::PutLog {
                group,
                index: 300,
                entry: Bytes::from_static(b"an entry's bytes"),
            },
            Mutation::TruncateLogFrom { group, from: 301 },
            Mutation::PurgeLogThrough {
                group,
                through: 200,
            },
        ];
        for key in [
            MetaKey::Vote,
            MetaKey::Committed,
            MetaKey::Purged,
            MetaKey::Applied,
            MetaKey::Snapshot,
            MetaKey::Member,
            MetaKey::AssignedAt,
            MetaKey::SnapshotState,
        ] {
            batch.push(Mutation::PutMeta {
                group,
                key,
                value: Bytes::from(vec![key as u8; 3]),
            });
        }
        batch.extend([
            Mutation::PutIndex {
                group,
                row: IndexRow {
                    first_sequence: 1_000,
                    log_index: 300,
                    first_offset: 65_536,
                    enqueued_time_ms: 1_790_000_000_000,
                    event_count: 16,
                },
            },
            Mutation::TruncateIndexFrom {
                group,
                from_sequence: 1_016,
            },
            Mutation::DeleteGroup { group },
            Mutation::InstallStaged {
                group,
                through: 299,
            },
            Mutation::TruncateIndexBefore {
                group,
                before_sequence: 900,
            },
            Mutation::PutCatalog {
                key: "catalog-key".into(),
                value: Bytes::from_static(b"value"),
            },
            Mutation::DeleteCatalog {
                key: "catalog-key".into(),
            },
        ]);
        batch
    }

    /// A log record's payload as release 0.1.0 wrote it (`golden/format-1/wal-batch.bin`):
    /// every kind of write still replays to the same mutation. The log's records are
    /// versioned by their tags (a new kind of write gets a new tag) and its files by their
    /// magic.
    #[test]
    fn a_record_of_release_0_1_0_replays() {
        /// Mutations compared by their debug form (they have no `PartialEq`).
        #[derive(Debug)]
        struct Batch(Vec<Mutation>);
        impl PartialEq for Batch {
            fn eq(&self, other: &Self) -> bool {
                format!("{self:?}") == format!("{other:?}")
            }
        }
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("golden");
        tributary_types::format::golden::check(
            &dir,
            tributary_types::format::FORMAT_LEGACY,
            "wal-batch",
            &Batch(every_mutation()),
            |_, batch| {
                let mut payload = Vec::new();
                payload.put_u32_le(batch.0.len() as u32);
                for mutation in &batch.0 {
                    encode(mutation, &mut payload);
                }
                payload
            },
            |payload| {
                decode_batch(payload)
                    .map(|(mutations, _)| Batch(mutations))
                    .ok_or_else(|| "not a log record".to_string())
            },
        );
    }

    fn mutation() -> impl Strategy<Value = Mutation> {
        let group = any::<u64>().prop_map(GroupId::from_u64);
        let bytes = proptest::collection::vec(any::<u8>(), 0..64).prop_map(Bytes::from);
        prop_oneof![
            (group.clone(), any::<u64>(), bytes.clone()).prop_map(|(group, index, entry)| {
                Mutation::PutLog {
                    group,
                    index,
                    entry,
                }
            }),
            (group.clone(), any::<u64>())
                .prop_map(|(group, from)| Mutation::TruncateLogFrom { group, from }),
            (group.clone(), any::<u64>())
                .prop_map(|(group, through)| Mutation::PurgeLogThrough { group, through }),
            (group.clone(), 1u8..=8, bytes.clone()).prop_map(|(group, key, value)| {
                Mutation::PutMeta {
                    group,
                    key: meta_key(key).unwrap(),
                    value,
                }
            }),
            (group.clone(), any::<(i64, u64, i64, i64, u32)>()).prop_map(|(group, r)| {
                Mutation::PutIndex {
                    group,
                    row: IndexRow {
                        first_sequence: r.0,
                        log_index: r.1,
                        first_offset: r.2,
                        enqueued_time_ms: r.3,
                        event_count: r.4,
                    },
                }
            }),
            (group.clone(), any::<i64>()).prop_map(|(group, from_sequence)| {
                Mutation::TruncateIndexFrom {
                    group,
                    from_sequence,
                }
            }),
            (group.clone(), any::<i64>()).prop_map(|(group, before_sequence)| {
                Mutation::TruncateIndexBefore {
                    group,
                    before_sequence,
                }
            }),
            group
                .clone()
                .prop_map(|group| Mutation::DeleteGroup { group }),
            (group, any::<u64>())
                .prop_map(|(group, through)| Mutation::InstallStaged { group, through }),
            ("[a-z/]{0,12}", bytes).prop_map(|(key, value)| Mutation::PutCatalog { key, value }),
            "[a-z/]{0,12}".prop_map(|key| Mutation::DeleteCatalog { key }),
        ]
    }

    fn same(a: &[Replayed], b: &[Vec<Mutation>]) -> bool {
        let a: Vec<&Vec<Mutation>> = a.iter().map(|r| &r.mutations).collect();
        format!("{a:?}") == format!("{:?}", b.iter().collect::<Vec<_>>())
    }

    fn entries(batch: &[Mutation]) -> Vec<Bytes> {
        batch
            .iter()
            .filter_map(|m| match m {
                Mutation::PutLog { entry, .. } => Some(entry.clone()),
                _ => None,
            })
            .collect()
    }

    fn segment_files(dir: &Path) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        files.sort();
        files
    }

    proptest! {
        /// Whatever was appended reads back (with every entry's location holding its
        /// bytes), across segments however small, and a log cut anywhere in its newest
        /// segment (a torn write at a crash) reads back as a prefix of whole batches.
        #[test]
        fn records_read_back_across_segments_and_a_torn_tail_leaves_a_prefix(
            batches in proptest::collection::vec(proptest::collection::vec(mutation(), 0..6), 0..8),
            segment_bytes_max in 64u64..2048,
            cut in any::<prop::sample::Index>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let log = dir.path().join("log");
            let (mut wal, replay) = Wal::open(&log, Position::default(), segment_bytes_max).unwrap();
            prop_assert!(replay.is_empty());
            let start = wal.position();
            for batch in &batches {
                let locations = wal.append(batch.iter()).unwrap();
                let read: Vec<Bytes> = locations
                    .iter()
                    .map(|l| wal.segments().read(*l).unwrap())
                    .collect();
                prop_assert_eq!(read, entries(batch));
            }
            wal.sync().unwrap();
            drop(wal);
            let (wal, replay) = Wal::open(&log, start, segment_bytes_max).unwrap();
            prop_assert!(same(&replay, &batches));
            for (replayed, batch) in replay.iter().zip(&batches) {
                let read: Vec<Bytes> = replayed
                    .locations
                    .iter()
                    .map(|l| wal.segments().read(*l).unwrap())
                    .collect();
                prop_assert_eq!(read, entries(batch));
            }
            // Replaying from where the reopened log appends finds nothing.
            let end = wal.position();
            drop(wal);
            let (_, replay) = Wal::open(&log, end, segment_bytes_max).unwrap();
            prop_assert!(replay.is_empty());

            // Cut the newest segment holding records (the reopenings added empty ones).
            let files = segment_files(&log);
            let newest = files
                .iter()
                .rev()
                .find(|f| std::fs::metadata(f).unwrap().len() > HEADER_BYTES)
                .cloned();
            if let Some(newest) = newest {
                let contents = std::fs::read(&newest).unwrap();
                let cut = HEADER_BYTES as usize
                    + cut.index(contents.len() - HEADER_BYTES as usize + 1);
                std::fs::write(&newest, &contents[..cut]).unwrap();
            }
            let (_, replay) = Wal::open(&log, start, segment_bytes_max).unwrap();
            prop_assert!(replay.len() <= batches.len());
            prop_assert!(same(&replay, &batches[..replay.len()]));
        }
    }

    /// A record as one buffer holds it: the layout every record has, however it is written.
    fn one_buffer_record(batch: &[Mutation]) -> Vec<u8> {
        let mut payload = (batch.len() as u32).to_le_bytes().to_vec();
        for mutation in batch {
            encode(mutation, &mut payload);
        }
        let mut record = (payload.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        record
    }

    /// Entries of 4 KiB or more are written from where they lie, and records over 1 MiB in
    /// pieces with their header last: the segment holds every record byte for byte as one
    /// buffer would have, each entry reads back from its location, and a large record whose
    /// header never reached the disk (a crash before its last write) ends replay there.
    #[test]
    fn records_written_from_their_entries_and_in_pieces_match_one_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let (mut wal, _) = Wal::open(&log, Position::default(), 64 << 20).unwrap();
        let start = wal.position();
        let group = GroupId::from_u64(7);
        let put = |index: u64, len: usize| Mutation::PutLog {
            group,
            index,
            entry: Bytes::from(
                (0..len)
                    .map(|i| (i as u64 * 31 + index) as u8)
                    .collect::<Vec<_>>(),
            ),
        };
        let meta = Mutation::PutMeta {
            group,
            key: MetaKey::Committed,
            value: Bytes::from_static(b"meta"),
        };
        let batches: Vec<Vec<Mutation>> = vec![
            // Small entries only: copied into the buffer.
            vec![put(1, 10), put(2, ENTRY_INLINE_MAX - 1)],
            // From where they lie, between copied writes.
            vec![
                put(3, ENTRY_INLINE_MAX),
                meta.clone(),
                put(4, 65_536),
                put(5, 0),
            ],
            // Over STREAM_PIECE_BYTES: written in pieces, the header last.
            (6..30)
                .map(|i| put(i, 65_536 + i as usize))
                .chain([meta])
                .collect(),
            // One entry larger than a piece.
            vec![put(30, 3 * STREAM_PIECE_BYTES + 5), put(31, 17)],
        ];
        let mut records = Vec::new();
        for batch in &batches {
            let at = wal.position().offset;
            let locations = wal.append(batch.iter()).unwrap();
            let read: Vec<Bytes> = locations
                .iter()
                .map(|l| wal.segments().read(*l).unwrap())
                .collect();
            assert_eq!(read, entries(batch));
            records.push((at, wal.position().offset));
        }
        wal.sync().unwrap();
        drop(wal);
        let path = segment_path(&log, start.segment);
        let contents = std::fs::read(&path).unwrap();
        for ((at, end), batch) in records.iter().zip(&batches) {
            assert!(
                contents[*at as usize..*end as usize] == one_buffer_record(batch),
                "the record at {at} differs from the one-buffer layout"
            );
        }
        let (_, replay) = Wal::open(&log, start, 64 << 20).unwrap();
        assert!(same(&replay, &batches), "every record replays");

        // The third record (written in pieces) without its header: replay ends before it.
        let mut contents = contents;
        let (at, _) = records[2];
        contents[at as usize..at as usize + RECORD_HEADER_BYTES].fill(0);
        std::fs::write(&path, &contents).unwrap();
        let (_, replay) = Wal::open(&log, start, 64 << 20).unwrap();
        assert!(
            same(&replay, &batches[..2]),
            "replay stops at the headerless record"
        );
    }

    /// A temporary directory on a disk-backed filesystem, or None (saying the test skipped,
    /// and why: `on_tmpfs`) when it is on tmpfs.
    fn on_disk_dir(on_tmpfs: &str) -> Option<tempfile::TempDir> {
        let dir = tempfile::tempdir().unwrap();
        if in_memory(dir.path()) {
            eprintln!("skipped: the temporary directory is on tmpfs, where {on_tmpfs}");
            return None;
        }
        Some(dir)
    }

    /// Appends write into space the segment already reserved, so their fsyncs flush data
    /// only; a log left with its reserved tail (a crash, or a stop) replays every record,
    /// and the segment is cut back to them.
    #[test]
    fn appends_fill_reserved_space_and_a_reserved_tail_replays_every_record() {
        let Some(dir) = on_disk_dir("nothing is reserved") else {
            return;
        };
        let log = dir.path().join("log");
        let (mut wal, _) = Wal::open(&log, Position::default(), 64 << 20).unwrap();
        let start = wal.position();
        let path = segment_path(&log, start.segment);
        let batch = |index| {
            vec![Mutation::PutLog {
                group: GroupId::from_u64(1),
                index,
                entry: Bytes::from(vec![index as u8; 1000]),
            }]
        };
        wal.append(batch(1).iter()).unwrap();
        let reserved = std::fs::metadata(&path).unwrap().len();
        assert!(
            reserved >= PREALLOCATE_BYTES,
            "the first append reserves {PREALLOCATE_BYTES} bytes ahead, the file has {reserved}"
        );
        for index in 2..=100 {
            wal.append(batch(index).iter()).unwrap();
            wal.sync().unwrap();
        }
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            reserved,
            "appends within the reserved space do not grow the file"
        );
        let end = wal.position().offset;
        drop(wal);
        let (_, replay) = Wal::open(&log, start, 64 << 20).unwrap();
        let expected: Vec<Vec<Mutation>> = (1..=100).map(batch).collect();
        assert!(same(&replay, &expected), "every record replays");
        assert_eq!(std::fs::metadata(&path).unwrap().len(), end);
    }

    /// A record that reaches past the written blocks writes zeros ahead of itself (within
    /// the reserved space), so the records after it land in written blocks: at least
    /// ZERO_AHEAD_BYTES, more after a larger record, none after one of 256 KiB or more.
    /// Nothing written ahead covers a record: every one replays.
    #[test]
    fn records_write_zeros_ahead_and_every_record_still_replays() {
        let Some(dir) = on_disk_dir("nothing is reserved") else {
            return;
        };
        let log = dir.path().join("log");
        let (mut wal, _) = Wal::open(&log, Position::default(), 64 << 20).unwrap();
        let start = wal.position();
        let path = segment_path(&log, start.segment);
        let batch = |index: u64, len: usize| {
            vec![Mutation::PutLog {
                group: GroupId::from_u64(1),
                index,
                entry: Bytes::from(vec![index as u8; len]),
            }]
        };
        let mut expected = Vec::new();
        let mut zeroings = 0;
        for index in 1..=1200 {
            let before = wal.written;
            let records = batch(index, 1000);
            wal.append(records.iter()).unwrap();
            expected.push(records);
            let end = wal.position().offset;
            if end > before {
                zeroings += 1;
                assert_eq!(
                    wal.written,
                    end + ZERO_AHEAD_BYTES as u64,
                    "record {index} reached past the written blocks: zeros follow it"
                );
            } else {
                assert_eq!(
                    wal.written, before,
                    "record {index} fell within written blocks"
                );
            }
        }
        assert!(
            zeroings >= 2,
            "1.2 MB of records crossed several zeroed windows, counted {zeroings}"
        );
        let contents = std::fs::read(&path).unwrap();
        let end = wal.position().offset as usize;
        assert!(
            contents[end..wal.written as usize].iter().all(|b| *b == 0),
            "zeros ahead of the last record"
        );
        // A larger record past the written blocks writes zeros for several of its size.
        let mut past_the_written = |wal: &mut Wal, len: usize| {
            while wal.written - wal.position().offset >= len as u64 {
                let filler = batch(expected.len() as u64 + 1, 1000);
                wal.append(filler.iter()).unwrap();
                expected.push(filler);
            }
            let record = batch(expected.len() as u64 + 1, len);
            let at = wal.position().offset;
            wal.append(record.iter()).unwrap();
            expected.push(record);
            (at, wal.position().offset)
        };
        let (at, end) = past_the_written(&mut wal, 200 * 1024);
        assert_eq!(
            wal.written,
            end + ZERO_AHEAD_RECORDS * (end - at),
            "zeros for {ZERO_AHEAD_RECORDS} records of its size after a large record"
        );
        // A record of ZERO_AHEAD_RECORD_MAX or more writes none: its own bytes dwarf the
        // conversion, and zeros for four more of its size would nearly double the writes.
        let (_, end) = past_the_written(&mut wal, ZERO_AHEAD_RECORD_MAX as usize);
        assert_eq!(wal.written, end, "no zeros after a record of 256 KiB");
        wal.sync().unwrap();
        drop(wal);
        let (_, replay) = Wal::open(&log, start, 64 << 20).unwrap();
        assert!(same(&replay, &expected), "every record replays");
    }

    /// After each fsync the log lets go of its cached pages more than CACHED_BEHIND_BYTES
    /// behind the newest record, in steps, the segment before the active one included once
    /// the window has moved past its end; every record still reads back.
    #[test]
    fn pages_more_than_the_cached_window_behind_the_newest_record_are_let_go() {
        let Some(dir) = on_disk_dir("pages are the data") else {
            return;
        };
        let log = dir.path().join("log");
        let segment_bytes_max = 80 << 20;
        let (mut wal, _) = Wal::open(&log, Position::default(), segment_bytes_max).unwrap();
        let start = wal.position();
        let record = |index: u64| {
            vec![Mutation::PutLog {
                group: GroupId::from_u64(1),
                index,
                entry: Bytes::from(vec![index as u8; 1 << 20]),
            }]
        };
        let mut expected = Vec::new();
        let mut index = 0;
        let mut append = |wal: &mut Wal| {
            index += 1;
            let batch = record(index);
            wal.append(batch.iter()).unwrap();
            wal.sync().unwrap();
            expected.push(batch);
        };
        // The first segment: nothing within the window is let go, what is behind it is in
        // steps.
        while wal.position().segment == start.segment {
            append(&mut wal);
            if wal.position().segment != start.segment {
                break;
            }
            let due = wal.position().offset.saturating_sub(CACHED_BEHIND_BYTES);
            assert!(wal.uncached <= due, "pages within the window stay cached");
            assert!(
                due - wal.uncached < UNCACHE_STEP_BYTES,
                "pages behind the window are let go at the next step: {} of {due}",
                wal.uncached
            );
        }
        assert_eq!(wal.uncached, 0, "the new segment has let go of nothing yet");
        let (_, from, len) = wal
            .previous
            .clone()
            .expect("the closed segment is followed");
        assert!(
            from > 0 && from < len,
            "let go of its start only, {from} of {len}"
        );
        // The next: the window moves past the closed segment's end, which is let go.
        while wal.previous.is_some() {
            let end = wal.position().offset;
            assert!(
                end < CACHED_BEHIND_BYTES,
                "the closed segment was let go by then"
            );
            append(&mut wal);
        }
        drop(wal);
        let (_, replay) = Wal::open(&log, start, segment_bytes_max).unwrap();
        assert!(same(&replay, &expected), "every record reads back");
    }

    #[test]
    fn a_corrupt_record_ends_the_replay_and_what_follows_is_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let (mut wal, _) = Wal::open(&log, Position::default(), 1 << 20).unwrap();
        let start = wal.position();
        let put = |index| Mutation::PutLog {
            group: GroupId::from_u64(1),
            index,
            entry: Bytes::from_static(b"entry"),
        };
        wal.append([put(1)].iter()).unwrap();
        let second_at = wal.position().offset;
        wal.append([put(2)].iter()).unwrap();
        wal.append([put(3)].iter()).unwrap();
        wal.sync().unwrap();
        let path = segment_path(&log, start.segment);
        drop(wal);
        let mut contents = std::fs::read(&path).unwrap();
        let flip = second_at as usize + RECORD_HEADER_BYTES + 3;
        contents[flip] ^= 0xff;
        std::fs::write(&path, &contents).unwrap();
        let (mut wal, replay) = Wal::open(&log, start, 1 << 20).unwrap();
        assert_eq!(replay.len(), 1, "only the record before the corrupt one");
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            second_at,
            "the corrupt record and what follows are cut off"
        );
        // The log goes on after what was kept.
        wal.append([put(2)].iter()).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let (_, replay) = Wal::open(&log, start, 1 << 20).unwrap();
        assert_eq!(replay.len(), 2);
    }

    /// Readers keep a bounded number of segments open, and still read from every one.
    #[test]
    fn entries_of_more_segments_than_may_be_open_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let (mut wal, _) = Wal::open(&log, Position::default(), 64).unwrap();
        let put = |index: u64| Mutation::PutLog {
            group: GroupId::from_u64(1),
            index,
            entry: Bytes::from(index.to_le_bytes().repeat(5)),
        };
        let count = OPEN_SEGMENTS_MAX as u64 * 2;
        let locations: Vec<Location> = (0..count)
            .map(|i| wal.append([put(i)].iter()).unwrap()[0])
            .collect();
        assert!(wal.segments().ids().len() as u64 > OPEN_SEGMENTS_MAX as u64);
        for round in 0..2 {
            for (i, location) in locations.iter().enumerate() {
                let bytes = wal.segments().read(*location).unwrap();
                assert_eq!(bytes, (i as u64).to_le_bytes().repeat(5), "round {round}");
            }
        }
        assert!(wal.segments().open.lock().unwrap().len() <= OPEN_SEGMENTS_MAX);
    }

    #[test]
    fn deleted_segments_are_gone_from_disk_and_from_reads() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        let (mut wal, _) = Wal::open(&log, Position::default(), 64).unwrap();
        let put = |index| Mutation::PutLog {
            group: GroupId::from_u64(1),
            index,
            entry: Bytes::from(vec![7u8; 40]),
        };
        let first = wal.append([put(1)].iter()).unwrap()[0];
        let second = wal.append([put(2)].iter()).unwrap()[0];
        assert!(
            second.segment > first.segment,
            "a record past the limit starts a segment"
        );
        wal.delete(first.segment).unwrap();
        assert!(!segment_path(&log, first.segment).exists());
        assert!(wal.segments().read(first).is_err());
        assert_eq!(wal.segments().read(second).unwrap(), vec![7u8; 40]);
    }
}
