//! The shard's write-ahead log. Every batch of writes is appended here as one record (and
//! fsynced when it holds a durable write) before it is committed to redb *without* an
//! fsync; redb is made durable only at checkpoints, after which the log starts over.
//!
//! Why: a durable redb commit rewrites every B-tree page the batch touched (a leaf per
//! group per table, and their parents) and fsyncs them, about 60 scattered 4 KiB pages per
//! group commit with 16 busy partitions, whatever the event size; the log instead writes
//! the batch's bytes once, sequentially. A redb commit without fsync keeps its pages in
//! memory, so a checkpoint writes each page once however many commits changed it.
//!
//! File layout: a 16-byte header (`MAGIC`, then the generation as u64 little-endian) and
//! records `[u32 length][u32 CRC-32 of the payload][payload]`. The generation ties the log
//! to the checkpoint it follows: redb stores the generation of the log that holds the
//! writes after it; a log of an older generation is already contained in redb (the node
//! stopped between a checkpoint and the log's reset) and is ignored. Recovery replays the
//! records of the current generation up to the first incomplete or corrupt one: a prefix of
//! the batches, including every batch whose fsync completed.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use bytes::{Buf, BufMut, Bytes};
use tributary_types::GroupId;

use crate::error::StorageError;
use crate::mutation::{IndexRow, MetaKey, Mutation};

const MAGIC: &[u8; 8] = b"TRBWAL01";
const HEADER_BYTES: u64 = 16;
const RECORD_HEADER_BYTES: usize = 8;

/// The write-ahead log file of one shard.
pub(crate) struct Wal {
    file: File,
    path: PathBuf,
    /// Bytes in the file (header included): where the next record goes.
    len: u64,
    /// Records appended since the last reset.
    records: u64,
    buf: Vec<u8>,
}

impl Wal {
    /// Opens (or creates) the log at `path` and returns the batches to replay on top of
    /// redb, whose latest checkpoint is followed by the log of `generation`.
    pub(crate) fn open(
        path: &Path,
        generation: u64,
    ) -> Result<(Wal, Vec<Vec<Mutation>>), StorageError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)
            .map_err(|e| StorageError::Io(format!("cannot open {}: {e}", path.display())))?;
        let mut contents = Vec::new();
        file.read_to_end(&mut contents)
            .map_err(|e| StorageError::Io(format!("cannot read {}: {e}", path.display())))?;
        let batches = match parse_header(&contents) {
            Some(found) if found == generation => parse_records(&contents[HEADER_BYTES as usize..]),
            // Empty, torn while being reset, or an older log already contained in redb.
            _ => Vec::new(),
        };
        let wal = Wal {
            file,
            path: path.to_path_buf(),
            len: contents.len() as u64,
            records: 0,
            buf: Vec::new(),
        };
        Ok((wal, batches))
    }

    /// Appends one batch of writes as one record (not yet fsynced).
    pub(crate) fn append<'a>(
        &mut self,
        mutations: impl Iterator<Item = &'a Mutation>,
    ) -> Result<(), StorageError> {
        self.buf.clear();
        self.buf.extend_from_slice(&[0; RECORD_HEADER_BYTES]);
        let mut count = 0u32;
        let count_at = self.buf.len();
        self.buf.put_u32_le(0);
        for mutation in mutations {
            encode(mutation, &mut self.buf);
            count += 1;
        }
        self.buf[count_at..count_at + 4].copy_from_slice(&count.to_le_bytes());
        let payload_len = (self.buf.len() - RECORD_HEADER_BYTES) as u32;
        let crc = crc32fast::hash(&self.buf[RECORD_HEADER_BYTES..]);
        self.buf[0..4].copy_from_slice(&payload_len.to_le_bytes());
        self.buf[4..8].copy_from_slice(&crc.to_le_bytes());
        self.file
            .write_all_at(&self.buf, self.len)
            .map_err(|e| self.error("write", e))?;
        self.len += self.buf.len() as u64;
        self.records += 1;
        Ok(())
    }

    /// Makes every appended record durable.
    pub(crate) fn sync(&self) -> Result<(), StorageError> {
        self.file.sync_data().map_err(|e| self.error("fsync", e))
    }

    /// Starts the log over as `generation`, once redb holds everything in it durably.
    pub(crate) fn reset(&mut self, generation: u64) -> Result<(), StorageError> {
        self.file
            .set_len(0)
            .map_err(|e| self.error("truncate", e))?;
        let mut header = Vec::with_capacity(HEADER_BYTES as usize);
        header.extend_from_slice(MAGIC);
        header.put_u64_le(generation);
        self.file
            .write_all_at(&header, 0)
            .map_err(|e| self.error("write", e))?;
        self.sync()?;
        self.len = HEADER_BYTES;
        self.records = 0;
        Ok(())
    }

    /// Bytes of records since the last reset.
    pub(crate) fn bytes(&self) -> u64 {
        self.len.saturating_sub(HEADER_BYTES)
    }

    /// Records since the last reset.
    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    fn error(&self, what: &str, err: std::io::Error) -> StorageError {
        StorageError::Io(format!(
            "write-ahead log {}: {what} failed: {err}",
            self.path.display()
        ))
    }
}

fn parse_header(contents: &[u8]) -> Option<u64> {
    let header = contents.get(..HEADER_BYTES as usize)?;
    if &header[..8] != MAGIC {
        return None;
    }
    Some(u64::from_le_bytes(
        header[8..16].try_into().expect("8 bytes"),
    ))
}

/// The complete records at the start of `body`, decoded; stops at the first incomplete,
/// corrupt or undecodable one.
fn parse_records(mut body: &[u8]) -> Vec<Vec<Mutation>> {
    let mut batches = Vec::new();
    while body.len() >= RECORD_HEADER_BYTES {
        let len = u32::from_le_bytes(body[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(body[4..8].try_into().expect("4 bytes"));
        let Some(payload) = body.get(RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + len) else {
            break;
        };
        if crc32fast::hash(payload) != crc {
            break;
        }
        match decode_batch(payload) {
            Some(batch) => batches.push(batch),
            None => break,
        }
        body = &body[RECORD_HEADER_BYTES + len..];
    }
    batches
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.put_u32_le(bytes.len() as u32);
    out.extend_from_slice(bytes);
}

fn encode(mutation: &Mutation, out: &mut Vec<u8>) {
    match mutation {
        Mutation::PutLog {
            group,
            index,
            entry,
        } => {
            out.put_u8(1);
            out.put_u64_le(group.to_u64());
            out.put_u64_le(*index);
            put_bytes(out, entry);
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
        Mutation::DeleteGroup { group } => {
            out.put_u8(7);
            out.put_u64_le(group.to_u64());
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

fn decode_batch(payload: &[u8]) -> Option<Vec<Mutation>> {
    let mut r = Reader(payload);
    let count = r.u32()?;
    let mut batch = Vec::with_capacity(count.min(1 << 16) as usize);
    for _ in 0..count {
        let mutation = match r.u8()? {
            1 => Mutation::PutLog {
                group: r.group()?,
                index: r.u64()?,
                entry: r.bytes()?,
            },
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
            8 => Mutation::PutCatalog {
                key: r.string()?,
                value: r.bytes()?,
            },
            9 => Mutation::DeleteCatalog { key: r.string()? },
            _ => return None,
        };
        batch.push(mutation);
    }
    r.0.is_empty().then_some(batch)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

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
            (group.clone(), 1u8..=7, bytes.clone()).prop_map(|(group, key, value)| {
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
            group.prop_map(|group| Mutation::DeleteGroup { group }),
            ("[a-z/]{0,12}", bytes).prop_map(|(key, value)| Mutation::PutCatalog { key, value }),
            "[a-z/]{0,12}".prop_map(|key| Mutation::DeleteCatalog { key }),
        ]
    }

    fn same(a: &[Vec<Mutation>], b: &[Vec<Mutation>]) -> bool {
        format!("{a:?}") == format!("{b:?}")
    }

    proptest! {
        /// Whatever was appended reads back, and a log cut anywhere (a torn write at a
        /// crash) reads back as a prefix of whole batches.
        #[test]
        fn records_read_back_and_a_torn_tail_leaves_a_prefix(
            batches in proptest::collection::vec(proptest::collection::vec(mutation(), 0..6), 0..8),
            cut in any::<prop::sample::Index>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("shard.wal");
            let (mut wal, replay) = Wal::open(&path, 7).unwrap();
            prop_assert!(replay.is_empty());
            wal.reset(7).unwrap();
            for batch in &batches {
                wal.append(batch.iter()).unwrap();
            }
            wal.sync().unwrap();
            drop(wal);
            let (_, replay) = Wal::open(&path, 7).unwrap();
            prop_assert!(same(&replay, &batches));

            // Another generation's log is not replayed.
            let (_, replay) = Wal::open(&path, 8).unwrap();
            prop_assert!(replay.is_empty());

            let contents = std::fs::read(&path).unwrap();
            let cut = HEADER_BYTES as usize + cut.index(contents.len() - HEADER_BYTES as usize + 1);
            std::fs::write(&path, &contents[..cut]).unwrap();
            let (_, replay) = Wal::open(&path, 7).unwrap();
            prop_assert!(replay.len() <= batches.len());
            prop_assert!(same(&replay, &batches[..replay.len()]));
        }
    }

    #[test]
    fn a_corrupt_record_ends_the_replay() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("shard.wal");
        let (mut wal, _) = Wal::open(&path, 1).unwrap();
        wal.reset(1).unwrap();
        let put = |index| Mutation::PutLog {
            group: GroupId::from_u64(1),
            index,
            entry: Bytes::from_static(b"entry"),
        };
        wal.append([put(1)].iter()).unwrap();
        let second_at = wal.len;
        wal.append([put(2)].iter()).unwrap();
        wal.append([put(3)].iter()).unwrap();
        wal.sync().unwrap();
        drop(wal);
        let mut contents = std::fs::read(&path).unwrap();
        let flip = second_at as usize + RECORD_HEADER_BYTES + 3;
        contents[flip] ^= 0xff;
        std::fs::write(&path, &contents).unwrap();
        let (_, replay) = Wal::open(&path, 1).unwrap();
        assert_eq!(replay.len(), 1, "only the record before the corrupt one");
    }
}
