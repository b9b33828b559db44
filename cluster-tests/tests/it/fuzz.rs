//! Fuzzing a running node: every gRPC method of every service on the client and peer ports
//! gets request bodies that are random bytes, random protobuf (fields of every wire type
//! with plausible values: the node's own names, numbers at the edges, nested messages) and
//! truncations of those; the Kafka port gets logged-in requests of every served API with
//! random bodies; every port (client, peer, HTTP, AMQP, Blob, Kafka) gets raw garbage, truncated HTTP/2
//! and idle connections. The node must answer each call with a status (never a crash: no
//! panic in its log, the process alive) and afterwards still serve: a hub created and read
//! back, `/healthz` answering.
//!
//! The node checks shared access signatures: most calls carry a valid token (so the fuzzed
//! bodies reach the handlers), the others a garbage token or none (so token parsing is
//! fuzzed on a live node too).
//!
//! The method list is read from the `.proto` files, so a new RPC is fuzzed without a change
//! here. `TRIBUTARY_FUZZ_SECONDS` sets the time spent (default 20); `scripts/fuzz` runs it
//! for longer. `TRIBUTARY_TEST_SEED` replays a run.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Instant;
use tonic::transport::Channel;
use tributary_client::{
    Client, ConnectOptions, ConnectionString, EventData, EventPosition, SendTarget,
};
use tributary_cluster_tests::{
    NodeProcess, RawCodec, TestDir, http_get, put_varint, root_connection_string, test_seed,
};

/// One gRPC method: its path and whether the server streams replies.
#[derive(Debug, Clone)]
struct Method {
    path: String,
    server_streaming: bool,
}

/// Every RPC declared in `file`, as `/<package>.<Service>/<Rpc>`.
fn methods_of(file: &Path) -> Vec<Method> {
    let text = std::fs::read_to_string(file).expect("the proto file is readable");
    let mut package = String::new();
    let mut service = String::new();
    let mut methods = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("package ") {
            package = rest.trim_end_matches(';').trim().to_owned();
        } else if let Some(rest) = line.strip_prefix("service ") {
            service = rest.trim_end_matches('{').trim().to_owned();
        } else if let Some(rest) = line.strip_prefix("rpc ") {
            let name = rest.split('(').next().unwrap().trim();
            let returns = rest.split("returns").nth(1).unwrap_or_default();
            methods.push(Method {
                path: format!("/{package}.{service}/{name}"),
                server_streaming: returns.contains("stream "),
            });
        }
    }
    assert!(!methods.is_empty(), "no rpc found in {}", file.display());
    methods
}

fn proto_file(relative: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../proto/proto")
        .join(relative)
}

/// Values that reach the node's code paths: names that exist, names at and past the limits,
/// and text that is not a name.
const STRINGS: &[&str] = &[
    "fuzz",
    "0",
    "1",
    "$Default",
    "-1",
    "",
    "@latest",
    "99999999999999999999",
    "../../etc",
    "fuzz/partitions/0",
    "SharedAccessSignature sr=a&sig=b&se=1&skn=c",
];

fn random_string(rng: &mut StdRng) -> Vec<u8> {
    match rng.random_range(0..4) {
        0 | 1 => STRINGS[rng.random_range(0..STRINGS.len())]
            .as_bytes()
            .to_vec(),
        2 => "x".repeat(rng.random_range(250..300)).into_bytes(),
        _ => random_bytes(rng, 64),
    }
}

fn random_bytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let len = rng.random_range(0..=max);
    (0..len).map(|_| rng.random()).collect()
}

/// Numbers at the edges: zero, small, negative (as protobuf writes them), the largest.
fn random_number(rng: &mut StdRng) -> u64 {
    match rng.random_range(0..6) {
        0 => 0,
        1 => rng.random_range(1..10),
        2 => u64::MAX,
        3 => (-1i64) as u64,
        4 => u64::from(u32::MAX),
        _ => rng.random(),
    }
}

/// A random protobuf message: fields 1..=20 of every wire type, nested up to `depth`.
fn random_message(rng: &mut StdRng, depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..rng.random_range(0..8) {
        let field = rng.random_range(1u64..=20);
        match rng.random_range(0..5) {
            0 => {
                put_varint(&mut out, field << 3);
                put_varint(&mut out, random_number(rng));
            }
            1 => {
                put_varint(&mut out, (field << 3) | 1);
                out.extend_from_slice(&random_number(rng).to_le_bytes());
            }
            2 => {
                put_varint(&mut out, (field << 3) | 5);
                out.extend_from_slice(&(random_number(rng) as u32).to_le_bytes());
            }
            3 if depth > 0 => {
                let nested = random_message(rng, depth - 1);
                put_varint(&mut out, (field << 3) | 2);
                put_varint(&mut out, nested.len() as u64);
                out.extend_from_slice(&nested);
            }
            _ => {
                let value = random_string(rng);
                put_varint(&mut out, (field << 3) | 2);
                // Now and then a length that lies.
                let len = if rng.random_ratio(1, 20) {
                    random_number(rng)
                } else {
                    value.len() as u64
                };
                put_varint(&mut out, len);
                out.extend_from_slice(&value);
            }
        }
    }
    out
}

fn random_body(rng: &mut StdRng) -> Bytes {
    let mut body = match rng.random_range(0..3) {
        0 => random_bytes(rng, 512),
        _ => random_message(rng, 3),
    };
    if rng.random_ratio(1, 5) && !body.is_empty() {
        body.truncate(rng.random_range(0..body.len()));
    }
    Bytes::from(body)
}

/// Calls `method` with `body` (and `token` as its authorization); what the node answered,
/// or `None` when the call neither failed nor finished in time (a stream waiting for
/// events).
async fn call(
    channel: &Channel,
    method: &Method,
    body: Bytes,
    token: Option<&str>,
) -> Option<Result<(), tonic::Status>> {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    let path = tonic::codegen::http::uri::PathAndQuery::from_str(&method.path).unwrap();
    let exchange = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let mut request = tonic::Request::new(body);
        if let Some(value) = token.and_then(|t| t.parse().ok()) {
            request.metadata_mut().insert("authorization", value);
        }
        let mut replies = grpc
            .server_streaming(request, path, RawCodec)
            .await?
            .into_inner();
        // A stream's first reply (or its end) is enough.
        match replies.next().await {
            Some(Err(status)) => Err(status),
            _ => Ok(()),
        }
    };
    let patience = if method.server_streaming {
        Duration::from_millis(300)
    } else {
        Duration::from_secs(10)
    };
    tokio::time::timeout(patience, exchange).await.ok()
}

/// The token a call carries: mostly the valid one, sometimes garbage (random text, a
/// token's shape with random parts, one byte changed), sometimes none.
fn random_token(rng: &mut StdRng, valid: &str) -> Option<String> {
    match rng.random_range(0..10) {
        0 => None,
        1 => Some(
            String::from_utf8_lossy(&random_bytes(rng, 200))
                .chars()
                .filter(|c| !c.is_control())
                .collect(),
        ),
        2 => {
            let part = |rng: &mut StdRng| String::from_utf8_lossy(&random_string(rng)).into_owned();
            Some(format!(
                "SharedAccessSignature sr={}&sig={}&se={}&skn={}",
                part(rng),
                part(rng),
                random_number(rng),
                part(rng)
            ))
        }
        3 => {
            let mut bytes = valid.as_bytes().to_vec();
            let at = rng.random_range(0..bytes.len());
            bytes[at] = rng.random_range(b' '..=b'~');
            Some(String::from_utf8(bytes).unwrap())
        }
        _ => Some(valid.to_owned()),
    }
}

/// Raw bytes to a TCP port: garbage, HTTP/2's preface followed by garbage frames, or a
/// connection opened and left idle for a while.
async fn garbage_to_port(rng: &mut StdRng, port: u16) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    let mut payload = Vec::new();
    match rng.random_range(0..4) {
        0 => payload = random_bytes(rng, 64 * 1024),
        1 => {
            payload.extend_from_slice(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
            payload.extend(random_bytes(rng, 4096));
        }
        2 => payload.extend_from_slice(
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\nabc",
        ),
        _ => {}
    }
    let _ = stream.write_all(&payload).await;
    let mut sink = [0u8; 4096];
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        while let Ok(n) = stream.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

/// One Kafka request frame: length, header (API key, version, correlation id, client id;
/// the tagged-field byte of flexible headers when `flexible`), body.
fn kafka_frame(api: i16, version: i16, flexible: bool, body: &[u8]) -> Vec<u8> {
    let mut frame = Vec::new();
    frame.extend_from_slice(&api.to_be_bytes());
    frame.extend_from_slice(&version.to_be_bytes());
    frame.extend_from_slice(&7i32.to_be_bytes());
    frame.extend_from_slice(&4i16.to_be_bytes());
    frame.extend_from_slice(b"fuzz");
    if flexible {
        frame.push(0);
    }
    frame.extend_from_slice(body);
    let mut out = (frame.len() as i32).to_be_bytes().to_vec();
    out.extend(frame);
    out
}

/// Reads one Kafka response frame (or gives up after a moment).
async fn kafka_answer(stream: &mut TcpStream) -> Option<Vec<u8>> {
    tokio::time::timeout(Duration::from_secs(5), async {
        let mut len = [0u8; 4];
        stream.read_exact(&mut len).await.ok()?;
        let mut body = vec![0u8; usize::try_from(i32::from_be_bytes(len)).ok()?.min(1 << 24)];
        stream.read_exact(&mut body).await.ok()?;
        Some(body)
    })
    .await
    .ok()
    .flatten()
}

/// Kafka requests with random bodies, after logging in (SASL PLAIN with the root
/// connection string) so they reach every served API's decoder: the connection may be
/// closed, the node must go on.
async fn garbage_to_kafka(rng: &mut StdRng, port: u16, connection_string: &str) {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)).await else {
        return;
    };
    // SaslHandshake v1 (PLAIN), then SaslAuthenticate v0 with `\0user\0password`.
    let _ = stream
        .write_all(&kafka_frame(17, 1, false, b"\x00\x05PLAIN"))
        .await;
    if kafka_answer(&mut stream).await.is_none() {
        return;
    }
    let login = format!("\0$ConnectionString\0{connection_string}");
    let mut body = (login.len() as i32).to_be_bytes().to_vec();
    body.extend_from_slice(login.as_bytes());
    let _ = stream.write_all(&kafka_frame(36, 0, false, &body)).await;
    let Some(answer) = kafka_answer(&mut stream).await else {
        return;
    };
    // Correlation id, then the error code: the fuzzed requests must get past the login.
    assert_eq!(
        answer.get(4..6),
        Some(&[0u8, 0][..]),
        "the fuzzer's Kafka login was refused"
    );
    // Produce, Fetch, ListOffsets, Metadata, the group APIs, ApiVersions, InitProducerId,
    // DescribeConfigs, CreateTopics (and a few not served), at versions in and out of range.
    const APIS: [i16; 17] = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 19, 22, 32];
    for _ in 0..rng.random_range(1..8) {
        let api = APIS[rng.random_range(0..APIS.len())];
        let version = rng.random_range(0..14);
        let body = random_bytes(rng, 2048);
        let frame = kafka_frame(api, version, rng.random_bool(0.5), &body);
        if stream.write_all(&frame).await.is_err() || kafka_answer(&mut stream).await.is_none() {
            return;
        }
    }
}

/// The node serves normally: a hub is created, events sent are read back, `/healthz`
/// answers.
async fn assert_serves(node: &NodeProcess, client: &Client, hub: &str) {
    client.create_event_hub(hub, 2, None).await.unwrap();
    let bodies: Vec<String> = (0..10).map(|i| format!("after-fuzz-{i}")).collect();
    client
        .producer()
        .send(
            hub,
            SendTarget::PartitionId("1".into()),
            bodies.iter().map(|b| EventData::from_body(b.clone())),
        )
        .await
        .unwrap();
    let mut stream = client
        .consumer()
        .receive(hub, "", "1", EventPosition::Earliest, 0)
        .await
        .unwrap();
    let mut read = Vec::new();
    while read.len() < bodies.len() {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("events arrive")
            .expect("stream open")
            .unwrap();
        read.extend(
            batch
                .iter()
                .map(|e| String::from_utf8_lossy(&e.body).into_owned()),
        );
    }
    assert_eq!(read, bodies);
    let health = http_get(node.http_addr(), "/healthz").await.unwrap();
    assert_eq!(health.status, 200, "/healthz: {}", health.body);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_on_every_port_and_method_never_stops_the_node() {
    let seed = test_seed("fuzz");
    let budget = Duration::from_secs(
        std::env::var("TRIBUTARY_FUZZ_SECONDS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(20),
    );
    let dir = TestDir::new("fuzz");
    let data_dir = dir.path().join("node");
    let mut node = NodeProcess::start_with_args(&data_dir, &["--auth", "sas"]).await;
    let root = root_connection_string(&data_dir).await;
    let client = Client::from_connection_string_with(
        &root,
        ConnectOptions {
            endpoint: Some(node.endpoint()),
            ..ConnectOptions::default()
        },
    )
    .await
    .unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let parsed = ConnectionString::parse(&root).unwrap();
    let token = parsed.token_for(&parsed.resource_uri(None), 3600, now);
    // A hub the fuzzed names hit.
    client.create_event_hub("fuzz", 2, None).await.unwrap();
    client
        .producer()
        .send(
            "fuzz",
            SendTarget::PartitionId("0".into()),
            [EventData::from_body("before")],
        )
        .await
        .unwrap();

    let mut client_methods = methods_of(&proto_file("tributary/v1/tributary.proto"));
    let peer_methods = methods_of(&proto_file("tributary/peer/v1/peer.proto"));
    client_methods.sort_by(|a, b| a.path.cmp(&b.path));
    let client_channel = Channel::from_shared(node.endpoint())
        .unwrap()
        .connect_lazy();
    let ports = node.ports();
    let peer_port = ports.peer;
    let peer_channel = Channel::from_shared(format!("http://127.0.0.1:{peer_port}"))
        .unwrap()
        .connect_lazy();
    let kafka_port = ports.kafka;
    let ports = [
        ports.client,
        ports.peer,
        ports.http,
        ports.amqp,
        ports.blob,
        ports.kafka,
    ];

    let mut rng = StdRng::seed_from_u64(seed);
    let started = Instant::now();
    let (mut calls, mut answered, mut raw) = (0u64, 0u64, 0u64);
    let mut codes = std::collections::BTreeMap::<String, u64>::new();
    let mut internal = Vec::new();
    while started.elapsed() < budget {
        if rng.random_ratio(1, 10) {
            let port = ports[rng.random_range(0..ports.len())];
            garbage_to_port(&mut rng, port).await;
            raw += 1;
            continue;
        }
        if rng.random_ratio(1, 10) {
            garbage_to_kafka(&mut rng, kafka_port, &root).await;
            raw += 1;
            continue;
        }
        // Peer methods get only random bytes and random protobuf: a fuzzer that forged a
        // well-formed Raft message could legitimately change the node's state (mutual TLS
        // keeps strangers off that port).
        let (channel, method) = if rng.random_ratio(1, 4) {
            (
                &peer_channel,
                &peer_methods[rng.random_range(0..peer_methods.len())],
            )
        } else {
            (
                &client_channel,
                &client_methods[rng.random_range(0..client_methods.len())],
            )
        };
        calls += 1;
        let body = random_body(&mut rng);
        let token = random_token(&mut rng, &token);
        if let Some(outcome) = call(channel, method, body, token.as_deref()).await {
            answered += 1;
            let code = match outcome {
                Ok(()) => "ok".to_owned(),
                Err(status) if status.code() == tonic::Code::Internal => {
                    internal.push(format!("{}: {}", method.path, status.message()));
                    "Internal".to_owned()
                }
                Err(status) => format!("{:?}", status.code()),
            };
            *codes.entry(code).or_default() += 1;
        }
        node.assert_running();
    }
    println!(
        "fuzz: {calls} calls ({answered} answered in time: {codes:?}), {raw} raw connections \
         in {:?}",
        started.elapsed()
    );
    // tonic answers a body that is not the method's message with INTERNAL ("failed to
    // decode Protobuf message: ..."); any other internal error is the node failing on input.
    internal.retain(|message| !message.contains("failed to decode Protobuf message"));
    internal.sort();
    internal.dedup();
    assert!(
        internal.is_empty(),
        "internal errors on fuzzed input (seed {seed}):\n{}",
        internal.join("\n")
    );
    node.assert_running();
    assert!(calls > 100, "only {calls} calls in {budget:?}");
    let log = std::fs::read_to_string(node.log_path()).unwrap();
    assert!(
        !log.contains("panicked"),
        "the node panicked while fuzzed (seed {seed}):\n{}",
        log.lines()
            .filter(|l| l.contains("panicked"))
            .take(5)
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_serves(&node, &client, "after-fuzz").await;
    node.assert_running();
}
