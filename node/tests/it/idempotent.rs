//! Idempotent publishing: a retried batch is stored once and gets the original reply; a
//! batch that skips sequence numbers is refused; the producer state survives a restart.

use tributary_client::{ErrorReason, EventData, EventPosition};
use tributary_proto::v1 as pb;
use tributary_proto::v1::producer_client::ProducerClient;

use crate::support::TestNode;

fn batch(producer_id: u64, producer_sequence: i64, bodies: &[&str]) -> pb::SendRequest {
    pb::SendRequest {
        event_hub: "idem".into(),
        target: Some(pb::send_request::Target::PartitionId("0".into())),
        events: bodies
            .iter()
            .map(|b| pb::EventData {
                body: b.to_string().into(),
                properties: Default::default(),
            })
            .collect(),
        producer_id,
        producer_sequence,
    }
}

async fn stored(node: &TestNode) -> i64 {
    let props = node
        .client
        .get_partition_properties("idem", "0")
        .await
        .unwrap();
    props.last_enqueued_sequence_number + 1
}

#[tokio::test]
async fn a_retried_batch_is_stored_once_with_the_original_reply_even_after_a_restart() {
    let mut node = TestNode::start().await;
    node.client.create_event_hub("idem", 1, None).await.unwrap();
    let mut raw = ProducerClient::connect(node.endpoint()).await.unwrap();
    let first = raw
        .send(batch(7, 0, &["a", "b"]))
        .await
        .unwrap()
        .into_inner();
    node.clock.advance_ms(5_000);
    let retried = raw
        .send(batch(7, 0, &["a", "b"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(retried, first, "a retry gets the original reply");
    assert_eq!(stored(&node).await, 2);
    raw.send(batch(7, 2, &["c"])).await.unwrap();
    assert_eq!(stored(&node).await, 3);

    // The producer state is part of the partition's durable state.
    node.restart().await;
    let mut raw = ProducerClient::connect(node.endpoint()).await.unwrap();
    let again = raw.send(batch(7, 2, &["c"])).await.unwrap().into_inner();
    assert_eq!(again.first_sequence_number, 2);
    assert_eq!(stored(&node).await, 3);
    let events = node.read("idem", "0", EventPosition::Earliest, 3).await;
    let bodies: Vec<_> = events.iter().map(crate::support::body).collect();
    assert_eq!(bodies, ["a", "b", "c"]);
}

#[tokio::test]
async fn a_gap_in_a_producers_numbering_is_refused() {
    let node = TestNode::start().await;
    node.client.create_event_hub("idem", 1, None).await.unwrap();
    let mut raw = ProducerClient::connect(node.endpoint()).await.unwrap();
    raw.send(batch(9, 0, &["a"])).await.unwrap();
    let status = raw.send(batch(9, 5, &["x"])).await.unwrap_err();
    let err = tributary_client::ClientError::from_status(status, "test");
    assert_eq!(err.reason(), Some(ErrorReason::OutOfOrderSequence));
    assert!(err.to_string().contains("expects 1 next"), "{err}");
    assert_eq!(
        stored(&node).await,
        1,
        "nothing of the refused batch was stored"
    );
    // Another producer is independent.
    raw.send(batch(10, 100, &["b"])).await.unwrap();
    assert_eq!(stored(&node).await, 2);
    // Idempotence needs an explicit partition.
    let mut untargeted = batch(11, 0, &["c"]);
    untargeted.target = None;
    let status = raw.send(untargeted).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
}

#[tokio::test]
async fn the_sdks_idempotent_producer_numbers_its_batches() {
    let node = TestNode::start().await;
    node.client.create_event_hub("idem", 2, None).await.unwrap();
    let producer = node.client.idempotent_producer();
    for round in 0..3 {
        for partition in ["0", "1"] {
            let response = producer
                .send(
                    "idem",
                    partition,
                    [
                        EventData::from_body(format!("{round}")),
                        EventData::from_body("x"),
                    ],
                )
                .await
                .unwrap();
            assert_eq!(response.first_sequence_number, 2 * round);
        }
    }
    // A batch replayed with the producer's last number is recognised as a retry.
    let mut raw = ProducerClient::connect(node.endpoint()).await.unwrap();
    let replay = raw
        .send(batch(producer.producer_id(), 4, &["2", "x"]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replay.first_sequence_number, 4);
    assert_eq!(stored(&node).await, 6);
}
