//! Leadership: a new hub's leaders spread evenly (each partition's preferred replica leads);
//! `node drain` moves every leader off a node with no failed send from a retrying
//! producer; `node undrain` lets them return. Draining an unknown node is a clear error.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tributary_client::{Client, EventData, SendTarget};
use tributary_cluster_tests::{LocalCluster, TestDir, cli, cli_ok, describe_output, eventually};

const PARTITIONS: u32 = 12;
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

/// Leaders per node id, as the cluster status reports them.
async fn leaders(client: &Client) -> Vec<(u64, u32)> {
    let status = client.cluster_status().await.unwrap();
    status.nodes.iter().map(|n| (n.id, n.leaders)).collect()
}

/// Waits until `done` holds for the leader counts; returns how long it took.
async fn await_leaders(
    client: &Client,
    what: &str,
    done: impl Fn(&[(u64, u32)]) -> bool,
) -> Duration {
    let started = Instant::now();
    let counts = eventually(SETTLE_TIMEOUT, what, async || {
        let counts = leaders(client).await;
        if done(&counts) {
            Ok(counts)
        } else {
            Err(format!("leaders per node {counts:?}"))
        }
    })
    .await;
    println!("{what} after {:?}: {counts:?}", started.elapsed());
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drain_moves_every_leader_away_without_failed_sends_and_undrain_brings_them_back() {
    let dir = TestDir::new("drain");
    let cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    let client = Client::connect(&endpoints[1]).await.unwrap();
    client
        .create_replicated_event_hub("drained", PARTITIONS, None, Some(3))
        .await
        .unwrap();
    let even = |counts: &[(u64, u32)]| counts.iter().all(|(_, l)| *l == PARTITIONS / 3);
    await_leaders(&client, "leaders spread evenly", even).await;

    // A producer with the SDK's retries sends to every partition in turn throughout.
    let stop = Arc::new(AtomicBool::new(false));
    let (sent, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let producer = tokio::spawn({
        let (stop, sent, failed) = (stop.clone(), sent.clone(), failed.clone());
        let producer = client.producer();
        async move {
            let mut i = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let partition = (i % PARTITIONS).to_string();
                match producer
                    .send(
                        "drained",
                        SendTarget::PartitionId(partition),
                        [EventData::from_body(format!("e{i}"))],
                    )
                    .await
                {
                    Ok(_) => sent.fetch_add(1, Ordering::Relaxed),
                    Err(err) => {
                        eprintln!("send {i} failed: {err}");
                        failed.fetch_add(1, Ordering::Relaxed)
                    }
                };
                i += 1;
            }
        }
    });

    let await_sends = |at_least: u64| {
        let sent = sent.clone();
        async move {
            let what = format!("{at_least} sends (the producer is stuck otherwise)");
            eventually(SETTLE_TIMEOUT, what, async || {
                match sent.load(Ordering::Relaxed) {
                    done if done >= at_least => Ok(()),
                    done => Err(format!("{done} sends")),
                }
            })
            .await;
        }
    };
    await_sends(20).await;
    cli_ok(&endpoints[0], &["node", "drain", "1"]).await;
    // Every node's status shows it drained (each node's view follows the controller).
    eventually(
        SETTLE_TIMEOUT,
        "node 1 draining in the status",
        async || {
            let status = client.cluster_status().await.unwrap();
            if status.nodes.iter().any(|n| n.id == 1 && n.draining) {
                Ok(())
            } else {
                Err(format!("{status:?}"))
            }
        },
    )
    .await;
    let took = await_leaders(&client, "node 1 drained", |counts| {
        counts.iter().any(|(id, l)| *id == 1 && *l == 0)
    })
    .await;
    println!("drain moved every leader off node 1 in {took:?}");

    cli_ok(&endpoints[2], &["node", "undrain", "1"]).await;
    await_leaders(&client, "leaders back on node 1", even).await;

    // Sends keep flowing after the leaders returned.
    await_sends(sent.load(Ordering::Relaxed) + 20).await;
    stop.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    let (sent, failed) = (sent.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    println!("{sent} sends acknowledged, {failed} failed");
    assert!(sent > 0);
    assert_eq!(
        failed, 0,
        "a retrying producer saw failed sends during the drain"
    );

    // An unknown node: a clear error, and the cluster keeps serving.
    let output = cli(&endpoints[0], &["node", "drain", "9"]).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("node 9 is not part of this cluster"),
        "{stderr}"
    );
    client
        .producer()
        .send("drained", SendTarget::Any, [EventData::from_body("still")])
        .await
        .unwrap();
}

/// `tributary drain` (the preStop hook's drain) on a node an operator had drained with
/// `node drain`: it reports that the drain does not end at the restart, and after the
/// restart the node is still drained. The HTTP port refuses a bad timeout with a message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_drain_outlasts_a_restart_drain() {
    let dir = TestDir::new("drain-operator");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    let client = Client::connect(&endpoints[0]).await.unwrap();
    client
        .create_replicated_event_hub("held", 3, None, Some(3))
        .await
        .unwrap();
    cli_ok(&endpoints[0], &["node", "drain", "2"]).await;
    await_leaders(&client, "node 2 drained", |counts| {
        counts.iter().any(|(id, l)| *id == 2 && *l == 0)
    })
    .await;

    let http_addr = cluster.nodes[1].http_addr().to_string();
    let refused = cli(
        &endpoints[1],
        &["drain", "--http-addr", &http_addr, "--timeout", "soon"],
    )
    .await;
    assert!(!refused.status.success(), "{}", describe_output(&refused));
    let bad =
        tributary_cluster_tests::http_post(cluster.nodes[1].http_addr(), "/drain?timeout=soon")
            .await
            .unwrap();
    assert_eq!(bad.status, 400, "{bad:?}");
    assert!(bad.body.contains("such as 30s"), "{bad:?}");

    let report = cli_ok(
        &endpoints[1],
        &["drain", "--http-addr", &http_addr, "--output", "json"],
    )
    .await;
    let report: serde_json::Value = serde_json::from_str(report.trim()).unwrap();
    assert_eq!(report["drained"], true, "{report}");
    assert_eq!(report["ends_at_restart"], false, "{report}");
    let text = cli_ok(&endpoints[1], &["drain", "--http-addr", &http_addr]).await;
    assert!(
        text.contains("stays drained until `tributary node undrain`"),
        "{text}"
    );
    assert!(
        !cluster.nodes[1]
            .data_dir()
            .join("drained-for-restart")
            .exists(),
        "no marker for an operator's drain"
    );

    let exit = cluster.nodes[1].terminate().await;
    assert!(exit.success(), "{exit}");
    cluster.nodes[1].restart().await;
    let status = Client::connect(&endpoints[1])
        .await
        .unwrap()
        .cluster_status()
        .await
        .unwrap();
    let node = status.nodes.iter().find(|n| n.id == 2).unwrap();
    assert!(node.up && node.draining, "still drained: {node:?}");
    assert_eq!(node.leaders, 0, "{node:?}");
}
