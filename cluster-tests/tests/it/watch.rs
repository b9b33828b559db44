//! Nodes that are not controller voters follow the cluster state through a Watch stream
//! from a voter. When that voter dies they follow another voter, never a non-voter: two
//! non-voters following each other would pass each other's frozen views for ever. (Found by
//! the kill nemesis, seed 600: after three voters had been killed in turn, both non-voters
//! kept a view minutes old, hosted replicas the cluster had moved away and were never
//! ready again.)

use std::time::Duration;

use tributary_client::{Client, ErrorReason};
use tributary_cluster_tests::{LocalCluster, TestDir, eventually};

/// How long a non-voter may take to see a change of the cluster state.
const FOLLOW_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_voters_keep_following_the_controller_as_voters_die_in_turn() {
    let dir = TestDir::new("watch-follow");
    // Nodes 1-3 are the controller's voters, 4 and 5 follow it.
    let mut cluster = LocalCluster::start(dir.path(), 5).await;
    for voter in 0..3 {
        cluster.nodes[voter].kill9().await;
        let via = Client::connect(&cluster.nodes[(voter + 1) % 3].endpoint())
            .await
            .unwrap();
        let hub = format!("after-kill-{}", voter + 1);
        // The killed voter may have led the controller: retry until another one does.
        eventually(FOLLOW_TIMEOUT, format!("{hub} created"), async || {
            let created = via.create_event_hub(&hub, 1, None).await;
            match created {
                Ok(_) => Ok(()),
                Err(err) if err.reason() == Some(ErrorReason::AlreadyExists) => Ok(()),
                Err(err) => Err(err),
            }
        })
        .await;
        for follower in [3, 4] {
            let client = Client::connect(&cluster.nodes[follower].endpoint())
                .await
                .unwrap();
            let what = format!(
                "node {} seeing hub {hub} after node {} was killed",
                follower + 1,
                voter + 1
            );
            eventually(FOLLOW_TIMEOUT, what, async || {
                client.get_event_hub(&hub).await
            })
            .await;
        }
        cluster.nodes[voter].restart().await;
    }
}
