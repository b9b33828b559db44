//! Reader rules per consumer group and partition over the real API (SPEC.md section 3): five
//! plain readers at most, owner-level displacement and refusal, and a reader's slot freed the
//! moment its stream is gone.

use std::time::Duration;

use futures::StreamExt;
use tributary_client::{ClientError, EventPosition, ReceiveOptions, ReceiveStream};
use tributary_proto::ErrorReason;

use crate::support::{TestNode, body};

async fn reader(
    node: &TestNode,
    name: &str,
    owner_level: Option<i64>,
) -> Result<ReceiveStream, ClientError> {
    node.client
        .consumer()
        .receive_with(
            "readers",
            "",
            "0",
            EventPosition::Earliest,
            ReceiveOptions {
                owner_level,
                reader_name: name.to_string(),
                ..ReceiveOptions::default()
            },
        )
        .await
}

/// The error a displaced reader's stream ends with.
async fn ended_with(stream: &mut ReceiveStream) -> ClientError {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.next())
            .await
            .expect("the displaced stream ends")
        {
            Some(Ok(_)) => continue,
            Some(Err(err)) => return err,
            None => panic!("the stream ended without an error"),
        }
    }
}

/// A node with hub `readers`: one partition holding one event.
async fn node_with_an_event() -> TestNode {
    let node = TestNode::start().await;
    node.client
        .create_event_hub("readers", 1, None)
        .await
        .unwrap();
    node.send("readers", "0", &["e"]).await;
    node
}

/// The error a reader that must be refused gets.
fn refused(result: Result<ReceiveStream, ClientError>) -> ClientError {
    match result {
        Ok(_) => panic!("the reader was let in"),
        Err(err) => err,
    }
}

#[tokio::test]
async fn a_sixth_plain_reader_is_refused_until_one_goes() {
    let node = node_with_an_event().await;
    let mut readers = Vec::new();
    for i in 0..5 {
        let mut stream = reader(&node, &format!("r{i}"), None).await.unwrap();
        assert_eq!(body(&stream.next().await.unwrap().unwrap()[0]), "e");
        readers.push(stream);
    }
    let err = refused(reader(&node, "r5", None).await);
    assert_eq!(err.reason(), Some(ErrorReason::QuotaExceeded));
    assert!(
        err.to_string().contains(
            "Exceeded the maximum number of allowed receivers per partition in a consumer group which is 5. List of connected receivers - r0, r1, r2, r3, r4"
        ),
        "{err}"
    );
    // Another consumer group has its own quota.
    node.client
        .create_consumer_group("readers", "audit")
        .await
        .unwrap();
    node.client
        .consumer()
        .receive("readers", "audit", "0", EventPosition::Earliest, 0)
        .await
        .unwrap();
    // Dropping a reader frees its slot at once: the server notices its stream is gone.
    drop(readers.pop());
    let started = tokio::time::Instant::now();
    loop {
        match reader(&node, "r5", None).await {
            Ok(_) => break,
            Err(err) => {
                assert_eq!(err.reason(), Some(ErrorReason::QuotaExceeded));
                assert!(
                    started.elapsed() < Duration::from_secs(2),
                    "the slot stayed taken: {err}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

#[tokio::test]
async fn owner_levels_displace_equal_or_lower_and_refuse_the_rest() {
    let node = node_with_an_event().await;
    let mut plain = reader(&node, "plain", None).await.unwrap();
    plain.next().await.unwrap().unwrap();

    // A reader with an owner level displaces plain readers.
    let mut first = reader(&node, "first", Some(0)).await.unwrap();
    first.next().await.unwrap().unwrap();
    let err = ended_with(&mut plain).await;
    assert_eq!(err.reason(), Some(ErrorReason::ReaderDisconnected));
    assert!(
        err.to_string().contains("displaced by a newer reader"),
        "{err}"
    );

    // An equal level displaces too (a new owner takes over from the old one).
    let mut second = reader(&node, "second", Some(0)).await.unwrap();
    second.next().await.unwrap().unwrap();
    let err = ended_with(&mut first).await;
    assert!(
        err.to_string()
            .contains("current receiver 'first' with epoch '0' is getting disconnected"),
        "{err}"
    );

    // A higher level displaces; then a lower one and a plain one are refused.
    let _third = reader(&node, "third", Some(3)).await.unwrap();
    ended_with(&mut second).await;
    let err = refused(reader(&node, "low", Some(2)).await);
    assert_eq!(err.reason(), Some(ErrorReason::ReaderDisconnected));
    assert!(err.to_string().contains("higher epoch '3'"), "{err}");
    let err = refused(reader(&node, "late", None).await);
    assert_eq!(err.reason(), Some(ErrorReason::ReaderDisconnected));
    assert!(
        err.to_string().contains("with epoch '3' is connected"),
        "{err}"
    );
}
