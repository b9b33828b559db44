//! `deploy/compose/docker-compose.yml`: one command brings up a working three-node cluster
//! (all three nodes up, each node's AMQP listener, Blob checkpoint endpoint and Kafka
//! listener answering on its published ports, every node listing the three Kafka brokers
//! at their published ports, a hub replicated on every node, events sent and read back
//! through node 1's published port). The nodes' peer ports are on the compose network, so they
//! start only with the cluster key the file's one-shot service makes: three nodes up means
//! they hold it and admit each other.
//!
//! Needs the `tributary:test` image (`scripts/docker-image`; `TRIBUTARY_IMAGE` names
//! another), so it runs from
//! `scripts/compose-check`, which sets `TRIBUTARY_COMPOSE_CHECK=1` (then a missing Docker
//! engine, compose tool or image fails the test). Without that variable it says so and
//! passes at once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use tributary_client::{Client, EventData, EventPosition, SendTarget};
use tributary_cluster_tests::containers::{IMAGE_DEFAULT, image_exists};
use tributary_cluster_tests::{
    REQUIRED_VALUE, amqp_answers, blob_answers, eventually, free_port, is_required, kafka_answers,
    kafka_brokers, poll_until, require_tool, test_seed,
};

/// Set to `1` by scripts/compose-check, which provides what this test needs.
const COMPOSE_CHECK_ENV: &str = "TRIBUTARY_COMPOSE_CHECK";
const PARTITIONS: u32 = 3;
const CLUSTER_UP_TIMEOUT: Duration = Duration::from_secs(180);
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// `docker compose` (the plugin) or `docker-compose`, whichever answers.
fn compose_tool() -> Option<Vec<&'static str>> {
    [vec!["docker", "compose"], vec!["docker-compose"]]
        .into_iter()
        .find(|tool| {
            Command::new(tool[0])
                .args(&tool[1..])
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// A compose project: `down -v` when dropped, so a failed test leaves nothing behind.
struct Project {
    tool: Vec<&'static str>,
    file: PathBuf,
    name: String,
    env: Vec<(&'static str, String)>,
}

impl Project {
    fn run(&self, args: &[&str]) -> std::process::Output {
        Command::new(self.tool[0])
            .args(&self.tool[1..])
            .args(["-f", &self.file.display().to_string(), "-p", &self.name])
            .args(args)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", self.tool.join(" ")))
    }

    fn logs(&self) -> String {
        let output = self.run(&["logs", "--no-color", "--tail", "40"]);
        String::from_utf8_lossy(&output.stdout).into_owned()
    }
}

impl Drop for Project {
    fn drop(&mut self) {
        let output = self.run(&["down", "-v", "--timeout", "10"]);
        if !output.status.success() {
            eprintln!(
                "compose down of {} failed: {}",
                self.name,
                String::from_utf8_lossy(&output.stderr)
            );
        }
    }
}

fn compose_file() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/compose/docker-compose.yml")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_file_brings_up_a_working_three_node_cluster() {
    // Only scripts/compose-check runs this test; with its variable set, whatever the test
    // needs must be there.
    let compose_check = &format!("{COMPOSE_CHECK_ENV}={REQUIRED_VALUE}");
    let how_to_run = &format!(
        "scripts/compose-check builds the {IMAGE_DEFAULT} image and runs this test with it"
    );
    let opted_in = is_required(COMPOSE_CHECK_ENV).then_some(());
    if require_tool(compose_check, opted_in, how_to_run, COMPOSE_CHECK_ENV).is_none() {
        return;
    }
    let Some(tool) = require_tool(
        "a compose tool (`docker compose` or `docker-compose`) that answers",
        compose_tool(),
        "install Docker with its compose plugin",
        COMPOSE_CHECK_ENV,
    ) else {
        return;
    };
    let image = std::env::var("TRIBUTARY_IMAGE").unwrap_or_else(|_| IMAGE_DEFAULT.to_owned());
    let Some(()) = require_tool(
        &format!("the image {image}"),
        image_exists(&image).await.then_some(()),
        "build it with scripts/docker-image",
        COMPOSE_CHECK_ENV,
    ) else {
        return;
    };
    let seed = test_seed("compose");
    // A subnet and host ports of this run's own, so a developer's cluster can keep running.
    let subnet = format!("172.30.{}", 1 + seed % 250);
    let port = free_port();
    let amqp_ports = [free_port(), free_port(), free_port()];
    let blob_ports = [free_port(), free_port(), free_port()];
    let kafka_ports = [free_port(), free_port(), free_port()];
    let project = Project {
        tool,
        file: compose_file(),
        name: format!("tributary-compose-{}", seed % 1_000_000),
        env: vec![
            ("TRIBUTARY_IMAGE", image),
            ("TRIBUTARY_COMPOSE_SUBNET", subnet),
            ("TRIBUTARY_NODE1_PORT", port.to_string()),
            ("TRIBUTARY_NODE2_PORT", free_port().to_string()),
            ("TRIBUTARY_NODE3_PORT", free_port().to_string()),
            ("TRIBUTARY_NODE1_AMQP_PORT", amqp_ports[0].to_string()),
            ("TRIBUTARY_NODE2_AMQP_PORT", amqp_ports[1].to_string()),
            ("TRIBUTARY_NODE3_AMQP_PORT", amqp_ports[2].to_string()),
            ("TRIBUTARY_NODE1_BLOB_PORT", blob_ports[0].to_string()),
            ("TRIBUTARY_NODE2_BLOB_PORT", blob_ports[1].to_string()),
            ("TRIBUTARY_NODE3_BLOB_PORT", blob_ports[2].to_string()),
            ("TRIBUTARY_NODE1_KAFKA_PORT", kafka_ports[0].to_string()),
            ("TRIBUTARY_NODE2_KAFKA_PORT", kafka_ports[1].to_string()),
            ("TRIBUTARY_NODE3_KAFKA_PORT", kafka_ports[2].to_string()),
        ],
    };
    let up = project.run(&["up", "-d"]);
    assert!(
        up.status.success(),
        "compose up failed: {}",
        String::from_utf8_lossy(&up.stderr)
    );

    let endpoint = format!("http://127.0.0.1:{port}");
    let started = Instant::now();
    let up = poll_until(CLUSTER_UP_TIMEOUT, async || {
        let client = Client::connect(&endpoint)
            .await
            .map_err(|err| err.to_string())?;
        match client.cluster_status().await {
            Ok(status) if status.controller_leader != 0 => {
                match status.nodes.iter().filter(|n| n.up).count() {
                    3 => Ok(client),
                    up => Err(format!("{up} nodes up")),
                }
            }
            Ok(_) => Err("no controller leader yet".to_owned()),
            Err(err) => Err(err.to_string()),
        }
    })
    .await;
    let client = up.unwrap_or_else(|timed_out| {
        panic!("three nodes up: {timed_out}; logs:\n{}", project.logs())
    });
    println!("three nodes up after {:?}", started.elapsed());

    // Each node's AMQP listener, on its published port.
    for (node, amqp_port) in (1..).zip(amqp_ports) {
        let addr = SocketAddr::from(([127, 0, 0, 1], amqp_port));
        let what = format!("node {node}'s AMQP listener answering on {addr}");
        eventually(CLUSTER_UP_TIMEOUT, &what, async || {
            amqp_answers(addr, None).await
        })
        .await;
    }
    // Each node's Blob checkpoint endpoint, on its published port: authorization is off,
    // so the probe's unsigned call is answered.
    for (node, blob_port) in (1..).zip(blob_ports) {
        let addr = SocketAddr::from(([127, 0, 0, 1], blob_port));
        let what = format!("node {node}'s Blob checkpoint endpoint answering on {addr}");
        eventually(CLUSTER_UP_TIMEOUT, &what, async || {
            blob_answers(addr, None, false).await
        })
        .await;
    }
    // Each node's Kafka listener, on its published port; and what every node tells Kafka
    // clients: the three nodes as brokers at their published ports, which this machine
    // reaches (authorization is off, so Metadata needs no SASL login).
    let advertised: Vec<(i32, String)> = (1..)
        .zip(kafka_ports)
        .map(|(node, port)| (node, format!("127.0.0.1:{port}")))
        .collect();
    for (node, kafka_port) in (1..).zip(kafka_ports) {
        let addr = SocketAddr::from(([127, 0, 0, 1], kafka_port));
        let what = format!("node {node}'s Kafka listener answering on {addr}");
        eventually(CLUSTER_UP_TIMEOUT, &what, async || {
            kafka_answers(addr, None).await
        })
        .await;
        let what = format!("node {node} listing the three Kafka brokers at their published ports");
        eventually(CLUSTER_UP_TIMEOUT, &what, async || {
            let mut brokers: Vec<(i32, String)> = kafka_brokers(addr, None)
                .await?
                .iter()
                .map(|broker| (broker.node_id, broker.addr()))
                .collect();
            brokers.sort();
            if brokers == advertised {
                Ok(())
            } else {
                Err(format!("Metadata lists {brokers:?}, not {advertised:?}"))
            }
        })
        .await;
    }

    client
        .create_replicated_event_hub("compose", PARTITIONS, None, Some(3))
        .await
        .unwrap_or_else(|e| panic!("create a hub with 3 replicas: {e}"));
    for p in 0..PARTITIONS {
        client
            .producer()
            .send(
                "compose",
                SendTarget::PartitionId(p.to_string()),
                [EventData::from_body(format!("event {p}"))],
            )
            .await
            .unwrap_or_else(|e| panic!("send to partition {p}: {e}\n{}", project.logs()));
    }
    for p in 0..PARTITIONS {
        let mut stream = client
            .consumer()
            .receive("compose", "", &p.to_string(), EventPosition::Earliest, 0)
            .await
            .unwrap_or_else(|e| panic!("read partition {p}: {e}"));
        let batch = tokio::time::timeout(READ_TIMEOUT, stream.next())
            .await
            .unwrap_or_else(|_| panic!("no event from partition {p} in {READ_TIMEOUT:?}"))
            .expect("stream open")
            .unwrap_or_else(|e| panic!("read partition {p}: {e}"));
        let bodies: Vec<String> = batch
            .iter()
            .map(|e| String::from_utf8_lossy(&e.body).into_owned())
            .collect();
        assert_eq!(bodies, [format!("event {p}")], "partition {p}");
    }
}
