//! Kafka consumer groups (the classic protocol) as the Kafka front end needs them from the
//! broker: which node coordinates the groups (the controller group's leader, where their
//! membership lives in memory), and their committed offsets, replicated in the controller's
//! consumer store. Kafka groups are their own namespace, not the hubs' consumer groups.
//! Offsets need Listen on each hub (as the gRPC API's checkpoints do).

use tributary_types::{NodeId, Rights};

use super::Service;
use crate::auth::{Credential, Scope};
use crate::error::Error;

pub use tributary_controller::store::{
    KAFKA_GROUP_ID_LEN_MAX, KAFKA_OFFSET_METADATA_BYTES_MAX, KafkaOffset, KafkaOffsetCommit,
    KafkaOffsetRecord,
};

/// The first cluster feature level whose nodes all know the Kafka offset commands.
const KAFKA_OFFSETS_FEATURE_LEVEL: u32 = 2;

impl Service {
    /// Whether this node coordinates Kafka groups now: it leads the controller group.
    pub fn is_kafka_coordinator(&self) -> bool {
        self.broker.runtime().is_controller_leader()
    }

    /// The node coordinating Kafka groups (the controller group's leader), as this node
    /// knows it; `None` while there is none, or on a node outside the controller group.
    pub fn kafka_coordinator(&self) -> Option<NodeId> {
        self.broker.runtime().controller_leader().map(NodeId)
    }

    /// Stores a Kafka group's offsets in one replicated command: all or none. Needs Listen
    /// on every hub named.
    pub async fn commit_kafka_offsets(
        &self,
        credential: &Credential,
        group: &str,
        offsets: Vec<KafkaOffsetCommit>,
    ) -> Result<Vec<KafkaOffsetRecord>, Error> {
        for offset in &offsets {
            self.check(credential, Scope::Hub(&offset.hub), Rights::LISTEN)?;
        }
        self.kafka_level()?;
        self.store.commit_kafka_offsets(group, offsets).await
    }

    /// A Kafka group's committed offsets in `hub`, or in every hub the credential may
    /// listen to.
    pub async fn kafka_offsets(
        &self,
        credential: &Credential,
        group: &str,
        hub: Option<&str>,
    ) -> Result<Vec<KafkaOffsetRecord>, Error> {
        if let Some(hub) = hub {
            self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        }
        self.kafka_level()?;
        let mut records = self.store.kafka_offsets(group, hub).await?;
        records.retain(|r| {
            self.check(credential, Scope::Hub(&r.hub), Rights::LISTEN)
                .is_ok()
        });
        Ok(records)
    }

    fn kafka_level(&self) -> Result<(), Error> {
        let feature = self.broker.runtime().state().feature.clone();
        if feature.level < KAFKA_OFFSETS_FEATURE_LEVEL {
            return Err(Error::unavailable(format!(
                "Kafka consumer groups need cluster feature level {KAFKA_OFFSETS_FEATURE_LEVEL}; \
                 this cluster runs level {} (release {}): upgrade every node, and the level \
                 rises by itself",
                feature.level, feature.release
            )));
        }
        Ok(())
    }
}
