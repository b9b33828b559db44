//! Snapshots whose log stays in storage ([`SnapshotData::Stored`]), in bounded pieces: the
//! sender reads the retained log a piece at a time straight from its segment files, and
//! the receiver stages each piece in its own storage as it arrives, under the group's
//! staging key, so neither ever holds more than a piece or two, whatever the partition
//! holds. Nothing staged touches the replica until openraft installs the snapshot (one
//! write, `Mutation::InstallStaged`); a node that stops half way discards what it staged
//! when it opens its storage again.
//!
//! [`SnapshotData::Stored`]: crate::SnapshotData::Stored

use std::io;

use bytes::Bytes;
use tributary_storage::{Durability, LogPiece, Mutation, Shard, staging_group};
use tributary_types::GroupId;

use crate::types::StoredSnapshot;

/// Stored bytes of log entries in one piece, about: a sender and a receiver each hold a
/// piece or two at a time.
pub const SNAPSHOT_PIECE_BYTES: usize = 4 * 1024 * 1024;

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Reads a stored snapshot's log, entries `first_log..=last_log`, one piece at a time.
#[derive(Debug)]
pub struct PieceReader {
    stored: StoredSnapshot,
    last_log: u64,
    next: u64,
    from_sequence: i64,
}

impl PieceReader {
    pub fn new(stored: StoredSnapshot, last_log: u64) -> Self {
        Self {
            next: stored.first_log,
            stored,
            last_log,
            from_sequence: i64::MIN,
        }
    }

    /// The same reader, going on from entry `next` (the receiver holds the ones before).
    pub fn starting_at(mut self, next: u64) -> Self {
        self.next = next;
        self
    }

    /// The next piece, `None` after the last. An error when the entries it needs are gone:
    /// retention removed the start of the log after the snapshot was taken, so this one can
    /// no longer be sent whole (the next one starts later).
    pub fn next_piece(&mut self) -> io::Result<Option<LogPiece>> {
        if self.next > self.last_log {
            return Ok(None);
        }
        let group = self.stored.rows_of;
        let piece = self.stored.shard.log_piece(
            group,
            self.next,
            self.last_log + 1,
            self.from_sequence,
            SNAPSHOT_PIECE_BYTES,
        )?;
        if piece.entries.is_empty() || !contiguous(&piece, self.next) {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "the entries of {group} from {} on were removed (retention) while its \
                     snapshot was being sent; a newer one is needed",
                    self.next
                ),
            ));
        }
        self.next += piece.entries.len() as u64;
        if let Some(row) = piece.index.last() {
            self.from_sequence = row.first_sequence + 1;
        }
        Ok(Some(piece))
    }
}

/// Whether `piece`'s entries are consecutive from `first`.
fn contiguous(piece: &LogPiece, first: u64) -> bool {
    piece
        .entries
        .iter()
        .enumerate()
        .all(|(i, (index, _))| *index == first + i as u64)
}

/// Stages a snapshot being received in `shard`, piece by piece.
#[derive(Debug)]
pub struct Stager {
    shard: Shard,
    group: GroupId,
    state: Bytes,
    first_log: u64,
    last_log: u64,
    /// The entry expected next.
    next_log: u64,
    bytes: u64,
}

impl Stager {
    /// Starts staging a snapshot of `group` through entry `last_log` whose log starts at
    /// `first_log`; whatever an earlier transfer staged is discarded first.
    pub async fn begin(
        shard: Shard,
        group: GroupId,
        state: Bytes,
        first_log: u64,
        last_log: u64,
        bytes: u64,
    ) -> io::Result<Self> {
        if first_log > last_log.saturating_add(1) {
            return Err(invalid(format!(
                "a snapshot of {group} through entry {last_log} cannot start at entry {first_log}"
            )));
        }
        discard(&shard, group).await?;
        Ok(Self {
            shard,
            group,
            state,
            first_log,
            last_log,
            next_log: first_log,
            bytes,
        })
    }

    /// Stores the next piece (consecutive entries and their index rows).
    pub async fn piece(&mut self, piece: LogPiece) -> io::Result<()> {
        let (first, last) = match (piece.entries.first(), piece.entries.last()) {
            (Some(first), Some(last)) => (first.0, last.0),
            _ => {
                return Err(invalid(format!(
                    "an empty piece of the snapshot of {}",
                    self.group
                )));
            }
        };
        let rows_fit = piece
            .index
            .iter()
            .all(|row| (first..=last).contains(&row.log_index));
        if first != self.next_log || last > self.last_log || !contiguous(&piece, first) || !rows_fit
        {
            return Err(invalid(format!(
                "a piece of the snapshot of {} holds entries {first} to {last} where entry {} \
                 was expected next",
                self.group, self.next_log
            )));
        }
        let staging = staging_group(self.group);
        let mut mutations: Vec<Mutation> = piece
            .entries
            .into_iter()
            .map(|(index, entry)| Mutation::PutLog {
                group: staging,
                index,
                entry,
            })
            .collect();
        mutations.extend(piece.index.into_iter().map(|row| Mutation::PutIndex {
            group: staging,
            row,
        }));
        // Lazy: the install that makes it count is an immediate write after it.
        self.shard.write(mutations, Durability::Lazy).await?;
        self.next_log = last + 1;
        Ok(())
    }

    /// Whether this is staging the snapshot that starts at `first_log`, ends at `last_log`
    /// and carries `state`: a new transfer of it goes on from [`Stager::next_log`].
    pub fn continues(&self, first_log: u64, last_log: u64, state: &Bytes) -> bool {
        (self.first_log, self.last_log) == (first_log, last_log) && self.state == state
    }

    /// The entry expected next.
    pub fn next_log(&self) -> u64 {
        self.next_log
    }

    /// The shard it stages in.
    pub fn shard(&self) -> &Shard {
        &self.shard
    }

    /// The staged snapshot, once every piece through `last_log` is stored.
    pub fn finish(self, last_log: u64) -> io::Result<StoredSnapshot> {
        if last_log != self.last_log || self.next_log != last_log + 1 {
            return Err(invalid(format!(
                "the snapshot of {} through entry {last_log} ended with entry {} next",
                self.group, self.next_log
            )));
        }
        Ok(StoredSnapshot {
            state: self.state,
            shard: self.shard,
            rows_of: staging_group(self.group),
            first_log: self.first_log,
            bytes: self.bytes,
        })
    }
}

/// Deletes whatever is staged for `group` in `shard`.
pub async fn discard(shard: &Shard, group: GroupId) -> io::Result<()> {
    shard
        .write(
            vec![Mutation::DeleteGroup {
                group: staging_group(group),
            }],
            Durability::Lazy,
        )
        .await?;
    Ok(())
}

/// Copies a stored snapshot (through entry `last_log`) into `shard`'s staging area for
/// `group`, piece by piece, as the transport does between two nodes.
pub async fn stage_copy(
    stored: &StoredSnapshot,
    last_log: u64,
    shard: Shard,
    group: GroupId,
) -> io::Result<StoredSnapshot> {
    let mut reader = PieceReader::new(stored.clone(), last_log);
    let mut stager = Stager::begin(
        shard,
        group,
        stored.state.clone(),
        stored.first_log,
        last_log,
        stored.bytes,
    )
    .await?;
    while let Some(piece) = reader.next_piece()? {
        stager.piece(piece).await?;
    }
    stager.finish(last_log)
}

#[cfg(test)]
mod tests {
    use tributary_storage::{IndexRow, ShardConfig};
    use tributary_types::{HubId, PartitionId};

    use super::*;

    fn group() -> GroupId {
        GroupId::new(HubId(2), PartitionId(1), 0)
    }

    /// Entry `index`'s bytes: `size` bytes that name it.
    fn entry(index: u64, size: usize) -> Bytes {
        let mut bytes = format!("entry {index} ").into_bytes();
        bytes.resize(size, b'.');
        Bytes::from(bytes)
    }

    fn row(index: u64) -> IndexRow {
        IndexRow {
            first_sequence: index as i64 * 3,
            log_index: index,
            first_offset: index as i64 * 300,
            enqueued_time_ms: 1000 + index as i64,
            event_count: 3,
        }
    }

    /// A shard holding entries `1..=last` of `size` bytes; every entry but the multiples
    /// of 5 holds events (has an index row).
    async fn source(dir: &tempfile::TempDir, last: u64, size: usize) -> Shard {
        let shard = Shard::open(&dir.path().join("source.redb"), ShardConfig::default()).unwrap();
        for chunk in (1..=last).collect::<Vec<_>>().chunks(16) {
            let mut writes: Vec<Mutation> = chunk
                .iter()
                .map(|&index| Mutation::PutLog {
                    group: group(),
                    index,
                    entry: entry(index, size),
                })
                .collect();
            writes.extend(chunk.iter().filter(|&&index| index % 5 != 0).map(|&index| {
                Mutation::PutIndex {
                    group: group(),
                    row: row(index),
                }
            }));
            shard.write(writes, Durability::Immediate).await.unwrap();
        }
        shard
    }

    fn stored(shard: &Shard, first_log: u64, bytes: u64) -> StoredSnapshot {
        StoredSnapshot {
            state: Bytes::from_static(b"state"),
            shard: shard.clone(),
            rows_of: group(),
            first_log,
            bytes,
        }
    }

    /// A log of many pieces arrives whole and in order in the receiver's staging area, and
    /// nowhere else, each piece within the piece size.
    #[tokio::test]
    async fn a_snapshot_of_many_pieces_is_staged_exactly() {
        let dir = tempfile::tempdir().unwrap();
        // 1 MiB entries through 40, sent from 3 through 37: about 9 pieces.
        let size = 1024 * 1024;
        let shard = source(&dir, 40, size).await;
        let snapshot = stored(&shard, 3, 35 * size as u64);
        let mut reader = PieceReader::new(snapshot.clone(), 37);
        let mut pieces = 0;
        while let Some(piece) = reader.next_piece().unwrap() {
            assert!(
                piece.entry_bytes() <= SNAPSHOT_PIECE_BYTES,
                "{}",
                piece.entry_bytes()
            );
            pieces += 1;
        }
        assert!(pieces >= 8, "{pieces} pieces");

        let target = Shard::open(&dir.path().join("target.redb"), ShardConfig::default()).unwrap();
        let staged = stage_copy(&snapshot, 37, target.clone(), group())
            .await
            .unwrap();
        assert_eq!(staged.rows_of, staging_group(group()));
        assert_eq!((staged.first_log, staged.bytes), (3, 35 * size as u64));
        let staging = staging_group(group());
        let entries = target.log_entries(staging, 0, u64::MAX).unwrap();
        assert_eq!(entries, shard.log_entries(group(), 3, 38).unwrap());
        let rows: Vec<IndexRow> = target.index_rows(staging, u64::MAX).unwrap();
        let expected: Vec<IndexRow> = (3..=37).filter(|i| i % 5 != 0).map(row).collect();
        assert_eq!(rows, expected);
        // The replica itself has nothing until the snapshot is installed.
        assert!(target.log_entries(group(), 0, u64::MAX).unwrap().is_empty());
    }

    /// Retention removing the entries a transfer still has to send ends it with an error,
    /// never a log with a hole.
    #[tokio::test]
    async fn entries_removed_while_sending_end_the_transfer() {
        let dir = tempfile::tempdir().unwrap();
        let size = 1024 * 1024;
        let shard = source(&dir, 20, size).await;
        let mut reader = PieceReader::new(stored(&shard, 1, 20 * size as u64), 20);
        let first = reader.next_piece().unwrap().unwrap();
        let sent = first.entries.last().unwrap().0;
        shard
            .write(
                vec![Mutation::PurgeLogThrough {
                    group: group(),
                    through: sent + 2,
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        let err = reader.next_piece().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound);
        // A reader going on from a later entry (what a receiver holds) reads from there.
        let snapshot = stored(&shard, 1, 20 * size as u64);
        let mut resumed = PieceReader::new(snapshot, 20).starting_at(sent + 3);
        let piece = resumed.next_piece().unwrap().unwrap();
        assert_eq!(piece.entries[0].0, sent + 3);
        assert!(piece.index.iter().all(|row| row.log_index >= sent + 3));
        assert_eq!(piece.index[0], row(sent + 3));
        assert!(err.to_string().contains("removed (retention)"), "{err}");
    }

    /// A receiver refuses pieces that do not continue what it has: a gap, a repeat, entries
    /// past the snapshot's point, index rows of other entries; and a snapshot whose pieces
    /// stopped short is not finished.
    #[tokio::test]
    async fn pieces_that_do_not_follow_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default()).unwrap();
        let piece = |indexes: std::ops::RangeInclusive<u64>, rows: Vec<IndexRow>| LogPiece {
            entries: indexes.map(|i| (i, entry(i, 10))).collect(),
            index: rows,
        };
        let mut stager = Stager::begin(shard.clone(), group(), Bytes::new(), 5, 12, 80)
            .await
            .unwrap();
        stager.piece(piece(5..=7, vec![row(5)])).await.unwrap();
        for wrong in [
            piece(9..=10, vec![]),
            piece(7..=8, vec![]),
            piece(8..=13, vec![]),
            piece(8..=9, vec![row(4)]),
            LogPiece::default(),
        ] {
            let err = stager.piece(wrong).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        }
        stager.piece(piece(8..=11, vec![row(9)])).await.unwrap();
        // A new transfer of the same snapshot goes on from here; another one does not.
        assert!(stager.continues(5, 12, &Bytes::new()));
        assert!(!stager.continues(5, 13, &Bytes::new()));
        assert!(!stager.continues(5, 12, &Bytes::from_static(b"other state")));
        assert_eq!(stager.next_log(), 12);
        let err = stager.finish(12).unwrap_err();
        assert!(err.to_string().contains("entry 12 next"), "{err}");
        assert!(
            Stager::begin(shard, group(), Bytes::new(), 14, 12, 0)
                .await
                .is_err()
        );
    }

    /// A new transfer starts from nothing: what an abandoned one staged is discarded.
    #[tokio::test]
    async fn a_new_transfer_discards_what_an_earlier_one_staged() {
        let dir = tempfile::tempdir().unwrap();
        let size = 1000;
        let shard = source(&dir, 10, size).await;
        let target = Shard::open(&dir.path().join("target.redb"), ShardConfig::default()).unwrap();
        let mut abandoned = Stager::begin(target.clone(), group(), Bytes::new(), 1, 10, 0)
            .await
            .unwrap();
        abandoned
            .piece(LogPiece {
                entries: vec![(1, entry(99, 10)), (2, entry(98, 10))],
                index: vec![row(1)],
            })
            .await
            .unwrap();
        let staged = stage_copy(
            &stored(&shard, 4, 7 * size as u64),
            10,
            target.clone(),
            group(),
        )
        .await
        .unwrap();
        assert_eq!(staged.first_log, 4);
        let staging = staging_group(group());
        assert_eq!(
            target.log_entries(staging, 0, u64::MAX).unwrap(),
            shard.log_entries(group(), 4, 11).unwrap()
        );
        assert_eq!(target.index_rows(staging, u64::MAX).unwrap()[0], row(4));
    }
}
