//! The SDK's buffered producer against a node: events enqueued one by one travel in
//! batches it makes, within its limits and the service's, in the order they were enqueued.

use futures::FutureExt as _;
use tributary_client::{
    BufferedOptions, BufferedProducer, ClientError, Delivery, DeliveryFuture, EventData,
    EventPosition, SendTarget,
};

use crate::support::{TestNode, body};

async fn deliveries(futures: Vec<DeliveryFuture>) -> Vec<Delivery> {
    let mut delivered = Vec::with_capacity(futures.len());
    for future in futures {
        delivered.push(future.await.expect("every event is delivered"));
    }
    delivered
}

/// A node with a 2-partition hub "buffered" and a producer making batches of 50 at most.
async fn node_with_hub() -> (TestNode, BufferedProducer) {
    let node = TestNode::start().await;
    node.client
        .create_event_hub("buffered", 2, None)
        .await
        .unwrap();
    let producer = node.client.buffered_producer(BufferedOptions {
        max_batch_events: 50,
        ..BufferedOptions::default()
    });
    (node, producer)
}

async fn enqueue(producer: &BufferedProducer, target: SendTarget, body: String) -> DeliveryFuture {
    producer
        .enqueue("buffered", target, EventData::from_body(body))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_every_outcome_and_each_target_keeps_its_order() {
    let (_node, producer) = node_with_hub().await;
    let mut to_partition = Vec::new();
    let mut to_key = Vec::new();
    for i in 0..600 {
        to_partition.push(
            enqueue(
                &producer,
                SendTarget::PartitionId("0".into()),
                format!("p-{i}"),
            )
            .await,
        );
        if i % 2 == 0 {
            to_key.push(
                enqueue(
                    &producer,
                    SendTarget::PartitionKey("k".into()),
                    format!("k-{i}"),
                )
                .await,
            );
        }
    }
    producer.flush().await;
    assert_eq!(producer.outstanding(), 0);
    // After the flush every outcome is already known.
    let known = |futures: Vec<DeliveryFuture>| -> Vec<Delivery> {
        futures
            .into_iter()
            .map(|f| {
                // Unconstrained: tokio's cooperative budget would make the 129th ready
                // receiver in one poll report pending.
                tokio::task::unconstrained(f)
                    .now_or_never()
                    .expect("flush returned before an event's outcome was known")
                    .expect("delivered")
            })
            .collect()
    };
    let to_partition = known(to_partition);
    let to_key = known(to_key);
    let sequences = |d: &[Delivery]| d.iter().map(|d| d.sequence_number).collect::<Vec<_>>();
    assert_eq!(sequences(&to_partition), (0..600).collect::<Vec<i64>>());
    let keyed = sequences(&to_key);
    assert!(
        keyed.windows(2).all(|w| w[0] < w[1]),
        "a key's events reordered: {keyed:?}"
    );
    let key_partition = &to_key[0].partition_id;
    assert!(to_key.iter().all(|d| &d.partition_id == key_partition));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_stay_within_the_event_limit_and_events_within_a_target_keep_order() {
    let (node, producer) = node_with_hub().await;
    let mut futures = Vec::new();
    for i in 0..600 {
        futures.push(
            enqueue(
                &producer,
                SendTarget::PartitionId("0".into()),
                format!("e-{i}"),
            )
            .await,
        );
    }
    let delivered = deliveries(futures).await;
    for (i, delivery) in delivered.iter().enumerate() {
        assert_eq!(&*delivery.partition_id, "0");
        assert_eq!(delivery.sequence_number, i as i64, "enqueue order kept");
        assert!(
            delivery.batch_events <= 50,
            "{delivery:?} beyond the batch limit"
        );
    }
    // The first event goes alone; the ones enqueued while it is in flight share batches.
    let batched = delivered.iter().filter(|d| d.batch_events > 1).count();
    assert!(batched > 0, "no two events shared a request: {delivered:?}");
    let events = node
        .read("buffered", "0", EventPosition::Earliest, 600)
        .await;
    let bodies: Vec<String> = events.iter().map(body).collect();
    let expected: Vec<String> = (0..600).map(|i| format!("e-{i}")).collect();
    assert_eq!(bodies, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_of_large_events_stay_under_the_publication_limit() {
    let node = TestNode::start().await;
    node.client
        .create_event_hub("large", 1, None)
        .await
        .unwrap();
    let producer = node.client.buffered_producer(BufferedOptions::default());
    let body = vec![7u8; 100 * 1024];
    let mut futures = Vec::new();
    for _ in 0..40 {
        futures.push(
            producer
                .enqueue("large", SendTarget::Any, EventData::from_body(body.clone()))
                .await
                .unwrap(),
        );
    }
    // The service refuses a publication over 1 MiB: every batch must be under it.
    let delivered = deliveries(futures).await;
    assert!(delivered.iter().all(|d| d.batch_events <= 9));
    assert!(delivered.iter().any(|d| d.batch_events > 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_larger_than_a_batch_is_refused_at_once() {
    let node = TestNode::start().await;
    node.client
        .create_event_hub("large", 1, None)
        .await
        .unwrap();
    let producer = node.client.buffered_producer(BufferedOptions::default());
    let error = producer
        .enqueue(
            "large",
            SendTarget::Any,
            EventData::from_body(vec![0u8; 2 * 1024 * 1024]),
        )
        .await
        .err()
        .expect("an event over the batch size is refused");
    assert!(matches!(error, ClientError::InvalidArgument(_)), "{error}");
    assert!(error.to_string().contains("at most"), "{error}");
    assert_eq!(producer.outstanding(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_batch_fails_each_of_its_events() {
    let node = TestNode::start().await;
    let producer = node.client.buffered_producer(BufferedOptions::default());
    let delivery = producer
        .enqueue("no-such-hub", SendTarget::Any, EventData::from_body("x"))
        .await
        .unwrap();
    let error = delivery.await.expect_err("the hub does not exist");
    assert!(error.to_string().contains("no-such-hub"), "{error}");
    producer.flush().await;
    assert_eq!(producer.outstanding(), 0);
}
