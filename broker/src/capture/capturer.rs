//! The node's capture task: every [`CAPTURE_INTERVAL`], each partition this node leads
//! whose hub captures writes its closed windows to files.
//!
//! Exactly once, across failovers: a window's events are fixed in the partition's own log
//! before its file is written. The leader proposes `CaptureWindow` (the sequence range and
//! the time naming the file), which applies only at the committed capture point with no
//! window claimed; once it has applied, the leader writes the file and proposes
//! `CaptureMark`, which moves the capture point past the window. A leader that finds a
//! claimed window (its predecessor died between claim and mark) writes that window again:
//! the same events, to the same path, replacing whatever the predecessor wrote. A deposed
//! leader's claim or mark that does not start at the committed point changes nothing, and a
//! deposed leader still writing writes only a committed window's events to its path.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tributary_raft::{CaptureRange, Proposal};
use tributary_types::{GroupId, HubId};

use crate::broker::Broker;
use crate::capture::window::{self, PendingEvent, WindowDecision, WindowRule};
use crate::capture::{CaptureError, Sink, encode_file, file_path};
use crate::partition::{Partition, PartitionError, ReadEvent};
use tributary_controller::state::{CaptureSettings, HubRecord};

/// How often the task looks for closed windows.
pub const CAPTURE_INTERVAL: Duration = Duration::from_millis(500);
/// Files one partition writes in one pass at most (more wait for the next pass, so one
/// partition catching up after an outage does not hold up the others for long).
pub const FILES_PER_PASS_MAX: usize = 16;
/// Events asked for per read (each read also stops at about 1 MiB of bodies).
const READ_EVENTS_MAX: usize = 4096;

/// Runs capture passes until the node shuts down.
pub async fn run(broker: Arc<Broker>) {
    let mut closing = broker.closing();
    let mut ticker = tokio::time::interval(CAPTURE_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut capturer = Capturer::new(broker);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = closing.wait_for(|c| *c) => return,
        }
        capturer.pass().await;
    }
}

/// Why a partition's capture stopped for this pass.
#[derive(Debug, thiserror::Error)]
enum StepError {
    #[error(transparent)]
    Partition(#[from] PartitionError),
    #[error(transparent)]
    Sink(#[from] CaptureError),
}

/// The capture task's state: open sinks and, per partition, what it has read of the window
/// being filled (so an open window is not read again on every pass).
pub struct Capturer {
    broker: Arc<Broker>,
    sinks: HashMap<HubId, Sink>,
    pending: HashMap<GroupId, Pending>,
}

/// Summaries of the events from a capture point on, as far as they have been read.
#[derive(Debug)]
struct Pending {
    /// The capture point they start at.
    from: i64,
    events: Vec<PendingEvent>,
    /// The sequence number to read from next.
    read_next: i64,
}

impl Capturer {
    pub fn new(broker: Arc<Broker>) -> Capturer {
        Capturer {
            broker,
            sinks: HashMap::new(),
            pending: HashMap::new(),
        }
    }

    /// One pass over every local partition of a capturing hub. Partitions go one at a
    /// time, so at most one window's events are in memory.
    pub async fn pass(&mut self) {
        let state = self.broker.runtime().state();
        let hubs: HashMap<HubId, &HubRecord> = state.hubs.values().map(|h| (h.id, h)).collect();
        let mut active = Vec::new();
        for partition in self.broker.local_partitions() {
            let Some(hub) = hubs.get(&partition.group.hub) else {
                continue;
            };
            let Some(capture) = &hub.settings.capture else {
                continue;
            };
            if !partition.is_leader() {
                continue;
            }
            active.push(partition.group);
            match self.capture_partition(&partition, hub, capture).await {
                Ok(()) => {}
                Err(StepError::Partition(
                    PartitionError::NotLeader { .. }
                    | PartitionError::NoLeader
                    | PartitionError::Closed,
                )) => {}
                Err(err) => {
                    metrics::counter!("tributary_capture_errors_total").increment(1);
                    tracing::warn!(
                        group = %partition.group,
                        error = %err,
                        "capture failed; trying again on the next pass"
                    );
                }
            }
        }
        self.pending.retain(|group, _| active.contains(group));
        self.sinks.retain(|hub, _| {
            hubs.get(hub)
                .is_some_and(|record| record.settings.capture.is_some())
        });
    }

    /// Writes `partition`'s closed windows, at most [`FILES_PER_PASS_MAX`].
    async fn capture_partition(
        &mut self,
        partition: &Partition,
        hub: &HubRecord,
        capture: &CaptureSettings,
    ) -> Result<(), StepError> {
        let rule = WindowRule {
            window_ms: capture.window_ms,
            window_bytes: capture.window_bytes,
            enabled_at_ms: capture.enabled_at_ms,
        };
        for _ in 0..FILES_PER_PASS_MAX {
            partition.ensure_caught_up().await?;
            let progress = partition.capture_progress();
            if let Some(range) = progress.claimed {
                // Claimed and not marked (by this leader before a failed write, or by a
                // predecessor): write exactly that window.
                self.write_window(partition, hub, capture, range).await?;
                if !self
                    .propose(partition, Proposal::CaptureMark(range))
                    .await?
                {
                    return Ok(());
                }
                continue;
            }
            let now_ms = self.broker.now_ms();
            let pending = self.read_pending(partition, progress.next_sequence, &rule)?;
            let decision =
                window::decide(&pending.events, &rule, now_ms, progress.last_file_time_ms);
            let from_sequence = progress.next_sequence;
            match decision {
                WindowDecision::Open => return Ok(()),
                WindowDecision::Skip { next_sequence } => {
                    let range = CaptureRange {
                        from_sequence,
                        next_sequence,
                        file_time_ms: progress.last_file_time_ms.unwrap_or(0),
                    };
                    if !self
                        .propose(partition, Proposal::CaptureMark(range))
                        .await?
                    {
                        return Ok(());
                    }
                }
                WindowDecision::Closed {
                    next_sequence,
                    file_time_ms,
                    ..
                } => {
                    let range = CaptureRange {
                        from_sequence,
                        next_sequence,
                        file_time_ms,
                    };
                    if !self
                        .propose(partition, Proposal::CaptureWindow(range))
                        .await?
                    {
                        return Ok(());
                    }
                    self.write_window(partition, hub, capture, range).await?;
                    if !self
                        .propose(partition, Proposal::CaptureMark(range))
                        .await?
                    {
                        return Ok(());
                    }
                }
            }
        }
        Ok(())
    }

    /// The events pending at the capture point `from`, read on from what earlier passes
    /// read until a window decision is possible or the partition's end.
    fn read_pending(
        &mut self,
        partition: &Partition,
        from: i64,
        rule: &WindowRule,
    ) -> Result<&Pending, StepError> {
        let pending = self
            .pending
            .entry(partition.group)
            .or_insert_with(|| Pending {
                from,
                events: Vec::new(),
                read_next: from,
            });
        if pending.from != from {
            // The capture point moved: keep what lies beyond it.
            pending.events.retain(|e| e.sequence >= from);
            pending.from = from;
            pending.read_next = pending.read_next.max(from);
        }
        // Whether the events read so far decide the window whatever the clock says: more
        // reading would not change the decision.
        let decided = |events: &[PendingEvent]| {
            !matches!(
                window::decide(events, rule, i64::MIN, None),
                WindowDecision::Open
            )
        };
        while !decided(&pending.events) {
            let events = partition.read(pending.read_next, READ_EVENTS_MAX)?;
            let Some(last) = events.last() else {
                break;
            };
            pending.read_next = last.sequence + 1;
            pending.events.extend(events.iter().map(PendingEvent::of));
        }
        Ok(pending)
    }

    /// Writes the file of `range` (its events as they are now) to the hub's destination.
    async fn write_window(
        &mut self,
        partition: &Partition,
        hub: &HubRecord,
        capture: &CaptureSettings,
        range: CaptureRange,
    ) -> Result<(), StepError> {
        let events = read_range(partition, range)?;
        let bytes = encode_file(&events)?;
        let path = file_path(
            &capture.namespace,
            &hub.name,
            &partition.group.partition.0.to_string(),
            range.file_time_ms,
        );
        let sink = self.sink(hub.id, capture)?;
        sink.put(&path, bytes).await?;
        metrics::counter!("tributary_capture_files_total").increment(1);
        metrics::counter!("tributary_capture_events_total").increment(events.len() as u64);
        tracing::debug!(
            group = %partition.group,
            %path,
            from = range.from_sequence,
            next = range.next_sequence,
            events = events.len(),
            "capture file written"
        );
        Ok(())
    }

    /// Proposes a claim or mark; whether it applied (it does not when the capture point
    /// moved meanwhile: then the pass for this partition ends).
    async fn propose(
        &mut self,
        partition: &Partition,
        proposal: Proposal,
    ) -> Result<bool, StepError> {
        let (applied, _next_sequence) = partition.propose_capture(proposal).await?;
        Ok(applied)
    }

    fn sink(&mut self, hub: HubId, capture: &CaptureSettings) -> Result<&Sink, CaptureError> {
        let stale = self
            .sinks
            .get(&hub)
            .is_none_or(|sink| *sink.destination() != capture.destination);
        if stale {
            self.sinks.insert(hub, Sink::open(&capture.destination)?);
        }
        Ok(self.sinks.get(&hub).expect("opened above"))
    }
}

/// The events of `range` that the partition holds (retention or compaction may have
/// removed some).
fn read_range(
    partition: &Partition,
    range: CaptureRange,
) -> Result<Vec<ReadEvent>, PartitionError> {
    let mut events = Vec::new();
    let mut next = range.from_sequence;
    while next < range.next_sequence {
        let read = partition.read(next, READ_EVENTS_MAX)?;
        let Some(last) = read.last() else {
            break;
        };
        next = last.sequence + 1;
        events.extend(
            read.into_iter()
                .filter(|e| e.sequence < range.next_sequence),
        );
    }
    Ok(events)
}
