//! When a capture window closes, and what goes into its file: pure decisions over the
//! events pending at a partition's capture point.

use crate::partition::ReadEvent;
use crate::partition::codec::Property;

/// Counted for every event on top of its body, key and properties: about what the Avro
/// record adds (sequence number, offset, times and system property names). Also bounds how
/// many events a window holds, and so the memory its summary takes.
pub const EVENT_OVERHEAD_BYTES: u64 = 64;

/// What a window decision needs of a pending event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PendingEvent {
    pub sequence: i64,
    pub enqueued_time_ms: i64,
    /// The event's size as the size window counts it ([`event_bytes`]).
    pub bytes: u64,
}

impl PendingEvent {
    pub fn of(event: &ReadEvent) -> PendingEvent {
        PendingEvent {
            sequence: event.sequence,
            enqueued_time_ms: event.enqueued_time_ms,
            bytes: event_bytes(event),
        }
    }
}

/// A hub's capture windows and start, as a decision needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowRule {
    pub window_ms: u64,
    pub window_bytes: u64,
    /// Events enqueued before this are not captured.
    pub enabled_at_ms: i64,
}

/// What to do with the events pending at the capture point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowDecision {
    /// Nothing pending, or the window that starts at the first pending event is still open
    /// (its first event is younger than the time window and its events take fewer bytes
    /// than the size window): wait. An idle partition writes no files (Event Hubs' "skip
    /// empty archives"; Event Hubs writes empty files by default).
    Open,
    /// The first pending events were enqueued before capture was enabled: move the capture
    /// point to `next_sequence` without a file.
    Skip { next_sequence: i64 },
    /// The window is closed: its file holds the first `events` pending events, up to
    /// `next_sequence` (exclusive), and is named after `file_time_ms`.
    Closed {
        events: usize,
        next_sequence: i64,
        file_time_ms: i64,
    },
}

/// Decides the window that starts at the first of `pending` (the events from the capture
/// point on, in sequence order; it may stop early once a decision is possible). The window
/// takes the events enqueued before its first event's time plus `window_ms`, up to
/// `window_bytes` (at least one event); it closes when an event beyond it is pending, or its
/// time window has passed at `now_ms`.
///
/// The file's time is the first event's enqueued time, or one second after the last file's
/// when that is later, in whole seconds: file paths have one-second resolution, so windows
/// closed by size within one second still get distinct paths; and it depends only on the
/// committed progress and events, so every leader names a window's file alike.
pub fn decide(
    pending: &[PendingEvent],
    rule: &WindowRule,
    now_ms: i64,
    last_file_time_ms: Option<i64>,
) -> WindowDecision {
    let Some(first) = pending.first() else {
        return WindowDecision::Open;
    };
    if first.enqueued_time_ms < rule.enabled_at_ms {
        let next_sequence = pending
            .iter()
            .find(|e| e.enqueued_time_ms >= rule.enabled_at_ms)
            .map_or_else(
                || pending.last().expect("not empty").sequence + 1,
                |e| e.sequence,
            );
        return WindowDecision::Skip { next_sequence };
    }
    let window_end_ms = first
        .enqueued_time_ms
        .saturating_add(i64::try_from(rule.window_ms).unwrap_or(i64::MAX));
    let mut bytes = 0u64;
    let mut events = 0usize;
    let mut closed = window_end_ms <= now_ms;
    for event in pending {
        if event.enqueued_time_ms >= window_end_ms {
            closed = true;
            break;
        }
        if events > 0 && bytes + event.bytes > rule.window_bytes {
            closed = true;
            break;
        }
        bytes += event.bytes;
        events += 1;
        if bytes >= rule.window_bytes {
            closed = true;
            break;
        }
    }
    if !closed {
        return WindowDecision::Open;
    }
    WindowDecision::Closed {
        events,
        next_sequence: pending[events - 1].sequence + 1,
        file_time_ms: file_time_ms(first.enqueued_time_ms, last_file_time_ms),
    }
}

/// The time naming a window's file: its first event's enqueued time, or one second after
/// the last file's if that is later, truncated to whole seconds.
pub fn file_time_ms(first_enqueued_ms: i64, last_file_time_ms: Option<i64>) -> i64 {
    let earliest = last_file_time_ms.map_or(i64::MIN, |last| last.saturating_add(1000));
    let time = first_enqueued_ms.max(earliest);
    time - time.rem_euclid(1000)
}

/// An event's size as the size window counts it: body, partition key, property names and
/// values, and [`EVENT_OVERHEAD_BYTES`].
pub fn event_bytes(event: &ReadEvent) -> u64 {
    let record = &event.record;
    let key = record.partition_key.as_ref().map_or(0, String::len);
    let properties: usize = record
        .properties
        .iter()
        .map(|(name, value)| {
            name.len()
                + match value {
                    Property::String(s) => s.len(),
                    Property::Bytes(b) => b.len(),
                    Property::Bool(_) => 1,
                    Property::Int64(_) | Property::Double(_) | Property::TimestampMs(_) => 8,
                }
        })
        .sum();
    (record.body.len() + key + properties) as u64 + EVENT_OVERHEAD_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    const RULE: WindowRule = WindowRule {
        window_ms: 2000,
        window_bytes: 1000,
        enabled_at_ms: 0,
    };

    fn event(sequence: i64, enqueued_time_ms: i64, bytes: u64) -> PendingEvent {
        PendingEvent {
            sequence,
            enqueued_time_ms,
            bytes,
        }
    }

    #[test]
    fn nothing_pending_waits() {
        assert_eq!(decide(&[], &RULE, 1_000_000, None), WindowDecision::Open);
    }

    #[test]
    fn a_young_small_window_stays_open() {
        let pending = [event(0, 10_000, 100), event(1, 11_000, 100)];
        assert_eq!(decide(&pending, &RULE, 11_999, None), WindowDecision::Open);
    }

    #[test]
    fn the_time_window_closes_once_the_first_event_is_old_enough() {
        let pending = [event(5, 10_500, 100), event(6, 11_000, 100)];
        assert_eq!(
            decide(&pending, &RULE, 12_500, None),
            WindowDecision::Closed {
                events: 2,
                next_sequence: 7,
                file_time_ms: 10_000,
            }
        );
    }

    #[test]
    fn events_after_the_time_window_wait_for_the_next_file() {
        // Enqueued 2 s after the first: the window is closed (whatever the clock says) and
        // that event starts the next window.
        let pending = [
            event(0, 10_000, 10),
            event(1, 11_999, 10),
            event(2, 12_000, 10),
        ];
        assert_eq!(
            decide(&pending, &RULE, 0, None),
            WindowDecision::Closed {
                events: 2,
                next_sequence: 2,
                file_time_ms: 10_000,
            }
        );
    }

    #[test]
    fn the_size_window_closes_first_when_it_fills() {
        let pending = [
            event(0, 10_000, 400),
            event(1, 10_001, 400),
            event(2, 10_002, 400),
        ];
        // 800 bytes fit, the third would pass 1000: closed after two.
        assert_eq!(
            decide(&pending, &RULE, 10_002, None),
            WindowDecision::Closed {
                events: 2,
                next_sequence: 2,
                file_time_ms: 10_000,
            }
        );
        // Exactly full closes too, without waiting for another event.
        let full = [event(0, 10_000, 500), event(1, 10_001, 500)];
        assert_eq!(
            decide(&full, &RULE, 10_001, None),
            WindowDecision::Closed {
                events: 2,
                next_sequence: 2,
                file_time_ms: 10_000,
            }
        );
        // An event larger than the window still goes, alone.
        let huge = [event(0, 10_000, 5000), event(1, 10_001, 1)];
        assert_eq!(
            decide(&huge, &RULE, 10_001, None),
            WindowDecision::Closed {
                events: 1,
                next_sequence: 1,
                file_time_ms: 10_000,
            }
        );
    }

    #[test]
    fn gaps_left_by_compaction_stay_inside_the_window() {
        let pending = [event(3, 10_000, 10), event(9, 10_100, 10)];
        assert_eq!(
            decide(&pending, &RULE, 13_000, None),
            WindowDecision::Closed {
                events: 2,
                next_sequence: 10,
                file_time_ms: 10_000,
            }
        );
    }

    #[test]
    fn events_before_capture_was_enabled_are_skipped() {
        let rule = WindowRule {
            enabled_at_ms: 10_500,
            ..RULE
        };
        let pending = [
            event(0, 10_000, 10),
            event(1, 10_499, 10),
            event(2, 10_500, 10),
        ];
        assert_eq!(
            decide(&pending, &rule, 20_000, None),
            WindowDecision::Skip { next_sequence: 2 }
        );
        // All pending events are older: skip past the last.
        assert_eq!(
            decide(&pending[..2], &rule, 20_000, None),
            WindowDecision::Skip { next_sequence: 2 }
        );
        // From the first captured event on, windows as usual.
        assert_eq!(
            decide(&pending[2..], &rule, 20_000, None),
            WindowDecision::Closed {
                events: 1,
                next_sequence: 3,
                file_time_ms: 10_000,
            }
        );
    }

    #[test]
    fn file_times_are_whole_seconds_after_the_last_file() {
        assert_eq!(file_time_ms(12_345, None), 12_000);
        assert_eq!(file_time_ms(12_345, Some(5_000)), 12_000);
        // Two windows in the same second: the second file takes the next second.
        assert_eq!(file_time_ms(12_345, Some(12_000)), 13_000);
        assert_eq!(file_time_ms(12_999, Some(12_000)), 13_000);
        assert_eq!(file_time_ms(-1, None), -1000);
        let pending = [event(0, 12_100, 2000), event(1, 12_200, 2000)];
        assert_eq!(
            decide(&pending, &RULE, 12_200, Some(12_000)),
            WindowDecision::Closed {
                events: 1,
                next_sequence: 1,
                file_time_ms: 13_000,
            }
        );
    }

    /// Whatever the events, windows taken one after another cover every event once, in
    /// order, each file at a later whole second than the one before.
    #[test]
    fn successive_windows_cover_every_event_once() {
        let seed = std::env::var("TRIBUTARY_WINDOW_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x5eed_u64);
        println!("seed {seed} (TRIBUTARY_WINDOW_SEED replays it)");
        let mut random = seed;
        let mut next = move |bound: u64| {
            random ^= random << 13;
            random ^= random >> 7;
            random ^= random << 17;
            random % bound
        };
        for _ in 0..200 {
            let mut time = 1_000_000 + next(5000) as i64;
            let mut sequence = 0;
            let mut events = Vec::new();
            for _ in 0..next(60) + 1 {
                time += next(700) as i64;
                sequence += 1 + next(2) as i64;
                events.push(event(sequence, time, 1 + next(600)));
            }
            let now = time + 10_000;
            let mut covered = Vec::new();
            let mut last_file = None;
            let mut rest: &[PendingEvent] = &events;
            while !rest.is_empty() {
                match decide(rest, &RULE, now, last_file) {
                    WindowDecision::Closed {
                        events: count,
                        next_sequence,
                        file_time_ms,
                    } => {
                        assert!(count >= 1);
                        assert_eq!(next_sequence, rest[count - 1].sequence + 1);
                        assert!(last_file.is_none_or(|last| file_time_ms > last));
                        assert_eq!(file_time_ms % 1000, 0);
                        covered.extend_from_slice(&rest[..count]);
                        last_file = Some(file_time_ms);
                        rest = &rest[count..];
                    }
                    other => panic!("seed {seed}: {other:?} with every window past"),
                }
            }
            assert_eq!(covered, events, "seed {seed}");
        }
    }
}
