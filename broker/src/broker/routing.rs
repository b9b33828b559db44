//! Routing: the partition a send goes to, the local replica that serves a call, and
//! NOT_LEADER (made here only) naming the node to ask and its client address.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tributary_types::{DEFAULT_CONSUMER_GROUP, GroupId, NodeId, PartitionId, partition_for_key};

use crate::error::{Error, ErrorKind};
use crate::partition::{Partition, PartitionError};
use tributary_controller::state::HubRecord;

use super::{Broker, Target};

impl Broker {
    /// The partition index a send goes to.
    pub fn route(&self, hub: &HubRecord, target: &Target) -> Result<u16, Error> {
        let count = hub.partition_count;
        match target {
            Target::Any => {
                Ok((self.round_robin.fetch_add(1, Ordering::Relaxed) % u64::from(count)) as u16)
            }
            Target::PartitionKey(key) => Ok(partition_for_key(key, count)),
            Target::PartitionId(id) => self.partition_index(hub, id),
        }
    }

    pub fn partition_index(&self, hub: &HubRecord, partition_id: &str) -> Result<u16, Error> {
        let count = hub.partition_count;
        partition_id
            .parse::<u16>()
            .ok()
            .filter(|p| *p < count && partition_id == p.to_string())
            .ok_or_else(|| {
                Error::not_found(format!(
                    "partition '{partition_id}' does not exist in event hub '{}'; valid partition ids are 0 to {}",
                    hub.name,
                    count - 1
                ))
            })
    }

    /// This node's replica of a partition. A node without one answers NOT_LEADER naming the
    /// partition's preferred leader, so clients can go there.
    pub fn local_partition(&self, hub: &HubRecord, index: u16) -> Result<Arc<Partition>, Error> {
        let group = GroupId::new(hub.id, PartitionId(index), 0);
        if let Some(partition) = self.partitions.read().expect("partitions lock").get(&group) {
            return Ok(partition.clone());
        }
        let replicas = &hub.replicas[usize::from(index)];
        if replicas.contains(&self.node_id().0) {
            return Err(Error::busy(
                "the partition is starting on this node. Please wait 1 seconds and try again",
                Duration::from_secs(1),
            ));
        }
        Err(self.not_leader(
            replicas.first().copied().map(NodeId),
            format!(
                "partition {index} of event hub '{}' has no replica on node {}; its replicas are on nodes {replicas:?}",
                hub.name,
                self.node_id()
            ),
        ))
    }

    /// Why a partition replica on this node stopped while its hub remains: it moved to
    /// other nodes. NOT_LEADER naming the partition's preferred leader, so clients go on
    /// there.
    pub fn partition_moved(&self, hub: &HubRecord, index: u16) -> Error {
        let replicas = hub
            .replicas
            .get(usize::from(index))
            .cloned()
            .unwrap_or_default();
        self.not_leader(
            replicas.first().copied().map(NodeId),
            format!(
                "partition {index} of event hub '{}' no longer has a replica on node {}; its replicas are on nodes {replicas:?}",
                hub.name,
                self.node_id()
            ),
        )
    }

    /// The leader replica of a partition, caught up with everything committed: reads are
    /// served from it.
    pub async fn leader_partition(
        &self,
        hub: &HubRecord,
        index: u16,
    ) -> Result<Arc<Partition>, Error> {
        let partition = self.local_partition(hub, index)?;
        partition
            .ensure_caught_up()
            .await
            .map_err(|e| self.partition_error(e))?;
        Ok(partition)
    }

    /// NOT_LEADER naming the node to ask and its client address: the one place this
    /// error is made.
    fn not_leader(&self, leader: Option<NodeId>, message: String) -> Error {
        let client_addr = leader.and_then(|l| {
            self.runtime
                .state()
                .nodes
                .get(&l.0)
                .map(|n| n.client_addr.clone())
        });
        Error::new(
            ErrorKind::NotLeader {
                node: leader,
                client_addr,
            },
            message,
        )
    }

    /// Maps a partition error, naming the leader's client address for NOT_LEADER.
    pub fn partition_error(&self, err: PartitionError) -> Error {
        Error::from_partition(err, |leader| {
            self.not_leader(
                leader,
                match leader {
                    Some(l) => format!("this node does not lead the partition; node {l} does"),
                    None => "this node does not lead the partition and no leader is known yet"
                        .to_string(),
                },
            )
        })
    }

    pub fn check_consumer_group(&self, hub: &HubRecord, name: &str) -> Result<(), Error> {
        if hub.consumer_groups.contains_key(name) || name == DEFAULT_CONSUMER_GROUP {
            Ok(())
        } else {
            Err(Error::not_found(format!(
                "consumer group '{name}' does not exist in event hub '{}'",
                hub.name
            )))
        }
    }
}
