//! The AMQP types of every `$management` reply field and event annotation a real node
//! sends, read with tributary-amqp-client: .NET casts each to one type and fails on another
//! (the Python SDK converts without checking, so its tests would not notice). WIRE-PROTOCOLS
//! A7 and A9 list them. And events larger than a gRPC message's default limit, sent and
//! read through a node that forwards them to their partition's leader.

use bytes::Bytes;
use tributary_amqp::server::StartPosition;
use tributary_amqp::{Body, DeliveryState, Message, Value, ValueKind, map_get};
use tributary_amqp_client::{
    ConnectionOptions, Delivery, ReceiverOptions, Sasl, SenderOptions, connect, selector,
};
use tributary_client::{Client, EventData, SendTarget};
use tributary_cluster_tests::{LocalCluster, NodeProcess, TestDir, cli_ok, http_get};
use tributary_types::partition_for_key;

const HUB: &str = "typed";
const KEY: &str = "device-7";

fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
    let Value::Map(pairs) = map else {
        panic!("the reply body is a map, not {map:?}")
    };
    map_get(pairs, key).unwrap_or_else(|| panic!("the reply has {key}: {map:?}"))
}

#[tokio::test]
async fn management_replies_and_annotations_have_the_types_the_sdks_cast_to() {
    let dir = TestDir::new("amqp_types");
    let node = NodeProcess::start(&dir.path().join("node")).await;
    cli_ok(
        &node.endpoint(),
        &["hub", "create", HUB, "--partitions", "2"],
    )
    .await;
    let partition = partition_for_key(KEY, 2).to_string();
    Client::connect(&node.endpoint())
        .await
        .unwrap()
        .producer()
        .send(
            HUB,
            SendTarget::PartitionKey(KEY.into()),
            [EventData::from_body("typed event")],
        )
        .await
        .unwrap();

    // Authorization is off: PLAIN with any rule name and key gets every right.
    let connection = connect(
        &node.amqp_addr().to_string(),
        ConnectionOptions {
            hostname: Some("127.0.0.1".into()),
            sasl: Sasl::Plain {
                user: "any-rule".into(),
                password: "any-key".into(),
            },
            ..ConnectionOptions::default()
        },
    )
    .await
    .unwrap();

    let hub = connection
        .management_read("com.microsoft:eventhub", HUB, None)
        .await
        .unwrap();
    assert_eq!(hub.status_code, 200, "{hub:?}");
    let body = hub.body_value().expect("an amqp-value body");
    for (key, kind) in [
        ("name", ValueKind::String),
        ("created_at", ValueKind::Timestamp),
        ("partition_count", ValueKind::Int),
        ("partition_ids", ValueKind::Array),
    ] {
        assert_eq!(field(body, key).kind(), kind, "{key} of {body:?}");
    }
    let Value::Array(ids) = field(body, "partition_ids") else {
        unreachable!()
    };
    assert_eq!(ids.kind(), ValueKind::String);
    assert_eq!(
        ids.items(),
        [Value::String("0".into()), Value::String("1".into())]
    );

    for (name, empty) in [
        (partition.clone(), false),
        (format!("{}", 1 - partition.parse::<u8>().unwrap()), true),
    ] {
        let reply = connection
            .management_read("com.microsoft:partition", HUB, Some(&name))
            .await
            .unwrap();
        assert_eq!(reply.status_code, 200, "{reply:?}");
        let body = reply.body_value().expect("an amqp-value body");
        for (key, kind) in [
            ("name", ValueKind::String),
            ("partition", ValueKind::String),
            ("begin_sequence_number", ValueKind::Long),
            ("last_enqueued_sequence_number", ValueKind::Long),
            ("last_enqueued_offset", ValueKind::String),
            ("last_enqueued_time_utc", ValueKind::Timestamp),
            ("is_partition_empty", ValueKind::Boolean),
        ] {
            assert_eq!(
                field(body, key).kind(),
                kind,
                "{key} of partition {name}: {body:?}"
            );
        }
        assert_eq!(field(body, "is_partition_empty"), &Value::Boolean(empty));
    }

    let mut receiver = connection
        .open_receiver(
            &format!("{HUB}/ConsumerGroups/$Default/Partitions/{partition}"),
            ReceiverOptions {
                filter: Some(selector(&StartPosition::Earliest)),
                ..ReceiverOptions::default()
            },
        )
        .await
        .unwrap();
    let event = tokio::time::timeout(std::time::Duration::from_secs(30), receiver.recv())
        .await
        .expect("the event within 30 s")
        .unwrap();
    for (key, kind) in [
        ("x-opt-sequence-number", ValueKind::Long),
        ("x-opt-offset", ValueKind::String),
        ("x-opt-enqueued-time", ValueKind::Timestamp),
        ("x-opt-partition-key", ValueKind::String),
    ] {
        let value = event
            .annotation(key)
            .unwrap_or_else(|| panic!("the event has {key}: {:?}", event.message));
        assert_eq!(value.kind(), kind, "{key}");
    }
    assert_eq!(event.partition_key(), Some(KEY));
    assert_eq!(event.sequence_number().map(|s| s.0), Some(0));

    // The AMQP metrics beside the others.
    let metrics = http_get(node.http_addr(), "/metrics").await.unwrap().body;
    let value = |series: &str| -> f64 {
        metrics
            .lines()
            .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("/metrics has {series}:\n{metrics}"))
    };
    assert_eq!(value("tributary_amqp_connections "), 1.0);
    assert_eq!(value("tributary_amqp_links{kind=\"receive\"} "), 1.0);
    assert!(value("tributary_amqp_transfers_total{direction=\"out\"} ") >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_forwards_large_events_to_and_from_the_leader() {
    const LARGE: usize = 5 * 1024 * 1024;
    let dir = TestDir::new("amqp_forward_large");
    let cluster = LocalCluster::start_with_args(
        dir.path(),
        3,
        &[
            "--publish-bytes-max".to_owned(),
            (8 * 1024 * 1024).to_string(),
        ],
        &[],
    )
    .await;
    cli_ok(
        &cluster.nodes[0].endpoint(),
        &["hub", "create", "large", "--partitions", "1"],
    )
    .await;
    let leader = cluster.partition_leader("large", "0").await;
    let elsewhere = &cluster.nodes[(leader + 1) % cluster.nodes.len()];
    let connection = connect(
        &elsewhere.amqp_addr().to_string(),
        ConnectionOptions {
            hostname: Some("127.0.0.1".into()),
            sasl: Sasl::Plain {
                user: "any-rule".into(),
                password: "any-key".into(),
            },
            max_message_size_bytes: 16 * 1024 * 1024,
            ..ConnectionOptions::default()
        },
    )
    .await
    .unwrap();
    let sender = connection
        .open_sender("large/Partitions/0", SenderOptions::default())
        .await
        .unwrap();
    for fill in [1_u8, 2] {
        let message = Message {
            body: Body::Data(vec![Bytes::from(vec![fill; LARGE])]),
            ..Message::default()
        };
        let outcome = sender.send(Delivery::event(&message)).await.unwrap();
        assert_eq!(outcome, DeliveryState::Accepted, "a {LARGE}-byte event");
    }
    let mut receiver = connection
        .open_receiver(
            "large/ConsumerGroups/$Default/Partitions/0",
            ReceiverOptions {
                filter: Some(selector(&StartPosition::Earliest)),
                ..ReceiverOptions::default()
            },
        )
        .await
        .unwrap();
    for fill in [1_u8, 2] {
        let event = tokio::time::timeout(std::time::Duration::from_secs(60), receiver.recv())
            .await
            .expect("the event within 60 s")
            .unwrap();
        let Body::Data(sections) = event.body() else {
            panic!("a data body: {:?}", event.message.header)
        };
        let body: Vec<u8> = sections.iter().flat_map(|s| s.iter().copied()).collect();
        assert_eq!(body.len(), LARGE);
        assert!(body.iter().all(|b| *b == fill));
    }
}
