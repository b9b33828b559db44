//! A reader at the end of a partition waits for the next commit instead of polling.

use std::time::Duration;

use futures::StreamExt;
use tributary_client::EventPosition;

use crate::support::{TestNode, body};

#[tokio::test]
async fn caught_up_reader_is_woken_by_the_next_commit_without_polling() {
    let node = TestNode::start().await;
    node.client.create_event_hub("wake", 2, None).await.unwrap();
    node.send("wake", "0", &["before"]).await;
    let mut stream = node
        .client
        .consumer()
        .receive("wake", "", "0", EventPosition::Earliest, 0)
        .await
        .unwrap();
    assert_eq!(body(&stream.next().await.unwrap().unwrap()[0]), "before");

    let broker = &node.node.as_ref().unwrap().broker;
    let hub = broker.hub("wake").unwrap();
    let partition = broker.local_partition(&hub, 0).unwrap();
    // Commits to another partition must not wake this reader.
    node.send("wake", "1", &["elsewhere"]).await;
    let reads_when_caught_up = partition.read_calls();
    // Idle on purpose: a polling reader would read storage again and again meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        partition.read_calls() <= reads_when_caught_up + 1,
        "the caught-up reader kept reading: {} -> {}",
        reads_when_caught_up,
        partition.read_calls()
    );
    node.send("wake", "0", &["after"]).await;
    let batch = tokio::time::timeout(Duration::from_secs(5), stream.next())
        .await
        .expect("woken by the commit")
        .unwrap()
        .unwrap();
    assert_eq!(body(&batch[0]), "after");
    assert_eq!(batch[0].sequence_number, 1);
}
