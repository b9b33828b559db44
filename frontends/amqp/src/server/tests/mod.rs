//! End-to-end tests of `serve_connection` over an in-memory stream, one behaviour each.

pub(crate) use super::test_backend as client;
mod consume;
mod publish;

use std::time::Duration;

use proptest::prelude::*;

use self::client::*;
use crate::server::{ConnectionError, ConnectionLimits};
use crate::test_support::config;
use crate::*;

const CBS_ID: [u8; 16] = [1; 16];
const READ_ID: [u8; 16] = [2; 16];

fn status(reply: &Message) -> (Value, Value) {
    (
        app(reply, "status-code").clone(),
        app(reply, "status-description").clone(),
    )
}

/// SASL ANONYMOUS, then header, open, begin and the `$cbs` pair pipelined, then put-token.
async fn connect_with_cbs(token: &str) -> (TestClient, Server, Message) {
    let (client, server, _, reply) = connect_with_cbs_as(ConnectionLimits::default(), token).await;
    (client, server, reply)
}

/// [`connect_with_cbs`] with a good token, returning the backend; the put-token succeeded.
async fn connect_with_cbs_limits(
    limits: ConnectionLimits,
) -> (TestClient, Server, std::sync::Arc<FakeBackend>) {
    let (client, server, backend, reply) = connect_with_cbs_as(limits, GOOD_TOKEN).await;
    assert_eq!(status(&reply).0, Value::Int(202));
    (client, server, backend)
}

async fn connect_with_cbs_as(
    limits: ConnectionLimits,
    token: &str,
) -> (TestClient, Server, std::sync::Arc<FakeBackend>, Message) {
    let (mut client, server, backend) = start_with_backend(limits);
    assert_eq!(client.sasl("ANONYMOUS", None).await, SaslCode::Ok);
    client.write_open_and_begin(None);
    client.write_attach_pair("$cbs", 0);
    client.flush().await;
    client.read_open_and_begin().await;
    client.read_attach_pair(0).await;
    client.write_request(1, &put_token(CBS_ID, token));
    client.flush().await;
    let reply = client.read_reply(0).await;
    (client, server, backend, reply)
}

async fn attach_management(client: &mut TestClient) {
    client.write_attach_pair("$management", 2);
    client.flush().await;
    client.read_attach_pair(2).await;
}

#[tokio::test]
async fn pyamqp_get_eventhub_properties() {
    let (mut client, server, reply) = connect_with_cbs(GOOD_TOKEN).await;
    let properties = reply.properties.as_ref().unwrap();
    assert_eq!(properties.correlation_id, Some(MessageId::Uuid(CBS_ID)));
    assert_eq!(
        status(&reply),
        (Value::Int(202), Value::String("Accepted".into()))
    );
    assert_eq!(reply.body, Body::Empty);

    attach_management(&mut client).await;
    let read = read_request(READ_ID, "com.microsoft:eventhub", None, Some(GOOD_TOKEN));
    client.write_request(3, &read);
    client.flush().await;
    let reply = client.read_reply(2).await;
    assert_eq!(
        reply.properties.as_ref().unwrap().correlation_id,
        Some(MessageId::Uuid(READ_ID))
    );
    assert_eq!(
        status(&reply),
        (Value::Int(200), Value::String("OK".into()))
    );
    let body = body_map(&reply);
    let keys: Vec<&str> = body.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        keys,
        ["name", "created_at", "partition_count", "partition_ids"]
    );
    assert_eq!(body[0].1, Value::String("hub".into()));
    assert_eq!(body[1].1, Value::Timestamp(START_UNIX_MS - 1000));
    assert_eq!(body[2].1, Value::Int(2));
    let Value::Array(ids) = &body[3].1 else {
        panic!("partition_ids is not an array: {:?}", body[3].1)
    };
    assert_eq!(ids.kind(), ValueKind::String);
    assert_eq!(
        ids.items(),
        [Value::String("0".into()), Value::String("1".into())]
    );
    client.close_all(&[0, 1, 2, 3], server).await;
}

#[tokio::test]
async fn read_partition_answers_with_the_types_dotnet_unboxes() {
    let (mut client, server) = start(ConnectionLimits::default());
    // .NET's mechanism; the READ relies on the CBS grant (no security_token).
    assert_eq!(client.sasl("MSSBCBS", None).await, SaslCode::Ok);
    client.write_open_and_begin(Some(60_000));
    client.write_attach_pair("$cbs", 0);
    client.flush().await;
    client.read_open_and_begin().await;
    client.read_attach_pair(0).await;
    client.write_request(1, &put_token(CBS_ID, GOOD_TOKEN));
    client.flush().await;
    assert_eq!(status(&client.read_reply(0).await).0, Value::Int(202));
    attach_management(&mut client).await;
    let read = read_request(READ_ID, "com.microsoft:partition", Some("1"), None);
    client.write_request(3, &read);
    client.flush().await;
    let reply = client.read_reply(2).await;
    assert_eq!(status(&reply).0, Value::Int(200));
    let expected = [
        ("name", Value::String("hub".into())),
        ("partition", Value::String("1".into())),
        ("begin_sequence_number", Value::Long(0)),
        ("last_enqueued_sequence_number", Value::Long(41)),
        ("last_enqueued_offset", Value::String("4096".into())),
        ("last_enqueued_time_utc", Value::Timestamp(START_UNIX_MS)),
        ("is_partition_empty", Value::Boolean(false)),
    ];
    let body = body_map(&reply);
    assert_eq!(body.len(), expected.len());
    for ((key, value), (expected_key, expected_value)) in body.iter().zip(expected) {
        assert_eq!((key.as_str(), value), (expected_key, &expected_value));
    }

    let unknown = read_request([3; 16], "com.microsoft:partition", Some("7"), None);
    client.write_request(3, &unknown);
    client.flush().await;
    let reply = client.read_reply(2).await;
    assert_eq!(status(&reply).0, Value::Int(404));
    assert_eq!(
        app(&reply, "error-condition"),
        &Value::symbol("amqp:not-found")
    );
    client.close_all(&[0, 1, 2, 3], server).await;
}

#[tokio::test]
async fn plain_sasl_admits_a_known_rule_and_its_grant_authorizes_reads() {
    let (mut client, server) = start(ConnectionLimits::default());
    assert_eq!(
        client.sasl("PLAIN", Some(b"\0rule\0key")).await,
        SaslCode::Ok
    );
    client.write_open_and_begin(None);
    client.flush().await;
    client.read_open_and_begin().await;
    attach_management(&mut client).await;
    client.write_request(
        3,
        &read_request(READ_ID, "com.microsoft:eventhub", None, None),
    );
    client.flush().await;
    assert_eq!(status(&client.read_reply(2).await).0, Value::Int(200));
    client.close_all(&[2, 3], server).await;
}

#[tokio::test]
async fn a_client_that_waits_for_our_header_before_its_open_gets_it() {
    // uamqp-c sends its AMQP header and reads ours before it writes open.
    let (mut client, server) = start(ConnectionLimits::default());
    assert_eq!(client.sasl("MSSBCBS", None).await, SaslCode::Ok);
    client.write_bytes(&ProtocolHeader::AMQP.to_bytes());
    client.flush().await;
    let header = tokio::time::timeout(Duration::from_secs(5), client.read_header())
        .await
        .expect("the server sends its AMQP header before the client's open arrives");
    assert_eq!(header, ProtocolHeader::AMQP);
    drop(client);
    drop(server);
}

#[tokio::test]
async fn plain_sasl_with_a_wrong_key_gets_outcome_auth() {
    let (mut client, server) = start(ConnectionLimits::default());
    assert_eq!(
        client.sasl("PLAIN", Some(b"\0rule\0wrong")).await,
        SaslCode::Auth
    );
    assert!(client.at_eof().await);
    let error = server.await.unwrap().unwrap_err();
    assert!(
        matches!(error, ConnectionError::Authentication(_)),
        "{error}"
    );
}

#[tokio::test]
async fn a_wrong_token_gets_401_and_a_read_without_grant_401() {
    let (mut client, server, reply) = connect_with_cbs("SharedAccessSignature sig=forged").await;
    assert_eq!(status(&reply).0, Value::Int(401));
    // pyamqp reports a put-token reply's status and description only without an
    // `error-condition`.
    assert!(
        reply
            .application_properties
            .iter()
            .flatten()
            .all(|(key, _)| key != "error-condition"),
        "{reply:?}"
    );
    attach_management(&mut client).await;
    client.write_request(
        3,
        &read_request(READ_ID, "com.microsoft:eventhub", None, None),
    );
    client.flush().await;
    let reply = client.read_reply(2).await;
    assert_eq!(status(&reply).0, Value::Int(401));
    assert_eq!(
        reply.properties.unwrap().correlation_id,
        Some(MessageId::Uuid(READ_ID))
    );
    client.close_all(&[0, 1, 2, 3], server).await;
}

/// pyamqp's shutdown: detaches, end, then detaches of its CBS links on the session it has
/// just ended, then close. The late detaches are ignored and the connection closes cleanly.
#[tokio::test]
async fn detaches_after_the_clients_own_end_are_ignored() {
    let (mut client, server, _) = connect_with_cbs(GOOD_TOKEN).await;
    client.write(1, End::default());
    for handle in [0, 1] {
        client.write(
            1,
            Detach {
                handle: Handle(handle),
                closed: false,
                error: None,
            },
        );
    }
    client.write(0, Close::default());
    client.flush().await;
    assert!(matches!(
        client.read().await.performative,
        Performative::End(End { error: None })
    ));
    assert_eq!(
        client.read().await.performative,
        Performative::Close(Close::default())
    );
    assert!(client.at_eof().await);
    server.await.unwrap().unwrap();
}

#[tokio::test]
async fn hub_links_that_cannot_be_served_are_echoed_then_detached() {
    let (mut client, server, _) = connect_with_cbs(GOOD_TOKEN).await;
    let cases = [
        (
            4,
            Role::Receiver,
            "amqps://ns.example.com/hub/ConsumerGroups/$Default/Partitions/9",
            "amqp:not-found",
        ),
        (
            5,
            Role::Receiver,
            "amqps://ns.example.com/other/ConsumerGroups/$Default/Partitions/0",
            "amqp:unauthorized-access",
        ),
        (
            6,
            Role::Sender,
            "amqps://ns.example.com/other",
            "amqp:unauthorized-access",
        ),
        (
            7,
            Role::Sender,
            "amqps://ns.example.com/hub/Publishers/p",
            "amqp:not-found",
        ),
    ];
    for (handle, role, address, condition) in cases {
        client.write(1, attach("link", handle, role, address));
        client.flush().await;
        let echo = client.read_attach(Handle(handle)).await;
        assert_ne!(echo.role, role);
        let Performative::Detach(detach) = client.read().await.performative else {
            panic!("expected detach")
        };
        assert_eq!(detach.handle, Handle(handle));
        assert!(detach.closed);
        assert_eq!(
            detach.error.unwrap().condition.as_str(),
            condition,
            "{address}"
        );
        // Our detach was sent: the client's detach gets no second one.
        client.write(
            1,
            Detach {
                handle: Handle(handle),
                closed: true,
                error: None,
            },
        );
    }
    client.close_all(&[0, 1], server).await;
}

#[tokio::test]
async fn sessions_and_links_over_the_limits_are_refused() {
    let limits = ConnectionLimits {
        sessions_per_connection_max: 1,
        links_per_session_max: 2,
        ..ConnectionLimits::default()
    };
    let (mut client, server) = start(limits);
    client.write_open_and_begin(None);
    client.write(
        2,
        Begin {
            next_outgoing_id: TransferNumber(0),
            incoming_window: 10,
            outgoing_window: 10,
            ..Begin::default()
        },
    );
    client.flush().await;
    assert_eq!(client.read_header().await, ProtocolHeader::AMQP);
    assert!(matches!(
        client.read().await.performative,
        Performative::Open(_)
    ));
    assert!(matches!(
        client.read().await.performative,
        Performative::Begin(_)
    ));
    let refused = client.read().await;
    assert_eq!(refused.channel, Channel(2));
    assert!(matches!(refused.performative, Performative::Begin(_)));
    let Performative::End(end) = client.read().await.performative else {
        panic!("expected end")
    };
    assert_eq!(
        end.error.unwrap().condition.as_str(),
        "amqp:resource-limit-exceeded"
    );
    client.write(2, End::default());
    client.write_attach_pair("$cbs", 0);
    client.write(1, attach("third", 2, Role::Sender, "$management"));
    client.flush().await;
    client.read_attach(Handle(0)).await;
    client.read_attach(Handle(1)).await;
    assert!(matches!(
        client.read().await.performative,
        Performative::Flow(_)
    ));
    client.read_attach(Handle(2)).await;
    let Performative::Detach(detach) = client.read().await.performative else {
        panic!("expected detach")
    };
    assert_eq!(
        detach.error.unwrap().condition.as_str(),
        "amqp:resource-limit-exceeded"
    );
    client.close_all(&[0, 1], server).await;
}

#[tokio::test(start_paused = true)]
async fn heartbeats_follow_the_client_idle_timeout_and_a_silent_client_is_dropped() {
    let limits = ConnectionLimits {
        idle_timeout_ms: 60_000,
        ..ConnectionLimits::default()
    };
    let (mut client, server) = start(limits);
    client.write_open_and_begin(Some(10_000));
    client.flush().await;
    let open = client.read_open_and_begin().await;
    assert_eq!(open.idle_timeout_ms, Some(60_000));
    let started = tokio::time::Instant::now();
    let mut heartbeats = 0;
    let mut last = started;
    while heartbeats < 5 {
        assert!(client.read_frame_or_heartbeat().await.is_none());
        let gap = last.elapsed();
        assert!(gap < Duration::from_millis(5_000), "a gap of {gap:?}");
        last = tokio::time::Instant::now();
        heartbeats += 1;
    }
    // The client never sent a frame after its begin: after twice our idle-time-out the
    // server closes.
    let error = client.expect_close("amqp:connection:forced", server).await;
    assert!(
        matches!(error, ConnectionError::Idle { silent_ms: 120_000 }),
        "{error}"
    );
    assert!(started.elapsed() >= Duration::from_millis(110_000));
}

#[tokio::test]
async fn garbage_after_the_header_is_a_decode_error() {
    let (mut client, server) = start(ConnectionLimits::default());
    client.write_bytes(&ProtocolHeader::AMQP.to_bytes());
    client.write_bytes(&[0, 0, 0, 12, 2, 0, 0, 0, 0xff, 0xfe, 0xfd, 0xfc]);
    client.flush().await;
    assert_eq!(client.read_header().await, ProtocolHeader::AMQP);
    assert!(matches!(
        client.read().await.performative,
        Performative::Open(_)
    ));
    let error = client.expect_close("amqp:decode-error", server).await;
    assert!(matches!(error, ConnectionError::Decode(_)), "{error}");
}

#[tokio::test]
async fn an_oversized_frame_is_a_framing_error() {
    let (mut client, server) = start(ConnectionLimits::default());
    client.write_open_and_begin(None);
    client.flush().await;
    client.read_open_and_begin().await;
    // 1 MiB claimed, our max-frame-size is 64 KiB: refused on the header alone.
    client.write_bytes(&[0, 0x10, 0, 0, 2, 0, 0, 1]);
    client.flush().await;
    let error = client
        .expect_close("amqp:connection:framing-error", server)
        .await;
    assert!(matches!(error, ConnectionError::Framing(_)), "{error}");
}

#[tokio::test]
async fn a_truncated_frame_then_eof_is_a_framing_error() {
    let (mut client, server) = start(ConnectionLimits::default());
    client.write_open_and_begin(None);
    client.write_bytes(&[0, 0, 0, 100, 2, 0, 0, 1, 0, 0x53]);
    client.shutdown().await;
    client.read_open_and_begin().await;
    let error = client
        .expect_close("amqp:connection:framing-error", server)
        .await;
    assert!(
        matches!(error, ConnectionError::Truncated { buffered_bytes: 10 }),
        "{error}"
    );
}

#[tokio::test]
async fn tls_and_http_get_our_header_and_a_hang_up() {
    for first_bytes in [
        &b"\x16\x03\x01\x02\x00\x01\x00\x01"[..],
        b"GET / HTTP/1.1\r\n",
        b"AMQP\x02\x01\x00\x00",
    ] {
        let (mut client, server) = start(ConnectionLimits::default());
        client.write_bytes(first_bytes);
        client.flush().await;
        assert_eq!(client.read_header().await, ProtocolHeader::AMQP);
        assert!(client.at_eof().await);
        let error = server.await.unwrap().unwrap_err();
        assert!(
            matches!(
                error,
                ConnectionError::NotAmqp(_) | ConnectionError::UnsupportedProtocol(_)
            ),
            "{error}"
        );
    }
}

/// Runs a server over `bytes` sent after a valid header and open; the client then hangs up.
fn serve_bytes(bytes: Vec<u8>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    runtime.block_on(async {
        let (mut client, server) = start(ConnectionLimits::default());
        client.write_open_and_begin(None);
        client.write_bytes(&bytes);
        client.shutdown().await;
        // Drain what the server says so it never blocks on a full pipe.
        client.drain_to_eof().await;
        let outcome = server.await;
        assert!(outcome.is_ok(), "the server task panicked: {outcome:?}");
    });
}

#[test]
fn a_stream_of_valid_frames_ending_at_a_frame_boundary_is_served() {
    let mut bytes = Vec::new();
    write_performative(
        &mut bytes,
        Channel(1),
        &client::attach("l", 0, Role::Sender, "$cbs").into(),
        &[],
    );
    bytes.extend_from_slice(&HEARTBEAT);
    serve_bytes(bytes);
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn random_bytes_after_a_valid_header_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..2048),
    ) {
        serve_bytes(bytes);
    }

    #[test]
    fn random_frames_after_a_valid_header_never_panic(
        frames in proptest::collection::vec(
            (0..4u16, proptest::collection::vec(any::<u8>(), 0..256)), 0..16),
    ) {
        let mut bytes = Vec::new();
        for (channel, body) in frames {
            write_frame(&mut bytes, FrameType::Amqp, Channel(channel), &body);
        }
        serve_bytes(bytes);
    }

    #[test]
    fn mutated_performatives_after_a_valid_header_never_panic(
        performative in crate::test_support::arb_performative(),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut bytes = Vec::new();
        write_performative(&mut bytes, Channel(1), &performative, &payload);
        serve_bytes(bytes);
    }
}
