//! Golden files of what a partition writes to storage or receives from another node: its
//! applied state (`MetaKey::Applied` and `MetaKey::SnapshotState`, and the state a streamed
//! snapshot carries), its snapshot metadata (`MetaKey::Snapshot`), a snapshot sent whole (as
//! releases before 0.1.0 sent them; only read), and the event batch inside every append
//! entry (see [`tributary_types::format`]). Each test decodes the files with the partition's
//! own code and checks that encoding its sample gives the same bytes, so a change to a field
//! or to the order of a variant fails here.
//!
//! The files under `broker/partition/golden/format-1/` are release 0.1.0's bytes: none of these types
//! (nor openraft's, nor postcard's version) changed between that release (commit 357b040)
//! and the one that introduced format 2, so what format 1 encodes today is what 0.1.0 wrote.
//! An event batch has no envelope in any format (it travels inside an entry, which has one):
//! its files sit with format 1, whose values have none. Missing files are written by
//! `TRIBUTARY_WRITE_GOLDEN=1 cargo test -p tributary-broker golden`; files of a format that
//! shipped are never rewritten.
//!
//! The state machine's own decoders (`decode_applied`, `SnapshotPayload::decode`) are
//! private to it, so the applied state and the whole snapshot are read the way a replica
//! reads them: a state machine opens a shard holding the golden state, or installs the
//! golden snapshot, and what it then writes is read back.

use std::collections::BTreeMap;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use serde::Serialize;
use tributary_raft::openraft_api::testing::log_id;
use tributary_raft::openraft_api::{BasicNode, RaftSnapshotBuilder, RaftStateMachine};
use tributary_raft::{
    AppendOutcome, CaptureRange, LogId, SnapshotData, SnapshotMeta, StoredMembership, TypeConfig,
};
use tributary_storage::{Durability, IndexRow, MetaKey, Mutation, Shard, ShardConfig};
use tributary_types::format::{self, FORMAT_LATEST, FORMAT_LEGACY, golden};
use tributary_types::{GroupId, HubId, PartitionId};

use super::codec::{self, DecodedEvent, EventRecord, Property};
use super::state_machine::{
    AppliedState, CaptureProgress, PartitionStateMachine, ProducerState, Progress,
};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

fn group() -> GroupId {
    GroupId::new(HubId(3), PartitionId(1), 2)
}

fn raft_log_id(index: u64) -> LogId {
    log_id::<TypeConfig>(8, 3, index)
}

/// Voters 1 to 3, with their peer addresses.
fn membership() -> StoredMembership {
    let nodes: BTreeMap<u64, BasicNode> = (1..=3)
        .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:7101"))))
        .collect();
    StoredMembership::new(Some(raft_log_id(2)), nodes.into())
}

/// A partition's state with a value in every field.
fn applied_state() -> AppliedState {
    let outcome = |first_sequence| AppendOutcome {
        first_sequence,
        first_offset: first_sequence * 20,
        enqueued_time_ms: 1_714_000_000_000 + first_sequence,
    };
    AppliedState {
        last_applied: Some(raft_log_id(420)),
        membership: membership(),
        progress: Progress {
            begin_sequence: 100,
            next_sequence: 4_003,
            next_offset: 80_060,
            last_offset: 80_040,
            last_time_ms: 1_714_000_004_003,
        },
        producers: BTreeMap::from([
            (
                77,
                ProducerState {
                    last_sequence: 1_000,
                    last_outcome: outcome(3_990),
                    next_sequence: 1_005,
                    last_log_index: 418,
                },
            ),
            (
                91,
                ProducerState {
                    last_sequence: 20,
                    last_outcome: outcome(4_000),
                    next_sequence: 23,
                    last_log_index: 420,
                },
            ),
        ]),
        capture: CaptureProgress {
            next_sequence: 3_000,
            last_file_time_ms: Some(1_714_000_001_000),
            claimed: Some(CaptureRange {
                from_sequence: 3_000,
                next_sequence: 3_500,
                file_time_ms: 1_714_000_002_000,
            }),
        },
        kafka_producers: Default::default(),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

async fn write_meta(shard: &Shard, key: MetaKey, value: &[u8]) {
    let put = Mutation::PutMeta {
        group: group(),
        key,
        value: Bytes::copy_from_slice(value),
    };
    shard
        .write(vec![put], Durability::Immediate)
        .await
        .expect("the shard writes");
}

/// The state a partition state machine opens with when its shard holds `bytes` as its
/// applied state, read back from the snapshot state it records (which holds all of it).
fn open_applied(bytes: &[u8]) -> Result<AppliedState, String> {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default())
            .map_err(|e| e.to_string())?;
        write_meta(&shard, MetaKey::Applied, bytes).await;
        let (mut machine, _) =
            PartitionStateMachine::open(group(), shard.clone()).map_err(|e| e.to_string())?;
        machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .map_err(|e| e.to_string())?;
        let recorded = shard
            .meta(group(), MetaKey::SnapshotState)
            .map_err(|e| e.to_string())?
            .ok_or("no snapshot state recorded")?;
        format::decode(&recorded).map_err(|e| e.to_string())
    })
}

/// The applied state, in format 1 (release 0.1.0's) and format 2, read by the state machine
/// as it opens.
#[test]
fn applied_state_of_each_format() {
    for version in [FORMAT_LEGACY, FORMAT_LATEST] {
        golden::check(
            &golden_dir(),
            version,
            "applied",
            &applied_state(),
            |version, state| format::encode_as(version, state).expect("the state encodes"),
            open_applied,
        );
    }
}

/// A state with Kafka producers (feature level 2): format 2 only, with the producers after
/// the rest. Read by the state machine as it opens, and back from the snapshot state it
/// records, so they survive restarts and travel in snapshots.
#[test]
fn applied_state_with_kafka_producers() {
    use crate::kafka_producers::KafkaProducers;
    use crate::state_machine::{decode_applied, encode_applied};
    use tributary_raft::KafkaProducerStamp;

    let mut state = applied_state();
    let mut producers = KafkaProducers::default();
    for (producer_id, epoch, base_sequence, first_sequence, log_index) in [
        (4_096_001, 0, 0, 3_995, 419),
        (4_096_001, 0, 5, 3_998, 420),
        (4_096_002, 2, 0, 4_001, 420),
    ] {
        let stamp = KafkaProducerStamp {
            producer_id,
            epoch,
            base_sequence,
        };
        let outcome = AppendOutcome {
            first_sequence,
            first_offset: first_sequence * 20,
            enqueued_time_ms: 1_714_000_000_000 + first_sequence,
        };
        producers.record(stamp, 3, outcome, log_index);
    }
    state.kafka_producers = producers;
    golden::check(
        &golden_dir(),
        FORMAT_LATEST,
        "applied-kafka-producers",
        &state,
        |_, state| encode_applied(state).expect("the state encodes").to_vec(),
        |bytes| {
            let recorded = runtime().block_on(async {
                let dir = tempfile::tempdir().expect("a temporary directory");
                let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default())
                    .map_err(|e| e.to_string())?;
                write_meta(&shard, MetaKey::Applied, bytes).await;
                let (mut machine, _) = PartitionStateMachine::open(group(), shard.clone())
                    .map_err(|e| e.to_string())?;
                machine
                    .get_snapshot_builder()
                    .await
                    .build_snapshot()
                    .await
                    .map_err(|e| e.to_string())?;
                shard
                    .meta(group(), MetaKey::SnapshotState)
                    .map_err(|e| e.to_string())?
                    .ok_or_else(|| "no snapshot state recorded".to_string())
            })?;
            decode_applied(&recorded).map_err(|e| e.to_string())
        },
    );
    // Without Kafka producers, the state encodes exactly as before they existed.
    let plain = applied_state();
    assert_eq!(
        encode_applied(&plain).unwrap(),
        tributary_raft::encode(&plain).unwrap()
    );
}

/// The snapshot metadata a partition records (`MetaKey::Snapshot`), read as
/// `get_current_snapshot` reads it.
#[test]
fn snapshot_meta() {
    let meta = SnapshotMeta {
        last_log_id: Some(raft_log_id(420)),
        last_membership: membership(),
    };
    for version in [FORMAT_LEGACY, FORMAT_LATEST] {
        golden::check(
            &golden_dir(),
            version,
            "snapshot-meta",
            &meta,
            |version, meta| format::encode_as(version, meta).expect("the meta encodes"),
            |bytes| tributary_raft::decode::<SnapshotMeta>(bytes).map_err(|e| e.to_string()),
        );
    }
}

/// A snapshot sent whole, as releases before 0.1.0 wrote it: the state as before Capture,
/// the index rows as tuples and the log, then the capture progress.
#[derive(Serialize)]
struct WholeSnapshotWire<'a> {
    state: StateBeforeCapture<'a>,
    index: Vec<(i64, u64, i64, i64, u32)>,
    log: &'a [(u64, Bytes)],
}

#[derive(Serialize)]
struct StateBeforeCapture<'a> {
    last_applied: &'a Option<LogId>,
    membership: &'a StoredMembership,
    progress: &'a Progress,
    producers: &'a BTreeMap<u64, ProducerState>,
}

/// What installing a whole snapshot leaves in a replica's storage.
#[derive(Debug, PartialEq)]
struct Installed {
    state: AppliedState,
    index: Vec<IndexRow>,
    log: Vec<(u64, Bytes)>,
}

fn encode_whole(installed: &Installed) -> Vec<u8> {
    let state = &installed.state;
    let wire = WholeSnapshotWire {
        state: StateBeforeCapture {
            last_applied: &state.last_applied,
            membership: &state.membership,
            progress: &state.progress,
            producers: &state.producers,
        },
        index: installed
            .index
            .iter()
            .map(|row| {
                (
                    row.first_sequence,
                    row.log_index,
                    row.first_offset,
                    row.enqueued_time_ms,
                    row.event_count,
                )
            })
            .collect(),
        log: &installed.log,
    };
    postcard::to_allocvec(&(wire, state.capture)).expect("the snapshot encodes")
}

/// Installs `bytes` as a snapshot received whole through `meta`, and reads back what the
/// replica then holds.
fn install_whole(meta: &SnapshotMeta, bytes: &[u8]) -> Result<Installed, String> {
    runtime().block_on(async {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let shard = Shard::open(&dir.path().join("s.redb"), ShardConfig::default())
            .map_err(|e| e.to_string())?;
        let (mut machine, _) =
            PartitionStateMachine::open(group(), shard.clone()).map_err(|e| e.to_string())?;
        let snapshot = SnapshotData::Whole(Cursor::new(bytes.to_vec()));
        machine
            .install_snapshot(meta, snapshot)
            .await
            .map_err(|e| e.to_string())?;
        let last_index = meta.last_log_id.map_or(0, |id| id.index);
        let state = shard
            .meta(group(), MetaKey::Applied)
            .map_err(|e| e.to_string())?
            .ok_or("no applied state stored")?;
        Ok(Installed {
            state: format::decode(&state).map_err(|e| e.to_string())?,
            index: shard
                .index_rows(group(), last_index)
                .map_err(|e| e.to_string())?,
            log: shard
                .log_entries(group(), 0, last_index + 1)
                .map_err(|e| e.to_string())?,
        })
    })
}

/// A snapshot sent whole: only releases before 0.1.0 sent one, so it exists in format 1
/// only, and is only read (installed).
#[test]
fn whole_snapshot() {
    let state = applied_state();
    let meta = SnapshotMeta {
        last_log_id: state.last_applied,
        last_membership: state.membership.clone(),
    };
    let installed = Installed {
        index: vec![
            IndexRow {
                first_sequence: 3_990,
                log_index: 418,
                first_offset: 79_800,
                enqueued_time_ms: 1_714_000_003_990,
                event_count: 10,
            },
            IndexRow {
                first_sequence: 4_000,
                log_index: 420,
                first_offset: 80_000,
                enqueued_time_ms: 1_714_000_004_000,
                event_count: 3,
            },
        ],
        log: vec![
            (418, Bytes::from_static(b"entry-418")),
            (419, Bytes::from_static(b"entry-419")),
            (420, Bytes::from_static(b"entry-420")),
        ],
        state,
    };
    golden::check(
        &golden_dir(),
        FORMAT_LEGACY,
        "snapshot-whole",
        &installed,
        |_, installed| encode_whole(installed),
        |bytes| install_whole(&meta, bytes),
    );
}

/// Events with and without a partition key, together holding every property type.
fn events() -> Vec<EventRecord> {
    vec![
        EventRecord {
            partition_key: Some("customer-42".into()),
            properties: vec![
                ("kind".into(), Property::String("order".into())),
                ("count".into(), Property::Int64(-7)),
                ("ratio".into(), Property::Double(2.5)),
            ],
            body: Bytes::from_static(b"{\"order\":1}"),
        },
        EventRecord {
            partition_key: None,
            properties: vec![
                ("urgent".into(), Property::Bool(true)),
                (
                    "digest".into(),
                    Property::Bytes(Bytes::from_static(b"\x00\xff")),
                ),
                ("due".into(), Property::TimestampMs(1_714_000_000_000)),
            ],
            body: Bytes::from_static(b"second"),
        },
        EventRecord {
            partition_key: Some("customer-7".into()),
            properties: Vec::new(),
            body: Bytes::from_static(b"third"),
        },
    ]
}

fn decode_events(batch: &[u8]) -> Result<Vec<DecodedEvent>, String> {
    codec::decode_batch(batch).map_err(|e| e.to_string())
}

/// A batch of events as an append entry carries it, and as compaction rewrites it (the
/// second event removed: a hole frame stands for it).
#[test]
fn event_batches() {
    let records = events();
    let batch = codec::encode_batch(&records);
    let positions = codec::frame_positions(&batch).expect("a batch as written");
    let decoded: Vec<DecodedEvent> = records
        .iter()
        .zip(positions)
        .enumerate()
        .map(|(index, (record, position))| DecodedEvent {
            index: index as u32,
            position,
            record: record.clone(),
        })
        .collect();
    golden::check(
        &golden_dir(),
        FORMAT_LEGACY,
        "event-batch",
        &decoded,
        |_, events| {
            let records: Vec<EventRecord> = events.iter().map(|e| e.record.clone()).collect();
            codec::encode_batch(&records).to_vec()
        },
        decode_events,
    );
    let kept: Vec<DecodedEvent> = decoded
        .iter()
        .filter(|event| event.index != 1)
        .cloned()
        .collect();
    golden::check(
        &golden_dir(),
        FORMAT_LEGACY,
        "event-batch-compacted",
        &kept,
        // Compaction rewrites the batch as written: the events it keeps alone do not make it.
        |_, _| {
            codec::compact_batch(&batch, |index| index != 1)
                .expect("the batch compacts")
                .to_vec()
        },
        decode_events,
    );
}
