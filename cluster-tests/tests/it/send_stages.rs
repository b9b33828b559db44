//! Where a send's time goes: on a three-node cluster, a send makes every stage histogram of
//! `tributary_send_stage_seconds` count on the node that records it (the leader's stages on
//! the leader, the followers' on both followers), and `tributary bench --breakdown` reports
//! them.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;
use tributary_client::{Client, EventData, SendTarget};
use tributary_cluster_tests::{LocalCluster, NodeProcess, TestDir, cli_ok, eventually, http_get};

/// Longest the counts may take to move after the sends were acknowledged (the second
/// follower may store the entries after the reply).
const COUNTS_TIMEOUT: Duration = Duration::from_secs(30);

/// Recorded on the partition's leader.
const LEADER_STAGES: &[&str] = &[
    "front_end",
    "appender_wait",
    "commit",
    "apply",
    "reply",
    "total",
    "leader_log_write",
    "replication",
    "storage_queue",
    "storage_log_write",
    "storage_index_commit",
];
/// Recorded on each follower.
const FOLLOWER_STAGES: &[&str] = &[
    "follower_handle",
    "follower_write",
    "storage_queue",
    "storage_log_write",
    "storage_index_commit",
];

/// Every stage's sample count on a node's metrics page (absent: none yet).
async fn stage_counts(node: &NodeProcess) -> Result<HashMap<String, f64>, String> {
    let page = http_get(node.http_addr(), "/metrics")
        .await
        .map_err(|e| format!("{}: {e}", node.metrics_url()))?;
    let mut counts = HashMap::new();
    for line in page.body.lines() {
        let Some(rest) = line.strip_prefix("tributary_send_stage_seconds_count{stage=\"") else {
            continue;
        };
        let Some((stage, value)) = rest.split_once("\"} ") else {
            continue;
        };
        if let Ok(value) = value.trim().parse::<f64>() {
            counts.insert(stage.to_owned(), value);
        }
    }
    Ok(counts)
}

#[tokio::test]
async fn a_send_counts_in_every_stage_on_leader_and_followers() {
    let dir = TestDir::new("send_stages");
    let cluster = LocalCluster::start(dir.path(), 3).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("staged", 1, None, Some(3))
        .await
        .unwrap();
    let leader = cluster.partition_leader("staged", "0").await;
    let mut before = Vec::new();
    for node in &cluster.nodes {
        before.push(stage_counts(node).await.unwrap());
    }

    let producer = Client::connect(&cluster.nodes[leader].endpoint())
        .await
        .unwrap()
        .producer();
    for i in 0..3 {
        producer
            .send(
                "staged",
                SendTarget::PartitionId("0".into()),
                vec![EventData::from_body(format!("e{i}"))],
            )
            .await
            .unwrap();
    }

    for (index, node) in cluster.nodes.iter().enumerate() {
        let (role, stages) = if index == leader {
            ("leader", LEADER_STAGES)
        } else {
            ("follower", FOLLOWER_STAGES)
        };
        let before = &before[index];
        eventually(
            COUNTS_TIMEOUT,
            format!("every {role} stage counted on node {}", index + 1),
            async || {
                let after = stage_counts(node).await?;
                let still: Vec<&str> = stages
                    .iter()
                    .copied()
                    .filter(|stage| {
                        after.get(*stage).copied().unwrap_or(0.0)
                            <= before.get(*stage).copied().unwrap_or(0.0)
                    })
                    .collect();
                if still.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "not counted yet: {still:?} (before {before:?}, now {after:?})"
                    ))
                }
            },
        )
        .await;
        // The stages of a send on its leader count on the leader only.
        if index != leader {
            let after = stage_counts(node).await.unwrap();
            for stage in ["front_end", "commit", "total"] {
                assert_eq!(
                    after.get(stage),
                    before.get(stage),
                    "a follower records no {stage}"
                );
            }
        }
    }

    // The bench reads the same histograms from every node and breaks its sends down.
    let urls: Vec<String> = cluster.nodes.iter().map(NodeProcess::metrics_url).collect();
    let stdout = cli_ok(
        &cluster.endpoints()[0],
        &[
            "bench",
            "--partitions",
            "3",
            "--producers",
            "3",
            "--duration",
            "2s",
            "--metrics-url",
            &urls.join(","),
            "--breakdown",
            "--output",
            "json",
        ],
    )
    .await;
    let report: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("bench --output json prints one JSON object ({e}): {stdout}"));
    eprintln!("bench breakdown: {}", report["breakdown"]);
    let breakdown = &report["breakdown"];
    assert_eq!(breakdown["nodes_read"], 3, "{report}");
    let sends = report["sends"].as_u64().unwrap();
    assert!(sends > 0, "{report}");
    let stage = |name: &str| {
        breakdown["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == name)
            .unwrap_or_else(|| panic!("no {name} in {breakdown}"))
            .clone()
    };
    // Every acknowledged send counted once in each stage of a send on its leader.
    for name in [
        "front_end",
        "appender_wait",
        "commit",
        "apply",
        "reply",
        "total",
    ] {
        assert_eq!(stage(name)["count"], sends, "{name}: {breakdown}");
    }
    for name in [
        "leader_log_write",
        "replication",
        "follower_handle",
        "follower_write",
    ] {
        assert!(
            stage(name)["count"].as_u64().unwrap() > 0,
            "{name}: {breakdown}"
        );
    }
    let share = stage("total")["share_percent"].as_f64().unwrap();
    assert!(
        share > 0.0 && share <= 100.0,
        "the node's part of a send is within the client's: {breakdown}"
    );
}
