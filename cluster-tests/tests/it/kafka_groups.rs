//! A Kafka consumer group of confluent-kafka consumers (librdkafka 2.16, from
//! `scripts/python-test-deps`) against a three-node cluster, with the classic protocol: two
//! members share the partitions and read every record exactly once between them, commit,
//! and when one leaves the other takes every partition and reads on from its commits; a
//! member started later resumes from the committed offsets, which the cluster replicates
//! and `tributary group show --kafka` shows.
//!
//! The coordinator is the node leading the controller group; clients bootstrap from another
//! node and find it with FindCoordinator.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tributary_client::{Client, ConnectOptions, EventData, SendTarget};
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok, eventually};

const SCRIPT: &str = include_str!("kafka_groups.py");
const ROOT_RULE: &str = "RootManageSharedAccessKey";
const ROOT_KEY: &str = "a2Fma2EtZ3JvdXBzLXRlc3Qtcm9vdC1rZXktMDAwMQ==";
const HUB: &str = "orders";
const GROUP: &str = "billing";
const PARTITIONS: u32 = 4;
/// Records per partition in each round.
const COUNT: i64 = 25;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(240);

fn connection_string() -> String {
    format!("Endpoint=sb://127.0.0.1/;SharedAccessKeyName={ROOT_RULE};SharedAccessKey={ROOT_KEY}")
}

async fn run_python(venv: &Path, settings: Json) -> Json {
    let output = tokio::time::timeout(
        CLIENT_TIMEOUT,
        tokio::process::Command::new(venv.join("bin/python"))
            .args(["-c", SCRIPT, &settings.to_string()])
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the confluent-kafka script finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary = stdout
        .lines()
        .chain(stderr.lines())
        .find_map(|line| {
            serde_json::from_str::<Json>(line)
                .ok()?
                .get("summary")
                .cloned()
        })
        .unwrap_or_else(|| {
            panic!(
                "the confluent-kafka script printed no summary; stdout {stdout}; stderr {stderr}"
            )
        });
    assert_eq!(summary["timeout"], Json::Null, "{summary}; stderr {stderr}");
    summary
}

/// The clients' errors, but for a busy node's THROTTLING_QUOTA_EXCEEDED, which librdkafka
/// reports and then retries (a loaded machine makes a node busy now and then).
fn lasting_errors(summary: &Json) -> Vec<Json> {
    summary["errors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["code"] != json!("THROTTLING_QUOTA_EXCEEDED") || e["fatal"] == json!(true))
        .cloned()
        .collect()
}

/// (partition, offset) of records as the script lists them (`[partition, offset, value]`).
fn records(list: &Json) -> Vec<(i64, i64, String)> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap(),
                r[1].as_i64().unwrap(),
                r[2].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Each (partition, offset) once, and exactly those of `round` (records `first..first+COUNT`
/// of every partition, at those offsets).
fn assert_exactly(read: &[(i64, i64, String)], first: i64, what: &str) {
    let seen: BTreeSet<(i64, i64)> = read.iter().map(|(p, o, _)| (*p, *o)).collect();
    assert_eq!(
        seen.len(),
        read.len(),
        "{what}: a record read twice: {read:?}"
    );
    let expected: BTreeSet<(i64, i64)> = (0..i64::from(PARTITIONS))
        .flat_map(|p| (first..first + COUNT).map(move |o| (p, o)))
        .collect();
    assert_eq!(seen, expected, "{what}");
    for (p, o, value) in read {
        assert_eq!(value, &format!("p{p}-{o}"), "{what}");
    }
}

async fn shown_offsets(endpoint: &str) -> Vec<Json> {
    let shown: Json = serde_json::from_str(
        &cli_ok(
            endpoint,
            &[
                "--connection-string",
                &connection_string(),
                "--output",
                "json",
                "group",
                "show",
                HUB,
                GROUP,
                "--kafka",
            ],
        )
        .await,
    )
    .unwrap();
    assert_eq!(shown["kafka_group"], json!(GROUP), "{shown}");
    shown["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["committed_offset"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_confluent_kafka_group_shares_rebalances_and_resumes_from_its_commits() {
    let Some(venv) = python_deps() else {
        return;
    };
    let dir = TestDir::new("kafka-groups");
    let cluster = LocalCluster::start_with_args(
        dir.path(),
        3,
        &["--auth".to_owned(), "sas".to_owned()],
        &[("TRIBUTARY_ROOT_KEY", ROOT_KEY)],
    )
    .await;
    let root = Client::from_connection_string_with(
        &connection_string(),
        ConnectOptions {
            endpoint: Some(cluster.nodes[0].endpoint()),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    eventually(
        Duration::from_secs(60),
        "the root rule in force",
        async || {
            root.create_event_hub(HUB, PARTITIONS, None)
                .await
                .map_err(|e| e.to_string())
        },
    )
    .await;
    let leader = eventually(
        Duration::from_secs(30),
        "a controller leader",
        async || match root.cluster_status().await {
            Ok(status) if status.controller_leader != 0 => Ok(status.controller_leader),
            Ok(_) => Err("none yet".to_owned()),
            Err(e) => Err(e.to_string()),
        },
    )
    .await;
    // Clients bootstrap from a node that does not coordinate the groups.
    let bootstrap = &cluster.nodes[usize::try_from(leader).unwrap() % 3];
    let settings = |scenario: &str| {
        json!({
            "scenario": scenario,
            "kafka_port": bootstrap.kafka_addr().port(),
            "connection_string": connection_string(),
            "topic": HUB,
            "partitions": PARTITIONS,
            "group": GROUP,
            "count": COUNT,
        })
    };

    // Two members: each partition goes to one of them, and every record is read once.
    let summary = run_python(&venv, settings("pair")).await;
    assert_eq!(lasting_errors(&summary), Vec::<Json>::new(), "{summary}");
    let assignment = &summary["first_assignment"];
    let of = |name: &str| -> BTreeSet<i64> {
        assignment[name]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_i64().unwrap())
            .collect()
    };
    let (a_partitions, b_partitions) = (of("a"), of("b"));
    assert!(
        !a_partitions.is_empty() && !b_partitions.is_empty(),
        "{summary}"
    );
    assert!(a_partitions.is_disjoint(&b_partitions), "{summary}");
    let first_a = records(&summary["first_a"]);
    let first_b = records(&summary["first_b"]);
    assert!(
        first_a.iter().all(|(p, _, _)| a_partitions.contains(p)),
        "{summary}"
    );
    assert!(
        first_b.iter().all(|(p, _, _)| b_partitions.contains(p)),
        "{summary}"
    );
    let both: Vec<_> = first_a.iter().chain(&first_b).cloned().collect();
    assert_exactly(&both, 0, "the two members' first reads");
    // One left: the other read on from the commits, its partitions and the leaver's.
    assert_exactly(
        &records(&summary["after_leave"]),
        COUNT,
        "the survivor's reads after the leave",
    );
    let committed: Vec<i64> = (0..PARTITIONS)
        .map(|p| summary["committed"][p.to_string()].as_i64().unwrap())
        .collect();
    assert_eq!(committed, vec![2 * COUNT; PARTITIONS as usize], "{summary}");

    // The offsets are the cluster's: shown through a node that does not coordinate.
    assert_eq!(
        shown_offsets(&bootstrap.endpoint()).await,
        vec![json!(2 * COUNT); PARTITIONS as usize]
    );

    // More events, sent through the gRPC API; a member started later reads exactly those.
    for p in 0..PARTITIONS {
        let events: Vec<EventData> = (2 * COUNT..3 * COUNT)
            .map(|i| EventData::from_body(format!("p{p}-{i}")))
            .collect();
        root.producer()
            .send(HUB, SendTarget::PartitionId(p.to_string()), events)
            .await
            .unwrap();
    }
    let summary = run_python(&venv, settings("restart")).await;
    assert_eq!(lasting_errors(&summary), Vec::<Json>::new(), "{summary}");
    assert_exactly(
        &records(&summary["read"]),
        2 * COUNT,
        "the restarted member's reads",
    );
    assert_eq!(
        shown_offsets(&cluster.nodes[0].endpoint()).await,
        vec![json!(3 * COUNT); PARTITIONS as usize]
    );
}
