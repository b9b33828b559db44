//! The node's hubs and their partitions: management operations and routing of sends and
//! reads to the right partition. gRPC handlers only decode, call this, and map errors.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::future::join_all;
use tributary_storage::{Durability, Mutation, Shard};
use tributary_types::limits::{
    CONSUMER_GROUPS_PER_HUB_MAX, RETENTION_DEFAULT, RETENTION_MAX, RETENTION_MIN,
};
use tributary_types::{
    Clock, DEFAULT_CONSUMER_GROUP, GroupId, HubId, NodeId, PartitionId, partition_for_key,
    validate_consumer_group_name, validate_hub_name,
};

use crate::api::error::ApiError;
use crate::catalog::{Catalog, HubRecord};
use crate::partition::Partition;
use crate::partition::state_machine::PartitionStateMachine;
use tributary_raft::{GroupHost, PeerRouter, TcpConnector};

/// Limits the broker enforces; validated once at startup.
#[derive(Debug, Clone)]
pub struct BrokerLimits {
    pub partitions_per_hub_max: u16,
    pub publish_bytes_max: usize,
}

/// Where a send goes.
#[derive(Debug, Clone)]
pub enum Target {
    Any,
    PartitionId(String),
    PartitionKey(String),
}

pub struct Hub {
    pub record: RwLock<HubRecord>,
    pub partitions: Vec<Arc<Partition>>,
    round_robin: AtomicU64,
}

impl Hub {
    pub fn record(&self) -> HubRecord {
        self.record.read().expect("hub lock poisoned").clone()
    }
}

pub struct Broker {
    host: Arc<GroupHost<PartitionStateMachine>>,
    node_addr: String,
    shards: Vec<Shard>,
    catalog: Catalog,
    clock: Arc<dyn Clock>,
    pub limits: BrokerLimits,
    hubs: RwLock<HashMap<String, Arc<Hub>>>,
    /// Management operations run one at a time.
    management: tokio::sync::Mutex<()>,
    /// Set when the node shuts down: open reader streams end so the server can drain.
    closing: tokio::sync::watch::Sender<bool>,
}

impl Broker {
    /// Opens every hub recorded in the catalog and starts its partitions.
    pub async fn open(
        node_id: NodeId,
        node_addr: String,
        shards: Vec<Shard>,
        clock: Arc<dyn Clock>,
        limits: BrokerLimits,
    ) -> anyhow::Result<Broker> {
        assert!(!shards.is_empty(), "a node has at least one storage shard");
        let catalog = Catalog::new(shards[0].clone());
        let broker = Broker {
            host: GroupHost::new(node_id, PeerRouter::new(node_id.0, TcpConnector)),
            node_addr,
            shards,
            catalog,
            clock,
            limits,
            hubs: RwLock::new(HashMap::new()),
            management: tokio::sync::Mutex::new(()),
            closing: tokio::sync::watch::channel(false).0,
        };
        for record in broker.catalog.hubs()? {
            let hub = broker.start_hub(record).await?;
            let name = hub.record().name;
            broker.hubs.write().expect("hubs lock").insert(name, hub);
        }
        Ok(broker)
    }

    fn shard_for(&self, group: GroupId) -> Shard {
        let key = u64::from(group.hub.0) + u64::from(group.partition.0);
        self.shards[(key % self.shards.len() as u64) as usize].clone()
    }

    async fn start_hub(&self, record: HubRecord) -> anyhow::Result<Arc<Hub>> {
        let opens = (0..record.partition_count).map(|p| {
            let group = GroupId::new(record.id, PartitionId(p), 0);
            Partition::open(
                &self.host,
                group,
                self.shard_for(group),
                &self.node_addr,
                self.clock.clone(),
            )
        });
        let mut partitions = Vec::new();
        for result in join_all(opens).await {
            partitions.push(Arc::new(result?));
        }
        Ok(Arc::new(Hub {
            record: RwLock::new(record),
            partitions,
            round_robin: AtomicU64::new(0),
        }))
    }

    pub fn hub(&self, name: &str) -> Result<Arc<Hub>, ApiError> {
        self.hubs
            .read()
            .expect("hubs lock")
            .get(name)
            .cloned()
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "The messaging entity '{name}' could not be found: no event hub of that name exists"
                ))
            })
    }

    pub fn hub_records(&self) -> Vec<HubRecord> {
        let mut records: Vec<_> = self
            .hubs
            .read()
            .expect("hubs lock")
            .values()
            .map(|h| h.record())
            .collect();
        records.sort_by(|a, b| a.name.cmp(&b.name));
        records
    }

    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        self.hubs
            .read()
            .expect("hubs lock")
            .values()
            .flat_map(|h| h.partitions.iter().cloned())
            .collect()
    }

    pub async fn create_hub(
        &self,
        name: &str,
        partition_count: u32,
        retention: Option<Duration>,
    ) -> Result<HubRecord, ApiError> {
        validate_hub_name(name).map_err(|e| ApiError::invalid(e.to_string()))?;
        let max = self.limits.partitions_per_hub_max;
        if partition_count == 0 || partition_count > u32::from(max) {
            return Err(ApiError::invalid(format!(
                "an event hub needs between 1 and {max} partitions; {partition_count} were requested"
            )));
        }
        let retention = retention.unwrap_or(RETENTION_DEFAULT);
        if retention < RETENTION_MIN || retention > RETENTION_MAX {
            return Err(ApiError::invalid(format!(
                "retention must be between 1h and 90d; {} was requested",
                humantime::format_duration(retention)
            )));
        }
        let _guard = self.management.lock().await;
        if self.hubs.read().expect("hubs lock").contains_key(name) {
            return Err(ApiError::already_exists(format!(
                "an event hub named '{name}' already exists"
            )));
        }
        let id = self.catalog.allocate_hub_id().await.map_err(internal)?;
        let record = HubRecord {
            id,
            name: name.to_string(),
            partition_count: partition_count as u16,
            retention_ms: retention.as_millis() as u64,
            created_at_ms: self.clock.now_ms(),
            consumer_groups: BTreeMap::from([(
                DEFAULT_CONSUMER_GROUP.to_string(),
                self.clock.now_ms(),
            )]),
        };
        // Record first: a crash after this restarts the partitions from the catalog.
        self.catalog.put_hub(&record).await.map_err(internal)?;
        let hub = self.start_hub(record.clone()).await.map_err(internal)?;
        self.hubs
            .write()
            .expect("hubs lock")
            .insert(name.to_string(), hub);
        tracing::info!(hub = name, id = %id, partitions = partition_count, "event hub created");
        Ok(record)
    }

    pub async fn delete_hub(&self, name: &str) -> Result<(), ApiError> {
        let _guard = self.management.lock().await;
        let hub = self.hub(name)?;
        self.catalog.delete_hub(name).await.map_err(internal)?;
        self.hubs.write().expect("hubs lock").remove(name);
        for partition in &hub.partitions {
            self.host.stop(partition.group).await;
            self.shard_for(partition.group)
                .write(
                    vec![Mutation::DeleteGroup {
                        group: partition.group,
                    }],
                    Durability::Immediate,
                )
                .await
                .map_err(internal)?;
        }
        tracing::info!(hub = name, "event hub deleted");
        Ok(())
    }

    pub async fn create_consumer_group(&self, hub_name: &str, name: &str) -> Result<i64, ApiError> {
        validate_consumer_group_name(name).map_err(|e| ApiError::invalid(e.to_string()))?;
        let _guard = self.management.lock().await;
        let hub = self.hub(hub_name)?;
        let mut record = hub.record();
        if record.consumer_groups.contains_key(name) {
            return Err(ApiError::already_exists(format!(
                "consumer group '{name}' already exists in event hub '{hub_name}'"
            )));
        }
        if record.consumer_groups.len() >= CONSUMER_GROUPS_PER_HUB_MAX {
            return Err(ApiError::new(
                tributary_proto::ErrorReason::QuotaExceeded,
                format!(
                    "event hub '{hub_name}' already has the maximum of {CONSUMER_GROUPS_PER_HUB_MAX} consumer groups"
                ),
            ));
        }
        let created = self.clock.now_ms();
        record.consumer_groups.insert(name.to_string(), created);
        self.catalog.put_hub(&record).await.map_err(internal)?;
        *hub.record.write().expect("hub lock") = record;
        Ok(created)
    }

    pub async fn delete_consumer_group(&self, hub_name: &str, name: &str) -> Result<(), ApiError> {
        if name == DEFAULT_CONSUMER_GROUP {
            return Err(ApiError::invalid(
                "the $Default consumer group always exists and cannot be deleted",
            ));
        }
        let _guard = self.management.lock().await;
        let hub = self.hub(hub_name)?;
        let mut record = hub.record();
        if record.consumer_groups.remove(name).is_none() {
            return Err(group_not_found(hub_name, name));
        }
        self.catalog.put_hub(&record).await.map_err(internal)?;
        *hub.record.write().expect("hub lock") = record;
        Ok(())
    }

    /// The partition a send goes to.
    pub fn route(&self, hub: &Hub, target: &Target) -> Result<Arc<Partition>, ApiError> {
        let count = hub.partitions.len() as u16;
        let index = match target {
            Target::Any => {
                (hub.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(count)) as u16
            }
            Target::PartitionKey(key) => partition_for_key(key, count),
            Target::PartitionId(id) => return self.partition(hub, id),
        };
        Ok(hub.partitions[usize::from(index)].clone())
    }

    pub fn partition(&self, hub: &Hub, partition_id: &str) -> Result<Arc<Partition>, ApiError> {
        let count = hub.partitions.len();
        partition_id
            .parse::<usize>()
            .ok()
            .filter(|p| *p < count && partition_id == p.to_string())
            .map(|p| hub.partitions[p].clone())
            .ok_or_else(|| {
                ApiError::not_found(format!(
                    "partition '{partition_id}' does not exist in event hub '{}'; valid partition ids are 0 to {}",
                    hub.record().name,
                    count - 1
                ))
            })
    }

    pub fn check_consumer_group(&self, hub: &Hub, name: &str) -> Result<(), ApiError> {
        let record = hub.record();
        if record.consumer_groups.contains_key(name) {
            Ok(())
        } else {
            Err(group_not_found(&record.name, name))
        }
    }

    /// Ends every open reader stream (they never end on their own).
    pub fn close_readers(&self) {
        self.closing.send_replace(true);
    }

    /// Becomes true when reader streams must end.
    pub fn closing(&self) -> tokio::sync::watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Stops every partition's Raft group.
    pub async fn shutdown(&self) {
        self.host.stop_all().await;
    }

    pub fn hub_id_of(&self, name: &str) -> Option<HubId> {
        self.hub(name).ok().map(|h| h.record().id)
    }
}

fn group_not_found(hub: &str, name: &str) -> ApiError {
    ApiError::not_found(format!(
        "consumer group '{name}' does not exist in event hub '{hub}'"
    ))
}

fn internal(err: impl std::fmt::Display) -> ApiError {
    ApiError::internal(err.to_string())
}
