//! What a partition remembers of Kafka idempotent producers (KIP-98), and the pure decision
//! on each of their batches. Part of the applied state: every replica decides the same, and
//! the state travels in snapshots, so a retry after a leader change or a restart is still
//! recognized.
//!
//! Per producer id: its epoch and its last [`KAFKA_BATCHES_REMEMBERED`] stored batches'
//! sequence ranges with their outcomes. A batch of the current epoch is
//! - a duplicate when its range is one of those (the reply repeats the original outcome,
//!   nothing is stored again);
//! - stored when it starts right after the last batch;
//! - refused as out of order otherwise (Kafka's 45 OUT_OF_ORDER_SEQUENCE_NUMBER).
//!
//! A batch of an older epoch is refused (47 INVALID_PRODUCER_EPOCH); one of a newer epoch
//! must start at sequence 0 and starts the producer afresh. A producer this partition has no
//! state for may start only at sequence 0: otherwise 59 UNKNOWN_PRODUCER_ID, on which
//! librdkafka bumps its epoch and starts again at 0. Beyond
//! [`KAFKA_PRODUCERS_PER_PARTITION_MAX`] producers, the least recently active is forgotten.

use std::collections::{BTreeMap, VecDeque};

use serde::{Deserialize, Serialize};
use tributary_raft::{AppendOutcome, KafkaProducerStamp};

/// Kafka producers remembered per partition; the least recently active is forgotten beyond
/// this. The applied state is written with every applied batch of entries, so this bounds
/// that write too (about 200 bytes per producer).
pub const KAFKA_PRODUCERS_PER_PARTITION_MAX: usize = 1024;
/// Batches remembered per producer, as Kafka brokers do: a client keeps at most 5 requests
/// in flight per partition with idempotence on.
pub const KAFKA_BATCHES_REMEMBERED: usize = 5;

/// Every Kafka producer a partition remembers, by producer id.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaProducers {
    producers: BTreeMap<i64, KafkaProducer>,
}

/// What a partition remembers of one Kafka producer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaProducer {
    pub epoch: i16,
    /// Its last stored batches, oldest first, at most [`KAFKA_BATCHES_REMEMBERED`].
    pub batches: VecDeque<KafkaBatch>,
    /// Log index of its last stored batch, for forgetting the least recently active.
    pub last_log_index: u64,
}

/// A stored batch: its first and last record's sequence, and where it was stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaBatch {
    pub first_sequence: i32,
    pub last_sequence: i32,
    pub outcome: AppendOutcome,
}

/// The decision on one batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaCheck {
    /// Store it.
    Append,
    /// Stored already, with this outcome.
    Duplicate(AppendOutcome),
    /// Its first sequence is not the next one.
    OutOfOrder { expected: i64, received: i64 },
    /// Of an epoch older than the producer's.
    StaleEpoch { current: i16, received: i16 },
    /// A sequence other than 0 from a producer this partition has no state for.
    UnknownProducer,
}

/// `sequence` moved on by `count` records, wrapping to 0 after `i32::MAX` as Kafka does.
pub fn advance(sequence: i32, count: u32) -> i32 {
    let next = (i64::from(sequence) + i64::from(count)) % (i64::from(i32::MAX) + 1);
    i32::try_from(next).unwrap_or(0)
}

impl KafkaProducers {
    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn get(&self, producer_id: i64) -> Option<&KafkaProducer> {
        self.producers.get(&producer_id)
    }

    /// The decision on a batch of `count` records stamped `stamp`.
    pub fn check(&self, stamp: KafkaProducerStamp, count: u32) -> KafkaCheck {
        let Some(known) = self.producers.get(&stamp.producer_id) else {
            return if stamp.base_sequence == 0 {
                KafkaCheck::Append
            } else {
                KafkaCheck::UnknownProducer
            };
        };
        if stamp.epoch < known.epoch {
            return KafkaCheck::StaleEpoch {
                current: known.epoch,
                received: stamp.epoch,
            };
        }
        if stamp.epoch > known.epoch {
            return if stamp.base_sequence == 0 {
                KafkaCheck::Append
            } else {
                KafkaCheck::OutOfOrder {
                    expected: 0,
                    received: i64::from(stamp.base_sequence),
                }
            };
        }
        let last_sequence = advance(stamp.base_sequence, count.saturating_sub(1));
        if let Some(stored) = known
            .batches
            .iter()
            .find(|b| b.first_sequence == stamp.base_sequence && b.last_sequence == last_sequence)
        {
            return KafkaCheck::Duplicate(stored.outcome);
        }
        let expected = known
            .batches
            .back()
            .map_or(0, |last| advance(last.last_sequence, 1));
        if stamp.base_sequence == expected {
            KafkaCheck::Append
        } else {
            KafkaCheck::OutOfOrder {
                expected: i64::from(expected),
                received: i64::from(stamp.base_sequence),
            }
        }
    }

    /// Remembers a batch [`check`](Self::check) let through, stored with `outcome` by the
    /// entry at `log_index`; forgets the least recently active producer beyond the limit.
    pub fn record(
        &mut self,
        stamp: KafkaProducerStamp,
        count: u32,
        outcome: AppendOutcome,
        log_index: u64,
    ) {
        let producer = self
            .producers
            .entry(stamp.producer_id)
            .or_insert_with(|| KafkaProducer {
                epoch: stamp.epoch,
                batches: VecDeque::new(),
                last_log_index: log_index,
            });
        if producer.epoch != stamp.epoch {
            producer.epoch = stamp.epoch;
            producer.batches.clear();
        }
        producer.batches.push_back(KafkaBatch {
            first_sequence: stamp.base_sequence,
            last_sequence: advance(stamp.base_sequence, count.saturating_sub(1)),
            outcome,
        });
        while producer.batches.len() > KAFKA_BATCHES_REMEMBERED {
            producer.batches.pop_front();
        }
        producer.last_log_index = log_index;
        if self.producers.len() > KAFKA_PRODUCERS_PER_PARTITION_MAX
            && let Some(oldest) = self
                .producers
                .iter()
                .min_by_key(|(_, p)| p.last_log_index)
                .map(|(id, _)| *id)
        {
            self.producers.remove(&oldest);
        }
    }
}

#[cfg(test)]
#[path = "kafka_producers_tests.rs"]
mod tests;
