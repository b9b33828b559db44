//! The controller's log does not grow without bound: its snapshot is its whole state, so
//! the entries it covers are deleted and the segment files they lay in are freed, however
//! many checkpoints are written.

use std::path::Path;
use std::time::Duration;

use tributary_client::{CheckpointStore, ClusterCheckpointStore};
use tributary_cluster_tests::eventually;

use crate::support::TestNode;

/// Ids of the log segment files of the node's storage shards.
fn segment_ids(data_dir: &Path) -> Vec<u64> {
    let mut ids = Vec::new();
    for shard in std::fs::read_dir(data_dir).unwrap() {
        let shard = shard.unwrap().path();
        if shard.is_dir() {
            for file in std::fs::read_dir(&shard).unwrap() {
                let name = file.unwrap().file_name().to_string_lossy().into_owned();
                if let Some(id) = name.strip_suffix(".seg") {
                    ids.push(id.parse().unwrap());
                }
            }
        }
    }
    ids.sort_unstable();
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_do_not_keep_segment_files_alive() {
    const SEGMENT_BYTES: u64 = 16 * 1024;
    /// Without the deletion, every segment the test writes (30 or more) stays.
    const SEGMENTS_LEFT_MAX: usize = 8;
    let node = TestNode::start_with(|config| {
        config.segment_bytes = SEGMENT_BYTES;
        config.raft.snapshot_entries = 100;
        config.raft.log_keep_entries = 50;
    })
    .await;
    let data_dir = node.config.data_dir.clone();
    node.client
        .create_event_hub("orders", 8, None)
        .await
        .unwrap();
    let store = ClusterCheckpointStore::new(&node.client);
    // Eight writers, one per partition: about 0.5 MB of controller log in all (some 110
    // bytes per update), some 30 segment files' worth.
    let writers = (0..8).map(|partition| {
        let store = store.clone();
        tokio::spawn(async move {
            for sequence in 0..500i64 {
                store
                    .update_checkpoint(
                        "orders",
                        "$Default",
                        &partition.to_string(),
                        sequence * 100,
                        sequence,
                        None,
                    )
                    .await
                    .unwrap();
            }
        })
    });
    for writer in writers {
        writer.await.unwrap();
    }
    // The first segment holds the hub's first entries and stays. Of the rest, only the
    // newest few may: the controller's entries since its last snapshot and the kept ones
    // behind it (up to 150 entries, some 16 KiB), and those not yet covered by a storage
    // checkpoint (each second). The controller's purged entries free all older ones.
    eventually(
        Duration::from_secs(30),
        format!("at most {SEGMENTS_LEFT_MAX} segment files left"),
        async || {
            let segments = segment_ids(&data_dir);
            let newest = segments.last().copied().unwrap_or(0);
            assert!(
                newest >= 20,
                "the test wrote only {newest} segments of log: {segments:?}"
            );
            if segments.len() <= SEGMENTS_LEFT_MAX {
                Ok(())
            } else {
                Err(format!(
                    "segment files {segments:?} of {SEGMENT_BYTES} bytes remain"
                ))
            }
        },
    )
    .await;
    let checkpoints = store.list_checkpoints("orders", "$Default").await.unwrap();
    assert_eq!(checkpoints.len(), 8);
    assert!(checkpoints.values().all(|c| c.sequence_number == 499));
}
