//! The checkpoint store of SPEC.md section 4, hosted by the cluster: per event hub, consumer
//! group and partition, an ownership record (which processor instance owns the partition,
//! claimed with optimistic concurrency on an etag) and a checkpoint (offset and sequence
//! number). It lives in the controller group beside the [`ClusterState`], so every record is
//! replicated and survives a controller leader failover; it is not part of the cluster view
//! that nodes follow, so checkpoint traffic never reaches them.
//!
//! Every operation, reads included, goes through the controller's log: reads are
//! linearizable (a new owner never reads a checkpoint older than one already acknowledged)
//! and last-modified times come from one clock, the store's, which never goes back whichever
//! node proposed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tributary_types::HubId;

use super::state::{ClusterState, CommandError, ErrorKind, HubRecord, hub_not_found};

mod blob;
mod kafka;
pub use blob::{BLOB_METADATA_BYTES_MAX, BlobCondition, BlobKind, BlobPut, BlobView, BlobWrite};
pub use kafka::{
    KAFKA_GROUP_ID_LEN_MAX, KAFKA_GROUPS_PER_HUB_MAX, KAFKA_OFFSET_METADATA_BYTES_MAX,
    KAFKA_OFFSETS_PER_COMMIT_MAX, KafkaOffset, KafkaOffsetCommit, KafkaOffsetRecord, KafkaOffsets,
};

/// Claims in one request at most (a processor claims at most every partition of a hub).
pub const CLAIMS_PER_REQUEST_MAX: usize = 1024;
/// Longest owner id accepted.
pub const OWNER_ID_LEN_MAX: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ownership {
    /// Empty: released (the partition is free to claim).
    pub owner_id: String,
    pub last_modified_ms: i64,
    pub etag: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub offset: i64,
    pub sequence_number: i64,
    pub last_modified_ms: i64,
}

/// One claim of a `ClaimOwnership` batch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    pub partition: u16,
    pub owner_id: String,
    /// The etag of the record the claimer last saw; `None` claims a partition that has no
    /// record yet.
    pub etag: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreCommand {
    ListOwnership {
        hub: String,
        group: String,
    },
    /// Each claim is a compare-and-set on its etag; the reply lists the claims won.
    ClaimOwnership {
        hub: String,
        group: String,
        claims: Vec<Claim>,
        now_ms: i64,
    },
    /// With `owner`, applies only while the partition's ownership record names it.
    UpdateCheckpoint {
        hub: String,
        group: String,
        partition: u16,
        offset: i64,
        sequence_number: i64,
        owner: Option<String>,
        now_ms: i64,
    },
    ListCheckpoints {
        hub: String,
        group: String,
    },
    /// A write through the Blob API (the Azure SDKs' `BlobCheckpointStore`): the record's
    /// metadata replaced as a whole, under the request's condition, atomically. `create`:
    /// Put Blob (creates or replaces the record); otherwise Set Blob Metadata (the record
    /// must exist). Proposed only at feature level 2 and later.
    PutBlob {
        hub: String,
        group: String,
        partition: u16,
        kind: BlobKind,
        metadata: BTreeMap<String, String>,
        condition: BlobCondition,
        create: bool,
        now_ms: i64,
    },
    /// Every record of a consumer group as the Blob API shows it. Feature level 2 and later.
    ListBlobs {
        hub: String,
        group: String,
    },
    /// A block of [`PRODUCER_IDS_PER_BLOCK`] Kafka producer ids for one node to hand out:
    /// the block of the command's log index, so blocks never overlap and need no state
    /// (see [`producer_id_block`]). Feature level 2 and later.
    AllocateProducerIds,
    /// A Kafka group's OffsetCommit: every offset stored, or none. Kafka groups are their
    /// own namespace (not the hubs' consumer groups) and are created by their first
    /// commit. Feature level 2 and later.
    CommitKafkaOffsets {
        group: String,
        offsets: Vec<KafkaOffsetCommit>,
        now_ms: i64,
    },
    /// A Kafka group's committed offsets, of one hub or of every hub. Feature level 2 and
    /// later.
    ListKafkaOffsets {
        group: String,
        hub: Option<String>,
    },
}

/// Kafka producer ids in one block a node caches.
pub const PRODUCER_IDS_PER_BLOCK: u32 = 1 << 16;

/// The block of producer ids allocated by the controller entry at `log_index`: every entry
/// has its own index, so each allocation its own block, on every replica alike. `None`
/// past the ids Kafka can carry (an index beyond 2^47).
pub fn producer_id_block(log_index: u64) -> Option<StoreReply> {
    let first = i64::try_from(log_index)
        .ok()?
        .checked_mul(i64::from(PRODUCER_IDS_PER_BLOCK))?;
    first
        .checked_add(i64::from(PRODUCER_IDS_PER_BLOCK))
        .map(|_| StoreReply::ProducerIds {
            first,
            count: PRODUCER_IDS_PER_BLOCK,
        })
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreReply {
    /// Ownership records by partition index.
    Ownership(Vec<(u16, Ownership)>),
    /// Checkpoints by partition index.
    Checkpoints(Vec<(u16, Checkpoint)>),
    Checkpoint(Checkpoint),
    /// The records of `ListBlobs`, ownership first, each kind by partition.
    Blobs(Vec<BlobView>),
    /// The outcome of `PutBlob`.
    BlobWrite(BlobWrite),
    /// The block of `AllocateProducerIds`: ids `first` to `first + count` (exclusive).
    ProducerIds {
        first: i64,
        count: u32,
    },
    /// The offsets a `CommitKafkaOffsets` stored, or those `ListKafkaOffsets` found.
    KafkaOffsets(Vec<KafkaOffsetRecord>),
}

/// Records of one (hub, consumer group, partition).
pub type Key = (HubId, String, u16);

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConsumerStore {
    ownership: BTreeMap<Key, Ownership>,
    checkpoints: BTreeMap<Key, Checkpoint>,
    /// The store's clock: the latest time it has stamped.
    clock_ms: i64,
    /// Etags are never reused.
    next_etag: u64,
    /// Metadata as last written through the Blob API, where a record has it (a write through
    /// the typed API drops it: its fields are then the whole record). Not part of this
    /// type's own encoding, which release 0.1.0 fixed: the applied state carries it after
    /// the rest from format 2 on (`state_machine::encode_applied`).
    #[serde(skip)]
    blob_metadata: BlobMetadata,
    /// Kafka groups' committed offsets. Like `blob_metadata`, not part of this type's own
    /// encoding: the format-2 applied state carries them after it, when there are any.
    #[serde(skip)]
    kafka_offsets: KafkaOffsets,
}

/// Raw Blob API metadata by record.
pub type BlobMetadata = BTreeMap<(Key, BlobKind), BTreeMap<String, String>>;

impl ConsumerStore {
    pub fn apply(
        &mut self,
        cluster: &ClusterState,
        command: StoreCommand,
    ) -> Result<StoreReply, CommandError> {
        match command {
            StoreCommand::ListOwnership { hub, group } => {
                let id = scope(cluster, &hub, &group)?.id;
                Ok(StoreReply::Ownership(
                    range(&self.ownership, id, &group)
                        .map(|(p, o)| (p, o.clone()))
                        .collect(),
                ))
            }
            StoreCommand::ListCheckpoints { hub, group } => {
                let id = scope(cluster, &hub, &group)?.id;
                Ok(StoreReply::Checkpoints(
                    range(&self.checkpoints, id, &group)
                        .map(|(p, c)| (p, *c))
                        .collect(),
                ))
            }
            StoreCommand::ClaimOwnership {
                hub,
                group,
                claims,
                now_ms,
            } => {
                let record = scope(cluster, &hub, &group)?;
                if claims.len() > CLAIMS_PER_REQUEST_MAX {
                    return Err(invalid(format!(
                        "{} claims in one request; at most {CLAIMS_PER_REQUEST_MAX}",
                        claims.len()
                    )));
                }
                for claim in &claims {
                    partition_in(record, claim.partition)?;
                    if claim.owner_id.len() > OWNER_ID_LEN_MAX {
                        return Err(invalid(format!(
                            "owner id of {} bytes; at most {OWNER_ID_LEN_MAX}",
                            claim.owner_id.len()
                        )));
                    }
                }
                let now = self.tick(now_ms);
                let mut won = Vec::new();
                for claim in claims {
                    let key = (record.id, group.clone(), claim.partition);
                    let current = self.ownership.get(&key).map(|o| o.etag.as_str());
                    if current != claim.etag.as_deref() {
                        continue;
                    }
                    let etag = self.etag();
                    self.blob_metadata
                        .remove(&(key.clone(), BlobKind::Ownership));
                    let ownership = Ownership {
                        owner_id: claim.owner_id,
                        last_modified_ms: now,
                        etag,
                    };
                    self.ownership.insert(key, ownership.clone());
                    won.push((claim.partition, ownership));
                }
                Ok(StoreReply::Ownership(won))
            }
            StoreCommand::UpdateCheckpoint {
                hub,
                group,
                partition,
                offset,
                sequence_number,
                owner,
                now_ms,
            } => {
                let record = scope(cluster, &hub, &group)?;
                partition_in(record, partition)?;
                if let Some(owner) = owner {
                    let current = self
                        .ownership
                        .get(&(record.id, group.clone(), partition))
                        .map_or("", |o| o.owner_id.as_str());
                    if current != owner {
                        return Err(CommandError {
                            kind: ErrorKind::NotOwner,
                            message: format!(
                                "checkpoint refused: partition {partition} of event hub '{hub}' in consumer group '{group}' is owned by '{current}', not '{owner}'"
                            ),
                        });
                    }
                }
                if offset < 0 || sequence_number < 0 {
                    return Err(invalid(format!(
                        "a checkpoint needs an offset and a sequence number of 0 or more (got {offset} and {sequence_number})"
                    )));
                }
                let checkpoint = Checkpoint {
                    offset,
                    sequence_number,
                    last_modified_ms: self.tick(now_ms),
                };
                let key = (record.id, group, partition);
                self.blob_metadata
                    .remove(&(key.clone(), BlobKind::Checkpoint));
                self.checkpoints.insert(key, checkpoint);
                Ok(StoreReply::Checkpoint(checkpoint))
            }
            StoreCommand::PutBlob {
                hub,
                group,
                partition,
                kind,
                metadata,
                condition,
                create,
                now_ms,
            } => {
                let record = scope(cluster, &hub, &group)?;
                partition_in(record, partition)?;
                let key = (record.id, group, partition);
                let write = blob::Write {
                    kind,
                    metadata,
                    condition,
                    create,
                    now_ms,
                };
                Ok(StoreReply::BlobWrite(self.put_blob(key, write)?))
            }
            StoreCommand::ListBlobs { hub, group } => {
                let id = scope(cluster, &hub, &group)?.id;
                Ok(StoreReply::Blobs(self.list_blobs(id, &group)))
            }
            // Answered from the entry's log index, which only the state machine knows
            // (`ControllerApplied::apply`).
            StoreCommand::AllocateProducerIds => Err(invalid(
                "producer ids are allocated by the controller's state machine".to_string(),
            )),
            StoreCommand::CommitKafkaOffsets {
                group,
                offsets,
                now_ms,
            } => self
                .commit_kafka_offsets(cluster, group, offsets, now_ms)
                .map(StoreReply::KafkaOffsets),
            StoreCommand::ListKafkaOffsets { group, hub } => self
                .list_kafka_offsets(cluster, &group, hub.as_deref())
                .map(StoreReply::KafkaOffsets),
        }
    }

    /// The raw Blob API metadata (the applied state's format-2 trailer).
    pub fn blob_metadata(&self) -> &BlobMetadata {
        &self.blob_metadata
    }

    /// Restores the raw Blob API metadata read from a format-2 applied state.
    pub fn set_blob_metadata(&mut self, metadata: BlobMetadata) {
        self.blob_metadata = metadata;
    }

    /// Every checkpoint: (hub, consumer group, partition index, sequence number).
    pub fn checkpoint_sequences(&self) -> Vec<(HubId, String, u16, i64)> {
        self.checkpoints
            .iter()
            .map(|((hub, group, partition), c)| {
                (*hub, group.clone(), *partition, c.sequence_number)
            })
            .collect()
    }

    /// Drops the records of hubs and consumer groups that no longer exist.
    pub fn prune(&mut self, cluster: &ClusterState) {
        let live = |(hub, group, _): &Key| {
            cluster
                .hub_by_id(*hub)
                .is_some_and(|h| h.consumer_groups.contains_key(group))
        };
        self.ownership.retain(|k, _| live(k));
        self.checkpoints.retain(|k, _| live(k));
        self.blob_metadata.retain(|(k, _), _| live(k));
        // Kafka groups' offsets go with their hub.
        self.kafka_offsets
            .retain(|(_, hub, _), _| cluster.hub_by_id(*hub).is_some());
    }

    /// Stamps a modification: the proposer's time, but never before an earlier stamp.
    fn tick(&mut self, now_ms: i64) -> i64 {
        self.clock_ms = self.clock_ms.max(now_ms);
        self.clock_ms
    }

    fn etag(&mut self) -> String {
        self.next_etag += 1;
        format!("{:016x}", self.next_etag)
    }
}

fn range<'a, T>(
    map: &'a BTreeMap<Key, T>,
    hub: HubId,
    group: &'a str,
) -> impl Iterator<Item = (u16, &'a T)> + 'a {
    map.range((hub, group.to_string(), 0)..=(hub, group.to_string(), u16::MAX))
        .map(|((_, _, p), v)| (*p, v))
}

fn invalid(message: String) -> CommandError {
    CommandError {
        kind: ErrorKind::InvalidArgument,
        message,
    }
}

fn scope<'a>(
    cluster: &'a ClusterState,
    hub: &str,
    group: &str,
) -> Result<&'a HubRecord, CommandError> {
    let record = cluster.hubs.get(hub).ok_or_else(|| hub_not_found(hub))?;
    if !record.consumer_groups.contains_key(group) {
        return Err(CommandError {
            kind: ErrorKind::NotFound,
            message: format!(
                "consumer group '{group}' does not exist in event hub '{hub}'; `tributary group create` makes one"
            ),
        });
    }
    Ok(record)
}

fn partition_in(record: &HubRecord, partition: u16) -> Result<(), CommandError> {
    if partition >= record.partition_count {
        return Err(CommandError {
            kind: ErrorKind::InvalidArgument,
            message: format!(
                "partition '{partition}' does not exist in event hub '{}'; its partitions are 0 to {}",
                record.name,
                record.partition_count - 1
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::{Command, test_cluster};

    fn cluster_with_hub() -> ClusterState {
        let mut state = test_cluster(3);
        state
            .apply(Command::CreateHub(crate::state::NewHub {
                name: "orders".into(),
                partition_count: 4,
                retention_ms: 3_600_000,
                replication_factor: None,
                partitions_max: 32,
                now_ms: 1,
                down_nodes: Vec::new(),
                throughput_units: 0,
                settings: Default::default(),
            }))
            .unwrap();
        state
    }

    fn claim(partition: u16, owner: &str, etag: Option<&str>) -> Claim {
        Claim {
            partition,
            owner_id: owner.into(),
            etag: etag.map(str::to_string),
        }
    }

    fn claim_all(
        store: &mut ConsumerStore,
        cluster: &ClusterState,
        claims: Vec<Claim>,
        now_ms: i64,
    ) -> Vec<(u16, Ownership)> {
        match store
            .apply(
                cluster,
                StoreCommand::ClaimOwnership {
                    hub: "orders".into(),
                    group: "$Default".into(),
                    claims,
                    now_ms,
                },
            )
            .unwrap()
        {
            StoreReply::Ownership(won) => won,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_claim_is_a_compare_and_set_on_the_etag() {
        let cluster = cluster_with_hub();
        let mut store = ConsumerStore::default();
        // A new record only where none exists.
        let won = claim_all(&mut store, &cluster, vec![claim(0, "a", None)], 10);
        assert_eq!(won.len(), 1);
        let etag = won[0].1.etag.clone();
        assert!(claim_all(&mut store, &cluster, vec![claim(0, "b", None)], 11).is_empty());
        // The current etag wins once; the old one is then stale.
        let won = claim_all(&mut store, &cluster, vec![claim(0, "b", Some(&etag))], 12);
        assert_eq!(won[0].1.owner_id, "b");
        assert_ne!(won[0].1.etag, etag);
        assert!(claim_all(&mut store, &cluster, vec![claim(0, "a", Some(&etag))], 13).is_empty());
        // A batch: each claim on its own.
        let current = won[0].1.etag.clone();
        let won = claim_all(
            &mut store,
            &cluster,
            vec![
                claim(0, "c", Some(&current)),
                claim(1, "c", None),
                claim(2, "c", Some("nonsense")),
            ],
            14,
        );
        let partitions: Vec<u16> = won.iter().map(|(p, _)| *p).collect();
        assert_eq!(partitions, vec![0, 1]);
    }

    #[test]
    fn a_checkpoint_for_an_owner_applies_only_while_it_owns_the_partition() {
        let cluster = cluster_with_hub();
        let mut store = ConsumerStore::default();
        let won = claim_all(&mut store, &cluster, vec![claim(0, "old", None)], 10);
        let update = |store: &mut ConsumerStore, owner: &str, seq: i64| {
            store.apply(
                &cluster,
                StoreCommand::UpdateCheckpoint {
                    hub: "orders".into(),
                    group: "$Default".into(),
                    partition: 0,
                    offset: seq,
                    sequence_number: seq,
                    owner: Some(owner.into()),
                    now_ms: 20,
                },
            )
        };
        update(&mut store, "old", 5).unwrap();
        claim_all(
            &mut store,
            &cluster,
            vec![claim(0, "new", Some(&won[0].1.etag))],
            30,
        );
        update(&mut store, "new", 9).unwrap();
        // The old owner's late checkpoint would move it back: refused.
        let err = update(&mut store, "old", 6).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotOwner);
        assert!(err.message.contains("owned by 'new'"), "{err}");
        let key = (cluster.hubs["orders"].id, "$Default".to_string(), 0);
        assert_eq!(store.checkpoints[&key].sequence_number, 9);
    }

    #[test]
    fn times_never_go_back_and_checkpoints_are_listed_per_group() {
        let mut cluster = cluster_with_hub();
        cluster
            .apply(Command::CreateConsumerGroup {
                hub: "orders".into(),
                name: "audit".into(),
                now_ms: 1,
            })
            .unwrap();
        let mut store = ConsumerStore::default();
        let won = claim_all(&mut store, &cluster, vec![claim(0, "a", None)], 100);
        assert_eq!(won[0].1.last_modified_ms, 100);
        // A proposer with a slow clock still moves time forward.
        let won = claim_all(&mut store, &cluster, vec![claim(1, "a", None)], 50);
        assert_eq!(won[0].1.last_modified_ms, 100);
        let update = |store: &mut ConsumerStore, group: &str, partition: u16, seq: i64| {
            store.apply(
                &cluster,
                StoreCommand::UpdateCheckpoint {
                    hub: "orders".into(),
                    group: group.into(),
                    partition,
                    offset: seq * 10,
                    sequence_number: seq,
                    owner: None,
                    now_ms: 200,
                },
            )
        };
        update(&mut store, "$Default", 2, 7).unwrap();
        update(&mut store, "audit", 2, 3).unwrap();
        let list = |store: &mut ConsumerStore, group: &str| match store
            .apply(
                &cluster,
                StoreCommand::ListCheckpoints {
                    hub: "orders".into(),
                    group: group.into(),
                },
            )
            .unwrap()
        {
            StoreReply::Checkpoints(list) => list,
            other => panic!("{other:?}"),
        };
        let default = list(&mut store, "$Default");
        assert_eq!(default.len(), 1);
        assert_eq!((default[0].0, default[0].1.sequence_number), (2, 7));
        assert_eq!(list(&mut store, "audit")[0].1.sequence_number, 3);
        // The metrics read every checkpoint at once, each group's under its hub's id.
        let hub = cluster.hubs["orders"].id;
        assert_eq!(
            store.checkpoint_sequences(),
            vec![(hub, "$Default".into(), 2, 7), (hub, "audit".into(), 2, 3)]
        );
        // Bad input: a clear error, nothing stored.
        let err = update(&mut store, "$Default", 9, 1).unwrap_err();
        assert!(err.message.contains("partitions are 0 to 3"), "{err}");
        let err = update(&mut store, "nobody", 0, 1).unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        // Deleting the group drops its records.
        cluster
            .apply(Command::DeleteConsumerGroup {
                hub: "orders".into(),
                name: "audit".into(),
            })
            .unwrap();
        store.prune(&cluster);
        assert_eq!(store.checkpoints.len(), 1);
    }
}
