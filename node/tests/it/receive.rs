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

/// Replies are bounded in bytes, not only in events: 84 events of 64 KiB (5.25 MiB, more
/// than gRPC's usual 4 MiB message limit in one reply) arrive in replies of about 1 MiB.
#[tokio::test]
async fn large_events_arrive_in_replies_bounded_in_bytes() {
    use tributary_client::{EventData, SendTarget};
    let node = TestNode::start().await;
    node.client
        .create_event_hub("large", 1, None)
        .await
        .unwrap();
    let event_bytes = 64 * 1024;
    for send in 0..7u8 {
        let events = (0..12u8).map(|i| EventData::from_body(vec![send * 12 + i; event_bytes]));
        node.client
            .producer()
            .send("large", SendTarget::PartitionId("0".into()), events)
            .await
            .unwrap();
    }
    let mut stream = node
        .client
        .consumer()
        .receive("large", "", "0", EventPosition::Earliest, 0)
        .await
        .unwrap();
    let mut received = 0usize;
    while received < 84 {
        let batch = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("events arrive")
            .expect("stream open")
            .unwrap();
        let bytes: usize = batch.iter().map(|e| e.body.len()).sum();
        assert!(
            bytes <= tributary_types::limits::RECEIVE_BATCH_BYTES_MAX + event_bytes,
            "a reply of {bytes} bytes"
        );
        for event in &batch {
            assert_eq!(event.sequence_number, received as i64);
            assert_eq!(event.body[0], received as u8);
            received += 1;
        }
    }
}
