//! The checkpoint store as the rest of the node sees it: one interface, so the records can
//! later move from the controller group to groups of their own without touching callers.
//! [`ControllerStore`] keeps them in the controller group ([`tributary_controller::store`]).

use std::sync::Arc;

use tributary_types::Clock;

use crate::cluster::ClusterRuntime;
use crate::error::Error;
use tributary_controller::state::{Command, Reply};
use tributary_controller::store::{
    BlobPut, BlobView, BlobWrite, Checkpoint, Claim, KafkaOffsetCommit, KafkaOffsetRecord,
    Ownership, StoreCommand, StoreReply,
};

#[tonic::async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// Every ownership record of a consumer group, by partition index.
    async fn list_ownership(&self, hub: &str, group: &str) -> Result<Vec<(u16, Ownership)>, Error>;

    /// Claims partitions, each a compare-and-set on its etag; returns the claims won.
    async fn claim_ownership(
        &self,
        hub: &str,
        group: &str,
        claims: Vec<Claim>,
    ) -> Result<Vec<(u16, Ownership)>, Error>;

    async fn update_checkpoint(
        &self,
        hub: &str,
        group: &str,
        partition: u16,
        offset: i64,
        sequence_number: i64,
        owner: Option<&str>,
    ) -> Result<Checkpoint, Error>;

    /// Every checkpoint of a consumer group, by partition index.
    async fn list_checkpoints(
        &self,
        hub: &str,
        group: &str,
    ) -> Result<Vec<(u16, Checkpoint)>, Error>;

    /// Every record of a consumer group as the Blob API shows it.
    async fn list_blobs(&self, hub: &str, group: &str) -> Result<Vec<BlobView>, Error> {
        let _ = (hub, group);
        Err(Error::unavailable(
            "this checkpoint store has no Blob API view",
        ))
    }

    /// A Blob API write: the record's metadata replaced under a condition, atomically.
    async fn put_blob(&self, hub: &str, group: &str, put: BlobPut) -> Result<BlobWrite, Error> {
        let _ = (hub, group, put);
        Err(Error::unavailable(
            "this checkpoint store has no Blob API view",
        ))
    }

    /// Stores a Kafka group's offsets, all or none.
    async fn commit_kafka_offsets(
        &self,
        group: &str,
        offsets: Vec<KafkaOffsetCommit>,
    ) -> Result<Vec<KafkaOffsetRecord>, Error> {
        let _ = (group, offsets);
        Err(Error::unavailable(
            "this checkpoint store keeps no Kafka offsets",
        ))
    }

    /// A Kafka group's offsets, of one hub or of every hub.
    async fn kafka_offsets(
        &self,
        group: &str,
        hub: Option<&str>,
    ) -> Result<Vec<KafkaOffsetRecord>, Error> {
        let _ = (group, hub);
        Err(Error::unavailable(
            "this checkpoint store keeps no Kafka offsets",
        ))
    }
}

fn unexpected(reply: impl std::fmt::Debug) -> Error {
    Error::internal(format!("the checkpoint store answered {reply:?}"))
}

/// Records replicated through the controller's Raft group (reads too, so they are
/// linearizable).
pub struct ControllerStore {
    runtime: Arc<ClusterRuntime>,
    clock: Arc<dyn Clock>,
}

impl ControllerStore {
    pub fn new(runtime: Arc<ClusterRuntime>, clock: Arc<dyn Clock>) -> Self {
        ControllerStore { runtime, clock }
    }

    async fn run(&self, command: StoreCommand) -> Result<StoreReply, Error> {
        match self.runtime.propose(Command::Store(command)).await? {
            Reply::Store(reply) => Ok(reply),
            other => Err(unexpected(other)),
        }
    }

    async fn ownership(&self, command: StoreCommand) -> Result<Vec<(u16, Ownership)>, Error> {
        match self.run(command).await? {
            StoreReply::Ownership(records) => Ok(records),
            other => Err(unexpected(other)),
        }
    }
}

#[tonic::async_trait]
impl CheckpointStore for ControllerStore {
    async fn list_blobs(&self, hub: &str, group: &str) -> Result<Vec<BlobView>, Error> {
        match self
            .run(StoreCommand::ListBlobs {
                hub: hub.to_string(),
                group: group.to_string(),
            })
            .await?
        {
            StoreReply::Blobs(blobs) => Ok(blobs),
            other => Err(unexpected(other)),
        }
    }

    async fn put_blob(&self, hub: &str, group: &str, put: BlobPut) -> Result<BlobWrite, Error> {
        match self
            .run(StoreCommand::PutBlob {
                hub: hub.to_string(),
                group: group.to_string(),
                partition: put.partition,
                kind: put.kind,
                metadata: put.metadata,
                condition: put.condition,
                create: put.create,
                now_ms: self.clock.now_ms(),
            })
            .await?
        {
            StoreReply::BlobWrite(write) => Ok(write),
            other => Err(unexpected(other)),
        }
    }

    async fn commit_kafka_offsets(
        &self,
        group: &str,
        offsets: Vec<KafkaOffsetCommit>,
    ) -> Result<Vec<KafkaOffsetRecord>, Error> {
        match self
            .run(StoreCommand::CommitKafkaOffsets {
                group: group.to_string(),
                offsets,
                now_ms: self.clock.now_ms(),
            })
            .await?
        {
            StoreReply::KafkaOffsets(records) => Ok(records),
            other => Err(unexpected(other)),
        }
    }

    async fn kafka_offsets(
        &self,
        group: &str,
        hub: Option<&str>,
    ) -> Result<Vec<KafkaOffsetRecord>, Error> {
        match self
            .run(StoreCommand::ListKafkaOffsets {
                group: group.to_string(),
                hub: hub.map(str::to_string),
            })
            .await?
        {
            StoreReply::KafkaOffsets(records) => Ok(records),
            other => Err(unexpected(other)),
        }
    }

    async fn list_ownership(&self, hub: &str, group: &str) -> Result<Vec<(u16, Ownership)>, Error> {
        self.ownership(StoreCommand::ListOwnership {
            hub: hub.to_string(),
            group: group.to_string(),
        })
        .await
    }

    async fn claim_ownership(
        &self,
        hub: &str,
        group: &str,
        claims: Vec<Claim>,
    ) -> Result<Vec<(u16, Ownership)>, Error> {
        self.ownership(StoreCommand::ClaimOwnership {
            hub: hub.to_string(),
            group: group.to_string(),
            claims,
            now_ms: self.clock.now_ms(),
        })
        .await
    }

    async fn update_checkpoint(
        &self,
        hub: &str,
        group: &str,
        partition: u16,
        offset: i64,
        sequence_number: i64,
        owner: Option<&str>,
    ) -> Result<Checkpoint, Error> {
        match self
            .run(StoreCommand::UpdateCheckpoint {
                hub: hub.to_string(),
                group: group.to_string(),
                partition,
                offset,
                sequence_number,
                owner: owner.map(str::to_string),
                now_ms: self.clock.now_ms(),
            })
            .await?
        {
            StoreReply::Checkpoint(checkpoint) => Ok(checkpoint),
            other => Err(unexpected(other)),
        }
    }

    async fn list_checkpoints(
        &self,
        hub: &str,
        group: &str,
    ) -> Result<Vec<(u16, Checkpoint)>, Error> {
        match self
            .run(StoreCommand::ListCheckpoints {
                hub: hub.to_string(),
                group: group.to_string(),
            })
            .await?
        {
            StoreReply::Checkpoints(records) => Ok(records),
            other => Err(unexpected(other)),
        }
    }
}
