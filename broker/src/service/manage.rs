//! Management: event hubs, consumer groups, nodes, placement and the cluster's status.
//! Changes are controller commands; each call waits (bounded) until this node's view shows
//! its effect, so the caller's next call here sees it.

use std::time::Duration;

use tributary_controller::state::{
    CAPTURE_WINDOW_DEFAULT_BYTES, CAPTURE_WINDOW_DEFAULT_MS, CaptureSettings, CleanupPolicy,
    Command, HubRecord, HubSettings, HubUpdate, NewHub, Reply,
};
use tributary_types::{NodeId, PartitionId, Rights};

use super::Service;
use crate::auth::{Credential, Scope};
use crate::capture::parse_destination;
use crate::error::Error;
use crate::status::ClusterStatus;

/// Capture as a request asks for it: zeros and empty strings take the defaults.
#[derive(Debug, Clone, Default)]
pub struct CaptureRequest {
    /// As people write it: `file:///dir`, `/dir` or `s3://bucket/prefix?region=...`.
    pub destination: String,
    pub window_ms: u64,
    pub window_bytes: u64,
    /// Empty: the cluster id.
    pub namespace: String,
}

/// A new hub's settings; zeros take the defaults.
#[derive(Debug, Clone, Default)]
pub struct HubSettingsRequest {
    pub cleanup_policy: CleanupPolicy,
    pub tombstone_retention_ms: u64,
    pub compaction_lag_ms: u64,
    pub retention_bytes_max: u64,
    pub capture: Option<CaptureRequest>,
}

/// A hub to create.
#[derive(Debug, Clone, Default)]
pub struct NewHubRequest {
    pub name: String,
    pub partition_count: u32,
    /// `None`: the default retention.
    pub retention: Option<Duration>,
    /// `None`: the cluster's default.
    pub replication_factor: Option<u8>,
    pub throughput_units: u32,
    pub settings: HubSettingsRequest,
}

/// Changes to a hub; `None` leaves a setting as it is.
#[derive(Debug, Clone, Default)]
pub struct HubUpdateRequest {
    pub name: String,
    pub throughput_units: Option<u32>,
    pub retention_ms: Option<u64>,
    pub cleanup_policy: Option<CleanupPolicy>,
    pub tombstone_retention_ms: Option<u64>,
    pub compaction_lag_ms: Option<u64>,
    pub retention_bytes_max: Option<u64>,
    /// `Some(None)` turns capture off.
    pub capture: Option<Option<CaptureRequest>>,
}

/// A move the placement controller would make.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PlannedMove {
    Replica {
        hub: String,
        partition: PartitionId,
        /// `None`: a replica added where one is missing.
        from: Option<NodeId>,
        to: NodeId,
    },
    Leader {
        hub: String,
        partition: PartitionId,
        from: NodeId,
        to: NodeId,
    },
}

/// What a rebalance would do now, and the nodes it counts as down.
#[derive(Debug, Clone, Default)]
pub struct RebalancePlan {
    pub moves: Vec<PlannedMove>,
    pub down_nodes: Vec<NodeId>,
}

impl Service {
    /// Creates a hub; its replicas go to nodes that are up now. Needs Manage on the
    /// namespace.
    pub async fn create_hub(
        &self,
        credential: &Credential,
        request: NewHubRequest,
    ) -> Result<HubRecord, Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        let broker = &self.broker;
        let retention = request
            .retention
            .unwrap_or(tributary_types::limits::RETENTION_DEFAULT);
        self.check_retention(retention)?;
        let settings = self.hub_settings(request.settings)?;
        // Replicas go to nodes that are up now; a replication factor above their number
        // is refused.
        let down_nodes = crate::status::down_nodes(broker.runtime()).await;
        let reply = broker
            .runtime()
            .propose(Command::CreateHub(NewHub {
                name: request.name.clone(),
                partition_count: request.partition_count,
                retention_ms: retention.as_millis() as u64,
                replication_factor: request.replication_factor,
                partitions_max: broker.limits.partitions_per_hub_max,
                now_ms: broker.now_ms(),
                down_nodes,
                throughput_units: request.throughput_units,
                settings,
            }))
            .await?;
        let Reply::Hub(record) = reply else {
            return Err(Error::internal("create hub returned no hub"));
        };
        let (name, id) = (&request.name, record.id);
        broker
            .await_view(|s| s.hubs.get(name).is_some_and(|h| h.id == id))
            .await;
        broker.await_local_replicas(&record).await;
        tracing::info!(hub = %name, id = %id, partitions = request.partition_count, "event hub created");
        Ok(record)
    }

    /// Changes a hub's settings (throughput units, retention, cleanup, capture); each
    /// applies at once. Needs Manage on the hub.
    pub async fn update_hub(
        &self,
        credential: &Credential,
        request: HubUpdateRequest,
    ) -> Result<HubRecord, Error> {
        self.check(credential, Scope::Hub(&request.name), Rights::MANAGE)?;
        let name = request.name.clone();
        self.broker.hub(&name)?;
        if let Some(retention_ms) = request.retention_ms {
            self.check_retention(Duration::from_millis(retention_ms))?;
        }
        let update = HubUpdate {
            capture: request
                .capture
                .map(|capture| capture.map(|c| self.capture_settings(c)).transpose())
                .transpose()?,
            throughput_units: request.throughput_units,
            retention_ms: request.retention_ms,
            cleanup_policy: request.cleanup_policy,
            tombstone_retention_ms: request.tombstone_retention_ms,
            compaction_lag_ms: request.compaction_lag_ms,
            retention_bytes_max: request.retention_bytes_max,
        };
        let reply = self
            .broker
            .runtime()
            .propose(Command::UpdateHub {
                hub: name.clone(),
                update,
            })
            .await?;
        let Reply::Hub(record) = reply else {
            return Err(Error::internal("update hub returned no hub"));
        };
        self.broker
            .await_view(|s| s.hubs.get(&name) == Some(&record))
            .await;
        Ok(record)
    }

    /// A hub's record. Needs any valid credential for the hub.
    pub fn get_hub(&self, credential: &Credential, name: &str) -> Result<HubRecord, Error> {
        self.check(credential, Scope::Hub(name), Rights::NONE)?;
        self.broker.hub(name)
    }

    /// Every hub. Needs Manage on the namespace.
    pub fn list_hubs(&self, credential: &Credential) -> Result<Vec<HubRecord>, Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        Ok(self.broker.hub_records())
    }

    /// Deletes a hub with its events, consumer groups and checkpoints. Needs Manage on the
    /// hub.
    pub async fn delete_hub(&self, credential: &Credential, name: &str) -> Result<(), Error> {
        self.check(credential, Scope::Hub(name), Rights::MANAGE)?;
        self.broker
            .runtime()
            .propose(Command::DeleteHub {
                name: name.to_string(),
            })
            .await?;
        self.broker.await_view(|s| !s.hubs.contains_key(name)).await;
        tracing::info!(hub = name, "event hub deleted");
        Ok(())
    }

    /// Creates a consumer group; returns its creation time. Needs Manage on the hub.
    pub async fn create_consumer_group(
        &self,
        credential: &Credential,
        hub: &str,
        name: &str,
    ) -> Result<i64, Error> {
        self.check(credential, Scope::Hub(hub), Rights::MANAGE)?;
        let reply = self
            .broker
            .runtime()
            .propose(Command::CreateConsumerGroup {
                hub: hub.to_string(),
                name: name.to_string(),
                now_ms: self.broker.now_ms(),
            })
            .await?;
        self.broker
            .await_view(|s| {
                s.hubs
                    .get(hub)
                    .is_some_and(|h| h.consumer_groups.contains_key(name))
            })
            .await;
        match reply {
            Reply::ConsumerGroupCreated { created_at_ms } => Ok(created_at_ms),
            _ => Err(Error::internal("create consumer group returned no time")),
        }
    }

    /// A hub's consumer groups with their creation times (`$Default` is implicit). Needs
    /// Manage on the hub.
    pub fn list_consumer_groups(
        &self,
        credential: &Credential,
        hub: &str,
    ) -> Result<Vec<(String, i64)>, Error> {
        self.check(credential, Scope::Hub(hub), Rights::MANAGE)?;
        let record = self.broker.hub(hub)?;
        Ok(record.consumer_groups.into_iter().collect())
    }

    /// Deletes a consumer group with its checkpoints. Needs Manage on the hub.
    pub async fn delete_consumer_group(
        &self,
        credential: &Credential,
        hub: &str,
        name: &str,
    ) -> Result<(), Error> {
        self.check(credential, Scope::Hub(hub), Rights::MANAGE)?;
        self.broker
            .runtime()
            .propose(Command::DeleteConsumerGroup {
                hub: hub.to_string(),
                name: name.to_string(),
            })
            .await?;
        self.broker
            .await_view(|s| {
                s.hubs
                    .get(hub)
                    .is_some_and(|h| !h.consumer_groups.contains_key(name))
            })
            .await;
        Ok(())
    }

    /// Drains a node (its leaderships move away) or lets leaders return to it. Needs Manage
    /// on the namespace.
    pub async fn drain_node(
        &self,
        credential: &Credential,
        node: NodeId,
        drain: bool,
    ) -> Result<(), Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        self.broker.set_draining(node.0, drain).await
    }

    /// Decommissions a node (the placement controller moves its replicas away), or stops
    /// doing so. Needs Manage on the namespace.
    pub async fn decommission_node(
        &self,
        credential: &Credential,
        node: NodeId,
        decommissioning: bool,
    ) -> Result<(), Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        let node = node.0;
        self.broker
            .runtime()
            .propose(Command::SetDecommissioning {
                node,
                decommissioning,
            })
            .await?;
        self.broker
            .await_view(|s| {
                s.nodes
                    .get(&node)
                    .is_some_and(|n| n.decommissioning == decommissioning)
            })
            .await;
        Ok(())
    }

    /// What the placement controller would move now, planned on this node from fresh
    /// reports. Needs Manage on the namespace.
    pub async fn plan_rebalance(&self, credential: &Credential) -> Result<RebalancePlan, Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        let (decision, down_nodes) = self.placement.dry_run().await;
        let state = self.broker.runtime().state();
        let mut moves: Vec<PlannedMove> = decision
            .moves
            .iter()
            .map(|m| PlannedMove::Replica {
                hub: state.hub_name(m.hub),
                partition: PartitionId(m.partition),
                from: m.from.map(NodeId),
                to: NodeId(m.to),
            })
            .collect();
        moves.extend(decision.leaders.iter().map(|(hub, partition, to)| {
            let from = state
                .replicas_of(*hub, *partition)
                .and_then(|r| r.first().copied())
                .unwrap_or(0);
            PlannedMove::Leader {
                hub: state.hub_name(*hub),
                partition: PartitionId(*partition),
                from: NodeId(from),
                to: NodeId(*to),
            }
        }));
        Ok(RebalancePlan {
            moves,
            down_nodes: down_nodes.into_iter().map(NodeId).collect(),
        })
    }

    /// Nodes, the controller leader and every partition's leader and replicas, from every
    /// node's report. Needs Manage on the namespace.
    pub async fn cluster_status(&self, credential: &Credential) -> Result<ClusterStatus, Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        Ok(crate::status::cluster_status(&self.broker).await)
    }

    /// Refuses a retention outside the operator's floor and the longest one allowed.
    fn check_retention(&self, retention: Duration) -> Result<(), Error> {
        let min = self.broker.limits.retention_min;
        let max = tributary_types::limits::RETENTION_MAX;
        if retention < min || retention > max {
            return Err(Error::invalid(format!(
                "retention must be between {} and 90d; {} was requested",
                humantime::format_duration(min),
                humantime::format_duration(retention)
            )));
        }
        Ok(())
    }

    /// A new hub's settings: defaults where the request leaves them 0.
    fn hub_settings(&self, request: HubSettingsRequest) -> Result<HubSettings, Error> {
        let defaults = HubSettings::default();
        Ok(HubSettings {
            cleanup_policy: request.cleanup_policy,
            tombstone_retention_ms: match request.tombstone_retention_ms {
                0 => defaults.tombstone_retention_ms,
                ms => ms,
            },
            compaction_lag_ms: request.compaction_lag_ms,
            retention_bytes_max: request.retention_bytes_max,
            capture: request
                .capture
                .map(|capture| self.capture_settings(capture))
                .transpose()?,
        })
    }

    /// What a request's capture settings ask for: defaults where it leaves them unset, the
    /// cluster id as the namespace when it names none, and now as the time capture is
    /// enabled. The controller checks the ranges.
    fn capture_settings(&self, capture: CaptureRequest) -> Result<CaptureSettings, Error> {
        Ok(CaptureSettings {
            destination: parse_destination(&capture.destination).map_err(Error::invalid)?,
            window_ms: match capture.window_ms {
                0 => CAPTURE_WINDOW_DEFAULT_MS,
                ms => ms,
            },
            window_bytes: match capture.window_bytes {
                0 => CAPTURE_WINDOW_DEFAULT_BYTES,
                bytes => bytes,
            },
            namespace: match capture.namespace.as_str() {
                "" => self.broker.runtime().state().cluster_id.clone(),
                namespace => namespace.to_owned(),
            },
            enabled_at_ms: self.broker.now_ms(),
        })
    }
}
