//! One Kafka consumer group against a three-node cluster, with the classic protocol, used in
//! turn by the three Kafka clients `scripts/python-test-deps` installs, unchanged:
//! - confluent-kafka (librdkafka 2.16): an idempotent producer with acks=all stores 100,000
//!   keyed records; two members share the partitions and read each record exactly once
//!   between them, and commit; when one leaves, the other takes every partition and reads
//!   on from its commits.
//! - The whole cluster restarts. kafka-python 3 with its defaults (an idempotent producer,
//!   a consumer committing automatically) then aiokafka with its defaults each produce keyed
//!   records, and their consumers, joining the group, resume from the committed offsets:
//!   each reads exactly the records stored since, once.
//!
//! The offsets are the cluster's, replicated in its controller group: `tributary group show
//! --kafka` shows them through any node. The coordinator is the node leading the controller
//! group; clients bootstrap from the other nodes and find it with FindCoordinator.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use serde_json::{Value as Json, json};
use tributary_client::{Client, ConnectOptions};
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok, eventually};

const SCRIPT: &str = include_str!("kafka_groups.py");
const ROOT_RULE: &str = "RootManageSharedAccessKey";
const ROOT_KEY: &str = "a2Fma2EtZ3JvdXBzLXRlc3Qtcm9vdC1rZXktMDAwMQ==";
const HUB: &str = "orders";
const GROUP: &str = "billing";
const PARTITIONS: u32 = 4;
/// Keyed records the idempotent confluent-kafka producer stores first.
const COUNT: usize = 100_000;
/// Records of each later phase.
const LATER_COUNT: usize = 1_000;
/// Distinct keys: records `i` and `i + KEYS` share one.
const KEYS: usize = 500;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(300);

/// A record as the script lists it: (partition, offset, key, value).
type Record = (i64, i64, String, String);

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
    .expect("the Kafka client script finishes")
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let summary = stdout
        .lines()
        .find_map(|line| {
            serde_json::from_str::<Json>(line)
                .ok()?
                .get("summary")
                .cloned()
        })
        .unwrap_or_else(|| {
            panic!("the Kafka client script printed no summary; stdout {stdout}; stderr {stderr}")
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

fn records(list: &Json) -> Vec<Record> {
    list.as_array()
        .unwrap_or_else(|| panic!("a list of records: {list}"))
        .iter()
        .map(|r| {
            (
                r[0].as_i64().unwrap(),
                r[1].as_i64().unwrap(),
                r[2].as_str().unwrap().to_owned(),
                r[3].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// The records of one phase as its producer was told they were stored: `count` of them,
/// values `<phase>-<i>` keyed `key-<i mod KEYS>`, each at its own offset, and the records of
/// one key in the order sent (one partition, rising offsets).
fn delivered(list: &Json, phase: &str, first: usize, count: usize) -> Vec<Record> {
    let mut records = records(list);
    assert_eq!(records.len(), count, "{phase}: every record delivered");
    records.sort_by_key(|r| index(&r.3));
    for (n, (_, _, key, value)) in records.iter().enumerate() {
        let i = first + n;
        assert_eq!(
            (key.as_str(), value.as_str()),
            (
                format!("key-{}", i % KEYS).as_str(),
                format!("{phase}-{i}").as_str()
            )
        );
    }
    let mut last_of_key: BTreeMap<&str, (i64, i64)> = BTreeMap::new();
    for (partition, offset, key, value) in &records {
        if let Some((p, o)) = last_of_key.insert(key, (*partition, *offset)) {
            assert!(
                p == *partition && o < *offset,
                "{phase}: {value} of {key} at {partition}/{offset}, after {p}/{o}"
            );
        }
    }
    let places: BTreeSet<(i64, i64)> = records.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(
        places.len(),
        records.len(),
        "{phase}: two records at one offset"
    );
    records
}

fn index(value: &str) -> usize {
    value.rsplit('-').next().unwrap().parse().unwrap()
}

/// `read` holds exactly the `expected` records, each once, and each partition's in offset
/// order.
fn assert_read_exactly(read: &[Record], expected: &[Record], what: &str) {
    let mut sorted = read.to_vec();
    sorted.sort();
    let duplicates: Vec<&Record> = sorted
        .windows(2)
        .filter(|w| w[0] == w[1])
        .map(|w| &w[0])
        .collect();
    assert!(
        duplicates.is_empty(),
        "{what}: read twice: {:?}",
        &duplicates[..duplicates.len().min(10)]
    );
    let mut want = expected.to_vec();
    want.sort();
    if sorted != want {
        let got: BTreeSet<&Record> = sorted.iter().collect();
        let wanted: BTreeSet<&Record> = want.iter().collect();
        let missing: Vec<_> = wanted.difference(&got).take(10).collect();
        let extra: Vec<_> = got.difference(&wanted).take(10).collect();
        panic!(
            "{what}: read {} records, expected {}; missing {missing:?}; not expected {extra:?}",
            sorted.len(),
            want.len()
        );
    }
    let mut last: BTreeMap<i64, i64> = BTreeMap::new();
    for (partition, offset, _, _) in read {
        if let Some(previous) = last.insert(*partition, *offset) {
            assert!(
                previous < *offset,
                "{what}: partition {partition} read {offset} after {previous}"
            );
        }
    }
}

/// Each partition's end: one past its last offset among `records`.
fn ends(records: &[Record]) -> BTreeMap<i64, i64> {
    let mut ends = BTreeMap::new();
    for (partition, offset, _, _) in records {
        let end = ends.entry(*partition).or_insert(0);
        *end = (*end).max(offset + 1);
    }
    ends
}

fn committed(summary: &Json) -> Vec<i64> {
    (0..PARTITIONS)
        .map(|p| {
            summary["committed"][p.to_string()]
                .as_i64()
                .unwrap_or_else(|| panic!("a commit for partition {p}: {summary}"))
        })
        .collect()
}

async fn shown_offsets(endpoint: &str) -> Vec<i64> {
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
        .map(|p| p["committed_offset"].as_i64().unwrap_or(-1))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_clients_share_a_group_rebalance_and_resume_from_its_commits_after_a_restart() {
    let Some(venv) = python_deps() else {
        return;
    };
    let dir = TestDir::new("kafka-groups");
    let mut cluster = LocalCluster::start_with_args(
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
    // Clients bootstrap from the nodes that do not coordinate the groups.
    let bootstrap: Vec<u16> = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| u64::try_from(i + 1).unwrap() != leader)
        .map(|(_, node)| node.kafka_addr().port())
        .collect();
    let settings = |scenario: &str, phase: &str, count: usize| {
        json!({
            "scenario": scenario,
            "phase": phase,
            "kafka_ports": bootstrap,
            "connection_string": connection_string(),
            "topic": HUB,
            "partitions": PARTITIONS,
            "group": GROUP,
            "count": count,
            "later_count": LATER_COUNT,
            "keys": KEYS,
        })
    };

    // confluent-kafka: two members, each partition to one of them; 100,000 keyed records
    // stored once each by the idempotent producer, and read once between the members.
    let summary = run_python(&venv, settings("pair", "confluent", COUNT)).await;
    assert_eq!(
        lasting_errors(&summary),
        Vec::<Json>::new(),
        "assignments {}",
        summary["assignments"]
    );
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
        "{assignment}"
    );
    assert!(a_partitions.is_disjoint(&b_partitions), "{assignment}");
    let first = delivered(&summary["delivered"], "confluent", 0, COUNT);
    let first_a = records(&summary["first_a"]);
    let first_b = records(&summary["first_b"]);
    assert!(
        first_a.iter().all(|r| a_partitions.contains(&r.0)),
        "a member read a partition it was not assigned"
    );
    assert!(
        first_b.iter().all(|r| b_partitions.contains(&r.0)),
        "a member read a partition it was not assigned"
    );
    let both: Vec<Record> = first_a.iter().chain(&first_b).cloned().collect();
    assert_read_exactly(&both, &first, "the two members' first reads");
    // One left: the other read on from the commits, its partitions and the leaver's.
    let later = delivered(&summary["delivered_later"], "confluent", COUNT, LATER_COUNT);
    assert_read_exactly(
        &records(&summary["after_leave"]),
        &later,
        "the survivor's reads after the leave",
    );
    let mut stored: Vec<Record> = first.iter().chain(&later).cloned().collect();
    let end_offsets = |stored: &[Record]| -> Vec<i64> {
        let ends = ends(stored);
        (0..i64::from(PARTITIONS))
            .map(|p| ends.get(&p).copied().unwrap_or(0))
            .collect()
    };
    assert_eq!(committed(&summary), end_offsets(&stored), "{summary}");
    // The offsets are the cluster's: shown through a node that does not coordinate.
    let elsewhere = &cluster.nodes[usize::try_from(leader).unwrap() % 3];
    assert_eq!(
        shown_offsets(&elsewhere.endpoint()).await,
        end_offsets(&stored)
    );

    // The whole cluster restarts: the group's commits survive in the controller group.
    for node in &mut cluster.nodes {
        node.terminate().await;
    }
    for node in &mut cluster.nodes {
        node.start_again();
    }
    for node in &mut cluster.nodes {
        node.wait_ready().await;
    }

    // kafka-python with its defaults: an idempotent producer, and a consumer joining the
    // group that resumes from the commits and reads exactly the records stored since.
    let summary = run_python(&venv, settings("kafka_python", "kafka-python", LATER_COUNT)).await;
    assert_eq!(summary["errors"], json!([]), "{summary}");
    assert_eq!(summary["idempotent"], json!(true), "kafka-python's default");
    let phase = delivered(&summary["delivered"], "kafka-python", 0, LATER_COUNT);
    assert_read_exactly(
        &records(&summary["read"]),
        &phase,
        "kafka-python's reads after the restart",
    );
    stored.extend(phase);
    assert_eq!(committed(&summary), end_offsets(&stored), "{summary}");

    // aiokafka with its defaults, the same way, on from kafka-python's commits.
    let summary = run_python(&venv, settings("aiokafka", "aiokafka", LATER_COUNT)).await;
    assert_eq!(summary["errors"], json!([]), "{summary}");
    let phase = delivered(&summary["delivered"], "aiokafka", 0, LATER_COUNT);
    assert_read_exactly(&records(&summary["read"]), &phase, "aiokafka's reads");
    stored.extend(phase);
    assert_eq!(committed(&summary), end_offsets(&stored), "{summary}");
    assert_eq!(
        shown_offsets(&cluster.nodes[0].endpoint()).await,
        end_offsets(&stored)
    );
}
