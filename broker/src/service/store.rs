//! The checkpoint store: consumer-group ownership and checkpoints (SPEC.md section 4), for
//! processors. Every call needs Listen on the hub.

use tributary_types::Rights;

use super::{Service, consumer_group};
use crate::auth::{Credential, Scope};
use crate::error::Error;

pub use tributary_controller::store::{Checkpoint, Claim, Ownership};

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
        claims: Vec<Claim>,
    ) -> Result<Vec<(u16, Ownership)>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        self.store
            .claim_ownership(hub, consumer_group(group), claims)
            .await
    }

    /// Stores a checkpoint; with `owner`, only while that instance owns the partition.
    #[allow(clippy::too_many_arguments)]
    pub async fn update_checkpoint(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
        partition: u16,
        offset: i64,
        sequence_number: i64,
        owner: Option<&str>,
    ) -> Result<Checkpoint, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        self.store
            .update_checkpoint(
                hub,
                consumer_group(group),
                partition,
                offset,
                sequence_number,
                owner,
            )
            .await
    }

    /// Every checkpoint of a consumer group, by partition index.
    pub async fn list_checkpoints(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
    ) -> Result<Vec<(u16, Checkpoint)>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        self.store
            .list_checkpoints(hub, consumer_group(group))
            .await
    }
}
