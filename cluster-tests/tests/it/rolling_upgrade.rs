//! A rolling upgrade from the previous release: a 3-node cluster of release 0.1.0 (built by
//! `scripts/previous-release` from the compatibility fixtures' commit; the test finds it
//! through `TRIBUTARY_PREVIOUS_BIN`) under continuous idempotent sends, each node drained,
//! stopped and started again with the build under test. No send fails, every acknowledged
//! event is stored once at its sequence number, the cluster's feature level stays at 1
//! while any node runs the previous release and rises once the last one is upgraded, and
//! then a node of the previous release can no longer join.

use std::path::PathBuf;

use tokio::time::Instant;
use tributary_client::Client;
use tributary_cluster_tests::{
    LocalCluster, NodePorts, NodeProcess, TestDir, cli_ok, eventually, http_get, require_tool,
};

use super::rolling_restart::{
    ContinuousProducer, PARTITIONS, assert_exactly_acknowledged, await_status, healthy,
};

const HUB: &str = "upgrading";
/// The variable naming the previous release's binary.
pub(crate) const PREVIOUS_BIN_ENV: &str = "TRIBUTARY_PREVIOUS_BIN";
/// Set to 1 (as `scripts/test` does) to fail instead of skipping without that binary.
const REQUIRE_ENV: &str = "TRIBUTARY_REQUIRE_PREVIOUS_RELEASE";
const SETTLE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// The previous release's binary, or `None` (skipped, saying so).
pub(crate) fn previous_release_binary() -> Option<PathBuf> {
    let found = std::env::var_os(PREVIOUS_BIN_ENV)
        .map(PathBuf::from)
        .filter(|path| path.is_file());
    require_tool(
        &format!("the previous release's binary (${PREVIOUS_BIN_ENV})"),
        found,
        "run scripts/rolling-upgrade, or set TRIBUTARY_PREVIOUS_BIN=$(scripts/previous-release \
         $(cat cluster-tests/fixtures/release-0.1.0/COMMIT))",
        REQUIRE_ENV,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_from_the_previous_release_fails_no_send_and_raises_the_level_last() {
    let Some(previous) = previous_release_binary() else {
        return;
    };
    let dir = TestDir::new("rolling-upgrade");
    // Placement rounds (which raise the level once they may) five times a second, so many
    // run while each upgraded node shares the cluster with older ones.
    let env = [("TRIBUTARY_PLACEMENT_INTERVAL", "200ms")];
    let mut cluster = LocalCluster::start_with_binary(dir.path(), 3, &previous, &env).await;
    let endpoints = cluster.endpoints();
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    admin
        .create_replicated_event_hub(HUB, PARTITIONS, None, Some(3))
        .await
        .unwrap();
    await_status(&admin, "the previous release's cluster healthy", healthy).await;
    let client = Client::connect_any(&endpoints).await.unwrap();
    let producer = ContinuousProducer::start(&client, HUB, PARTITIONS);
    producer.await_sends("on the previous release".into()).await;

    let started = Instant::now();
    let count = cluster.nodes.len();
    for (index, node) in cluster.nodes.iter_mut().enumerate() {
        let id = index as u64 + 1;
        // As the chart's preStop hook and the README's procedure: drain, stop, start the
        // new release on the same data directory.
        let http_addr = node.http_addr().to_string();
        cli_ok(
            &endpoints[index],
            &["drain", "--http-addr", &http_addr, "--timeout", "30s"],
        )
        .await;
        let exit = node.terminate().await;
        assert!(exit.success(), "node {id} did not stop cleanly: {exit}");
        producer
            .await_sends(format!("with node {id} stopped"))
            .await;
        node.set_binary(None);
        node.restart().await;
        // Asked through the upgraded node: the previous release reports no level.
        let upgraded = Client::connect(&endpoints[index]).await.unwrap();
        await_status(
            &upgraded,
            &format!("cluster healthy after upgrading node {id}"),
            healthy,
        )
        .await;
        producer
            .await_sends(format!("after upgrading node {id}"))
            .await;
        let status = upgraded.cluster_status().await.unwrap();
        let releases: Vec<String> = status.nodes.iter().map(|n| n.release.clone()).collect();
        if index + 1 < count {
            // Placement rounds (which raise the level when they can) have run while the
            // cluster healed and the producer sent.
            assert_eq!(
                status.feature_level, 1,
                "the level rose while nodes run the previous release: {releases:?}"
            );
            assert_eq!(build_info_level(node).await, "1", "build info");
            assert!(
                releases.iter().any(|r| r == "0.1.0"),
                "status names the previous release: {releases:?}"
            );
        }
        println!(
            "node {id} upgraded; {:?} since the first",
            started.elapsed()
        );
    }

    // Every node runs this release: the controller raises the level.
    let admin = Client::connect(&endpoints[0]).await.unwrap();
    await_status(&admin, "the cluster's feature level raised", |s| {
        s.feature_level == tributary_types::format::FEATURE_LEVEL
            && s.nodes
                .iter()
                .all(|n| n.release == tributary_types::format::RELEASE)
    })
    .await;
    for node in &cluster.nodes {
        let what = format!("node at {} reports the raised level", node.http_addr());
        eventually(SETTLE_TIMEOUT, what, async || {
            match build_info_level(node).await.as_str() {
                "2" => Ok(()),
                other => Err(other.to_string()),
            }
        })
        .await;
    }
    producer.await_sends("at the raised level".into()).await;
    let acknowledged = producer.finish(started).await;
    assert_exactly_acknowledged(&client, HUB, PARTITIONS, &acknowledged).await;

    // At the new level a node of the previous release is refused, saying what it needs.
    let seeds = cluster.seeds.clone();
    let mut old = NodeProcess::launch_binary(
        &previous,
        &dir.path().join("node-4"),
        NodePorts::free(),
        &["--node-id".into(), "4".into(), "--seeds".into(), seeds],
        &[],
    );
    let exit = old.wait_for_exit().await;
    let log = old.run_log();
    assert!(!exit.success(), "the old node must not start: {log}");
    assert!(
        log.contains("needs release 0.2.0 or later"),
        "the refusal names the release: {log}"
    );
}

/// The `cluster_feature_level` label of the node's build info series that is 1.
async fn build_info_level(node: &NodeProcess) -> String {
    let metrics = http_get(node.http_addr(), "/metrics").await.unwrap().body;
    metrics
        .lines()
        .filter(|l| l.starts_with("tributary_build_info{") && l.ends_with(" 1"))
        .find_map(|l| {
            let at = l.find("cluster_feature_level=\"")? + "cluster_feature_level=\"".len();
            Some(l[at..].split('"').next()?.to_string())
        })
        .unwrap_or_default()
}
