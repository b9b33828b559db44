//! Retention: a replica removes whole entries from the front of its log once every event in
//! them is past the hub's retention (or the retained bytes exceed the hub's cap).
//!
//! The log is the data, so retention, Raft log purging and snapshots are one mechanism. A
//! replica removes entries only through a point that openraft has purged (so openraft never
//! reads them again) and that a snapshot covers (so a replica that needs them is sent the
//! snapshot, which carries the state at its point and the log still retained). To move
//! that point it asks openraft for a snapshot and a purge, then removes the log rows and
//! their index rows in one write, queued in the shard after the applied state that covers
//! them (a crash keeps both or neither). Each replica decides on its own clock; they agree
//! on the events' times, and a reader may still see an event just past retention (Event
//! Hubs promises at least the retention, not at most).
//!
//! Compaction (hubs whose cleanup policy compacts) runs in the same pass, on entries the
//! same way out of openraft's reach: their events are past the compaction lag, and
//! openraft has snapshotted and purged through them (so a rewritten entry is never applied
//! again, and a replica that needs it gets it in a snapshot, as it is). The rewritten
//! entries replace the old ones in one write; see [`super::compaction`] for what goes.

use std::time::Duration;

use openraft::RaftMetrics;
use tributary_storage::{Durability, Mutation};

use super::compaction::{self, CompactionPolicy};
use super::{Partition, PartitionError, storage};

/// A compacted partition is compacted again, even with nothing new past the lag, this
/// often (tombstones expire with time alone).
const COMPACTION_REPEAT_MS: i64 = 60_000;

/// How long one retention step waits for openraft to record a snapshot or purge the log.
const RAFT_STEP_WAIT: Duration = Duration::from_secs(5);

/// What a hub retains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Events older than this go (`None`: no time limit, as for a compact-only hub).
    pub retention_ms: Option<u64>,
    /// The oldest entries go while the retained ones take more bytes than this (`None`: no
    /// cap).
    pub bytes_max: Option<u64>,
    /// Compaction, for hubs whose cleanup policy compacts.
    pub compaction: Option<CompactionPolicy>,
    /// Events from this sequence number on are not captured yet: neither removed nor
    /// compacted away (`None`: capture is off).
    pub keep_from_sequence: Option<i64>,
}

/// Where compaction last ran on a replica: through which log index, at what time.
#[derive(Debug, Default, Clone, Copy)]
pub struct CompactionMark {
    pub through: u64,
    pub at_ms: i64,
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionOutcome {
    /// Nothing is past retention.
    Nothing,
    /// Entries through `through` were removed (if any: `through` is then at least the first
    /// index) and `compacted` entries were rewritten; the partition begins at `begin_sequence`.
    Cleaned {
        removed_through: Option<u64>,
        compacted: usize,
        begin_sequence: i64,
    },
    /// Entries are past retention but openraft has not purged them yet; a later pass goes on.
    Waiting,
}

impl Partition {
    /// Removes the entries past `policy` at time `now_ms`, and compacts (see the module
    /// documentation).
    pub async fn enforce_retention(
        &self,
        policy: RetentionPolicy,
        now_ms: i64,
    ) -> Result<RetentionOutcome, PartitionError> {
        let Some(first) = self.shard.first_index(self.group).map_err(storage)? else {
            return Ok(RetentionOutcome::Nothing);
        };
        let visible = *self.visible.borrow();
        let floor = self.keep_floor(policy.keep_from_sequence, visible)?;
        let remove_target = self
            .retention_target(policy, now_ms, first.log_index, floor)?
            .filter(|t| *t >= first.log_index);
        let compact_target = match policy.compaction {
            Some(compaction) => self
                .last_entry_at_or_before(now_ms.saturating_sub(compaction.lag_ms), floor)?
                .filter(|t| *t >= first.log_index)
                .filter(|t| {
                    let mark = *self.compaction_mark.lock().expect("compaction mark");
                    *t > mark.through || now_ms - mark.at_ms >= COMPACTION_REPEAT_MS
                }),
            None => None,
        };
        let Some(target) = remove_target.max(compact_target) else {
            return Ok(RetentionOutcome::Nothing);
        };
        let purged = self.purge_raft_log_through(target).await?;
        let mut removed_through = None;
        let mut begin_sequence = self.progress().begin_sequence;
        if let Some(cut) = remove_target.map(|t| t.min(purged))
            && cut >= first.log_index
        {
            begin_sequence = self.remove_through(cut, first.log_index).await?;
            removed_through = Some(cut);
        }
        let mut compacted = 0;
        if let (Some(compaction), Some(target)) = (policy.compaction, compact_target) {
            let through = target.min(purged);
            compacted = self.compact_through(through, &compaction, now_ms).await?;
            *self.compaction_mark.lock().expect("compaction mark") = CompactionMark {
                through,
                at_ms: now_ms,
            };
        }
        if removed_through.is_none() && compacted == 0 && purged < target {
            return Ok(RetentionOutcome::Waiting);
        }
        Ok(RetentionOutcome::Cleaned {
            removed_through,
            compacted,
            begin_sequence,
        })
    }

    /// The last log index whose entries may be removed or compacted: before the entry
    /// holding the first event not captured yet, and at most `visible`.
    fn keep_floor(
        &self,
        keep_from_sequence: Option<i64>,
        visible: u64,
    ) -> Result<u64, PartitionError> {
        let Some(keep) = keep_from_sequence else {
            return Ok(visible);
        };
        Ok(
            match self
                .shard
                .index_for_sequence(self.group, keep)
                .map_err(storage)?
            {
                // The entry holding `keep` (or, once it is past the last event, the last
                // entry, whose events are all below it).
                Some(row) if keep < row.first_sequence + i64::from(row.event_count) => {
                    row.log_index.saturating_sub(1).min(visible)
                }
                Some(_) => visible,
                None => 0,
            },
        )
    }

    /// The last log index before the first entry with an event enqueued after `time_ms`
    /// (every retained entry when there is none), at most `floor`.
    fn last_entry_at_or_before(
        &self,
        time_ms: i64,
        floor: u64,
    ) -> Result<Option<u64>, PartitionError> {
        let last = match self
            .shard
            .sequence_for_time(self.group, time_ms, false)
            .map_err(storage)?
        {
            Some(kept) => self
                .shard
                .index_for_sequence(self.group, kept)
                .map_err(storage)?
                .map(|row| row.log_index.saturating_sub(1)),
            None => Some(floor),
        };
        Ok(last.map(|l| l.min(floor)))
    }

    /// Asks openraft to snapshot and purge its log through `target`; returns the index it
    /// has purged through (perhaps less, if it is still replicating those entries).
    async fn purge_raft_log_through(&self, target: u64) -> Result<u64, PartitionError> {
        let index = |id: Option<tributary_raft::LogId>| id.map_or(0, |id| id.index);
        if index(self.raft_metrics().snapshot) < target {
            self.raft.trigger().snapshot().await.map_err(storage)?;
            let _ = self
                .raft
                .wait(Some(RAFT_STEP_WAIT))
                .metrics(|m| index(m.snapshot) >= target, "snapshot covers the cut")
                .await;
        }
        if index(self.raft_metrics().purged) < target {
            self.raft
                .trigger()
                .purge_log(target)
                .await
                .map_err(storage)?;
            let _ = self
                .raft
                .wait(Some(RAFT_STEP_WAIT))
                .metrics(|m| index(m.purged) >= target, "log purged through the cut")
                .await;
        }
        Ok(index(self.raft_metrics().purged))
    }

    /// Removes log entries `first..=cut` (all purged by openraft) and their index rows;
    /// returns the new begin sequence number.
    async fn remove_through(&self, cut: u64, first: u64) -> Result<i64, PartitionError> {
        // Read after `visible` (by the caller): progress covers at least what was visible,
        // and every index row it covers is readable.
        let progress = self.progress();
        let begin_sequence = self
            .shard
            .first_index_after(self.group, cut)
            .map_err(storage)?
            .map_or(progress.next_sequence, |row| row.first_sequence);
        // Readers move on first, then the rows go.
        self.progress_sender.send_modify(|p| {
            p.begin_sequence = p.begin_sequence.max(begin_sequence);
        });
        self.shard
            .write(
                vec![
                    Mutation::PurgeLogThrough {
                        group: self.group,
                        through: cut,
                    },
                    Mutation::TruncateIndexBefore {
                        group: self.group,
                        before_sequence: begin_sequence,
                    },
                ],
                Durability::Lazy,
            )
            .await
            .map_err(storage)?;
        metrics::counter!("tributary_retention_entries_removed_total").increment(cut + 1 - first);
        tracing::debug!(
            group = %self.group,
            through = cut,
            begin_sequence,
            "removed entries past retention"
        );
        Ok(begin_sequence)
    }

    /// Compacts the retained entries through log index `through` (all purged by openraft);
    /// returns how many entries were rewritten.
    async fn compact_through(
        &self,
        through: u64,
        policy: &CompactionPolicy,
        now_ms: i64,
    ) -> Result<usize, PartitionError> {
        let rows = self
            .shard
            .index_rows(self.group, through)
            .map_err(storage)?;
        let mut entries = Vec::with_capacity(rows.len());
        for row in rows {
            let Some(bytes) = self
                .shard
                .log_entry(self.group, row.log_index)
                .map_err(storage)?
            else {
                // Removed by retention since the rows were read.
                continue;
            };
            entries.push((row, bytes));
        }
        let rewrites = compaction::compact(&entries, policy, now_ms).map_err(storage)?;
        if rewrites.is_empty() {
            return Ok(0);
        }
        let count = rewrites.len();
        let mutations = rewrites
            .into_iter()
            .map(|(index, entry)| Mutation::PutLog {
                group: self.group,
                index,
                entry,
            })
            .collect();
        self.shard
            .write(mutations, Durability::Lazy)
            .await
            .map_err(storage)?;
        metrics::counter!("tributary_compaction_entries_rewritten_total").increment(count as u64);
        tracing::debug!(group = %self.group, through, rewritten = count, "compacted");
        Ok(count)
    }

    /// The last log index retention would remove (at most `floor`), if any.
    fn retention_target(
        &self,
        policy: RetentionPolicy,
        now_ms: i64,
        first_log_index: u64,
        floor: u64,
    ) -> Result<Option<u64>, PartitionError> {
        let mut target: Option<u64> = None;
        if let Some(retention_ms) = policy.retention_ms {
            let cutoff = now_ms.saturating_sub(retention_ms as i64);
            target = target.max(self.last_entry_at_or_before(cutoff, floor)?);
        }
        if let Some(bytes_max) = policy.bytes_max {
            let sizes = self.shard.log_sizes(self.group).map_err(storage)?;
            let mut kept: u64 = 0;
            // Walk back from the newest row; the first row that does not fit and all before
            // it go.
            let by_size = sizes.iter().rev().find_map(|(index, size)| {
                kept += size;
                (kept > bytes_max).then_some(*index)
            });
            target = target.max(by_size.map(|t| t.min(floor)));
        }
        Ok(target.filter(|t| *t >= first_log_index))
    }

    fn raft_metrics(&self) -> RaftMetrics<tributary_raft::TypeConfig> {
        use openraft::type_config::async_runtime::WatchReceiver;
        self.raft.metrics().borrow_watched().clone()
    }
}
