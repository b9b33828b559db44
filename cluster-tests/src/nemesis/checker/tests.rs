//! Each rule of the checker on a hand-made history: a clean one passes, and the same history
//! with one thing broken fails with that rule's violation.

use std::collections::BTreeMap;

use super::*;
use crate::nemesis::history::{
    CheckpointSample, FaultRecord, FinalPartition, ManagementRecord, ProcessorCall, ReaderRecord,
};

const BOUNDS: Bounds = Bounds {
    handoff_max_ms: 3_000,
    recovery_max_ms: 45_000,
};
const OFFSET_STEP: i64 = 100;

fn id(producer: u32, number: u64) -> EventId {
    EventId { producer, number }
}

fn event(sequence: i64, id: EventId) -> Delivered {
    Delivered {
        sequence,
        offset: sequence * OFFSET_STEP,
        id: Some(id),
    }
}

/// A history in which producer 0 sends three acknowledged batches to partition "0"
/// (events 0/0..0/5, stored at sequences 0..5), one indeterminate batch that was never stored,
/// a reader reads all of it, two processors hand the partition over cleanly, the checkpoint
/// moves forward, a group is created, and one fault heals quickly.
fn clean() -> History {
    let mut h = History::default();
    let mut sequence = 0;
    let mut number = 0;
    for (t, size) in [(0u64, 2usize), (100, 1), (200, 3)] {
        let events: Vec<EventId> = (0..size)
            .map(|_| {
                number += 1;
                id(0, number - 1)
            })
            .collect();
        h.sends.push(SendRecord {
            producer: 0,
            partition: "0".into(),
            events: events.clone(),
            invoked_ms: t,
            acked_ms: Some(t + 50),
            attempts: 1,
            outcome: SendOutcome::Acked {
                first_sequence: sequence,
                offsets: (0..size as i64)
                    .map(|i| (sequence + i) * OFFSET_STEP)
                    .collect(),
            },
        });
        sequence += size as i64;
    }
    h.sends.push(SendRecord {
        producer: 0,
        partition: "0".into(),
        events: vec![id(0, 6), id(0, 7)],
        invoked_ms: 300,
        acked_ms: None,
        attempts: 3,
        outcome: SendOutcome::Indeterminate {
            last_error: "timed out".into(),
        },
    });
    let stored: Vec<Delivered> = (0..6).map(|i| event(i, id(0, i as u64))).collect();
    h.finals.push(FinalPartition {
        partition: "0".into(),
        events: stored.clone(),
        replicas: (1..=3).map(|n| (n, ("abc".to_owned(), 6))).collect(),
    });
    h.readers.push(ReaderRecord {
        reader: "$Default/0".into(),
        partition: "0".into(),
        events: stored.clone(),
    });
    h.processor_calls.push(ProcessorCall {
        processor: "processor-0".into(),
        partition: "0".into(),
        tenure: 1,
        started_ms: 100,
        ended_ms: 200,
        events: stored[..3].to_vec(),
    });
    h.processor_calls.push(ProcessorCall {
        processor: "processor-1".into(),
        partition: "0".into(),
        tenure: 1,
        started_ms: 1_000,
        ended_ms: 1_100,
        events: stored[2..].to_vec(),
    });
    for (at_ms, sequence) in [(150, 2), (1_050, 5)] {
        h.checkpoints.push(CheckpointSample {
            at_ms,
            partition: "0".into(),
            sequence,
            offset: sequence * OFFSET_STEP,
        });
    }
    h.management.push(ManagementRecord {
        invoked_ms: 10,
        completed_ms: 20,
        op: ManagementOp::CreateGroup("managed-group-1".into()),
        outcome: CallOutcome::Ok,
    });
    h.final_groups = Some(["managed-group-1".to_owned()].into());
    h.final_hubs = Some(Default::default());
    h.faults.push(FaultRecord {
        kind: "kill".into(),
        description: "SIGKILL node 2".into(),
        injected_ms: 0,
        healed_ms: Some(5_000),
        recovered_ms: Some(6_000),
    });
    h
}

fn kinds(report: &CheckReport) -> Vec<ViolationKind> {
    let mut kinds: Vec<ViolationKind> = report.violations.iter().map(|v| v.kind).collect();
    kinds.sort();
    kinds.dedup();
    kinds
}

/// The kinds of violations found after `change` is made to the clean history.
fn violations_after(change: impl FnOnce(&mut History)) -> (CheckReport, Vec<ViolationKind>) {
    let mut history = clean();
    change(&mut history);
    let report = check(&history, BOUNDS);
    let kinds = kinds(&report);
    (report, kinds)
}

#[test]
fn a_clean_history_passes_with_its_figures() {
    let report = check(&clean(), BOUNDS);
    assert!(report.is_valid(), "{}", report.render(20));
    assert_eq!(report.acked_events, 6);
    assert_eq!(report.indeterminate_events, 2);
    assert_eq!(report.indeterminate_stored, 0);
    assert_eq!(
        (report.lost, report.duplicated, report.reordered),
        (0, 0, 0)
    );
    assert_eq!(report.delivered_events, 6);
    assert_eq!(report.processed_events, 7);
    assert_eq!(report.checkpoint_samples, 2);
    assert_eq!(report.max_handoff_ms, 0);
    assert_eq!(report.faults, BTreeMap::from([("kill".to_owned(), 1)]));
    assert_eq!(
        report.max_recovery_ms,
        BTreeMap::from([("kill".to_owned(), 1_000)])
    );
}

#[test]
fn an_acknowledged_event_missing_is_lost() {
    let (report, kinds) = violations_after(|h| {
        // The last event is gone: a replica that acknowledged it lost it.
        h.finals[0].events.pop();
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 5))).collect();
        h.readers[0].events.pop();
        h.processor_calls[1].events.pop();
        h.checkpoints.pop();
    });
    assert_eq!(kinds, [ViolationKind::Lost, ViolationKind::PartialBatch]);
    assert_eq!(report.lost, 1);
}

#[test]
fn an_event_stored_twice_is_duplicated() {
    let (report, kinds) = violations_after(|h| {
        let again = event(6, id(0, 5));
        h.finals[0].events.push(again);
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 7))).collect();
    });
    assert!(kinds.contains(&ViolationKind::Duplicated), "{kinds:?}");
    assert_eq!(report.duplicated, 1);
}

#[test]
fn an_indeterminate_batch_may_be_stored_once_but_never_twice() {
    let stored_once = |h: &mut History| {
        h.finals[0].events.push(event(6, id(0, 6)));
        h.finals[0].events.push(event(7, id(0, 7)));
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 8))).collect();
    };
    let (report, kinds) = violations_after(stored_once);
    assert!(kinds.is_empty(), "{}", report.render(20));
    assert_eq!(report.indeterminate_stored, 2);
    let (report, kinds) = violations_after(|h| {
        stored_once(h);
        h.finals[0].events.push(event(8, id(0, 6)));
        h.finals[0].events.push(event(9, id(0, 7)));
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 10))).collect();
    });
    assert_eq!(kinds, [ViolationKind::Duplicated]);
    assert_eq!(report.duplicated, 2);
}

#[test]
fn an_acknowledgement_with_other_numbers_than_stored_is_misplaced() {
    let (_, kinds) = violations_after(|h| {
        if let SendOutcome::Acked { first_sequence, .. } = &mut h.sends[1].outcome {
            *first_sequence += 1;
        }
    });
    assert_eq!(kinds, [ViolationKind::Misplaced]);
    let (_, kinds) = violations_after(|h| {
        if let SendOutcome::Acked { offsets, .. } = &mut h.sends[1].outcome {
            offsets[0] += 1;
        }
    });
    assert_eq!(kinds, [ViolationKind::Misplaced]);
}

#[test]
fn a_batch_stored_in_part_or_apart_is_caught() {
    let (_, kinds) = violations_after(|h| {
        // Only the first event of the indeterminate batch 0/6, 0/7 is stored.
        h.finals[0].events.push(event(6, id(0, 6)));
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 7))).collect();
    });
    assert_eq!(kinds, [ViolationKind::PartialBatch]);
    let (_, kinds) = violations_after(|h| {
        // Both, but with another producer's event between them.
        h.sends.push(SendRecord {
            producer: 1,
            partition: "0".into(),
            events: vec![id(1, 0)],
            invoked_ms: 300,
            acked_ms: None,
            attempts: 1,
            outcome: SendOutcome::Indeterminate {
                last_error: "timed out".into(),
            },
        });
        h.finals[0].events.push(event(6, id(0, 6)));
        h.finals[0].events.push(event(7, id(1, 0)));
        h.finals[0].events.push(event(8, id(0, 7)));
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 9))).collect();
    });
    assert_eq!(kinds, [ViolationKind::PartialBatch]);
}

#[test]
fn an_event_nobody_sent_is_a_phantom() {
    let (_, kinds) = violations_after(|h| {
        h.finals[0].events.push(event(6, id(7, 0)));
        h.finals[0].events.push(Delivered {
            sequence: 7,
            offset: 700,
            id: None,
        });
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 8))).collect();
    });
    assert_eq!(kinds, [ViolationKind::Phantom]);
}

/// Batch 1 (event 0/2) stored before batch 0 (events 0/0, 0/1), as the acknowledgements
/// said; what everyone read follows.
fn store_second_batch_first(h: &mut History) {
    let order = [id(0, 2), id(0, 0), id(0, 1), id(0, 3), id(0, 4), id(0, 5)];
    h.finals[0].events = order
        .iter()
        .enumerate()
        .map(|(s, i)| event(s as i64, *i))
        .collect();
    h.sends[0].outcome = SendOutcome::Acked {
        first_sequence: 1,
        offsets: vec![100, 200],
    };
    h.sends[1].outcome = SendOutcome::Acked {
        first_sequence: 0,
        offsets: vec![0],
    };
    h.readers[0].events = h.finals[0].events.clone();
    h.processor_calls[0].events = h.finals[0].events[..3].to_vec();
    h.processor_calls[1].events = h.finals[0].events[2..].to_vec();
}

#[test]
fn acknowledged_batches_stored_out_of_order_are_reordered() {
    let (report, kinds) = violations_after(store_second_batch_first);
    assert_eq!(kinds, [ViolationKind::Reordered]);
    assert_eq!(report.reordered, 1);
}

#[test]
fn batches_in_flight_together_may_land_in_either_order() {
    let (report, kinds) = violations_after(|h| {
        store_second_batch_first(h);
        // Batch 1 was sent before batch 0 was acknowledged.
        h.sends[1].invoked_ms = 40;
    });
    assert!(kinds.is_empty(), "{}", report.render(20));
}

#[test]
fn gaps_in_the_stored_numbers_are_caught() {
    let (_, kinds) = violations_after(|h| h.finals[0].events[3].sequence = 4);
    assert!(kinds.contains(&ViolationKind::SequenceGap), "{kinds:?}");
    let (_, kinds) = violations_after(|h| h.finals[0].events[3].offset = 150);
    assert!(kinds.contains(&ViolationKind::SequenceGap), "{kinds:?}");
}

#[test]
fn a_reader_that_skips_repeats_or_sees_what_is_later_missing_diverges() {
    let (_, kinds) = violations_after(|h| {
        h.readers[0].events.remove(2);
    });
    assert_eq!(kinds, [ViolationKind::ReaderDivergence]);
    let (_, kinds) = violations_after(|h| {
        let again = h.readers[0].events[2];
        h.readers[0].events.insert(3, again);
    });
    assert_eq!(kinds, [ViolationKind::ReaderDivergence]);
    let (_, kinds) = violations_after(|h| {
        // The reader saw an event at sequence 6 that the partition does not hold at the end.
        h.readers[0].events.push(event(6, id(0, 6)));
    });
    assert_eq!(kinds, [ViolationKind::ReaderDivergence]);
    let (_, kinds) = violations_after(|h| {
        // A reader that has not caught up yet is fine.
        h.readers[0].events.truncate(3);
    });
    assert!(kinds.is_empty());
}

#[test]
fn processors_that_skip_events_diverge() {
    let (_, kinds) = violations_after(|h| {
        // The second owner started after sequence 3 although nobody processed 3.
        h.processor_calls[1].events = h.finals[0].events[4..].to_vec();
    });
    assert_eq!(kinds, [ViolationKind::ProcessorDivergence]);
    let (_, kinds) = violations_after(|h| {
        // A gap within one tenure.
        h.processor_calls[0].events.remove(1);
    });
    assert!(kinds.contains(&ViolationKind::ProcessorDivergence));
}

/// Appends an empty `process_events` call of `processor` (tenure 1) at `started_ms`.
fn late_call(h: &mut History, processor: &str, started_ms: Millis) {
    h.processor_calls.push(ProcessorCall {
        processor: processor.into(),
        partition: "0".into(),
        tenure: 1,
        started_ms,
        ended_ms: started_ms + 10,
        events: Vec::new(),
    });
}

#[test]
fn processors_overlapping_beyond_the_hand_off_are_caught() {
    let (report, kinds) = violations_after(|h| {
        late_call(h, "processor-0", 2_500);
        late_call(h, "processor-1", 3_000);
    });
    assert!(kinds.is_empty(), "{}", report.render(20));
    assert_eq!(report.max_handoff_ms, 1_500);
    let (report, kinds) = violations_after(|h| {
        late_call(h, "processor-0", 4_100);
        late_call(h, "processor-1", 5_000);
    });
    assert_eq!(kinds, [ViolationKind::ProcessorOverlap]);
    assert_eq!(report.max_handoff_ms, 3_100);
}

#[test]
fn a_call_that_ends_late_is_no_overlap() {
    // The old owner's last call began before the new owner's first and ended long after it
    // (a checkpoint waiting on a faulty cluster): nothing was processed twice at once.
    let (report, kinds) = violations_after(|h| {
        h.processor_calls[0].ended_ms = 20_000;
        late_call(h, "processor-1", 9_000);
    });
    assert!(kinds.is_empty(), "{}", report.render(20));
    assert_eq!(report.max_handoff_ms, 0);
}

#[test]
fn checkpoints_moving_back_or_naming_nothing_are_caught() {
    let (_, kinds) = violations_after(|h| h.checkpoints[1].sequence = 1);
    assert!(kinds.contains(&ViolationKind::CheckpointBackwards));
    let (_, kinds) = violations_after(|h| h.checkpoints[1].offset += 1);
    assert_eq!(kinds, [ViolationKind::CheckpointBackwards]);
}

#[test]
fn management_effects_must_follow_the_answers() {
    let (_, kinds) = violations_after(|h| h.final_groups = Some(Default::default()));
    assert_eq!(kinds, [ViolationKind::Management]);
    let (_, kinds) = violations_after(|h| {
        h.management[0].outcome = CallOutcome::Failed("refused".into());
    });
    assert_eq!(kinds, [ViolationKind::Management]);
    let (_, kinds) = violations_after(|h| {
        h.management[0].outcome = CallOutcome::Indeterminate("timed out".into());
    });
    assert!(kinds.is_empty());
    let (_, kinds) = violations_after(|h| {
        h.management.push(ManagementRecord {
            invoked_ms: 30,
            completed_ms: 40,
            op: ManagementOp::DeleteGroup("managed-group-1".into()),
            outcome: CallOutcome::Ok,
        });
    });
    assert_eq!(kinds, [ViolationKind::Management]);
    let (_, kinds) = violations_after(|h| {
        h.final_hubs = Some(["managed-hub-9".to_owned()].into());
    });
    assert_eq!(kinds, [ViolationKind::Management]);
    let (_, kinds) = violations_after(|h| h.final_groups = None);
    assert!(kinds.is_empty(), "an unknown final state judges nothing");
}

#[test]
fn replicas_that_differ_are_caught() {
    let (_, kinds) = violations_after(|h| {
        h.finals[0].replicas.insert(2, ("abd".into(), 6));
    });
    assert_eq!(kinds, [ViolationKind::ReplicaDivergence]);
    let (_, kinds) = violations_after(|h| {
        h.finals[0].replicas.insert(3, ("abc".into(), 5));
    });
    assert_eq!(kinds, [ViolationKind::ReplicaDivergence]);
}

#[test]
fn a_slow_or_missing_recovery_is_caught() {
    let (report, kinds) = violations_after(|h| h.faults[0].recovered_ms = Some(60_000));
    assert_eq!(kinds, [ViolationKind::SlowRecovery]);
    assert_eq!(report.max_recovery_ms["kill"], 55_000);
    let (_, kinds) = violations_after(|h| h.faults[0].recovered_ms = None);
    assert_eq!(kinds, [ViolationKind::SlowRecovery]);
}

#[test]
fn the_report_names_each_violation() {
    let (report, _) = violations_after(|h| {
        h.finals[0].events.pop();
        h.finals[0].replicas = (1..=3).map(|n| (n, ("abc".to_owned(), 5))).collect();
    });
    let text = report.render(1);
    assert!(text.contains("lost 1"), "{text}");
    assert!(text.contains("event 0/5"), "{text}");
    assert!(text.contains("more"), "{text}");
    assert!(check(&clean(), BOUNDS).render(5).contains("no violations"));
}

#[test]
fn ranges_are_compact() {
    assert_eq!(ranges(&[1, 2, 3, 7, 9, 10]), "1..=3, 7, 9..=10");
    assert_eq!(ranges(&[4]), "4");
}
