//! Golden files of every value the controller writes to storage or sends to another node:
//! each [`Command`] variant (the controller log's payload), each command result (the Raft
//! reply), the applied state with the checkpoint store (its snapshots and stored state), the
//! stored snapshot record, and the cluster state as cluster views carry it (see
//! [`tributary_types::format`]). Each test decodes the files of every format this release
//! reads with the controller's own decoder and checks that encoding its sample gives the same
//! bytes, so a change to a field or to the order of a variant fails here.
//!
//! The files under `controller/golden/format-1/` are release 0.1.0's bytes: none of these
//! types changed between that release (commit 357b040) and the one that introduced format 2,
//! except by what format 1 never carries (the `SetFeatureLevel` command, appended last,
//! and the cluster's feature level, which `ClusterState` does not serialize), so what format
//! 1 encodes today is what 0.1.0 wrote. Missing files are written by
//! `TRIBUTARY_WRITE_GOLDEN=1 cargo test -p tributary-controller golden`; files of a format
//! that shipped are never rewritten.
//!
//! Each sample fills every field with a value other than its default, and the samples
//! together hold every variant of every enum they contain, so a field dropped, added or
//! retyped, or a variant moved, changes the bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Serialize;
use tributary_raft::openraft_api::BasicNode;
use tributary_raft::openraft_api::testing::log_id;
use tributary_raft::{LogId, SnapshotMeta, StoredMembership, TypeConfig};
use tributary_types::format::{self, FORMAT_LATEST, FORMAT_LEGACY, golden};
use tributary_types::{AuthorizationRule, HubId, Rights};

use crate::capture::CaptureDestination;
use crate::rules::{KeyKind, RuleCommand, RuleScope};
use crate::state::{
    CaptureSettings, CleanupPolicy, ClusterFeature, ClusterState, Command, CommandError, ErrorKind,
    HubRecord, HubSettings, HubUpdate, NewHub, NodeRecord, ReplicaMove, Reply,
};
use crate::state_machine::{
    CommandResult, ControllerApplied, decode_applied, decode_command, decode_result, encode_applied,
};
use crate::store::{
    BlobCondition, BlobKind, BlobView, BlobWrite, Checkpoint, Claim, ConsumerStore,
    KafkaOffsetCommit, Ownership, StoreCommand, StoreReply,
};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// Checks `value` against its golden files of `versions`, reading them with `decode` (the
/// controller's own decoder for the type) after checking each file's format.
fn check<T, E>(
    name: &str,
    value: &T,
    versions: &[u8],
    decode: impl Fn(&[u8]) -> Result<T, E> + Copy,
) where
    T: Serialize + PartialEq + std::fmt::Debug,
    E: std::fmt::Display,
{
    golden::check_formats(&golden_dir(), name, value, versions, decode);
}

const EVERY_FORMAT: &[u8] = &[FORMAT_LEGACY, FORMAT_LATEST];

fn raft_log_id(term: u64, node: u64, index: u64) -> LogId {
    log_id::<TypeConfig>(term, node, index)
}

/// The controller group's membership: voters 1 to 3, with their peer addresses.
fn membership() -> StoredMembership {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3)
        .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:7101"))))
        .collect();
    StoredMembership::new(Some(raft_log_id(2, 1, 5)), nodes.into())
}

fn rule(name: &str, rights: Rights) -> AuthorizationRule {
    AuthorizationRule {
        name: name.into(),
        primary_key: format!("{name}-primary-key"),
        secondary_key: format!("{name}-secondary-key"),
        rights,
    }
}

fn node(id: u64) -> NodeRecord {
    NodeRecord {
        id,
        client_addr: format!("10.0.0.{id}:5671"),
        peer_addr: format!("10.0.0.{id}:7101"),
        data_id: 0xda7a_0000 + id,
        incarnation: 2,
        incarnation_version: 40 + id,
        capacity_units: 4,
        zone: Some(format!("zone-{id}")),
        draining: true,
        decommissioning: true,
    }
}

fn s3_capture() -> CaptureSettings {
    CaptureSettings {
        destination: CaptureDestination::S3 {
            endpoint: Some("http://127.0.0.1:9000".into()),
            bucket: "captures".into(),
            region: "eu-west-1".into(),
            prefix: "tributary".into(),
            allow_http: true,
        },
        window_ms: 60_000,
        window_bytes: 10 * 1024 * 1024,
        namespace: "orders-ns".into(),
        enabled_at_ms: 1_714_000_000_000,
    }
}

fn directory_capture() -> CaptureSettings {
    CaptureSettings {
        destination: CaptureDestination::Directory {
            path: "/var/lib/tributary/capture".into(),
        },
        window_ms: 120_000,
        window_bytes: 2 * 1024 * 1024,
        namespace: "audit-ns".into(),
        enabled_at_ms: 1_714_000_100_000,
    }
}

fn hub() -> HubRecord {
    HubRecord {
        id: HubId(3),
        name: "orders".into(),
        partition_count: 2,
        retention_ms: 7 * 24 * 3_600_000,
        created_at_ms: 1_713_000_000_000,
        replication_factor: 3,
        consumer_groups: BTreeMap::from([
            ("$Default".to_string(), 1_713_000_000_000),
            ("audit".to_string(), 1_713_000_500_000),
        ]),
        replicas: vec![vec![1, 2, 3], vec![2, 3, 1]],
        created_version: 12,
        throughput_units: 6,
        moved: BTreeSet::from([1]),
        joins: BTreeMap::from([(1, BTreeMap::from([(3, 2)]))]),
        founders: vec![vec![1, 2, 3], vec![2, 3, 1]],
        settings: HubSettings {
            cleanup_policy: CleanupPolicy::DeleteOrCompact,
            tombstone_retention_ms: 3_600_000,
            compaction_lag_ms: 60_000,
            retention_bytes_max: 1 << 30,
            capture: Some(s3_capture()),
        },
        rules: vec![rule("orders-send", Rights::SEND)],
    }
}

/// A cluster state with a value in every field; its feature level is the default, which
/// [`ClusterState`]'s own encoding does not carry.
fn cluster_state() -> ClusterState {
    ClusterState {
        cluster_id: "9f1c2d3e-cluster".into(),
        controller_voters: vec![1, 2, 3],
        nodes: (1..=3).map(|id| (id, node(id))).collect(),
        hubs: BTreeMap::from([("orders".to_string(), hub())]),
        next_hub_id: 4,
        version: 57,
        moves: vec![ReplicaMove {
            hub: HubId(3),
            partition: 1,
            from: Some(1),
            to: 4,
            started_ms: 1_714_000_300_000,
        }],
        rules: vec![rule(
            "RootManageSharedAccessKey",
            Rights::MANAGE.union(Rights::SEND).union(Rights::LISTEN),
        )],
        feature: ClusterFeature::default(),
    }
}

/// A checkpoint store with ownership records and checkpoints of two partitions, made the
/// way the controller makes it (its fields are its own).
fn consumer_store(state: &ClusterState) -> ConsumerStore {
    let mut store = ConsumerStore::default();
    let claims = (0..2)
        .map(|partition| Claim {
            partition,
            owner_id: format!("processor-{partition}"),
            etag: None,
        })
        .collect();
    let commands = [
        StoreCommand::ClaimOwnership {
            hub: "orders".into(),
            group: "audit".into(),
            claims,
            now_ms: 1_714_000_400_000,
        },
        StoreCommand::UpdateCheckpoint {
            hub: "orders".into(),
            group: "audit".into(),
            partition: 1,
            offset: 81_920,
            sequence_number: 4_000,
            owner: Some("processor-1".into()),
            now_ms: 1_714_000_500_000,
        },
        StoreCommand::UpdateCheckpoint {
            hub: "orders".into(),
            group: "$Default".into(),
            partition: 0,
            offset: 4_096,
            sequence_number: 200,
            owner: None,
            now_ms: 1_714_000_600_000,
        },
    ];
    for command in commands {
        store
            .apply(state, command)
            .expect("the sample store applies");
    }
    store
}

fn applied() -> ControllerApplied {
    let state = cluster_state();
    ControllerApplied {
        last_applied: Some(raft_log_id(2, 1, 90)),
        membership: membership(),
        store: consumer_store(&state),
        state,
    }
}

fn new_hub() -> NewHub {
    NewHub {
        name: "audit".into(),
        partition_count: 4,
        retention_ms: 3_600_000,
        replication_factor: Some(2),
        partitions_max: 32,
        now_ms: 1_714_000_700_000,
        down_nodes: vec![3],
        throughput_units: 2,
        settings: HubSettings {
            cleanup_policy: CleanupPolicy::Compact,
            tombstone_retention_ms: 7_200_000,
            compaction_lag_ms: 30_000,
            retention_bytes_max: 1 << 20,
            capture: Some(directory_capture()),
        },
    }
}

/// One command of each variant (and of each variant of the store and rule commands they
/// carry), named for its golden file. `SetFeatureLevel` is checked apart: format 1 cannot
/// carry it.
fn commands() -> Vec<(&'static str, Command)> {
    let hub_name = || "orders".to_string();
    let group = || "audit".to_string();
    vec![
        (
            "command-bootstrap",
            Command::Bootstrap {
                cluster_id: "9f1c2d3e-cluster".into(),
                voters: vec![1, 2, 3],
            },
        ),
        ("command-register-node", Command::RegisterNode(node(4))),
        ("command-create-hub", Command::CreateHub(new_hub())),
        (
            "command-delete-hub",
            Command::DeleteHub { name: hub_name() },
        ),
        (
            "command-set-draining",
            Command::SetDraining {
                node: 2,
                draining: true,
            },
        ),
        (
            "command-set-decommissioning",
            Command::SetDecommissioning {
                node: 3,
                decommissioning: true,
            },
        ),
        (
            "command-start-moves",
            Command::StartMoves(vec![
                cluster_state().moves[0].clone(),
                ReplicaMove {
                    hub: HubId(3),
                    partition: 0,
                    from: None,
                    to: 5,
                    started_ms: 1_714_000_800_000,
                },
            ]),
        ),
        (
            "command-finish-move",
            Command::FinishMove {
                hub: HubId(3),
                partition: 1,
                to: 4,
            },
        ),
        (
            "command-abort-move",
            Command::AbortMove {
                hub: HubId(3),
                partition: 1,
                to: 4,
            },
        ),
        (
            "command-set-preferred-leaders",
            Command::SetPreferredLeaders(vec![(HubId(3), 0, 2), (HubId(3), 1, 3)]),
        ),
        (
            "command-set-throughput-units",
            Command::SetThroughputUnits {
                hub: hub_name(),
                throughput_units: 8,
            },
        ),
        (
            "command-create-consumer-group",
            Command::CreateConsumerGroup {
                hub: hub_name(),
                name: group(),
                now_ms: 1_714_000_900_000,
            },
        ),
        (
            "command-delete-consumer-group",
            Command::DeleteConsumerGroup {
                hub: hub_name(),
                name: group(),
            },
        ),
        (
            "command-store-list-ownership",
            Command::Store(StoreCommand::ListOwnership {
                hub: hub_name(),
                group: group(),
            }),
        ),
        (
            "command-store-claim-ownership",
            Command::Store(StoreCommand::ClaimOwnership {
                hub: hub_name(),
                group: group(),
                claims: vec![
                    Claim {
                        partition: 0,
                        owner_id: "processor-0".into(),
                        etag: Some("0000000000000001".into()),
                    },
                    Claim {
                        partition: 1,
                        owner_id: "processor-1".into(),
                        etag: None,
                    },
                ],
                now_ms: 1_714_001_000_000,
            }),
        ),
        (
            "command-store-update-checkpoint",
            Command::Store(StoreCommand::UpdateCheckpoint {
                hub: hub_name(),
                group: group(),
                partition: 1,
                offset: 81_920,
                sequence_number: 4_000,
                owner: Some("processor-1".into()),
                now_ms: 1_714_001_100_000,
            }),
        ),
        (
            "command-store-list-checkpoints",
            Command::Store(StoreCommand::ListCheckpoints {
                hub: hub_name(),
                group: group(),
            }),
        ),
        (
            "command-update-hub",
            Command::UpdateHub {
                hub: hub_name(),
                update: HubUpdate {
                    throughput_units: Some(10),
                    retention_ms: Some(2 * 3_600_000),
                    cleanup_policy: Some(CleanupPolicy::Delete),
                    tombstone_retention_ms: Some(600_000),
                    compaction_lag_ms: Some(5_000),
                    retention_bytes_max: Some(1 << 25),
                    capture: Some(Some(s3_capture())),
                },
            },
        ),
        (
            "command-update-hub-capture-off",
            Command::UpdateHub {
                hub: hub_name(),
                update: HubUpdate {
                    capture: Some(None),
                    ..HubUpdate::default()
                },
            },
        ),
        (
            "command-rule-ensure-root",
            Command::Rule(RuleCommand::EnsureRoot {
                primary_key: "root-primary-key".into(),
                secondary_key: "root-secondary-key".into(),
            }),
        ),
        (
            "command-rule-create",
            Command::Rule(RuleCommand::Create {
                scope: RuleScope::Namespace,
                rule: rule("listen-all", Rights::LISTEN),
            }),
        ),
        (
            "command-rule-delete",
            Command::Rule(RuleCommand::Delete {
                scope: RuleScope::Hub(hub_name()),
                name: "orders-send".into(),
            }),
        ),
        (
            "command-rule-regenerate-primary-key",
            Command::Rule(RuleCommand::RegenerateKey {
                scope: RuleScope::Hub(hub_name()),
                name: "orders-send".into(),
                key: KeyKind::Primary,
                new_key: "new-primary-key".into(),
            }),
        ),
        (
            "command-rule-regenerate-secondary-key",
            Command::Rule(RuleCommand::RegenerateKey {
                scope: RuleScope::Namespace,
                name: "listen-all".into(),
                key: KeyKind::Secondary,
                new_key: "new-secondary-key".into(),
            }),
        ),
    ]
}

#[test]
fn commands_of_every_variant() {
    for (name, command) in commands() {
        check(name, &command, EVERY_FORMAT, decode_command);
    }
}

/// `SetFeatureLevel` came with format 2 (release 0.2.0): only nodes that read format 2 ever
/// receive it, so it has no format-1 file.
#[test]
fn set_feature_level_command() {
    let command = Command::SetFeatureLevel {
        level: 2,
        release: "0.2.0".into(),
    };
    check(
        "command-set-feature-level",
        &command,
        &[FORMAT_LATEST],
        decode_command,
    );
}

/// The Blob API's store commands and replies came with format 2 (release 0.2.0), proposed
/// only once the cluster reads it: they have no format-1 files.
#[test]
fn blob_store_commands_and_replies() {
    let metadata = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    let put = |kind, condition, create| {
        Command::Store(StoreCommand::PutBlob {
            hub: "orders".into(),
            group: "audit".into(),
            partition: 3,
            kind,
            metadata: metadata(&[("ownerid", "python-1"), ("extra", "")]),
            condition,
            create,
            now_ms: 1_714_000_950_000,
        })
    };
    let commands = [
        (
            "command-store-put-blob-if-match",
            put(
                BlobKind::Ownership,
                BlobCondition::IfMatch("0000000000000007".into()),
                false,
            ),
        ),
        (
            "command-store-put-blob-if-none-match",
            put(BlobKind::Checkpoint, BlobCondition::IfNoneMatchAny, true),
        ),
        (
            "command-store-put-blob-unconditional",
            put(BlobKind::Checkpoint, BlobCondition::None, true),
        ),
        (
            "command-store-list-blobs",
            Command::Store(StoreCommand::ListBlobs {
                hub: "orders".into(),
                group: "audit".into(),
            }),
        ),
    ];
    for (name, command) in commands {
        check(name, &command, &[FORMAT_LATEST], decode_command);
    }
    let view = |kind| BlobView {
        partition: 2,
        kind,
        etag: "c00000000000000ff".into(),
        last_modified_ms: 1_714_000_960_000,
        metadata: metadata(&[("offset", "4096"), ("sequencenumber", "")]),
    };
    let replies = [
        (
            "result-store-blobs",
            StoreReply::Blobs(vec![view(BlobKind::Ownership), view(BlobKind::Checkpoint)]),
        ),
        (
            "result-store-blob-written",
            StoreReply::BlobWrite(BlobWrite::Written(view(BlobKind::Checkpoint))),
        ),
        (
            "result-store-blob-not-found",
            StoreReply::BlobWrite(BlobWrite::NotFound),
        ),
        (
            "result-store-blob-condition-not-met",
            StoreReply::BlobWrite(BlobWrite::ConditionNotMet),
        ),
        (
            "result-store-blob-already-exists",
            StoreReply::BlobWrite(BlobWrite::AlreadyExists),
        ),
    ];
    for (name, reply) in replies {
        let result: CommandResult = Ok(Reply::Store(reply));
        check(name, &result, &[FORMAT_LATEST], decode_result);
    }
}

/// Kafka producer id blocks came with format 2 (release 0.2.0), proposed only once the
/// cluster reads it: no format-1 files.
#[test]
fn producer_id_commands_and_replies() {
    check(
        "command-store-allocate-producer-ids",
        &Command::Store(StoreCommand::AllocateProducerIds),
        &[FORMAT_LATEST],
        decode_command,
    );
    let result: CommandResult = Ok(Reply::Store(StoreReply::ProducerIds {
        first: 4_096 * 65_536,
        count: 65_536,
    }));
    check(
        "result-store-producer-ids",
        &result,
        &[FORMAT_LATEST],
        decode_result,
    );
}

/// The Kafka groups' offset commands and reply came with format 2 (release 0.2.0), proposed
/// only once the cluster reads it: they have no format-1 files.
#[test]
fn kafka_offset_commands_and_replies() {
    let commit = |hub: &str, partition, offset| KafkaOffsetCommit {
        hub: hub.into(),
        partition,
        offset,
        metadata: format!("meta-{offset}"),
    };
    let commands = [
        (
            "command-store-commit-kafka-offsets",
            Command::Store(StoreCommand::CommitKafkaOffsets {
                group: "billing".into(),
                offsets: vec![commit("orders", 1, 4_096), commit("audit", 0, 7)],
                now_ms: 1_714_000_980_000,
            }),
        ),
        (
            "command-store-list-kafka-offsets",
            Command::Store(StoreCommand::ListKafkaOffsets {
                group: "billing".into(),
                hub: Some("orders".into()),
            }),
        ),
        (
            "command-store-list-kafka-offsets-every-hub",
            Command::Store(StoreCommand::ListKafkaOffsets {
                group: "billing".into(),
                hub: None,
            }),
        ),
    ];
    for (name, command) in commands {
        check(name, &command, &[FORMAT_LATEST], decode_command);
    }
    let result: CommandResult = Ok(Reply::Store(StoreReply::KafkaOffsets(vec![
        crate::store::KafkaOffsetRecord {
            hub: "orders".into(),
            partition: 1,
            offset: crate::store::KafkaOffset {
                offset: 4_096,
                metadata: "meta-4096".into(),
                last_modified_ms: 1_714_000_990_000,
            },
        },
    ])));
    check(
        "result-store-kafka-offsets",
        &result,
        &[FORMAT_LATEST],
        decode_result,
    );
}

/// Each controller entry allocates its own block of producer ids, the same on every replica.
#[test]
fn producer_id_blocks_follow_the_log_index() {
    use crate::store::{PRODUCER_IDS_PER_BLOCK, producer_id_block};
    let mut applied = ControllerApplied::default();
    let mut firsts = Vec::new();
    for index in [5, 6, 9] {
        applied.last_applied = Some(raft_log_id(2, 1, index));
        let (result, changed) = applied.apply(Command::Store(StoreCommand::AllocateProducerIds));
        assert!(!changed);
        match result {
            Ok(Reply::Store(StoreReply::ProducerIds { first, count })) => {
                assert_eq!(count, PRODUCER_IDS_PER_BLOCK);
                firsts.push(first);
            }
            other => panic!("{other:?}"),
        }
    }
    let block = i64::from(PRODUCER_IDS_PER_BLOCK);
    assert_eq!(firsts, vec![5 * block, 6 * block, 9 * block]);
    assert!(producer_id_block(u64::MAX).is_none());
    assert!(producer_id_block(1 << 47).is_none());
}

/// One result of each reply variant (and of each variant of the store replies), and an
/// error of each kind.
#[test]
fn command_results_of_every_variant() {
    let ownership = |partition: u16| Ownership {
        owner_id: format!("processor-{partition}"),
        last_modified_ms: 1_714_000_400_000,
        etag: format!("{:016x}", partition + 1),
    };
    let checkpoint = Checkpoint {
        offset: 81_920,
        sequence_number: 4_000,
        last_modified_ms: 1_714_000_500_000,
    };
    let replies = [
        ("result-done", Reply::Done),
        ("result-hub", Reply::Hub(hub())),
        (
            "result-consumer-group-created",
            Reply::ConsumerGroupCreated {
                created_at_ms: 1_714_000_900_000,
            },
        ),
        (
            "result-store-ownership",
            Reply::Store(StoreReply::Ownership(vec![
                (0, ownership(0)),
                (1, ownership(1)),
            ])),
        ),
        (
            "result-store-checkpoints",
            Reply::Store(StoreReply::Checkpoints(vec![(1, checkpoint)])),
        ),
        (
            "result-store-checkpoint",
            Reply::Store(StoreReply::Checkpoint(checkpoint)),
        ),
        (
            "result-rule",
            Reply::Rule(rule("listen-all", Rights::LISTEN.union(Rights::SEND))),
        ),
    ];
    for (name, reply) in replies {
        let result: CommandResult = Ok(reply);
        check(name, &result, EVERY_FORMAT, decode_result);
    }
    let errors = [
        ("result-error-not-found", ErrorKind::NotFound),
        ("result-error-already-exists", ErrorKind::AlreadyExists),
        ("result-error-invalid-argument", ErrorKind::InvalidArgument),
        ("result-error-quota-exceeded", ErrorKind::QuotaExceeded),
        ("result-error-not-owner", ErrorKind::NotOwner),
    ];
    for (name, kind) in errors {
        let result: CommandResult = Err(CommandError {
            kind,
            message: format!("{kind:?}: refused"),
        });
        check(name, &result, EVERY_FORMAT, decode_result);
    }
}

/// The applied state (snapshots, `MetaKey::Applied`). Format 1 is [`ControllerApplied`]
/// alone, read at feature level 1; format 2 carries the feature level beside it, and is
/// what [`encode_applied`] writes for a state whose level allows it.
#[test]
fn applied_state_of_each_format() {
    let legacy = applied();
    assert_eq!(legacy.state.feature, ClusterFeature::default());
    golden::check(
        &golden_dir(),
        FORMAT_LEGACY,
        "applied",
        &legacy,
        // What `encode_applied` writes while the process writes format 1 (the process-wide
        // format is not this test's to set).
        |version, applied| format::encode_as(version, applied).expect("the state encodes"),
        |bytes| decode_applied(bytes).map_err(|e| e.to_string()),
    );
    let mut raised = applied();
    raised.state.feature = ClusterFeature {
        level: 2,
        release: "0.2.0".into(),
    };
    golden::check(
        &golden_dir(),
        FORMAT_LATEST,
        "applied",
        &raised,
        |version, applied| {
            let bytes = encode_applied(applied).expect("the state encodes");
            assert_eq!(
                format::split(&bytes).expect("a known format").0,
                version,
                "a state at feature level 2 is written in format 2"
            );
            bytes
        },
        |bytes| decode_applied(bytes).map_err(|e| e.to_string()),
    );
}

/// A format-2 applied state whose checkpoint store holds Blob API metadata carries it after
/// the feature level; one without any ends at the feature level, as before it existed.
#[test]
fn applied_state_with_blob_metadata() {
    let mut applied = applied();
    applied.state.feature = ClusterFeature {
        level: 2,
        release: "0.2.0".into(),
    };
    let command = StoreCommand::PutBlob {
        hub: "orders".into(),
        group: "audit".into(),
        partition: 1,
        kind: BlobKind::Checkpoint,
        metadata: [
            ("offset", "8192"),
            ("sequencenumber", ""),
            ("clientidentifier", "a"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
        condition: BlobCondition::None,
        create: true,
        now_ms: 1_714_000_970_000,
    };
    applied
        .store
        .apply(&applied.state, command)
        .expect("the sample applies");
    assert_eq!(applied.store.blob_metadata().len(), 1);
    golden::check(
        &golden_dir(),
        FORMAT_LATEST,
        "applied-blob-metadata",
        &applied,
        |_, applied| encode_applied(applied).expect("the state encodes"),
        |bytes| decode_applied(bytes).map_err(|e| e.to_string()),
    );
    let decoded = decode_applied(&encode_applied(&applied).unwrap()).unwrap();
    assert_eq!(decoded.store.blob_metadata(), applied.store.blob_metadata());
}

/// A format-2 applied state whose store holds Kafka groups' offsets carries them after the
/// Blob API metadata (empty here, so one byte), which follows the feature level.
#[test]
fn applied_state_with_kafka_offsets() {
    let mut applied = applied();
    applied.state.feature = ClusterFeature {
        level: 2,
        release: "0.2.0".into(),
    };
    let command = StoreCommand::CommitKafkaOffsets {
        group: "billing".into(),
        offsets: vec![KafkaOffsetCommit {
            hub: "orders".into(),
            partition: 1,
            offset: 512,
            metadata: "consumer-1".into(),
        }],
        now_ms: 1_714_000_995_000,
    };
    applied
        .store
        .apply(&applied.state, command)
        .expect("the sample applies");
    assert!(applied.store.blob_metadata().is_empty());
    golden::check(
        &golden_dir(),
        FORMAT_LATEST,
        "applied-kafka-offsets",
        &applied,
        |_, applied| encode_applied(applied).expect("the state encodes"),
        |bytes| decode_applied(bytes).map_err(|e| e.to_string()),
    );
    let decoded = decode_applied(&encode_applied(&applied).unwrap()).unwrap();
    assert_eq!(decoded.store.kafka_offsets(), applied.store.kafka_offsets());
    assert_eq!(decoded.store.kafka_offsets().len(), 1);
}

/// The cluster state as cluster views carry it (its feature level travels beside it).
#[test]
fn cluster_state_in_views() {
    check("cluster-state", &cluster_state(), EVERY_FORMAT, |bytes| {
        format::decode::<ClusterState>(bytes)
    });
}

/// The stored snapshot record (`MetaKey::Snapshot`): its metadata and its payload (an
/// encoded applied state).
#[test]
fn snapshot_record() {
    let meta = SnapshotMeta {
        last_log_id: Some(raft_log_id(2, 1, 90)),
        last_membership: membership(),
    };
    let record = (meta, b"\x80\x00\x02applied".to_vec());
    check("snapshot-record", &record, EVERY_FORMAT, |bytes| {
        tributary_raft::decode::<(SnapshotMeta, Vec<u8>)>(bytes)
    });
}
