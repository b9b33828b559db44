//! The README's three-node cluster script starts a working cluster.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tributary_client::{Client, EventData, EventPosition, SendTarget};
use tributary_cluster_tests::{TestDir, binary_path, free_port, workspace_dir};

/// A base port whose nine ports (three per node) are all free right now, and the three
/// after it (the nodes' AMQP ports, `AMQP_BASE_PORT` = base + 3), and the three after those
/// (their Blob ports, `BLOB_BASE_PORT` = base + 6), and each node's Kafka port (base +
/// 10 (N - 1) + 9, `KAFKA_BASE_PORT` = base + 9).
fn free_base_port() -> u16 {
    loop {
        let base = free_port();
        if base > 60_000 {
            continue;
        }
        let all_free = (0..3).all(|n| {
            let ports: Vec<u16> = if n == 0 {
                (0..10).collect()
            } else {
                vec![0, 1, 2, 9]
            };
            ports
                .into_iter()
                .all(|k| std::net::TcpListener::bind(("127.0.0.1", base + 10 * n + k)).is_ok())
        });
        if all_free {
            return base;
        }
    }
}

/// Starts `scripts/cluster-local` on free ports with its data in `dir`: the script and its
/// base port once it says the cluster is ready, or `Err` with the script's output when a
/// node exited because one of its ports was taken (another test bound it between
/// [`free_base_port`]'s check and the node's bind; the caller tries other ports).
async fn start_script(dir: &std::path::Path) -> Result<(tokio::process::Child, u16), String> {
    let base = free_base_port();
    let mut script = tokio::process::Command::new("bash")
        .arg(workspace_dir().join("scripts/cluster-local"))
        .env("TRIBUTARY_BIN", binary_path())
        .env("CLUSTER_DIR", dir)
        .env("BASE_PORT", base.to_string())
        .env("AMQP_BASE_PORT", (base + 3).to_string())
        .env("BLOB_BASE_PORT", (base + 6).to_string())
        // Node N's Kafka port is base + 10 (N - 1) + 9: beside its client, peer and HTTP
        // ports (base + 10 (N - 1) + 0..2), never on the AMQP and Blob ones.
        .env("KAFKA_BASE_PORT", (base + 9).to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(script.stdout.take().unwrap()).lines();
    let ready = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            println!("script: {line}");
            if line.starts_with("cluster ready") {
                return true;
            }
        }
        false
    })
    .await
    .expect("the cluster gets ready, or the script ends saying why not");
    if ready {
        // What the script says later (as it stops) is read on, or its writes would fail.
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                println!("script: {line}");
            }
        });
        return Ok((script, base));
    }
    let mut errors = String::new();
    script
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut errors)
        .await
        .unwrap();
    assert!(
        errors.contains("Address already in use"),
        "the script ended before the cluster was ready: {errors}"
    );
    Err(errors)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_local_script_starts_three_nodes() {
    let dir = TestDir::new("cluster-script");
    let mut attempts = 0;
    let (mut script, base) = loop {
        attempts += 1;
        match start_script(&dir.path().join(format!("attempt-{attempts}"))).await {
            Ok(started) => break started,
            Err(errors) if attempts < 3 => println!("a port was taken; again: {errors}"),
            Err(errors) => panic!("three starts found a port taken: {errors}"),
        }
    };

    let client = Client::connect(&format!("http://127.0.0.1:{base}"))
        .await
        .unwrap();
    let hub = client
        .create_replicated_event_hub("orders", 3, None, Some(3))
        .await
        .unwrap();
    assert_eq!(hub.replication_factor, 3);
    let other = Client::connect(&format!("http://127.0.0.1:{}", base + 20))
        .await
        .unwrap();
    other
        .producer()
        .send(
            "orders",
            SendTarget::PartitionId("2".into()),
            [EventData::from_body("hello")],
        )
        .await
        .unwrap();
    let mut stream = client
        .consumer()
        .receive("orders", "", "2", EventPosition::Earliest, 0)
        .await
        .unwrap();
    use futures::StreamExt;
    let batch = stream.next().await.unwrap().unwrap();
    assert_eq!(batch[0].body.as_ref(), b"hello");

    // SIGTERM (like Ctrl-C, which a shell started in the background may ignore) stops
    // every node.
    kill(Pid::from_raw(script.id().unwrap() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(30), script.wait())
        .await
        .expect("the script stops its nodes and exits")
        .unwrap();
    assert!(status.code().is_some(), "{status}");
    for n in 0..3 {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", base + 10 * n)).is_ok(),
            "node {n} still listens after the script stopped"
        );
    }
}
