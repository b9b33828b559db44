//! The cluster feature level: a cluster of this release raises its level once every node
//! supports it, and a cluster that runs a later release's level refuses nodes of this
//! release, at join and at restart, with a message naming the release they need. The later
//! release is simulated by the test build's `TRIBUTARY_TEST_FEATURE_LEVEL` (debug builds
//! only): those nodes report release 0.3.0 and support level 3.

use tributary_client::Client;
use tributary_cluster_tests::{LocalCluster, NodePorts, NodeProcess, TestDir, eventually};
use tributary_types::format;

use super::rolling_restart::await_status;

const LATER_LEVEL: u32 = format::FEATURE_LEVEL + 1;
const LATER_RELEASE: &str = "0.3.0";
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_at_a_later_level_refuses_nodes_of_this_release_naming_the_release() {
    let dir = TestDir::new("feature-level");
    let later = format!("{LATER_LEVEL}@{LATER_RELEASE}");
    let mut cluster =
        LocalCluster::start_with_env(dir.path(), 3, &[("TRIBUTARY_TEST_FEATURE_LEVEL", &later)])
            .await;
    let admin = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    await_status(&admin, "the later release's level raised", |s| {
        s.feature_level == LATER_LEVEL
            && s.feature_release == LATER_RELEASE
            && s.nodes.iter().all(|n| n.release == LATER_RELEASE)
    })
    .await;

    // A node of this release asks to join.
    let mut joining = NodeProcess::launch_with_env(
        &dir.path().join("node-4"),
        NodePorts::free(),
        &[
            "--node-id".into(),
            "4".into(),
            "--seeds".into(),
            cluster.seeds.clone(),
        ],
        &[],
    );
    let exit = joining.wait_for_exit().await;
    let log = joining.run_log();
    assert!(!exit.success(), "a node of this release joined: {log}");
    assert!(
        log.contains(&format!(
            "runs feature level {LATER_LEVEL} and needs release {LATER_RELEASE} or later"
        )) && log.contains(&format!("node 4 runs release {}", format::RELEASE)),
        "the refusal names both releases: {log}"
    );
    let status = admin.cluster_status().await.unwrap();
    assert!(
        status.nodes.iter().all(|n| n.id != 4),
        "the refused node is not registered"
    );

    // A member of that cluster restarted with this release (a downgrade) is refused too:
    // its data directory records the level.
    let node = &mut cluster.nodes[2];
    assert!(node.terminate().await.success());
    let data_dir = node.data_dir().to_path_buf();
    let ports = node.ports();
    let args = [
        "--node-id".into(),
        "3".into(),
        "--seeds".into(),
        cluster.seeds.clone(),
    ];
    let mut downgraded = NodeProcess::launch_with_env(&data_dir, ports, &args, &[]);
    let exit = downgraded.wait_for_exit().await;
    let log = downgraded.run_log();
    assert!(!exit.success(), "a downgraded node started: {log}");
    assert!(
        log.contains(&format!(
            "feature level {LATER_LEVEL}, which needs release {LATER_RELEASE} or later"
        )),
        "the refusal names the release: {log}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_cluster_of_this_release_runs_its_level() {
    let dir = TestDir::new("feature-level-new");
    let cluster = LocalCluster::start(dir.path(), 3).await;
    let admin = Client::connect(&cluster.endpoints()[1]).await.unwrap();
    await_status(&admin, "this release's level raised", |s| {
        s.feature_level == format::FEATURE_LEVEL
            && s.nodes
                .iter()
                .all(|n| n.release == format::RELEASE && n.feature_level == format::FEATURE_LEVEL)
    })
    .await;
    for node in &cluster.nodes {
        let what = format!("{} records the level", node.data_dir().display());
        eventually(SETTLE_TIMEOUT, what, async || {
            let identity = std::fs::read_to_string(node.data_dir().join("identity.json"))
                .map_err(|e| e.to_string())?;
            let identity: serde_json::Value =
                serde_json::from_str(&identity).map_err(|e| e.to_string())?;
            if identity["feature_level"] == format::FEATURE_LEVEL {
                Ok(())
            } else {
                Err(identity.to_string())
            }
        })
        .await;
    }
}
