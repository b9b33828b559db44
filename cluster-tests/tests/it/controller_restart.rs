//! The controller's applied state is stored only at its snapshot points; a restart
//! re-applies the durable log after the last one. Killed with SIGKILL between snapshot
//! points (and again right after a restart), a node comes back with every acknowledged
//! checkpoint, ownership claim and hub.

use std::collections::BTreeMap;

use tributary_client::checkpoints::Claim;
use tributary_client::{CheckpointStore, Client, ClusterCheckpointStore};
use tributary_cluster_tests::{NodeProcess, TestDir};

const HUB: &str = "replayed";
const GROUP: &str = "readers";
const PARTITIONS: u32 = 4;
/// Controller entries between snapshot points: the rounds below stop between them.
const SNAPSHOT_ENTRIES: &str = "50";
/// Entries kept behind a snapshot point: the log before it is soon deleted, so only the
/// stored state can bring back what those entries did.
const LOG_KEEP_ENTRIES: &str = "10";
/// Checkpoint updates per round, so each kill lands at another distance from a snapshot.
const ROUNDS: [i64; 3] = [37, 120, 1];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_controller_writes_survive_sigkill_between_snapshot_points() {
    let dir = TestDir::new("controller-restart");
    let mut node = NodeProcess::start_with_args(
        dir.path(),
        &[
            "--raft-snapshot-entries",
            SNAPSHOT_ENTRIES,
            "--raft-log-keep-entries",
            LOG_KEEP_ENTRIES,
        ],
    )
    .await;
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client
        .create_event_hub(HUB, PARTITIONS, None)
        .await
        .unwrap();
    client.create_consumer_group(HUB, GROUP).await.unwrap();

    let mut expected: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    let mut sequence = 0i64;
    for (round, updates) in ROUNDS.into_iter().enumerate() {
        let client = Client::connect(&node.endpoint()).await.unwrap();
        let store = ClusterCheckpointStore::new(&client);
        let owner = format!("owner-{round}");
        let claims = (0..PARTITIONS)
            .map(|p| Claim {
                partition_id: p.to_string(),
                owner_id: owner.clone(),
                etag: None,
            })
            .collect();
        // Earlier rounds' records exist: claim with their etags.
        let current = store.list_ownership(HUB, GROUP).await.unwrap();
        let claims: Vec<Claim> = if current.is_empty() {
            claims
        } else {
            current
                .iter()
                .map(|o| Claim {
                    partition_id: o.partition_id.clone(),
                    owner_id: owner.clone(),
                    etag: Some(o.etag.clone()),
                })
                .collect()
        };
        let won = store.claim_ownership(HUB, GROUP, claims).await.unwrap();
        assert_eq!(won.len(), PARTITIONS as usize, "round {round}: {won:?}");
        for _ in 0..updates {
            sequence += 1;
            let partition = (sequence % i64::from(PARTITIONS)).to_string();
            store
                .update_checkpoint(
                    HUB,
                    GROUP,
                    &partition,
                    sequence * 10,
                    sequence,
                    Some(&owner),
                )
                .await
                .unwrap();
            expected.insert(partition, (sequence * 10, sequence));
        }

        node.kill9().await;
        node.restart().await;

        let client = Client::connect(&node.endpoint()).await.unwrap();
        let store = ClusterCheckpointStore::new(&client);
        let checkpoints = store.list_checkpoints(HUB, GROUP).await.unwrap();
        let found: BTreeMap<String, (i64, i64)> = checkpoints
            .into_iter()
            .map(|(p, c)| (p, (c.offset, c.sequence_number)))
            .collect();
        assert_eq!(found, expected, "round {round}: checkpoints after SIGKILL");
        let owners = store.list_ownership(HUB, GROUP).await.unwrap();
        assert_eq!(
            owners.len(),
            PARTITIONS as usize,
            "round {round}: {owners:?}"
        );
        assert!(
            owners.iter().all(|o| o.owner_id == owner),
            "round {round}: the last claims stand: {owners:?}"
        );
        let hub = client.get_event_hub(HUB).await.unwrap();
        assert_eq!(hub.partition_ids.len(), PARTITIONS as usize);
    }
}
