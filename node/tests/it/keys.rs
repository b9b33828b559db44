//! 100,000 events with 1,000 distinct keys into a 4-partition hub.

use std::collections::HashMap;

use futures::StreamExt;
use tributary_client::{EventData, EventPosition, SendTarget};
use tributary_types::partition_for_key;

use crate::support::{TestNode, body};

const KEYS: usize = 1_000;
const EVENTS_PER_KEY: usize = 100;
const EVENTS_PER_BATCH: usize = 25;
const CONCURRENT_KEYS: usize = 64;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_events_keep_partition_and_order() {
    let node = TestNode::start().await;
    node.client.create_event_hub("keys", 4, None).await.unwrap();
    let producer = node.client.producer();
    // Each key's batches go in order; different keys go concurrently.
    futures::stream::iter(0..KEYS)
        .for_each_concurrent(CONCURRENT_KEYS, |key| {
            let producer = producer.clone();
            async move {
                for batch in 0..EVENTS_PER_KEY / EVENTS_PER_BATCH {
                    let events = (0..EVENTS_PER_BATCH).map(|i| {
                        EventData::from_body(format!("key-{key}:{}", batch * EVENTS_PER_BATCH + i))
                    });
                    let response = producer
                        .send(
                            "keys",
                            SendTarget::PartitionKey(format!("key-{key}")),
                            events,
                        )
                        .await
                        .unwrap();
                    let expected = partition_for_key(&format!("key-{key}"), 4);
                    assert_eq!(response.partition_id, expected.to_string());
                }
            }
        })
        .await;

    let mut total = 0;
    let mut partition_of_key: HashMap<String, u16> = HashMap::new();
    for partition in 0..4u16 {
        let pid = partition.to_string();
        let props = node
            .client
            .get_partition_properties("keys", &pid)
            .await
            .unwrap();
        let count = (props.last_enqueued_sequence_number + 1) as usize;
        let events = node
            .read("keys", &pid, EventPosition::Earliest, count)
            .await;
        total += events.len();
        let mut next_index: HashMap<String, usize> = HashMap::new();
        for (expected_sequence, event) in events.iter().enumerate() {
            assert_eq!(
                event.sequence_number, expected_sequence as i64,
                "gap-free from 0"
            );
            let text = body(event);
            let (key, index) = text.split_once(':').unwrap();
            let index: usize = index.parse().unwrap();
            assert_eq!(event.partition_key.as_deref(), Some(key));
            let previous = partition_of_key.insert(key.to_string(), partition);
            assert!(
                previous.is_none_or(|p| p == partition),
                "{key} in two partitions"
            );
            let next = next_index.entry(key.to_string()).or_default();
            assert_eq!(index, *next, "{key}'s events out of send order");
            *next += 1;
        }
        let last = events.last().unwrap();
        assert_eq!(props.begin_sequence_number, 0);
        assert!(!props.is_empty);
        assert_eq!(props.last_enqueued_offset, last.offset);
        assert_eq!(props.last_enqueued_time_ms, last.enqueued_time_ms);
        assert!(next_index.values().all(|n| *n == EVENTS_PER_KEY));
    }
    assert_eq!(total, KEYS * EVENTS_PER_KEY);
    assert_eq!(partition_of_key.len(), KEYS);
}
