//! Capture in a running cluster, read back by fastavro: every event lands in exactly one
//! file while the leader of a partition is killed with SIGKILL and later restarted under
//! continuous sends, and a node captures to an S3-compatible server (moto) with credentials
//! from its environment.
//!
//! fastavro and moto live in the virtual environment `scripts/python-test-deps` makes.
//! Without it these tests print that they were skipped and pass, unless
//! `TRIBUTARY_REQUIRE_PYTHON_DEPS=1` makes a missing environment a failure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tributary_cluster_tests::eventually;
use tributary_cluster_tests::python_tools::{MotoServer, python_deps};

use serde_json::Value;
use tokio::time::Instant;
use tributary_client::{Client, EventData, SendTarget};
use tributary_cluster_tests::{LocalCluster, TestDir, cli_ok};
use tributary_types::UtcDateTime;

const HUB: &str = "captured";
const NAMESPACE: &str = "testns";
const PARTITION_KEYS: u64 = 5;
/// Acknowledged sends between the steps of the failover test.
const ACKS_PER_STEP: usize = 150;
/// How long capture may take to write everything after the sends stop.
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(60);
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

/// An acknowledged event: where the service put it and what it was.
#[derive(Debug, Clone)]
struct Acked {
    number: u64,
    partition: String,
    sequence: i64,
    offset: String,
}

/// A record as `scripts/read_capture.py` prints it.
#[derive(Debug, Clone)]
struct Captured {
    path: String,
    partition: String,
    sequence: i64,
    record: Value,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_writes_every_event_once_across_a_leader_kill() {
    let Some(python) = python_deps() else { return };
    let dir = TestDir::new("capture-failover");
    let capture_dir = dir.path().join("capture");
    let mut cluster = LocalCluster::start(dir.path(), 3).await;
    let endpoints = cluster.endpoints();
    let destination = format!("file://{}", capture_dir.display());
    cli_ok(
        &endpoints[0],
        &[
            "hub",
            "create",
            HUB,
            "--partitions",
            "2",
            "--replication-factor",
            "3",
            "--capture-destination",
            &destination,
            "--capture-window",
            "2s",
            "--capture-window-bytes",
            "65536",
            "--capture-namespace",
            NAMESPACE,
        ],
    )
    .await;
    let shown: Value = serde_json::from_str(
        &cli_ok(&endpoints[0], &["--output", "json", "hub", "show", HUB]).await,
    )
    .unwrap();
    assert_eq!(shown["capture_destination"], destination.as_str());
    assert_eq!(shown["capture_window_ms"], 2000);
    assert_eq!(shown["capture_window_bytes"], 65536);

    let producer = Producer::start(&endpoints);
    producer.wait_for_acks(ACKS_PER_STEP).await;
    let victim = cluster.partition_leader(HUB, "0").await;
    cluster.nodes[victim].kill9().await;
    producer.wait_for_acks(ACKS_PER_STEP).await;
    cluster.nodes[victim].restart().await;
    producer.wait_for_acks(ACKS_PER_STEP).await;
    let acked = producer.stop().await;

    let client = Client::connect_any(&cluster.endpoints()).await.unwrap();
    let last = wait_until_captured(&client, &["0", "1"]).await;
    let records = read_capture(&python, &capture_dir.display().to_string(), None);
    check_capture(&records, &acked, &last);
    // Files from before the kill, around it and after it.
    let files: BTreeSet<&str> = records.iter().map(|r| r.path.as_str()).collect();
    assert!(files.len() >= 4, "{files:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capture_writes_to_s3_with_credentials_from_the_environment() {
    let Some(python) = python_deps() else { return };
    let server = MotoServer::start(&python).await;
    let endpoint = server.endpoint();
    create_bucket(&python, &endpoint, "captures");
    let dir = TestDir::new("capture-s3");
    let cluster = LocalCluster::start_with_env(
        dir.path(),
        1,
        &[
            ("AWS_ACCESS_KEY_ID", "test-key"),
            ("AWS_SECRET_ACCESS_KEY", "test-secret"),
        ],
    )
    .await;
    let endpoints = cluster.endpoints();
    cli_ok(&endpoints[0], &["hub", "create", HUB, "--partitions", "1"]).await;
    // Events from before capture is enabled are not captured.
    let client = Client::connect(&endpoints[0]).await.unwrap();
    let before = client
        .producer()
        .send(
            HUB,
            SendTarget::PartitionId("0".into()),
            [EventData::from_body("before")],
        )
        .await
        .unwrap();
    assert_eq!(before.first_sequence_number, 0);
    let destination = format!("s3://captures/tributary/run?region=us-east-1&endpoint={endpoint}");
    cli_ok(
        &endpoints[0],
        &[
            "hub",
            "update",
            HUB,
            "--capture-destination",
            &destination,
            "--capture-window",
            "1s",
            "--capture-namespace",
            NAMESPACE,
        ],
    )
    .await;
    let mut acked = Vec::new();
    for number in 0..40u64 {
        let response = client
            .producer()
            .send(HUB, SendTarget::PartitionKey(key(number)), [event(number)])
            .await
            .unwrap();
        acked.push(Acked {
            number,
            partition: response.partition_id.clone(),
            sequence: response.first_sequence_number,
            offset: response.offsets[0].clone(),
        });
    }
    let last = wait_until_captured(&client, &["0"]).await;
    let records = read_capture(&python, "s3://captures/tributary/run", Some(&endpoint));
    assert!(records.iter().all(|r| r.sequence >= 1), "{records:?}");
    check_capture_from(&records, &acked, &last, 1);

    // Disabled: later events are not captured.
    cli_ok(&endpoints[0], &["hub", "update", HUB, "--capture-off"]).await;
    let shown: Value = serde_json::from_str(
        &cli_ok(&endpoints[0], &["--output", "json", "hub", "show", HUB]).await,
    )
    .unwrap();
    assert_eq!(shown["capture_destination"], Value::Null);
    server.stop();
}

fn key(number: u64) -> String {
    format!("key-{}", number % PARTITION_KEYS)
}

fn body(number: u64) -> String {
    format!("event-{number:06}-{}", "x".repeat((number % 50) as usize))
}

fn event(number: u64) -> EventData {
    EventData::from_body(body(number))
        .with_property("n", number as i64)
        .with_property("tag", format!("tag-{}", number % 3))
}

/// Sends numbered events, one per send, keyed so they spread over the partitions, until
/// stopped; remembers the acknowledged ones.
struct Producer {
    acked: Arc<Mutex<Vec<Acked>>>,
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Producer {
    fn start(endpoints: &[String]) -> Producer {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let endpoints = endpoints.to_vec();
        let task = tokio::spawn({
            let acked = acked.clone();
            let stop = stop.clone();
            async move {
                let client = Client::connect_any(&endpoints)
                    .await
                    .unwrap()
                    .with_retry_deadline(Duration::from_secs(2));
                let producer = client.producer();
                let mut number = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let sent = producer
                        .send(HUB, SendTarget::PartitionKey(key(number)), [event(number)])
                        .await;
                    match sent {
                        Ok(response) => acked.lock().unwrap().push(Acked {
                            number,
                            partition: response.partition_id.clone(),
                            sequence: response.first_sequence_number,
                            offset: response.offsets[0].clone(),
                        }),
                        // May or may not be stored: not counted as sent, never resent.
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                    number += 1;
                }
            }
        });
        Producer { acked, stop, task }
    }

    /// Waits for `count` more acknowledged sends.
    async fn wait_for_acks(&self, count: usize) {
        let target = self.acked.lock().unwrap().len() + count;
        let what = format!("{count} more sends acknowledged");
        eventually(STEP_TIMEOUT, what, async || {
            match self.acked.lock().unwrap().len() {
                acked if acked >= target => Ok(()),
                acked => Err(format!("{acked} of {target} acknowledged")),
            }
        })
        .await;
    }

    async fn stop(self) -> Vec<Acked> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap();
        Arc::try_unwrap(self.acked).unwrap().into_inner().unwrap()
    }
}

/// Waits until capture has written every event of each partition; returns each one's last
/// sequence number.
async fn wait_until_captured(client: &Client, partitions: &[&str]) -> BTreeMap<String, i64> {
    let deadline = Instant::now() + CAPTURE_TIMEOUT;
    let mut last = BTreeMap::new();
    for partition in partitions {
        let what =
            format!("partition {partition} captured (within {CAPTURE_TIMEOUT:?} of the first)");
        let captured = eventually(deadline, what, async || {
            match client.get_partition_properties(HUB, partition).await {
                Ok(p) if p.capture_next_sequence_number == p.last_enqueued_sequence_number + 1 => {
                    Ok(p.last_enqueued_sequence_number)
                }
                properties => Err(format!("{properties:?}")),
            }
        })
        .await;
        last.insert(partition.to_string(), captured);
    }
    last
}

/// Runs `scripts/read_capture.py` on a directory or S3 prefix.
fn read_capture(python: &Path, location: &str, endpoint: Option<&str>) -> Vec<Captured> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/read_capture.py");
    let mut command = Command::new(python.join("bin/python"));
    command.arg(script).arg(location).args(endpoint);
    command
        .env("AWS_ACCESS_KEY_ID", "test-key")
        .env("AWS_SECRET_ACCESS_KEY", "test-secret");
    let output = command.output().unwrap();
    assert!(
        output.status.success(),
        "read_capture.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            let path = record["path"].as_str().unwrap().to_owned();
            let partition = check_path(&path);
            Captured {
                path,
                partition,
                sequence: record["SequenceNumber"].as_i64().unwrap(),
                record,
            }
        })
        .collect()
}

/// Checks a file's path is `{namespace}/{hub}/{partition}/{YYYY}/{MM}/{DD}/{hh}/{mm}/{ss}.avro`
/// and returns its partition.
fn check_path(path: &str) -> String {
    let parts: Vec<&str> = path.split('/').collect();
    assert_eq!(parts.len(), 9, "{path}");
    assert_eq!((parts[0], parts[1]), (NAMESPACE, HUB), "{path}");
    let second = parts[8].strip_suffix(".avro").expect(path);
    let widths = [4, 2, 2, 2, 2, 2];
    for (field, width) in parts[3..8].iter().chain([&second]).zip(widths) {
        assert!(
            field.len() == width && field.bytes().all(|b| b.is_ascii_digit()),
            "{path}"
        );
    }
    parts[2].to_owned()
}

fn check_capture(records: &[Captured], acked: &[Acked], last: &BTreeMap<String, i64>) {
    check_capture_from(records, acked, last, 0)
}

/// Every event of each partition from sequence `from` through `last` is in exactly one
/// file, as it was sent and acknowledged.
fn check_capture_from(
    records: &[Captured],
    acked: &[Acked],
    last: &BTreeMap<String, i64>,
    from: i64,
) {
    let mut by_position: BTreeMap<(String, i64), &Captured> = BTreeMap::new();
    for record in records {
        let position = (record.partition.clone(), record.sequence);
        if let Some(earlier) = by_position.insert(position, record) {
            panic!(
                "partition {} sequence {} is in two files: {} and {}",
                record.partition, record.sequence, earlier.path, record.path
            );
        }
        check_record(record);
    }
    for (partition, last) in last {
        let sequences: Vec<i64> = by_position
            .keys()
            .filter(|(p, _)| p == partition)
            .map(|(_, s)| *s)
            .collect();
        let expected: Vec<i64> = (from..=*last).collect();
        assert_eq!(sequences, expected, "partition {partition}: gaps or extras");
    }
    for sent in acked {
        let record = by_position
            .get(&(sent.partition.clone(), sent.sequence))
            .unwrap_or_else(|| panic!("acknowledged {sent:?} is in no file"));
        assert_eq!(
            record.record["Properties"]["n"], sent.number as i64,
            "{sent:?}"
        );
        assert_eq!(record.record["Offset"], sent.offset.as_str(), "{sent:?}");
        assert_eq!(
            record.record["SystemProperties"]["x-opt-partition-key"],
            key(sent.number).as_str()
        );
    }
}

/// A record's fields agree with each other and with what was sent under its number.
fn check_record(captured: &Captured) {
    let record = &captured.record;
    let number = record["Properties"]["n"].as_u64().expect("property n");
    let expected_body = body(number);
    let decoded = base64_decode(record["Body"].as_str().unwrap());
    assert_eq!(decoded, expected_body.as_bytes(), "{record}");
    assert_eq!(record["Properties"]["tag"], format!("tag-{}", number % 3));
    let system = &record["SystemProperties"];
    assert_eq!(system["x-opt-sequence-number"], record["SequenceNumber"]);
    assert_eq!(system["x-opt-offset"], record["Offset"]);
    assert_eq!(system["x-opt-partition-key"], key(number).as_str());
    let enqueued_ms = system["x-opt-enqueued-time"].as_i64().unwrap();
    assert_eq!(
        record["EnqueuedTimeUtc"],
        dotnet_invariant_time(enqueued_ms),
        "{record}"
    );
}

/// `M/d/yyyy h:mm:ss tt` in UTC, as Event Hubs writes `EnqueuedTimeUtc`.
fn dotnet_invariant_time(ms: i64) -> String {
    let t = UtcDateTime::from_unix_ms(ms);
    let hour = match t.hour % 12 {
        0 => 12,
        h => h,
    };
    let meridiem = if t.hour < 12 { "AM" } else { "PM" };
    format!(
        "{}/{}/{:04} {hour}:{:02}:{:02} {meridiem}",
        t.month, t.day, t.year, t.minute, t.second
    )
}

fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut buffer = 0u32;
    let mut bits = 0;
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = ALPHABET.iter().position(|a| *a == byte).expect("base64") as u32;
        buffer = (buffer << 6) | value;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((buffer >> bits) as u8);
            buffer &= (1 << bits) - 1;
        }
    }
    out
}

fn create_bucket(python: &Path, endpoint: &str, bucket: &str) {
    let output = Command::new(python.join("bin/python"))
        .arg("-c")
        .arg(
            "import sys, boto3; boto3.client('s3', endpoint_url=sys.argv[1], \
             region_name='us-east-1').create_bucket(Bucket=sys.argv[2])",
        )
        .args([endpoint, bucket])
        .env("AWS_ACCESS_KEY_ID", "test-key")
        .env("AWS_SECRET_ACCESS_KEY", "test-secret")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "creating the bucket failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
