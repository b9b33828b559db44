//! The checkpoint store: consumer-group partition ownership and checkpoints (SPEC.md
//! section 4). [`ClusterCheckpointStore`] uses the one the cluster hosts;
//! [`InMemoryCheckpointStore`] keeps records in this process (tests, single instances).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;

use tributary_proto::v1 as proto;
use tributary_proto::v1::checkpoint_store_client::CheckpointStoreClient as StoreStub;

use crate::client::require_name;
use crate::routing::Routing;
use crate::{Client, ClientError};

/// Which processor instance owns a partition in a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ownership {
    pub partition_id: String,
    /// Empty: released, free to claim.
    pub owner_id: String,
    /// The store's time of the last claim, in milliseconds since the Unix epoch.
    pub last_modified_ms: i64,
    /// Changes with every claim; a claim names the etag it last saw.
    pub etag: String,
}

/// Where a consumer group has got to in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    pub offset: i64,
    pub sequence_number: i64,
    pub last_modified_ms: i64,
}

/// A claim on a partition: `etag` is that of the record last seen (`None` when the
/// partition had no record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub partition_id: String,
    pub owner_id: String,
    pub etag: Option<String>,
}

/// Ownership and checkpoints of consumer groups, as the event processor needs them.
#[tonic::async_trait]
pub trait CheckpointStore: Send + Sync {
    async fn list_ownership(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, ClientError>;

    /// Each claim succeeds only if its etag is the record's current one; returns the claims
    /// won (a lost claim is no error).
    async fn claim_ownership(
        &self,
        event_hub: &str,
        consumer_group: &str,
        claims: Vec<Claim>,
    ) -> Result<Vec<Ownership>, ClientError>;

    /// With `owner_id`, the update applies only while the partition's ownership record
    /// names that owner ([`crate::ErrorReason::NotOwner`] otherwise), so an instance that
    /// lost a partition cannot move its checkpoint back.
    async fn update_checkpoint(
        &self,
        event_hub: &str,
        consumer_group: &str,
        partition_id: &str,
        offset: i64,
        sequence_number: i64,
        owner_id: Option<&str>,
    ) -> Result<Checkpoint, ClientError>;

    /// Checkpoints by partition id.
    async fn list_checkpoints(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<BTreeMap<String, Checkpoint>, ClientError>;
}

/// The checkpoint store hosted by the cluster (replicated in its controller). Transient
/// failures (a controller leader change, a node restarting) are retried until the client's
/// retry deadline. A claim retried after a lost reply may come back lost although it was
/// won; the next listing shows the record as this owner's.
#[derive(Debug, Clone)]
pub struct ClusterCheckpointStore {
    routing: Routing,
}

impl ClusterCheckpointStore {
    pub fn new(client: &Client) -> Self {
        ClusterCheckpointStore {
            routing: client.routing.clone(),
        }
    }

    /// Runs one store call with the client's retries of transient failures.
    async fn call<Req, Resp, F, Fut>(&self, request: Req, method: F) -> Result<Resp, ClientError>
    where
        Req: Clone,
        F: Fn(StoreStub<crate::routing::Channel>, Req) -> Fut,
        Fut: Future<Output = Result<tonic::Response<Resp>, tonic::Status>>,
    {
        self.routing
            .call(None, |channel, endpoint| {
                let call = method(StoreStub::new(channel), request.clone());
                async move {
                    call.await
                        .map(tonic::Response::into_inner)
                        .map_err(|s| ClientError::from_status(s, &endpoint))
                }
            })
            .await
    }
}

impl ClusterCheckpointStore {
    /// A Kafka consumer group's committed offsets in `event_hub` (Kafka groups are their
    /// own namespace, apart from the hub's consumer groups).
    pub async fn list_kafka_offsets(
        &self,
        event_hub: &str,
        kafka_group: &str,
    ) -> Result<Vec<proto::KafkaOffset>, ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("Kafka group id", kafka_group)?;
        let request = proto::ListKafkaOffsetsRequest {
            event_hub: event_hub.to_owned(),
            kafka_group: kafka_group.to_owned(),
        };
        let response = self
            .call(request, |mut stub, request| async move {
                stub.list_kafka_offsets(request).await
            })
            .await?;
        Ok(response.offsets)
    }
}

fn ownership_from(record: proto::Ownership) -> Ownership {
    Ownership {
        partition_id: record.partition_id,
        owner_id: record.owner_id,
        last_modified_ms: record.last_modified_ms,
        etag: record.etag,
    }
}

fn checkpoint_from(record: &proto::Checkpoint) -> Result<Checkpoint, ClientError> {
    Ok(Checkpoint {
        offset: record.offset.parse().map_err(|_| {
            ClientError::InvalidArgument(format!(
                "the store returned offset '{}', not an integer",
                record.offset
            ))
        })?,
        sequence_number: record.sequence_number,
        last_modified_ms: record.last_modified_ms,
    })
}

#[tonic::async_trait]
impl CheckpointStore for ClusterCheckpointStore {
    async fn list_ownership(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, ClientError> {
        require_name("event hub name", event_hub)?;
        let request = proto::ListOwnershipRequest {
            event_hub: event_hub.to_owned(),
            consumer_group: consumer_group.to_owned(),
        };
        let response = self
            .call(request, |mut stub, request| async move {
                stub.list_ownership(request).await
            })
            .await?;
        Ok(response.ownership.into_iter().map(ownership_from).collect())
    }

    async fn claim_ownership(
        &self,
        event_hub: &str,
        consumer_group: &str,
        claims: Vec<Claim>,
    ) -> Result<Vec<Ownership>, ClientError> {
        require_name("event hub name", event_hub)?;
        let request = proto::ClaimOwnershipRequest {
            event_hub: event_hub.to_owned(),
            consumer_group: consumer_group.to_owned(),
            claims: claims
                .into_iter()
                .map(|c| proto::Ownership {
                    partition_id: c.partition_id,
                    owner_id: c.owner_id,
                    last_modified_ms: 0,
                    etag: c.etag.unwrap_or_default(),
                })
                .collect(),
        };
        let response = self
            .call(request, |mut stub, request| async move {
                stub.claim_ownership(request).await
            })
            .await?;
        Ok(response.claimed.into_iter().map(ownership_from).collect())
    }

    async fn update_checkpoint(
        &self,
        event_hub: &str,
        consumer_group: &str,
        partition_id: &str,
        offset: i64,
        sequence_number: i64,
        owner_id: Option<&str>,
    ) -> Result<Checkpoint, ClientError> {
        require_name("event hub name", event_hub)?;
        let request = proto::UpdateCheckpointRequest {
            event_hub: event_hub.to_owned(),
            consumer_group: consumer_group.to_owned(),
            checkpoint: Some(proto::Checkpoint {
                partition_id: partition_id.to_owned(),
                offset: offset.to_string(),
                sequence_number,
                last_modified_ms: 0,
            }),
            owner_id: owner_id.unwrap_or_default().to_owned(),
        };
        let response = self
            .call(request, |mut stub, request| async move {
                stub.update_checkpoint(request).await
            })
            .await?;
        checkpoint_from(&response)
    }

    async fn list_checkpoints(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<BTreeMap<String, Checkpoint>, ClientError> {
        require_name("event hub name", event_hub)?;
        let request = proto::ListCheckpointsRequest {
            event_hub: event_hub.to_owned(),
            consumer_group: consumer_group.to_owned(),
        };
        let response = self
            .call(request, |mut stub, request| async move {
                stub.list_checkpoints(request).await
            })
            .await?;
        response
            .checkpoints
            .iter()
            .map(|c| Ok((c.partition_id.clone(), checkpoint_from(c)?)))
            .collect()
    }
}

/// Records kept in this process: one application instance, or tests. Same semantics as the
/// cluster's store; times from this machine's clock, never going back.
#[derive(Debug, Default)]
pub struct InMemoryCheckpointStore {
    inner: Mutex<Memory>,
}

#[derive(Debug, Default)]
struct Memory {
    /// (hub, group, partition id) → record.
    ownership: BTreeMap<(String, String, String), Ownership>,
    checkpoints: BTreeMap<(String, String, String), Checkpoint>,
    clock_ms: i64,
    next_etag: u64,
}

impl Memory {
    fn tick(&mut self) -> i64 {
        self.clock_ms = self.clock_ms.max(crate::time::now_ms());
        self.clock_ms
    }
}

impl InMemoryCheckpointStore {
    pub fn new() -> Self {
        Self::default()
    }
}

#[tonic::async_trait]
impl CheckpointStore for InMemoryCheckpointStore {
    async fn list_ownership(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<Vec<Ownership>, ClientError> {
        let memory = self.inner.lock().expect("store lock");
        Ok(memory
            .ownership
            .iter()
            .filter(|((h, g, _), _)| h == event_hub && g == consumer_group)
            .map(|(_, o)| o.clone())
            .collect())
    }

    async fn claim_ownership(
        &self,
        event_hub: &str,
        consumer_group: &str,
        claims: Vec<Claim>,
    ) -> Result<Vec<Ownership>, ClientError> {
        let mut memory = self.inner.lock().expect("store lock");
        let now = memory.tick();
        let mut won = Vec::new();
        for claim in claims {
            let key = (
                event_hub.to_owned(),
                consumer_group.to_owned(),
                claim.partition_id.clone(),
            );
            if memory.ownership.get(&key).map(|o| o.etag.as_str()) != claim.etag.as_deref() {
                continue;
            }
            memory.next_etag += 1;
            let record = Ownership {
                partition_id: claim.partition_id,
                owner_id: claim.owner_id,
                last_modified_ms: now,
                etag: format!("{:016x}", memory.next_etag),
            };
            memory.ownership.insert(key, record.clone());
            won.push(record);
        }
        Ok(won)
    }

    async fn update_checkpoint(
        &self,
        event_hub: &str,
        consumer_group: &str,
        partition_id: &str,
        offset: i64,
        sequence_number: i64,
        owner_id: Option<&str>,
    ) -> Result<Checkpoint, ClientError> {
        let mut memory = self.inner.lock().expect("store lock");
        let key = (
            event_hub.to_owned(),
            consumer_group.to_owned(),
            partition_id.to_owned(),
        );
        if let Some(owner) = owner_id {
            let current = memory
                .ownership
                .get(&key)
                .map_or("", |o| o.owner_id.as_str());
            if current != owner {
                return Err(ClientError::Service {
                    reason: crate::ErrorReason::NotOwner,
                    code: tonic::Code::FailedPrecondition,
                    message: format!(
                        "checkpoint refused: partition {partition_id} is owned by '{current}', not '{owner}'"
                    ),
                    retry_after: None,
                    leader_hint: None,
                });
            }
        }
        let checkpoint = Checkpoint {
            offset,
            sequence_number,
            last_modified_ms: memory.tick(),
        };
        memory.checkpoints.insert(key, checkpoint);
        Ok(checkpoint)
    }

    async fn list_checkpoints(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<BTreeMap<String, Checkpoint>, ClientError> {
        let memory = self.inner.lock().expect("store lock");
        Ok(memory
            .checkpoints
            .iter()
            .filter(|((h, g, _), _)| h == event_hub && g == consumer_group)
            .map(|((_, _, p), c)| (p.clone(), *c))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(partition: &str, owner: &str, etag: Option<&str>) -> Claim {
        Claim {
            partition_id: partition.into(),
            owner_id: owner.into(),
            etag: etag.map(str::to_owned),
        }
    }

    #[tokio::test]
    async fn in_memory_claims_are_compare_and_set() {
        let store = InMemoryCheckpointStore::new();
        let won = store
            .claim_ownership("h", "g", vec![claim("0", "a", None)])
            .await
            .unwrap();
        let etag = won[0].etag.clone();
        let lost = store
            .claim_ownership("h", "g", vec![claim("0", "b", None)])
            .await
            .unwrap();
        assert!(lost.is_empty());
        let won = store
            .claim_ownership("h", "g", vec![claim("0", "b", Some(&etag))])
            .await
            .unwrap();
        assert_eq!(won[0].owner_id, "b");
        let stale = store
            .claim_ownership("h", "g", vec![claim("0", "a", Some(&etag))])
            .await
            .unwrap();
        assert!(stale.is_empty());
        let listed = store.list_ownership("h", "g").await.unwrap();
        assert_eq!(listed, won);
        assert!(store.list_ownership("h", "other").await.unwrap().is_empty());
    }
}
