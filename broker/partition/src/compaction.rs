//! Log compaction's decision: which stored events a compacted partition no longer holds,
//! and the rewritten entries that leave them out. Pure: the caller reads the entries,
//! supplies the time and stores what comes back.
//!
//! The rules (cleanup policy `Compact`; the key is the partition key):
//! - The *compactable range* is the events enqueued at or before `now − lag`. Enqueued
//!   times never decrease along the log, so it is a prefix of the log; the events after it
//!   are kept and supersede nothing.
//! - Within the range, of each partition key's events only the one with the highest
//!   sequence number is kept.
//! - A kept event with an empty body is a *tombstone*: it is removed too once its enqueued
//!   time is at or before `now − tombstone retention`.
//! - Events without a partition key are never removed.
//! - Entries that are not appends (blank, membership) are left alone. An append entry whose
//!   events are all removed stays, holding one hole, so its index row stays valid.
//!
//! Removed events leave holes ([`codec::compact_batch`]): the kept events keep their
//! sequence numbers, offsets and order, so each key's events stay in order and a reader
//! from the start still sees each key's final value. With the same policy the decision only
//! grows with `now` (an event removed at one time is removed at every later time), so
//! compacting a compacted log again at the same time removes nothing, and a later run,
//! seeing the earlier holes, removes exactly what a run over the whole log would.
//!
//! A rewritten entry must never be applied again: [`codec::frame_positions`] refuses a
//! batch with holes, since its length no longer gives the offsets that follow it. Whoever
//! runs compaction therefore rewrites only entries this replica has applied durably and
//! that no replica still needs to receive.

use std::collections::{HashMap, HashSet};

use bytes::Bytes;
use tributary_raft::openraft_api::EntryPayload;
use tributary_raft::{AppendBatch, Proposal, decode_entry, encode_entry};
use tributary_storage::IndexRow;

use super::codec::{self, CodecError};

/// How a compacted partition decides what goes. Both durations are at least zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionPolicy {
    /// How long an event stays untouched by compaction after it was enqueued.
    pub lag_ms: i64,
    /// How long a tombstone that is its key's latest event stays readable after it was
    /// enqueued.
    pub tombstone_retention_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error("log entry {log_index} cannot be decoded: {message}")]
    Entry { log_index: u64, message: String },
    #[error("the events of log entry {log_index}: {source}")]
    Events { log_index: u64, source: CodecError },
    #[error("log entry {log_index} does not match its index row: {message}")]
    Mismatch { log_index: u64, message: String },
}

/// Compacts a partition's log as of `now_ms` (see the module documentation for the rules).
/// `entries` are the partition's retained entries in log order, each with its index row
/// (not looked at for entries that are not appends) and its stored Raft entry bytes (as
/// [`tributary_raft::encode_entry`] writes them). Returns the entries that change, in log
/// order, with their log index: the same entry (log id, enqueued time, event count,
/// producer) re-encoded with the removed events replaced by holes.
pub fn compact(
    entries: &[(IndexRow, Bytes)],
    policy: &CompactionPolicy,
    now_ms: i64,
) -> Result<Vec<(u64, Bytes)>, CompactionError> {
    debug_assert!(policy.lag_ms >= 0 && policy.tombstone_retention_ms >= 0);
    let horizon_ms = now_ms.saturating_sub(policy.lag_ms);
    let tombstone_horizon_ms = now_ms.saturating_sub(policy.tombstone_retention_ms);
    let range = compactable(entries, horizon_ms)?;

    let mut latest: HashMap<&str, i64> = HashMap::new();
    for candidate in &range {
        for event in &candidate.events {
            if let Some(key) = &event.key {
                let sequence = candidate.row.first_sequence + i64::from(event.index);
                let kept = latest.entry(key).or_insert(sequence);
                *kept = (*kept).max(sequence);
            }
        }
    }
    let removes = |candidate: &Candidate, event: &KeyedEvent| {
        let Some(key) = &event.key else {
            return false;
        };
        let sequence = candidate.row.first_sequence + i64::from(event.index);
        sequence != latest[key.as_str()]
            || (event.tombstone && candidate.row.enqueued_time_ms <= tombstone_horizon_ms)
    };

    let mut rewrites = Vec::new();
    for candidate in &range {
        let removed: HashSet<u32> = candidate
            .events
            .iter()
            .filter(|event| removes(candidate, event))
            .map(|event| event.index)
            .collect();
        if removed.is_empty() {
            continue;
        }
        let log_index = candidate.row.log_index;
        let events =
            codec::compact_batch(&candidate.batch.events, |index| !removed.contains(&index))
                .map_err(|source| CompactionError::Events { log_index, source })?;
        let mut entry = candidate.entry.clone();
        // The entry keeps its kind (a Kafka producer's append stays one).
        entry.payload =
            EntryPayload::Normal(candidate.proposal.with_events(events).ok_or_else(|| {
                CompactionError::Mismatch {
                    log_index,
                    message: "not an append entry".to_string(),
                }
            })?);
        let bytes = encode_entry(&entry).map_err(|e| CompactionError::Entry {
            log_index,
            message: e.to_string(),
        })?;
        rewrites.push((log_index, bytes));
    }
    Ok(rewrites)
}

/// An append entry of the compactable range, with its events' keys.
struct Candidate {
    row: IndexRow,
    entry: tributary_raft::Entry,
    proposal: Proposal,
    batch: AppendBatch,
    events: Vec<KeyedEvent>,
}

/// What compaction needs to know of a stored event.
struct KeyedEvent {
    index: u32,
    key: Option<String>,
    tombstone: bool,
}

/// The append entries whose events were enqueued at or before `horizon_ms`: those before
/// the first append entry enqueued later.
fn compactable(
    entries: &[(IndexRow, Bytes)],
    horizon_ms: i64,
) -> Result<Vec<Candidate>, CompactionError> {
    let mut range = Vec::new();
    for (row, bytes) in entries {
        let entry = decode_entry(bytes).map_err(|e| CompactionError::Entry {
            log_index: row.log_index,
            message: e.to_string(),
        })?;
        let EntryPayload::Normal(proposal) = &entry.payload else {
            continue;
        };
        let Some(batch) = proposal.append_batch() else {
            continue;
        };
        let log_index = entry.log_id.index;
        if row.log_index != log_index {
            return Err(CompactionError::Mismatch {
                log_index,
                message: format!("the row is for log entry {}", row.log_index),
            });
        }
        if row.enqueued_time_ms > horizon_ms {
            break;
        }
        let decoded = codec::decode_batch(&batch.events)
            .map_err(|source| CompactionError::Events { log_index, source })?;
        if let Some(beyond) = decoded.iter().find(|e| e.index >= row.event_count) {
            return Err(CompactionError::Mismatch {
                log_index,
                message: format!(
                    "event {} of an entry of {} events",
                    beyond.index, row.event_count
                ),
            });
        }
        let events = decoded
            .into_iter()
            .map(|e| KeyedEvent {
                index: e.index,
                tombstone: e.record.body.is_empty(),
                key: e.record.partition_key,
            })
            .collect();
        let batch = batch.clone();
        let proposal = proposal.clone();
        range.push(Candidate {
            row: *row,
            entry,
            proposal,
            batch,
            events,
        });
    }
    Ok(range)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::prelude::*;
    use tributary_raft::openraft_api::testing::{RaftEntry, log_id, membership_ent};
    use tributary_raft::{Entry, ProducerStamp, TypeConfig};

    use super::*;
    use crate::codec::{EventRecord, Property, encode_batch, frame_positions};

    /// One generated event: its key (from a small set), body (empty: a tombstone) and
    /// whether it starts a new entry, enqueued `step_ms` after the previous one.
    #[derive(Debug, Clone)]
    struct Generated {
        key: Option<u8>,
        body: Vec<u8>,
        property: Option<i64>,
        new_entry: bool,
        step_ms: i64,
        /// A blank or membership entry follows this event's entry.
        other_after: bool,
    }

    /// An event as stored, numbered as the state machine numbers it.
    #[derive(Debug, Clone, PartialEq)]
    struct Stored {
        sequence: i64,
        offset: i64,
        time_ms: i64,
        record: EventRecord,
    }

    struct Log {
        entries: Vec<(IndexRow, Bytes)>,
        events: Vec<Stored>,
        last_time_ms: i64,
    }

    fn record(key: Option<&str>, body: &[u8], property: Option<i64>) -> EventRecord {
        EventRecord {
            partition_key: key.map(String::from),
            properties: property
                .map(|p| ("p".to_string(), Property::Int64(p)))
                .into_iter()
                .collect(),
            body: Bytes::copy_from_slice(body),
        }
    }

    /// Builds stored entries from `generated`, numbering the events the way the state
    /// machine does: consecutive sequence numbers, offsets the running byte total.
    fn build(generated: &[Generated], first_sequence: i64, first_offset: i64) -> Log {
        let mut groups: Vec<(i64, Vec<EventRecord>, bool)> = Vec::new();
        let mut time_ms = 1_000;
        for (i, g) in generated.iter().enumerate() {
            if i == 0 || g.new_entry {
                time_ms += g.step_ms;
                groups.push((time_ms, Vec::new(), false));
            }
            let key = g.key.map(|k| format!("key-{k}"));
            let last = groups.last_mut().expect("pushed above");
            last.1.push(record(key.as_deref(), &g.body, g.property));
            last.2 |= g.other_after;
        }
        let (mut sequence, mut offset, mut log_index) = (first_sequence, first_offset, 3);
        let mut log = Log {
            entries: Vec::new(),
            events: Vec::new(),
            last_time_ms: time_ms,
        };
        for (time_ms, records, other_after) in groups {
            let events = encode_batch(&records);
            let positions = frame_positions(&events).unwrap();
            let row = IndexRow {
                first_sequence: sequence,
                log_index,
                first_offset: offset,
                enqueued_time_ms: time_ms,
                event_count: records.len() as u32,
            };
            let entry = Entry::new_normal(
                log_id::<TypeConfig>(2, 1, log_index),
                Proposal::Append(AppendBatch {
                    enqueued_time_ms: time_ms,
                    event_count: records.len() as u32,
                    producer: (log_index % 2 == 0).then_some(ProducerStamp {
                        producer_id: 7,
                        sequence: log_index as i64,
                    }),
                    events: events.clone(),
                }),
            );
            log.entries.push((row, encode_entry(&entry).unwrap()));
            for (record, position) in records.into_iter().zip(positions) {
                log.events.push(Stored {
                    sequence,
                    offset: offset + position as i64,
                    time_ms,
                    record,
                });
                sequence += 1;
            }
            offset += events.len() as i64;
            log_index += 1;
            if other_after {
                // Not appends: no index row of their own, so a stand-in the compaction
                // must not look at.
                let other = if log_index % 2 == 0 {
                    Entry::new_blank(log_id::<TypeConfig>(2, 1, log_index))
                } else {
                    membership_ent::<TypeConfig>(2, 1, log_index, vec![[1u64].into()])
                };
                let stand_in = IndexRow {
                    first_sequence: 0,
                    log_index: 0,
                    first_offset: 0,
                    enqueued_time_ms: 0,
                    event_count: 0,
                };
                log.entries.push((stand_in, encode_entry(&other).unwrap()));
                log_index += 1;
            }
        }
        log
    }

    /// What a compacted log holds at `now_ms`, straight from the rules: keyless events and
    /// events after the range stay; in the range each key keeps its last event, unless that
    /// is a tombstone past its retention.
    fn model(events: &[Stored], policy: &CompactionPolicy, now_ms: i64) -> Vec<Stored> {
        let horizon_ms = now_ms - policy.lag_ms;
        let mut last: HashMap<&str, i64> = HashMap::new();
        for e in events.iter().filter(|e| e.time_ms <= horizon_ms) {
            if let Some(key) = &e.record.partition_key {
                last.insert(key, e.sequence);
            }
        }
        events
            .iter()
            .filter(|e| {
                let Some(key) = &e.record.partition_key else {
                    return true;
                };
                let expired =
                    e.record.body.is_empty() && e.time_ms <= now_ms - policy.tombstone_retention_ms;
                e.time_ms > horizon_ms || (last[key.as_str()] == e.sequence && !expired)
            })
            .cloned()
            .collect()
    }

    /// Stores `rewrites` over `log`'s entries, checking each is the same entry with fewer
    /// events, no longer than before.
    fn apply(log: &mut Log, rewrites: &[(u64, Bytes)]) {
        let mut previous = 0;
        for (index, bytes) in rewrites {
            assert!(*index > previous, "rewrites out of log order");
            previous = *index;
            let (row, stored) = log
                .entries
                .iter_mut()
                .find(|(row, _)| row.log_index == *index)
                .expect("a rewrite of an append entry of the log");
            let (before, after) = (decode_entry(stored).unwrap(), decode_entry(bytes).unwrap());
            assert_eq!(before.log_id, after.log_id);
            let (
                EntryPayload::Normal(Proposal::Append(old)),
                EntryPayload::Normal(Proposal::Append(new)),
            ) = (before.payload, after.payload)
            else {
                panic!("entry {index} rewritten as another kind");
            };
            assert_eq!(
                (old.enqueued_time_ms, old.event_count, old.producer),
                (new.enqueued_time_ms, new.event_count, new.producer)
            );
            assert!(new.events.len() <= old.events.len());
            assert_eq!(row.event_count, new.event_count);
            *stored = bytes.clone();
        }
    }

    /// Compacts `log` at `now_ms` and stores the result.
    fn run(log: &mut Log, policy: &CompactionPolicy, now_ms: i64) {
        let rewrites = compact(&log.entries, policy, now_ms).unwrap();
        apply(log, &rewrites);
    }

    /// Every event the log holds, numbered by its index rows.
    fn read(log: &Log) -> Vec<Stored> {
        let mut out = Vec::new();
        for (row, bytes) in &log.entries {
            let entry = decode_entry(bytes).unwrap();
            let EntryPayload::Normal(Proposal::Append(batch)) = entry.payload else {
                continue;
            };
            for event in codec::decode_batch(&batch.events).unwrap() {
                out.push(Stored {
                    sequence: row.first_sequence + i64::from(event.index),
                    offset: row.first_offset + event.position as i64,
                    time_ms: row.enqueued_time_ms,
                    record: event.record,
                });
            }
        }
        out
    }

    fn generated() -> impl Strategy<Value = Generated> {
        (
            prop::option::weighted(0.8, 0..4u8),
            prop_oneof![1 => Just(Vec::new()), 3 => prop::collection::vec(any::<u8>(), 1..24)],
            prop::option::of(any::<i64>()),
            prop::bool::weighted(0.4),
            0..6i64,
            prop::bool::weighted(0.1),
        )
            .prop_map(
                |(key, body, property, new_entry, step_ms, other_after)| Generated {
                    key,
                    body,
                    property,
                    new_entry,
                    step_ms,
                    other_after,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn compaction_keeps_exactly_what_the_model_keeps(
            events in prop::collection::vec(generated(), 0..48),
            first_sequence in 0..1_000i64,
            first_offset in 0..100_000i64,
            lag_ms in 0..40i64,
            tombstone_retention_ms in 0..60i64,
            now_after_start_ms in -10..120i64,
            later_ms in 0..120i64,
        ) {
            let policy = CompactionPolicy { lag_ms, tombstone_retention_ms };
            let mut log = build(&events, first_sequence, first_offset);
            let original = log.entries.clone();
            let now_ms = 1_000 + now_after_start_ms;
            let later_now_ms = now_ms + later_ms;

            for now_ms in [now_ms, later_now_ms] {
                run(&mut log, &policy, now_ms);
                let expected = model(&log.events, &policy, now_ms);
                prop_assert_eq!(read(&log), expected, "at {} ms", now_ms);
                // Nothing more to do at the same time.
                prop_assert!(compact(&log.entries, &policy, now_ms).unwrap().is_empty());
            }
            // Entries that are not appends are untouched, and no entry was dropped.
            prop_assert_eq!(log.entries.len(), original.len());
            for ((row, bytes), (_, before)) in log.entries.iter().zip(&original) {
                if row.event_count == 0 {
                    prop_assert_eq!(bytes, before);
                }
            }
            // Everything past the last event's time plus lag and retention: each key keeps
            // only its final event, unless that is a tombstone.
            let end_ms = log.last_time_ms + lag_ms + tombstone_retention_ms;
            run(&mut log, &policy, end_ms);
            let mut keys = HashMap::new();
            for e in read(&log) {
                if let Some(key) = e.record.partition_key {
                    prop_assert!(!e.record.body.is_empty(), "an expired tombstone remains");
                    prop_assert!(keys.insert(key, e.sequence).is_none(), "a superseded event remains");
                }
            }
        }
    }

    fn entries_at(times_ms: &[i64], batches: &[&[EventRecord]]) -> Vec<(IndexRow, Bytes)> {
        let mut log = Vec::new();
        let (mut sequence, mut offset) = (0, 0);
        for (i, (time_ms, records)) in times_ms.iter().zip(batches).enumerate() {
            let index = i as u64 + 1;
            let events = encode_batch(records);
            let entry = Entry::new_normal(
                log_id::<TypeConfig>(1, 1, index),
                Proposal::Append(AppendBatch {
                    enqueued_time_ms: *time_ms,
                    event_count: records.len() as u32,
                    events: events.clone(),
                    producer: None,
                }),
            );
            let row = IndexRow {
                first_sequence: sequence,
                log_index: index,
                first_offset: offset,
                enqueued_time_ms: *time_ms,
                event_count: records.len() as u32,
            };
            log.push((row, encode_entry(&entry).unwrap()));
            sequence += records.len() as i64;
            offset += events.len() as i64;
        }
        log
    }

    #[test]
    fn a_key_keeps_its_latest_value_and_a_tombstone_goes_after_its_retention() {
        let policy = CompactionPolicy {
            lag_ms: 10,
            tombstone_retention_ms: 100,
        };
        let a1 = record(Some("a"), b"1", None);
        let b1 = record(Some("b"), b"1", None);
        let none = record(None, b"n", None);
        let a2 = record(Some("a"), b"2", None);
        let b_gone = record(Some("b"), b"", None);
        let a3 = record(Some("a"), b"3", None);
        let mut log = Log {
            entries: entries_at(
                &[0, 5, 50],
                &[
                    &[a1, b1, none.clone()],
                    &[a2.clone(), b_gone.clone()],
                    std::slice::from_ref(&a3),
                ],
            ),
            events: Vec::new(),
            last_time_ms: 50,
        };
        // At 20 the first two entries are in the range: a1 and b1 go, the tombstone stays.
        run(&mut log, &policy, 20);
        let kept: Vec<(i64, EventRecord)> = read(&log)
            .into_iter()
            .map(|e| (e.sequence, e.record))
            .collect();
        assert_eq!(
            kept,
            vec![(2, none.clone()), (3, a2), (4, b_gone), (5, a3.clone())]
        );
        // At 105 the tombstone is past its retention; a3 supersedes a2. The first
        // entry keeps only its keyless event, the second nothing but a hole.
        run(&mut log, &policy, 105);
        let kept: Vec<(i64, EventRecord)> = read(&log)
            .into_iter()
            .map(|e| (e.sequence, e.record))
            .collect();
        assert_eq!(kept, vec![(2, none), (5, a3)]);
        assert_eq!(log.entries.len(), 3);
        assert!(compact(&log.entries, &policy, 105).unwrap().is_empty());
    }

    #[test]
    fn a_row_for_another_entry_is_an_error() {
        let mut log = entries_at(&[0], &[&[record(Some("a"), b"1", None)]]);
        log[0].0.log_index = 9;
        let policy = CompactionPolicy {
            lag_ms: 0,
            tombstone_retention_ms: 0,
        };
        assert!(matches!(
            compact(&log, &policy, 10),
            Err(CompactionError::Mismatch { log_index: 1, .. })
        ));
    }
}
