//! The cluster-hosted checkpoint store under a controller leader failover: processors keep
//! claiming partitions and writing checkpoints through the surviving nodes while the
//! controller leader is killed with SIGKILL. No acknowledged checkpoint or ownership record
//! is lost, and etag conflicts come back as lost claims, not errors.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tributary_client::checkpoints::{Claim, Ownership};
use tributary_client::{CheckpointStore, Client, ClusterCheckpointStore};
use tributary_cluster_tests::{LocalCluster, TestDir, eventually};

const HUB: &str = "store";
const GROUP: &str = "billing";
const PARTITIONS: u32 = 8;
/// Acknowledged checkpoints per partition before the kill, and again after it.
const UPDATES_PER_STEP: i64 = 15;
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// What one partition's writer knows was acknowledged.
#[derive(Debug, Default, Clone)]
struct Acked {
    /// The last acknowledged checkpoint's sequence number.
    checkpoint: i64,
    /// The highest sequence number ever sent (acknowledged or not).
    attempted: i64,
    /// The ownership record of the last acknowledged claim, when no claim attempted since
    /// went unanswered.
    ownership: Option<Ownership>,
    /// The etag of the first acknowledged claim (stale once claimed again).
    first_etag: Option<String>,
}

/// Claims partition `p` for `owner` and then checkpoints it again and again, sequence numbers
/// counting up, each claim naming the etag last seen. A claim that comes back lost (a retry
/// after a lost reply finds its own earlier success) is settled by listing.
async fn writer(
    store: ClusterCheckpointStore,
    p: u32,
    owner: String,
    acked: Arc<Mutex<BTreeMap<u32, Acked>>>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let partition_id = p.to_string();
    let mut etag: Option<String> = None;
    let mut seq = 0i64;
    while !*stop.borrow_and_update() {
        let claim = Claim {
            partition_id: partition_id.clone(),
            owner_id: owner.clone(),
            etag: etag.clone(),
        };
        acked.lock().unwrap().get_mut(&p).unwrap().ownership = None;
        match store.claim_ownership(HUB, GROUP, vec![claim]).await {
            Ok(won) if won.len() == 1 => {
                etag = Some(won[0].etag.clone());
                let mut acked = acked.lock().unwrap();
                let entry = acked.get_mut(&p).unwrap();
                entry.ownership = Some(won[0].clone());
                entry.first_etag.get_or_insert(won[0].etag.clone());
            }
            Ok(_) | Err(_) => {
                // Unknown whether an earlier attempt won: the record says.
                if let Ok(records) = store.list_ownership(HUB, GROUP).await {
                    let mine = records.into_iter().find(|o| o.partition_id == partition_id);
                    if let Some(record) = mine {
                        assert_eq!(record.owner_id, owner, "partition {p} has one claimer");
                        etag = Some(record.etag.clone());
                        acked.lock().unwrap().get_mut(&p).unwrap().ownership = Some(record);
                    }
                }
                continue;
            }
        }
        seq += 1;
        acked.lock().unwrap().get_mut(&p).unwrap().attempted = seq;
        if let Ok(checkpoint) = store
            .update_checkpoint(HUB, GROUP, &partition_id, seq * 100, seq, Some(&owner))
            .await
        {
            assert_eq!(checkpoint.sequence_number, seq);
            acked.lock().unwrap().get_mut(&p).unwrap().checkpoint = seq;
        }
    }
}

async fn wait_for_progress(acked: &Arc<Mutex<BTreeMap<u32, Acked>>>, at_least: i64, what: &str) {
    let awaited = format!("{what}: {at_least} acknowledged checkpoints in every partition");
    eventually(STEP_TIMEOUT, awaited, async || {
        let slowest = acked
            .lock()
            .unwrap()
            .values()
            .map(|a| a.checkpoint)
            .min()
            .unwrap_or(0);
        if slowest >= at_least {
            Ok(())
        } else {
            Err(format!("the slowest partition has {slowest}"))
        }
    })
    .await;
}

/// Item 4 of the consumer-group issue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_checkpoint_store_survives_a_controller_leader_failover() {
    let dir = TestDir::new("checkpoint-store-failover");
    // Frequent controller snapshots, little log kept behind them: the controller's log is
    // deleted as it goes, so the killed node restarts from a snapshot and a purged log,
    // and catches up from a leader that no longer has the entries it missed.
    let mut cluster = LocalCluster::start_with_env(
        dir.path(),
        3,
        &[
            ("TRIBUTARY_RAFT_SNAPSHOT_ENTRIES", "40"),
            ("TRIBUTARY_RAFT_LOG_KEEP_ENTRIES", "10"),
        ],
    )
    .await;
    let endpoints = cluster.endpoints();
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    admin
        .create_replicated_event_hub(HUB, PARTITIONS, None, Some(3))
        .await
        .unwrap();
    admin.create_consumer_group(HUB, GROUP).await.unwrap();
    let leader = admin.cluster_status().await.unwrap().controller_leader;
    assert!((1..=3).contains(&leader), "controller leader {leader}");
    let survivors: Vec<String> = (1..=3u64)
        .filter(|id| *id != leader)
        .map(|id| endpoints[id as usize - 1].clone())
        .collect();
    println!("controller leader: node {leader}; writers use nodes {survivors:?}");

    let acked: Arc<Mutex<BTreeMap<u32, Acked>>> = Arc::new(Mutex::new(
        (0..PARTITIONS).map(|p| (p, Acked::default())).collect(),
    ));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut writers = Vec::new();
    for p in 0..PARTITIONS {
        let client = Client::connect(&survivors[p as usize % survivors.len()])
            .await
            .unwrap();
        writers.push(tokio::spawn(writer(
            client.checkpoint_store(),
            p,
            format!("processor-{}", p % 3),
            acked.clone(),
            stopped.clone(),
        )));
    }
    wait_for_progress(&acked, UPDATES_PER_STEP, "before the kill").await;
    let before_kill = acked.lock().unwrap().clone();
    println!("killing controller leader {leader}");
    let killed_at = Instant::now();
    cluster.nodes[leader as usize - 1].kill9().await;
    wait_for_progress(
        &acked,
        before_kill[&0].checkpoint.max(UPDATES_PER_STEP) + UPDATES_PER_STEP,
        "after the kill",
    )
    .await;
    println!(
        "writers made {UPDATES_PER_STEP} more checkpoints per partition within {:?} of the kill",
        killed_at.elapsed()
    );
    stop.send_replace(true);
    for w in writers {
        w.await.unwrap();
    }

    // Every acknowledged record is there, read through either survivor.
    let acked = acked.lock().unwrap().clone();
    for endpoint in &survivors {
        let store = Client::connect(endpoint).await.unwrap().checkpoint_store();
        let checkpoints = store.list_checkpoints(HUB, GROUP).await.unwrap();
        let ownership = store.list_ownership(HUB, GROUP).await.unwrap();
        for (p, a) in &acked {
            let stored = checkpoints[&p.to_string()];
            assert!(
                stored.sequence_number >= a.checkpoint && stored.sequence_number <= a.attempted,
                "partition {p}: stored checkpoint {} but {} was acknowledged ({} attempted)",
                stored.sequence_number,
                a.checkpoint,
                a.attempted
            );
            assert_eq!(stored.offset, stored.sequence_number * 100);
            let record = ownership
                .iter()
                .find(|o| o.partition_id == p.to_string())
                .unwrap_or_else(|| panic!("partition {p}: ownership record lost"));
            if let Some(claimed) = &a.ownership {
                assert_eq!(record, claimed, "partition {p}: acknowledged claim lost");
            }
        }
    }

    // Etag conflicts: two claimers with the same etag, one wins and the other's claim is
    // lost (no error); the etag from before the failover is stale.
    let store_a = Client::connect(&survivors[0])
        .await
        .unwrap()
        .checkpoint_store();
    let store_b = Client::connect(&survivors[1])
        .await
        .unwrap()
        .checkpoint_store();
    let current = store_a
        .list_ownership(HUB, GROUP)
        .await
        .unwrap()
        .into_iter()
        .find(|o| o.partition_id == "0")
        .unwrap();
    let claim = |owner: &str, etag: &str| Claim {
        partition_id: "0".into(),
        owner_id: owner.into(),
        etag: Some(etag.into()),
    };
    let (a, b) = tokio::join!(
        store_a.claim_ownership(HUB, GROUP, vec![claim("a", &current.etag)]),
        store_b.claim_ownership(HUB, GROUP, vec![claim("b", &current.etag)]),
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    assert_eq!(a.len() + b.len(), 1, "exactly one claim wins: {a:?} {b:?}");
    let stale = before_kill[&0]
        .first_etag
        .clone()
        .expect("claimed before the kill");
    let lost = store_a
        .claim_ownership(HUB, GROUP, vec![claim("c", &stale)])
        .await
        .unwrap();
    assert!(lost.is_empty(), "a stale etag wins nothing: {lost:?}");
    // A claim for a partition that had a record, made as if it had none, is lost too.
    let lost = store_b
        .claim_ownership(
            HUB,
            GROUP,
            vec![Claim {
                partition_id: "1".into(),
                owner_id: "d".into(),
                etag: None,
            }],
        )
        .await
        .unwrap();
    assert!(
        lost.is_empty(),
        "only an absent record is created: {lost:?}"
    );

    // The killed node comes back and, with one of the others stopped, is half of the
    // controller's quorum: every record is still there, and new commands commit.
    let records = store_a.list_checkpoints(HUB, GROUP).await.unwrap();
    cluster.nodes[leader as usize - 1].restart().await;
    let other = (1..=3u64).find(|id| *id != leader).unwrap();
    cluster.nodes[other as usize - 1].terminate().await;
    let restarted = Client::connect(&endpoints[leader as usize - 1])
        .await
        .unwrap();
    assert_eq!(
        restarted
            .checkpoint_store()
            .list_checkpoints(HUB, GROUP)
            .await
            .unwrap(),
        records,
        "the records after node {leader} restarted and node {other} stopped"
    );
    restarted
        .create_consumer_group(HUB, "after-restart")
        .await
        .unwrap();
}
