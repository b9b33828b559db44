//! The client against `serve_connection` and the server tests' fake backend, over an
//! in-memory stream: one behaviour each.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tributary_types::{Offset, SequenceNumber};

use super::*;
use tributary_amqp::server::test_backend::{
    FakeBackend, GOOD_TOKEN, HOST, START_UNIX_MS, SendAnswer, SentCall,
};
use tributary_amqp::server::{
    AmqpEvent, BackendError, BackendErrorKind, ConnectionError, ConnectionLimits, EventBody,
    LastEnqueued, SAS_TOKEN_TYPE, SendTarget, StoredEvent, serve_connection,
};
use tributary_amqp::test_support::{arb_performative, config};
use tributary_amqp::{
    Begin, Channel, Open, ProtocolHeader, SaslCode, TransferNumber, ValueKind, write_performative,
};

type Server = JoinHandle<Result<(), ConnectionError>>;

const PARTITION_0: &str = "amqps://ns.example.com/hub/ConsumerGroups/$Default/Partitions/0";

fn options(sasl: Sasl) -> ConnectionOptions {
    ConnectionOptions {
        container_id: "client-test".into(),
        hostname: Some(HOST.into()),
        sasl,
        ..ConnectionOptions::default()
    }
}

/// A server over an in-memory stream smaller than the traffic, so both sides must read
/// while they write.
fn serve(limits: ConnectionLimits) -> (DuplexStream, Server, Arc<FakeBackend>) {
    let (client, server) = tokio::io::duplex(16 * 1024);
    let backend = FakeBackend::new();
    let task = tokio::spawn(serve_connection(server, backend.clone(), limits));
    (client, task, backend)
}

async fn open(sasl: Sasl, limits: ConnectionLimits) -> (Connection, Server, Arc<FakeBackend>) {
    let (io, server, backend) = serve(limits);
    let connection = Connection::open(io, options(sasl)).await.unwrap();
    (connection, server, backend)
}

/// SASL ANONYMOUS and a good token on `$cbs` for the hub.
async fn authorized(limits: ConnectionLimits) -> (Connection, Server, Arc<FakeBackend>) {
    let (connection, server, backend) = open(Sasl::Anonymous, limits).await;
    let reply = connection
        .put_token(&format!("sb://{HOST}/hub"), SAS_TOKEN_TYPE, GOOD_TOKEN)
        .await
        .unwrap();
    assert_eq!(reply.status_code, 202, "{reply:?}");
    (connection, server, backend)
}

async fn close(connection: Connection, server: Server) {
    connection.close().await.unwrap();
    server.await.unwrap().unwrap();
}

fn event(body: &'static [u8]) -> Message {
    Message::with_data(Bytes::from_static(body))
}

fn data(body: &[u8]) -> EventBody {
    EventBody::Data(Bytes::copy_from_slice(body))
}

fn stored(sequence_number: i64, key: Option<&str>, body: &[u8]) -> StoredEvent {
    StoredEvent {
        sequence_number: SequenceNumber(sequence_number),
        offset: Offset(sequence_number * 100),
        enqueued_time_unix_ms: START_UNIX_MS + sequence_number,
        event: AmqpEvent {
            partition_key: key.map(str::to_owned),
            body: data(body),
            ..AmqpEvent::default()
        },
        last_enqueued: LastEnqueued {
            sequence_number: SequenceNumber(99),
            offset: Offset(9_900),
            enqueued_time_unix_ms: START_UNIX_MS + 99,
        },
    }
}

fn body_map(reply: &RequestReply) -> Vec<(&str, &Value)> {
    let Some(Value::Map(pairs)) = reply.body_value() else {
        panic!("the READ body is not a map: {reply:?}")
    };
    pairs
        .iter()
        .map(|(key, value)| {
            let Value::String(key) = key else {
                panic!("key {key:?} is not a string")
            };
            (key.as_str(), value)
        })
        .collect()
}

#[tokio::test]
async fn anonymous_handshake_and_put_token() {
    let (connection, server, _) = open(Sasl::Anonymous, ConnectionLimits::default()).await;
    let open = connection.peer_open();
    assert_eq!(open.container_id, "tributary-node");
    assert_eq!(open.max_frame_size_bytes, 65_536, "the lower of both");
    assert_eq!(open.idle_timeout_ms, Some(120_000));

    let audience = format!("sb://{HOST}/hub");
    let refused = connection
        .put_token(
            &audience,
            SAS_TOKEN_TYPE,
            "SharedAccessSignature sig=forged",
        )
        .await
        .unwrap();
    assert_eq!(refused.status_code, 401);
    assert!(!refused.is_success());
    assert_eq!(
        refused.status_description.as_deref(),
        Some("the signature does not match")
    );
    let accepted = connection
        .put_token(&audience, SAS_TOKEN_TYPE, GOOD_TOKEN)
        .await
        .unwrap();
    assert_eq!(
        (accepted.status_code, accepted.status_description.as_deref()),
        (202, Some("Accepted"))
    );
    close(connection, server).await;
}

#[tokio::test]
async fn plain_admits_a_rule_and_refuses_a_wrong_key() {
    let plain = |password: &str| Sasl::Plain {
        user: "rule".into(),
        password: password.into(),
    };
    let (connection, server, _) = open(plain("key"), ConnectionLimits::default()).await;
    // PLAIN's grant covers the namespace: no token needed.
    let reply = connection
        .management_read("com.microsoft:eventhub", "hub", None)
        .await
        .unwrap();
    assert_eq!(reply.status_code, 200);
    close(connection, server).await;

    let (io, server, _) = serve(ConnectionLimits::default());
    let error = Connection::open(io, options(plain("wrong")))
        .await
        .err()
        .unwrap();
    assert!(
        matches!(
            error,
            ClientError::Authentication {
                mechanism: "PLAIN",
                code: SaslCode::Auth
            }
        ),
        "{error}"
    );
    assert!(server.await.unwrap().is_err());
}

#[tokio::test]
async fn management_reads_keep_every_amqp_type() {
    let (connection, server, _) = authorized(ConnectionLimits::default()).await;
    let hub = connection
        .management_read("com.microsoft:eventhub", "hub", None)
        .await
        .unwrap();
    assert_eq!(
        (hub.status_code, hub.status_description.as_deref()),
        (200, Some("OK"))
    );
    let body = body_map(&hub);
    let keys: Vec<&str> = body.iter().map(|(k, _)| *k).collect();
    assert_eq!(
        keys,
        ["name", "created_at", "partition_count", "partition_ids"]
    );
    assert_eq!(body[0].1, &Value::String("hub".into()));
    assert_eq!(body[1].1, &Value::Timestamp(START_UNIX_MS - 1000));
    assert_eq!(body[2].1, &Value::Int(2));
    let Value::Array(ids) = body[3].1 else {
        panic!("partition_ids is not an array: {:?}", body[3].1)
    };
    assert_eq!(ids.kind(), ValueKind::String);
    assert_eq!(
        ids.items(),
        [Value::String("0".into()), Value::String("1".into())]
    );

    let partition = connection
        .management_read("com.microsoft:partition", "hub", Some("1"))
        .await
        .unwrap();
    let kinds: Vec<(&str, ValueKind)> = body_map(&partition)
        .into_iter()
        .map(|(k, v)| (k, v.kind()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("name", ValueKind::String),
            ("partition", ValueKind::String),
            ("begin_sequence_number", ValueKind::Long),
            ("last_enqueued_sequence_number", ValueKind::Long),
            ("last_enqueued_offset", ValueKind::String),
            ("last_enqueued_time_utc", ValueKind::Timestamp),
            ("is_partition_empty", ValueKind::Boolean),
        ]
    );
    assert_eq!(body_map(&partition)[4].1, &Value::String("4096".into()));

    let missing = connection
        .management_read("com.microsoft:partition", "hub", Some("7"))
        .await
        .unwrap();
    assert_eq!(missing.status_code, 404);
    assert_eq!(
        missing.application_property("error-condition"),
        Some(&Value::symbol("amqp:not-found"))
    );
    close(connection, server).await;
}

#[tokio::test]
async fn events_batches_keys_and_partitions_are_accepted() {
    let (connection, server, backend) = authorized(ConnectionLimits::default()).await;
    let hub = connection
        .open_sender("amqps://ns.example.com/hub", SenderOptions::default())
        .await
        .unwrap();
    assert_eq!(
        hub.peer_attach().max_message_size_bytes,
        Some(1_048_576),
        "the server's attach"
    );
    let outcomes = [
        hub.send(Delivery::event(&event(b"single"))).await,
        hub.send(Delivery::batch(
            &[event(b"a"), event(b"b"), event(b"c")],
            None,
        ))
        .await,
        hub.send(Delivery::event(&with_partition_key(event(b"keyed"), "k")))
            .await,
        hub.send(Delivery::batch(&[event(b"x"), event(b"y")], Some("j")))
            .await,
    ];
    let partition = connection
        .open_sender("hub/Partitions/1", SenderOptions::default())
        .await
        .unwrap();
    let to_partition = partition.send(Delivery::event(&event(b"one"))).await;
    for outcome in outcomes.into_iter().chain([to_partition]) {
        assert_eq!(outcome.unwrap(), DeliveryState::Accepted);
    }

    let bodies = |call: &SentCall| -> Vec<EventBody> {
        call.events.iter().map(|e| e.body.clone()).collect()
    };
    let sent = backend.sent();
    let expected = [
        (SendTarget::RoundRobin, vec![data(b"single")]),
        (
            SendTarget::RoundRobin,
            vec![data(b"a"), data(b"b"), data(b"c")],
        ),
        (SendTarget::PartitionKey("k".into()), vec![data(b"keyed")]),
        (
            SendTarget::PartitionKey("j".into()),
            vec![data(b"x"), data(b"y")],
        ),
        (SendTarget::PartitionId("1".into()), vec![data(b"one")]),
    ];
    assert_eq!(sent.len(), expected.len());
    for (call, (target, events)) in sent.iter().zip(expected) {
        assert_eq!(call.hub, "hub");
        assert_eq!((&call.target, bodies(call)), (&target, events));
    }
    hub.close().await.unwrap();
    partition.close().await.unwrap();
    close(connection, server).await;
}

#[tokio::test]
async fn a_refused_send_carries_its_condition() {
    let (connection, server, backend) = authorized(ConnectionLimits::default()).await;
    backend.answer_sends(SendAnswer::Refuse(BackendError::new(
        BackendErrorKind::ServerBusy,
        "the partition is throttled",
    )));
    let sender = connection
        .open_sender("hub", SenderOptions::default())
        .await
        .unwrap();
    let outcome = sender.send(Delivery::event(&event(b"e"))).await.unwrap();
    let DeliveryState::Rejected { error: Some(error) } = outcome else {
        panic!("expected rejected, got {outcome:?}")
    };
    assert_eq!(error.condition.as_str(), "com.microsoft:server-busy");
    assert_eq!(
        error.description.as_deref(),
        Some("the partition is throttled")
    );
    close(connection, server).await;
}

/// The server grants 8 credits at a time and rejects deliveries beyond them with
/// server-busy: every one of 300 pipelined sends is accepted, in order, in far less time
/// than one commit after another would take.
#[tokio::test(start_paused = true)]
async fn pipelined_sends_stay_within_credit_and_keep_their_order() {
    let limits = ConnectionLimits {
        sender_link_credit: 8,
        pending_sends_per_link_max: 8,
        ..ConnectionLimits::default()
    };
    let (connection, server, backend) = authorized(limits).await;
    backend.answer_sends(SendAnswer::CommitAfter(Duration::from_millis(100)));
    let sender = connection
        .open_sender("hub/Partitions/0", SenderOptions { in_flight_max: 64 })
        .await
        .unwrap();
    let started = tokio::time::Instant::now();
    let mut pending = Vec::new();
    for n in 0..300u32 {
        let message = Message::with_data(Bytes::from(n.to_be_bytes().to_vec()));
        pending.push(sender.submit(Delivery::event(&message)).await.unwrap());
    }
    for outcome in pending {
        assert_eq!(outcome.await.unwrap(), DeliveryState::Accepted);
    }
    // 300 commits of 100 ms, 8 at a time: about 4 s, not 30.
    assert!(
        started.elapsed() < Duration::from_secs(8),
        "{:?}",
        started.elapsed()
    );
    let order: Vec<EventBody> = backend
        .sent()
        .iter()
        .map(|call| call.events[0].body.clone())
        .collect();
    let expected: Vec<EventBody> = (0..300u32).map(|n| data(&n.to_be_bytes())).collect();
    assert_eq!(order, expected);
    close(connection, server).await;
}

#[tokio::test]
async fn receivers_send_filter_epoch_and_name_and_get_annotated_events() {
    let (connection, server, backend) = authorized(ConnectionLimits::default()).await;
    let start = StartPosition::SequenceNumber {
        sequence_number: SequenceNumber(5),
        inclusive: true,
    };
    let filter = selector(&start);
    assert_eq!(filter, "amqp.annotation.x-opt-sequence-number >= '5'");
    let options = ReceiverOptions {
        filter: Some(filter.clone()),
        epoch: Some(1),
        receiver_name: Some("r1".into()),
        credit: 4,
    };
    let mut receiver = connection
        .open_receiver(PARTITION_0, options)
        .await
        .unwrap();
    let echoed = receiver.peer_attach().source.as_ref().unwrap();
    assert_eq!(echoed.selector_filter(), Some(filter.as_str()));
    let (request, events) = backend.reader(0);
    assert_eq!(request.start, start);
    assert_eq!(request.owner_level, Some(1));
    assert_eq!(request.receiver_name.as_deref(), Some("r1"));

    // More events than the credit: the receiver gives credit back as it takes them.
    for first in (5..25).step_by(5) {
        let batch = (first..first + 5)
            .map(|n| stored(n, (n % 2 == 0).then_some("device-7"), &n.to_be_bytes()))
            .collect();
        events.send(Ok(batch)).await.unwrap();
    }
    for n in 5..25i64 {
        let event = receiver.recv().await.unwrap();
        assert_eq!(event.sequence_number(), Some(SequenceNumber(n)));
        assert_eq!(event.offset(), Some(Offset(n * 100)));
        assert_eq!(event.enqueued_time_unix_ms(), Some(START_UNIX_MS + n));
        let key = (n % 2 == 0).then_some("device-7");
        assert_eq!(event.partition_key(), key);
        assert_eq!(
            event.annotation("x-opt-offset").map(Value::kind),
            Some(ValueKind::String)
        );
        assert_eq!(event.message_format, 0);
        assert_eq!(
            event.body(),
            &Body::Data(vec![Bytes::copy_from_slice(&n.to_be_bytes())])
        );
    }
    receiver.close().await.unwrap();
    assert!(
        events.is_closed(),
        "closing the receiver releases the reader"
    );
    close(connection, server).await;
}

#[tokio::test]
async fn a_higher_epoch_steals_the_partition_from_the_old_receiver() {
    let (connection, server, backend) = authorized(ConnectionLimits::default()).await;
    let with_epoch = |epoch, name: &str| ReceiverOptions {
        filter: Some(selector(&StartPosition::Earliest)),
        epoch: Some(epoch),
        receiver_name: Some(name.into()),
        ..ReceiverOptions::default()
    };
    let mut old = connection
        .open_receiver(PARTITION_0, with_epoch(1, "old"))
        .await
        .unwrap();
    let mut new = connection
        .open_receiver(PARTITION_0, with_epoch(2, "new"))
        .await
        .unwrap();
    let (_, old_events) = backend.reader(0);
    let (request, new_events) = backend.reader(1);
    assert_eq!(request.owner_level, Some(2));
    // The backend's verdict on the old reader, as the broker's reader rules give it.
    let text = "New receiver 'new' with higher epoch of '2' is created hence current receiver \
                'old' with epoch '1' is getting disconnected";
    old_events
        .send(Err(BackendError::new(BackendErrorKind::LinkStolen, text)))
        .await
        .unwrap();
    let error = old.recv().await.unwrap_err();
    assert_eq!(error.condition(), Some("amqp:link:stolen"), "{error}");
    let ClientError::LinkDetached(Some(detach)) = &error else {
        panic!("expected a detach, got {error}")
    };
    assert_eq!(detach.description.as_deref(), Some(text));
    // The link stays ended.
    assert_eq!(
        old.recv().await.unwrap_err().condition(),
        Some("amqp:link:stolen")
    );

    new_events
        .send(Ok(vec![stored(0, None, b"e")]))
        .await
        .unwrap();
    let event = new.recv().await.unwrap();
    assert_eq!(event.sequence_number(), Some(SequenceNumber(0)));
    close(connection, server).await;
}

#[tokio::test]
async fn refused_links_report_the_servers_condition() {
    let (connection, server, _) = open(Sasl::Anonymous, ConnectionLimits::default()).await;
    // No token: the server echoes the attach and detaches with unauthorized-access.
    let sender = connection
        .open_sender("hub", SenderOptions::default())
        .await
        .unwrap();
    let error = sender
        .send(Delivery::event(&event(b"e")))
        .await
        .unwrap_err();
    assert_eq!(
        error.condition(),
        Some("amqp:unauthorized-access"),
        "{error}"
    );
    let reply = connection
        .put_token(&format!("sb://{HOST}/hub"), SAS_TOKEN_TYPE, GOOD_TOKEN)
        .await
        .unwrap();
    assert!(reply.is_success());
    let mut receiver = connection
        .open_receiver(
            "hub/ConsumerGroups/$Default/Partitions/9",
            ReceiverOptions::default(),
        )
        .await
        .unwrap();
    let error = receiver.recv().await.unwrap_err();
    assert_eq!(error.condition(), Some("amqp:not-found"), "{error}");
    close(connection, server).await;
}

#[tokio::test]
async fn messages_larger_than_a_frame_go_both_ways() {
    let limits = ConnectionLimits {
        max_frame_size_bytes: 512,
        ..ConnectionLimits::default()
    };
    let (io, server, backend) = serve(limits);
    let connection = Connection::open(
        io,
        ConnectionOptions {
            max_frame_size_bytes: 1024,
            ..options(Sasl::Anonymous)
        },
    )
    .await
    .unwrap();
    let reply = connection
        .put_token(&format!("sb://{HOST}/hub"), SAS_TOKEN_TYPE, GOOD_TOKEN)
        .await
        .unwrap();
    assert!(reply.is_success());
    let body: Vec<u8> = (0..5_000u32).map(|i| i as u8).collect();
    let sender = connection
        .open_sender("hub", SenderOptions::default())
        .await
        .unwrap();
    let message = Message::with_data(Bytes::from(body.clone()));
    let batch = Delivery::batch(&[message.clone(), message], None);
    assert_eq!(sender.send(batch).await.unwrap(), DeliveryState::Accepted);
    assert_eq!(backend.sent()[0].events[1].body, data(&body));

    let mut receiver = connection
        .open_receiver(PARTITION_0, ReceiverOptions::default())
        .await
        .unwrap();
    let (_, events) = backend.reader(0);
    events.send(Ok(vec![stored(1, None, &body)])).await.unwrap();
    let event = receiver.recv().await.unwrap();
    assert_eq!(event.body(), &Body::Data(vec![Bytes::from(body)]));
    close(connection, server).await;
}

#[tokio::test]
async fn a_server_that_goes_away_fails_every_waiter() {
    let (connection, server, _) = authorized(ConnectionLimits::default()).await;
    let mut receiver = connection
        .open_receiver(PARTITION_0, ReceiverOptions::default())
        .await
        .unwrap();
    server.abort();
    let error = receiver.recv().await.unwrap_err();
    assert!(matches!(error, ClientError::Io(_)), "{error}");
    let error = connection
        .management_read("com.microsoft:eventhub", "hub", None)
        .await
        .unwrap_err();
    assert!(matches!(error, ClientError::Io(_)), "{error}");
    assert!(connection.close().await.is_err());
}

/// A server that answers the handshake and then sends `bytes`, reading until the client
/// hangs up.
fn against_hostile_server(bytes: Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, mut server) = tokio::io::duplex(16 * 1024);
        let fake = tokio::spawn(async move {
            let mut out = ProtocolHeader::AMQP.to_bytes().to_vec();
            let open = Open {
                container_id: "hostile".into(),
                max_frame_size_bytes: 512,
                idle_timeout_ms: Some(1_000),
                ..Open::default()
            };
            write_performative(&mut out, Channel(0), &open.into(), &[]);
            let begin = Begin {
                remote_channel: Some(Channel(0)),
                next_outgoing_id: TransferNumber(0),
                incoming_window: 100,
                outgoing_window: 100,
                handle_max: 7,
                ..Begin::default()
            };
            write_performative(&mut out, Channel(0), &begin.into(), &[]);
            out.extend_from_slice(&bytes);
            let _ = server.write_all(&out).await;
            let mut sink = vec![0; 4096];
            while matches!(server.read(&mut sink).await, Ok(n) if n > 0) {}
        });
        let connection = Connection::open(client, options(Sasl::None)).await.unwrap();
        let _ = connection
            .management_read("com.microsoft:eventhub", "hub", None)
            .await;
        let _ = connection
            .open_sender("hub", SenderOptions::default())
            .await;
        // Panics if the connection's task did.
        let _ = connection.close().await;
        fake.await.unwrap();
    });
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn random_bytes_from_the_server_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        against_hostile_server(bytes);
    }

    #[test]
    fn random_performatives_from_the_server_never_panic(
        performatives in proptest::collection::vec(
            (arb_performative(), proptest::collection::vec(any::<u8>(), 0..64)), 1..8),
    ) {
        let mut bytes = Vec::new();
        for (performative, payload) in performatives {
            write_performative(&mut bytes, Channel(0), &performative, &payload);
        }
        against_hostile_server(bytes);
    }
}
