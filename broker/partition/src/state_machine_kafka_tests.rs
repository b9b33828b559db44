//! Kafka idempotent producers in the partition state machine: a retried batch after a
//! leader change is answered from the replicated producer state and not stored again, on
//! the new leader, on a replica restarted from storage and on one rebuilt from a snapshot.

use tributary_raft::openraft_api::testing::{RaftEntry, log_id, membership_ent};
use tributary_raft::{AppendOutcome, KafkaProducerStamp, Proposal, ProposalResult};
use tributary_storage::{Shard, ShardConfig};
use tributary_types::{GroupId, HubId, PartitionId};

use super::tests::{batch, store_entries, stream};
use super::*;

fn kafka(producer_id: i64, epoch: i16, base_sequence: i32, bodies: &[&str]) -> Proposal {
    let Proposal::Append(batch) = batch(bodies, 1) else {
        unreachable!("batch() makes appends")
    };
    Proposal::KafkaAppend {
        batch,
        producer: KafkaProducerStamp {
            producer_id,
            epoch,
            base_sequence,
        },
    }
}

fn entry(term: u64, index: u64, proposal: Proposal) -> tributary_raft::Entry {
    tributary_raft::Entry::new_normal(log_id::<TypeConfig>(term, 1, index), proposal)
}

/// What applying `proposal` at `index` decides on `machine`'s state (without changing it).
fn decision(machine: &PartitionStateMachine, index: u64, proposal: &Proposal) -> ProposalResult {
    machine
        .state
        .clone()
        .apply_proposal(index, proposal)
        .expect("the proposal applies")
        .0
}

/// The failure the producer state guards against: the leader commits a batch and dies
/// before the client hears so; the client retries the batch through the new leader. The
/// retry is a new entry of a later term, and must not store the records a second time.
#[tokio::test]
async fn a_retried_batch_after_a_leader_change_is_stored_once() {
    let group = GroupId::new(HubId(8), PartitionId(0), 0);
    let dir = tempfile::tempdir().unwrap();
    let old_leader = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
    let new_leader = Shard::open(&dir.path().join("b.redb"), ShardConfig::default()).unwrap();
    let rebuilt = Shard::open(&dir.path().join("c.redb"), ShardConfig::default()).unwrap();
    // Term 1: the old leader's entries, replicated to the new leader.
    let term_1 = vec![
        membership_ent::<TypeConfig>(1, 1, 1, vec![[1u64].into()]),
        entry(1, 2, kafka(42, 0, 0, &["r0", "r1"])),
        entry(1, 3, batch(&["plain"], 2)),
        entry(1, 4, kafka(42, 0, 2, &["r2"])),
    ];
    let mut machines = Vec::new();
    for shard in [&old_leader, &new_leader] {
        store_entries(shard, group, &term_1).await;
        let (mut machine, _) = PartitionStateMachine::open(group, shard.clone()).unwrap();
        machine.apply(stream(term_1.clone())).await.unwrap();
        machines.push(machine);
    }
    let original = AppendOutcome {
        first_sequence: 3,
        first_offset: machines[1].state.progress.next_offset
            - i64::try_from(
                codec::encode_batch(&[codec::EventRecord {
                    partition_key: None,
                    properties: vec![],
                    body: bytes::Bytes::from_static(b"r2"),
                }])
                .len(),
            )
            .unwrap(),
        enqueued_time_ms: 2,
    };
    // A snapshot of the new leader, before the retry (a replica rebuilt from it must know
    // the producer too).
    machines[1]
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let snapshot = machines[1].get_current_snapshot().await.unwrap().unwrap();
    let (mut from_snapshot, _) = PartitionStateMachine::open(group, rebuilt.clone()).unwrap();
    from_snapshot
        .install_snapshot(&snapshot.meta, snapshot.snapshot)
        .await
        .unwrap();
    // The old leader restarts from what it stored.
    drop(machines.remove(0));
    let (restarted, _) = PartitionStateMachine::open(group, old_leader.clone()).unwrap();

    // Term 2: the client's retry of its last batch, then its next one.
    let retry = kafka(42, 0, 2, &["r2"]);
    let next = kafka(42, 0, 3, &["r3"]);
    for machine in [&machines[0], &restarted, &from_snapshot] {
        assert_eq!(
            machine.state.kafka_producers,
            machines[0].state.kafka_producers
        );
        assert_eq!(
            decision(machine, 5, &retry),
            ProposalResult::Duplicate(original),
            "the retry is answered with the original offset"
        );
        // An older batch of the last five too, and a gap is refused.
        assert!(matches!(
            decision(machine, 5, &kafka(42, 0, 0, &["r0", "r1"])),
            ProposalResult::Duplicate(AppendOutcome {
                first_sequence: 0,
                ..
            })
        ));
        assert_eq!(
            decision(machine, 5, &kafka(42, 0, 9, &["r9"])),
            ProposalResult::OutOfOrder {
                expected: 3,
                received: 9
            }
        );
        assert_eq!(
            decision(machine, 5, &kafka(43, 0, 7, &["x"])),
            ProposalResult::UnknownProducer { producer_id: 43 }
        );
    }
    let term_2 = vec![entry(2, 5, retry), entry(2, 6, next)];
    for (machine, shard) in [
        (&mut machines[0], &new_leader),
        (&mut from_snapshot, &rebuilt),
    ] {
        store_entries(shard, group, &term_2).await;
        machine.apply(stream(term_2.clone())).await.unwrap();
        machine
            .visible()
            .wait_for(|index| *index >= 6)
            .await
            .unwrap();
        // r0 r1 plain r2 r3: the retry stored nothing.
        assert_eq!(machine.state.progress.next_sequence, 5);
        let bodies: Vec<String> = (0..5)
            .map(|sequence| {
                let row = shard.index_for_sequence(group, sequence).unwrap().unwrap();
                let entry = tributary_raft::decode_entry(
                    &shard.log_entry(group, row.log_index).unwrap().unwrap(),
                )
                .unwrap();
                let EntryPayload::Normal(proposal) = entry.payload else {
                    panic!("an index row points at a non-event entry")
                };
                let events = codec::decode_batch(&proposal.append_batch().unwrap().events).unwrap();
                let at = usize::try_from(sequence - row.first_sequence).unwrap();
                String::from_utf8(events[at].record.body.to_vec()).unwrap()
            })
            .collect();
        assert_eq!(bodies, ["r0", "r1", "plain", "r2", "r3"]);
    }
}

/// A newer epoch fences the older one on every replica; the producer state with it is
/// written with the applied state and read back after a restart.
#[tokio::test]
async fn epochs_survive_a_restart() {
    let group = GroupId::new(HubId(9), PartitionId(0), 0);
    let dir = tempfile::tempdir().unwrap();
    let shard = Shard::open(&dir.path().join("a.redb"), ShardConfig::default()).unwrap();
    let entries = vec![
        membership_ent::<TypeConfig>(1, 1, 1, vec![[1u64].into()]),
        entry(1, 2, kafka(42, 0, 0, &["a"])),
        entry(1, 3, kafka(42, 1, 0, &["b"])),
    ];
    store_entries(&shard, group, &entries).await;
    let (mut machine, _) = PartitionStateMachine::open(group, shard.clone()).unwrap();
    machine.apply(stream(entries)).await.unwrap();
    machine
        .visible()
        .wait_for(|index| *index >= 3)
        .await
        .unwrap();
    drop(machine);
    let (machine, _) = PartitionStateMachine::open(group, shard).unwrap();
    assert_eq!(machine.state.progress.next_sequence, 2);
    assert_eq!(
        decision(&machine, 4, &kafka(42, 0, 1, &["c"])),
        ProposalResult::StaleProducerEpoch {
            current: 1,
            received: 0
        }
    );
    assert!(matches!(
        decision(&machine, 4, &kafka(42, 1, 1, &["c"])),
        ProposalResult::Appended(_)
    ));
}
