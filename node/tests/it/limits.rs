//! Limits against abuse on the client port: connections over `--max-connections` are told
//! the node is busy and why, a place frees when a connection closes, and a connection that
//! sends nothing is closed after `--idle-timeout` while an idle SDK client stays connected.

use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tributary_client::{Client, ClientError, ErrorReason};
use tributary_cluster_tests::eventually;

use crate::support::TestNode;

const IDLE_TIMEOUT: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_over_the_limit_are_told_why() {
    let node = TestNode::start_with(|config| {
        // The test node's own client is the first connection.
        config.connections.max_connections = 2;
    })
    .await;
    node.client
        .create_event_hub("limits", 1, None)
        .await
        .unwrap();
    let second = Client::connect(&node.endpoint()).await.unwrap();
    second.list_event_hubs().await.unwrap();

    // A third connection: refused with the reason, not reset.
    let third = Client::connect(&node.endpoint())
        .await
        .unwrap()
        .with_retry_deadline(Duration::ZERO);
    let refused = third.list_event_hubs().await.unwrap_err();
    match &refused {
        ClientError::Service {
            reason, message, ..
        } => {
            assert_eq!(*reason, ErrorReason::ServerBusy, "{refused}");
            assert!(message.contains("--max-connections"), "{refused}");
        }
        other => panic!("expected a busy error naming the limit, got {other}"),
    }
    assert!(
        refused.is_transient(),
        "the SDK retries a busy node: {refused}"
    );

    // The second client goes away: the third gets its place once its refused connection
    // has closed and it connects again.
    drop(second);
    eventually(
        Duration::from_secs(30),
        "the freed place given to the third client",
        async || match third.list_event_hubs().await {
            Ok(_) => Ok(()),
            Err(e) if e.is_transient() => Err(e.to_string()),
            Err(e) => panic!("the freed place was not given to the third client: {e}"),
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_idle_clients_are_not() {
    let node = TestNode::start_with(|config| {
        config.connections.idle_timeout = IDLE_TIMEOUT;
    })
    .await;
    node.client.list_event_hubs().await.unwrap();
    // A connection that never says anything is closed after the idle timeout...
    let started = tokio::time::Instant::now();
    let mut silent = TcpStream::connect(node.node.as_ref().unwrap().client_addr)
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "a silent connection stayed open");
    assert!(
        started.elapsed() >= IDLE_TIMEOUT,
        "closed after {:?}, before the idle timeout",
        started.elapsed()
    );
    // ...while an HTTP/2 connection that sends nothing of its own but answers the node's
    // pings (as every HTTP/2 client does) stays open well past it.
    let tcp = TcpStream::connect(node.node.as_ref().unwrap().client_addr)
        .await
        .unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake::<_, _, http_body_util::Empty<bytes::Bytes>>(
            hyper_util::rt::TokioExecutor::new(),
            hyper_util::rt::TokioIo::new(tcp),
        )
        .await
        .unwrap();
    let connection = tokio::spawn(connection);
    tokio::time::sleep(IDLE_TIMEOUT * 3).await;
    assert!(
        !connection.is_finished(),
        "an idle HTTP/2 connection answering pings was closed: {:?}",
        connection.await
    );
    sender.ready().await.expect("the connection is still open");
}
