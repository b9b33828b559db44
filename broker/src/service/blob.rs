//! The checkpoint store as blobs, for the Blob checkpoint endpoint (the Azure SDKs'
//! `BlobCheckpointStore`): the same ownership records and checkpoints as `store.rs`, with
//! their metadata, ETags and Azure's write conditions. Every call needs Listen on the hub,
//! except [`Service::authenticated`] (container calls, which touch no hub).

use tributary_types::Rights;

use super::Service;
use crate::auth::{Credential, Scope};
use crate::error::Error;

pub use tributary_controller::store::{
    BLOB_METADATA_BYTES_MAX, BlobCondition, BlobKind, BlobPut, BlobView, BlobWrite,
};

/// The first cluster feature level whose nodes all know the Blob store commands.
const BLOB_FEATURE_LEVEL: u32 = 2;

impl Service {
    /// Passes when the credential is valid for some rule of the cluster, whatever it
    /// grants (or authorization is off).
    pub fn authenticated(&self, credential: &Credential) -> Result<(), Error> {
        self.auth.authenticated(credential)
    }

    /// Every record of a consumer group as blobs.
    pub async fn list_blobs(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
    ) -> Result<Vec<BlobView>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        self.blob_level()?;
        self.store.list_blobs(hub, group).await
    }

    /// Writes a record's metadata under the request's condition.
    pub async fn put_blob(
        &self,
        credential: &Credential,
        hub: &str,
        group: &str,
        put: BlobPut,
    ) -> Result<BlobWrite, Error> {
        self.check(credential, Scope::Hub(hub), Rights::LISTEN)?;
        self.blob_level()?;
        self.store.put_blob(hub, group, put).await
    }

    fn blob_level(&self) -> Result<(), Error> {
        let feature = self.broker.runtime().state().feature.clone();
        if feature.level < BLOB_FEATURE_LEVEL {
            return Err(Error::unavailable(format!(
                "the Blob checkpoint endpoint needs cluster feature level {BLOB_FEATURE_LEVEL}; \
                 this cluster runs level {} (release {}): upgrade every node, and the level \
                 rises by itself",
                feature.level, feature.release
            )));
        }
        Ok(())
    }
}
