//! The placement controller on real processes, under continuous sends: nodes joining with
//! different capacity units receive replicas and leaders in proportion; a decommissioned node
//! is emptied; a node dead past the timeout is replaced and, back, used again; the controller
//! leader killed while replicas move. Every acknowledged event is checked on every replica
//! afterwards (`load::verify`), and consumers must see gap-free sequence numbers throughout.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;
use tributary_client::{Client, SendTarget};
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok, eventually, test_seed};
use tributary_proto::v1::ClusterStatus;

use crate::load::{Load, verify};
use crate::rejoin::counter;

/// Placement settings for the tests: quick rounds, short cooldown and dead-node timeout.
const ENV: &[(&str, &str)] = &[
    ("TRIBUTARY_PLACEMENT_INTERVAL", "500ms"),
    ("TRIBUTARY_PLACEMENT_COOLDOWN", "2s"),
    ("TRIBUTARY_PLACEMENT_MOVES_PER_NODE", "8"),
    ("TRIBUTARY_PLACEMENT_MOVES_MAX", "24"),
    ("TRIBUTARY_NODE_DEAD_TIMEOUT", "8s"),
];
const PARTITIONS: u32 = 48;
const PRODUCERS: u64 = 3;
/// Acknowledged events that must arrive between steps: the cluster keeps serving.
const ACKS_PER_STEP: u64 = 100;
/// How long the cluster may take to reach balance after a change.
const BALANCE_TIMEOUT: Duration = Duration::from_secs(360);

fn any_partition(rng: &mut StdRng) -> SendTarget {
    SendTarget::PartitionId(rng.random_range(0..PARTITIONS).to_string())
}

/// Partitions of the hubs of the smaller tests.
const SMALL: u32 = 16;

fn any_small_partition(rng: &mut StdRng) -> SendTarget {
    SendTarget::PartitionId(rng.random_range(0..SMALL).to_string())
}

/// Waits until `check` holds for the cluster status; returns how long it took.
async fn await_status(
    cluster: &LocalCluster,
    what: &str,
    check: impl Fn(&ClusterStatus) -> Result<(), String>,
) -> Duration {
    let started = Instant::now();
    eventually(BALANCE_TIMEOUT, what, async || {
        check(&status(cluster).await)
    })
    .await;
    println!("{what} after {:?}", started.elapsed());
    started.elapsed()
}

/// No replica on `node`, none moving, every partition at full replication on other nodes.
fn emptied(status: &ClusterStatus, node: u64) -> Result<(), String> {
    let counts = counts(status);
    let held = counts.get(&node).map_or(0, |c| c.0);
    let short: Vec<&str> = status
        .partitions
        .iter()
        .filter(|p| p.replicas.len() != 3 || p.replicas.iter().any(|r| r.node == node))
        .map(|p| p.partition_id.as_str())
        .collect();
    if held > 0 || !status.moves.is_empty() || !short.is_empty() || status.under_replicated > 0 {
        return Err(format!(
            "node {node} holds {held} replicas, {} moves under way, {} under-replicated, partitions not yet placed elsewhere {short:?}; {counts:?}",
            status.moves.len(),
            status.under_replicated
        ));
    }
    Ok(())
}

/// Whether `node` has a replica of `hub`/`partition` stored, per its own diagnostics.
async fn holds_replica(cluster: &LocalCluster, node: usize, hub: &str, partition: u32) -> bool {
    let client = Client::connect(&cluster.nodes[node].endpoint())
        .await
        .unwrap();
    client
        .replica_events_page(hub, &partition.to_string(), 0, 1)
        .await
        .is_ok()
}

/// The cluster status, asked of the first running node that answers.
async fn status(cluster: &LocalCluster) -> ClusterStatus {
    for node in cluster.nodes.iter().filter(|n| n.pid().is_some()) {
        if let Ok(client) = Client::connect(&node.endpoint()).await
            && let Ok(status) = client.cluster_status().await
        {
            return status;
        }
    }
    panic!("no running node answers the cluster status");
}

/// Per node id: (replicas, leaders).
fn counts(status: &ClusterStatus) -> BTreeMap<u64, (u32, u32)> {
    status
        .nodes
        .iter()
        .map(|n| (n.id, (n.replicas, n.leaders)))
        .collect()
}

/// Whether every node listed in `capacity_units` holds replicas and leads partitions in
/// proportion to its capacity units, within one, with no move under way, every partition
/// led and at full replication; `Err` says what is not there yet.
fn balanced(
    status: &ClusterStatus,
    capacity_units: &BTreeMap<u64, u32>,
    partitions: u32,
) -> Result<(), String> {
    let total_cu: u32 = capacity_units.values().sum();
    let replicas_total = partitions * 3;
    let counts = counts(status);
    if !status.moves.is_empty() {
        return Err(format!(
            "{} moves under way; {counts:?}",
            status.moves.len()
        ));
    }
    if status.under_replicated > 0 || status.partitions.iter().any(|p| p.leader == 0) {
        return Err(format!(
            "{} partitions under-replicated or without a leader; {counts:?}",
            status.under_replicated
        ));
    }
    for (node, (replicas, leaders)) in &counts {
        let cu = capacity_units.get(node).copied().unwrap_or(0);
        let ideal_replicas = f64::from(replicas_total * cu) / f64::from(total_cu);
        let ideal_leaders = f64::from(partitions * cu) / f64::from(total_cu);
        if (f64::from(*replicas) - ideal_replicas).abs() > 1.0
            || (f64::from(*leaders) - ideal_leaders).abs() > 1.0
        {
            return Err(format!(
                "node {node} ({cu} CU) holds {replicas} replicas and leads {leaders}; ideal \
                 {ideal_replicas:.1} and {ideal_leaders:.1}; all: {counts:?}"
            ));
        }
    }
    Ok(())
}

/// Waits until [`balanced`] holds; returns how long it took.
async fn await_balance(
    cluster: &LocalCluster,
    capacity_units: &BTreeMap<u64, u32>,
    partitions: u32,
    what: &str,
) -> Duration {
    let started = Instant::now();
    let mut reported = Instant::now();
    let status = eventually(BALANCE_TIMEOUT, format!("{what}: balanced"), async || {
        let status = status(cluster).await;
        match balanced(&status, capacity_units, partitions) {
            Ok(()) => Ok(status),
            Err(state) => {
                if reported.elapsed() > Duration::from_secs(10) {
                    println!("{what}: after {:?}: {state}", started.elapsed());
                    reported = Instant::now();
                }
                Err(state)
            }
        }
    })
    .await;
    let took = started.elapsed();
    println!("{what}: balanced after {took:?}: {:?}", counts(&status));
    took
}

/// Item 2 of the placement issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_added_with_2_and_1_capacity_units_take_proportional_replicas_and_leaders() {
    let dir = TestDir::new("placement-scale-out");
    let mut cluster = LocalCluster::start_with_env(dir.path(), 3, ENV).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("scaled", PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let mut capacity_units = BTreeMap::from([(1, 1), (2, 1), (3, 1)]);
    await_balance(
        &cluster,
        &capacity_units,
        PARTITIONS,
        "3 nodes, 48 partitions",
    )
    .await;

    let mut rng = StdRng::seed_from_u64(test_seed("placement-scale-out"));
    let load = Load::start(
        &cluster.endpoints(),
        "scaled",
        PARTITIONS,
        PRODUCERS,
        any_partition,
        &mut rng,
    );
    load.wait_for_acks(ACKS_PER_STEP, "before nodes join").await;

    let started = Instant::now();
    cluster
        .add_node(dir.path(), &["--capacity-units", "2"], ENV)
        .await;
    cluster
        .add_node(dir.path(), &["--capacity-units", "1"], ENV)
        .await;
    capacity_units.extend([(4, 2), (5, 1)]);
    let took = await_balance(
        &cluster,
        &capacity_units,
        PARTITIONS,
        "nodes 4 (2 CU) and 5 (1 CU) added",
    )
    .await;
    println!(
        "scale-out: replicas and leaders proportional to capacity units {:?} after the nodes joined ({took:?} after the first was ready)",
        started.elapsed()
    );
    load.wait_for_acks(ACKS_PER_STEP, "after balancing").await;
    let outcome = load.stop().await;
    println!(
        "{} sends failed and were retried elsewhere",
        outcome.failed_sends
    );
    println!("{}", verify(&cluster, "scaled", PARTITIONS, &outcome).await);
    // The dry run agrees that nothing is left to do.
    let plan = cli_ok(
        &cluster.endpoints()[4],
        &["cluster", "rebalance", "--dry-run"],
    )
    .await;
    assert!(plan.contains("no moves planned"), "{plan}");
}

/// Item 3 of the placement issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decommissioned_node_is_emptied_under_load_and_nothing_is_lost() {
    let dir = TestDir::new("placement-decommission");
    let cluster = LocalCluster::start_with_env(dir.path(), 4, ENV).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("decom", SMALL, None, Some(3))
        .await
        .unwrap();
    let four = BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1)]);
    await_balance(&cluster, &four, SMALL, "4 nodes").await;
    let held_before: Vec<u32> = (0..SMALL).collect();
    let mut rng = StdRng::seed_from_u64(test_seed("placement-decommission"));
    let load = Load::start(
        &cluster.endpoints(),
        "decom",
        SMALL,
        PRODUCERS,
        any_small_partition,
        &mut rng,
    );
    load.wait_for_acks(ACKS_PER_STEP, "before the decommission")
        .await;

    let started = Instant::now();
    let out = cli_ok(
        &cluster.endpoints()[1],
        &["node", "decommission", "4", "--wait", "--timeout", "4m"],
    )
    .await;
    println!("{out}");
    assert!(out.contains("node 4 holds no replicas"), "{out}");
    await_status(&cluster, "node 4 emptied", |s| emptied(s, 4)).await;
    println!("decommission finished after {:?}", started.elapsed());
    let status = status(&cluster).await;
    let node = status.nodes.iter().find(|n| n.id == 4).unwrap();
    assert!(node.decommissioning && node.replicas == 0, "{node:?}");
    load.wait_for_acks(ACKS_PER_STEP, "after the decommission")
        .await;
    let outcome = load.stop().await;
    println!("{}", verify(&cluster, "decom", SMALL, &outcome).await);
    // Node 4 dropped its copies.
    for p in held_before {
        assert!(
            !holds_replica(&cluster, 3, "decom", p).await,
            "node 4 still stores partition {p}"
        );
    }
    // The three remaining nodes share the replicas evenly.
    let three = BTreeMap::from([(1, 1), (2, 1), (3, 1)]);
    await_balance(&cluster, &three, SMALL, "after the decommission").await;
}

/// Item 4 of the placement issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dead_past_the_timeout_is_replaced_and_back_drops_its_stale_replicas() {
    let dir = TestDir::new("placement-dead-node");
    let mut cluster = LocalCluster::start_with_env(dir.path(), 4, ENV).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("dead", SMALL, None, Some(3))
        .await
        .unwrap();
    let four = BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1)]);
    await_balance(&cluster, &four, SMALL, "4 nodes").await;
    let status_before = status(&cluster).await;
    let held: Vec<u32> = status_before
        .partitions
        .iter()
        .filter(|p| p.replicas.iter().any(|r| r.node == 4))
        .map(|p| p.partition_id.parse().unwrap())
        .collect();
    assert!(!held.is_empty());
    let mut rng = StdRng::seed_from_u64(test_seed("placement-dead-node"));
    let load = Load::start(
        &cluster.endpoints()[..3],
        "dead",
        SMALL,
        PRODUCERS,
        any_small_partition,
        &mut rng,
    );
    load.wait_for_acks(ACKS_PER_STEP, "before the kill").await;

    cluster.nodes[3].kill9().await;
    let took = await_status(
        &cluster,
        "partitions of dead node 4 back at full replication",
        |s| emptied(s, 4),
    )
    .await;
    // The timeout is 8 s: nothing can have moved sooner.
    assert!(
        took >= Duration::from_secs(7),
        "re-replicated after {took:?}"
    );
    load.wait_for_acks(ACKS_PER_STEP, "after re-replication")
        .await;

    cluster.nodes[3].restart().await;
    let what = format!("node 4 dropping its stale replicas of partitions {held:?}");
    eventually(BALANCE_TIMEOUT, what, async || {
        let dropped = counter(&cluster, 3, "tributary_stale_replicas_dropped_total").await;
        assert!(
            dropped <= held.len() as u64,
            "node 4 dropped {dropped} stale replicas; it held partitions {held:?}"
        );
        if dropped == held.len() as u64 {
            Ok(())
        } else {
            Err(format!("{dropped} dropped"))
        }
    })
    .await;
    for p in &held {
        assert!(
            !holds_replica(&cluster, 3, "dead", *p).await || {
                // The balancer may already have given it back a fresh copy.
                status(&cluster).await.partitions[*p as usize]
                    .replicas
                    .iter()
                    .any(|r| r.node == 4)
            },
            "node 4 still stores its stale copy of partition {p}"
        );
    }
    await_balance(&cluster, &four, SMALL, "node 4 back").await;
    load.wait_for_acks(ACKS_PER_STEP, "after node 4 is used again")
        .await;
    let outcome = load.stop().await;
    println!("{}", verify(&cluster, "dead", SMALL, &outcome).await);
}

/// Item 5 of the placement issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_leader_killed_during_moves_leaves_every_partition_a_quorum() {
    let dir = TestDir::new("placement-controller-kill");
    let mut cluster = LocalCluster::start_with_env(dir.path(), 3, ENV).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("ctl", SMALL, None, Some(3))
        .await
        .unwrap();
    let three = BTreeMap::from([(1, 1), (2, 1), (3, 1)]);
    await_balance(&cluster, &three, SMALL, "3 nodes").await;
    let mut rng = StdRng::seed_from_u64(test_seed("placement-controller-kill"));
    let load = Load::start(
        &cluster.endpoints(),
        "ctl",
        SMALL,
        PRODUCERS,
        any_small_partition,
        &mut rng,
    );
    load.wait_for_acks(ACKS_PER_STEP, "before the new node")
        .await;

    // A watcher: every partition with a known leader has a quorum of caught-up replicas.
    let (stop_watch, mut stopped) = tokio::sync::watch::channel(false);
    let endpoints = cluster.endpoints();
    let watcher = tokio::spawn(async move {
        let mut looks = 0u64;
        loop {
            for endpoint in &endpoints {
                let Ok(client) = Client::connect(endpoint).await else {
                    continue;
                };
                let Ok(status) = client.cluster_status().await else {
                    continue;
                };
                looks += 1;
                // Partitions whose leader vouches for itself in this status (while a dead
                // leader's partitions elect a new one, nobody can tell who is caught up).
                let leader_up = |p: &&tributary_proto::v1::PartitionStatus| {
                    p.replicas
                        .iter()
                        .any(|r| r.node == p.leader && r.up && r.caught_up)
                };
                for p in status.partitions.iter().filter(leader_up) {
                    let healthy = p.replicas.iter().filter(|r| r.up && r.caught_up).count();
                    assert!(
                        healthy >= 2,
                        "partition {} has {healthy} caught-up replicas: {p:?}",
                        p.partition_id
                    );
                }
                break;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stopped.wait_for(|s| *s) => return looks,
            }
        }
    });

    cluster.add_node(dir.path(), &[], ENV).await;
    let in_flight = eventually(BALANCE_TIMEOUT, "a move under way", async || {
        let status = status(&cluster).await;
        if status.moves.is_empty() {
            Err("no move started")
        } else {
            Ok(status)
        }
    })
    .await;
    let leader = in_flight.controller_leader;
    println!(
        "killing controller leader {leader} with {} moves under way: {:?}",
        in_flight.moves.len(),
        in_flight.moves
    );
    assert!((1..=3).contains(&leader));
    let index = leader as usize - 1;
    cluster.nodes[index].kill9().await;
    await_status(&cluster, "a new controller leader", |s| {
        if s.controller_leader != 0 && s.controller_leader != leader {
            Ok(())
        } else {
            Err(format!("controller leader {}", s.controller_leader))
        }
    })
    .await;
    cluster.nodes[index].restart().await;
    let four = BTreeMap::from([(1, 1), (2, 1), (3, 1), (4, 1)]);
    await_balance(
        &cluster,
        &four,
        SMALL,
        "after the controller leader was killed",
    )
    .await;
    let after = status(&cluster).await;
    for m in &in_flight.moves {
        let p = after
            .partitions
            .iter()
            .find(|p| p.partition_id == m.partition_id)
            .unwrap();
        let nodes: Vec<u64> = p.replicas.iter().map(|r| r.node).collect();
        let outcome = match (nodes.contains(&m.to), nodes.contains(&m.from)) {
            (true, false) => "completed",
            (false, true) => "rolled back",
            _ => "superseded by later moves",
        };
        println!(
            "move of partition {} from {} to {}: {outcome}; replicas now {nodes:?}",
            m.partition_id, m.from, m.to
        );
    }
    load.wait_for_acks(ACKS_PER_STEP, "after balancing").await;
    stop_watch.send_replace(true);
    let looks = watcher.await.expect("no partition fell below a quorum");
    assert!(looks > 10, "the watcher looked {looks} times");
    let outcome = load.stop().await;
    println!("{}", verify(&cluster, "ctl", SMALL, &outcome).await);
}
