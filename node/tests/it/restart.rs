//! Data survives a clean restart, and numbering continues.

use tributary_client::EventPosition;

use crate::support::{TestNode, body};

#[tokio::test]
async fn events_hubs_and_groups_survive_a_restart() {
    let mut node = TestNode::start().await;
    node.client
        .create_event_hub("durable", 2, None)
        .await
        .unwrap();
    node.client
        .create_consumer_group("durable", "audit")
        .await
        .unwrap();
    let before = node.send("durable", "1", &["one", "two"]).await;
    let read_before = node.read("durable", "1", EventPosition::Earliest, 2).await;
    node.restart().await;
    let hub = node.client.get_event_hub("durable").await.unwrap();
    assert_eq!(hub.partition_ids, vec!["0", "1"]);
    let groups = node.client.list_consumer_groups("durable").await.unwrap();
    assert!(groups.iter().any(|g| g.name == "audit"));
    let read_after = node.read("durable", "1", EventPosition::Earliest, 2).await;
    assert_eq!(read_before, read_after);
    let after = node.send("durable", "1", &["three"]).await;
    assert_eq!(before.first_sequence_number, 0);
    assert_eq!(after.first_sequence_number, 2);
    let all = node.read("durable", "1", EventPosition::Earliest, 3).await;
    assert_eq!(body(&all[2]), "three");
    assert!(all[2].offset.parse::<i64>().unwrap() > all[1].offset.parse::<i64>().unwrap());
}

#[tokio::test]
async fn a_deleted_hub_is_gone_and_its_name_can_be_reused() {
    let mut node = TestNode::start().await;
    node.client
        .create_event_hub("again", 1, None)
        .await
        .unwrap();
    node.send("again", "0", &["old life"]).await;
    node.client.delete_event_hub("again").await.unwrap();
    node.client
        .create_event_hub("again", 1, None)
        .await
        .unwrap();
    let props = node
        .client
        .get_partition_properties("again", "0")
        .await
        .unwrap();
    assert!(props.is_empty, "a re-created hub starts empty");
    node.restart().await;
    let props = node
        .client
        .get_partition_properties("again", "0")
        .await
        .unwrap();
    assert!(props.is_empty);
    assert_eq!(
        node.send("again", "0", &["new life"])
            .await
            .first_sequence_number,
        0
    );
}

#[tokio::test]
async fn shutdown_ends_open_readers_with_a_retryable_error() {
    use futures::StreamExt;
    let mut node = TestNode::start().await;
    node.client
        .create_event_hub("draining", 1, None)
        .await
        .unwrap();
    // Without retries the SDK does not resume the read, so the server's own ending shows.
    let mut stream = node
        .client
        .with_retry_deadline(std::time::Duration::ZERO)
        .consumer()
        .receive("draining", "", "0", EventPosition::Latest, 0)
        .await
        .unwrap();
    let restart = tokio::time::timeout(std::time::Duration::from_secs(30), node.restart());
    restart
        .await
        .expect("shutdown is not held up by an open reader");
    let err = stream.next().await.unwrap().unwrap_err();
    assert_eq!(
        err.reason(),
        Some(tributary_client::ErrorReason::Unavailable)
    );
    assert!(err.to_string().contains("shutting down"), "{err}");
}

/// A client's sends stay on one open stream between sends. A stopping node ends those
/// streams itself: an idle one does not hold its shutdown until the drain time (5 s) runs
/// out and cuts it off, and a client sending again finds the node gone, not a stream that
/// never answers.
#[tokio::test]
async fn a_stopping_node_ends_the_send_streams_held_to_it() {
    let mut node = TestNode::start().await;
    node.client
        .create_event_hub("streams", 1, None)
        .await
        .unwrap();
    node.send("streams", "0", &["one"]).await;
    let started = std::time::Instant::now();
    node.node.take().unwrap().shutdown().await.unwrap();
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(3),
        "shutdown took {took:?} with a send stream open"
    );
}
