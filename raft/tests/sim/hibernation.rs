//! Idle groups sleep (no ticks, no heartbeats) and still fail over: when the node leading
//! sleeping groups crashes or is cut off from the others (alive, still believing it leads),
//! their followers stop hearing its node beats, wake, and elect new leaders that accept
//! writes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openraft::async_runtime::WatchReceiver;
use tributary_raft::quiet::{ASLEEP_AFTER, BEAT_TIMEOUT};
use tributary_raft::{
    AppendBatch, GroupHost, Hibernation, Proposal, Raft, VoterChange, member_id, member_node,
    reconcile_voters,
};
use tributary_storage::Shard;
use tributary_types::{GroupId, HubId, PartitionId};

use crate::cluster::{HOSTS, add_each_host, host_of, node_of};

use crate::net;
use crate::state_machine::MemStateMachine;

const GROUPS: u16 = 6;
/// How long the crashed node's groups may take to accept writes again: waking takes
/// [`BEAT_TIMEOUT`], an election well under a second more.
const FAILOVER_MAX: Duration = Duration::from_secs(3);

fn group(index: u16) -> GroupId {
    GroupId::new(HubId(3), PartitionId(index), 0)
}

struct Replica {
    node: u64,
    group: GroupId,
    raft: Raft<MemStateMachine>,
    hibernation: Hibernation,
}

#[derive(Default)]
struct Shared {
    replicas: Mutex<Vec<Replica>>,
    hosts: Mutex<BTreeMap<u64, Arc<GroupHost<MemStateMachine>>>>,
    /// Set by the scenario: the node the test driver crashes or cuts off next step.
    victim: Mutex<Option<u64>>,
    struck: AtomicBool,
}

/// What happens to the node leading the most sleeping groups.
#[derive(Debug, Clone, Copy)]
enum Fault {
    /// It crashes: no more beats, no more messages.
    Crash,
    /// It is cut off from the other nodes both ways and keeps running.
    Cut,
}

impl Shared {
    /// The replica of `group` that leads it, on a node other than `excluded`.
    fn leader(
        &self,
        group: GroupId,
        excluded: Option<u64>,
    ) -> Option<(u64, Raft<MemStateMachine>, Hibernation)> {
        let replicas = self.replicas.lock().expect("replicas lock");
        replicas
            .iter()
            .filter(|r| r.group == group && Some(r.node) != excluded)
            .find(|r| {
                let m = r.raft.metrics();
                let m = m.borrow_watched();
                m.current_leader.map(|l| member_node(l).0) == Some(r.node)
                    && m.state == openraft::ServerState::Leader
            })
            .map(|r| (r.node, r.raft.clone(), r.hibernation.clone()))
    }

    /// (node, group, is leader) of every replica awake.
    fn awake(&self) -> Vec<(u64, GroupId, bool)> {
        let replicas = self.replicas.lock().expect("replicas lock");
        replicas
            .iter()
            .filter(|r| !r.hibernation.is_asleep())
            .map(|r| {
                let m = r.raft.metrics();
                let leads = m.borrow_watched().state == openraft::ServerState::Leader;
                (r.node, r.group, leads)
            })
            .collect()
    }

    fn asleep(&self, excluded: Option<u64>) -> usize {
        self.hosts
            .lock()
            .expect("hosts lock")
            .iter()
            .filter(|(node, _)| Some(**node) != excluded)
            .map(|(_, host)| host.asleep_count())
            .sum()
    }
}

async fn write(shared: &Shared, group: GroupId, excluded: Option<u64>) -> bool {
    let Some((_, raft, hibernation)) = shared.leader(group, excluded) else {
        return false;
    };
    hibernation.wake_for_write(&raft).await;
    let proposal = Proposal::Append(AppendBatch {
        enqueued_time_ms: 0,
        event_count: 1,
        events: Bytes::from_static(b"event"),
        producer: None,
    });
    matches!(
        tokio::time::timeout(Duration::from_secs(1), raft.client_write(proposal)).await,
        Ok(Ok(_))
    )
}

async fn wait_until(what: &str, max: Duration, mut done: impl AsyncFnMut() -> bool) -> Duration {
    let start = tokio::time::Instant::now();
    while !done().await {
        assert!(start.elapsed() < max, "{what}: not within {max:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    start.elapsed()
}

async fn scenario(shared: Arc<Shared>) -> turmoil::Result {
    let replicas = GROUPS as usize * HOSTS.len();
    wait_until(
        "every group writable",
        Duration::from_secs(10),
        async || {
            for index in 0..GROUPS {
                if !write(&shared, group(index), None).await {
                    return false;
                }
            }
            true
        },
    )
    .await;
    wait_until(
        "every replica asleep",
        ASLEEP_AFTER + Duration::from_secs(2),
        async || shared.asleep(None) == replicas,
    )
    .await;

    // Asleep means silent: no leader's heartbeat acknowledgements move.
    let heartbeats = |shared: &Shared| -> Vec<String> {
        (0..GROUPS)
            .filter_map(|index| shared.leader(group(index), None))
            .map(|(_, raft, _)| format!("{:?}", raft.metrics().borrow_watched().heartbeat))
            .collect()
    };
    let before = heartbeats(&shared);
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        heartbeats(&shared),
        before,
        "sleeping leaders sent heartbeats"
    );
    assert_eq!(
        shared.asleep(None),
        replicas,
        "a replica woke with nothing to do"
    );

    // A write wakes its group, commits, and the group falls asleep again.
    assert!(
        write(&shared, group(0), None).await,
        "a write to a sleeping group failed"
    );
    wait_until(
        "every replica asleep after a write",
        ASLEEP_AFTER + Duration::from_secs(2),
        async || shared.asleep(None) == replicas,
    )
    .await;

    // A write reaching a follower of a sleeping group (a client whose routing is out of
    // date) is turned away naming the leader, and wakes nothing: no election follows, the
    // same node leads in the same term, and every replica stays asleep.
    let (leader_node, leader_raft, _) = shared.leader(group(2), None).expect("a leader");
    let term = leader_raft.metrics().borrow_watched().current_term;
    let (follower_raft, follower_hibernation) = {
        let replicas = shared.replicas.lock().expect("replicas lock");
        let follower = replicas
            .iter()
            .find(|r| r.group == group(2) && r.node != leader_node)
            .expect("a follower");
        (follower.raft.clone(), follower.hibernation.clone())
    };
    follower_hibernation.wake_for_write(&follower_raft).await;
    let refused = tokio::time::timeout(
        Duration::from_secs(1),
        follower_raft.client_write(Proposal::Append(AppendBatch {
            enqueued_time_ms: 0,
            event_count: 1,
            events: Bytes::from_static(b"to a follower"),
            producer: None,
        })),
    )
    .await;
    assert!(
        matches!(
            refused,
            Ok(Err(openraft::error::RaftError::APIError(
                openraft::error::ClientWriteError::ForwardToLeader(_)
            )))
        ),
        "a follower's write: {refused:?}"
    );
    // Nothing must happen: watched for several beat timeouts, after which a woken follower
    // would have campaigned.
    tokio::time::sleep(BEAT_TIMEOUT * 3).await;
    let (now_leading, now_raft, _) = shared.leader(group(2), None).expect("a leader");
    assert_eq!(
        (
            now_leading,
            now_raft.metrics().borrow_watched().current_term
        ),
        (leader_node, term),
        "a write to a follower moved the leadership"
    );
    // Only the written group is watched: another group may wake meanwhile for its own
    // reasons (a node beat late in simulated time while a host waited for its storage).
    let awake = shared.awake();
    assert!(
        !awake.iter().any(|(_, g, _)| *g == group(2)),
        "a write to a follower woke a replica of its group: awake (node, group, leads) {awake:?}"
    );

    // A membership change on a sleeping group goes through (a leader that slept refuses
    // changes until it has confirmed its leadership): its voters shrink to two nodes and
    // grow back to three, and it falls asleep again.
    let (leader_node, raft, hibernation) = shared.leader(group(1), None).expect("a leader");
    let me = member_id(leader_node, 0);
    let all: BTreeMap<u64, String> = HOSTS
        .iter()
        .enumerate()
        .map(|(i, host)| (member_id(node_of(i), 0), net::peer_addr(host)))
        .collect();
    let two: BTreeMap<u64, String> = all
        .iter()
        .filter(|(member, _)| **member == me || all.keys().find(|m| **m != me) == Some(*member))
        .map(|(m, a)| (*m, a.clone()))
        .collect();
    for (desired, what) in [(&two, "shrink to two voters"), (&all, "grow back to three")] {
        wait_until(what, Duration::from_secs(5), async || {
            let change = reconcile_voters(&raft, &hibernation, me, desired).await;
            matches!(change, Ok(VoterChange::Nothing))
                && raft
                    .metrics()
                    .borrow_watched()
                    .membership_config
                    .membership()
                    .voter_ids()
                    .count()
                    == desired.len()
        })
        .await;
    }
    wait_until(
        "every replica asleep after the membership changes",
        ASLEEP_AFTER + Duration::from_secs(3),
        async || shared.asleep(None) == replicas,
    )
    .await;

    // Crash or cut off the node leading the most groups.
    let mut led: BTreeMap<u64, Vec<u16>> = BTreeMap::new();
    for index in 0..GROUPS {
        let (node, _, _) = shared.leader(group(index), None).expect("a leader");
        led.entry(node).or_default().push(index);
    }
    let (&victim, orphaned) = led.iter().max_by_key(|(_, g)| g.len()).expect("leaders");
    let orphaned = orphaned.clone();
    *shared.victim.lock().expect("victim lock") = Some(victim);
    wait_until("the fault", Duration::from_secs(1), async || {
        shared.struck.load(Ordering::SeqCst)
    })
    .await;
    let took = wait_until(
        "the lost node's groups writable on the others",
        FAILOVER_MAX,
        async || {
            for index in &orphaned {
                if !write(&shared, group(*index), Some(victim)).await {
                    return false;
                }
            }
            true
        },
    )
    .await;
    assert!(
        took >= BEAT_TIMEOUT / 2,
        "groups failed over in {took:?}: were they asleep at all?"
    );
    Ok(())
}

#[test]
fn sleeping_groups_are_silent_wake_on_writes_and_fail_over_when_their_leader_is_lost() {
    let runs = [
        (0u64, Fault::Crash),
        (1, Fault::Crash),
        (2, Fault::Cut),
        (3, Fault::Cut),
    ];
    for (seed, fault) in runs {
        eprintln!("hibernation: seed {seed}, {fault:?}");
        let dir = crate::data_dir();
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(40))
            .tick_duration(Duration::from_millis(5))
            .max_message_latency(Duration::from_millis(20))
            .enable_random_order()
            .rng_seed(seed)
            .build();
        let shared = Arc::new(Shared::default());
        add_each_host(&mut sim, dir.path(), &shared, run_host);
        sim.client("scenario", scenario(shared.clone()));
        loop {
            if let Some(node) = shared.victim.lock().expect("victim lock").take() {
                let victim = HOSTS[host_of(node)];
                match fault {
                    Fault::Crash => sim.crash(victim),
                    Fault::Cut => {
                        for other in HOSTS.iter().filter(|h| **h != victim) {
                            sim.partition(victim, *other);
                        }
                    }
                }
                shared.struck.store(true, Ordering::SeqCst);
            }
            match sim.step() {
                Ok(true) => break,
                Ok(false) => {}
                Err(err) => panic!("seed {seed}, {fault:?}: {err}"),
            }
        }
    }
}

async fn run_host(
    node: u64,
    shard: Shard,
    members: BTreeMap<u64, String>,
    shared: Arc<Shared>,
) -> turmoil::Result {
    let (host, server) = net::start_host(node, &members);
    host.hibernate_idle();
    shared
        .hosts
        .lock()
        .expect("hosts lock")
        .insert(node, host.clone());
    for index in 0..GROUPS {
        let (machine, _) = MemStateMachine::new();
        let raft = host
            .start(group(index), node, shard.clone(), machine, members.clone())
            .await?;
        let hibernation = host.hibernation(group(index)).expect("started");
        shared
            .replicas
            .lock()
            .expect("replicas lock")
            .push(Replica {
                node,
                group: group(index),
                raft,
                hibernation,
            });
    }
    server.await?.map_err(|e| e.to_string())?;
    Ok(())
}
