//! TLS on the client port and mutual TLS on the peer port, through the real binary: who may
//! talk to a node, what a client that gets it wrong is told, renewed certificates, garbage.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tokio::time::Instant;
use tributary_client::tls::{TlsConnector, client_config, read_certificates};
use tributary_client::{Client, ClientError, ClientOptions, EventData, SendTarget};
use tributary_cluster_tests::{
    LocalCluster, NodeCert, NodePorts, NodeProcess, TestCa, TestDir, TlsTrust, blob_answers, cli,
    describe_output, eventually, http_get,
};
use tributary_proto::peer::node_status_client::NodeStatusClient;
use tributary_proto::peer::raft_peer_client::RaftPeerClient;
use tributary_proto::peer::{
    GroupMessage, LocalStatusRequest, MessageKind, SessionMessage, group_reply,
};

/// How long a node that must not get into the cluster is given to try.
const JOIN_REFUSED_WAIT: Duration = Duration::from_secs(15);
/// Pause between two looks at a condition being waited for.
const POLL_INTERVAL: Duration = Duration::from_millis(100);

fn options(ca: &TestCa) -> ClientOptions {
    ClientOptions {
        ca_cert: Some(ca.ca_pem()),
    }
}

fn stderr(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A TLS client configuration trusting `ca`, presenting `cert` when given.
fn tls_client(ca: &TestCa, cert: Option<&NodeCert>) -> rustls::ClientConfig {
    let roots = read_certificates(&ca.ca_pem()).expect("the CA's certificate");
    let Some(cert) = cert else {
        return client_config(&roots, None).expect("a client configuration");
    };
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root).expect("a usable CA certificate");
    }
    let chain = read_certificates(&cert.cert).expect("the node's certificate");
    let key = PrivateKeyDer::from_pem_file(&cert.key).expect("the node's key");
    let mut config =
        rustls::ClientConfig::builder_with_provider(tributary_client::tls::crypto_provider())
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_root_certificates(store)
            .with_client_auth_cert(chain, key)
            .expect("a usable client certificate");
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

/// The end-entity certificate a fresh TLS handshake with `addr` sees.
async fn presented(addr: SocketAddr, config: rustls::ClientConfig) -> CertificateDer<'static> {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let stream = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .expect("a TLS handshake");
    stream
        .get_ref()
        .1
        .peer_certificates()
        .expect("a certificate")[0]
        .clone()
}

fn end_entity(cert: &NodeCert) -> CertificateDer<'static> {
    read_certificates(&cert.cert).expect("the node's certificate")[0].clone()
}

/// A node's own status over its peer port, dialed with `config`.
async fn peer_status(addr: SocketAddr, config: rustls::ClientConfig) -> Result<u64, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{addr}"))
        .expect("a valid URL")
        .connect_timeout(Duration::from_secs(5))
        .connect_with_connector_lazy(TlsConnector::new(Arc::new(config)));
    let mut request = tonic::Request::new(LocalStatusRequest {});
    request.set_timeout(Duration::from_secs(5));
    NodeStatusClient::new(channel)
        .local_status(request)
        .await
        .map(|reply| reply.into_inner().node)
}

/// The value of `tributary_tls_connections_refused_total{port="<port>"}` on `node`.
async fn refused_connections(node: &NodeProcess, port: &str) -> u64 {
    let metrics = http_get(node.http_addr(), "/metrics")
        .await
        .expect("metrics")
        .body;
    let label = format!("tributary_tls_connections_refused_total{{port=\"{port}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&label))
        .map_or(0, |value| value.trim().parse().expect("a counter"))
}

#[tokio::test]
async fn the_client_port_serves_tls_and_tells_clients_that_get_it_wrong() {
    let dir = TestDir::new("the_client_port_serves_tls_and_tells_clients_that_get_it_wrong");
    let ca = TestCa::new(dir.path(), "ca-one").await;
    let other_ca = TestCa::new(dir.path(), "ca-two").await;
    let cert = ca.node_cert("node-1", None).await;
    let args = cert.client_port_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let node = NodeProcess::start_with_args(&dir.path().join("tls"), &args).await;
    let ca_pem = ca.ca_pem();
    let ca_pem = ca_pem.to_str().unwrap();

    let https = node.tls_endpoint();
    let output = cli(
        &https,
        &[
            "--ca-cert",
            ca_pem,
            "hub",
            "create",
            "orders",
            "--partitions",
            "2",
        ],
    )
    .await;
    assert!(output.status.success(), "{}", describe_output(&output));
    let client = Client::connect_with(&https, options(&ca)).await.unwrap();
    let hubs = client.list_event_hubs().await.unwrap();
    let names: Vec<&str> = hubs.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(names, ["orders"]);

    // The Blob endpoint is HTTPS with the same certificate, and negotiates HTTP/1.1 with
    // clients offering it (as the Azure Storage SDKs' HTTP clients do).
    let ca_path = ca.ca_pem();
    let trust = TlsTrust {
        ca_pem: &ca_path,
        server_name: "127.0.0.1",
    };
    blob_answers(node.blob_addr(), Some(trust), false)
        .await
        .unwrap_or_else(|e| panic!("the Blob endpoint over TLS: {e}"));

    // Plain text to the TLS port: told at once, not retried.
    let plain = node.endpoint();
    let started = Instant::now();
    let output = cli(&plain, &["hub", "list"]).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    assert!(
        stderr(&output).contains("speaks TLS only: use an https:// endpoint"),
        "{}",
        describe_output(&output)
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "answered at once"
    );

    // https:// without the CA, with another CA.
    let output = cli(&https, &["hub", "list"]).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    assert!(
        stderr(&output).contains("--ca-cert"),
        "{}",
        describe_output(&output)
    );
    let other_pem = other_ca.ca_pem();
    let output = cli(
        &https,
        &["--ca-cert", other_pem.to_str().unwrap(), "hub", "list"],
    )
    .await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    let text = stderr(&output);
    assert!(
        text.contains("is not trusted"),
        "{}",
        describe_output(&output)
    );
    assert!(text.contains("--ca-cert"), "{}", describe_output(&output));

    // TLS to a plain-text port.
    let plain_node = NodeProcess::start(&dir.path().join("plain")).await;
    let output = cli(
        &plain_node.tls_endpoint(),
        &["--ca-cert", ca_pem, "hub", "list"],
    )
    .await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    assert!(
        stderr(&output).contains("does not speak TLS"),
        "{}",
        describe_output(&output)
    );
    let error = Client::connect_with(&plain_node.tls_endpoint(), options(&ca))
        .await
        .unwrap()
        .list_event_hubs()
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Tls { .. }), "{error:?}");
}

#[tokio::test]
async fn garbage_on_the_tls_ports_leaves_the_node_serving() {
    let dir = TestDir::new("garbage_on_the_tls_ports_leaves_the_node_serving");
    let ca = TestCa::new(dir.path(), "ca").await;
    let cert = ca.node_cert("node-1", Some(1)).await;
    let mut args = cert.client_port_args();
    args.extend(cert.peer_port_args(&ca));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut node = NodeProcess::start_with_args(&dir.path().join("node"), &args).await;

    let mut held = Vec::new();
    for addr in [node.client_addr(), node.peer_addr()] {
        // Silent, garbage, a broken TLS record, and plain-text HTTP/2.
        held.push(TcpStream::connect(addr).await.unwrap());
        for bytes in [
            &b"\xde\xad\xbe\xef garbage"[..],
            &[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5],
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        ] {
            let mut stream = TcpStream::connect(addr).await.unwrap();
            stream.write_all(bytes).await.unwrap();
            held.push(stream);
        }
    }
    let plain = Client::connect(&node.endpoint()).await.unwrap();
    let error = plain.list_event_hubs().await.unwrap_err();
    assert!(error.to_string().contains("speaks TLS"), "{error}");

    let client = Client::connect_with(&node.tls_endpoint(), options(&ca))
        .await
        .unwrap();
    client.create_event_hub("orders", 2, None).await.unwrap();
    let sent = client
        .producer()
        .send("orders", SendTarget::Any, [EventData::from_body("hello")])
        .await
        .unwrap();
    assert_eq!(sent.offsets.len(), 1, "{sent:?}");
    assert_eq!(
        peer_status(node.peer_addr(), tls_client(&ca, Some(&cert)))
            .await
            .unwrap(),
        1
    );
    node.assert_running();
    // The garbage and the broken TLS record were refused on both ports (the silent and
    // the plain-text connections are counted when they end).
    for port in ["client", "peer"] {
        let what = format!("2 refusals on the {port} port counted");
        eventually(
            Duration::from_secs(10),
            what,
            async || match refused_connections(&node, port).await {
                refused if refused >= 2 => Ok(()),
                refused => Err(format!("{refused} counted")),
            },
        )
        .await;
    }
}

#[tokio::test]
async fn renewed_certificates_are_used_without_a_restart() {
    let dir = TestDir::new("renewed_certificates_are_used_without_a_restart");
    let ca = TestCa::new(dir.path(), "ca").await;
    let client_cert = ca.node_cert("client-port", None).await;
    let peer_cert = ca.node_cert("peer-port", Some(1)).await;
    let mut args = client_cert.client_port_args();
    args.extend(peer_cert.peer_port_args(&ca));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut node = NodeProcess::start_with_args(&dir.path().join("node"), &args).await;
    let member = ca.node_cert("member", Some(2)).await;

    let first_client = end_entity(&client_cert);
    let first_peer = end_entity(&peer_cert);
    assert_eq!(
        presented(node.client_addr(), tls_client(&ca, None)).await,
        first_client
    );
    assert_eq!(
        presented(node.peer_addr(), tls_client(&ca, Some(&member))).await,
        first_peer
    );

    ca.node_cert("client-port", None).await;
    ca.node_cert("peer-port", Some(1)).await;
    let renewed_client = end_entity(&client_cert);
    let renewed_peer = end_entity(&peer_cert);
    assert_ne!(renewed_client, first_client);
    assert_ne!(renewed_peer, first_peer);
    assert_eq!(
        presented(node.client_addr(), tls_client(&ca, None)).await,
        renewed_client
    );
    assert_eq!(
        presented(node.peer_addr(), tls_client(&ca, Some(&member))).await,
        renewed_peer
    );
    // Without a restart: the same process still serves.
    let client = Client::connect_with(&node.tls_endpoint(), options(&ca))
        .await
        .unwrap();
    client.create_event_hub("orders", 1, None).await.unwrap();
    node.assert_running();
}

#[tokio::test]
async fn nodes_without_a_certificate_from_the_cluster_ca_cannot_join() {
    let dir = TestDir::new("nodes_without_a_certificate_from_the_cluster_ca_cannot_join");
    let ca = TestCa::new(dir.path(), "cluster-ca").await;
    let other_ca = TestCa::new(dir.path(), "other-ca").await;
    // A certificate for each node, naming it (all valid for 127.0.0.1).
    let mut certs = Vec::new();
    for id in 1..=3 {
        certs.push(ca.node_cert(&format!("node-{id}"), Some(id)).await);
    }
    let cluster = LocalCluster::start_with_node_args(
        dir.path(),
        3,
        |id| {
            let cert = &certs[id as usize - 1];
            let mut args = cert.client_port_args();
            args.extend(cert.peer_port_args(&ca));
            args
        },
        &[],
    )
    .await;
    let cert = certs[1].clone();

    // The cluster forms and serves over mutual TLS; sends to every partition follow
    // NOT_LEADER hints to other nodes over https://.
    let client = Client::connect_with(&cluster.nodes[0].tls_endpoint(), options(&ca))
        .await
        .unwrap();
    client
        .create_replicated_event_hub("orders", 3, None, Some(3))
        .await
        .unwrap();
    for partition in ["0", "1", "2"] {
        client
            .producer()
            .send(
                "orders",
                SendTarget::PartitionId(partition.into()),
                [EventData::from_body("hello")],
            )
            .await
            .unwrap();
    }

    // A node with a certificate from another CA, and one without peer TLS. Each expects
    // another node before it forms a cluster of its own (a node expecting only itself forms
    // one when its seeds do not answer), so ready would mean it joined this one.
    let stranger_cert = other_ca.node_cert("stranger", Some(4)).await;
    let seeds = cluster.seeds.clone();
    let outsider_args = |id: &str| -> Vec<String> {
        [
            "--node-id",
            id,
            "--seeds",
            &seeds,
            "--bootstrap-expect",
            "2",
        ]
        .map(String::from)
        .to_vec()
    };
    let mut stranger_args = outsider_args("4");
    stranger_args.extend(stranger_cert.peer_port_args(&other_ca));
    let mut stranger = NodeProcess::launch_with_env(
        &dir.path().join("stranger"),
        NodePorts::free(),
        &stranger_args,
        &[],
    );
    let plain_args = outsider_args("5");
    let mut plain = NodeProcess::launch_with_env(
        &dir.path().join("plain"),
        NodePorts::free(),
        &plain_args,
        &[],
    );
    let deadline = Instant::now() + JOIN_REFUSED_WAIT;
    while Instant::now() < deadline {
        for outsider in [&mut stranger, &mut plain] {
            outsider.assert_running();
            let ready = http_get(outsider.http_addr(), "/readyz").await;
            assert!(
                !ready.is_ok_and(|r| r.status == 200),
                "a node without a certificate from the cluster CA got ready"
            );
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
    let status = client.cluster_status().await.unwrap();
    let mut members: Vec<u64> = status.nodes.iter().map(|n| n.id).collect();
    members.sort_unstable();
    assert_eq!(members, [1, 2, 3], "{status:?}");
    let mut refused = 0;
    for node in &cluster.nodes {
        refused += refused_connections(node, "peer").await;
    }
    assert!(refused >= 2, "refused peer connections: {refused}");

    stranger.terminate().await;
    plain.terminate().await;
    // Each outsider was told why.
    let log = std::fs::read_to_string(plain.log_path()).unwrap();
    assert!(
        log.contains("this peer port speaks mutual TLS only"),
        "{log}"
    );
    let log = std::fs::read_to_string(stranger.log_path()).unwrap();
    assert!(log.contains("is not trusted"), "{log}");
    assert!(log.contains("--peer-ca"), "{log}");

    // Calls to the peer port: without a client certificate, or with one from another CA,
    // refused (and counted); with one from the cluster CA, answered.
    let peer = cluster.nodes[0].peer_addr();
    let unnamed = ca.node_cert("names-no-node", None).await;
    for (what, config) in [
        ("no client certificate", tls_client(&ca, None)),
        (
            "a certificate from the cluster CA naming no node",
            tls_client(&ca, Some(&unnamed)),
        ),
        (
            "a certificate from another CA",
            tls_client(&ca, Some(&stranger_cert)),
        ),
    ] {
        let before = refused_connections(&cluster.nodes[0], "peer").await;
        let answer = peer_status(peer, config).await;
        assert!(
            answer.is_err(),
            "a call with {what} was answered: {answer:?}"
        );
        let counted = format!("the call with {what} counted as refused");
        eventually(
            Duration::from_secs(10),
            counted,
            async || match refused_connections(&cluster.nodes[0], "peer").await {
                refused if refused > before => Ok(()),
                refused => Err(format!("{refused} refused, as before")),
            },
        )
        .await;
    }
    assert_eq!(
        peer_status(peer, tls_client(&ca, Some(&cert)))
            .await
            .unwrap(),
        1
    );
    // Node 2's certificate speaks for node 2 only: a Raft message claiming to come from
    // node 3 over it is refused before it reaches any group.
    let channel = tonic::transport::Endpoint::from_shared(format!("https://{peer}"))
        .expect("a valid URL")
        .connect_with_connector_lazy(TlsConnector::new(Arc::new(tls_client(&ca, Some(&cert)))));
    let impostor = GroupMessage {
        group: 0,
        kind: MessageKind::Vote as i32,
        payload: Vec::new().into(),
        from_node: 3,
        to_member: 1,
    };
    let error = RaftPeerClient::new(channel.clone())
        .call(impostor.clone())
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::PermissionDenied, "{error:?}");
    assert!(error.message().contains("names node 2"), "{error:?}");
    // The same message on a session (where replication travels) is answered with the
    // refusal, under its call id.
    let mut replies = RaftPeerClient::new(channel)
        .session(futures::stream::iter([SessionMessage {
            id: 7,
            message: Some(impostor),
        }]))
        .await
        .expect("a session")
        .into_inner();
    let reply = replies.message().await.unwrap().expect("a reply");
    assert_eq!(reply.id, 7);
    match reply.reply.and_then(|reply| reply.result) {
        Some(group_reply::Result::Error(error)) => {
            assert!(error.contains("names node 2"), "{error}")
        }
        other => panic!("the impostor's message was not refused: {other:?}"),
    }
}
