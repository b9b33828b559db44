//! The node's record of event hubs and consumer groups, kept in the first storage shard.
//! (The replication issue moves this into the controller group.)

use std::collections::BTreeMap;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tributary_storage::{Durability, Mutation, Shard, StorageError};
use tributary_types::HubId;

const HUB_PREFIX: &str = "hub/";
const NEXT_HUB_ID_KEY: &str = "next_hub_id";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubRecord {
    pub id: HubId,
    pub name: String,
    pub partition_count: u16,
    pub retention_ms: u64,
    pub created_at_ms: i64,
    /// Consumer group name → created time. `$Default` is always present.
    pub consumer_groups: BTreeMap<String, i64>,
}

#[derive(Debug, Clone)]
pub struct Catalog {
    shard: Shard,
}

fn corrupt(err: postcard::Error) -> StorageError {
    StorageError::Corrupt(err.to_string())
}

impl Catalog {
    pub fn new(shard: Shard) -> Self {
        Self { shard }
    }

    pub fn hubs(&self) -> Result<Vec<HubRecord>, StorageError> {
        self.shard
            .catalog_scan(HUB_PREFIX)?
            .into_iter()
            .map(|(_, bytes)| postcard::from_bytes(&bytes).map_err(corrupt))
            .collect()
    }

    /// Hub ids are never reused, so a re-created hub's groups never meet an old one's state.
    pub async fn allocate_hub_id(&self) -> Result<HubId, StorageError> {
        let next = match self.shard.catalog_get(NEXT_HUB_ID_KEY)? {
            Some(bytes) => postcard::from_bytes::<u32>(&bytes).map_err(corrupt)?,
            None => 1,
        };
        self.shard
            .write(
                vec![Mutation::PutCatalog {
                    key: NEXT_HUB_ID_KEY.into(),
                    value: Bytes::from(postcard::to_allocvec(&(next + 1)).map_err(corrupt)?),
                }],
                Durability::Immediate,
            )
            .await?;
        Ok(HubId(next))
    }

    pub async fn put_hub(&self, hub: &HubRecord) -> Result<(), StorageError> {
        self.shard
            .write(
                vec![Mutation::PutCatalog {
                    key: format!("{HUB_PREFIX}{}", hub.name),
                    value: Bytes::from(postcard::to_allocvec(hub).map_err(corrupt)?),
                }],
                Durability::Immediate,
            )
            .await
    }

    pub async fn delete_hub(&self, name: &str) -> Result<(), StorageError> {
        self.shard
            .write(
                vec![Mutation::DeleteCatalog {
                    key: format!("{HUB_PREFIX}{name}"),
                }],
                Durability::Immediate,
            )
            .await
    }
}
