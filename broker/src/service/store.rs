//! The checkpoint store: consumer-group ownership and checkpoints (SPEC.md section 4), for
//! processors. Every call needs Listen on the hub.

use tributary_types::Rights;

use super::{Service, consumer_group};
use crate::auth::{Credential, Scope};
use crate::error::Error;

pub use tributary_controller::store::{Checkpoint, Claim, Ownership};

/// A claim as front ends receive it: the partition id as text.
#[derive(Debug, Clone, Default)]
pub struct ClaimRequest {
    pub partition_id: String,
    pub owner_id: String,
    /// `None`: claim only if nobody ever owned the partition.
    pub etag: Option<String>,
}

/// A checkpoint as front ends receive it: the partition id and offset as text (as events
/// carry them).
#[derive(Debug, Clone, Default)]
pub struct CheckpointUpdate {
    pub partition_id: String,
    pub offset: String,
    pub sequence_number: i64,
}

impl Service {
    /// Every ownership record of a consumer group (empty: `$Default`), by partition index.
    pub async fn list_ownership(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
    ) -> Result<Vec<(u16, Ownership)>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        self.store.list_ownership(hub, consumer_group(group)).await
    }

    /// Claims partitions, each a compare-and-set on its etag; returns the claims won.
    pub async fn claim_ownership(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
        claims: Vec<ClaimRequest>,
    ) -> Result<Vec<(u16, Ownership)>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        let claims = claims
            .into_iter()
            .map(|c| {
                Ok(Claim {
                    partition: partition_index(&c.partition_id)?,
                    owner_id: c.owner_id,
                    etag: c.etag,
                })
            })
            .collect::<Result<Vec<Claim>, Error>>()?;
        self.store
            .claim_ownership(hub, consumer_group(group), claims)
            .await
    }

    /// Stores a checkpoint; with `owner`, only while that instance owns the partition.
    /// Returns the partition's index and the stored record.
    pub async fn update_checkpoint(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
        update: CheckpointUpdate,
        owner: Option<&str>,
    ) -> Result<(u16, Checkpoint), Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        let partition = partition_index(&update.partition_id)?;
        let offset = update.offset.parse::<i64>().map_err(|_| {
            Error::invalid(format!(
                "offset '{}' is not an offset: offsets are decimal integers, as events carry them",
                update.offset
            ))
        })?;
        let stored = self
            .store
            .update_checkpoint(
                hub,
                consumer_group(group),
                partition,
                offset,
                update.sequence_number,
                owner,
            )
            .await?;
        Ok((partition, stored))
    }

    /// Every checkpoint of a consumer group, by partition index.
    pub async fn list_checkpoints(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
    ) -> Result<Vec<(u16, Checkpoint)>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        let mut checkpoints = self
            .store
            .list_checkpoints(hub, consumer_group(group))
            .await?;
        // A checkpoint written through the Blob API without a sequence number names no
        // position this API can start from.
        checkpoints.retain(|(_, c)| c.sequence_number >= 0);
        Ok(checkpoints)
    }
}

/// A partition id as the checkpoint store writes it: the partition's index in decimal.
fn partition_index(partition_id: &str) -> Result<u16, Error> {
    partition_id
        .parse::<u16>()
        .ok()
        .filter(|p| p.to_string() == partition_id)
        .ok_or_else(|| {
            Error::invalid(format!(
                "partition id '{partition_id}' is not a partition id: ids are 0, 1, 2, ... up to the hub's partition count minus one"
            ))
        })
}
