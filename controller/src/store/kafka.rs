//! Kafka consumer groups' committed offsets (OffsetCommit, OffsetFetch). Kafka groups are
//! their own namespace, as in Event Hubs: auto-created by their first commit, apart from the
//! hubs' Event Hubs consumer groups, and one group may commit offsets of several hubs. An
//! offset is a Kafka offset, that is a sequence number. Offsets go with their hub.
//!
//! Membership (generations, members, assignments) is not here: the Kafka front end keeps it
//! in memory on the node that leads the controller group; only offsets are replicated.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tributary_types::HubId;

use super::{ConsumerStore, invalid, partition_in};
use crate::state::{ClusterState, CommandError, hub_not_found};

/// The longest Kafka group id (Event Hubs' limit).
pub const KAFKA_GROUP_ID_LEN_MAX: usize = 256;
/// The most metadata a committed offset carries (Event Hubs' limit).
pub const KAFKA_OFFSET_METADATA_BYTES_MAX: usize = 1024;
/// Kafka groups with offsets in one hub at most.
pub const KAFKA_GROUPS_PER_HUB_MAX: usize = 1024;
/// Offsets in one commit at most.
pub const KAFKA_OFFSETS_PER_COMMIT_MAX: usize = 64 * 1024;

/// A committed offset as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaOffset {
    /// The next offset (sequence number) the group reads.
    pub offset: i64,
    pub metadata: String,
    pub last_modified_ms: i64,
}

/// One partition's offset in a commit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaOffsetCommit {
    pub hub: String,
    pub partition: u16,
    pub offset: i64,
    pub metadata: String,
}

/// An offset of a group, with its hub's name and partition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KafkaOffsetRecord {
    pub hub: String,
    pub partition: u16,
    pub offset: KafkaOffset,
}

/// Offsets by (Kafka group, hub, partition).
pub type KafkaOffsets = BTreeMap<(String, HubId, u16), KafkaOffset>;

impl ConsumerStore {
    /// Stores every offset of a commit, or none (a hub, partition or value that does not fit
    /// refuses the whole commit: the front end checks each one first).
    pub(super) fn commit_kafka_offsets(
        &mut self,
        cluster: &ClusterState,
        group: String,
        offsets: Vec<KafkaOffsetCommit>,
        now_ms: i64,
    ) -> Result<Vec<KafkaOffsetRecord>, CommandError> {
        check_group(&group)?;
        if offsets.len() > KAFKA_OFFSETS_PER_COMMIT_MAX {
            return Err(invalid(format!(
                "{} offsets in one commit; at most {KAFKA_OFFSETS_PER_COMMIT_MAX}",
                offsets.len()
            )));
        }
        let mut keys = Vec::with_capacity(offsets.len());
        for commit in &offsets {
            let record = cluster
                .hubs
                .get(&commit.hub)
                .ok_or_else(|| hub_not_found(&commit.hub))?;
            partition_in(record, commit.partition)?;
            if commit.offset < 0 {
                return Err(invalid(format!(
                    "a committed offset is 0 or more (got {})",
                    commit.offset
                )));
            }
            if commit.metadata.len() > KAFKA_OFFSET_METADATA_BYTES_MAX {
                return Err(invalid(format!(
                    "offset metadata of {} bytes; at most {KAFKA_OFFSET_METADATA_BYTES_MAX}",
                    commit.metadata.len()
                )));
            }
            if !self.kafka_group_in(&group, record.id) {
                let groups = self.kafka_groups_of(record.id);
                if groups >= KAFKA_GROUPS_PER_HUB_MAX {
                    return Err(CommandError {
                        kind: crate::state::ErrorKind::QuotaExceeded,
                        message: format!(
                            "event hub '{}' has offsets of {groups} Kafka groups, the most it keeps; delete the hub's unused groups' offsets or use an existing group",
                            commit.hub
                        ),
                    });
                }
            }
            keys.push((group.clone(), record.id, commit.partition));
        }
        let now = self.tick(now_ms);
        let mut stored = Vec::with_capacity(offsets.len());
        for (key, commit) in keys.into_iter().zip(offsets) {
            let offset = KafkaOffset {
                offset: commit.offset,
                metadata: commit.metadata,
                last_modified_ms: now,
            };
            self.kafka_offsets.insert(key, offset.clone());
            stored.push(KafkaOffsetRecord {
                hub: commit.hub,
                partition: commit.partition,
                offset,
            });
        }
        Ok(stored)
    }

    /// A group's offsets, of one hub or of all, by hub name and partition.
    pub(super) fn list_kafka_offsets(
        &self,
        cluster: &ClusterState,
        group: &str,
        hub: Option<&str>,
    ) -> Result<Vec<KafkaOffsetRecord>, CommandError> {
        check_group(group)?;
        let only = match hub {
            Some(name) => Some(
                cluster
                    .hubs
                    .get(name)
                    .ok_or_else(|| hub_not_found(name))?
                    .id,
            ),
            None => None,
        };
        let start = (group.to_string(), HubId(0), 0);
        let mut records: Vec<KafkaOffsetRecord> = self
            .kafka_offsets
            .range(start..)
            .take_while(|((g, _, _), _)| g == group)
            .filter(|((_, id, _), _)| only.is_none_or(|only| only == *id))
            .filter_map(|((_, id, partition), offset)| {
                Some(KafkaOffsetRecord {
                    hub: cluster.hub_by_id(*id)?.name.clone(),
                    partition: *partition,
                    offset: offset.clone(),
                })
            })
            .collect();
        records.sort_by(|a, b| (&a.hub, a.partition).cmp(&(&b.hub, b.partition)));
        Ok(records)
    }

    /// Every Kafka group with offsets, of one hub or of all.
    pub fn kafka_groups(&self, hub: Option<HubId>) -> Vec<String> {
        let mut groups: Vec<String> = self
            .kafka_offsets
            .keys()
            .filter(|(_, id, _)| hub.is_none_or(|hub| hub == *id))
            .map(|(group, _, _)| group.clone())
            .collect();
        groups.dedup();
        groups
    }

    /// The committed Kafka offsets (the applied state's format-2 trailer).
    pub fn kafka_offsets(&self) -> &KafkaOffsets {
        &self.kafka_offsets
    }

    /// Restores the committed Kafka offsets read from a format-2 applied state.
    pub fn set_kafka_offsets(&mut self, offsets: KafkaOffsets) {
        self.kafka_offsets = offsets;
    }

    fn kafka_group_in(&self, group: &str, hub: HubId) -> bool {
        let start = (group.to_string(), hub, 0);
        let end = (group.to_string(), hub, u16::MAX);
        self.kafka_offsets.range(start..=end).next().is_some()
    }

    fn kafka_groups_of(&self, hub: HubId) -> usize {
        self.kafka_groups(Some(hub)).len()
    }
}

fn check_group(group: &str) -> Result<(), CommandError> {
    if group.is_empty() || group.len() > KAFKA_GROUP_ID_LEN_MAX {
        return Err(invalid(format!(
            "a Kafka group id of {} bytes; ids are 1 to {KAFKA_GROUP_ID_LEN_MAX} bytes",
            group.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
#[path = "kafka_tests.rs"]
mod tests;
