//! `tributary serve` stops cleanly on SIGTERM at any point of its life: while it is still
//! starting (waiting for the rest of its cluster), and while calls it cannot finish are in
//! flight.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use tributary_client::{Client, EventData, SendTarget};
use tributary_cluster_tests::{
    LocalCluster, PEER_ADDR_ENV, TestDir, eventually, free_port, http_get, tributary_command,
};

/// How long the node may take to exit after the signal.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the node may take to reach the point where it waits for its cluster.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A node told to expect three founding members waits for the other two for ever; SIGTERM
/// (and SIGINT) then stop it with exit code 0 instead of killing it or going unheard.
/// Meanwhile it is alive (`/healthz`, so a liveness probe leaves it be) but not ready.
#[tokio::test]
async fn a_signal_while_waiting_for_the_cluster_stops_the_node_cleanly() {
    let dir = TestDir::new("signal_while_starting");
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let http_addr = std::net::SocketAddr::from(([127, 0, 0, 1], free_port()));
        let mut command = tributary_command();
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join(signal.as_str()))
            .arg("--client-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--http-addr")
            .arg(http_addr.to_string())
            .args(["--bootstrap-expect", "3"])
            .env(PEER_ADDR_ENV, format!("127.0.0.1:{}", free_port()))
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the node starts");
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let waiting = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await.expect("stderr is readable") {
                if line.contains("joining the cluster") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(
            waiting,
            Ok(true),
            "the node never logged that it is joining its cluster"
        );
        let health = http_get(http_addr, "/healthz").await.unwrap();
        assert_eq!(health.status, 200, "alive while joining: {health:?}");
        let ready = http_get(http_addr, "/readyz").await.unwrap();
        assert_eq!(ready.status, 503, "not ready before joining: {ready:?}");
        assert!(ready.body.contains("not joined"), "{ready:?}");
        let pid = Pid::from_raw(child.id().expect("running") as i32);
        kill(pid, signal).expect("the node can be signalled");
        // Keep draining stderr so the node never blocks on a full pipe.
        let drain = tokio::spawn(async move {
            let mut rest = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                rest.push(line);
            }
            rest
        });
        let status = tokio::time::timeout(EXIT_TIMEOUT, child.wait())
            .await
            .unwrap_or_else(|_| panic!("the node still ran {EXIT_TIMEOUT:?} after {signal}"))
            .expect("the node can be waited for");
        let rest = drain.await.expect("the drain task ends");
        assert_eq!(
            status.code(),
            Some(0),
            "{signal} while starting: {status}; its last lines: {rest:#?}"
        );
        assert!(
            rest.iter()
                .any(|line| line.contains("received while starting")),
            "the node says why it stopped: {rest:#?}"
        );
    }
}

/// A send that waits for a commit that cannot come (both followers of its partition are
/// frozen) does not hold up shutdown: SIGTERM stops the leader within a supervisor's usual
/// grace period (`terminate` allows 30 s, as Kubernetes does), with exit code 0.
#[tokio::test]
async fn a_send_stuck_without_a_quorum_does_not_hold_up_shutdown() {
    let dir = TestDir::new("signal_stuck_send");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let client = Client::connect(&cluster.endpoints()[0]).await.unwrap();
    client
        .create_replicated_event_hub("stuck", 1, None, Some(3))
        .await
        .unwrap();
    let leader = cluster.partition_leader("stuck", "0").await;
    let leader_client = Client::connect(&cluster.nodes[leader].endpoint())
        .await
        .unwrap();
    // The new partition has settled: its leader has committed a send with every replica up.
    leader_client
        .producer()
        .send(
            "stuck",
            SendTarget::PartitionId("0".into()),
            [EventData::from_body("committed")],
        )
        .await
        .unwrap();
    for (i, node) in cluster.nodes.iter_mut().enumerate() {
        if i != leader {
            node.pause();
        }
    }
    let send = tokio::spawn(async move {
        leader_client
            .producer()
            .send(
                "stuck",
                SendTarget::PartitionId("0".into()),
                [EventData::from_body("never committed")],
            )
            .await
    });
    let metrics = cluster.nodes[leader].http_addr();
    // Or else the send never reached the leader.
    eventually(
        START_TIMEOUT,
        "the send in flight at the leader",
        async || {
            let response = http_get(metrics, "/metrics")
                .await
                .map_err(|e| e.to_string())?;
            match response
                .body
                .lines()
                .find(|l| l.starts_with("tributary_sends_in_flight "))
            {
                Some(line) if !line.ends_with(" 0") => Ok(()),
                line => Err(format!("{line:?}")),
            }
        },
    )
    .await;
    assert!(!send.is_finished(), "a send without a quorum was answered");
    let status = cluster.nodes[leader].terminate().await;
    assert_eq!(status.code(), Some(0), "{status}");
    send.abort();
}
