//! A three-node cluster of real processes: replicated partitions, routing from any node, and
//! a partition leader killed with SIGKILL while producers keep sending.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::StreamExt;
use tributary_client::{Client, ErrorReason, EventData, EventPosition, SendTarget};
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok, eventually, test_seed};

const PARTITIONS: u32 = 6;

async fn read_all(client: &Client, hub: &str, partition: &str, count: usize) -> Vec<String> {
    let mut stream = client
        .consumer()
        .receive(hub, "", partition, EventPosition::Earliest, 0)
        .await
        .unwrap();
    let mut bodies = Vec::new();
    while bodies.len() < count {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("events arrive")
            .expect("stream open")
            .unwrap();
        bodies.extend(
            batch
                .iter()
                .map(|e| String::from_utf8(e.body.to_vec()).unwrap()),
        );
    }
    bodies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_node_cluster_replicates_and_survives_a_killed_node() {
    let seed = test_seed("three_node_cluster");
    let dir = TestDir::new("three-node");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    let first = Client::connect(&endpoints[0]).await.unwrap();
    let hub = first
        .create_replicated_event_hub("orders", PARTITIONS, None, Some(3))
        .await
        .unwrap();
    assert_eq!(hub.replication_factor, 3);
    // Any node answers management calls and routes the SDK to partition leaders.
    let second = Client::connect(&endpoints[1]).await.unwrap();
    let third = Client::connect(&endpoints[2]).await.unwrap();
    assert_eq!(
        third.get_event_hub("orders").await.unwrap().partition_count,
        PARTITIONS
    );

    let mut acked: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for round in 0..5 {
        send_round(&second, round, &mut acked, seed).await;
    }

    // Every node holds a replica of every partition (RF 3 on 3 nodes) and the leaders add
    // up; nothing is under-replicated.
    let status = cluster_status(&endpoints[0]).await;
    assert_eq!(status["under_replicated"], 0, "{status}");
    let nodes = status["nodes"].as_array().unwrap();
    let leaders: u64 = nodes.iter().map(|n| n["leaders"].as_u64().unwrap()).sum();
    assert_eq!(leaders, u64::from(PARTITIONS), "{status}");
    for node in nodes {
        assert_eq!(node["replicas"], PARTITIONS, "{status}");
        assert_eq!(node["capacity_units"], 1, "{status}");
        assert!(node["node_id"].is_u64(), "{status}");
    }

    // Kill the controller leader (which also leads some partitions): every partition
    // and the controller keep a majority.
    let victim_id = first.cluster_status().await.unwrap().controller_leader;
    assert!(
        (1..=3).contains(&victim_id),
        "controller leader {victim_id}"
    );
    let victim = victim_id as usize - 1;
    cluster.nodes[victim].kill9().await;
    let survivor = Client::connect(&endpoints[(victim + 1) % 3]).await.unwrap();
    // A management call made at once, while the survivors still know the dead node as the
    // controller leader, waits out the election instead of failing.
    survivor
        .create_consumer_group("orders", "right-after-the-kill")
        .await
        .expect("a management call just after the controller leader died");
    for round in 5..10 {
        send_round(&survivor, round, &mut acked, seed).await;
    }
    // `cluster status` from a survivor shows the dead node and the new leaders.
    let status = cluster_status(&endpoints[(victim + 1) % 3]).await;
    let node = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == victim_id)
        .unwrap();
    assert_eq!(node["up"], false, "{status}");
    for partition in status["partitions"].as_array().unwrap() {
        assert_ne!(partition["leader"], victim_id, "{status}");
        assert!(partition["leader"].is_u64(), "{status}");
    }
    // Every partition had a replica on the dead node.
    assert_eq!(status["under_replicated"], PARTITIONS, "{status}");
    // Three replicas need three live nodes: a clear error, and the cluster keeps serving.
    let err = survivor
        .create_replicated_event_hub("too-wide", 2, None, Some(3))
        .await
        .unwrap_err();
    assert_eq!(err.reason(), Some(ErrorReason::InvalidArgument), "{err}");
    assert!(
        err.to_string().contains(&format!(
            "2 of the cluster's 3 nodes are up (down: nodes [{victim_id}])"
        )),
        "{err}"
    );
    // A hub created now is placed on the live nodes only.
    survivor
        .create_replicated_event_hub("narrow", 3, None, Some(2))
        .await
        .unwrap();
    let status = cluster_status(&endpoints[(victim + 1) % 3]).await;
    for partition in status["partitions"].as_array().unwrap() {
        if partition["event_hub"] == "narrow" {
            let replicas = partition["replicas"].as_array().unwrap();
            assert_eq!(replicas.len(), 2, "{status}");
            assert!(replicas.iter().all(|r| r["node"] != victim_id), "{status}");
        }
    }
    for (p, bodies) in &acked {
        assert_eq!(
            &read_all(&survivor, "orders", p, bodies.len()).await,
            bodies,
            "partition {p} lost or reordered acknowledged events (seed {seed})"
        );
    }

    // The killed node comes back and catches up; reading through it sees everything.
    cluster.nodes[victim].restart().await;
    let back = Client::connect(&endpoints[victim]).await.unwrap();
    for (p, bodies) in &acked {
        assert_eq!(&read_all(&back, "orders", p, bodies.len()).await, bodies);
    }
    // Every replica catches up again (the leaders' replication progress says so).
    eventually(
        Duration::from_secs(30),
        "every replica caught up",
        async || {
            let status = cluster_status(&endpoints[victim]).await;
            let all_caught_up = status["partitions"].as_array().unwrap().iter().all(|p| {
                p["replicas"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|r| r["up"] == true && r["caught_up"] == true)
            });
            if all_caught_up { Ok(()) } else { Err(status) }
        },
    )
    .await;
}

/// Sends one event to every partition, recording the acknowledged bodies per partition.
async fn send_round(
    client: &Client,
    round: usize,
    acked: &mut BTreeMap<String, Vec<String>>,
    seed: u64,
) {
    for p in 0..PARTITIONS {
        let body = format!("p{p}-r{round}");
        client
            .producer()
            .send(
                "orders",
                SendTarget::PartitionId(p.to_string()),
                [EventData::from_body(body.clone())],
            )
            .await
            .unwrap_or_else(|e| panic!("send {body} in round {round} (seed {seed}): {e}"));
        acked.entry(p.to_string()).or_default().push(body);
    }
}

async fn cluster_status(endpoint: &str) -> serde_json::Value {
    let text = cli_ok(endpoint, &["cluster", "status", "--output", "json"]).await;
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("bad status JSON {text:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_node_joins_and_a_foreign_node_is_refused() {
    let dir = TestDir::new("join");
    let cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();

    // A fresh node with --seeds joins the running cluster and gets replicas.
    let fourth = tributary_cluster_tests::NodeProcess::start_with_args(
        &dir.path().join("node-4"),
        &[
            "--node-id",
            "4",
            "--seeds",
            &cluster.seeds,
            "--capacity-units",
            "2",
            "--zone",
            "rack-b",
        ],
    )
    .await;
    let status = cluster_status(&endpoints[0]).await;
    let nodes = status["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 4, "{status}");
    assert!(nodes.iter().all(|n| n["up"] == true), "{status}");
    let fourth_status = nodes.iter().find(|n| n["node_id"] == 4).unwrap();
    assert_eq!(fourth_status["capacity_units"], 2, "{status}");
    assert_eq!(fourth_status["zone"], "rack-b", "{status}");
    let client = Client::connect(&fourth.endpoint()).await.unwrap();
    client
        .create_replicated_event_hub("joined", 4, None, Some(3))
        .await
        .unwrap();
    let status = cluster_status(&fourth.endpoint()).await;
    let on_fourth = status["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| {
            p["replicas"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["node"] == 4)
        })
        .count();
    assert!(on_fourth > 0, "the new node holds replicas: {status}");
    for p in 0..4 {
        client
            .producer()
            .send(
                "joined",
                SendTarget::PartitionId(p.to_string()),
                [EventData::from_body("x")],
            )
            .await
            .unwrap();
    }

    // A node of another cluster pointed at these seeds is refused with a clear error.
    let mut foreign = tributary_cluster_tests::tributary_command();
    foreign
        .arg("serve")
        .arg("--node-id")
        .arg("9")
        .arg("--cluster-id")
        .arg("someone-else")
        .arg("--data-dir")
        .arg(dir.path().join("foreign"))
        .arg("--client-addr")
        .arg(format!(
            "127.0.0.1:{}",
            tributary_cluster_tests::free_port()
        ))
        .arg("--http-addr")
        .arg(format!(
            "127.0.0.1:{}",
            tributary_cluster_tests::free_port()
        ))
        .arg("--seeds")
        .arg(&cluster.seeds)
        .env(
            tributary_cluster_tests::PEER_ADDR_ENV,
            format!("127.0.0.1:{}", tributary_cluster_tests::free_port()),
        );
    let output = tributary_cluster_tests::output_within(foreign, Duration::from_secs(30)).await;
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("belongs to cluster 'someone-else'"),
        "{stderr}"
    );
    // The cluster keeps serving.
    client
        .producer()
        .send("joined", SendTarget::Any, [EventData::from_body("still")])
        .await
        .unwrap();
}

/// A seed where no node answers is reported in the node's log (not silently retried), and
/// the node keeps trying.
#[tokio::test]
async fn an_unreachable_seed_is_reported() {
    let dir = TestDir::new("unreachable-seed");
    let nowhere = format!("127.0.0.1:{}", tributary_cluster_tests::free_port());
    let mut node = tributary_cluster_tests::NodeProcess::launch(
        &dir.path().join("node-1"),
        tributary_cluster_tests::NodePorts::free(),
        &[
            "--seeds".to_string(),
            nowhere.clone(),
            "--bootstrap-expect".to_string(),
            "2".to_string(),
        ],
    );
    let what = format!("a warning about the unreachable seed {nowhere}");
    eventually(Duration::from_secs(30), what, async || {
        let log = std::fs::read_to_string(node.log_path()).unwrap_or_default();
        if log.contains("seed does not answer") && log.contains(&nowhere) {
            Ok(())
        } else {
            Err(format!("the log:\n{log}"))
        }
    })
    .await;
    node.assert_running();
    node.kill9().await;
}
