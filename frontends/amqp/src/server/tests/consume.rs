//! Receiver links (WIRE-PROTOCOLS A9): the reader asked of the backend, and how its events
//! are delivered.

use bytes::Bytes;
use tributary_types::{Offset, SequenceNumber};

use super::client::*;
use super::{connect_with_cbs_limits, status};
use crate::server::{
    AmqpEvent, BackendError, BackendErrorKind, ConnectionLimits, EventBody, LastEnqueued,
    StartPosition, StoredEvent,
};
use crate::*;

const RUNTIME_METRIC: &str = "com.microsoft:enable-receiver-runtime-metric";

fn address(partition: &str) -> String {
    format!("amqps://ns.example.com/hub/ConsumerGroups/$Default/Partitions/{partition}")
}

/// A receiver's attach as the SDKs write it.
fn receiver(
    handle: u32,
    partition: &str,
    filter: Option<(Value, &str)>,
    properties: Vec<(&str, Value)>,
    capabilities: &[&str],
) -> Attach {
    let mut attach = attach("receiver", handle, Role::Receiver, &address(partition));
    if let Some((descriptor, expression)) = filter {
        attach.source.as_mut().unwrap().filter = Some(vec![(
            Symbol::from(SELECTOR_FILTER_NAME),
            Value::described(descriptor, Value::String(expression.into())),
        )]);
    }
    attach.properties = Some(
        properties
            .into_iter()
            .map(|(k, v)| (Symbol::from(k), v))
            .collect(),
    );
    attach.desired_capabilities = capabilities.iter().map(|c| Symbol::from(*c)).collect();
    attach
}

fn stored(sequence_number: i64, key: Option<&str>, body: Vec<u8>) -> StoredEvent {
    StoredEvent {
        sequence_number: SequenceNumber(sequence_number),
        offset: Offset(sequence_number * 100),
        enqueued_time_unix_ms: START_UNIX_MS + sequence_number,
        event: AmqpEvent {
            partition_key: key.map(str::to_owned),
            application_properties: vec![("n".into(), Value::Long(sequence_number))],
            body: EventBody::Data(Bytes::from(body)),
            ..AmqpEvent::default()
        },
        last_enqueued: LastEnqueued {
            sequence_number: SequenceNumber(99),
            offset: Offset(9_900),
            enqueued_time_unix_ms: START_UNIX_MS + 99,
        },
    }
}

fn annotation<'a>(message: &'a Message, key: &str) -> Option<&'a Value> {
    map_get(message.message_annotations.as_deref().unwrap_or(&[]), key)
}

/// Attaches, reads our attach; the backend has the reader by then.
async fn attach_receiver(client: &mut TestClient, attach: Attach) -> Attach {
    let handle = attach.handle;
    client.write(1, attach);
    client.flush().await;
    client.read_attach(handle).await
}

#[tokio::test]
async fn events_are_delivered_settled_with_the_annotation_types_of_a9() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    let filter = (
        Value::symbol(SELECTOR_FILTER_NAME),
        "amqp.annotation.x-opt-offset > '-1'",
    );
    let attach = receiver(
        4,
        "0",
        Some(filter),
        vec![
            ("com.microsoft:epoch", Value::Long(3)),
            ("com.microsoft:receiver-name", Value::String("r1".into())),
            ("com.microsoft:timeout", Value::Long(0)),
        ],
        &["com.microsoft:georeplication"],
    );
    let sent_source = attach.source.clone();
    let reply = attach_receiver(&mut client, attach).await;
    assert_eq!(reply.role, Role::Sender);
    assert_eq!(reply.snd_settle_mode, SenderSettleMode::Settled);
    assert_eq!(reply.initial_delivery_count, Some(0));
    assert_eq!(
        reply.source, sent_source,
        "the source and its filter are echoed"
    );
    assert!(reply.offered_capabilities.is_empty());
    let (request, events) = backend.reader(0);
    assert_eq!(
        (request.hub.as_str(), request.consumer_group.as_str()),
        ("hub", "$Default")
    );
    assert_eq!(request.partition, "0");
    assert_eq!(request.start, StartPosition::Earliest);
    assert_eq!(request.owner_level, Some(3));
    assert_eq!(request.receiver_name.as_deref(), Some("r1"));

    client.write_flow(4, 0, 300, false);
    client.flush().await;
    events
        .send(Ok(vec![
            stored(7, Some("device-42"), b"first".to_vec()),
            stored(8, None, b"second".to_vec()),
        ]))
        .await
        .unwrap();
    let (transfer, message, _) = client.read_delivery().await;
    assert_eq!(transfer.handle, Handle(4));
    assert_eq!(transfer.settled, Some(true));
    assert_eq!(transfer.message_format, Some(0));
    assert_eq!(
        annotation(&message, "x-opt-sequence-number"),
        Some(&Value::Long(7))
    );
    assert_eq!(
        annotation(&message, "x-opt-offset"),
        Some(&Value::String("700".into()))
    );
    assert_eq!(
        annotation(&message, "x-opt-enqueued-time"),
        Some(&Value::Timestamp(START_UNIX_MS + 7))
    );
    assert_eq!(
        annotation(&message, "x-opt-partition-key"),
        Some(&Value::String("device-42".into()))
    );
    // Symbol keys: pyamqp looks them up as bytes.
    for (key, _) in message.message_annotations.as_ref().unwrap() {
        assert_eq!(key.kind(), ValueKind::Symbol);
    }
    assert_eq!(message.delivery_annotations, None);
    assert_eq!(message.body, Body::Data(vec![Bytes::from_static(b"first")]));
    assert_eq!(
        message.application_properties,
        Some(vec![("n".to_owned(), Value::Long(7))])
    );
    let (second, message, _) = client.read_delivery().await;
    assert_eq!(annotation(&message, "x-opt-partition-key"), None);
    assert_ne!(second.delivery_id, transfer.delivery_id);
    assert_ne!(second.delivery_tag, transfer.delivery_tag);
    client.close_all(&[0, 1, 4], server).await;
    assert!(events.is_closed(), "the reader is released with its link");
}

#[tokio::test]
async fn deliveries_stay_within_the_credit() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    // .NET: the Microsoft descriptor and an unquoted value.
    let filter = (
        Value::Ulong(SELECTOR_FILTER_CODE_MICROSOFT),
        "amqp.annotation.x-opt-sequence-number >= 5",
    );
    attach_receiver(&mut client, receiver(4, "1", Some(filter), vec![], &[])).await;
    let (request, events) = backend.reader(0);
    assert_eq!(
        request.start,
        StartPosition::SequenceNumber {
            sequence_number: SequenceNumber(5),
            inclusive: true
        }
    );
    let batch = (5..10).map(|n| stored(n, None, vec![1])).collect();
    events.send(Ok(batch)).await.unwrap();
    client.write_flow(4, 0, 2, false);
    client.flush().await;
    for expected in [5, 6] {
        let (_, message, _) = client.read_delivery().await;
        assert_eq!(
            annotation(&message, "x-opt-sequence-number"),
            Some(&Value::Long(expected))
        );
    }
    // Out of credit: the answer to an echo is our flow, with three messages waiting.
    client.write_flow(4, 2, 0, true);
    client.flush().await;
    let Performative::Flow(flow) = client.read().await.performative else {
        panic!("a transfer beyond the credit")
    };
    assert_eq!(
        (flow.delivery_count, flow.link_credit, flow.available),
        (Some(2), Some(0), Some(3))
    );
    client.write_flow(4, 2, 300, false);
    client.flush().await;
    for expected in [7, 8, 9] {
        let (_, message, _) = client.read_delivery().await;
        assert_eq!(
            annotation(&message, "x-opt-sequence-number"),
            Some(&Value::Long(expected))
        );
    }
    client.close_all(&[0, 1, 4], server).await;
}

#[tokio::test]
async fn transfers_are_split_at_the_client_max_frame_size() {
    let (mut client, server, backend) = start_with_backend(ConnectionLimits::default());
    client.write_open_and_begin_with(None, 512);
    client.write_attach_pair("$cbs", 0);
    client.flush().await;
    let open = client.read_open_and_begin().await;
    assert_eq!(open.max_frame_size_bytes, 512);
    client.read_attach_pair(0).await;
    client.write_request(1, &put_token([1; 16], GOOD_TOKEN));
    client.flush().await;
    assert_eq!(status(&client.read_reply(0).await).0, Value::Int(202));
    attach_receiver(&mut client, receiver(4, "0", None, vec![], &[])).await;
    let (request, events) = backend.reader(0);
    assert_eq!(request.start, StartPosition::Latest, "no filter: latest");
    client.write_flow(4, 0, 10, false);
    client.flush().await;
    let body: Vec<u8> = (0..2_000u32).map(|i| i as u8).collect();
    events
        .send(Ok(vec![stored(0, None, body.clone())]))
        .await
        .unwrap();
    let mut payload = Vec::new();
    let mut frames = 0;
    loop {
        let received = client.read().await;
        assert!(
            received.frame_bytes <= 512,
            "{} bytes",
            received.frame_bytes
        );
        let Performative::Transfer(transfer) = received.performative else {
            panic!("expected transfer")
        };
        assert_eq!(transfer.settled, Some(true));
        payload.extend_from_slice(&received.payload);
        frames += 1;
        if !transfer.more {
            break;
        }
    }
    assert!(frames >= 5, "{frames} frames");
    let message = Message::decode(Bytes::from(payload)).unwrap();
    assert_eq!(message.body, Body::Data(vec![Bytes::from(body)]));
    client.close_all(&[0, 1, 4], server).await;
}

#[tokio::test]
async fn a_stolen_reader_detaches_its_link_with_link_stolen() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    let epoch = vec![("com.microsoft:epoch", Value::Long(3))];
    attach_receiver(&mut client, receiver(4, "0", None, epoch, &[])).await;
    let (_, events) = backend.reader(0);
    let text = "New receiver 'r2' with higher epoch of '5' is created hence current receiver \
                'r1' with epoch '3' is getting disconnected";
    events
        .send(Err(BackendError::new(BackendErrorKind::LinkStolen, text)))
        .await
        .unwrap();
    let Performative::Detach(detach) = client.read().await.performative else {
        panic!("expected detach")
    };
    assert_eq!(detach.handle, Handle(4));
    assert!(detach.closed);
    let error = detach.error.unwrap();
    assert_eq!(error.condition.as_str(), "amqp:link:stolen");
    assert_eq!(error.description.as_deref(), Some(text));
    assert!(events.is_closed());
    client.write(
        1,
        Detach {
            handle: Handle(4),
            closed: true,
            error: None,
        },
    );
    client.close_all(&[0, 1], server).await;
}

#[tokio::test]
async fn the_runtime_metric_is_delivered_only_when_asked_for() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    let reply = attach_receiver(
        &mut client,
        receiver(4, "0", None, vec![], &[RUNTIME_METRIC]),
    )
    .await;
    assert_eq!(
        reply.offered_capabilities,
        vec![Symbol::from(RUNTIME_METRIC)]
    );
    let filter = (
        Value::Ulong(SELECTOR_FILTER_CODE_APACHE),
        "amqp.annotation.x-opt-enqueued-time >= '1767225600000'",
    );
    attach_receiver(&mut client, receiver(5, "1", Some(filter), vec![], &[])).await;
    let (_, with_metric) = backend.reader(0);
    let (request, without_metric) = backend.reader(1);
    assert_eq!(
        request.start,
        StartPosition::EnqueuedTime {
            unix_ms: START_UNIX_MS,
            inclusive: true
        }
    );
    client.write_flow(4, 0, 10, false);
    client.write_flow(5, 0, 10, false);
    client.flush().await;

    with_metric
        .send(Ok(vec![stored(1, None, vec![1])]))
        .await
        .unwrap();
    let (transfer, message, _) = client.read_delivery().await;
    assert_eq!(transfer.handle, Handle(4));
    let expected = [
        (
            Value::symbol("last_enqueued_sequence_number"),
            Value::Long(99),
        ),
        (
            Value::symbol("last_enqueued_offset"),
            Value::String("9900".into()),
        ),
        (
            Value::symbol("last_enqueued_time_utc"),
            Value::Timestamp(START_UNIX_MS + 99),
        ),
    ];
    let annotations = message.delivery_annotations.unwrap();
    assert_eq!(annotations[..3], expected[..]);
    assert_eq!(
        annotations[3].0,
        Value::symbol("runtime_info_retrieval_time_utc")
    );
    assert_eq!(annotations[3].1.kind(), ValueKind::Timestamp);

    without_metric
        .send(Ok(vec![stored(1, None, vec![1])]))
        .await
        .unwrap();
    let (transfer, message, _) = client.read_delivery().await;
    assert_eq!(transfer.handle, Handle(5));
    assert_eq!(message.delivery_annotations, None);
    client.close_all(&[0, 1, 4, 5], server).await;
}

#[tokio::test]
async fn a_published_event_stored_and_read_back_is_the_same_message() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    let published = Message {
        header: Some(Header {
            durable: true,
            ..Header::default()
        }),
        message_annotations: Some(vec![
            (
                Value::symbol("x-opt-partition-key"),
                Value::String("k".into()),
            ),
            (Value::symbol("x-opt-custom"), Value::symbol("kept")),
        ]),
        properties: Some(Properties {
            message_id: Some(MessageId::Uuid([5; 16])),
            content_type: Some(Symbol::from("application/json")),
            correlation_id: Some(MessageId::Ulong(9)),
            ..Properties::default()
        }),
        application_properties: Some(vec![
            ("s".into(), Value::String("text".into())),
            ("i".into(), Value::Int(7)),
            ("l".into(), Value::Long(-7)),
            ("u".into(), Value::Uuid([1; 16])),
            ("t".into(), Value::Timestamp(START_UNIX_MS)),
            ("d".into(), Value::Double(0.5)),
        ]),
        ..Message::with_data(Bytes::from_static(b"{\"temp\":21}"))
    };
    client.attach_sender(6, "amqps://ns.example.com/hub").await;
    client.write_delivery(6, 0, false, &[&published.to_bytes()]);
    client.flush().await;
    assert_eq!(
        client.read_disposition().await.state,
        Some(DeliveryState::Accepted)
    );
    let event = backend.sent()[0].events[0].clone();
    let record = event.to_record();
    let read_back = AmqpEvent::from_record(record);

    attach_receiver(&mut client, receiver(4, "0", None, vec![], &[])).await;
    let (_, events) = backend.reader(0);
    client.write_flow(4, 0, 10, false);
    client.flush().await;
    let mut stored_event = stored(3, None, Vec::new());
    stored_event.event = read_back;
    events.send(Ok(vec![stored_event])).await.unwrap();
    let (_, delivered, _) = client.read_delivery().await;
    assert_eq!(delivered.header, published.header);
    assert_eq!(delivered.properties, published.properties);
    assert_eq!(
        delivered.application_properties,
        published.application_properties
    );
    assert_eq!(delivered.body, published.body);
    assert_eq!(
        annotation(&delivered, "x-opt-partition-key"),
        Some(&Value::String("k".into()))
    );
    assert_eq!(
        annotation(&delivered, "x-opt-custom"),
        Some(&Value::symbol("kept"))
    );
    client.close_all(&[0, 1, 4, 6], server).await;
}
