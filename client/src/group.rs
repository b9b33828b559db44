//! A consumer group at a glance: per partition its owner, checkpoint, lag and connected
//! readers.

use tributary_proto::v1 as proto;
use tributary_proto::v1::consumer_client::ConsumerClient as ConsumerStub;

use crate::checkpoints::{Checkpoint, CheckpointStore};
use crate::client::require_name;
use crate::{Client, ClientError};

/// A reader connected to a partition in a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectedReader {
    pub name: String,
    pub owner_level: Option<i64>,
}

/// One partition of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupPartition {
    pub partition_id: String,
    /// The instance owning it; `None` when unclaimed or released.
    pub owner_id: Option<String>,
    /// When the ownership record was last claimed (store time, ms since the epoch).
    pub last_modified_ms: Option<i64>,
    pub checkpoint: Option<Checkpoint>,
    pub begin_sequence_number: i64,
    /// -1 when the partition has never held an event.
    pub last_enqueued_sequence_number: i64,
    /// Events after the checkpoint (all retained events without one).
    pub lag: i64,
    pub readers: Vec<ConnectedReader>,
}

/// Events of a partition that a consumer group has not checkpointed yet.
pub fn lag(checkpoint: Option<&Checkpoint>, begin: i64, last_enqueued: i64) -> i64 {
    if last_enqueued < 0 {
        return 0;
    }
    match checkpoint {
        Some(c) => (last_enqueued - c.sequence_number).max(0),
        None => last_enqueued - begin + 1,
    }
}

impl Client {
    /// Every partition of `event_hub` as `consumer_group` sees it: owner, checkpoint, lag
    /// and the readers connected (asked of each partition's leader).
    pub async fn describe_consumer_group(
        &self,
        event_hub: &str,
        consumer_group: &str,
    ) -> Result<Vec<GroupPartition>, ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("consumer group name", consumer_group)?;
        let hub = self.get_event_hub(event_hub).await?;
        let store = self.checkpoint_store();
        let ownership = store.list_ownership(event_hub, consumer_group).await?;
        let checkpoints = store.list_checkpoints(event_hub, consumer_group).await?;
        let mut partitions = Vec::with_capacity(hub.partition_ids.len());
        for partition_id in hub.partition_ids {
            let request = proto::GetPartitionReadersRequest {
                event_hub: event_hub.to_owned(),
                consumer_group: consumer_group.to_owned(),
                partition_id: partition_id.clone(),
            };
            let key = (event_hub.to_owned(), partition_id.clone());
            let readers = self
                .routing
                .call(Some(key), |channel, endpoint| {
                    let request = request.clone();
                    async move {
                        ConsumerStub::new(channel)
                            .get_partition_readers(request)
                            .await
                            .map(tonic::Response::into_inner)
                            .map_err(|status| ClientError::from_status(status, &endpoint))
                    }
                })
                .await?;
            let properties = readers.properties.unwrap_or_default();
            let record = ownership
                .iter()
                .find(|o| o.partition_id == partition_id && !o.owner_id.is_empty());
            let checkpoint = checkpoints.get(&partition_id).copied();
            partitions.push(GroupPartition {
                owner_id: record.map(|o| o.owner_id.clone()),
                last_modified_ms: record.map(|o| o.last_modified_ms),
                lag: lag(
                    checkpoint.as_ref(),
                    properties.begin_sequence_number,
                    properties.last_enqueued_sequence_number,
                ),
                checkpoint,
                begin_sequence_number: properties.begin_sequence_number,
                last_enqueued_sequence_number: properties.last_enqueued_sequence_number,
                readers: readers
                    .readers
                    .into_iter()
                    .map(|r| ConnectedReader {
                        name: r.name,
                        owner_level: r.owner_level,
                    })
                    .collect(),
                partition_id,
            });
        }
        Ok(partitions)
    }
}

/// One partition of a Kafka consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaGroupPartition {
    pub partition_id: String,
    /// The next offset (sequence number) the group reads; `None` when it never committed.
    pub committed_offset: Option<i64>,
    pub metadata: Option<String>,
    /// When the offset was committed (store time, ms since the epoch).
    pub last_modified_ms: Option<i64>,
    /// -1 when the partition has never held an event.
    pub last_enqueued_sequence_number: i64,
    /// Events at or after the committed offset (all retained events without one).
    pub lag: i64,
}

impl Client {
    /// Every partition of `event_hub` as Kafka consumer group `kafka_group` sees it:
    /// committed offset and lag. Kafka groups are their own namespace, apart from the hub's
    /// consumer groups.
    pub async fn describe_kafka_group(
        &self,
        event_hub: &str,
        kafka_group: &str,
    ) -> Result<Vec<KafkaGroupPartition>, ClientError> {
        let hub = self.get_event_hub(event_hub).await?;
        let offsets = self
            .checkpoint_store()
            .list_kafka_offsets(event_hub, kafka_group)
            .await?;
        let mut partitions = Vec::with_capacity(hub.partition_ids.len());
        for partition_id in hub.partition_ids {
            let properties = self
                .get_partition_properties(event_hub, &partition_id)
                .await?;
            let committed = offsets.iter().find(|o| o.partition_id == partition_id);
            let last = properties.last_enqueued_sequence_number;
            let lag = match committed {
                _ if last < 0 => 0,
                Some(c) => (last + 1 - c.offset).max(0),
                None => last - properties.begin_sequence_number + 1,
            };
            partitions.push(KafkaGroupPartition {
                committed_offset: committed.map(|c| c.offset),
                metadata: committed.map(|c| c.metadata.clone()),
                last_modified_ms: committed.map(|c| c.last_modified_ms),
                last_enqueued_sequence_number: last,
                lag,
                partition_id,
            });
        }
        Ok(partitions)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lag_counts_events_after_the_checkpoint() {
        let at = |seq| Checkpoint {
            offset: 0,
            sequence_number: seq,
            last_modified_ms: 0,
        };
        assert_eq!(lag(None, 0, -1), 0);
        assert_eq!(lag(None, 0, 9), 10);
        assert_eq!(lag(None, 5, 9), 5);
        assert_eq!(lag(Some(&at(9)), 0, 9), 0);
        assert_eq!(lag(Some(&at(3)), 0, 9), 6);
    }
}
