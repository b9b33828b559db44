//! Capture files checked by tools no one here wrote: a local S3-compatible server (moto)
//! behind the S3 sink, and fastavro reading what `encode_file` writes.
//!
//! Both tools live in the virtual environment `scripts/python-test-deps` makes. Without it
//! these tests print that they were skipped and pass, unless
//! `TRIBUTARY_REQUIRE_PYTHON_DEPS=1` makes a missing environment a failure.

use std::process::Command;
use tributary_cluster_tests::python_tools::{MotoServer, python_deps};

use apache_avro::Reader;
use apache_avro::types::Value;
use bytes::Bytes;
use object_store::ObjectStoreExt;
use object_store::aws::AmazonS3Builder;
use serde_json::json;
use tributary_broker::capture::{CaptureDestination, Sink, encode_file, file_path};
use tributary_broker::partition::ReadEvent;
use tributary_broker::partition::codec::{EventRecord, Property};

/// How long moto may take to start listening (it imports a lot of Python first).
const BUCKET: &str = "captures";
const PREFIX: &str = "tributary/test";
/// 2019-01-27T23:04:48.250Z
const ENQUEUED_MS: i64 = 1_548_630_288_250;

#[tokio::test]
async fn s3_sink_puts_lists_and_overwrites() {
    let Some(venv) = python_deps() else { return };
    let server = MotoServer::start(&venv).await;
    let endpoint = server.endpoint();
    let http = reqwest::Client::new();
    // object_store cannot create buckets; moto takes an unsigned CreateBucket.
    let created = http
        .put(format!("{endpoint}/{BUCKET}"))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "{created:?}");

    let destination = CaptureDestination::S3 {
        endpoint: Some(endpoint.clone()),
        bucket: BUCKET.to_owned(),
        region: "us-east-1".to_owned(),
        prefix: PREFIX.to_owned(),
        allow_http: true,
    };
    let env = [
        ("AWS_ACCESS_KEY_ID", "test-key"),
        ("AWS_SECRET_ACCESS_KEY", "test-secret"),
    ]
    .map(|(key, value)| (key.to_owned(), value.to_owned()));
    let sink = Sink::open_with_env(&destination, env).unwrap();

    let path = file_path("ns", "hub", "0", ENQUEUED_MS);
    let older = encode_file(&sample_events()[..1]).unwrap();
    let file = encode_file(&sample_events()).unwrap();
    sink.put(&path, older).await.unwrap();
    // The same window written again (after a failover) replaces the first file.
    sink.put(&path, file.clone()).await.unwrap();
    let neighbour = file_path("ns", "hub", "1", ENQUEUED_MS);
    sink.put(&neighbour, encode_file(&[]).unwrap())
        .await
        .unwrap();

    assert_eq!(path, "ns/hub/0/2019/01/27/23/04/48.avro");
    assert_eq!(
        sink.list("").await.unwrap(),
        [path.as_str(), neighbour.as_str()]
    );
    assert_eq!(sink.list("ns/hub/0").await.unwrap(), [path.as_str()]);

    // Read back with a client of the whole bucket (moto refuses unsigned reads): the object
    // sits under the prefix, whole and replaced.
    let bucket = AmazonS3Builder::new()
        .with_endpoint(&endpoint)
        .with_allow_http(true)
        .with_bucket_name(BUCKET)
        .with_region("us-east-1")
        .with_access_key_id("test-key")
        .with_secret_access_key("test-secret")
        .build()
        .unwrap();
    let key = object_store::path::Path::from(format!("{PREFIX}/{path}"));
    let fetched = bucket.get(&key).await.unwrap().bytes().await.unwrap();
    assert_eq!(fetched.as_ref(), file.as_slice());
    let records: Vec<Value> = Reader::new(fetched.as_ref())
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(records.len(), 2);

    // A bucket that does not exist is an error naming the destination.
    let missing = Sink::open_with_env(
        &CaptureDestination::S3 {
            endpoint: Some(endpoint.clone()),
            bucket: "no-such-bucket".to_owned(),
            region: "us-east-1".to_owned(),
            prefix: String::new(),
            allow_http: true,
        },
        [
            ("AWS_ACCESS_KEY_ID".to_owned(), "test-key".to_owned()),
            ("AWS_SECRET_ACCESS_KEY".to_owned(), "test-secret".to_owned()),
        ],
    )
    .unwrap();
    let err = missing.put(&path, vec![1]).await.unwrap_err();
    assert!(err.to_string().contains("no-such-bucket"), "{err}");
    server.stop();
}

#[test]
fn fastavro_reads_capture_files() {
    let Some(venv) = python_deps() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("capture.avro");
    std::fs::write(&file, encode_file(&sample_events()).unwrap()).unwrap();
    // fastavro gives bytes as Python bytes, which JSON cannot hold: written as hex.
    let script = r#"
import json, sys, fastavro
with open(sys.argv[1], "rb") as f:
    reader = fastavro.reader(f)
    out = {"codec": reader.codec, "schema": reader.writer_schema, "records": list(reader)}
print(json.dumps(out, default=lambda b: {"hex": b.hex()}))
"#;
    let output = Command::new(venv.join("bin/python"))
        .arg("-c")
        .arg(script)
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "fastavro failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let read: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    println!("fastavro read: {read}");

    assert_eq!(read["codec"], "deflate");
    let schema = &read["schema"];
    assert_eq!(schema["name"], "Microsoft.ServiceBus.Messaging.EventData");
    let fields: Vec<(&str, &serde_json::Value)> = schema["fields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|field| (field["name"].as_str().unwrap(), &field["type"]))
        .collect();
    assert_eq!(
        fields,
        [
            ("SequenceNumber", &json!("long")),
            ("Offset", &json!("string")),
            ("EnqueuedTimeUtc", &json!("string")),
            (
                "SystemProperties",
                &json!({"type": "map", "values": ["long", "double", "string", "bytes"]})
            ),
            (
                "Properties",
                &json!({"type": "map", "values": ["long", "double", "string", "bytes", "null"]})
            ),
            ("Body", &json!(["null", "bytes"])),
        ]
    );

    let records = read["records"].as_array().unwrap();
    assert_eq!(records.len(), 2);
    assert_eq!(
        records[0],
        json!({
            "SequenceNumber": 7,
            "Offset": "1024",
            "EnqueuedTimeUtc": "1/27/2019 11:04:48 PM",
            "SystemProperties": {
                "x-opt-sequence-number": 7,
                "x-opt-offset": "1024",
                "x-opt-enqueued-time": ENQUEUED_MS,
                "x-opt-partition-key": "device-7",
            },
            "Properties": {
                "s": "text",
                "i": -42,
                "d": 2.5,
                "t": "true",
                "f": "false",
                "b": {"hex": "00ff"},
                "at": ENQUEUED_MS,
            },
            "Body": {"hex": "68656c6c6f"},
        })
    );
    assert_eq!(
        records[1],
        json!({
            "SequenceNumber": 8,
            "Offset": "1100",
            "EnqueuedTimeUtc": "1/27/2019 11:04:49 PM",
            "SystemProperties": {
                "x-opt-sequence-number": 8,
                "x-opt-offset": "1100",
                "x-opt-enqueued-time": ENQUEUED_MS + 1000,
            },
            "Properties": {},
            "Body": {"hex": ""},
        })
    );
}

/// An event with a key and every property type, then one with neither and an empty body.
fn sample_events() -> Vec<ReadEvent> {
    vec![
        ReadEvent {
            sequence: 7,
            offset: 1024,
            enqueued_time_ms: ENQUEUED_MS,
            record: EventRecord {
                partition_key: Some("device-7".to_owned()),
                properties: vec![
                    ("s".to_owned(), Property::String("text".to_owned())),
                    ("i".to_owned(), Property::Int64(-42)),
                    ("d".to_owned(), Property::Double(2.5)),
                    ("t".to_owned(), Property::Bool(true)),
                    ("f".to_owned(), Property::Bool(false)),
                    (
                        "b".to_owned(),
                        Property::Bytes(Bytes::from_static(&[0, 255])),
                    ),
                    ("at".to_owned(), Property::TimestampMs(ENQUEUED_MS)),
                ],
                body: Bytes::from_static(b"hello"),
            },
        },
        ReadEvent {
            sequence: 8,
            offset: 1100,
            enqueued_time_ms: ENQUEUED_MS + 1000,
            record: EventRecord {
                partition_key: None,
                properties: vec![],
                body: Bytes::new(),
            },
        },
    ]
}
