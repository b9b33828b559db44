//! Golden files of every value this crate writes to storage or sends to a peer: Raft log
//! entries of each payload kind, the vote, the committed and purged log ids, proposal
//! results, a replica's member id, and every peer message with its reply (see
//! [`tributary_types::format`]). Each test decodes the files of every format this release
//! reads and checks that encoding its sample gives the same bytes, so a change to a field or
//! to the order of a variant fails here.
//!
//! The files under `raft/golden/format-1/` are release 0.1.0's bytes: none of these types
//! (nor openraft's, nor postcard's version) changed between that release (commit 357b040)
//! and the one that introduced format 2, so what format 1 encodes today is what 0.1.0 wrote.
//! Missing files are written by `TRIBUTARY_WRITE_GOLDEN=1 cargo test -p tributary-raft
//! golden`; files of a format that shipped are never rewritten.
//!
//! Each sample fills every field with a value other than its default, so a field dropped,
//! added or retyped changes the bytes.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use openraft::alias::{LogIdOf, VoteOf};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, TransferLeaderError,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft::{BasicNode, EntryPayload, Membership};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tributary_storage::{IndexRow, LogPiece};
use tributary_types::format::{self, golden};

use crate::network::{PieceBody, SnapshotChunk, SnapshotPiece};
use crate::quiet::QuietBeat;
use crate::types::{
    AppendBatch, AppendOutcome, CaptureRange, Entry, KafkaProducerStamp, ProducerStamp, Proposal,
    ProposalResult, SnapshotMeta, StoredMembership, TypeConfig,
};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("golden")
}

/// A value compared by its `Debug` text, for openraft and peer message types that have no
/// `PartialEq` (their `Debug` shows every field; the golden check compares bytes too).
#[derive(Debug, Serialize, serde::Deserialize)]
#[serde(transparent)]
struct ByDebug<T>(T);

impl<T: std::fmt::Debug> PartialEq for ByDebug<T> {
    fn eq(&self, other: &Self) -> bool {
        format!("{:?}", self.0) == format!("{:?}", other.0)
    }
}

/// Checks `value` against its golden files of every format, reading them with this crate's
/// own [`crate::decode`].
fn check<T>(name: &str, value: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    golden::check_formats(
        &golden_dir(),
        name,
        value,
        &[format::FORMAT_LEGACY, format::FORMAT_LATEST],
        crate::decode::<T>,
    );
}

fn log_id(term: u64, node: u64, index: u64) -> LogIdOf<TypeConfig> {
    openraft::testing::log_id::<TypeConfig>(term, node, index)
}

fn vote() -> VoteOf<TypeConfig> {
    VoteOf::<TypeConfig>::new_committed(9, crate::member_id(2, 1))
}

/// A joint configuration (two voter sets) with a learner (node 5).
fn membership() -> Membership<u64, BasicNode> {
    let nodes: BTreeMap<u64, BasicNode> = (1..=5)
        .map(|id| (id, BasicNode::new(format!("10.0.0.{id}:7101"))))
        .collect();
    Membership::new(
        vec![BTreeSet::from([1, 2, 3]), BTreeSet::from([2, 3, 4])],
        nodes,
    )
    .expect("the voters are among the nodes")
}

fn snapshot_meta() -> SnapshotMeta {
    SnapshotMeta {
        last_log_id: Some(log_id(8, 3, 420)),
        last_membership: StoredMembership::new(Some(log_id(7, 1, 301)), membership()),
    }
}

fn append_batch() -> AppendBatch {
    AppendBatch {
        enqueued_time_ms: 1_714_000_123_456,
        event_count: 2,
        events: Bytes::from_static(b"\x03\0\0\0abc\x02\0\0\0de"),
        producer: Some(ProducerStamp {
            producer_id: 77,
            sequence: 1_000,
        }),
    }
}

fn capture_range() -> CaptureRange {
    CaptureRange {
        from_sequence: 120,
        next_sequence: 180,
        file_time_ms: 1_714_000_200_000,
    }
}

fn entry(index: u64, payload: EntryPayload<Proposal, u64, BasicNode>) -> Entry {
    Entry {
        log_id: log_id(8, 3, index),
        payload,
    }
}

/// One entry of each payload kind, named for its golden file.
fn entries() -> Vec<(&'static str, Entry)> {
    vec![
        ("entry-blank", entry(11, EntryPayload::Blank)),
        (
            "entry-membership",
            entry(12, EntryPayload::Membership(membership())),
        ),
        (
            "entry-append",
            entry(13, EntryPayload::Normal(Proposal::Append(append_batch()))),
        ),
        (
            "entry-controller",
            entry(
                14,
                EntryPayload::Normal(Proposal::Controller(Bytes::from_static(b"\x01command"))),
            ),
        ),
        (
            "entry-capture-window",
            entry(
                15,
                EntryPayload::Normal(Proposal::CaptureWindow(capture_range())),
            ),
        ),
        (
            "entry-capture-mark",
            entry(
                16,
                EntryPayload::Normal(Proposal::CaptureMark(capture_range())),
            ),
        ),
    ]
}

#[test]
fn log_entries_of_every_payload_kind() {
    for (name, entry) in entries() {
        check(name, &entry);
    }
}

/// Checks `value` against its golden file of format 2 only: variants appended in feature
/// level 2, which no format-1 writer ever writes.
fn check_format_2<T>(name: &str, value: &T)
where
    T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug,
{
    golden::check_formats(&golden_dir(), name, value, &[2], crate::decode::<T>);
}

/// A Kafka idempotent producer's append (feature level 2).
#[test]
fn kafka_append_entries() {
    let batch = AppendBatch {
        producer: None,
        ..append_batch()
    };
    let proposal = Proposal::KafkaAppend {
        batch,
        producer: KafkaProducerStamp {
            producer_id: 4_096_001,
            epoch: 3,
            base_sequence: 1_250,
        },
    };
    check_format_2(
        "entry-kafka-append",
        &entry(17, EntryPayload::Normal(proposal)),
    );
}

/// Results of Kafka producers' refused batches (feature level 2).
#[test]
fn kafka_producer_results() {
    check_format_2(
        "result-stale-producer-epoch",
        &ProposalResult::StaleProducerEpoch {
            current: 4,
            received: 3,
        },
    );
    check_format_2(
        "result-unknown-producer",
        &ProposalResult::UnknownProducer {
            producer_id: 4_096_001,
        },
    );
}

/// The vote (`MetaKey::Vote`).
#[test]
fn stored_vote() {
    check("vote", &vote());
}

/// The purged log id (`MetaKey::Purged`) and the committed one (`MetaKey::Committed`, an
/// option).
#[test]
fn purged_and_committed_log_ids() {
    check("log-id", &log_id(8, 3, 420));
    check("committed", &Some(log_id(8, 3, 421)));
    check("committed-none", &None::<LogIdOf<TypeConfig>>);
}

/// The member id a replica stores (`MetaKey::Member`).
#[test]
fn member_id() {
    check("member", &crate::member_id(7, 3));
}

#[test]
fn proposal_results() {
    let outcome = AppendOutcome {
        first_sequence: 4_000,
        first_offset: 81_920,
        enqueued_time_ms: 1_714_000_123_456,
    };
    let results = [
        ("result-none", ProposalResult::None),
        ("result-appended", ProposalResult::Appended(outcome)),
        ("result-duplicate", ProposalResult::Duplicate(outcome)),
        (
            "result-out-of-order",
            ProposalResult::OutOfOrder {
                expected: 1_002,
                received: 1_005,
            },
        ),
        (
            "result-controller",
            ProposalResult::Controller(Bytes::from_static(b"\x00reply")),
        ),
        (
            "result-capture",
            ProposalResult::Capture {
                applied: true,
                next_sequence: 180,
            },
        ),
    ];
    for (name, result) in results {
        check(name, &result);
    }
}

#[test]
fn append_entries_messages() {
    let request = AppendEntriesRequest::<TypeConfig> {
        vote: vote(),
        prev_log_id: Some(log_id(8, 3, 10)),
        entries: entries().into_iter().map(|(_, entry)| entry).collect(),
        leader_commit: Some(log_id(8, 3, 9)),
    };
    check("append-entries-request", &ByDebug(request));
    let responses = [
        (
            "append-entries-success",
            AppendEntriesResponse::<TypeConfig>::Success,
        ),
        (
            "append-entries-partial-success",
            AppendEntriesResponse::PartialSuccess(Some(log_id(8, 3, 14))),
        ),
        ("append-entries-conflict", AppendEntriesResponse::Conflict),
        (
            "append-entries-higher-vote",
            AppendEntriesResponse::HigherVote(VoteOf::<TypeConfig>::new(10, 4)),
        ),
    ];
    for (name, response) in responses {
        check(name, &response);
    }
}

/// Vote and pre-vote messages (both are a `VoteRequest` answered by a `VoteResponse`).
#[test]
fn vote_messages() {
    let request = VoteRequest::<TypeConfig> {
        vote: VoteOf::<TypeConfig>::new(10, 4),
        last_log_id: Some(log_id(8, 3, 16)),
        leadership_transfer: true,
    };
    check("vote-request", &request);
    let response = VoteResponse::<TypeConfig> {
        vote: VoteOf::<TypeConfig>::new_committed(10, 4),
        vote_granted: true,
        last_log_id: Some(log_id(8, 3, 15)),
    };
    check("vote-response", &response);
}

#[test]
fn transfer_leader_messages() {
    let request = TransferLeaderRequest::<TypeConfig>::new(vote(), 4, Some(log_id(8, 3, 16)));
    check("transfer-leader-request", &request);
    let responses: [(&str, TransferLeaderResponse<TypeConfig>); 3] = [
        ("transfer-leader-done", Ok(())),
        (
            "transfer-leader-vote-changed",
            Err(TransferLeaderError::VoteChanged {
                expected: vote(),
                actual: VoteOf::<TypeConfig>::new(10, 4),
            }),
        ),
        (
            "transfer-leader-log-not-flushed",
            Err(TransferLeaderError::LogNotFlushed {
                expected: Some(log_id(8, 3, 16)),
                actual: Some(log_id(8, 3, 12)),
            }),
        ),
    ];
    for (name, response) in responses {
        check(name, &response);
    }
}

/// A node beat; its reply (and that of a snapshot's log piece, or of a whole snapshot's
/// chunk before the last) is `()`.
#[test]
fn quiet_beat() {
    let beat = QuietBeat {
        asleep: vec![(0x0003_0001_0000, 9), (0x0004_0002_0001, 12)],
    };
    check("quiet-beat", &ByDebug(beat));
    check("unit-reply", &());
}

/// The pieces of a snapshot streamed from storage, and the replies to them: the entry to go
/// on from (to the first), `()` (to log pieces) and openraft's snapshot response (to the
/// last).
#[test]
fn snapshot_pieces() {
    let piece = |seq, body| SnapshotPiece {
        transfer: 0x5eed_0000_0000_0001,
        seq,
        body,
    };
    let begin = PieceBody::Begin {
        point: Some(log_id(8, 3, 420)),
        state: Bytes::from_static(b"\x01state"),
        first_log: 17,
        last_log: 420,
        bytes: 65_536,
    };
    check("snapshot-piece-begin", &ByDebug(piece(0, begin)));
    let log = PieceBody::Log(LogPiece {
        entries: vec![
            (17, Bytes::from_static(b"entry-17")),
            (18, Bytes::from_static(b"entry-18")),
        ],
        index: vec![IndexRow {
            first_sequence: 4_000,
            log_index: 17,
            first_offset: 81_920,
            enqueued_time_ms: 1_714_000_123_456,
            event_count: 3,
        }],
    });
    check("snapshot-piece-log", &ByDebug(piece(1, log)));
    let end = PieceBody::End {
        vote: vote(),
        meta: snapshot_meta(),
    };
    check("snapshot-piece-end", &ByDebug(piece(2, end)));
    check("snapshot-piece-resume-from", &18u64);
    check(
        "snapshot-response",
        &SnapshotResponse::<TypeConfig>::new(vote()),
    );
}

/// The chunks of a snapshot sent whole (the controller's): one before the last, and the
/// last with the leader's vote and the snapshot's metadata.
#[test]
fn snapshot_chunks() {
    let chunk = SnapshotChunk {
        transfer: 0x5eed_0000_0000_0002,
        offset: 4_096,
        data: Bytes::from_static(b"\x02chunk"),
        done: None,
    };
    check("snapshot-chunk", &ByDebug(chunk));
    let last = SnapshotChunk {
        transfer: 0x5eed_0000_0000_0002,
        offset: 8_192,
        data: Bytes::from_static(b"\x03last"),
        done: Some((vote(), snapshot_meta())),
    };
    check("snapshot-chunk-last", &ByDebug(last));
}
