//! Replica rebuilds (snapshots streamed from storage): the node's bandwidth budget that
//! every rebuild it sends or receives shares, and the progress of each one, for `/metrics`
//! and the cluster status.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tributary_types::GroupId;

/// The default of `--rebuild-bytes-per-second`: replicas are rebuilt at up to 100 MiB/s per
/// node, about a disk's sequential rate left to live traffic on a busy node (Redpanda's
/// recovery default is the same order).
pub const REBUILD_BYTES_PER_SECOND_DEFAULT: u64 = 100 * 1024 * 1024;

/// Which way a rebuild's bytes go from this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Direction {
    Send,
    Receive,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Direction::Send => "send",
            Direction::Receive => "receive",
        }
    }
}

/// How far one rebuild has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RebuildProgress {
    pub group: GroupId,
    pub direction: Direction,
    /// The member receiving (when sending) or the node sending (when receiving).
    pub peer: u64,
    pub bytes_done: u64,
    pub bytes_total: u64,
}

#[derive(Debug)]
struct Budget {
    /// 0: no limit.
    bytes_per_second: AtomicU64,
    /// When the bytes reserved so far have had their time: the next reservation starts
    /// there (or now, if that has passed).
    next_free: Mutex<Instant>,
}

/// The rebuilds of one node: their shared bandwidth budget and their progress. Cheap to
/// clone.
#[derive(Debug, Clone)]
pub struct Rebuilds {
    budget: Arc<Budget>,
    running: Arc<Mutex<HashMap<u64, RebuildProgress>>>,
    next_id: Arc<AtomicU64>,
}

impl Default for Rebuilds {
    fn default() -> Self {
        Self::new(REBUILD_BYTES_PER_SECOND_DEFAULT)
    }
}

impl Rebuilds {
    /// Rebuilds sharing `bytes_per_second` (0: unlimited).
    pub fn new(bytes_per_second: u64) -> Self {
        Self {
            budget: Arc::new(Budget {
                bytes_per_second: AtomicU64::new(bytes_per_second),
                next_free: Mutex::new(Instant::now()),
            }),
            running: Arc::new(Mutex::new(HashMap::new())),
            next_id: Arc::new(AtomicU64::new(0)),
        }
    }

    pub fn set_bytes_per_second(&self, bytes_per_second: u64) {
        self.budget
            .bytes_per_second
            .store(bytes_per_second, Ordering::Relaxed);
    }

    pub fn bytes_per_second(&self) -> u64 {
        self.budget.bytes_per_second.load(Ordering::Relaxed)
    }

    /// Waits until `bytes` more fit the node's budget. Every rebuild (sending and receiving)
    /// reserves its pieces' time one after another, so together they never go faster than
    /// the budget, and each gets a fair share of it.
    pub async fn take(&self, bytes: u64) {
        let rate = self.bytes_per_second();
        if rate == 0 {
            return;
        }
        let start = {
            let mut next_free = self.budget.next_free.lock().expect("budget lock");
            let start = (*next_free).max(Instant::now());
            *next_free = start + Duration::from_secs_f64(bytes as f64 / rate as f64);
            start
        };
        tokio::time::sleep_until(start).await;
    }

    /// Records a rebuild starting; its progress is reported until the returned handle is
    /// dropped.
    pub fn start(
        &self,
        group: GroupId,
        direction: Direction,
        peer: u64,
        bytes_total: u64,
    ) -> RebuildHandle {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.running.lock().expect("rebuilds lock").insert(
            id,
            RebuildProgress {
                group,
                direction,
                peer,
                bytes_done: 0,
                bytes_total,
            },
        );
        metrics::gauge!("tributary_rebuilds_in_progress", "direction" => direction.label())
            .increment(1.0);
        let handle = RebuildHandle {
            rebuilds: self.clone(),
            id,
            labels: [
                ("group", group.to_string()),
                ("peer", peer.to_string()),
                ("direction", direction.label().to_string()),
            ],
            direction,
        };
        metrics::gauge!("tributary_rebuild_size_bytes", &handle.labels).set(bytes_total as f64);
        metrics::gauge!("tributary_rebuild_progress_bytes", &handle.labels).set(0.0);
        handle
    }

    /// Every rebuild running now.
    pub fn running(&self) -> Vec<RebuildProgress> {
        let mut running: Vec<RebuildProgress> = self
            .running
            .lock()
            .expect("rebuilds lock")
            .values()
            .copied()
            .collect();
        running.sort_by_key(|p| (p.group, p.peer));
        running
    }

    /// The rebuild of `group` this node is receiving, if any.
    pub fn receiving(&self, group: GroupId) -> Option<RebuildProgress> {
        self.running()
            .into_iter()
            .find(|p| p.group == group && p.direction == Direction::Receive)
    }
}

/// One rebuild's progress report; dropping it ends the report.
#[derive(Debug)]
pub struct RebuildHandle {
    rebuilds: Rebuilds,
    id: u64,
    labels: [(&'static str, String); 3],
    direction: Direction,
}

impl RebuildHandle {
    /// Counts `bytes` more sent or received.
    pub fn add(&self, bytes: u64) {
        let done = {
            let mut running = self.rebuilds.running.lock().expect("rebuilds lock");
            let Some(progress) = running.get_mut(&self.id) else {
                return;
            };
            progress.bytes_done += bytes;
            progress.bytes_done
        };
        metrics::gauge!("tributary_rebuild_progress_bytes", &self.labels).set(done as f64);
        let total = match self.direction {
            Direction::Send => "tributary_rebuild_bytes_sent_total",
            Direction::Receive => "tributary_rebuild_bytes_received_total",
        };
        metrics::counter!(total).increment(bytes);
    }
}

impl Drop for RebuildHandle {
    fn drop(&mut self) {
        self.rebuilds
            .running
            .lock()
            .expect("rebuilds lock")
            .remove(&self.id);
        metrics::gauge!("tributary_rebuilds_in_progress", "direction" => self.direction.label())
            .decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> GroupId {
        GroupId::new(
            tributary_types::HubId(3),
            tributary_types::PartitionId(1),
            0,
        )
    }

    /// Two rebuilds taking from one budget together go no faster than it.
    #[tokio::test(start_paused = true)]
    async fn rebuilds_share_the_budget() {
        let rebuilds = Rebuilds::new(1000);
        let started = Instant::now();
        let take = |n| {
            let rebuilds = rebuilds.clone();
            async move {
                for _ in 0..n {
                    rebuilds.take(500).await;
                }
            }
        };
        // 20 pieces of 500 bytes at 1000 bytes/s: the last may start after 9.5 s.
        tokio::join!(take(10), take(10));
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(9500) && took < Duration::from_millis(10_500),
            "{took:?}"
        );
        // Unlimited: no wait at all.
        rebuilds.set_bytes_per_second(0);
        let started = Instant::now();
        take(100).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[test]
    fn progress_is_reported_until_the_rebuild_ends() {
        let rebuilds = Rebuilds::new(0);
        let handle = rebuilds.start(group(), Direction::Receive, 2, 1000);
        handle.add(300);
        handle.add(200);
        let progress = rebuilds
            .receiving(group())
            .expect("a rebuild being received");
        assert_eq!((progress.bytes_done, progress.bytes_total), (500, 1000));
        assert_eq!(progress.peer, 2);
        let sending = rebuilds.start(group(), Direction::Send, 7, 10);
        assert_eq!(rebuilds.running().len(), 2);
        drop(handle);
        assert_eq!(rebuilds.receiving(group()), None);
        drop(sending);
        assert!(rebuilds.running().is_empty());
    }
}
