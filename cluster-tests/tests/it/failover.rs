//! Leader failover in a three-node cluster of real processes, under continuous sends:
//! partition leaders killed with SIGKILL and restarted, round after round, and a leader
//! frozen with SIGSTOP past the election timeout, then continued. Checked through each node's
//! own replica (`Diagnostics.ReplicaEvents`): every acknowledged event is where its ack put
//! it, sequence numbers are gap-free, all replicas of a partition hold the identical events,
//! and nothing a consumer saw vanished.

use std::collections::BTreeMap;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng as _, SeedableRng as _};
use tokio::time::Instant;
use tributary_client::{Client, SendTarget, replica_digest};
use tributary_cluster_tests::{
    LocalCluster, NodeProcess, TestDir, cli, cli_ok, eventually, test_seed,
};

use crate::load::{Load, STEP_TIMEOUT, verify};

/// Kill-and-restart rounds of the SIGKILL test.
const KILL_ROUNDS: usize = 10;
const KILL_HUB: &str = "failover";
const KILL_PARTITIONS: u32 = 12;
/// Partitions 0..HOT get most explicit sends; the busiest partitions are measured, not
/// assumed, but these make sure some stand out.
const HOT_PARTITIONS: u32 = 4;
/// The busiest partitions of a round whose leaders decide which node is killed.
const BUSIEST_PARTITIONS: usize = 4;
const KILL_PRODUCERS: u64 = 4;

const PAUSE_HUB: &str = "paused";
const PAUSE_PARTITIONS: u32 = 3;
const PAUSE_PRODUCERS: u64 = 3;
/// The paused partition; most sends go to it.
const PAUSED_PARTITION: &str = "0";
/// How long the leader stays frozen: well past the longest election timeout (1600 ms).
const PAUSE: Duration = Duration::from_secs(4);

/// Distinct partition keys the producers use.
const PARTITION_KEYS: u32 = 40;
/// Acknowledged events that must arrive between the steps of a round: the cluster keeps
/// serving.
const ACKS_PER_STEP: u64 = 40;

/// Item 2 of the failover issue: the node leading most of the busiest partitions is killed
/// with SIGKILL and restarted, ten times, while producers and consumers keep going.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leaders_lose_nothing_and_replicas_stay_identical() {
    let seed = test_seed("killed_leaders_lose_nothing_and_replicas_stay_identical");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = TestDir::new("failover-kill");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    Client::connect(&endpoints[0])
        .await
        .unwrap()
        .create_replicated_event_hub(KILL_HUB, KILL_PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let load = Load::start(
        &endpoints,
        KILL_HUB,
        KILL_PARTITIONS,
        KILL_PRODUCERS,
        |rng| {
            if rng.random_bool(0.6) {
                SendTarget::PartitionId(rng.random_range(0..HOT_PARTITIONS).to_string())
            } else if rng.random_bool(0.5) {
                SendTarget::PartitionId(rng.random_range(0..KILL_PARTITIONS).to_string())
            } else {
                SendTarget::PartitionKey(format!("key-{}", rng.random_range(0..PARTITION_KEYS)))
            }
        },
        &mut rng,
    );
    let started = Instant::now();
    let mut counted = load.acked_per_partition();
    for round in 1..=KILL_ROUNDS {
        load.wait_for_acks(ACKS_PER_STEP, "before the kill").await;
        let now = load.acked_per_partition();
        let busiest = busiest_partitions(&counted, &now);
        counted = now;
        let leaders = partition_leaders(&cluster, KILL_HUB, None).await;
        let victim = leading_most(&leaders, &busiest);
        eprintln!(
            "round {round}: busiest partitions {busiest:?}, leaders {leaders:?}: killing node {} \
             ({:.1}s so far)",
            victim + 1,
            started.elapsed().as_secs_f64()
        );
        cluster.nodes[victim].kill9().await;
        let killed_at = Instant::now();
        // Sends go on, and the partitions the victim led get new leaders that accept them.
        let led: Vec<usize> = (0..leaders.len())
            .filter(|p| leaders[*p] == victim as u64 + 1)
            .collect();
        load.wait_for_acks_to(&led, "after the kill, to the partitions the victim led")
            .await;
        let failed_over_ms = killed_at.elapsed().as_millis();
        let restarting_at = Instant::now();
        cluster.nodes[victim].restart().await;
        let restart_ms = restarting_at.elapsed().as_millis();
        let catching_up_at = Instant::now();
        let caught_up = wait_caught_up(&cluster, victim, KILL_HUB, KILL_PARTITIONS).await;
        eprintln!(
            "round {round}: sends to its partitions resumed {failed_over_ms} ms after the kill; \
             restart took {restart_ms} ms, catching up {} ms",
            catching_up_at.elapsed().as_millis()
        );
        eprintln!(
            "round {round}: node {} back and caught up with {caught_up} events; {} acked, {}",
            victim + 1,
            load.acked_total(),
            load.failures()
        );
    }
    load.wait_for_acks(ACKS_PER_STEP, "after the last round")
        .await;
    let outcome = load.stop().await;
    let report = verify(&cluster, KILL_HUB, KILL_PARTITIONS, &outcome).await;
    assert_all_running(&mut cluster);
    eprintln!(
        "{report}; {} sends failed during failovers; {:.1}s in all",
        outcome.failed_sends,
        started.elapsed().as_secs_f64()
    );
}

/// Item 3 of the failover issue: a partition leader frozen with SIGSTOP past the election
/// timeout is replaced, steps down once continued, and nothing acknowledged is lost or
/// numbered twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_steps_down_and_loses_nothing() {
    let seed = test_seed("a_paused_leader_steps_down_and_loses_nothing");
    let mut rng = StdRng::seed_from_u64(seed);
    let dir = TestDir::new("failover-pause");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    Client::connect(&endpoints[0])
        .await
        .unwrap()
        .create_replicated_event_hub(PAUSE_HUB, PAUSE_PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let load = Load::start(
        &endpoints,
        PAUSE_HUB,
        PAUSE_PARTITIONS,
        PAUSE_PRODUCERS,
        |rng| {
            if rng.random_bool(0.7) {
                SendTarget::PartitionId(PAUSED_PARTITION.to_owned())
            } else {
                SendTarget::PartitionId(rng.random_range(0..PAUSE_PARTITIONS).to_string())
            }
        },
        &mut rng,
    );
    load.wait_for_acks(ACKS_PER_STEP, "before the pause").await;
    let partition: usize = PAUSED_PARTITION.parse().unwrap();
    let old_leader = partition_leaders(&cluster, PAUSE_HUB, None).await[partition];
    let paused = usize::try_from(old_leader - 1).unwrap();
    eprintln!("pausing node {old_leader}, the leader of partition {PAUSED_PARTITION}");
    cluster.nodes[paused].pause();
    let paused_at = Instant::now();

    // Another node is elected (a higher term) and takes sends while the old leader sleeps.
    let cluster_ref = &cluster;
    let new_leader = eventually(
        STEP_TIMEOUT,
        "another leader of the paused node's partition",
        move || async move {
            let leader = partition_leaders(cluster_ref, PAUSE_HUB, Some(paused)).await[partition];
            if leader != old_leader {
                Ok(leader)
            } else {
                Err(format!("node {leader} still reported as the leader"))
            }
        },
    )
    .await;
    eprintln!(
        "node {new_leader} leads partition {PAUSED_PARTITION} {:.1}s into the pause",
        paused_at.elapsed().as_secs_f64()
    );
    load.wait_for_acks_to(&[partition], "during the pause")
        .await;
    assert!(
        cluster.nodes[paused].is_paused(),
        "node {old_leader} is still paused"
    );
    // The deliberate part: the old leader stays frozen for the whole pause.
    tokio::time::sleep_until(paused_at + PAUSE).await;
    cluster.nodes[paused].resume();
    eprintln!(
        "resumed node {old_leader} after {:.1}s",
        paused_at.elapsed().as_secs_f64()
    );

    // Continued, the old leader learns of the newer term and steps down: its own replica says
    // so. It must not lead again while the new leader runs.
    let old_client = &Client::connect(&endpoints[paused]).await.unwrap();
    let resumed_at = Instant::now();
    eventually(
        STEP_TIMEOUT,
        "the resumed leader stepped down",
        move || async move {
            match old_client
                .replica_events_page(PAUSE_HUB, PAUSED_PARTITION, i64::MAX, 1)
                .await
            {
                Ok(page) if !page.is_leader => Ok(()),
                Ok(_) => Err(format!("node {old_leader} still says it leads")),
                Err(e) => Err(e.to_string()),
            }
        },
    )
    .await;
    eprintln!(
        "node {old_leader} stepped down {} ms after it was resumed",
        resumed_at.elapsed().as_millis()
    );
    let leaders = partition_leaders(&cluster, PAUSE_HUB, None).await;
    assert_ne!(
        leaders[partition], old_leader,
        "the resumed node leads partition {PAUSED_PARTITION} again: {leaders:?}"
    );
    load.wait_for_acks(ACKS_PER_STEP, "after the resume").await;

    let outcome = load.stop().await;
    let report = verify(&cluster, PAUSE_HUB, PAUSE_PARTITIONS, &outcome).await;
    eprintln!("{report}; {} sends failed", outcome.failed_sends);
    assert_cli_summaries_agree(&cluster, PAUSE_HUB, PAUSED_PARTITION).await;
    assert_all_running(&mut cluster);
}

/// `tributary debug replica-events` against each node prints the same summary as the SDK
/// computes, and refuses what it cannot list with a message a person can act on.
async fn assert_cli_summaries_agree(cluster: &LocalCluster, hub: &str, partition: &str) {
    let args = [
        "debug",
        "replica-events",
        "--hub",
        hub,
        "--partition",
        partition,
    ];
    let mut digests = Vec::new();
    for node in &cluster.nodes {
        let listing = Client::connect(&node.endpoint())
            .await
            .unwrap()
            .replica_events(hub, partition, 0, None)
            .await
            .unwrap();
        let expected = replica_digest(&listing.events);
        let text = cli_ok(&node.endpoint(), &[&args[..], &["--summary"]].concat()).await;
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "--summary prints one line: {text}");
        let summary: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        let summary = &summary["summary"];
        assert_eq!(summary["count"], expected.count, "{text}");
        assert_eq!(
            summary["last_sequence"],
            expected.last_sequence_number.unwrap(),
            "{text}"
        );
        assert_eq!(
            summary["digest"],
            format!("{:016x}", expected.digest),
            "{text}"
        );
        digests.push(summary["digest"].clone());
    }
    assert!(
        digests.windows(2).all(|w| w[0] == w[1]),
        "replica digests differ between nodes: {digests:?}"
    );

    // Listing events: one JSON line per event, then the summary.
    let endpoint = cluster.nodes[0].endpoint();
    let text = cli_ok(
        &endpoint,
        &[&args[..], &["--from-sequence", "2", "--limit", "3"]].concat(),
    )
    .await;
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "{text}");
    for (i, line) in lines[..3].iter().enumerate() {
        assert_eq!(line["sequence"], 2 + i as i64, "{text}");
        assert!(line["body_checksum"].as_str().unwrap().len() == 8, "{text}");
        assert!(line["offset"].is_string(), "{text}");
        assert!(line["enqueued_time"].is_string(), "{text}");
    }
    assert_eq!(lines[3]["summary"]["count"], 3, "{text}");

    let missing = cli(
        &endpoint,
        &[
            "debug",
            "replica-events",
            "--hub",
            "nope",
            "--partition",
            "0",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(!missing.status.success());
    assert!(stderr.contains("'nope'"), "{stderr}");
    let out_of_range = cli(&endpoint, &[&args[..4], &["--partition", "99"]].concat()).await;
    let stderr = String::from_utf8_lossy(&out_of_range.stderr);
    assert!(!out_of_range.status.success());
    assert!(stderr.contains("99"), "{stderr}");

    // A node without a replica says where the replicas are.
    let client = Client::connect(&endpoint).await.unwrap();
    client
        .create_replicated_event_hub("single", 1, None, Some(1))
        .await
        .unwrap();
    let holder = partition_leaders(cluster, "single", None).await[0];
    let other = cluster
        .nodes
        .iter()
        .enumerate()
        .find(|(i, _)| *i as u64 + 1 != holder)
        .map(|(_, n)| n.endpoint())
        .unwrap();
    let output = cli(
        &other,
        &[
            "debug",
            "replica-events",
            "--hub",
            "single",
            "--partition",
            "0",
        ],
    )
    .await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("holds no replica") && stderr.contains(&format!("[{holder}]")),
        "{stderr}"
    );
}

/// The partitions with the most events acknowledged between two counts, busiest first.
fn busiest_partitions(before: &[u64], now: &[u64]) -> Vec<usize> {
    let mut partitions: Vec<usize> = (0..now.len()).collect();
    partitions.sort_by_key(|p| (std::cmp::Reverse(now[*p] - before[*p]), *p));
    partitions.truncate(BUSIEST_PARTITIONS);
    partitions
}

/// The index of the node that leads most of `busiest` (then most partitions overall; then
/// the lowest id).
fn leading_most(leaders: &[u64], busiest: &[usize]) -> usize {
    let busy_led = |node: u64| busiest.iter().filter(|p| leaders[**p] == node).count();
    let all_led = |node: u64| leaders.iter().filter(|l| **l == node).count();
    let node = (1..=3u64)
        .max_by_key(|node| (busy_led(*node), all_led(*node), std::cmp::Reverse(*node)))
        .expect("three nodes");
    usize::try_from(node - 1).unwrap()
}

/// The leader of every partition of `hub`, in partition order, as the cluster status
/// (asked of a running node other than `skip`) reports it; waits until each has one.
async fn partition_leaders(cluster: &LocalCluster, hub: &str, skip: Option<usize>) -> Vec<u64> {
    eventually(
        STEP_TIMEOUT,
        format!("a leader for every partition of {hub}"),
        move || async move {
            let mut last = String::from("no running node to ask");
            for (i, node) in cluster.nodes.iter().enumerate() {
                if Some(i) == skip || node.pid().is_none() || node.is_paused() {
                    continue;
                }
                let status = match Client::connect(&node.endpoint())
                    .await
                    .unwrap()
                    .cluster_status()
                    .await
                {
                    Ok(status) => status,
                    Err(e) => {
                        last = e.to_string();
                        continue;
                    }
                };
                let mut leaders: BTreeMap<u32, u64> = BTreeMap::new();
                for p in status.partitions.iter().filter(|p| p.event_hub == hub) {
                    leaders.insert(p.partition_id.parse().unwrap(), p.leader);
                }
                if !leaders.is_empty() && leaders.values().all(|l| *l != 0) {
                    return Ok(leaders.into_values().collect());
                }
                last = format!("leaders {leaders:?}");
            }
            Err(last)
        },
    )
    .await
}

/// Waits until the restarted node's replica of every partition has applied at least what
/// the other replicas had when it came back; returns how many events that is in all.
async fn wait_caught_up(
    cluster: &LocalCluster,
    restarted: usize,
    hub: &str,
    partitions: u32,
) -> i64 {
    let mut targets = Vec::new();
    for p in 0..partitions {
        let mut target = 0;
        for (i, node) in cluster.nodes.iter().enumerate() {
            if i != restarted {
                let endpoint = &node.endpoint();
                let next = eventually(STEP_TIMEOUT, "the other replicas' progress", move || {
                    next_sequence(endpoint, hub, p)
                })
                .await;
                target = target.max(next);
            }
        }
        targets.push(target);
    }
    let endpoint = &cluster.nodes[restarted].endpoint();
    for (p, target) in (0..partitions).zip(&targets) {
        eventually(
            STEP_TIMEOUT,
            format!("the restarted node's replica of partition {p} caught up to {target}"),
            move || async move {
                let next = next_sequence(endpoint, hub, p).await?;
                if next >= *target {
                    Ok(())
                } else {
                    Err(format!("at {next}"))
                }
            },
        )
        .await;
    }
    targets.iter().sum()
}

/// The sequence number the node's replica will give its next applied event.
async fn next_sequence(endpoint: &str, hub: &str, partition: u32) -> Result<i64, String> {
    let client = Client::connect(endpoint).await.map_err(|e| e.to_string())?;
    client
        .replica_events_page(hub, &partition.to_string(), i64::MAX, 1)
        .await
        .map(|page| page.next_sequence_number)
        .map_err(|e| e.to_string())
}

fn assert_all_running(cluster: &mut LocalCluster) {
    for node in &mut cluster.nodes {
        NodeProcess::assert_running(node);
    }
}
