//! How a new group picks its first leader. Every founding replica may initialize a new
//! group; the preferred one does at once and the others only after a delay, so the preferred
//! one leads (a new hub's leaders start spread as placement chose), and when it is down the
//! others still start the group.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use openraft::async_runtime::WatchReceiver;
use tributary_raft::member_node;
use tributary_storage::Shard;
use tributary_types::{GroupId, HubId, PartitionId};

use crate::cluster::add_each_host;
use crate::net;
use crate::state_machine::MemStateMachine;

/// Groups whose preferred founder runs: group g prefers node g mod 3 + 1.
const LED_GROUPS: u16 = 6;
/// A group whose preferred founder (node 3) never starts it, as if it were down.
const ORPHAN: u16 = LED_GROUPS;
/// What the node waits before a founder that is not preferred initializes.
const FOUNDER_INIT_DELAY: Duration = Duration::from_millis(1000);

fn group(index: u16) -> GroupId {
    GroupId::new(HubId(2), PartitionId(index), 0)
}

fn preferred(index: u16) -> u64 {
    if index == ORPHAN {
        3
    } else {
        u64::from(index % 3) + 1
    }
}

type Leaders = Arc<Mutex<Vec<(u64, u16, tributary_raft::Raft<MemStateMachine>)>>>;

#[test]
fn a_new_groups_preferred_founder_leads_it_and_the_others_start_it_without_it() {
    for seed in 0..4u64 {
        let dir = crate::data_dir();
        let mut sim = turmoil::Builder::new()
            .simulation_duration(Duration::from_secs(30))
            .tick_duration(Duration::from_millis(5))
            .max_message_latency(Duration::from_millis(20))
            .enable_random_order()
            .rng_seed(seed)
            .build();
        let rafts = Leaders::default();
        add_each_host(&mut sim, dir.path(), &rafts, run_host);
        let leader_of = |rafts: &Leaders, index: u16| -> Option<u64> {
            // The leader every replica of the group agrees on.
            let rafts = rafts.lock().expect("rafts lock");
            let mut leaders = rafts
                .iter()
                .filter(|(_, g, _)| *g == index)
                .map(|(_, _, raft)| raft.metrics().borrow_watched().current_leader);
            let first = leaders.next()??;
            leaders
                .all(|l| l == Some(first))
                .then(|| member_node(first).0)
        };
        let mut elected: BTreeMap<u16, u64> = BTreeMap::new();
        while elected.len() <= usize::from(LED_GROUPS) {
            assert!(
                sim.elapsed() < Duration::from_secs(10),
                "seed {seed}: groups without an agreed leader after {:?}: elected {elected:?}",
                sim.elapsed()
            );
            sim.step().expect("simulation step");
            for index in 0..=ORPHAN {
                if let Some(leader) = leader_of(&rafts, index) {
                    elected.entry(index).or_insert(leader);
                }
            }
        }
        for index in 0..LED_GROUPS {
            assert_eq!(
                elected[&index],
                preferred(index),
                "seed {seed}: group {index}'s first leader is not its preferred founder"
            );
        }
        assert!(
            [1, 2].contains(&elected[&ORPHAN]),
            "seed {seed}: the group whose preferred founder is down elected {}",
            elected[&ORPHAN]
        );
    }
}

async fn run_host(
    node: u64,
    shard: Shard,
    members: BTreeMap<u64, String>,
    rafts: Leaders,
) -> turmoil::Result {
    let (host, server) = net::start_host(node, &members);
    for index in 0..=ORPHAN {
        if index == ORPHAN && node == preferred(ORPHAN) {
            continue;
        }
        let delay = if node == preferred(index) {
            Duration::ZERO
        } else {
            FOUNDER_INIT_DELAY
        };
        let (machine, _) = MemStateMachine::new();
        let raft = host
            .start_founding(
                group(index),
                node,
                shard.clone(),
                machine,
                members.clone(),
                delay,
            )
            .await?;
        rafts.lock().expect("rafts lock").push((node, index, raft));
    }
    server.await?.map_err(|e| e.to_string())?;
    Ok(())
}
