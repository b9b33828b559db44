use super::*;
use crate::state::{ClusterState, Command, ErrorKind, NewHub, test_cluster};
use crate::store::{StoreCommand, StoreReply};

fn new_hub(name: &str) -> Command {
    Command::CreateHub(NewHub {
        name: name.into(),
        partition_count: 4,
        retention_ms: 3_600_000,
        replication_factor: None,
        partitions_max: 64,
        now_ms: 1,
        down_nodes: Vec::new(),
        throughput_units: 0,
        settings: Default::default(),
    })
}

fn cluster() -> ClusterState {
    let mut state = test_cluster(3);
    state.apply(new_hub("orders")).unwrap();
    state.apply(new_hub("audit")).unwrap();
    state
}

fn commit(hub: &str, partition: u16, offset: i64) -> KafkaOffsetCommit {
    KafkaOffsetCommit {
        hub: hub.into(),
        partition,
        offset,
        metadata: format!("m{offset}"),
    }
}

fn run(
    store: &mut ConsumerStore,
    cluster: &ClusterState,
    command: StoreCommand,
) -> Result<Vec<KafkaOffsetRecord>, CommandError> {
    match store.apply(cluster, command)? {
        StoreReply::KafkaOffsets(records) => Ok(records),
        other => panic!("{other:?}"),
    }
}

fn commit_all(
    store: &mut ConsumerStore,
    cluster: &ClusterState,
    group: &str,
    offsets: Vec<KafkaOffsetCommit>,
) -> Result<Vec<KafkaOffsetRecord>, CommandError> {
    run(
        store,
        cluster,
        StoreCommand::CommitKafkaOffsets {
            group: group.into(),
            offsets,
            now_ms: 500,
        },
    )
}

fn list(
    store: &mut ConsumerStore,
    cluster: &ClusterState,
    group: &str,
    hub: Option<&str>,
) -> Vec<(String, u16, i64)> {
    run(
        store,
        cluster,
        StoreCommand::ListKafkaOffsets {
            group: group.into(),
            hub: hub.map(str::to_string),
        },
    )
    .unwrap()
    .into_iter()
    .map(|r| (r.hub, r.partition, r.offset.offset))
    .collect()
}

#[test]
fn a_commit_of_many_hubs_and_partitions_is_stored_whole_and_listed_per_group() {
    let cluster = cluster();
    let mut store = ConsumerStore::default();
    let stored = commit_all(
        &mut store,
        &cluster,
        "billing",
        vec![
            commit("orders", 0, 10),
            commit("orders", 3, 7),
            commit("audit", 1, 2),
        ],
    )
    .unwrap();
    assert_eq!(stored.len(), 3);
    assert_eq!(stored[0].offset.metadata, "m10");
    assert_eq!(stored[0].offset.last_modified_ms, 500);
    commit_all(&mut store, &cluster, "other", vec![commit("orders", 0, 99)]).unwrap();
    // A later commit replaces the partition's offset (even a lower one: a reset).
    commit_all(
        &mut store,
        &cluster,
        "billing",
        vec![commit("orders", 0, 4)],
    )
    .unwrap();
    assert_eq!(
        list(&mut store, &cluster, "billing", None),
        vec![
            ("audit".into(), 1, 2),
            ("orders".into(), 0, 4),
            ("orders".into(), 3, 7)
        ]
    );
    assert_eq!(
        list(&mut store, &cluster, "billing", Some("orders")),
        vec![("orders".into(), 0, 4), ("orders".into(), 3, 7)]
    );
    assert!(list(&mut store, &cluster, "nobody", None).is_empty());
    assert_eq!(store.kafka_groups(None), vec!["billing", "other"]);
    let audit = cluster.hubs["audit"].id;
    assert_eq!(store.kafka_groups(Some(audit)), vec!["billing"]);
    // The hubs' Event Hubs consumer groups see none of it.
    assert!(store.checkpoint_sequences().is_empty());
}

#[test]
fn a_commit_with_one_bad_offset_stores_nothing() {
    let cluster = cluster();
    let mut store = ConsumerStore::default();
    let bad = [
        (
            commit("orders", 4, 1),
            ErrorKind::InvalidArgument,
            "partitions are 0 to 3",
        ),
        (commit("nowhere", 0, 1), ErrorKind::NotFound, "nowhere"),
        (
            commit("orders", 1, -1),
            ErrorKind::InvalidArgument,
            "0 or more",
        ),
        (
            KafkaOffsetCommit {
                metadata: "x".repeat(KAFKA_OFFSET_METADATA_BYTES_MAX + 1),
                ..commit("orders", 1, 1)
            },
            ErrorKind::InvalidArgument,
            "metadata",
        ),
    ];
    for (offset, kind, text) in bad {
        let err = commit_all(
            &mut store,
            &cluster,
            "g",
            vec![commit("orders", 0, 1), offset],
        )
        .unwrap_err();
        assert_eq!(err.kind, kind, "{err}");
        assert!(err.message.contains(text), "{err}");
    }
    assert!(store.kafka_offsets().is_empty());
    for group in ["", &"g".repeat(KAFKA_GROUP_ID_LEN_MAX + 1)] {
        let err =
            commit_all(&mut store, &cluster, group, vec![commit("orders", 0, 1)]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }
    let longest = "g".repeat(KAFKA_GROUP_ID_LEN_MAX);
    commit_all(&mut store, &cluster, &longest, vec![commit("orders", 0, 1)]).unwrap();
}

#[test]
fn groups_per_hub_are_bounded() {
    let cluster = cluster();
    let mut store = ConsumerStore::default();
    for g in 0..KAFKA_GROUPS_PER_HUB_MAX {
        commit_all(
            &mut store,
            &cluster,
            &format!("g{g}"),
            vec![commit("orders", 0, 1)],
        )
        .unwrap();
    }
    let err = commit_all(
        &mut store,
        &cluster,
        "one-more",
        vec![commit("orders", 0, 1)],
    )
    .unwrap_err();
    assert_eq!(err.kind, ErrorKind::QuotaExceeded, "{err}");
    // Existing groups go on committing; another hub has room.
    commit_all(&mut store, &cluster, "g7", vec![commit("orders", 2, 5)]).unwrap();
    commit_all(
        &mut store,
        &cluster,
        "one-more",
        vec![commit("audit", 0, 1)],
    )
    .unwrap();
}

#[test]
fn offsets_go_with_their_hub() {
    let mut cluster = cluster();
    let mut store = ConsumerStore::default();
    commit_all(
        &mut store,
        &cluster,
        "g",
        vec![commit("orders", 0, 3), commit("audit", 0, 4)],
    )
    .unwrap();
    cluster
        .apply(Command::DeleteHub {
            name: "orders".into(),
        })
        .unwrap();
    store.prune(&cluster);
    assert_eq!(
        list(&mut store, &cluster, "g", None),
        vec![("audit".into(), 0, 4)]
    );
    // A new hub of the same name starts without them.
    cluster.apply(new_hub("orders")).unwrap();
    store.prune(&cluster);
    assert!(list(&mut store, &cluster, "g", Some("orders")).is_empty());
}
