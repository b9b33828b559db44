use proptest::prelude::*;

use super::*;

fn stamp(producer_id: i64, epoch: i16, base_sequence: i32) -> KafkaProducerStamp {
    KafkaProducerStamp {
        producer_id,
        epoch,
        base_sequence,
    }
}

fn outcome(first_sequence: i64) -> AppendOutcome {
    AppendOutcome {
        first_sequence,
        first_offset: first_sequence * 100,
        enqueued_time_ms: 1_000 + first_sequence,
    }
}

/// Stores a batch as the state machine does: checked, then recorded if let through. Returns
/// the check and the outcome replied.
fn offer(
    producers: &mut KafkaProducers,
    next_sequence: &mut i64,
    log_index: u64,
    stamp: KafkaProducerStamp,
    count: u32,
) -> (KafkaCheck, Option<AppendOutcome>) {
    let check = producers.check(stamp, count);
    let reply = match check {
        KafkaCheck::Append => {
            let stored = outcome(*next_sequence);
            *next_sequence += i64::from(count);
            producers.record(stamp, count, stored, log_index);
            Some(stored)
        }
        KafkaCheck::Duplicate(original) => Some(original),
        _ => None,
    };
    (check, reply)
}

#[test]
fn a_retry_of_any_of_the_last_five_batches_gets_its_original_outcome() {
    let mut producers = KafkaProducers::default();
    let mut next = 0;
    let mut replies = Vec::new();
    for (i, base) in [0, 3, 6, 9, 12, 15].into_iter().enumerate() {
        let (check, reply) = offer(&mut producers, &mut next, i as u64, stamp(7, 0, base), 3);
        assert_eq!(check, KafkaCheck::Append, "batch at {base}");
        replies.push(reply.unwrap());
    }
    assert_eq!(next, 18);
    // The last five (3..=17) are remembered: each retry is a duplicate of its own batch.
    for (i, base) in [3, 6, 9, 12, 15].into_iter().enumerate() {
        assert_eq!(
            producers.check(stamp(7, 0, base), 3),
            KafkaCheck::Duplicate(replies[i + 1]),
        );
    }
    // The sixth-last is forgotten: its retry is out of order, never stored again.
    assert_eq!(
        producers.check(stamp(7, 0, 0), 3),
        KafkaCheck::OutOfOrder {
            expected: 18,
            received: 0
        }
    );
    // A retry whose range differs from the stored batch's is not a duplicate.
    assert_eq!(
        producers.check(stamp(7, 0, 15), 2),
        KafkaCheck::OutOfOrder {
            expected: 18,
            received: 15
        }
    );
}

#[test]
fn a_gap_is_out_of_order() {
    let mut producers = KafkaProducers::default();
    let mut next = 0;
    offer(&mut producers, &mut next, 1, stamp(7, 0, 0), 5);
    assert_eq!(
        producers.check(stamp(7, 0, 6), 1),
        KafkaCheck::OutOfOrder {
            expected: 5,
            received: 6
        }
    );
    assert_eq!(producers.check(stamp(7, 0, 5), 1), KafkaCheck::Append);
}

#[test]
fn epochs_fence_older_producers_and_restart_newer_ones() {
    let mut producers = KafkaProducers::default();
    let mut next = 0;
    offer(&mut producers, &mut next, 1, stamp(7, 2, 0), 4);
    assert_eq!(
        producers.check(stamp(7, 1, 4), 1),
        KafkaCheck::StaleEpoch {
            current: 2,
            received: 1
        }
    );
    // Even a retry of a stored batch, once the epoch is stale.
    assert_eq!(
        producers.check(stamp(7, 1, 0), 4),
        KafkaCheck::StaleEpoch {
            current: 2,
            received: 1
        }
    );
    // A newer epoch starts at 0.
    assert_eq!(
        producers.check(stamp(7, 3, 4), 1),
        KafkaCheck::OutOfOrder {
            expected: 0,
            received: 4
        }
    );
    let (check, _) = offer(&mut producers, &mut next, 2, stamp(7, 3, 0), 2);
    assert_eq!(check, KafkaCheck::Append);
    let producer = producers.get(7).unwrap();
    assert_eq!(producer.epoch, 3);
    assert_eq!(
        producer.batches.len(),
        1,
        "the old epoch's batches are dropped"
    );
    assert!(matches!(
        producers.check(stamp(7, 2, 4), 1),
        KafkaCheck::StaleEpoch { .. }
    ));
}

#[test]
fn an_unknown_producer_may_only_start_at_zero() {
    let producers = KafkaProducers::default();
    assert_eq!(
        producers.check(stamp(9, 0, 42), 1),
        KafkaCheck::UnknownProducer
    );
    assert_eq!(producers.check(stamp(9, 0, 0), 1), KafkaCheck::Append);
}

#[test]
fn sequences_wrap_after_i32_max() {
    assert_eq!(advance(i32::MAX, 1), 0);
    assert_eq!(advance(i32::MAX - 1, 3), 1);
    let mut producers = KafkaProducers::default();
    producers.record(stamp(7, 0, i32::MAX - 1), 3, outcome(0), 1);
    assert_eq!(
        producers.get(7).unwrap().batches[0].last_sequence,
        0,
        "records MAX-1, MAX, 0"
    );
    assert_eq!(producers.check(stamp(7, 0, 1), 1), KafkaCheck::Append);
    assert_eq!(
        producers.check(stamp(7, 0, i32::MAX - 1), 3),
        KafkaCheck::Duplicate(outcome(0))
    );
}

#[test]
fn the_least_recently_active_producer_is_forgotten_beyond_the_limit() {
    let mut producers = KafkaProducers::default();
    let max = KAFKA_PRODUCERS_PER_PARTITION_MAX as i64;
    for id in 0..max {
        producers.record(stamp(id, 0, 0), 1, outcome(id), id as u64 + 1);
    }
    // Producer 0 is active again, so producer 1 is now the least recently active.
    producers.record(stamp(0, 0, 1), 1, outcome(max), max as u64 + 1);
    producers.record(stamp(max, 0, 0), 1, outcome(max + 1), max as u64 + 2);
    assert_eq!(producers.len(), KAFKA_PRODUCERS_PER_PARTITION_MAX);
    assert!(producers.get(1).is_none());
    assert!(producers.get(0).is_some());
    assert!(producers.get(max).is_some());
    // The forgotten producer's next batch: it has no state here any more.
    assert_eq!(
        producers.check(stamp(1, 0, 1), 1),
        KafkaCheck::UnknownProducer
    );
}

/// What a client does next.
#[derive(Debug, Clone)]
enum Action {
    /// Sends its next batch of `count` records.
    Next(u32),
    /// Retries one of its batches sent so far (index from the newest).
    Retry(usize),
    /// Sends a batch skipping `gap` records.
    Skip(u32),
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        3 => (1u32..6).prop_map(Action::Next),
        2 => (0usize..8).prop_map(Action::Retry),
        1 => (1u32..4).prop_map(Action::Skip),
    ]
}

proptest! {
    /// Whatever a producer sends, retries or skips: every record is stored at most once,
    /// a retry is answered with its batch's original outcome or refused, never stored
    /// again, and the stored records are the producer's in order without gaps.
    #[test]
    fn records_are_stored_once_and_in_order(actions in prop::collection::vec(action(), 1..60)) {
        let mut producers = KafkaProducers::default();
        let mut next_stored = 0i64;
        // Batches sent: (base sequence, count, outcome when first stored).
        let mut sent: Vec<(i32, u32, Option<AppendOutcome>)> = Vec::new();
        let mut next_sequence = 0i32;
        let mut stored_records: Vec<i32> = Vec::new();
        for (i, action) in actions.into_iter().enumerate() {
            let log_index = i as u64 + 1;
            match action {
                Action::Next(count) => {
                    let (check, reply) =
                        offer(&mut producers, &mut next_stored, log_index, stamp(7, 0, next_sequence), count);
                    prop_assert_eq!(check, KafkaCheck::Append);
                    stored_records.extend((0..count).map(|r| advance(next_sequence, r)));
                    sent.push((next_sequence, count, reply));
                    next_sequence = advance(next_sequence, count);
                }
                Action::Retry(back) => {
                    let Some(&(base, count, original)) = sent.iter().rev().nth(back) else {
                        continue;
                    };
                    let before = next_stored;
                    let (check, reply) =
                        offer(&mut producers, &mut next_stored, log_index, stamp(7, 0, base), count);
                    prop_assert_eq!(next_stored, before, "a retry is never stored again");
                    if back < KAFKA_BATCHES_REMEMBERED {
                        prop_assert_eq!(reply, original);
                    } else {
                        let refused = matches!(check, KafkaCheck::OutOfOrder { .. });
                        prop_assert!(refused || reply == original, "{:?}", check);
                    }
                }
                Action::Skip(gap) => {
                    let before = next_stored;
                    let (check, _) = offer(
                        &mut producers,
                        &mut next_stored,
                        log_index,
                        stamp(7, 0, advance(next_sequence, gap)),
                        1,
                    );
                    prop_assert_eq!(next_stored, before);
                    let expected = if sent.is_empty() {
                        // Nothing stored yet: this partition has no state for the producer.
                        KafkaCheck::UnknownProducer
                    } else {
                        KafkaCheck::OutOfOrder {
                            expected: i64::from(next_sequence),
                            received: i64::from(advance(next_sequence, gap)),
                        }
                    };
                    prop_assert_eq!(check, expected);
                }
            }
        }
        prop_assert_eq!(stored_records.len() as i64, next_stored);
        let expected: Vec<i32> = (0..next_stored as i32).collect();
        prop_assert_eq!(stored_records, expected);
    }
}
