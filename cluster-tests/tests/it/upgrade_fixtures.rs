//! Upgrades: the current build opens data directories written by the release before it.
//!
//! `cluster-tests/fixtures/release-0.1.0/` holds the data directories of a three-node
//! cluster written by release 0.1.0 (hubs: plain, cut by retention, compacted, captured;
//! consumer groups with checkpoints and ownership records; authorization rules) and what
//! that release's CLI reported about them (`expected.json`); `scripts/compat-fixtures`
//! regenerates it. This test starts the current binary as the same three nodes on a copy of
//! them and finds everything as the release reported it, comparing the JSON fields the
//! release printed (a newer CLI may print more). Then new events go after the old ones,
//! with the old keys still hashing to the old partitions, the old rules' keys still sign
//! tokens, an ownership claim goes on from the old etag, and Capture goes on from where it
//! stopped.
//!
//! The events were enqueued in 2099 (the fixture was made on a fake clock), so no retention
//! removes them while the test runs. The nodes run on the fixture's fixed ports (27410 to
//! 27432, the addresses the cluster's state records): two runs of this test at once, or one
//! beside `scripts/compat-fixtures`, collide.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use tributary_client::checkpoints::Claim;
use tributary_client::{CheckpointStore, Client, ConnectOptions, Transport, rfc3339_millis};
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{
    NodePorts, NodeProcess, TestDir, cli, cli_ok, describe_output, eventually, workspace_dir,
};

const FIXTURE: &str = "cluster-tests/fixtures/release-0.1.0";
/// How long the cluster may take to elect every partition's leader after starting.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// How long Capture may take to write the windows the new events close.
const CAPTURE_TIMEOUT: Duration = Duration::from_secs(60);
/// Body bytes of each event sent to the captured hub: two of them exceed its 4096-byte
/// window, so each closes a window by size.
const CAPTURED_BODY_BYTES: usize = 3000;

/// The fixture's description of how its nodes ran (`settings.json`).
struct Settings {
    root_connection_string: String,
    nodes: Vec<(u64, NodePorts)>,
    serve_flags: Vec<String>,
    root_key: String,
    capture_namespace: String,
}

impl Settings {
    fn read(fixture: &Path) -> Settings {
        let settings = read_json(&fixture.join("settings.json"));
        let text = |v: &Value| v.as_str().expect("a string").to_owned();
        let port = |v: &Value| u16::try_from(v.as_u64().expect("a port")).expect("a port");
        let nodes: Vec<(u64, NodePorts)> = settings["nodes"]
            .as_array()
            .expect("nodes")
            .iter()
            .map(|n| {
                let ports = NodePorts {
                    client: port(&n["client"]),
                    http: port(&n["http"]),
                    peer: port(&n["peer"]),
                    amqp: tributary_cluster_tests::free_port(),
                    amqps: tributary_cluster_tests::free_port(),
                    blob: tributary_cluster_tests::free_port(),
                    kafka: tributary_cluster_tests::free_port(),
                    kafka_tls: tributary_cluster_tests::free_port(),
                };
                (n["node_id"].as_u64().expect("a node id"), ports)
            })
            .collect();
        let root_key = text(&settings["root_key"]);
        Settings {
            root_connection_string: connection_string(
                nodes[0].1.client,
                &text(&settings["root_rule"]),
                &root_key,
                None,
            ),
            serve_flags: settings["serve_flags"]
                .as_array()
                .expect("serve flags")
                .iter()
                .map(text)
                .collect(),
            nodes,
            root_key,
            capture_namespace: text(&settings["capture_namespace"]),
        }
    }
}

/// The three nodes of the fixture's cluster, running the current build.
struct Cluster {
    nodes: Vec<NodeProcess>,
    endpoint: String,
    root: String,
}

impl Cluster {
    /// Starts every node on its data directory under `dir`, with the fixture's ids, ports
    /// and flags, and waits until each is ready and every partition has a leader.
    async fn start(dir: &Path, settings: &Settings) -> Cluster {
        for (_, ports) in &settings.nodes {
            for port in [ports.client, ports.peer, ports.http] {
                assert!(
                    TcpListener::bind(("127.0.0.1", port)).is_ok(),
                    "port {port} is taken: is another run of this test, or \
                     scripts/compat-fixtures, going on?"
                );
            }
        }
        let seeds = settings
            .nodes
            .iter()
            .map(|(_, ports)| format!("127.0.0.1:{}", ports.peer))
            .collect::<Vec<_>>()
            .join(",");
        let mut nodes = Vec::new();
        for (id, ports) in &settings.nodes {
            let mut args = vec![
                "--node-id".to_owned(),
                id.to_string(),
                "--seeds".to_owned(),
                seeds.clone(),
            ];
            args.extend(settings.serve_flags.iter().cloned());
            nodes.push(NodeProcess::launch_with_env(
                &dir.join(format!("node-{id}")),
                *ports,
                &args,
                &[("TRIBUTARY_ROOT_KEY", settings.root_key.as_str())],
            ));
        }
        for node in &mut nodes {
            node.wait_ready().await;
        }
        let cluster = Cluster {
            endpoint: nodes[0].endpoint(),
            nodes,
            root: settings.root_connection_string.clone(),
        };
        cluster.wait_for_leaders().await;
        cluster
    }

    async fn wait_for_leaders(&self) {
        eventually(
            SETTLE_TIMEOUT,
            "every node up, every partition led",
            async || {
                let output = cli(
                    &self.endpoint,
                    &[
                        "--connection-string",
                        &self.root,
                        "--output",
                        "json",
                        "cluster",
                        "status",
                    ],
                )
                .await;
                if !output.status.success() {
                    return Err(describe_output(&output));
                }
                let status: Value = serde_json::from_slice(&output.stdout).expect("JSON");
                let unled: Vec<String> = status["partitions"]
                    .as_array()
                    .expect("partitions")
                    .iter()
                    .filter(|p| p["leader"].is_null())
                    .map(|p| format!("{}/{}", p["event_hub"], p["partition_id"]))
                    .collect();
                let down: Vec<&Value> = status["nodes"]
                    .as_array()
                    .expect("nodes")
                    .iter()
                    .filter(|n| n["up"] != Value::Bool(true))
                    .map(|n| &n["node_id"])
                    .collect();
                if unled.is_empty() && down.is_empty() && status["controller_leader"].is_u64() {
                    Ok(())
                } else {
                    Err(format!(
                        "partitions without a leader {unled:?}, nodes down {down:?}"
                    ))
                }
            },
        )
        .await;
    }

    /// Runs the CLI as the root rule; panics unless it succeeds.
    async fn cli(&self, args: &[&str]) -> String {
        let mut all = vec!["--connection-string", self.root.as_str()];
        all.extend_from_slice(args);
        cli_ok(&self.endpoint, &all).await
    }

    /// Runs the CLI as the root rule with `--output json`, and parses what it prints.
    async fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let text = self.cli(&all).await;
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{args:?} printed {text}: {e}"))
    }

    /// `count` events of a partition from its first retained one, as `receive` prints them.
    async fn events(&self, hub: &str, partition: &str, count: usize) -> Vec<Value> {
        if count == 0 {
            return Vec::new();
        }
        let text = self
            .cli(&[
                "--output",
                "json",
                "receive",
                hub,
                "--partition",
                partition,
                "--from",
                "earliest",
                "--count",
                &count.to_string(),
                "--timeout",
                "10s",
            ])
            .await;
        text.lines()
            .map(|line| serde_json::from_str(line).expect("one JSON event per line"))
            .collect()
    }

    /// An SDK client signed in as `connection_string`'s rule, talking to node 1.
    async fn client(&self, connection_string: &str) -> Client {
        Client::from_connection_string_with(
            connection_string,
            ConnectOptions {
                transport: Transport::Plaintext,
                endpoint: Some(self.endpoint.clone()),
                ..ConnectOptions::default()
            },
        )
        .await
        .expect("the connection string is valid")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_current_build_reads_what_release_0_1_0_wrote() {
    let fixture = workspace_dir().join(FIXTURE);
    let settings = Settings::read(&fixture);
    let expected = read_json(&fixture.join("expected.json"));
    check_fixture(&expected);
    let dir = TestDir::new("upgrade-fixtures");
    extract(&fixture.join("cluster.tar.gz"), dir.path());
    let mut cluster = Cluster::start(dir.path(), &settings).await;

    check_nodes(&cluster, &expected).await;
    check_hubs_and_events(&cluster, &expected).await;
    check_groups(&cluster, &expected).await;
    check_rules(&cluster, &expected).await;
    check_new_events(&cluster, &expected).await;
    check_capture_goes_on(&cluster, &expected, &settings, dir.path()).await;

    for node in &mut cluster.nodes {
        let status = node.terminate().await;
        assert!(status.success(), "a node stopped with {status}");
    }
}

/// The fixture holds what this test relies on: a retention cut, a compaction, checkpoints,
/// owners and a captured window (a regenerated fixture must keep them).
fn check_fixture(expected: &Value) {
    let expiring = &expected["hubs"]["expiring"]["partitions"][0];
    assert!(
        expiring["begin_sequence_number"].as_i64() > Some(0),
        "no retention cut in the fixture: {expiring}"
    );
    let prices = sequence_numbers(&expected["events"]["prices"]["1"]);
    assert!(
        prices.windows(2).any(|w| w[1] > w[0] + 1),
        "no compaction in the fixture: {prices:?}"
    );
    let analytics = &expected["group_show"]["orders"]["analytics"]["partitions"];
    let owned = analytics
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["owner_id"].as_str().is_some_and(|o| !o.is_empty()))
        .count();
    assert!(owned > 0, "no owned partitions in the fixture: {analytics}");
    assert!(
        !expected["capture_files"].as_array().unwrap().is_empty(),
        "no captured window in the fixture"
    );
}

async fn check_nodes(cluster: &Cluster, expected: &Value) {
    let status = cluster.json(&["cluster", "status"]).await;
    let mut nodes = status["nodes"].as_array().expect("nodes").clone();
    nodes.sort_by_key(|n| n["node_id"].as_u64());
    let nodes = Value::Array(nodes);
    assert_holds(&nodes, &expected["cluster_nodes"], "cluster status nodes");
}

/// Every hub with its settings and partitions, and every event of every partition.
async fn check_hubs_and_events(cluster: &Cluster, expected: &Value) {
    let hubs = cluster.json(&["hub", "list"]).await;
    assert_holds(&by_name(&hubs), &by_name(&expected["hub_list"]), "hub list");
    for (hub, shown) in expected["hubs"].as_object().unwrap() {
        let actual = cluster.json(&["hub", "show", hub]).await;
        assert_holds(&actual, shown, &format!("hub show {hub}"));
        for (partition, events) in expected["events"][hub].as_object().unwrap() {
            let count = events.as_array().unwrap().len();
            let actual = Value::Array(cluster.events(hub, partition, count).await);
            assert_holds(&actual, events, &format!("events of {hub}/{partition}"));
        }
    }
}

/// Every consumer group, its checkpoints and ownership records, through the CLI and
/// through the SDK's checkpoint store (what processors use); an owner's claim goes on from
/// the etag it held before the upgrade.
async fn check_groups(cluster: &Cluster, expected: &Value) {
    for (hub, groups) in expected["consumer_groups"].as_object().unwrap() {
        let actual = cluster.json(&["group", "list", hub]).await;
        assert_holds(
            &by_name(&actual),
            &by_name(groups),
            &format!("groups of {hub}"),
        );
        for (group, shown) in expected["group_show"][hub].as_object().unwrap() {
            let actual = cluster.json(&["group", "show", hub, group]).await;
            assert_holds(&actual, shown, &format!("group show {hub} {group}"));
        }
    }

    let client = cluster.client(&cluster.root).await;
    let store = client.checkpoint_store();
    let mut etags = BTreeSet::new();
    for (hub, groups) in expected["group_show"].as_object().unwrap() {
        for (group, shown) in groups.as_object().unwrap() {
            let ownership = store.list_ownership(hub, group).await.unwrap();
            etags.extend(ownership.iter().map(|o| o.etag.clone()));
            let checkpoints = store.list_checkpoints(hub, group).await.unwrap();
            for p in shown["partitions"].as_array().unwrap() {
                let id = p["partition_id"].as_str().unwrap();
                let what = format!("{hub}/{group}/{id}");
                let owned = ownership.iter().find(|o| o.partition_id == id);
                match p["owner_id"].as_str() {
                    Some(owner) => {
                        let owned = owned.unwrap_or_else(|| panic!("{what}: no ownership record"));
                        assert_eq!(owned.owner_id, owner, "{what}");
                        assert_eq!(
                            rfc3339_millis(owned.last_modified_ms).as_deref(),
                            p["last_modified"].as_str(),
                            "{what}"
                        );
                    }
                    // Never claimed, or released (`group show` shows no owner then).
                    None => assert!(
                        owned.is_none_or(|o| o.owner_id.is_empty()),
                        "{what}: {owned:?}"
                    ),
                }
                let checkpoint = checkpoints.get(id);
                assert_eq!(
                    checkpoint.map(|c| c.sequence_number),
                    p["checkpoint_sequence_number"].as_i64(),
                    "{what}"
                );
                assert_eq!(
                    checkpoint.map(|c| c.offset.to_string()).as_deref(),
                    p["checkpoint_offset"].as_str(),
                    "{what}"
                );
            }
        }
    }

    // The analytics processor was killed holding its partitions: it renews a claim with the
    // etag it last saw, and the new etag is none of the old ones (no etag handed out twice).
    let ownership = store.list_ownership("orders", "analytics").await.unwrap();
    let held = ownership
        .iter()
        .find(|o| !o.owner_id.is_empty())
        .expect("analytics owns partitions of orders");
    let claim = |etag: &str| Claim {
        partition_id: held.partition_id.clone(),
        owner_id: held.owner_id.clone(),
        etag: Some(etag.to_owned()),
    };
    let won = store
        .claim_ownership("orders", "analytics", vec![claim(&held.etag)])
        .await
        .unwrap();
    assert_eq!(won.len(), 1, "renewing with the old etag: {won:?}");
    assert!(
        !etags.contains(&won[0].etag),
        "the etag {} was handed out before the upgrade: {etags:?}",
        won[0].etag
    );
    let stale = store
        .claim_ownership("orders", "analytics", vec![claim(&held.etag)])
        .await
        .unwrap();
    assert!(stale.is_empty(), "a claim with a stale etag won: {stale:?}");
}

/// Every rule with its rights and keys.
async fn check_rules(cluster: &Cluster, expected: &Value) {
    let rules = &expected["rules"];
    let keys = &expected["rule_keys"];
    let actual = cluster.json(&["auth", "rule", "list"]).await;
    assert_holds(
        &by_name(&actual),
        &by_name(&rules["namespace"]),
        "namespace rules",
    );
    for (name, keys) in keys["namespace"].as_object().unwrap() {
        let actual = cluster.json(&["auth", "rule", "keys", name]).await;
        assert_holds(&actual, keys, &format!("keys of namespace rule {name}"));
    }
    for (hub, hub_rules) in rules.as_object().unwrap() {
        if hub == "namespace" {
            continue;
        }
        let actual = cluster.json(&["auth", "rule", "list", "--hub", hub]).await;
        assert_holds(
            &by_name(&actual),
            &by_name(hub_rules),
            &format!("rules of {hub}"),
        );
        for (name, keys) in keys[hub].as_object().unwrap() {
            let actual = cluster
                .json(&["auth", "rule", "keys", name, "--hub", hub])
                .await;
            assert_holds(&actual, keys, &format!("keys of rule {name} of {hub}"));
        }
    }
}

/// New events go after the old ones: sequence numbers follow on, offsets and enqueued times
/// grow, partition keys land where their old events are, and the old events stay as they
/// were. Sent as `orders`' `sender` rule with its current key; its key from before a
/// rotation is refused.
async fn check_new_events(cluster: &Cluster, expected: &Value) {
    let sender = &expected["rule_keys"]["orders"]["sender"];
    let retired = expected["retired_keys"]["orders/sender"].as_str().unwrap();
    let port = cluster.nodes[0].ports().client;
    let refused = cli(
        &cluster.endpoint,
        &[
            "--connection-string",
            &connection_string(port, "sender", retired, Some("orders")),
            "send",
            "orders",
            "--body",
            "signed with a rotated key",
        ],
    )
    .await;
    assert!(
        !refused.status.success(),
        "a token signed with a rotated-away key was taken: {}",
        describe_output(&refused)
    );

    let sends: [(&str, &str, &[&str]); 3] = [
        (
            "orders",
            sender["primary_connection_string"].as_str().unwrap(),
            &["--partition-key", "customer-0"],
        ),
        ("expiring", cluster.root.as_str(), &["--partition", "0"]),
        (
            "prices",
            cluster.root.as_str(),
            &["--partition-key", "AAPL"],
        ),
    ];
    for (hub, connection, target) in sends {
        let mut args = vec![
            "--connection-string",
            connection,
            "--output",
            "json",
            "send",
            hub,
            "--body",
            "after the upgrade",
        ];
        args.extend_from_slice(target);
        let sent: Value = serde_json::from_str(&cli_ok(&cluster.endpoint, &args).await).unwrap();
        let partition = sent["partition"].as_str().expect("one partition");
        let old = expected["events"][hub][partition].as_array().unwrap();
        let last = old.last().expect("the partition held events");
        if let Some(key) = target.get(1).filter(|_| target[0] == "--partition-key") {
            assert!(
                old.iter().any(|e| e["partition_key"] == *key),
                "key {key} of {hub} went to partition {partition}, where none of its events are"
            );
        }
        let what = format!("the event sent to {hub}/{partition}: {sent}");
        assert_eq!(
            sent["sequence_number"].as_i64(),
            Some(last["sequence_number"].as_i64().unwrap() + 1),
            "{what}"
        );
        assert!(offset(&sent) > offset(last), "{what}");
        assert!(
            sent["enqueued_time"].as_str() >= last["enqueued_time"].as_str(),
            "{what}"
        );
        let events = cluster.events(hub, partition, old.len() + 1).await;
        assert_holds(
            &Value::Array(events[..old.len()].to_vec()),
            &Value::Array(old.clone()),
            &format!("old events of {hub}/{partition} after a send"),
        );
        let new = &events[old.len()];
        assert_eq!(new["sequence_number"], sent["sequence_number"], "{new}");
        assert_eq!(new["body"], "after the upgrade", "{new}");
    }
}

/// The captured window stays captured: Capture, pointed at a directory of the test, writes
/// files only for the new events, named after the old window's.
async fn check_capture_goes_on(
    cluster: &Cluster,
    expected: &Value,
    settings: &Settings,
    dir: &Path,
) {
    let shown = &expected["hubs"]["captured"];
    let captured_through = shown["partitions"][0]["captured_through_sequence_number"]
        .as_i64()
        .unwrap();
    let last = shown["partitions"][0]["last_enqueued_sequence_number"]
        .as_i64()
        .unwrap();
    assert_eq!(captured_through, last, "the fixture captured every event");
    let capture_dir = dir.join("capture-after-upgrade");
    let destination = format!("file://{}", capture_dir.display());
    let window_ms = shown["capture_window_ms"].as_u64().unwrap();
    let window_bytes = shown["capture_window_bytes"].as_u64().unwrap().to_string();
    cluster
        .cli(&[
            "hub",
            "update",
            "captured",
            "--capture-destination",
            &destination,
            "--capture-window",
            &format!("{window_ms}ms"),
            "--capture-window-bytes",
            &window_bytes,
            "--capture-namespace",
            &settings.capture_namespace,
        ])
        .await;
    cluster
        .cli(&[
            "send",
            "captured",
            "--partition",
            "0",
            "--count",
            "3",
            "--size",
            &CAPTURED_BODY_BYTES.to_string(),
            "--batch-size",
            "1",
        ])
        .await;
    // The first two new events each fill a window; the third may wait for its window to
    // pass (it was enqueued in 2099, where the partition's clock stands).
    let through = eventually(
        CAPTURE_TIMEOUT,
        "two windows of new events captured",
        async || {
            let shown = cluster.json(&["hub", "show", "captured"]).await;
            let through = shown["partitions"][0]["captured_through_sequence_number"]
                .as_i64()
                .unwrap();
            if through >= last + 2 {
                Ok(through)
            } else {
                Err(format!("captured through {through}"))
            }
        },
    )
    .await;
    let old_files: Vec<String> = expected["capture_files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect();
    let new_files = files_under(&capture_dir);
    assert!(new_files.len() >= 2, "{new_files:?}");
    let newest_old = old_files.iter().max().unwrap();
    for file in &new_files {
        assert!(
            file > newest_old,
            "{file} is not after the old window's {newest_old}"
        );
    }
    // The old window's file, from the fixture, is unchanged by the upgrade (it lives outside
    // the data directories).
    assert_eq!(files_under(&dir.join("capture")), old_files);

    // With fastavro at hand: the new files hold exactly the new events, the old one exactly
    // the old ones.
    let Some(python) = python_deps() else { return };
    let new = captured_sequences(&python, &capture_dir);
    assert_eq!(new, (last + 1..=through).collect::<Vec<_>>());
    let old = captured_sequences(&python, &dir.join("capture"));
    assert_eq!(old, sequence_numbers(&expected["events"]["captured"]["0"]));
}

/// Fails unless `actual` holds everything `expected` holds: every field of an object
/// (more fields are fine), arrays of the same length item by item, other values equal.
#[track_caller]
fn assert_holds(actual: &Value, expected: &Value, what: &str) {
    if let Err(difference) = holds(actual, expected, what.to_owned()) {
        panic!("{difference}\n(release 0.1.0 reported: {expected})");
    }
}

fn holds(actual: &Value, expected: &Value, at: String) -> Result<(), String> {
    match (expected, actual) {
        (Value::Object(expected), Value::Object(actual)) => {
            for (field, value) in expected {
                let Some(got) = actual.get(field) else {
                    return Err(format!("{at}.{field}: missing"));
                };
                holds(got, value, format!("{at}.{field}"))?;
            }
            Ok(())
        }
        (Value::Array(expected), Value::Array(actual)) if expected.len() == actual.len() => {
            for (i, (value, got)) in expected.iter().zip(actual).enumerate() {
                holds(got, value, format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        _ if expected == actual => Ok(()),
        _ => Err(format!("{at}: {actual}, expected {expected}")),
    }
}

/// An array of objects sorted by their `name`, for lists whose order is not promised.
fn by_name(list: &Value) -> Value {
    let mut items = list.as_array().expect("a list").clone();
    items.sort_by(|a, b| a["name"].as_str().cmp(&b["name"].as_str()));
    Value::Array(items)
}

fn sequence_numbers(events: &Value) -> Vec<i64> {
    events
        .as_array()
        .expect("events")
        .iter()
        .map(|e| e["sequence_number"].as_i64().expect("a sequence number"))
        .collect()
}

fn offset(event: &Value) -> u64 {
    event["offset"]
        .as_str()
        .and_then(|o| o.parse().ok())
        .unwrap_or_else(|| panic!("an offset: {event}"))
}

fn connection_string(port: u16, rule: &str, key: &str, hub: Option<&str>) -> String {
    let hub = hub.map(|h| format!(";EntityPath={h}")).unwrap_or_default();
    format!("Endpoint=sb://127.0.0.1:{port}/;SharedAccessKeyName={rule};SharedAccessKey={key}{hub}")
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Unpacks the fixture's data directories (and capture files) into `dir`.
fn extract(archive: &Path, dir: &Path) {
    let output = Command::new("tar")
        .arg("-xzf")
        .arg(archive)
        .arg("-C")
        .arg(dir)
        .output()
        .expect("tar runs");
    assert!(
        output.status.success(),
        "cannot unpack {}: {}",
        archive.display(),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The files under `dir`, as sorted paths relative to it.
fn files_under(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, files: &mut Vec<String>) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries {
            let path: PathBuf = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(base, &path, files);
            } else {
                let relative = path.strip_prefix(base).expect("under the base");
                files.push(relative.to_string_lossy().into_owned());
            }
        }
    }
    let mut files = Vec::new();
    walk(dir, dir, &mut files);
    files.sort();
    files
}

/// The sequence numbers of every record in the capture files under `dir`, in order, read
/// by fastavro (`scripts/read_capture.py`).
fn captured_sequences(python: &Path, dir: &Path) -> Vec<i64> {
    let script = workspace_dir().join("cluster-tests/scripts/read_capture.py");
    let output = Command::new(python.join("bin/python"))
        .arg(script)
        .arg(dir)
        .output()
        .expect("python runs");
    assert!(
        output.status.success(),
        "read_capture.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let mut sequences: Vec<i64> = String::from_utf8(output.stdout)
        .expect("UTF-8")
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).expect("a JSON record");
            record["SequenceNumber"]
                .as_i64()
                .expect("a sequence number")
        })
        .collect();
    sequences.sort();
    sequences
}
