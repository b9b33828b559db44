//! The peer port protected by a cluster key (`--cluster-key-file`), through the real binary:
//! keyed nodes form a cluster and fail over; a caller without the key is refused every peer
//! call, changes nothing and hears no authorization key (the regression test of the open
//! `Cluster/Watch`); a node with another key cannot join; a keyed connection recorded and
//! replayed later is refused; a peer address facing the network needs protection.
//!
//! The test itself dials with the key where it must ([`keyed_proxy`]): the nodes' own
//! handshake, `tributary_raft::peer_key::dial`, made on the connection to the node.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr as _;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tonic::metadata::{KeyAndValueRef, MetadataMap};
use tonic::transport::{Channel, Endpoint};
use tributary_client::{Client, ConnectOptions, EventData, EventPosition, Rights, RuleKey};
use tributary_client::{ClientError, SendTarget};
use tributary_cluster_tests::{
    CLI_TIMEOUT, LocalCluster, NodePorts, NodeProcess, RawCodec, TestDir, describe_output,
    eventually, free_port, http_get, output_within, root_connection_string, tributary_command,
};
use tributary_controller::state::{Command, HubSettings, NewHub};
use tributary_controller::state_machine::{decode_result, encode_command};
use tributary_proto::peer::cluster_client::ClusterClient;
use tributary_proto::peer::node_status_client::NodeStatusClient;
use tributary_proto::peer::propose_reply::Result as ProposeResult;
use tributary_proto::peer::raft_peer_client::RaftPeerClient;
use tributary_proto::peer::{
    GroupBatch, GroupMessage, HelloRequest, LocalStatusRequest, MessageKind, NodeInfo,
    ProposeRequest, WatchRequest,
};
use tributary_raft::peer_key::{self, ClusterKey};

/// How long one call to a peer port may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a refused connection may take to be counted in `/metrics` (a refused gRPC
/// client is answered for a few seconds before its connection is closed and counted).
const REFUSAL_COUNTED_WAIT: Duration = Duration::from_secs(15);
/// Join attempts of a node with another key that must all be refused.
const JOIN_ATTEMPTS_REFUSED: u64 = 3;
/// How long those attempts may take.
const JOIN_REFUSED_WAIT: Duration = Duration::from_secs(30);
/// How long a node that must exit at startup may run.
const START_REFUSED_TIMEOUT: Duration = Duration::from_secs(30);
/// Pause after a stream's last reply before the stream is taken to have said everything.
const STREAM_QUIET: Duration = Duration::from_millis(500);
/// Bytes kept of what one call answers.
const HEARD_BYTES_MAX: usize = 4 * 1024 * 1024;
/// What every refusal of a caller without the key names.
const KEY_FLAG: &str = "--cluster-key-file";
/// The root rule's key (`TRIBUTARY_ROOT_KEY`) and another rule's key, in the form Event Hubs
/// keys take (base64 of 32 bytes).
const ROOT_KEY: &str = "cm9vdC1rZXktb2YtdGhlLXBlZXItc2VjdXJpdHktdGVzdA==";
const RULE_KEY: &str = "bGlzdGVuZXIta2V5LW9mLXRoZS1wZWVyLXNlY3VyaXR5LXQ=";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keyed_cluster_forms_replicates_and_fails_over() {
    let dir = TestDir::new("a_keyed_cluster_forms_replicates_and_fails_over");
    let key = cluster_key_file(dir.path(), "cluster.key").await;
    let mut cluster = LocalCluster::start_with_args(dir.path(), 3, &key_args(&key), &[]).await;
    let endpoints = cluster.endpoints();
    let client = Client::connect(&endpoints[0]).await.unwrap();
    let hub = client
        .create_replicated_event_hub("keyed", 1, None, Some(3))
        .await
        .unwrap();
    assert_eq!(hub.replication_factor, 3);
    let mut acked = Vec::new();
    send(&client, "keyed", ("before", 0..5), &mut acked).await;

    let leader = cluster.partition_leader("keyed", "0").await;
    cluster.nodes[leader].kill9().await;
    let survivor = Client::connect(&endpoints[(leader + 1) % 3]).await.unwrap();
    send(&survivor, "keyed", ("after", 5..10), &mut acked).await;

    assert_eq!(
        read(&survivor, "keyed", "0", acked.len()).await,
        acked,
        "the survivors lost or reordered acknowledged events"
    );
    let status = survivor.cluster_status().await.unwrap();
    let partition = &status.partitions[0];
    assert!(
        partition.leader > 0 && partition.leader != leader as u64 + 1,
        "a survivor leads: {status:?}"
    );
    assert_eq!(partition.replicas.len(), 3, "{status:?}");
}

#[tokio::test]
async fn an_outsider_without_the_key_is_refused_every_peer_call_and_changes_nothing() {
    let dir = TestDir::new("an_outsider_without_the_key_is_refused_every_peer_call");
    let key = cluster_key_file(dir.path(), "cluster.key").await;
    let node = keyed_node(dir.path(), &key).await;
    let client = Client::connect(&node.endpoint()).await.unwrap();
    client.create_event_hub("existing", 1, None).await.unwrap();
    let hubs = hub_names(&client).await;
    let before = refusals(&node, "no_key").await;

    let calls = outsider_calls(node.peer_addr());
    let call_count = calls.len() as u64;
    for (what, call) in calls {
        let answer = tokio::time::timeout(CALL_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| panic!("{what} was not answered within {CALL_TIMEOUT:?}"));
        let status = answer
            .err()
            .unwrap_or_else(|| panic!("{what} was answered to a caller without the cluster key"));
        assert_eq!(
            status.code(),
            tonic::Code::Unauthenticated,
            "{what}: {status:?}"
        );
        assert!(status.message().contains(KEY_FLAG), "{what}: {status:?}");
    }

    // Each call came on a connection of its own, each refused and counted.
    eventually(
        REFUSAL_COUNTED_WAIT,
        format!("{call_count} more no_key refusals than {before}"),
        async || match refusals(&node, "no_key").await {
            now if now >= before + call_count => Ok(()),
            now => Err(format!("{now} counted")),
        },
    )
    .await;
    assert_eq!(
        hub_names(&client).await,
        hubs,
        "the outsider changed the hubs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_another_key_cannot_join() {
    let dir = TestDir::new("a_node_with_another_key_cannot_join");
    let key = cluster_key_file(dir.path(), "cluster.key").await;
    let other_key = cluster_key_file(dir.path(), "other.key").await;
    let cluster = LocalCluster::start_with_args(dir.path(), 3, &key_args(&key), &[]).await;
    let refused_before = wrong_key_refusals(&cluster).await;

    // It expects another node before forming a cluster of its own, so ready would mean it
    // joined this one.
    let mut args: Vec<String> = ["--node-id", "4", "--seeds", &cluster.seeds]
        .into_iter()
        .chain(["--bootstrap-expect", "2"])
        .map(String::from)
        .collect();
    args.extend(key_args(&other_key));
    let mut stranger =
        NodeProcess::launch_with_env(&dir.path().join("node-4"), NodePorts::free(), &args, &[]);
    eventually(
        JOIN_REFUSED_WAIT,
        format!("{JOIN_ATTEMPTS_REFUSED} join attempts refused as a wrong key"),
        async || {
            stranger.assert_running();
            let ready = http_get(stranger.http_addr(), "/readyz").await;
            assert!(
                !ready.is_ok_and(|r| r.status == 200),
                "a node with another cluster key got ready"
            );
            match wrong_key_refusals(&cluster).await {
                now if now >= refused_before + JOIN_ATTEMPTS_REFUSED => Ok(()),
                now => Err(format!("{now} wrong_key refusals, {refused_before} before")),
            }
        },
    )
    .await;

    let client = Client::connect(&cluster.nodes[0].endpoint()).await.unwrap();
    let status = client.cluster_status().await.unwrap();
    let mut members: Vec<u64> = status.nodes.iter().map(|n| n.id).collect();
    members.sort_unstable();
    assert_eq!(members, [1, 2, 3], "{status:?}");
    // The cluster keeps serving.
    client.create_event_hub("still", 1, None).await.unwrap();
    let mut acked = Vec::new();
    send(&client, "still", ("still", 0..1), &mut acked).await;
    // The stranger was told why.
    stranger.terminate().await;
    let log = std::fs::read_to_string(stranger.log_path()).unwrap();
    assert!(log.contains("does not know this cluster's key"), "{log}");
}

/// A connection's proof is bound to both sides' fresh nonces: bytes recorded from a genuine
/// keyed connection, a proposal included, prove nothing on another.
#[tokio::test]
async fn a_recorded_peer_connection_replayed_later_is_refused() {
    let dir = TestDir::new("a_recorded_peer_connection_replayed_later_is_refused");
    let key_file = cluster_key_file(dir.path(), "cluster.key").await;
    let key = ClusterKey::read(&key_file).unwrap();
    let node = keyed_node(dir.path(), &key_file).await;
    let client = Client::connect(&node.endpoint()).await.unwrap();

    // One keyed connection, recorded: its one call creates hub "recorded".
    let (proxy, recording) = keyed_proxy(node.peer_addr(), key).await;
    let mut cluster = ClusterClient::new(plain_channel(proxy));
    let reply = cluster
        .propose(ProposeRequest {
            command: create_hub_command("recorded"),
            hops: 0,
        })
        .await
        .unwrap()
        .into_inner();
    assert_command_ran(reply.result);
    drop(cluster);
    let recorded = tokio::time::timeout(CALL_TIMEOUT, recording)
        .await
        .expect("the recorded connection closes once its client is gone")
        .unwrap();
    assert!(recorded.starts_with(peer_key::MAGIC), "{recorded:?}");
    assert!(contains(&recorded, b"recorded"), "the call was recorded");
    let recorded_listed = async |listed: bool| {
        let what = format!("hub recorded listed: {listed}");
        eventually(CALL_TIMEOUT, what, async || {
            let hubs = hub_names(&client).await;
            if hubs.contains(&"recorded".to_owned()) == listed {
                Ok(())
            } else {
                Err(format!("{hubs:?}"))
            }
        })
        .await;
    };
    recorded_listed(true).await;
    client.delete_event_hub("recorded").await.unwrap();
    recorded_listed(false).await;

    // Replayed byte for byte on a new connection.
    let before = refusals(&node, "wrong_key").await;
    let mut replay = TcpStream::connect(node.peer_addr()).await.unwrap();
    // The node may close the connection before it has read everything: errors are fine.
    let _ = replay.write_all(&recorded).await;
    let mut heard = Vec::new();
    let closed = tokio::time::timeout(CALL_TIMEOUT, replay.read_to_end(&mut heard)).await;
    assert!(closed.is_ok(), "the node closes a replayed connection");
    eventually(
        REFUSAL_COUNTED_WAIT,
        "the replay refused as a wrong key",
        async || match refusals(&node, "wrong_key").await {
            now if now > before => Ok(()),
            now => Err(format!("{now} counted, {before} before")),
        },
    )
    .await;
    // The connection is closed and refused before its calls were read: nothing comes back.
    assert!(
        !hub_names(&client).await.contains(&"recorded".to_owned()),
        "the replayed proposal ran again"
    );
}

/// The regression test of the hole the cluster key closes: a plain gRPC `Cluster/Watch` on
/// an open peer port answered the cluster state, every authorization rule's keys included.
#[tokio::test]
async fn no_peer_call_answered_to_an_unauthenticated_caller_contains_a_rule_key() {
    let dir = TestDir::new("no_peer_call_answered_to_an_unauthenticated_caller");
    let key_file = cluster_key_file(dir.path(), "cluster.key").await;
    let mut args = key_args(&key_file);
    args.extend(["--auth".to_owned(), "sas".to_owned()]);
    let node = start_node(
        &dir.path().join("node"),
        &args,
        &[("TRIBUTARY_ROOT_KEY", ROOT_KEY)],
    )
    .await;
    let root = root_connection_string(node.data_dir()).await;
    assert!(root.contains(ROOT_KEY), "the root rule has the key set");
    let options = ConnectOptions {
        endpoint: Some(node.endpoint()),
        ..ConnectOptions::default()
    };
    let client = Client::from_connection_string_with(&root, options)
        .await
        .unwrap();
    // The root rule is made just after the node is ready: retried until it is in force.
    eventually(CALL_TIMEOUT, "a rule created as root", async || {
        client
            .create_authorization_rule(None, "listener", Rights::LISTEN)
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    client
        .regenerate_authorization_rule_key(None, "listener", RuleKey::Primary, Some(RULE_KEY))
        .await
        .unwrap();
    let secrets: Vec<(&str, Vec<u8>)> = [("root key", ROOT_KEY), ("rule key", RULE_KEY)]
        .into_iter()
        .flat_map(|(what, key)| forms(key).into_iter().map(move |form| (what, form)))
        .collect();

    let methods = peer_methods();
    assert!(
        methods
            .iter()
            .any(|m| m == "/tributary.peer.v1.Cluster/Watch"),
        "{methods:?}"
    );
    for method in &methods {
        let heard = everything_heard(plain_channel(node.peer_addr()), method).await;
        assert!(
            contains(&heard, KEY_FLAG.as_bytes()),
            "{method} was not refused naming {KEY_FLAG}: {}",
            String::from_utf8_lossy(&heard)
        );
        for (what, form) in &secrets {
            assert!(
                !contains(&heard, form),
                "{method} told a caller without the cluster key the {what}"
            );
        }
    }

    // The control: a node's Watch does carry the keys, so the search above would find them.
    let (proxy, _recording) =
        keyed_proxy(node.peer_addr(), ClusterKey::read(&key_file).unwrap()).await;
    let heard = everything_heard(plain_channel(proxy), "/tributary.peer.v1.Cluster/Watch").await;
    assert!(
        contains(&heard, RULE_KEY.as_bytes()),
        "a keyed Watch carries the rule's key (if keys no longer travel in the cluster state, \
         this control has nothing to show)"
    );
}

#[tokio::test]
async fn a_peer_address_facing_the_network_needs_protection() {
    let dir = TestDir::new("a_peer_address_facing_the_network_needs_protection");
    let key = cluster_key_file(dir.path(), "cluster.key").await;
    let open = |port: u16| format!("0.0.0.0:{port}");

    let mut bare = tributary_command();
    bare.arg("serve")
        .arg("--data-dir")
        .arg(dir.path().join("bare"))
        .args(["--client-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--http-addr", &format!("127.0.0.1:{}", free_port())])
        .args(["--peer-addr", &open(free_port())]);
    let insecure_args = [
        "--peer-addr".to_owned(),
        open(free_port()),
        "--peer-insecure".to_owned(),
    ];
    let mut keyed_args = vec!["--peer-addr".to_owned(), open(free_port())];
    keyed_args.extend(key_args(&key));
    let (insecure_dir, keyed_dir) = (dir.path().join("insecure"), dir.path().join("keyed"));
    let (bare, insecure, keyed) = tokio::join!(
        output_within(bare, START_REFUSED_TIMEOUT),
        start_node(&insecure_dir, &insecure_args, &[]),
        start_node(&keyed_dir, &keyed_args, &[]),
    );

    assert!(!bare.status.success(), "{}", describe_output(&bare));
    let stderr = String::from_utf8_lossy(&bare.stderr);
    for flag in [KEY_FLAG, "--peer-ca", "--peer-insecure"] {
        assert!(stderr.contains(flag), "{}", describe_output(&bare));
    }
    for (node, insecure) in [(&insecure, 1), (&keyed, 0)] {
        let metrics = http_get(node.http_addr(), "/metrics").await.unwrap().body;
        let line = format!("tributary_peer_insecure {insecure}");
        assert!(metrics.lines().any(|l| l == line), "{line}: {metrics}");
    }
}

/// A new cluster key file made by the binary, readable by its owner only.
async fn cluster_key_file(dir: &Path, name: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    let mut command = tributary_command();
    command.args(["cert", "cluster-key", "--out"]).arg(&path);
    let output = output_within(command, CLI_TIMEOUT).await;
    assert!(output.status.success(), "{}", describe_output(&output));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(
        mode & 0o777,
        0o600,
        "{} is readable by others",
        path.display()
    );
    path
}

fn key_args(file: &Path) -> Vec<String> {
    vec![KEY_FLAG.to_owned(), file.display().to_string()]
}

/// A one-node cluster with the cluster key in `key`.
async fn keyed_node(dir: &Path, key: &Path) -> NodeProcess {
    start_node(&dir.join("node"), &key_args(key), &[]).await
}

/// A one-node cluster with these flags and environment, once ready.
async fn start_node(data_dir: &Path, args: &[String], env: &[(&str, &str)]) -> NodeProcess {
    let mut node = NodeProcess::launch_with_env(data_dir, NodePorts::free(), args, env);
    node.wait_ready().await;
    node
}

/// `tributary_peer_refused_total{reason="<reason>"}` on `node` (0 before the first).
async fn refusals(node: &NodeProcess, reason: &str) -> u64 {
    let metrics = http_get(node.http_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    let label = format!("tributary_peer_refused_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&label))
        .map_or(0, |value| value.trim().parse().expect("a counter"))
}

/// Connections the cluster's nodes refused for a wrong key (a dialer with another key
/// hangs up on a node's proof, which counts as one too).
async fn wrong_key_refusals(cluster: &LocalCluster) -> u64 {
    let mut refused = 0;
    for node in &cluster.nodes {
        refused += refusals(node, "wrong_key").await;
    }
    refused
}

async fn hub_names(client: &Client) -> Vec<String> {
    let mut names: Vec<String> = client
        .list_event_hubs()
        .await
        .unwrap()
        .into_iter()
        .map(|h| h.name)
        .collect();
    names.sort();
    names
}

/// Sends `<label>-<i>` for each `i` to partition 0 of `hub`, recording the acknowledged
/// bodies.
async fn send(
    client: &Client,
    hub: &str,
    (label, events): (&str, std::ops::Range<u32>),
    acked: &mut Vec<String>,
) {
    for i in events {
        let body = format!("{label}-{i}");
        client
            .producer()
            .send(
                hub,
                SendTarget::PartitionId("0".into()),
                [EventData::from_body(body.clone())],
            )
            .await
            .unwrap_or_else(|e: ClientError| panic!("send {body}: {e}"));
        acked.push(body);
    }
}

/// The first `count` event bodies of a partition.
async fn read(client: &Client, hub: &str, partition: &str, count: usize) -> Vec<String> {
    let mut stream = client
        .consumer()
        .receive(hub, "", partition, EventPosition::Earliest, 0)
        .await
        .unwrap();
    let mut bodies = Vec::new();
    while bodies.len() < count {
        let batch = tokio::time::timeout(CALL_TIMEOUT, stream.next())
            .await
            .expect("events arrive")
            .expect("stream open")
            .unwrap();
        bodies.extend(
            batch
                .iter()
                .map(|e| String::from_utf8(e.body.to_vec()).unwrap()),
        );
    }
    bodies
}

/// A channel to `addr` without TLS or cluster key, connecting on its first call.
fn plain_channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("a valid URL")
        .connect_timeout(CALL_TIMEOUT)
        .connect_lazy()
}

/// Every peer call as a caller without the key would make it (a real request each, the
/// proposal one that would create a hub), each on a connection of its own.
fn outsider_calls(
    peer: SocketAddr,
) -> Vec<(&'static str, BoxFuture<'static, Result<(), tonic::Status>>)> {
    let message = || GroupMessage {
        group: 0,
        kind: MessageKind::Vote as i32,
        payload: Bytes::new(),
        from_node: 9,
        to_member: 0,
    };
    vec![
        (
            "Cluster.Hello",
            async move {
                let request = HelloRequest {
                    cluster_id: String::new(),
                    node: Some(NodeInfo {
                        id: 9,
                        client_addr: "127.0.0.1:1".into(),
                        peer_addr: "127.0.0.1:2".into(),
                        ..Default::default()
                    }),
                };
                ClusterClient::new(plain_channel(peer))
                    .hello(request)
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "Cluster.Propose",
            async move {
                let request = ProposeRequest {
                    command: create_hub_command("outsider"),
                    hops: 0,
                };
                ClusterClient::new(plain_channel(peer))
                    .propose(request)
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "Cluster.Watch",
            async move {
                let mut views = ClusterClient::new(plain_channel(peer))
                    .watch(WatchRequest {})
                    .await?
                    .into_inner();
                views.message().await.map(drop)
            }
            .boxed(),
        ),
        (
            "NodeStatus.LocalStatus",
            async move {
                NodeStatusClient::new(plain_channel(peer))
                    .local_status(LocalStatusRequest {})
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "RaftPeer.Call",
            async move {
                RaftPeerClient::new(plain_channel(peer))
                    .call(message())
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
        (
            "RaftPeer.Batch",
            async move {
                let batch = GroupBatch {
                    messages: vec![message(), message()],
                };
                RaftPeerClient::new(plain_channel(peer))
                    .batch(batch)
                    .await
                    .map(drop)
            }
            .boxed(),
        ),
    ]
}

/// The controller command creating hub `name` (one partition, an hour's retention, default
/// settings), encoded as a node proposes it.
fn create_hub_command(name: &str) -> Bytes {
    let now_ms = i64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    encode_command(&Command::CreateHub(NewHub {
        name: name.to_owned(),
        partition_count: 1,
        retention_ms: 3_600_000,
        replication_factor: None,
        partitions_max: 1024,
        now_ms,
        down_nodes: Vec::new(),
        throughput_units: 0,
        settings: HubSettings::default(),
    }))
}

/// Panics unless a proposal's reply says the command ran: an encoded `Ok` (in whichever
/// format the cluster writes).
fn assert_command_ran(result: Option<ProposeResult>) {
    match result {
        Some(ProposeResult::Reply(reply)) => match decode_result(&reply) {
            Ok(Ok(_)) => {}
            refused => panic!("the command was refused: {refused:?}"),
        },
        other => panic!("the command did not run: {other:?}"),
    }
}

/// A local address whose one connection reaches `node`'s peer port with the cluster key:
/// the handshake is made here, as a node dials its peers, and the rest is passed through.
/// The task returns every byte sent to the node once the connection is closed.
async fn keyed_proxy(node: SocketAddr, key: ClusterKey) -> (SocketAddr, JoinHandle<Vec<u8>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let (mut client, _) = listener.accept().await.unwrap();
        let mut upstream = Recording {
            io: TcpStream::connect(node).await.unwrap(),
            sent: Vec::new(),
        };
        peer_key::dial(&mut upstream, &key)
            .await
            .expect("the node admits the cluster key");
        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
        upstream.sent
    });
    (addr, task)
}

/// A stream that keeps a copy of every byte written to it.
struct Recording {
    io: TcpStream,
    sent: Vec<u8>,
}

impl AsyncRead for Recording {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Recording {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = written {
            self.sent.extend_from_slice(&buf[..n]);
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Every RPC of the peer port, as `/<package>.<Service>/<Rpc>`, from its `.proto` file: a
/// new RPC is checked without a change here.
fn peer_methods() -> Vec<String> {
    let file =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/proto/tributary/peer/v1/peer.proto");
    let text = std::fs::read_to_string(&file).expect("the proto file is readable");
    let mut service = "";
    let mut methods = Vec::new();
    for line in text.lines().map(str::trim) {
        if let Some(rest) = line.strip_prefix("service ") {
            service = rest.trim_end_matches('{').trim();
        } else if let Some(rest) = line.strip_prefix("rpc ") {
            let name = rest.split('(').next().unwrap_or_default().trim();
            methods.push(format!("/tributary.peer.v1.{service}/{name}"));
        }
    }
    assert!(methods.len() >= 6, "{methods:?} in {}", file.display());
    methods
}

/// Every byte a caller hears from one call of `method` with an empty request (valid for
/// every peer request): the status's code, message, details and metadata, or the replies
/// (a stream's until it is quiet) with their headers and trailers.
async fn everything_heard(channel: Channel, method: &str) -> Vec<u8> {
    let mut heard = Vec::new();
    let mut grpc = tonic::client::Grpc::new(channel);
    let path = tonic::codegen::http::uri::PathAndQuery::from_str(method).unwrap();
    let exchange = async {
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let response = grpc
            .server_streaming(tonic::Request::new(Bytes::new()), path, RawCodec)
            .await?;
        heard.extend(metadata_bytes(response.metadata()));
        let mut replies = response.into_inner();
        while heard.len() < HEARD_BYTES_MAX {
            match tokio::time::timeout(STREAM_QUIET, replies.message()).await {
                Ok(Ok(Some(reply))) => heard.extend_from_slice(&reply),
                Ok(Ok(None)) => break,
                Ok(Err(status)) => return Err(status),
                Err(_quiet) => return Ok(()),
            }
        }
        if let Ok(Some(trailers)) = replies.trailers().await {
            heard.extend(metadata_bytes(&trailers));
        }
        Ok(())
    };
    let answer = tokio::time::timeout(CALL_TIMEOUT, exchange)
        .await
        .unwrap_or_else(|_| panic!("{method} was not answered within {CALL_TIMEOUT:?}"));
    if let Err(status) = answer {
        heard.extend_from_slice(format!("{:?} ", status.code()).as_bytes());
        heard.extend_from_slice(status.message().as_bytes());
        heard.extend_from_slice(status.details());
        heard.extend(metadata_bytes(status.metadata()));
    }
    heard
}

/// Metadata keys and values, binary values both as sent (base64) and decoded.
fn metadata_bytes(metadata: &MetadataMap) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in metadata.iter() {
        match entry {
            KeyAndValueRef::Ascii(key, value) => {
                bytes.extend_from_slice(key.as_str().as_bytes());
                bytes.extend_from_slice(value.as_encoded_bytes());
            }
            KeyAndValueRef::Binary(key, value) => {
                bytes.extend_from_slice(key.as_str().as_bytes());
                bytes.extend_from_slice(value.as_encoded_bytes());
                if let Ok(decoded) = value.to_bytes() {
                    bytes.extend_from_slice(&decoded);
                }
            }
        }
        bytes.push(b'\n');
    }
    bytes
}

/// The forms a secret could take in an answer: its text, that text in base64, and the
/// bytes the text stands for when it is base64 itself.
fn forms(secret: &str) -> Vec<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let mut forms = vec![secret.as_bytes().to_vec()];
    for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
        forms.push(engine.encode(secret).into_bytes());
    }
    if let Ok(raw) = STANDARD.decode(secret) {
        forms.push(raw);
    }
    forms
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|window| window == needle)
}
