//! Bad input gets a clear, machine-readable error, and the node keeps serving.

use std::time::Duration;

use tributary_client::{ClientError, ErrorReason, EventData, EventPosition, SendTarget};
use tributary_cluster_tests::RawCodec;
use tributary_proto::v1 as pb;
use tributary_proto::v1::management_client::ManagementClient;
use tributary_proto::v1::producer_client::ProducerClient;

use crate::support::TestNode;

fn reason(err: &ClientError) -> ErrorReason {
    err.reason()
        .unwrap_or_else(|| panic!("no reason in {err:?}"))
}

fn status_reason(status: &tonic::Status) -> ErrorReason {
    use prost::Message;
    let detail = pb::ErrorDetail::decode(status.details()).expect("error detail present");
    assert!(!detail.message.is_empty());
    ErrorReason::try_from(detail.reason).unwrap()
}

async fn still_serving(node: &TestNode) {
    node.send("ok", "0", &["still here"]).await;
}

#[tokio::test]
async fn unknown_hub_group_and_partition_are_not_found() {
    let node = TestNode::start().await;
    node.client.create_event_hub("ok", 2, None).await.unwrap();
    let producer = node.client.producer();
    let consumer = node.client.consumer();
    let err = producer
        .send("nope", SendTarget::Any, [EventData::from_body("x")])
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::NotFound);
    assert!(err.to_string().contains("nope"), "{err}");
    let err = consumer
        .receive("nope", "", "0", EventPosition::Earliest, 0)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::NotFound);
    let err = consumer
        .receive("ok", "no-such-group", "0", EventPosition::Earliest, 0)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::NotFound);
    assert!(err.to_string().contains("no-such-group"), "{err}");
    for partition in ["2", "9", "01", "x", "-1"] {
        let err = producer
            .send(
                "ok",
                SendTarget::PartitionId(partition.into()),
                [EventData::from_body("x")],
            )
            .await
            .unwrap_err();
        assert_eq!(reason(&err), ErrorReason::NotFound, "partition {partition}");
        let err = node
            .client
            .get_partition_properties("ok", partition)
            .await
            .unwrap_err();
        assert_eq!(reason(&err), ErrorReason::NotFound, "partition {partition}");
    }
    let err = node.client.delete_event_hub("nope").await.unwrap_err();
    assert_eq!(reason(&err), ErrorReason::NotFound);
    let err = node.client.list_consumer_groups("nope").await.unwrap_err();
    assert_eq!(reason(&err), ErrorReason::NotFound);
    still_serving(&node).await;
}

#[tokio::test]
async fn names_and_counts_that_break_the_rules_are_invalid() {
    let node = TestNode::start_with(|c| c.partitions_per_hub_max = 64).await;
    node.client.create_event_hub("ok", 1, None).await.unwrap();
    let long = "a".repeat(257);
    for name in [
        "-starts-with-dash",
        "ends-with-dot.",
        "has space",
        "ünïcode",
        long.as_str(),
    ] {
        let err = node
            .client
            .create_event_hub(name, 1, None)
            .await
            .unwrap_err();
        assert_eq!(
            reason(&err),
            ErrorReason::InvalidArgument,
            "hub name {name:?}"
        );
    }
    for name in ["bad name", "$Other", &"g".repeat(51)] {
        let err = node
            .client
            .create_consumer_group("ok", name)
            .await
            .unwrap_err();
        assert_eq!(
            reason(&err),
            ErrorReason::InvalidArgument,
            "group name {name:?}"
        );
    }
    let mut raw = ManagementClient::connect(node.endpoint()).await.unwrap();
    for partition_count in [0, 65, 5000] {
        let status = raw
            .create_event_hub(pb::CreateEventHubRequest {
                name: "counts".into(),
                partition_count,
                retention_ms: 0,
                replication_factor: 0,
                throughput_units: 0,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(status_reason(&status), ErrorReason::InvalidArgument);
        assert!(
            status.message().contains("between 1 and 64 partitions"),
            "{}",
            status.message()
        );
    }
    let err = node
        .client
        .create_event_hub("short", 1, Some(Duration::from_secs(60)))
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::InvalidArgument);
    let err = node
        .client
        .create_event_hub("ok", 1, None)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::AlreadyExists);
    node.client.create_consumer_group("ok", "g1").await.unwrap();
    let err = node
        .client
        .create_consumer_group("ok", "g1")
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::AlreadyExists);
    let err = node
        .client
        .delete_consumer_group("ok", "$Default")
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::InvalidArgument);
    assert!(
        node.client
            .create_event_hub("ok.v2_x-1", 64, None)
            .await
            .is_ok()
    );
    still_serving(&node).await;
}

#[tokio::test]
async fn oversized_and_empty_batches_are_refused_whole() {
    let node = TestNode::start_with(|c| c.publish_bytes_max = 4096).await;
    node.client.create_event_hub("ok", 1, None).await.unwrap();
    let producer = node.client.producer();
    let big = vec![EventData::from_body("x".repeat(1500)); 3];
    let err = producer
        .send("ok", SendTarget::PartitionId("0".into()), big)
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::MessageTooLarge);
    assert!(err.to_string().contains("4096"), "{err}");
    // Nothing of the refused batch landed.
    let props = node
        .client
        .get_partition_properties("ok", "0")
        .await
        .unwrap();
    assert!(props.is_empty);

    let mut raw = ProducerClient::connect(node.endpoint()).await.unwrap();
    let status = raw
        .send(pb::SendRequest {
            event_hub: "ok".into(),
            target: None,
            events: vec![],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status_reason(&status), ErrorReason::InvalidArgument);
    let status = raw
        .send(pb::SendRequest {
            event_hub: "ok".into(),
            target: None,
            events: vec![pb::EventData {
                body: "x".into(),
                properties: [("p".to_string(), pb::PropertyValue { value: None })].into(),
            }],
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status_reason(&status), ErrorReason::InvalidArgument);
    still_serving(&node).await;
}

#[tokio::test]
async fn the_default_publication_limit_is_one_mebibyte() {
    let node = TestNode::start().await;
    node.client.create_event_hub("ok", 1, None).await.unwrap();
    let producer = node.client.producer();
    let err = producer
        .send(
            "ok",
            SendTarget::Any,
            [EventData::from_body(vec![7u8; 1024 * 1024 + 1])],
        )
        .await
        .unwrap_err();
    assert_eq!(reason(&err), ErrorReason::MessageTooLarge);
    producer
        .send(
            "ok",
            SendTarget::Any,
            [EventData::from_body(vec![7u8; 1000 * 1024])],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn malformed_requests_get_an_error_and_the_node_keeps_serving() {
    let node = TestNode::start().await;
    node.client.create_event_hub("ok", 1, None).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(node.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    // Not a protobuf message: field 1 with wire type 7 does not exist.
    let garbage = vec![0x0f, 0xff, 0xff, 0xff, 0x01];
    let status = grpc
        .unary(
            tonic::Request::new(bytes::Bytes::from(garbage)),
            http::uri::PathAndQuery::from_static("/tributary.v1.Producer/Send"),
            RawCodec,
        )
        .await
        .unwrap_err();
    assert_ne!(status.code(), tonic::Code::Ok);
    assert!(!status.message().is_empty());
    let status = tributary_proto::v1::consumer_client::ConsumerClient::connect(node.endpoint())
        .await
        .unwrap()
        .receive(pb::ReceiveRequest {
            event_hub: "ok".into(),
            consumer_group: String::new(),
            partition_id: "0".into(),
            position: None,
            max_batch: 1_000_000,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status_reason(&status), ErrorReason::InvalidArgument);
    still_serving(&node).await;
}

/// A request over its service's size limit is refused before it is decoded, with a message
/// giving both sizes; the node keeps serving.
#[tokio::test]
async fn requests_over_the_size_limit_are_refused_with_the_sizes() {
    let node = TestNode::start().await;
    node.client.create_event_hub("ok", 1, None).await.unwrap();
    let channel = tonic::transport::Endpoint::from_shared(node.endpoint())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    // A management request of 1 MiB (field 1, the hub name, 1 MiB long).
    let mut huge = vec![0x0a, 0x80, 0x80, 0x40];
    huge.resize(4 + (1 << 20), b'a');
    let status = grpc
        .unary(
            tonic::Request::new(bytes::Bytes::from(huge)),
            http::uri::PathAndQuery::from_static("/tributary.v1.Management/GetEventHub"),
            RawCodec,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert!(
        status.message().contains("too large") && status.message().contains("limit"),
        "{status:?}"
    );
    still_serving(&node).await;
}
