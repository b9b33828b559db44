//! Every position kind, with inclusive and exclusive edges and out-of-range values.

use std::time::Duration;

use futures::StreamExt;
use tributary_client::{ErrorReason, EventPosition};

use crate::support::{TestNode, body};

const T0: i64 = 1_700_000_000_000;

/// a,b at T0; c at T0+1000; d,e at T0+2000.
async fn fixture() -> TestNode {
    let node = TestNode::start().await;
    node.client.create_event_hub("pos", 1, None).await.unwrap();
    node.clock.set_ms(T0);
    node.send("pos", "0", &["a", "b"]).await;
    node.clock.set_ms(T0 + 1000);
    node.send("pos", "0", &["c"]).await;
    node.clock.set_ms(T0 + 2000);
    node.send("pos", "0", &["d", "e"]).await;
    node
}

async fn first(node: &TestNode, position: EventPosition) -> String {
    body(&node.read("pos", "0", position, 1).await[0])
}

/// The position waits at the end: the next event published is the first one read.
async fn waits_for_next(node: &TestNode, position: EventPosition, next_body: &str) {
    let mut stream = node
        .client
        .consumer()
        .receive("pos", "", "0", position, 0)
        .await
        .unwrap();
    node.send("pos", "0", &[next_body]).await;
    let batch = tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(body(&batch[0]), next_body);
}

#[tokio::test]
async fn earliest_and_latest() {
    let node = fixture().await;
    assert_eq!(first(&node, EventPosition::Earliest).await, "a");
    waits_for_next(&node, EventPosition::Latest, "f").await;
}

#[tokio::test]
async fn latest_on_an_empty_partition_gets_the_first_event() {
    let node = TestNode::start().await;
    node.client
        .create_event_hub("empty", 1, None)
        .await
        .unwrap();
    let props = node
        .client
        .get_partition_properties("empty", "0")
        .await
        .unwrap();
    assert!(props.is_empty);
    assert_eq!(props.last_enqueued_sequence_number, -1);
    let mut stream = node
        .client
        .consumer()
        .receive("empty", "", "0", EventPosition::Latest, 0)
        .await
        .unwrap();
    node.send("empty", "0", &["first"]).await;
    let batch = stream.next().await.unwrap().unwrap();
    assert_eq!(batch[0].sequence_number, 0);
    assert_eq!(body(&batch[0]), "first");
}

#[tokio::test]
async fn sequence_numbers_inclusive_exclusive_and_past_the_end() {
    let node = fixture().await;
    let seq = |sequence_number, inclusive| EventPosition::SequenceNumber {
        sequence_number,
        inclusive,
    };
    assert_eq!(first(&node, seq(2, true)).await, "c");
    assert_eq!(first(&node, seq(2, false)).await, "d");
    assert_eq!(first(&node, seq(0, true)).await, "a");
    assert_eq!(first(&node, seq(-1, false)).await, "a");
    // Exclusive of the last event and inclusive of the next one both wait for it.
    waits_for_next(&node, seq(4, false), "f").await;
    waits_for_next(&node, seq(6, true), "g").await;
    let err = node
        .client
        .consumer()
        .receive("pos", "", "0", seq(9, true), 0)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), Some(ErrorReason::InvalidArgument));
    assert!(
        err.to_string().contains(
            "The supplied sequence number '9' is invalid. The last sequence number in the system is '6'"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn offsets_inclusive_exclusive_and_past_the_end() {
    let node = fixture().await;
    let all = node.read("pos", "0", EventPosition::Earliest, 5).await;
    let offset_of = |i: usize| all[i].offset.parse::<i64>().unwrap();
    let off = |offset, inclusive| EventPosition::Offset { offset, inclusive };
    assert_eq!(first(&node, off(offset_of(2), true)).await, "c");
    assert_eq!(first(&node, off(offset_of(2), false)).await, "d");
    // Between two events' offsets: the next event after it.
    assert_eq!(first(&node, off(offset_of(2) + 1, true)).await, "d");
    assert_eq!(first(&node, off(-1, false)).await, "a");
    waits_for_next(&node, off(offset_of(4), false), "f").await;
    let err = node
        .client
        .consumer()
        .receive("pos", "", "0", off(offset_of(4) + 1_000_000, true), 0)
        .await
        .unwrap_err();
    assert_eq!(err.reason(), Some(ErrorReason::InvalidArgument));
    assert!(
        err.to_string()
            .contains("is invalid. The last offset in the system is"),
        "{err}"
    );
}

#[tokio::test]
async fn enqueued_times_before_between_and_after() {
    let node = fixture().await;
    let time = |time_ms, inclusive| EventPosition::EnqueuedTime { time_ms, inclusive };
    assert_eq!(first(&node, time(T0 - 60_000, false)).await, "a");
    assert_eq!(first(&node, time(T0, true)).await, "a");
    assert_eq!(first(&node, time(T0, false)).await, "c");
    assert_eq!(first(&node, time(T0 + 500, false)).await, "c");
    assert_eq!(first(&node, time(T0 + 1000, false)).await, "d");
    node.clock.set_ms(T0 + 3000);
    waits_for_next(&node, time(T0 + 2000, false), "f").await;
}

#[tokio::test]
async fn enqueued_time_never_decreases_when_the_clock_steps_back() {
    let node = fixture().await;
    node.clock.set_ms(T0 - 3_600_000);
    let response = node.send("pos", "0", &["late"]).await;
    assert_eq!(response.enqueued_time_ms, T0 + 2000);
    let all = node.read("pos", "0", EventPosition::Earliest, 6).await;
    assert!(
        all.windows(2)
            .all(|w| w[0].enqueued_time_ms <= w[1].enqueued_time_ms)
    );
    node.clock.set_ms(T0 + 10_000);
    let response = node.send("pos", "0", &["later"]).await;
    assert_eq!(response.enqueued_time_ms, T0 + 10_000);
}
