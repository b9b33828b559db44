//! Kafka idempotent producers' ids (InitProducerId). Ids are cluster-unique: the controller
//! hands out blocks of them, one Raft entry per block (the block of the entry's log index,
//! see [`tributary_controller::store::producer_id_block`]), and each node hands out its
//! cached block's ids one at a time. Needs Send on the namespace or on some hub.

use std::ops::Range;
use std::sync::Mutex;

use tributary_controller::state::{Command, Reply};
use tributary_controller::store::{StoreCommand, StoreReply};
use tributary_types::Rights;

use super::Service;
use crate::auth::{Credential, Scope};
use crate::error::Error;

/// The first cluster feature level whose nodes all know Kafka producers' entries and
/// commands.
pub const KAFKA_PRODUCER_FEATURE_LEVEL: u32 = 2;

/// A Kafka idempotent producer as InitProducerId names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KafkaProducer {
    pub producer_id: i64,
    pub epoch: i16,
}

/// The block of producer ids a node hands out; refilled from the controller when empty.
#[derive(Debug, Default)]
pub struct ProducerIds {
    block: Mutex<Range<i64>>,
}

impl ProducerIds {
    fn take(&self) -> Option<i64> {
        self.block.lock().expect("producer id lock poisoned").next()
    }

    /// Keeps `fresh` unless ids of another block are still left (two callers found the
    /// block empty at once: the second block's rest is dropped, ids are never reused).
    fn refill(&self, fresh: Range<i64>) {
        let mut block = self.block.lock().expect("producer id lock poisoned");
        if block.is_empty() {
            *block = fresh;
        }
    }
}

impl Service {
    /// InitProducerId without a transactional id: a new producer (a fresh id, epoch 0), or,
    /// given the producer's current id and epoch (Kafka 2.5+ clients, after an
    /// UNKNOWN_PRODUCER_ID or a timed-out batch), the same id at the next epoch; a producer
    /// whose epoch cannot rise further gets a fresh id. Epochs are not tracked here: the
    /// partitions fence older epochs once they see a newer one.
    pub async fn init_kafka_producer(
        &self,
        credential: &Credential,
        current: Option<KafkaProducer>,
    ) -> Result<KafkaProducer, Error> {
        self.check_send_somewhere(credential)?;
        if crate::fault::FaultHooks::global().take_producer_id_refusal() {
            return Err(Error::unavailable(
                "refused by a fault hook (testing only): no producer id now; retry",
            ));
        }
        self.kafka_producer_level()?;
        if let Some(current) = current
            && current.producer_id >= 0
            && (0..i16::MAX).contains(&current.epoch)
        {
            return Ok(KafkaProducer {
                producer_id: current.producer_id,
                epoch: current.epoch + 1,
            });
        }
        Ok(KafkaProducer {
            producer_id: self.next_producer_id().await?,
            epoch: 0,
        })
    }

    async fn next_producer_id(&self) -> Result<i64, Error> {
        if let Some(id) = self.producer_ids.take() {
            return Ok(id);
        }
        let command = Command::Store(StoreCommand::AllocateProducerIds);
        match self.broker.runtime().propose(command).await? {
            Reply::Store(StoreReply::ProducerIds { first, count }) => {
                let end = first.saturating_add(i64::from(count));
                self.producer_ids.refill(first.saturating_add(1)..end);
                Ok(first)
            }
            other => Err(Error::internal(format!(
                "the controller answered a producer id allocation with {other:?}"
            ))),
        }
    }

    /// Passes when the credential grants Send on the namespace or on any hub: an
    /// InitProducerId names no hub.
    fn check_send_somewhere(&self, credential: &Credential) -> Result<(), Error> {
        let namespace = self.check(credential, Scope::Namespace, Rights::SEND);
        if namespace.is_ok() {
            return namespace;
        }
        let state = self.broker.runtime().state();
        if state.hubs.keys().any(|hub| {
            self.check(credential, Scope::Hub(hub), Rights::SEND)
                .is_ok()
        }) {
            return Ok(());
        }
        namespace
    }

    /// Refuses Kafka producers' entries and commands until every node knows them.
    pub(super) fn kafka_producer_level(&self) -> Result<(), Error> {
        let feature = self.broker.runtime().state().feature.clone();
        if feature.level < KAFKA_PRODUCER_FEATURE_LEVEL {
            return Err(Error::unavailable(format!(
                "the idempotent Kafka producer needs cluster feature level \
                 {KAFKA_PRODUCER_FEATURE_LEVEL}; this cluster runs level {} (release {}): \
                 upgrade every node, and the level rises by itself",
                feature.level, feature.release
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_is_handed_out_once_and_a_second_one_found_empty_together_is_dropped() {
        let ids = ProducerIds::default();
        assert_eq!(ids.take(), None, "no block yet");
        ids.refill(10..13);
        // Another caller's block arrives while ids of the first are left: dropped.
        ids.refill(100..200);
        assert_eq!(
            [ids.take(), ids.take(), ids.take(), ids.take()],
            [Some(10), Some(11), Some(12), None]
        );
        ids.refill(200..201);
        assert_eq!(ids.take(), Some(200));
    }
}
