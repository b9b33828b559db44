//! Replies slower than openraft's own timeouts: every message between hosts takes 60 ms
//! each way, so a round trip (120 ms and more) outlasts the 112 ms openraft asks for an
//! AppendEntries, as a loaded node's answers do (hundreds of groups electing or writing at
//! once, its disk queue long). Replication must wait for such replies: had it given up at
//! openraft's timeout, it would send the same entries again and again and no write would
//! ever commit. Heartbeats must be waited for the whole heartbeat interval (150 ms): a
//! leader whose heartbeats no majority answers in time loses its lease and turns every
//! write away. Elections still succeed (a vote may take 300 ms), and followers, which hear
//! their leaders' heartbeats 60 ms after they are sent, stand for no election.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use tributary_raft::{AppendBatch, Proposal, Raft, member_node};
use tributary_storage::Shard;
use tributary_types::{GroupId, HubId, PartitionId};

use crate::cluster::add_each_host;
use crate::net;
use crate::state_machine::MemStateMachine;

const GROUPS: u16 = 3;
/// One way, every message.
const LATENCY: Duration = Duration::from_millis(60);
const WRITES_PER_GROUP: usize = 10;

fn group(index: u16) -> GroupId {
    GroupId::new(HubId(5), PartitionId(index), 0)
}

#[derive(Default)]
struct Shared {
    replicas: Mutex<Vec<(u64, GroupId, Raft<MemStateMachine>)>>,
}

impl Shared {
    fn leader(&self, group: GroupId) -> Option<Raft<MemStateMachine>> {
        let replicas = self.replicas.lock().expect("replicas lock");
        replicas
            .iter()
            .filter(|(_, g, _)| *g == group)
            .find(|(node, _, raft)| {
                let m = raft.metrics();
                let m = m.borrow_watched();
                m.state == openraft::ServerState::Leader
                    && m.current_leader.map(|l| member_node(l).0) == Some(*node)
            })
            .map(|(_, _, raft)| raft.clone())
    }

    fn terms(&self) -> Vec<u64> {
        let replicas = self.replicas.lock().expect("replicas lock");
        replicas
            .iter()
            .map(|(_, _, raft)| raft.metrics().borrow_watched().current_term)
            .collect()
    }
}

async fn scenario(shared: Arc<Shared>) -> turmoil::Result {
    let start = tokio::time::Instant::now();
    let mut leaders = Vec::new();
    for index in 0..GROUPS {
        loop {
            if let Some(raft) = shared.leader(group(index)) {
                leaders.push(raft);
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "group {index} elected no leader within 10 s"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let terms = shared.terms();
    for (index, raft) in leaders.iter().enumerate() {
        for n in 0..WRITES_PER_GROUP {
            let proposal = Proposal::Append(AppendBatch {
                enqueued_time_ms: 0,
                event_count: 1,
                events: Bytes::from(format!("event {n}")),
                producer: None,
            });
            // A new leader takes writes once a majority acknowledged something it sent
            // (its lease): until then it turns them away, and so does one whose followers
            // acknowledge nothing at all.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
            loop {
                let written =
                    tokio::time::timeout_at(deadline, raft.client_write(proposal.clone())).await;
                match written {
                    Ok(Ok(_)) => break,
                    Ok(Err(err)) if tokio::time::Instant::now() < deadline => {
                        tracing::debug!(%err, "write refused, trying again");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                    Ok(Err(err)) => panic!(
                        "group {index}, write {n}: not committed within 3 s over 120 ms round \
                         trips: {err}"
                    ),
                    Err(_) => panic!(
                        "group {index}, write {n}: not committed within 3 s over 120 ms round \
                         trips; the leader's metrics: {:?}",
                        raft.metrics().borrow_watched()
                    ),
                }
            }
        }
    }
    // Every replica holds every write: replication reached both followers, not only one.
    let expected = leaders
        .iter()
        .map(|raft| {
            raft.metrics()
                .borrow_watched()
                .last_applied
                .map(|l| l.index)
        })
        .collect::<Vec<_>>();
    let caught_up = tokio::time::Instant::now();
    loop {
        let behind = {
            let replicas = shared.replicas.lock().expect("replicas lock");
            replicas
                .iter()
                .filter(|(_, g, raft)| {
                    let index = usize::from(g.partition.0);
                    raft.metrics().borrow_watched().last_log_index < expected[index]
                })
                .count()
        };
        if behind == 0 {
            break;
        }
        assert!(
            caught_up.elapsed() < Duration::from_secs(5),
            "{behind} replicas do not hold every committed write 5 s later"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        shared.terms(),
        terms,
        "a slow link alone started an election"
    );
    Ok(())
}

#[test]
fn replication_waits_for_replies_slower_than_openrafts_timeout() {
    let dir = crate::data_dir();
    let mut sim = turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(30))
        .tick_duration(Duration::from_millis(5))
        .min_message_latency(LATENCY)
        .max_message_latency(LATENCY)
        .rng_seed(7)
        .build();
    let shared = Arc::new(Shared::default());
    add_each_host(&mut sim, dir.path(), &shared, run_host);
    sim.client("scenario", scenario(shared.clone()));
    sim.run().expect("simulation");
}

async fn run_host(
    node: u64,
    shard: Shard,
    members: BTreeMap<u64, String>,
    shared: Arc<Shared>,
) -> turmoil::Result {
    let (host, server) = net::start_host(node, &members);
    for index in 0..GROUPS {
        let (machine, _) = MemStateMachine::new();
        let raft = host
            .start(group(index), node, shard.clone(), machine, members.clone())
            .await?;
        shared
            .replicas
            .lock()
            .expect("replicas lock")
            .push((node, group(index), raft));
    }
    server.await?.map_err(|e| e.to_string())?;
    Ok(())
}
