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
