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

use std::time::Duration;

use openraft::RaftMetrics;
use tributary_storage::{Durability, Mutation};

use super::{Partition, PartitionError, storage};

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
}

/// What one retention pass did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetentionOutcome {
    /// Nothing is past retention.
    Nothing,
    /// Entries through `through` were removed; the partition now begins at `begin_sequence`.
    Removed { through: u64, begin_sequence: i64 },
    /// Entries are past retention but openraft has not purged them yet; a later pass goes on.
    Waiting,
}

impl Partition {
    /// Removes the entries past `policy` at time `now_ms` (see the module documentation).
    pub async fn enforce_retention(
        &self,
        policy: RetentionPolicy,
        now_ms: i64,
    ) -> Result<RetentionOutcome, PartitionError> {
        let Some(first) = self.shard.first_index(self.group).map_err(storage)? else {
            return Ok(RetentionOutcome::Nothing);
        };
        let visible = *self.visible.borrow();
        let Some(target) = self.retention_target(policy, now_ms, first.log_index, visible)? else {
            return Ok(RetentionOutcome::Nothing);
        };
        let metrics = self.raft_metrics();
        let index = |id: Option<tributary_raft::LogId>| id.map_or(0, |id| id.index);
        if index(metrics.snapshot) < target {
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
        let cut = target.min(index(self.raft_metrics().purged));
        if cut < first.log_index {
            return Ok(RetentionOutcome::Waiting);
        }
        // Read after `visible`: progress covers at least what was visible, and every index
        // row it covers is readable.
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
        metrics::counter!("tributary_retention_entries_removed_total")
            .increment(cut + 1 - first.log_index);
        tracing::debug!(
            group = %self.group,
            through = cut,
            begin_sequence,
            "removed entries past retention"
        );
        Ok(RetentionOutcome::Removed {
            through: cut,
            begin_sequence,
        })
    }

    /// The last log index retention would remove (at most `visible`), if any.
    fn retention_target(
        &self,
        policy: RetentionPolicy,
        now_ms: i64,
        first_log_index: u64,
        visible: u64,
    ) -> Result<Option<u64>, PartitionError> {
        let mut target: Option<u64> = None;
        if let Some(retention_ms) = policy.retention_ms {
            let cutoff = now_ms.saturating_sub(retention_ms as i64);
            // The first entry with an event after the cutoff is kept, and all after it.
            let by_time = match self
                .shard
                .sequence_for_time(self.group, cutoff, false)
                .map_err(storage)?
            {
                Some(kept) => self
                    .shard
                    .index_for_sequence(self.group, kept)
                    .map_err(storage)?
                    .map(|row| row.log_index.saturating_sub(1)),
                None => Some(visible),
            };
            target = target.max(by_time);
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
            target = target.max(by_size);
        }
        Ok(target
            .map(|t| t.min(visible))
            .filter(|t| *t >= first_log_index))
    }

    fn raft_metrics(&self) -> RaftMetrics<tributary_raft::TypeConfig> {
        use openraft::type_config::async_runtime::WatchReceiver;
        self.raft.metrics().borrow_watched().clone()
    }
}
