//! The released Blob checkpoint store of the Azure Event Hubs Python SDK
//! (azure-eventhub-checkpointstoreblob 1.2.0 with azure-eventhub 5.15.1, from
//! `scripts/python-test-deps`), unchanged, against three-node clusters' Blob checkpoint
//! endpoints: load-balancing processors sharing partitions and taking over from a dead one,
//! a Python processor beside the Rust `EventProcessor` (`tributary process`) in one consumer
//! group, racing claims, and refusals. `blob_checkpoints.py` runs each side; the assertions
//! are here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value as Json, json};
use tokio::io::{AsyncBufReadExt, AsyncRead};
use tributary_client::{CheckpointStore, Client, ConnectOptions, EventData, SendTarget};
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{
    LocalCluster, TestCa, TestDir, cli_ok, eventually, http_get, tributary_command,
};
use tributary_types::Rights;

const SCRIPT: &str = include_str!("blob_checkpoints.py");
const ROOT_RULE: &str = "RootManageSharedAccessKey";
/// Blob account keys are base64 (the SDK decodes them): so are the cluster's.
const ROOT_KEY: &str = "YmxvYi1jaGVja3BvaW50LXRlc3Qtcm9vdC1rZXktMDE=";
const WRONG_KEY: &str = "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktMDE=";
const HUB: &str = "orders";
const PARTITIONS: u32 = 8;
/// Balancing, checkpointing and taking over, with 1 s balancing rounds and 6 s ownership
/// expiry, on a loaded machine.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(120);
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(180);

struct BlobCluster {
    dir: TestDir,
    cluster: LocalCluster,
    venv: PathBuf,
    root: Client,
    ca: Option<PathBuf>,
}

impl BlobCluster {
    /// Three nodes with `--auth sas` and hub `orders` of 8 partitions; TLS on the client
    /// port (and so HTTPS on the Blob port) when `tls`.
    async fn start(name: &str, tls: bool) -> Option<BlobCluster> {
        let venv = python_deps()?;
        let dir = TestDir::new(name);
        let mut args = vec!["--auth".to_owned(), "sas".to_owned()];
        let ca = if tls {
            let ca = TestCa::new(dir.path(), "ca").await;
            args.extend(ca.node_cert("nodes", None).await.client_port_args());
            Some(ca.ca_pem())
        } else {
            None
        };
        let cluster = LocalCluster::start_with_args(
            dir.path(),
            3,
            &args,
            &[("TRIBUTARY_ROOT_KEY", ROOT_KEY)],
        )
        .await;
        let endpoint = if tls {
            cluster.nodes[0].tls_endpoint()
        } else {
            cluster.nodes[0].endpoint()
        };
        let root = Client::from_connection_string_with(
            &root_connection_string(),
            ConnectOptions {
                endpoint: Some(endpoint),
                ca_cert: ca.clone(),
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
        Some(BlobCluster {
            dir,
            cluster,
            venv,
            root,
            ca,
        })
    }

    fn settings(&self, scenario: &str, node: usize, extra: Json) -> Json {
        let node = &self.cluster.nodes[node];
        let mut settings = json!({
            "scenario": scenario,
            "hub": HUB,
            "group": "$Default",
            "rule": ROOT_RULE,
            "key": ROOT_KEY,
            "amqp_port": node.amqp_addr().port(),
            "blob_port": node.blob_addr().port(),
        });
        if let Some(ca) = &self.ca {
            settings["ca"] = json!(ca.to_str().unwrap());
        }
        for (k, v) in extra.as_object().unwrap() {
            settings[k] = v.clone();
        }
        settings
    }

    fn python(&self, name: &str, settings: Json) -> Lines {
        let stderr = self.dir.path().join(format!("{name}.stderr"));
        let mut command = tokio::process::Command::new(self.venv.join("bin/python"));
        command
            .args(["-c", SCRIPT, &settings.to_string()])
            .stderr(std::fs::File::create(&stderr).unwrap());
        Lines::spawn(name, command, stderr)
    }

    /// A Python load-balancing processor on `group`, through node `node`.
    fn python_processor(&self, name: &str, node: usize, group: &str) -> Lines {
        self.python(
            name,
            self.settings("processor", node, json!({ "group": group })),
        )
    }

    /// `tributary process` (the Rust `EventProcessor`) on `group`, through node `node`. Its
    /// events (stdout) and notices (stderr: partitions opened and closed, checkpoints) are
    /// collected together.
    fn rust_processor(&self, name: &str, node: usize, group: &str) -> Lines {
        let mut command = tributary_command();
        command
            .args(["--endpoint", &self.cluster.nodes[node].endpoint()])
            .args(["--connection-string", &root_connection_string()])
            .args(["process", HUB, "--group", group, "--instance-id", name])
            .args([
                "--load-balancing-interval",
                "1s",
                "--ownership-expiration",
                "6s",
            ])
            .args(["--checkpoint-every", "1", "--strategy", "balanced"])
            .args(["--output", "json"])
            .stderr(Stdio::piped());
        Lines::spawn(name, command, PathBuf::new())
    }

    /// Sends `count` events to every partition.
    async fn send_each(&self, count: usize) {
        for p in 0..PARTITIONS {
            let events = (0..count).map(|i| EventData::from_body(format!("p{p}-{i}")));
            self.root
                .producer()
                .send(HUB, SendTarget::PartitionId(p.to_string()), events)
                .await
                .unwrap();
        }
    }

    /// Owner id per partition, from the cluster's store (the gRPC API).
    async fn owners(&self, group: &str) -> Result<BTreeMap<u32, String>, String> {
        let records = self
            .root
            .checkpoint_store()
            .list_ownership(HUB, group)
            .await
            .map_err(|e| e.to_string())?;
        Ok(records
            .into_iter()
            .filter(|o| !o.owner_id.is_empty())
            .map(|o| (o.partition_id.parse().unwrap(), o.owner_id))
            .collect())
    }

    /// Waits until every partition's checkpoint (read through the gRPC API) is at `seq`.
    async fn await_checkpoints(&self, group: &str, seq: i64) {
        eventually(
            SETTLE_TIMEOUT,
            &format!("every checkpoint of '{group}' at sequence number {seq}"),
            async || {
                let checkpoints = self
                    .root
                    .checkpoint_store()
                    .list_checkpoints(HUB, group)
                    .await
                    .map_err(|e| e.to_string())?;
                let at: BTreeMap<String, i64> = checkpoints
                    .iter()
                    .map(|(p, c)| (p.clone(), c.sequence_number))
                    .collect();
                if at.len() == PARTITIONS as usize && at.values().all(|s| *s == seq) {
                    Ok(())
                } else {
                    Err(format!("checkpoints: {at:?}"))
                }
            },
        )
        .await;
    }
}

fn root_connection_string() -> String {
    format!("Endpoint=sb://127.0.0.1/;SharedAccessKeyName={ROOT_RULE};SharedAccessKey={ROOT_KEY}")
}

/// A child process's JSON stdout lines, collected as they come. Killed when dropped.
struct Lines {
    name: String,
    child: tokio::process::Child,
    lines: Arc<Mutex<Vec<Json>>>,
    stderr: PathBuf,
}

impl Lines {
    fn spawn(name: &str, mut command: tokio::process::Command, stderr: PathBuf) -> Lines {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        tokio::spawn(collect(child.stdout.take().unwrap(), lines.clone()));
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(collect(stderr, lines.clone()));
        }
        Lines {
            name: name.to_owned(),
            child,
            lines,
            stderr,
        }
    }

    fn lines(&self) -> Vec<Json> {
        self.lines.lock().unwrap().clone()
    }

    /// Partitions opened and not closed since.
    fn open_partitions(&self) -> BTreeSet<u32> {
        let mut open = BTreeSet::new();
        for line in self.lines() {
            if let Some(p) = partition_of(&line["opened"]) {
                open.insert(p);
            }
            if let Some(p) = partition_of(&line["closed"]) {
                open.remove(&p);
            }
        }
        open
    }

    /// The events processed after line `from`, per partition: their sequence numbers in
    /// the order processed.
    fn events_after(&self, from: usize) -> BTreeMap<u32, Vec<i64>> {
        let mut events: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
        for line in self.lines().into_iter().skip(from) {
            // Python's lines: {"event": {"p", "seq"}}; `tributary process --output json`'s
            // events carry partition and sequence_number at the top.
            let (p, seq) = if let Some(event) = line.get("event") {
                (event["p"].as_u64(), event["seq"].as_i64())
            } else if line.get("body").is_some() {
                (
                    line["partition"].as_str().and_then(|p| p.parse().ok()),
                    line["sequence_number"].as_i64(),
                )
            } else {
                continue;
            };
            events
                .entry(u32::try_from(p.unwrap()).unwrap())
                .or_default()
                .push(seq.unwrap());
        }
        events
    }

    fn stderr_tail(&self) -> String {
        if self.stderr.as_os_str().is_empty() {
            return "(collected with stdout)".to_owned();
        }
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let tail: Vec<&str> = text.lines().rev().take(30).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    async fn kill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// The summary line of a scenario that ends by itself.
    async fn summary(&mut self) -> Json {
        let ended = tokio::time::timeout(SCRIPT_TIMEOUT, self.child.wait()).await;
        let lines = self.lines();
        match lines.iter().find_map(|l| l.get("summary")) {
            Some(summary) if ended.is_ok() => summary.clone(),
            _ => panic!(
                "{} ended ({ended:?}) without a summary; stdout {lines:?}; stderr:\n{}",
                self.name,
                self.stderr_tail()
            ),
        }
    }
}

fn partition_of(value: &Json) -> Option<u32> {
    value
        .as_u64()
        .map(|p| u32::try_from(p).unwrap())
        .or_else(|| value.as_str().and_then(|p| p.parse().ok()))
}

async fn collect(stdout: impl AsyncRead + Unpin, lines: Arc<Mutex<Vec<Json>>>) {
    let mut reader = tokio::io::BufReader::new(stdout).lines();
    while let Ok(Some(line)) = reader.next_line().await {
        if let Ok(value) = serde_json::from_str::<Json>(&line) {
            lines.lock().unwrap().push(value);
        }
    }
}

/// Waits until the store's ownership splits the partitions `per_owner` each between
/// exactly `processors`, and each process has open exactly the partitions the store says it
/// owns. Returns each processor's owner id.
async fn await_balance(env: &BlobCluster, group: &str, processors: &[&Lines]) -> Vec<String> {
    let per_owner = PARTITIONS as usize / processors.len();
    eventually(
        SETTLE_TIMEOUT,
        &format!("{PARTITIONS} partitions of '{group}' settled {per_owner} per processor"),
        async || {
            let owners = env.owners(group).await?;
            let mut by_owner: BTreeMap<String, BTreeSet<u32>> = BTreeMap::new();
            for (p, owner) in &owners {
                by_owner.entry(owner.clone()).or_default().insert(*p);
            }
            let mut ids = Vec::new();
            for process in processors {
                let open = process.open_partitions();
                let id = by_owner
                    .iter()
                    .find(|(_, ps)| **ps == open && ps.len() == per_owner)
                    .map(|(id, _)| id.clone())
                    .ok_or_else(|| {
                        format!(
                            "{} has open {open:?}; the store's owners: {by_owner:?}",
                            process.name
                        )
                    })?;
                ids.push(id);
            }
            if owners.len() == PARTITIONS as usize && by_owner.len() == processors.len() {
                Ok(ids)
            } else {
                Err(format!("the store's owners: {by_owner:?}"))
            }
        },
    )
    .await
}

/// Checks that `events` (one processor's, from some point on) hold for every partition in
/// `partitions` exactly `expected`, once each and in order.
fn assert_exactly(
    who: &str,
    events: &BTreeMap<u32, Vec<i64>>,
    partitions: &BTreeSet<u32>,
    expected: std::ops::RangeInclusive<i64>,
) {
    let expected: Vec<i64> = expected.collect();
    for p in partitions {
        assert_eq!(
            events.get(p).cloned().unwrap_or_default(),
            expected,
            "{who}'s events of partition {p}: it must start right after the last checkpoint \
             and process each later event once, in order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_processors_balance_checkpoint_and_take_over_from_a_dead_one() {
    let Some(env) = BlobCluster::start("blob-processors", false).await else {
        return;
    };
    env.send_each(10).await;
    // Through different nodes: each processor's checkpoint store and AMQP connection.
    let mut first = env.python_processor("python-1", 0, "$Default");
    let second = env.python_processor("python-2", 1, "$Default");
    let ids = await_balance(&env, "$Default", &[&first, &second]).await;
    assert_ne!(ids[0], ids[1]);
    env.await_checkpoints("$Default", 9).await;
    env.send_each(10).await;
    env.await_checkpoints("$Default", 19).await;

    // Everything is checkpointed: the survivor must start each partition it takes over at
    // sequence number 20, and process nothing before it again.
    let taken: BTreeSet<u32> = env
        .owners("$Default")
        .await
        .unwrap()
        .into_iter()
        .filter(|(_, owner)| *owner == ids[0])
        .map(|(p, _)| p)
        .collect();
    assert_eq!(taken.len(), 4);
    first.kill().await;
    let mark = second.lines().len();
    env.send_each(10).await;
    eventually(
        SETTLE_TIMEOUT,
        "the survivor owns every partition",
        async || {
            let owners = env.owners("$Default").await?;
            if owners.len() == PARTITIONS as usize && owners.values().all(|o| *o == ids[1]) {
                Ok(())
            } else {
                Err(format!("owners: {owners:?}"))
            }
        },
    )
    .await;
    env.await_checkpoints("$Default", 29).await;
    let events = second.events_after(mark);
    let all: BTreeSet<u32> = (0..PARTITIONS).collect();
    assert_exactly("the survivor", &events, &all, 20..=29);

    // The checkpoints the SDK wrote are the cluster's: `tributary group show` has them.
    let shown: Json = serde_json::from_str(
        &cli_ok(
            &env.cluster.nodes[2].endpoint(),
            &[
                "--connection-string",
                &root_connection_string(),
                "--output",
                "json",
                "group",
                "show",
                HUB,
                "$Default",
            ],
        )
        .await,
    )
    .unwrap();
    for partition in shown["partitions"].as_array().unwrap() {
        assert_eq!(
            partition["checkpoint_sequence_number"],
            json!(29),
            "{shown}"
        );
        assert_eq!(partition["owner_id"], json!(ids[1]), "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_and_rust_processors_share_a_consumer_group() {
    let Some(env) = BlobCluster::start("blob-mixed", false).await else {
        return;
    };
    let group = "mixed";
    env.root.create_consumer_group(HUB, group).await.unwrap();
    env.send_each(5).await;
    let python = env.python_processor("python-1", 2, group);
    let mut rust = env.rust_processor("rust-1", 1, group);
    let ids = await_balance(&env, group, &[&python, &rust]).await;
    assert_eq!(ids[1], "rust-1");
    env.await_checkpoints(group, 4).await;

    // Rust's checkpoints, read by Python: it takes over Rust's partitions right after them.
    let rust_partitions = rust.open_partitions();
    rust.kill().await;
    let mark = python.lines().len();
    env.send_each(5).await;
    env.await_checkpoints(group, 9).await;
    eventually(
        SETTLE_TIMEOUT,
        "the Python processor owns every partition",
        async || {
            let owners = env.owners(group).await?;
            if owners.len() == PARTITIONS as usize && owners.values().all(|o| *o == ids[0]) {
                Ok(())
            } else {
                Err(format!("owners: {owners:?}"))
            }
        },
    )
    .await;
    let all: BTreeSet<u32> = (0..PARTITIONS).collect();
    assert_exactly("python-1", &python.events_after(mark), &all, 5..=9);
    assert_eq!(rust_partitions.len(), 4);

    // Python's checkpoints, read by Rust: a new Rust instance takes its share from Python
    // and starts each partition right after Python's checkpoint.
    let rust = env.rust_processor("rust-2", 0, group);
    let ids = await_balance(&env, group, &[&python, &rust]).await;
    assert_eq!(ids[1], "rust-2");
    let mark = rust.lines().len();
    env.send_each(5).await;
    env.await_checkpoints(group, 14).await;
    let rust_partitions = rust.open_partitions();
    assert_exactly(
        "rust-2",
        &rust.events_after(mark),
        &rust_partitions,
        10..=14,
    );
    // Each instance saw every event of its own partitions since the handover.
    let python_partitions: BTreeSet<u32> = all.difference(&rust_partitions).copied().collect();
    let python_events = python.events_after(0);
    for p in &python_partitions {
        assert!(
            python_events[p].ends_with(&[10, 11, 12, 13, 14]),
            "python-1's events of partition {p}: {:?}",
            python_events[p]
        );
    }
    let rust_openings: Vec<Json> = rust
        .lines()
        .into_iter()
        .filter(|l| l.get("opened").is_some())
        .collect();
    for opening in &rust_openings {
        assert_eq!(
            opening["checkpoint_sequence_number"],
            json!(9),
            "rust-2 opens partitions at Python's checkpoints: {opening}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_claims_with_one_etag_have_one_winner_and_one_412() {
    let Some(env) = BlobCluster::start("blob-race", false).await else {
        return;
    };
    let mut race = env.python(
        "race",
        env.settings("race", 0, json!({"rounds": 12, "partitions": PARTITIONS})),
    );
    let summary = race.summary().await;
    let rounds = summary["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 12);
    for round in rounds {
        let won: Vec<(&String, &Json)> = round["won"].as_object().unwrap().iter().collect();
        let winners: Vec<&String> = won
            .iter()
            .filter(|(_, owners)| !owners.as_array().unwrap().is_empty())
            .map(|(owner, _)| *owner)
            .collect();
        assert_eq!(winners.len(), 1, "exactly one claim wins: {round}");
        assert_eq!(round["owner_after"], json!([winners[0]]), "{round}");
        // The loser's last answer is a refusal the SDK reads as a lost claim: 412
        // ConditionNotMet (or, for two first claims, 409 BlobAlreadyExists).
        let loser = won
            .iter()
            .find(|(owner, _)| *owner != winners[0])
            .unwrap()
            .0;
        let responses = round["responses"][loser].as_array().unwrap();
        let last = responses.last().unwrap();
        let first_claim = round["etag"].is_null();
        let lost = (last["status"] == json!(412) && last["code"] == json!("ConditionNotMet"))
            || (first_claim
                && last["status"] == json!(409)
                && last["code"] == json!("BlobAlreadyExists"));
        assert!(lost, "the losing claim's answers: {responses:?} ({round})");
        if !first_claim {
            assert_eq!(last["status"], json!(412), "{round}");
        }
    }
    // The first 8 rounds claim fresh partitions; the rest race on an existing ETag.
    assert!(rounds.iter().filter(|r| !r["etag"].is_null()).count() >= 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_keys_weak_rules_and_other_blobs_are_refused_over_https() {
    let Some(env) = BlobCluster::start("blob-refusals", true).await else {
        return;
    };
    env.root
        .create_authorization_rule(None, "sender", Rights::SEND)
        .await
        .unwrap();
    env.root
        .create_authorization_rule(Some(HUB), "listener", Rights::LISTEN)
        .await
        .unwrap();
    let send_key = env
        .root
        .authorization_rule_keys(None, "sender")
        .await
        .unwrap()
        .primary_key;
    let listen_key = env
        .root
        .authorization_rule_keys(Some(HUB), "listener")
        .await
        .unwrap()
        .primary_key;
    let settings = env.settings(
        "refusals",
        1,
        json!({
            "wrong_key": WRONG_KEY,
            "send_rule": "sender",
            "send_key": send_key,
            "listen_rule": "listener",
            "listen_key": listen_key,
        }),
    );
    let summary = env.python("refusals", settings).summary().await;
    let refused = |case: &str, status: u16, code: &str| {
        let outcome = &summary[case];
        assert_eq!(outcome["ok"], json!(false), "{case}: {outcome}");
        assert_eq!(outcome["status"], json!(status), "{case}: {outcome}");
        assert_eq!(outcome["code"], json!(code), "{case}: {outcome}");
    };
    refused("wrong_key", 403, "AuthenticationFailed");
    refused("send_only_list", 403, "AuthorizationPermissionMismatch");
    refused(
        "send_only_checkpoint",
        403,
        "AuthorizationPermissionMismatch",
    );
    refused("outside_layout", 400, "InvalidResourceName");
    refused(
        "read_only_sas_checkpoint",
        403,
        "AuthorizationPermissionMismatch",
    );
    refused("forged_sas_list", 403, "AuthenticationFailed");
    assert!(
        summary["outside_layout"]["message"]
            .as_str()
            .unwrap()
            .contains("checkpoint store"),
        "{summary}"
    );
    // A hub rule's account SAS works on its hub; the node kept serving throughout.
    assert_eq!(summary["sas_checkpoint"]["ok"], json!(true), "{summary}");
    assert_eq!(summary["sas_list"]["ok"], json!(true), "{summary}");
    assert_eq!(summary["after"]["ok"], json!(true), "{summary}");
    let checkpoints = env
        .root
        .checkpoint_store()
        .list_checkpoints(HUB, "$Default")
        .await
        .unwrap();
    assert_eq!(checkpoints["0"].sequence_number, 0);
    // Refusals are counted by operation and code.
    let metrics = http_get(env.cluster.nodes[1].http_addr(), "/metrics")
        .await
        .unwrap()
        .body;
    for series in [
        "tributary_blob_requests_total{operation=\"list_blobs\",code=\"AuthenticationFailed\"}",
        "tributary_blob_requests_total{operation=\"put_blob\",code=\"InvalidResourceName\"}",
        "tributary_blob_requests_total{operation=\"list_blobs\",code=\"ok\"}",
    ] {
        assert!(
            metrics.lines().any(|line| line.starts_with(series)),
            "/metrics has {series}:\n{metrics}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_asyncio_store_and_processor_work_too() {
    let Some(env) = BlobCluster::start("blob-aio", false).await else {
        return;
    };
    let group = "aio";
    env.root.create_consumer_group(HUB, group).await.unwrap();
    env.send_each(3).await;
    let settings = env.settings(
        "aio",
        2,
        json!({"group": group, "partitions": PARTITIONS, "events": 3 * PARTITIONS}),
    );
    let summary = env.python("aio", settings).summary().await;
    let every: Vec<String> = {
        let mut ids: Vec<String> = (0..PARTITIONS).map(|p| p.to_string()).collect();
        ids.sort();
        ids
    };
    assert_eq!(summary["first"], json!(every), "{summary}");
    assert_eq!(summary["renewed"], json!(every), "{summary}");
    assert_eq!(summary["etags_changed"], json!(true), "{summary}");
    assert_eq!(summary["stale"], json!([]), "{summary}");
    assert_eq!(summary["owners"], json!(["aio-a"]), "{summary}");
    let mut expected = Vec::new();
    for p in 0..PARTITIONS {
        for seq in 0..3 {
            expected.push(json!([p, seq]));
        }
    }
    assert_eq!(summary["received"], json!(expected), "{summary}");
    env.await_checkpoints(group, 2).await;
}
