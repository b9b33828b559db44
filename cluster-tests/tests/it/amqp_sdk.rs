//! The AMQP front end against a client no one here wrote: azure-eventhub 5.15.1 (default
//! pyamqp transport, from `scripts/python-test-deps`), unchanged. The connection is served
//! in-process over TCP by `tributary_amqp::server::serve_connection`, in front of an
//! in-memory hub; `amqp_sdk.py` reads properties, publishes, consumes and prints what it saw.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value as Json;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tributary_amqp::Value;
use tributary_amqp::server::{
    AmqpEvent, Backend, BackendError, BackendFuture, ConnectionLimits, EventBody, EventStream,
    HubProperties, LastEnqueued, PartitionProperties, ReadRequest, Rights, SendOutcome, SendTarget,
    StartPosition, StoredEvent, TokenGrant, covers, entity_path, serve_connection,
};
use tributary_cluster_tests::python_tools::python_deps;
use tributary_cluster_tests::{describe_output, output_within};
use tributary_types::{
    AuthorizationRule, Offset, SequenceNumber, parse_token, partition_for_key, verify,
};

const SDK_SCRIPT: &str = include_str!("amqp_sdk.py");
const HUB: &str = "orders";
const PARTITION_IDS: [&str; 2] = ["0", "1"];
const RULE: &str = "root";
const KEY: &str = "the-root-key-of-the-test";
/// The whole script, both clients included; its own timeouts are shorter.
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(120);
/// Batches an open reader may have queued for its connection.
const READER_QUEUE_BATCHES: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_publishes_and_consumes_over_amqp() {
    let Some(venv) = python_deps() else { return };
    let hub = Arc::new(MemoryHub::new());
    let port = serve(hub.clone()).await;

    let summary = run_script(&venv, port, KEY, "roundtrip").await;

    assert_eq!(summary["hub"]["name"], HUB, "{summary}");
    assert_eq!(
        summary["hub"]["partition_ids"],
        serde_json::json!(PARTITION_IDS)
    );
    let before = &summary["partition_0_before"];
    assert_eq!(before["id"], "0");
    assert_eq!(before["eventhub_name"], HUB);
    assert_eq!(before["is_empty"], true, "{before}");
    assert_eq!(before["last_enqueued_sequence_number"], -1, "{before}");

    // What the backend stored: the keyed batch on the key's partition, the single event
    // on partition 1.
    let keyed = usize::from(partition_for_key("k", 2));
    let stored = hub.snapshot();
    let mut expected_counts = [0usize; 2];
    expected_counts[keyed] += 3;
    expected_counts[1] += 1;
    assert_eq!(
        stored.iter().map(Vec::len).collect::<Vec<_>>(),
        expected_counts,
        "{stored:#?}"
    );
    let keyed_events: Vec<&StoredEvent> = stored[keyed]
        .iter()
        .filter(|e| e.event.partition_key.is_some())
        .collect();
    assert_eq!(keyed_events.len(), 3, "{stored:#?}");
    for (i, event) in keyed_events.iter().enumerate() {
        assert_eq!(event.event.partition_key.as_deref(), Some("k"));
        assert_eq!(event.event.body, data(&format!("keyed-{i}")));
        assert_eq!(
            event.event.application_properties,
            [
                ("index".to_owned(), Value::Int(i as i32)),
                ("kind".to_owned(), Value::String("keyed".into())),
            ],
            "{event:#?}"
        );
    }
    let direct = stored[1].last().unwrap();
    assert_eq!(direct.event.partition_key, None);
    assert_eq!(direct.event.body, data("direct"));
    assert_eq!(
        direct.event.application_properties,
        [("kind".to_owned(), Value::String("direct".into()))]
    );

    // What the SDK saw afterwards: properties and every stored event, in order, with its
    // place in the partition.
    for (index, id) in PARTITION_IDS.iter().enumerate() {
        let after = &summary["partitions_after"][index];
        let events = &stored[index];
        assert_eq!(after["id"], *id);
        assert_eq!(after["is_empty"], events.is_empty(), "{after}");
        assert_eq!(after["beginning_sequence_number"], 0, "{after}");
        assert_eq!(
            after["last_enqueued_sequence_number"],
            events.len() as i64 - 1,
            "{after}"
        );
        let last_offset = events.last().map_or(-1, |e| e.offset.0);
        assert_eq!(
            after["last_enqueued_offset"],
            last_offset.to_string(),
            "{after}"
        );

        let received = summary["received"][id].as_array().unwrap();
        assert_eq!(received.len(), events.len(), "{summary}");
        for (n, (got, event)) in received.iter().zip(events).enumerate() {
            assert_eq!(got["partition"], *id, "{got}");
            assert_eq!(got["sequence_number"], n as i64, "{got}");
            assert_eq!(got["sequence_number"], event.sequence_number.0, "{got}");
            assert_eq!(got["offset"], event.offset.0.to_string(), "{got}");
            assert_eq!(got["offset_type"], "str", "{got}");
            assert_eq!(got["enqueued_time_set"], true, "{got}");
            let EventBody::Data(body) = &event.event.body else {
                panic!("a non-data body was stored: {event:#?}")
            };
            assert_eq!(got["body"], std::str::from_utf8(body).unwrap(), "{got}");
            match &event.event.partition_key {
                Some(key) => assert_eq!(got["partition_key"], key.as_str(), "{got}"),
                None => assert_eq!(got["partition_key"], Json::Null, "{got}"),
            }
        }
    }
    let keyed_received = &summary["received"][PARTITION_IDS[keyed]];
    let keyed_received: Vec<&Json> = keyed_received
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["partition_key"] == "k")
        .collect();
    for (i, got) in keyed_received.iter().enumerate() {
        assert_eq!(got["body"], format!("keyed-{i}"), "{got}");
        assert_eq!(
            got["properties"],
            serde_json::json!({"index": i, "kind": "keyed"}),
            "{got}"
        );
    }
    let direct = summary["received"]["1"].as_array().unwrap().last().unwrap();
    assert_eq!(direct["body"], "direct", "{direct}");
    assert_eq!(direct["properties"], serde_json::json!({"kind": "direct"}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_sdk_is_refused_with_a_wrong_key() {
    let Some(venv) = python_deps() else { return };
    let hub = Arc::new(MemoryHub::new());
    let port = serve(hub.clone()).await;

    let summary = run_script(&venv, port, "not-the-key", "wrong-key").await;

    assert_eq!(summary["error"], "AuthenticationError", "{summary}");
    let message = summary["message"].as_str().unwrap();
    // The put-token reply carries no error-condition, so pyamqp passes its status code and
    // description on to the user.
    assert!(
        message.contains("CBS Token authentication failed")
            && message.contains("401")
            && message.contains("signature does not match"),
        "{message}"
    );
    let refusals = hub.refusals.lock().unwrap().clone();
    assert!(!refusals.is_empty(), "the backend saw no token");
    for refusal in &refusals {
        assert!(refusal.contains("signature does not match"), "{refusals:?}");
    }
    assert!(hub.snapshot().iter().all(Vec::is_empty));
}

/// Serves every connection on a fresh port with `backend`; returns the port.
async fn serve(backend: Arc<MemoryHub>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let limits = ConnectionLimits {
        node_name: "amqp-sdk-test".into(),
        ..ConnectionLimits::default()
    };
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let backend: Arc<dyn Backend> = backend.clone();
            let limits = limits.clone();
            tokio::spawn(async move {
                // The SDK's own errors say what went wrong; a failed connection is logged
                // for when they do not.
                if let Err(error) = serve_connection(socket, backend, limits).await {
                    eprintln!("AMQP connection ended with: {error}");
                }
            });
        }
    });
    port
}

/// Runs `amqp_sdk.py` and parses the JSON summary it prints; its stderr is in the panic
/// message when it fails.
async fn run_script(venv: &Path, port: u16, key: &str, mode: &str) -> Json {
    let mut command = tokio::process::Command::new(venv.join("bin/python"));
    command
        .args(["-c", SDK_SCRIPT, &port.to_string(), key, mode])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let output = output_within(command, SCRIPT_TIMEOUT).await;
    assert!(
        output.status.success(),
        "the azure-eventhub script ({mode}) failed: {}",
        describe_output(&output)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last_line = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last_line).unwrap_or_else(|error| {
        panic!(
            "the script printed no JSON summary ({error}): {}",
            describe_output(&output)
        )
    })
}

fn data(text: &str) -> EventBody {
    EventBody::Data(bytes::Bytes::copy_from_slice(text.as_bytes()))
}

fn now_unix_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// One hub, `orders`, with two partitions held in memory; one rule, `root`, with Manage.
struct MemoryHub {
    rules: Vec<AuthorizationRule>,
    created_at_unix_ms: i64,
    /// Why tokens were refused, in order.
    refusals: Mutex<Vec<String>>,
    /// Shared with the readers' tasks.
    store: Arc<Store>,
}

struct Store {
    state: Mutex<HubState>,
    /// Counts appends: readers wait for it to change.
    appended: watch::Sender<u64>,
}

#[derive(Default)]
struct HubState {
    partitions: [Vec<StoredEvent>; 2],
    next_round_robin: usize,
}

impl MemoryHub {
    fn new() -> MemoryHub {
        MemoryHub {
            rules: vec![AuthorizationRule {
                name: RULE.into(),
                primary_key: KEY.into(),
                secondary_key: "an-unused-secondary-key".into(),
                rights: tributary_types::Rights::MANAGE,
            }],
            created_at_unix_ms: now_unix_ms(),
            refusals: Mutex::default(),
            store: Arc::new(Store {
                state: Mutex::new(HubState::default()),
                appended: watch::channel(0).0,
            }),
        }
    }

    fn snapshot(&self) -> [Vec<StoredEvent>; 2] {
        self.store.state.lock().unwrap().partitions.clone()
    }

    fn grant(expires_at_unix_ms: i64) -> TokenGrant {
        TokenGrant {
            rights: Rights {
                send: true,
                listen: true,
                manage: true,
            },
            expires_at_unix_ms,
        }
    }

    fn check_hub(hub: &str) -> Result<(), BackendError> {
        if hub.eq_ignore_ascii_case(HUB) {
            Ok(())
        } else {
            Err(BackendError::not_found(format!(
                "The messaging entity '{hub}' could not be found"
            )))
        }
    }

    fn partition_index(hub: &str, partition: &str) -> Result<usize, BackendError> {
        Self::check_hub(hub)?;
        PARTITION_IDS
            .iter()
            .position(|id| *id == partition)
            .ok_or_else(|| {
                BackendError::not_found(format!(
                    "The messaging entity '{hub}/Partitions/{partition}' could not be found"
                ))
            })
    }

    /// Stores `events` at the end of partition `index`; the first one's sequence number.
    fn append(&self, index: usize, events: Vec<AmqpEvent>) -> SequenceNumber {
        let mut state = self.store.state.lock().unwrap();
        let partition = &mut state.partitions[index];
        let first = SequenceNumber(partition.len() as i64);
        let now = now_unix_ms();
        for event in events {
            // Offsets are byte positions: the previous event's offset plus its body.
            let offset = partition
                .last()
                .map_or(0, |e| e.offset.0 + e.event.body.bytes().len() as i64 + 1);
            let sequence_number = SequenceNumber(partition.len() as i64);
            let last_enqueued = LastEnqueued {
                sequence_number,
                offset: Offset(offset),
                enqueued_time_unix_ms: now,
            };
            partition.push(StoredEvent {
                sequence_number,
                offset: Offset(offset),
                enqueued_time_unix_ms: now,
                event,
                last_enqueued,
            });
        }
        drop(state);
        self.store.appended.send_modify(|count| *count += 1);
        first
    }

    /// The index of the first event of `partition` at or after `start`.
    fn start_index(partition: &[StoredEvent], start: StartPosition) -> usize {
        let first_where = |f: &dyn Fn(&StoredEvent) -> bool| {
            partition.iter().position(f).unwrap_or(partition.len())
        };
        match start {
            StartPosition::Earliest => 0,
            StartPosition::Latest => partition.len(),
            StartPosition::Offset { offset, inclusive } => {
                first_where(&|e| e.offset > offset || (inclusive && e.offset == offset))
            }
            StartPosition::SequenceNumber {
                sequence_number,
                inclusive,
            } => first_where(&|e| {
                e.sequence_number > sequence_number
                    || (inclusive && e.sequence_number == sequence_number)
            }),
            StartPosition::EnqueuedTime { unix_ms, inclusive } => first_where(&|e| {
                e.enqueued_time_unix_ms > unix_ms
                    || (inclusive && e.enqueued_time_unix_ms == unix_ms)
            }),
        }
    }
}

impl Backend for MemoryHub {
    fn now_unix_ms(&self) -> i64 {
        now_unix_ms()
    }

    fn sasl_plain<'a>(&'a self, user: &'a str, password: &'a str) -> BackendFuture<'a, TokenGrant> {
        Box::pin(async move {
            if user == RULE && password == KEY {
                Ok(Self::grant(i64::MAX))
            } else {
                Err(BackendError::unauthorized("unknown rule or wrong key"))
            }
        })
    }

    fn put_token<'a>(
        &'a self,
        audience: &'a str,
        _token_type: &'a str,
        token: &'a str,
    ) -> BackendFuture<'a, TokenGrant> {
        Box::pin(async move {
            let now_unix_s = (now_unix_ms() / 1000) as u64;
            let refused = |error: &dyn std::fmt::Display| {
                self.refusals.lock().unwrap().push(error.to_string());
                BackendError::unauthorized(error.to_string())
            };
            // The SDK signs `sb://127.0.0.1:<port>/orders` but puts the token for
            // `sb://127.0.0.1/orders`: as the server does for grants, the token's resource
            // is compared with the audience by entity path, host and port aside.
            let parsed = parse_token(token).map_err(|e| refused(&e))?;
            let grant = verify(
                &parsed,
                &self.rules,
                parsed.resource(),
                tributary_types::Rights::NONE,
                now_unix_s,
            )
            .map_err(|e| refused(&e))?;
            let (granted, asked) = (entity_path(parsed.resource()), entity_path(audience));
            if !covers(&granted, &asked) {
                return Err(refused(&format!(
                    "the token is for {granted:?}, which does not cover {asked:?}"
                )));
            }
            Ok(Self::grant(grant.expiry_unix_s as i64 * 1000))
        })
    }

    fn hub_properties<'a>(
        &'a self,
        _grant: &'a TokenGrant,
        hub: &'a str,
    ) -> BackendFuture<'a, HubProperties> {
        Box::pin(async move {
            Self::check_hub(hub)?;
            Ok(HubProperties {
                name: HUB.into(),
                created_at_unix_ms: self.created_at_unix_ms,
                partition_ids: PARTITION_IDS.map(String::from).to_vec(),
            })
        })
    }

    fn partition_properties<'a>(
        &'a self,
        _grant: &'a TokenGrant,
        hub: &'a str,
        partition: &'a str,
    ) -> BackendFuture<'a, PartitionProperties> {
        Box::pin(async move {
            let index = Self::partition_index(hub, partition)?;
            let state = self.store.state.lock().unwrap();
            let last = state.partitions[index].last();
            Ok(PartitionProperties {
                hub: HUB.into(),
                partition_id: partition.into(),
                begin_sequence_number: 0,
                last_enqueued_sequence_number: last.map_or(-1, |e| e.sequence_number.0),
                last_enqueued_offset: last.map_or(-1, |e| e.offset.0).to_string(),
                last_enqueued_time_unix_ms: last.map_or(0, |e| e.enqueued_time_unix_ms),
                is_empty: last.is_none(),
            })
        })
    }

    fn send(
        &self,
        _grant: &TokenGrant,
        hub: &str,
        target: SendTarget,
        events: Vec<AmqpEvent>,
    ) -> BackendFuture<'static, SendOutcome> {
        let index = match &target {
            SendTarget::PartitionId(id) => Self::partition_index(hub, id),
            SendTarget::PartitionKey(key) => Self::check_hub(hub)
                .map(|()| usize::from(partition_for_key(key, PARTITION_IDS.len() as u16))),
            SendTarget::RoundRobin => Self::check_hub(hub).map(|()| {
                let mut state = self.store.state.lock().unwrap();
                state.next_round_robin += 1;
                (state.next_round_robin - 1) % PARTITION_IDS.len()
            }),
        };
        // Stored at the call, so a link's sends keep their order.
        let outcome = index.map(|index| SendOutcome {
            partition_id: PARTITION_IDS[index].into(),
            first_sequence_number: self.append(index, events),
        });
        Box::pin(async move { outcome })
    }

    fn read(
        &self,
        _grant: &TokenGrant,
        request: ReadRequest,
    ) -> BackendFuture<'static, EventStream> {
        let index = Self::partition_index(&request.hub, &request.partition);
        let store = self.store.clone();
        Box::pin(async move {
            let index = index?;
            let (sender, stream) = EventStream::channel(READER_QUEUE_BATCHES);
            // Subscribed first, so no append between the two is missed.
            let mut appended = store.appended.subscribe();
            let mut next = {
                let state = store.state.lock().unwrap();
                Self::start_index(&state.partitions[index], request.start)
            };
            tokio::spawn(async move {
                loop {
                    let batch: Vec<StoredEvent> = {
                        let state = store.state.lock().unwrap();
                        state.partitions[index][next..].to_vec()
                    };
                    next += batch.len();
                    if !batch.is_empty() && sender.send(Ok(batch)).await.is_err() {
                        return; // The link is gone.
                    }
                    tokio::select! {
                        changed = appended.changed() => if changed.is_err() { return },
                        () = sender.closed() => return,
                    }
                }
            });
            Ok(stream)
        })
    }
}
