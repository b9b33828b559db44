//! Fetching: a one-shot read of committed events from a sequence number, for front ends
//! whose clients poll with offsets (Kafka's Fetch) rather than hold a reader. No reader is
//! registered (Event Hubs' reader rules are for consumer groups' readers), so it needs no
//! consumer group.

use std::time::Duration;

use tributary_types::Rights;

use super::Service;
use crate::auth::{Credential, Scope};
use crate::error::Error;
use crate::partition::ReadEvent;
use crate::partition::position::Position;

/// What to fetch.
#[derive(Debug, Clone)]
pub struct FetchRequest {
    pub hub: String,
    pub partition_id: String,
    /// The first sequence number wanted.
    pub from_sequence: i64,
    /// When set, from the first event enqueued at or after this time (milliseconds) instead
    /// of `from_sequence` (Kafka's ListOffsets by time).
    pub from_time_ms: Option<i64>,
    /// Events at most.
    pub max_events: usize,
    /// Body bytes at most, except that a first event is returned whatever its size.
    pub max_bytes: usize,
    /// How long to wait for an event when there is none yet.
    pub wait: Duration,
}

/// Events fetched, and the partition's bounds when they were read.
#[derive(Debug, Clone)]
pub struct FetchBatch {
    pub events: Vec<ReadEvent>,
    /// The first retained sequence number.
    pub begin_sequence: i64,
    /// The sequence number the next event will get (Kafka's high watermark: everything
    /// below is committed).
    pub next_sequence: i64,
}

impl FetchBatch {
    /// Whether the request's sequence number lies outside what the partition holds.
    pub fn out_of_range(&self, from_sequence: i64) -> bool {
        from_sequence < self.begin_sequence || from_sequence > self.next_sequence
    }
}

impl Service {
    /// Committed events from `from_sequence` (or `from_time_ms`) on, read on this node (its
    /// leader replica), waiting up to `wait` for one when there are none. Needs Listen on
    /// the hub.
    pub async fn fetch(
        &self,
        credential: &Credential,
        mut request: FetchRequest,
    ) -> Result<FetchBatch, Error> {
        self.check(credential, Scope::Hub(&request.hub), Rights::LISTEN)?;
        let hub = self.broker.hub(&request.hub)?;
        let index = self.broker.partition_index(&hub, &request.partition_id)?;
        let partition = self.broker.leader_partition(&hub, index).await?;
        if let Some(time_ms) = request.from_time_ms {
            request.from_sequence = partition
                .resolve(Position::EnqueuedTime {
                    time_ms,
                    inclusive: true,
                })
                .map_err(|err| self.broker.partition_error(err))?;
        }
        // What was acknowledged before this fetch is in it: a sender hears of its numbers a
        // moment before readers see its events, so wait until everything this replica has
        // applied is readable.
        partition.settled_progress().await;
        let mut progress = partition.subscribe();
        let deadline = tokio::time::Instant::now() + request.wait;
        loop {
            progress.mark_unchanged();
            let now = partition.progress();
            let mut batch = FetchBatch {
                events: Vec::new(),
                begin_sequence: now.begin_sequence,
                next_sequence: now.next_sequence,
            };
            if batch.out_of_range(request.from_sequence) {
                return Ok(batch);
            }
            let events = partition
                .read(request.from_sequence, request.max_events.max(1))
                .map_err(|err| self.broker.partition_error(err))?;
            let mut bytes = 0;
            for event in events {
                bytes += event.record.body.len();
                if !batch.events.is_empty() && bytes > request.max_bytes {
                    break;
                }
                batch.events.push(event);
            }
            if !batch.events.is_empty() {
                return Ok(batch);
            }
            tokio::select! {
                changed = progress.changed() => {
                    if changed.is_err() {
                        return Err(self.broker.partition_moved(&hub, index));
                    }
                }
                _ = tokio::time::sleep_until(deadline) => return Ok(batch),
                _ = partition.stopped() => return Err(self.broker.partition_moved(&hub, index)),
            }
        }
    }
}
