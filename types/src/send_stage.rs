//! Where a send's time goes: one latency histogram per stage of a send,
//! `tributary_send_stage_seconds{stage="..."}`, recorded by the crate that runs the stage.
//!
//! A send on the replica leading its partition passes five consecutive stages, which add up
//! to its time on the node (`total`):
//!
//! | stage | from | to | where |
//! | --- | --- | --- | --- |
//! | `front_end` | `Service::send` is entered (the front end has decoded the request) | the send reaches its partition (`Partition::append`): credential check, hub lookup, encoding the batch, routing, throughput admission | `broker/src/service/send.rs` |
//! | `appender_wait` | the send reaches its partition | its Raft entry is handed to openraft (`client_write_ff`): the partition's in-flight permit, the appender's queue, waiting while two entries are uncommitted, merging with other sends, waking a hibernating group | `broker/partition/src/appender.rs` |
//! | `commit` | the entry is handed to openraft | openraft reports it committed (the responder's commit notice) | `broker/partition/src/appender.rs` |
//! | `apply` | committed | openraft hands the partition state machine's result for the entry to its responder | `broker/partition/src/appender.rs` |
//! | `reply` | the entry's result reaches the appender | `Service::send` returns the send's numbers (the result split between the entry's sends and handed to each waiting send) | `broker/src/service/send.rs` |
//! | `total` | `Service::send` is entered | it returns | `broker/src/service/send.rs` |
//!
//! The five are recorded once per acknowledged send, on the leader. `commit` is made of work
//! that runs in parallel, recorded where it runs (one sample per write or message, not per
//! send):
//!
//! | stage | from | to | where |
//! | --- | --- | --- | --- |
//! | `leader_log_write` | the leader's log store is asked to append entries it proposed (`LogStore::append`) | the storage shard reports them durable (the flush callback) | `raft/src/log_store.rs`, on the leader |
//! | `replication` | the leader sends an AppendEntries carrying entries to a follower | its reply is decoded | `raft/src/network.rs`, on the leader |
//! | `follower_handle` | a follower has decoded such an AppendEntries | its reply is encoded (openraft answers once the entries are durable) | `raft/src/peer_service.rs`, on the follower |
//! | `follower_write` | the follower's log store is asked to append the leader's entries | the storage shard reports them durable | `raft/src/log_store.rs`, on the follower |
//!
//! Every log write (the leader's and the followers') goes through its node's storage shard,
//! whose writer thread commits the writes of all groups together; the shard's part of a
//! durable write is recorded in three more stages:
//!
//! | stage | from | to | where |
//! | --- | --- | --- | --- |
//! | `storage_queue` | a durable write is queued for the shard's writer | the writer starts the batch holding it | `storage/src/shard.rs` |
//! | `storage_log_write` | the writer starts a batch with durable writes | the batch is appended to the segment files and fsynced | `storage/src/shard.rs` |
//! | `storage_index_commit` | the batch is durable in the log | redb has committed its index rows (openraft's flush callbacks fire before this, the writes' other callbacks after) | `storage/src/shard.rs` |
//!
//! The controller's group is left out: only partitions' writes and messages are recorded.
//! What the client measures beyond `total` is the transport: the request and reply on the
//! wire, HTTP/2 and protobuf on both ends.
//!
//! Recording costs one `Instant::now()` per stage boundary and one histogram update: the
//! histogram handles are made once (at first use, so the node installs its metrics
//! recorder before it opens storage) and no label is built per call.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The histogram family every stage is recorded in, labelled `stage`.
pub const SEND_STAGE_METRIC: &str = "tributary_send_stage_seconds";

/// Bucket bounds of [`SEND_STAGE_METRIC`], in seconds: fine below a few milliseconds, where
/// a waiting producer's send spends its time.
pub const SEND_STAGE_BUCKETS_SECONDS: &[f64] = &[
    0.000_025, 0.000_05, 0.000_075, 0.000_1, 0.000_15, 0.000_2, 0.000_3, 0.000_4, 0.000_5, 0.000_6,
    0.000_8, 0.001, 0.001_25, 0.001_5, 0.002, 0.002_5, 0.003, 0.004, 0.005, 0.006, 0.008, 0.01,
    0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// One stage of a send (see the module's documentation for where each starts and ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendStage {
    FrontEnd,
    AppenderWait,
    Commit,
    LeaderLogWrite,
    Replication,
    FollowerHandle,
    FollowerWrite,
    Apply,
    Reply,
    Total,
    StorageQueue,
    StorageLogWrite,
    StorageIndexCommit,
}

const STAGE_COUNT: usize = 13;

impl SendStage {
    /// Every stage, in the order a send meets them (the storage stages last).
    pub const ALL: [SendStage; STAGE_COUNT] = [
        SendStage::FrontEnd,
        SendStage::AppenderWait,
        SendStage::Commit,
        SendStage::LeaderLogWrite,
        SendStage::Replication,
        SendStage::FollowerHandle,
        SendStage::FollowerWrite,
        SendStage::Apply,
        SendStage::Reply,
        SendStage::Total,
        SendStage::StorageQueue,
        SendStage::StorageLogWrite,
        SendStage::StorageIndexCommit,
    ];

    /// The value of the `stage` label.
    pub const fn name(self) -> &'static str {
        match self {
            SendStage::FrontEnd => "front_end",
            SendStage::AppenderWait => "appender_wait",
            SendStage::Commit => "commit",
            SendStage::LeaderLogWrite => "leader_log_write",
            SendStage::Replication => "replication",
            SendStage::FollowerHandle => "follower_handle",
            SendStage::FollowerWrite => "follower_write",
            SendStage::Apply => "apply",
            SendStage::Reply => "reply",
            SendStage::Total => "total",
            SendStage::StorageQueue => "storage_queue",
            SendStage::StorageLogWrite => "storage_log_write",
            SendStage::StorageIndexCommit => "storage_index_commit",
        }
    }

    /// The stage called `name`, if any.
    pub fn from_name(name: &str) -> Option<SendStage> {
        SendStage::ALL
            .into_iter()
            .find(|stage| stage.name() == name)
    }

    /// Whether the stage is one of the consecutive parts of a send on its leader, which add
    /// up to [`SendStage::Total`].
    pub const fn adds_up(self) -> bool {
        matches!(
            self,
            SendStage::FrontEnd
                | SendStage::AppenderWait
                | SendStage::Commit
                | SendStage::Apply
                | SendStage::Reply
        )
    }

    /// The stage this one runs inside of (in parallel with its siblings), if any.
    pub const fn within(self) -> Option<SendStage> {
        match self {
            SendStage::LeaderLogWrite | SendStage::Replication => Some(SendStage::Commit),
            SendStage::FollowerHandle => Some(SendStage::Replication),
            SendStage::FollowerWrite => Some(SendStage::FollowerHandle),
            _ => None,
        }
    }

    /// Records that the stage took `duration`.
    pub fn record(self, duration: Duration) {
        self.histogram().record(duration.as_secs_f64());
    }

    /// Records the stage from `start` to `end`.
    pub fn record_between(self, start: Instant, end: Instant) {
        self.record(end.saturating_duration_since(start));
    }

    /// Records the stage from `start` to now, and returns now (where the next stage starts).
    pub fn record_since(self, start: Instant) -> Instant {
        let now = Instant::now();
        self.record_between(start, now);
        now
    }

    fn histogram(self) -> &'static metrics::Histogram {
        static HISTOGRAMS: [OnceLock<metrics::Histogram>; STAGE_COUNT] =
            [const { OnceLock::new() }; STAGE_COUNT];
        HISTOGRAMS[self as usize]
            .get_or_init(|| metrics::histogram!(SEND_STAGE_METRIC, "stage" => self.name()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_has_its_own_name_and_slot() {
        for (slot, stage) in SendStage::ALL.into_iter().enumerate() {
            assert_eq!(stage as usize, slot, "ALL is in declaration order");
            assert_eq!(SendStage::from_name(stage.name()), Some(stage));
        }
        assert_eq!(SendStage::from_name("nope"), None);
    }

    #[test]
    fn the_parallel_stages_sit_inside_commit() {
        let mut stage = SendStage::FollowerWrite;
        while let Some(parent) = stage.within() {
            stage = parent;
        }
        assert_eq!(stage, SendStage::Commit);
        let adding: Vec<_> = SendStage::ALL
            .into_iter()
            .filter(|s| s.adds_up())
            .map(SendStage::name)
            .collect();
        assert_eq!(
            adding,
            ["front_end", "appender_wait", "commit", "apply", "reply"]
        );
    }

    #[test]
    fn buckets_rise() {
        assert!(SEND_STAGE_BUCKETS_SECONDS.windows(2).all(|w| w[0] < w[1]));
    }
}
