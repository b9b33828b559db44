//! Kafka clients, unchanged, producing to a three-node cluster's Kafka listeners: Debian's
//! kcat (`-L` metadata, `-P` with keys) and confluent-kafka (librdkafka 2.16, from
//! `scripts/python-test-deps`) with acks=all and every codec, logging in with SASL PLAIN as
//! Event Hubs takes it. What they sent is read back through the gRPC API and the CLI at the
//! sequence numbers the Kafka clients were told, and events sent through the gRPC API and
//! the CLI are consumed over Kafka.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::StreamExt;
use serde_json::{Value as Json, json};
use tributary_client::{
    Client, ConnectOptions, EventData, EventPosition, PropertyValue, ReceivedEvent, SendTarget,
};
use tributary_cluster_tests::kafka_tools::kcat;
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok, eventually};
use tributary_types::partition_for_key;

use crate::kafka_raw::{NOT_LEADER_OR_FOLLOWER, PartitionAnswer, RawKafka};

const SCRIPT: &str = include_str!("kafka_clients.py");
const ROOT_RULE: &str = "RootManageSharedAccessKey";
pub(super) const ROOT_KEY: &str = "a2Fma2EtcHJvZHVjZS10ZXN0LXJvb3Qta2V5LTAwMDE=";
const HUB: &str = "orders";
const PARTITIONS: u32 = 4;
const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);
/// The create timestamps confluent-kafka gives its records: this plus the record's index.
const TIMESTAMP_BASE: i64 = 1_600_000_000_000;

pub(super) fn connection_string(key: &str) -> String {
    format!("Endpoint=sb://127.0.0.1/;SharedAccessKeyName={ROOT_RULE};SharedAccessKey={key}")
}

pub(super) async fn start(
    name: &str,
) -> Option<(
    TestDir,
    LocalCluster,
    Client,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    start_with_env(name, &[]).await
}

/// [`start`] with more environment for every node.
pub(super) async fn start_with_env(
    name: &str,
    env: &[(&str, &str)],
) -> Option<(
    TestDir,
    LocalCluster,
    Client,
    std::path::PathBuf,
    std::path::PathBuf,
)> {
    let kcat = kcat()?;
    let venv = python_deps()?;
    let dir = TestDir::new(name);
    let cluster = LocalCluster::start_with_args(
        dir.path(),
        3,
        &["--auth".to_owned(), "sas".to_owned()],
        &[&[("TRIBUTARY_ROOT_KEY", ROOT_KEY)], env].concat(),
    )
    .await;
    let root = Client::from_connection_string_with(
        &connection_string(ROOT_KEY),
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
    Some((dir, cluster, root, kcat, venv))
}

/// `kcat` with SASL PLAIN as Event Hubs takes it, against `port`.
async fn run_kcat(
    kcat: &Path,
    port: u16,
    args: &[&str],
    input: Option<&str>,
) -> std::process::Output {
    use tokio::io::AsyncWriteExt;
    let mut command = tokio::process::Command::new(kcat);
    command
        .args(["-b", &format!("127.0.0.1:{port}")])
        .args([
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanisms=PLAIN",
        ])
        .args(["-X", "sasl.username=$ConnectionString"])
        .args([
            "-X",
            &format!("sasl.password={}", connection_string(ROOT_KEY)),
        ])
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    if let Some(input) = input {
        stdin.write_all(input.as_bytes()).await.unwrap();
    }
    drop(stdin);
    tokio::time::timeout(CLIENT_TIMEOUT, child.wait_with_output())
        .await
        .expect("kcat finishes")
        .unwrap()
}

pub(super) async fn run_python(venv: &Path, settings: Json) -> Json {
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
    stdout
        .lines()
        .find_map(|line| {
            serde_json::from_str::<Json>(line)
                .ok()?
                .get("summary")
                .cloned()
        })
        .unwrap_or_else(|| {
            panic!(
                "the confluent-kafka script printed no summary; stdout {stdout}; stderr {}",
                String::from_utf8_lossy(&output.stderr)
            )
        })
}

async fn read_all(root: &Client, partition: u32) -> Vec<ReceivedEvent> {
    let partition = partition.to_string();
    let last = root
        .get_partition_properties(HUB, &partition)
        .await
        .unwrap()
        .last_enqueued_sequence_number;
    let mut events = Vec::new();
    if last < 0 {
        return events;
    }
    let mut stream = root
        .consumer()
        .receive(HUB, "$Default", &partition, EventPosition::Earliest, 500)
        .await
        .unwrap();
    while (events.len() as i64) <= last {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("events within 30 s")
            .expect("the stream goes on")
            .unwrap();
        events.extend(batch);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kcat_and_confluent_kafka_produce_through_any_node() {
    let Some((_dir, cluster, root, kcat, venv)) = start("kafka-produce").await else {
        return;
    };
    let node = &cluster.nodes[1];
    let port = node.kafka_addr().port();

    // Metadata: every node is a broker at its own Kafka port, and each partition's leader
    // is the node that leads it (as the cluster status says), so clients go straight there.
    let brokers: Vec<Json> = cluster
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| json!({"id": i + 1, "name": format!("127.0.0.1:{}", n.kafka_addr().port())}))
        .collect();
    eventually(
        Duration::from_secs(60),
        "Kafka metadata naming every node and each partition's leader",
        async || {
            let status = root.cluster_status().await.map_err(|e| e.to_string())?;
            let listing = run_kcat(&kcat, port, &["-L", "-J"], None).await;
            if !listing.status.success() {
                return Err(format!("{listing:?}"));
            }
            let metadata: Json = serde_json::from_slice(&listing.stdout).unwrap();
            let mut listed = metadata["brokers"].as_array().cloned().unwrap_or_default();
            listed.sort_by_key(|b| b["id"].as_u64());
            assert_eq!(listed, brokers, "{metadata}");
            let topic = metadata["topics"]
                .as_array()
                .unwrap()
                .iter()
                .find(|t| t["topic"] == json!(HUB))
                .unwrap_or_else(|| panic!("{metadata}"))
                .clone();
            let partitions = topic["partitions"].as_array().unwrap();
            assert_eq!(partitions.len(), PARTITIONS as usize);
            for partition in partitions {
                let id = partition["partition"].to_string();
                let leader = status
                    .partitions
                    .iter()
                    .find(|p| p.event_hub == HUB && p.partition_id == id)
                    .map(|p| p.leader);
                assert_eq!(
                    partition["replicas"].as_array().unwrap().len(),
                    3,
                    "{partition}"
                );
                if leader != partition["leader"].as_u64() {
                    return Err(format!("status leader {leader:?}, metadata {partition}"));
                }
            }
            Ok(())
        },
    )
    .await;

    // kcat -P with keys, to partition 2: read back through gRPC, keys as partition keys.
    let produced = run_kcat(
        &kcat,
        port,
        &["-P", "-t", HUB, "-p", "2", "-K", ":"],
        Some("k1:first\nk2:second\n"),
    )
    .await;
    assert!(produced.status.success(), "{produced:?}");
    let events = read_all(&root, 2).await;
    let seen: Vec<(Option<&str>, &[u8])> = events
        .iter()
        .map(|e| (e.partition_key.as_deref(), &e.body[..]))
        .collect();
    assert_eq!(
        seen,
        vec![(Some("k1"), &b"first"[..]), (Some("k2"), &b"second"[..])]
    );

    // confluent-kafka, acks=all, every codec: each delivery's offset is the event's sequence
    // number, with its key, value and headers.
    let codecs = ["none", "gzip", "snappy", "lz4", "zstd"];
    let summary = run_python(
        &venv,
        json!({
            "scenario": "produce",
            "kafka_port": cluster.nodes[0].kafka_addr().port(),
            "connection_string": connection_string(ROOT_KEY),
            "topic": HUB,
            "partitions": PARTITIONS,
            "count": 40,
            "codecs": codecs,
            "timestamp_base": TIMESTAMP_BASE,
        }),
    )
    .await;
    assert_eq!(summary["errors"], json!([]), "{summary}");
    let delivered = summary["delivered"].as_array().unwrap();
    assert_eq!(delivered.len(), 40 * codecs.len(), "{summary}");
    let mut by_partition: BTreeMap<u32, Vec<ReceivedEvent>> = BTreeMap::new();
    for p in 0..PARTITIONS {
        by_partition.insert(p, read_all(&root, p).await);
    }
    for delivery in delivered {
        assert_eq!(delivery["error"], Json::Null, "{delivery}");
        let partition = u32::try_from(delivery["partition"].as_u64().unwrap()).unwrap();
        let offset = delivery["offset"].as_i64().unwrap();
        let event = by_partition[&partition]
            .iter()
            .find(|e| e.sequence_number == offset)
            .unwrap_or_else(|| panic!("no event at sequence number {offset}: {delivery}"));
        let key = delivery["key"].as_str().unwrap();
        assert_eq!(event.partition_key.as_deref(), Some(key), "{delivery}");
        let index = key.rsplit('-').next().unwrap();
        let codec = delivery["codec"].as_str().unwrap();
        assert_eq!(&event.body[..], format!("{codec}/value-{index}").as_bytes());
        assert_eq!(
            event.properties.get("index"),
            Some(&PropertyValue::Bytes(index.as_bytes().to_vec().into())),
            "{delivery}"
        );
    }
    // Each partition's records in the order produced, nothing else stored.
    let stored: usize = by_partition.values().map(Vec::len).sum();
    assert_eq!(stored, 2 + 40 * codecs.len());

    // The CLI lists partition 3 as the Kafka clients stored it: each record at its
    // delivered offset as sequence number, its key as partition key, its headers as
    // properties (bytes, shown as base64).
    let listed = cli_ok(
        &cluster.nodes[2].endpoint(),
        &[
            "--connection-string",
            &connection_string(ROOT_KEY),
            "--output",
            "json",
            "receive",
            HUB,
            "--partition",
            "3",
            "--count",
            &by_partition[&3].len().to_string(),
        ],
    )
    .await;
    let lines: BTreeMap<i64, Json> = listed
        .lines()
        .map(|line| {
            let event: Json = serde_json::from_str(line).unwrap();
            (event["sequence_number"].as_i64().unwrap(), event)
        })
        .collect();
    let on_3: Vec<&Json> = delivered
        .iter()
        .filter(|d| d["partition"] == json!(3))
        .collect();
    assert_eq!(lines.len(), on_3.len(), "{listed}");
    for delivery in on_3 {
        let offset = delivery["offset"].as_i64().unwrap();
        let line = lines
            .get(&offset)
            .unwrap_or_else(|| panic!("the CLI lists no sequence number {offset}: {listed}"));
        let key = delivery["key"].as_str().unwrap();
        let index = key.rsplit('-').next().unwrap();
        let codec = delivery["codec"].as_str().unwrap();
        assert_eq!(line["partition_key"], json!(key), "{line}");
        assert_eq!(
            line["body"],
            json!(format!("{codec}/value-{index}")),
            "{line}"
        );
        assert_eq!(
            (&line["properties"]["codec"], &line["properties"]["index"]),
            (&json!(BASE64.encode(codec)), &json!(BASE64.encode(index))),
            "{line}"
        );
    }

    // kcat -C (Fetch, ListOffsets) reads partition 2 back through a node that leads none
    // or some of it: keys, values and offsets as produced.
    let consumed = run_kcat(
        &kcat,
        cluster.nodes[2].kafka_addr().port(),
        &[
            "-C",
            "-t",
            HUB,
            "-p",
            "2",
            "-o",
            "beginning",
            "-e",
            "-f",
            "%k=%s@%o#%T\n",
        ],
        None,
    )
    .await;
    assert!(consumed.status.success(), "{consumed:?}");
    let lines: Vec<String> = String::from_utf8_lossy(&consumed.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), by_partition[&2].len(), "{lines:?}");
    assert!(lines[0].starts_with("k1=first@0#"), "{lines:?}");
    assert!(lines[1].starts_with("k2=second@1#"), "{lines:?}");
    for (line, event) in lines.iter().zip(&by_partition[&2]).skip(2) {
        // confluent-kafka's records keep the create timestamps it gave them.
        let index: i64 = event
            .partition_key
            .as_deref()
            .unwrap()
            .rsplit('-')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let expected = format!(
            "{}={}@{}#{}",
            event.partition_key.as_deref().unwrap_or(""),
            String::from_utf8_lossy(&event.body),
            event.sequence_number,
            TIMESTAMP_BASE + index
        );
        assert_eq!(line, &expected);
    }

    // AdminClient: CreateTopics makes an event hub (a setting hubs lack is refused, a
    // second creation too), DescribeConfigs answers its retention; ListOffsets by time
    // finds the first event enqueued at or after each time.
    // One time per partition (a client asks once per partition): an event's own time, the
    // last event's, and a time no event has reached.
    let probes = [
        (0u32, by_partition[&0][3].enqueued_time_ms),
        (1, by_partition[&1].last().unwrap().enqueued_time_ms),
        (2, i64::MAX / 2),
    ];
    let summary = run_python(
        &venv,
        json!({
            "scenario": "admin",
            "kafka_port": port,
            "connection_string": connection_string(ROOT_KEY),
            "topic": HUB,
            "new_topic": "created-by-kafka",
            "times": probes.iter().map(|(p, t)| json!([p, t])).collect::<Vec<_>>(),
        }),
    )
    .await;
    assert_eq!(
        summary["created"],
        json!({"created-by-kafka": "created", "created-by-kafka-bad": "INVALID_CONFIG", "again": "TOPIC_ALREADY_EXISTS"}),
        "{summary}"
    );
    let created = root.get_event_hub("created-by-kafka").await.unwrap();
    assert_eq!(
        (
            created.partition_count,
            created.replication_factor,
            created.retention_ms
        ),
        (3, 3, 7_200_000)
    );
    assert!(root.get_event_hub("created-by-kafka-bad").await.is_err());
    assert_eq!(
        summary["configs"]["retention.ms"],
        json!("7200000"),
        "{summary}"
    );
    assert_eq!(
        summary["configs"]["cleanup.policy"],
        json!("delete"),
        "{summary}"
    );
    let expected: Vec<Json> = probes
        .iter()
        .map(|(p, t)| {
            let first = by_partition[p]
                .iter()
                .find(|e| e.enqueued_time_ms >= *t)
                .map_or(-1, |e| e.sequence_number);
            json!([p, first])
        })
        .collect();
    assert_eq!(summary["offsets"], json!(expected), "{summary}");

    // An event sent with a partition key over gRPC shows that key, and its properties as
    // headers, to a Kafka consumer.
    let partition = u32::from(partition_for_key("grpc-key", PARTITIONS as u16));
    root.producer()
        .send(
            HUB,
            SendTarget::PartitionKey("grpc-key".into()),
            [EventData::from_body("from-grpc").with_property("origin", "grpc")],
        )
        .await
        .unwrap();
    let consumed = run_kcat(
        &kcat,
        port,
        &[
            "-C",
            "-t",
            HUB,
            "-p",
            &partition.to_string(),
            "-o",
            "-1",
            "-e",
            "-f",
            "%k=%s;%h@%o\n",
        ],
        None,
    )
    .await;
    assert!(consumed.status.success(), "{consumed:?}");
    let last = by_partition[&partition].len();
    assert_eq!(
        String::from_utf8_lossy(&consumed.stdout).trim(),
        format!("grpc-key=from-grpc;origin=grpc@{last}")
    );

    // An event sent by the CLI with a partition key is consumed over Kafka with that key,
    // at the sequence number the CLI printed.
    let sent: Json = serde_json::from_str(
        &cli_ok(
            &cluster.nodes[0].endpoint(),
            &[
                "--connection-string",
                &connection_string(ROOT_KEY),
                "--output",
                "json",
                "send",
                HUB,
                "--partition-key",
                "cli-key",
                "--body",
                "from-cli",
            ],
        )
        .await,
    )
    .unwrap();
    let cli_partition = partition_for_key("cli-key", PARTITIONS as u16).to_string();
    assert_eq!(sent["partition"], json!(cli_partition), "{sent}");
    let sequence_number = sent["sequence_number"].as_i64().unwrap();
    let consumed = run_kcat(
        &kcat,
        cluster.nodes[1].kafka_addr().port(),
        &[
            "-C",
            "-t",
            HUB,
            "-p",
            &cli_partition,
            "-o",
            &sequence_number.to_string(),
            "-c",
            "1",
            "-e",
            "-f",
            "%k=%s@%o\n",
        ],
        None,
    )
    .await;
    assert!(consumed.status.success(), "{consumed:?}");
    assert_eq!(
        String::from_utf8_lossy(&consumed.stdout).trim(),
        format!("cli-key=from-cli@{sequence_number}")
    );

    // A wrong key: the login is refused, nothing is stored, and the node goes on serving.
    let summary = run_python(
        &venv,
        json!({
            "scenario": "wrong_password",
            "kafka_port": port,
            "connection_string": connection_string(ROOT_KEY),
            "wrong_connection_string": connection_string("d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktMDE="),
            "topic": HUB,
        }),
    )
    .await;
    let errors = summary["errors"].as_array().unwrap();
    assert!(
        errors.iter().any(|e| e["code"] == json!("_AUTHENTICATION")),
        "{summary}"
    );
    assert_ne!(summary["delivered"], json!([Json::Null]), "{summary}");
    let after: usize = {
        let mut n = 0;
        for p in 0..PARTITIONS {
            n += read_all(&root, p).await.len();
        }
        n
    };
    assert_eq!(after, stored + 2, "nothing stored by the refused producer");
    let again = run_kcat(&kcat, port, &["-L", "-J"], None).await;
    assert!(again.status.success(), "{again:?}");

    // A Produce or a Fetch reaching a node that does not lead the partition (a client whose
    // Metadata is out of date) is answered NOT_LEADER_OR_FOLLOWER at once, and nothing is
    // stored; the client refreshes its Metadata and goes to the leader, where both succeed.
    // Leadership settles on each partition's preferred replica after the hub is made:
    // wait for that, so the leader does not move away during the check.
    let leader = eventually(
        Duration::from_secs(60),
        "partition 0 led by its preferred replica",
        async || {
            let status = root.cluster_status().await.map_err(|e| e.to_string())?;
            let partition = status
                .partitions
                .iter()
                .find(|p| p.event_hub == HUB && p.partition_id == "0")
                .ok_or("partition 0 is not listed")?;
            match partition.replicas.first() {
                Some(preferred) if partition.leader != 0 && preferred.node == partition.leader => {
                    Ok(partition.leader)
                }
                _ => Err(format!("led by node {}", partition.leader)),
            }
        },
    )
    .await;
    let at = |node: u64| {
        cluster.nodes[usize::try_from(node - 1).unwrap()]
            .kafka_addr()
            .port()
    };
    let end = i64::try_from(read_all(&root, 0).await.len()).unwrap();
    let mut elsewhere = RawKafka::login(at(leader % 3 + 1), &connection_string(ROOT_KEY)).await;
    let refused = elsewhere.produce(HUB, 0, "to-a-follower").await;
    assert_eq!(
        refused.partition.error_code, NOT_LEADER_OR_FOLLOWER,
        "{refused:?}"
    );
    let fetched = elsewhere.fetch(HUB, 0).await;
    assert_eq!(
        fetched.error_code,
        NOT_LEADER_OR_FOLLOWER,
        "{fetched:?} from node {} (leader {leader}, end {end})",
        leader % 3 + 1
    );
    let mut there = RawKafka::login(at(leader), &connection_string(ROOT_KEY)).await;
    assert_eq!(
        there.produce(HUB, 0, "to-the-leader").await.partition,
        PartitionAnswer {
            error_code: 0,
            offset: end
        }
    );
    assert_eq!(
        there.fetch(HUB, 0).await,
        PartitionAnswer {
            error_code: 0,
            offset: end + 1
        }
    );
    let bodies: Vec<Vec<u8>> = read_all(&root, 0)
        .await
        .iter()
        .skip(usize::try_from(end).unwrap())
        .map(|e| e.body.to_vec())
        .collect();
    assert_eq!(bodies, vec![b"to-the-leader".to_vec()]);
}

/// librdkafka sends a connection's Produce requests without waiting for their answers; the
/// node works on several of them at once (they share commits), and the partition still
/// stores the records in the order they were sent, acknowledged in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_produce_requests_keep_their_order() {
    const COUNT: usize = 2000;
    const PARTITION: u32 = 1;
    let Some((_dir, cluster, root, _kcat, venv)) = start("kafka-pipelined").await else {
        return;
    };
    let ports: Vec<u16> = cluster
        .nodes
        .iter()
        .map(|node| node.kafka_addr().port())
        .collect();
    let summary = run_python(
        &venv,
        json!({
            "scenario": "pipelined",
            "kafka_ports": ports,
            "connection_string": connection_string(ROOT_KEY),
            "topic": HUB,
            "partition": PARTITION,
            "count": COUNT,
            "pause_s": 0.0005,
        }),
    )
    .await;
    assert_eq!(summary["errors"], json!([]), "{summary}");
    let acked: Vec<(usize, i64)> = serde_json::from_value(summary["acked"].clone()).unwrap();
    assert_eq!(acked.len(), COUNT, "{summary}");
    // After the first record (offset 0), each numbered one at the next offset.
    for (i, (number, offset)) in acked.iter().enumerate() {
        assert_eq!((*number, *offset), (i, i as i64 + 1), "{summary}");
    }
    let bodies: Vec<String> = read_all(&root, PARTITION)
        .await
        .iter()
        .map(|event| String::from_utf8_lossy(&event.body).into_owned())
        .collect();
    let sent: Vec<String> = std::iter::once("-1".to_owned())
        .chain((0..COUNT).map(|i| i.to_string()))
        .collect();
    assert_eq!(bodies, sent);
}
