use std::collections::BTreeMap;

use super::*;
use crate::state::{ClusterState, Command, ErrorKind, NewHub, test_cluster};
use crate::store::{Claim, StoreCommand, StoreReply};

fn cluster() -> ClusterState {
    let mut state = test_cluster(3);
    state
        .apply(Command::CreateHub(NewHub {
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

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

struct Store {
    cluster: ClusterState,
    store: ConsumerStore,
    now_ms: i64,
}

impl Store {
    fn new() -> Self {
        Store {
            cluster: cluster(),
            store: ConsumerStore::default(),
            now_ms: 1_000,
        }
    }

    fn put(
        &mut self,
        kind: BlobKind,
        partition: u16,
        metadata: BTreeMap<String, String>,
        condition: BlobCondition,
        create: bool,
    ) -> BlobWrite {
        self.now_ms += 1_000;
        match self
            .store
            .apply(
                &self.cluster,
                StoreCommand::PutBlob {
                    hub: "orders".into(),
                    group: "$Default".into(),
                    partition,
                    kind,
                    metadata,
                    condition,
                    create,
                    now_ms: self.now_ms,
                },
            )
            .unwrap()
        {
            StoreReply::BlobWrite(write) => write,
            other => panic!("{other:?}"),
        }
    }

    fn claim_as_owner(&mut self, owner: &str, condition: BlobCondition) -> BlobWrite {
        // Python's claim: Set Blob Metadata, then Put Blob when the blob is missing.
        match self.put(
            BlobKind::Ownership,
            0,
            meta(&[("ownerid", owner)]),
            condition.clone(),
            false,
        ) {
            BlobWrite::NotFound => self.put(
                BlobKind::Ownership,
                0,
                meta(&[("ownerid", owner)]),
                condition,
                true,
            ),
            other => other,
        }
    }

    fn list(&mut self) -> Vec<BlobView> {
        match self
            .store
            .apply(
                &self.cluster,
                StoreCommand::ListBlobs {
                    hub: "orders".into(),
                    group: "$Default".into(),
                },
            )
            .unwrap()
        {
            StoreReply::Blobs(blobs) => blobs,
            other => panic!("{other:?}"),
        }
    }
}

fn written(write: BlobWrite) -> BlobView {
    match write {
        BlobWrite::Written(view) => view,
        other => panic!("expected a write, got {other:?}"),
    }
}

#[test]
fn conditions_follow_azure_for_set_metadata_and_put_blob() {
    let mut s = Store::new();
    let owner = |o: &str| meta(&[("ownerid", o)]);
    // Set Metadata on a missing blob is 404 whatever its condition.
    for condition in [
        BlobCondition::None,
        BlobCondition::IfNoneMatchAny,
        BlobCondition::IfMatch("x".into()),
    ] {
        let put = s.put(BlobKind::Ownership, 0, owner("a"), condition, false);
        assert_eq!(put, BlobWrite::NotFound);
    }
    // Put Blob with If-Match on a missing blob: 412, not 404.
    let put = s.put(
        BlobKind::Ownership,
        0,
        owner("a"),
        BlobCondition::IfMatch("x".into()),
        true,
    );
    assert_eq!(put, BlobWrite::ConditionNotMet);
    let first = written(s.put(
        BlobKind::Ownership,
        0,
        owner("a"),
        BlobCondition::IfNoneMatchAny,
        true,
    ));
    // Put Blob with If-None-Match: * on an existing blob: 409; Set Metadata: 412.
    let put = s.put(
        BlobKind::Ownership,
        0,
        owner("b"),
        BlobCondition::IfNoneMatchAny,
        true,
    );
    assert_eq!(put, BlobWrite::AlreadyExists);
    let put = s.put(
        BlobKind::Ownership,
        0,
        owner("b"),
        BlobCondition::IfNoneMatchAny,
        false,
    );
    assert_eq!(put, BlobWrite::ConditionNotMet);
    // A renewal with the same values still gets a new ETag and a later time.
    let renewed = written(s.put(
        BlobKind::Ownership,
        0,
        owner("a"),
        BlobCondition::IfMatch(first.etag.clone()),
        false,
    ));
    assert_ne!(renewed.etag, first.etag);
    assert!(renewed.last_modified_ms > first.last_modified_ms);
    // The stale ETag now loses, through either call.
    for create in [false, true] {
        let put = s.put(
            BlobKind::Ownership,
            0,
            owner("b"),
            BlobCondition::IfMatch(first.etag.clone()),
            create,
        );
        assert_eq!(put, BlobWrite::ConditionNotMet);
    }
    // No condition: last writer wins.
    let put = written(s.put(
        BlobKind::Ownership,
        0,
        owner("c"),
        BlobCondition::None,
        true,
    ));
    assert_eq!(put.metadata, owner("c"));
}

#[test]
fn two_claims_with_one_etag_have_one_winner() {
    let mut s = Store::new();
    let first = written(s.claim_as_owner("a", BlobCondition::IfNoneMatchAny));
    let etag = BlobCondition::IfMatch(first.etag);
    let b = s.claim_as_owner("b", etag.clone());
    let c = s.claim_as_owner("c", etag);
    assert!(matches!(b, BlobWrite::Written(_)), "{b:?}");
    assert_eq!(c, BlobWrite::ConditionNotMet);
    // Two first claims: one creates, the other finds it made.
    let mut s = Store::new();
    written(s.claim_as_owner("a", BlobCondition::IfNoneMatchAny));
    let second = s.claim_as_owner("b", BlobCondition::IfNoneMatchAny);
    assert_eq!(second, BlobWrite::ConditionNotMet);
}

#[test]
fn blob_and_typed_claims_share_the_record_and_its_etag() {
    let mut s = Store::new();
    let blob = written(s.claim_as_owner("python-1", BlobCondition::IfNoneMatchAny));
    let typed = s.store.apply(
        &s.cluster,
        StoreCommand::ListOwnership {
            hub: "orders".into(),
            group: "$Default".into(),
        },
    );
    let StoreReply::Ownership(records) = typed.unwrap() else {
        panic!()
    };
    assert_eq!(records[0].1.owner_id, "python-1");
    assert_eq!(records[0].1.etag, blob.etag);
    // A typed claim with that etag takes it; the Blob API then sees the new owner and etag
    // and the old one loses.
    let StoreReply::Ownership(won) = s
        .store
        .apply(
            &s.cluster,
            StoreCommand::ClaimOwnership {
                hub: "orders".into(),
                group: "$Default".into(),
                claims: vec![Claim {
                    partition: 0,
                    owner_id: "rust-1".into(),
                    etag: Some(blob.etag.clone()),
                }],
                now_ms: 50_000,
            },
        )
        .unwrap()
    else {
        panic!()
    };
    assert_eq!(won.len(), 1);
    let listed = s.list();
    assert_eq!(listed[0].metadata, meta(&[("ownerid", "rust-1")]));
    assert_eq!(listed[0].etag, won[0].1.etag);
    let lost = s.claim_as_owner("python-1", BlobCondition::IfMatch(blob.etag));
    assert_eq!(lost, BlobWrite::ConditionNotMet);
}

#[test]
fn checkpoints_keep_raw_metadata_and_set_the_typed_record() {
    let mut s = Store::new();
    let python = meta(&[("offset", "1024"), ("sequencenumber", "7")]);
    assert_eq!(
        s.put(
            BlobKind::Checkpoint,
            1,
            python.clone(),
            BlobCondition::None,
            false
        ),
        BlobWrite::NotFound
    );
    let first = written(s.put(
        BlobKind::Checkpoint,
        1,
        python.clone(),
        BlobCondition::None,
        true,
    ));
    assert_eq!(first.metadata, python);
    let key = (s.cluster.hubs["orders"].id, "$Default".to_string(), 1);
    assert_eq!(s.store.checkpoints[&key].sequence_number, 7);
    assert_eq!(s.store.checkpoints[&key].offset, 1024);
    // What the typed API would show is not stored twice.
    assert!(s.store.blob_metadata().is_empty());
    // A .NET-style checkpoint: an empty sequence number and an extra key, read back as
    // written; the typed record knows no sequence number.
    let dotnet = meta(&[
        ("offset", "2048"),
        ("sequencenumber", ""),
        ("clientidentifier", "host-1"),
    ]);
    let second = written(s.put(
        BlobKind::Checkpoint,
        1,
        dotnet.clone(),
        BlobCondition::None,
        false,
    ));
    assert_eq!(second.metadata, dotnet);
    assert_ne!(second.etag, first.etag);
    assert_eq!(s.store.checkpoints[&key].sequence_number, -1);
    assert_eq!(s.list()[0].metadata, dotnet);
    // A typed checkpoint replaces it; the Blob API shows its fields.
    s.store
        .apply(
            &s.cluster,
            StoreCommand::UpdateCheckpoint {
                hub: "orders".into(),
                group: "$Default".into(),
                partition: 1,
                offset: 4096,
                sequence_number: 9,
                owner: None,
                now_ms: 90_000,
            },
        )
        .unwrap();
    let listed = s.list();
    assert_eq!(
        listed[0].metadata,
        meta(&[("offset", "4096"), ("sequencenumber", "9")])
    );
    assert_eq!(listed[0].kind, BlobKind::Checkpoint);
    assert!(s.store.blob_metadata().is_empty());
}

#[test]
fn bad_writes_are_refused_with_a_reason() {
    let mut s = Store::new();
    let big = meta(&[("ownerid", &"x".repeat(BLOB_METADATA_BYTES_MAX))]);
    let err = s
        .store
        .apply(
            &s.cluster,
            StoreCommand::PutBlob {
                hub: "orders".into(),
                group: "$Default".into(),
                partition: 9,
                kind: BlobKind::Ownership,
                metadata: meta(&[("ownerid", "a")]),
                condition: BlobCondition::None,
                create: true,
                now_ms: 1,
            },
        )
        .unwrap_err();
    assert!(err.message.contains("partitions are 0 to 3"), "{err}");
    let err = s
        .store
        .apply(
            &s.cluster,
            StoreCommand::PutBlob {
                hub: "orders".into(),
                group: "$Default".into(),
                partition: 0,
                kind: BlobKind::Ownership,
                metadata: big,
                condition: BlobCondition::None,
                create: true,
                now_ms: 1,
            },
        )
        .unwrap_err();
    assert_eq!(err.kind, ErrorKind::InvalidArgument);
    assert!(err.message.contains("at most 8192"), "{err}");
    assert!(s.list().is_empty());
}
