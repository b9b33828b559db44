//! Sender links (WIRE-PROTOCOLS A8): what the backend is handed and how deliveries settle.

use std::time::Duration;

use super::client::*;
use super::{READ_ID, attach_management, connect_with_cbs_limits, status};
use crate::server::{BackendError, BackendErrorKind, ConnectionLimits, EventBody, SendTarget};
use crate::*;

const HUB: &str = "amqps://ns.example.com/hub";
const SENDER: u32 = 4;

fn event(body: &[u8], key: Option<&str>) -> Message {
    Message {
        message_annotations: key.map(|k| {
            vec![(
                Value::symbol("x-opt-partition-key"),
                Value::String(k.into()),
            )]
        }),
        application_properties: Some(vec![("n".into(), Value::Long(1))]),
        ..Message::with_data(bytes::Bytes::copy_from_slice(body))
    }
}

fn rejection(disposition: &Disposition) -> (String, String) {
    let Some(DeliveryState::Rejected { error: Some(error) }) = &disposition.state else {
        panic!(
            "expected rejected with an error, got {:?}",
            disposition.state
        )
    };
    (
        error.condition.as_str().to_owned(),
        error.description.clone().unwrap_or_default(),
    )
}

#[tokio::test]
async fn a_single_event_is_sent_round_robin_and_accepted() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    let (reply, flow) = client.attach_sender(SENDER, HUB).await;
    assert_eq!(reply.role, Role::Receiver);
    assert_eq!(reply.rcv_settle_mode, ReceiverSettleMode::First);
    assert_eq!(reply.max_message_size_bytes, Some(1_048_576));
    assert_eq!(
        reply.target.unwrap().address.as_deref(),
        Some(HUB),
        "the target is echoed"
    );
    assert_eq!(flow.link_credit, Some(1_000));
    assert_eq!(flow.delivery_count, Some(0));

    let id = client.write_delivery(SENDER, 0, false, &[&event(b"hello", None).to_bytes()]);
    client.flush().await;
    let disposition = client.read_disposition().await;
    assert_eq!(disposition.role, Role::Receiver);
    assert_eq!(disposition.first, DeliveryNumber(id));
    assert_eq!(disposition.state, Some(DeliveryState::Accepted));
    let sent = backend.sent();
    assert_eq!(sent.len(), 1);
    assert_eq!(sent[0].hub, "hub");
    assert_eq!(sent[0].target, SendTarget::RoundRobin);
    let [event] = &sent[0].events[..] else {
        panic!("one event expected")
    };
    assert_eq!(
        event.body,
        EventBody::Data(bytes::Bytes::from_static(b"hello"))
    );
    assert_eq!(
        event.application_properties,
        vec![("n".to_owned(), Value::Long(1))]
    );
    assert_eq!(event.partition_key, None);
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test]
async fn a_keyed_batch_of_three_is_one_send_of_three_events() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    client.attach_sender(SENDER, HUB).await;
    let events: Vec<Message> = [&b"a"[..], b"b", b"c"]
        .iter()
        .map(|body| Message {
            header: Some(Header {
                durable: true,
                ..Header::default()
            }),
            ..event(body, Some("device-42"))
        })
        .collect();
    let batch = build_batch(event(b"", Some("device-42")), &events);
    let id = client.write_delivery(SENDER, BATCH_MESSAGE_FORMAT, false, &[&batch.to_bytes()]);
    client.flush().await;
    let disposition = client.read_disposition().await;
    assert_eq!(
        (disposition.first, disposition.state),
        (DeliveryNumber(id), Some(DeliveryState::Accepted))
    );
    let sent = backend.sent();
    assert_eq!(sent[0].target, SendTarget::PartitionKey("device-42".into()));
    let bodies: Vec<&EventBody> = sent[0].events.iter().map(|e| &e.body).collect();
    assert_eq!(
        bodies,
        [b"a", b"b", b"c"]
            .map(|b| EventBody::Data(bytes::Bytes::from_static(b)))
            .iter()
            .collect::<Vec<_>>()
    );
    for event in &sent[0].events {
        assert_eq!(event.partition_key.as_deref(), Some("device-42"));
        assert!(event.header.as_ref().unwrap().durable);
        // The key is kept as the event's key, not among its other annotations.
        assert!(event.message_annotations.is_empty());
    }
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test]
async fn a_partition_link_sends_to_its_partition_and_refuses_keys() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    client
        .attach_sender(SENDER, "amqps://ns.example.com/hub/Partitions/1")
        .await;
    let plain = client.write_delivery(SENDER, 0, false, &[&event(b"x", None).to_bytes()]);
    let keyed = client.write_delivery(SENDER, 0, false, &[&event(b"y", Some("k")).to_bytes()]);
    client.flush().await;
    // Settled as they are decided: the refusal may overtake the commit.
    let mut dispositions = [
        client.read_disposition().await,
        client.read_disposition().await,
    ];
    dispositions.sort_by_key(|d| d.first);
    assert_eq!(dispositions[0].first, DeliveryNumber(plain));
    assert_eq!(dispositions[0].state, Some(DeliveryState::Accepted));
    let disposition = &dispositions[1];
    assert_eq!(disposition.first, DeliveryNumber(keyed));
    let (condition, description) = rejection(disposition);
    assert_eq!(condition, "com.microsoft:argument-error");
    assert!(description.contains("'k'"), "{description}");
    let sent = backend.sent();
    assert_eq!(
        sent.len(),
        1,
        "the keyed delivery never reaches the backend"
    );
    assert_eq!(sent[0].target, SendTarget::PartitionId("1".into()));
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test]
async fn a_delivery_in_several_frames_is_reassembled() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    client.attach_sender(SENDER, HUB).await;
    let body: Vec<u8> = (0..150_000u32).map(|i| i as u8).collect();
    let bytes = Message::with_data(bytes::Bytes::from(body.clone())).to_bytes();
    let parts: Vec<&[u8]> = bytes.chunks(60_000).collect();
    assert_eq!(parts.len(), 3);
    let id = client.write_delivery(SENDER, 0, false, &parts);
    client.flush().await;
    let disposition = client.read_disposition().await;
    assert_eq!(
        (disposition.first, disposition.state),
        (DeliveryNumber(id), Some(DeliveryState::Accepted))
    );
    assert_eq!(
        backend.sent()[0].events[0].body,
        EventBody::Data(bytes::Bytes::from(body))
    );
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test]
async fn an_oversized_delivery_is_rejected_and_the_link_goes_on() {
    let limits = ConnectionLimits {
        max_message_size_bytes: 4_096,
        ..ConnectionLimits::default()
    };
    let (mut client, server, backend) = connect_with_cbs_limits(limits).await;
    let (reply, _) = client.attach_sender(SENDER, HUB).await;
    assert_eq!(reply.max_message_size_bytes, Some(4_096));
    let big = Message::with_data(bytes::Bytes::from(vec![7u8; 6_000])).to_bytes();
    let (first, second) = big.split_at(3_000);
    let oversized = client.write_delivery(SENDER, 0, false, &[first, second]);
    let small = client.write_delivery(SENDER, 0, false, &[&event(b"ok", None).to_bytes()]);
    client.flush().await;
    let disposition = client.read_disposition().await;
    assert_eq!(disposition.first, DeliveryNumber(oversized));
    assert_eq!(rejection(&disposition).0, "amqp:link:message-size-exceeded");
    let disposition = client.read_disposition().await;
    assert_eq!(
        (disposition.first, disposition.state),
        (DeliveryNumber(small), Some(DeliveryState::Accepted))
    );
    assert_eq!(backend.sent().len(), 1);
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test]
async fn a_backend_refusal_rejects_with_its_condition() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    backend.answer_sends(SendAnswer::Refuse(BackendError::new(
        BackendErrorKind::ServerBusy,
        "the partition is being throttled; please wait 4 seconds and try again",
    )));
    client.attach_sender(SENDER, HUB).await;
    client.write_delivery(SENDER, 0, false, &[&event(b"x", None).to_bytes()]);
    client.flush().await;
    let (condition, description) = rejection(&client.read_disposition().await);
    assert_eq!(condition, "com.microsoft:server-busy");
    assert!(description.contains("throttled"));
    backend.answer_sends(SendAnswer::Refuse(BackendError::not_found(
        "The messaging entity 'hub' could not be found",
    )));
    client.write_delivery(SENDER, 0, false, &[&event(b"x", None).to_bytes()]);
    client.flush().await;
    assert_eq!(
        rejection(&client.read_disposition().await).0,
        "amqp:not-found"
    );
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test]
async fn a_pre_settled_delivery_gets_no_disposition() {
    let (mut client, server, backend) = connect_with_cbs_limits(ConnectionLimits::default()).await;
    client.attach_sender(SENDER, HUB).await;
    client.write_delivery(
        SENDER,
        0,
        true,
        &[&event(b"fire-and-forget", None).to_bytes()],
    );
    let unsettled = client.write_delivery(SENDER, 0, false, &[&event(b"x", None).to_bytes()]);
    client.flush().await;
    // The first frame back settles the second delivery: the first got none.
    let disposition = client.read_disposition().await;
    assert_eq!(disposition.first, DeliveryNumber(unsettled));
    assert_eq!(backend.sent().len(), 2);
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_commit_holds_up_neither_heartbeats_nor_other_links() {
    let limits = ConnectionLimits {
        pending_sends_per_link_max: 2,
        ..ConnectionLimits::default()
    };
    let (mut client, server, backend) = start_with_backend(limits);
    client.write_open_and_begin(Some(10_000));
    client.write_attach_pair("$cbs", 0);
    client.flush().await;
    client.read_open_and_begin().await;
    client.read_attach_pair(0).await;
    client.write_request(1, &put_token([1; 16], GOOD_TOKEN));
    client.flush().await;
    assert_eq!(status(&client.read_reply(0).await).0, Value::Int(202));
    backend.answer_sends(SendAnswer::CommitAfter(Duration::from_secs(60)));
    let started = tokio::time::Instant::now();

    // The credit never exceeds the room for pending sends.
    let (_, flow) = client.attach_sender(SENDER, HUB).await;
    assert_eq!(flow.link_credit, Some(2));
    let first = client.write_delivery(SENDER, 0, false, &[&event(b"1", None).to_bytes()]);
    let second = client.write_delivery(SENDER, 0, false, &[&event(b"2", None).to_bytes()]);
    // Beyond the credit (pyamqp does that): refused at once, not queued.
    let third = client.write_delivery(SENDER, 0, false, &[&event(b"3", None).to_bytes()]);
    client.flush().await;
    let disposition = client.read_disposition().await;
    assert_eq!(disposition.first, DeliveryNumber(third));
    assert_eq!(rejection(&disposition).0, "com.microsoft:server-busy");
    let sent = backend.sent();
    let bodies: Vec<&EventBody> = sent.iter().map(|s| &s.events[0].body).collect();
    assert_eq!(
        bodies,
        [
            &EventBody::Data(bytes::Bytes::from_static(b"1")),
            &EventBody::Data(bytes::Bytes::from_static(b"2"))
        ],
        "handed over in arrival order"
    );

    // Another link is served and heartbeats flow while both commits are pending.
    attach_management(&mut client).await;
    client.write_request(
        3,
        &read_request(READ_ID, "com.microsoft:eventhub", None, None),
    );
    client.flush().await;
    assert_eq!(status(&client.read_reply(2).await).0, Value::Int(200));
    let mut heartbeats = 0;
    let mut settled = Vec::new();
    let mut flows = Vec::new();
    // Once the commits are in, the credit comes back.
    while settled.len() < 2 || flows.last() != Some(&Some(2)) {
        match client
            .read_frame_or_heartbeat()
            .await
            .map(|r| r.performative)
        {
            None => heartbeats += 1,
            Some(Performative::Disposition(d)) => {
                assert_eq!(d.state, Some(DeliveryState::Accepted));
                assert!(started.elapsed() >= Duration::from_secs(60));
                settled.push(d.first);
            }
            Some(Performative::Flow(flow)) => {
                assert_eq!(flow.handle, Some(Handle(SENDER)));
                flows.push(flow.link_credit);
            }
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
    assert!(heartbeats >= 10, "{heartbeats} heartbeats in 60 s");
    settled.sort();
    assert_eq!(settled, [DeliveryNumber(first), DeliveryNumber(second)]);
    client.close_all(&[0, 1, 2, 3, SENDER], server).await;
}

#[tokio::test(start_paused = true)]
async fn sends_that_fill_the_buffers_are_refused_without_closing_the_connection() {
    let limits = ConnectionLimits {
        max_message_size_bytes: 4_096,
        buffered_bytes_max: 8_192,
        ..ConnectionLimits::default()
    };
    let (mut client, server, backend) = connect_with_cbs_limits(limits).await;
    backend.answer_sends(SendAnswer::CommitAfter(Duration::from_secs(10)));
    client.attach_sender(SENDER, HUB).await;
    let message = Message::with_data(bytes::Bytes::from(vec![1u8; 3_000])).to_bytes();
    let ids: Vec<u32> = (0..3)
        .map(|_| client.write_delivery(SENDER, 0, false, &[&message]))
        .collect();
    client.flush().await;
    // Two sends hold 6000 of the 8192 bytes until they commit: the third is refused.
    let disposition = client.read_disposition().await;
    assert_eq!(disposition.first, DeliveryNumber(ids[2]));
    assert_eq!(rejection(&disposition).0, "com.microsoft:server-busy");
    for id in &ids[..2] {
        let disposition = client.read_disposition().await;
        assert_eq!(
            (disposition.first, disposition.state),
            (DeliveryNumber(*id), Some(DeliveryState::Accepted))
        );
    }
    assert_eq!(backend.sent().len(), 2);
    client.close_all(&[0, 1, SENDER], server).await;
}

#[tokio::test(start_paused = true)]
async fn a_link_the_buffers_left_without_credit_gets_it_back_when_they_drain() {
    const OTHER: u32 = SENDER + 1;
    let limits = ConnectionLimits {
        max_message_size_bytes: 4_096,
        buffered_bytes_max: 8_192,
        sender_link_credit: 2,
        ..ConnectionLimits::default()
    };
    let (mut client, server, backend) = connect_with_cbs_limits(limits).await;
    backend.answer_sends(SendAnswer::CommitAfter(Duration::from_secs(10)));
    assert_eq!(
        client.attach_sender(SENDER, HUB).await.1.link_credit,
        Some(2)
    );
    assert_eq!(
        client.attach_sender(OTHER, HUB).await.1.link_credit,
        Some(2)
    );
    let message = Message::with_data(bytes::Bytes::from(vec![1u8; 3_000])).to_bytes();
    // The first link's two sends hold 6000 of the 8192 bytes; the other link's two
    // deliveries find the buffers full, are refused, and use up its credit.
    let held: Vec<u32> = (0..2)
        .map(|_| client.write_delivery(SENDER, 0, false, &[&message]))
        .collect();
    let refused: [u32; 2] =
        std::array::from_fn(|_| client.write_delivery(OTHER, 0, false, &[&message]));
    client.flush().await;
    // (The first link's credit is topped up meanwhile: flows come between.)
    let mut rejected = Vec::new();
    while rejected.len() < refused.len() {
        match client.read().await.performative {
            Performative::Disposition(d) => {
                assert_eq!(rejection(&d).0, "com.microsoft:server-busy");
                rejected.push(d.first);
            }
            Performative::Flow(flow) => assert_eq!(flow.handle, Some(Handle(SENDER))),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(rejected, refused.map(DeliveryNumber));

    // The other link has no credit and no send pending: only the first link's commits,
    // which free the buffers, can give it credit again.
    let mut accepted = Vec::new();
    let mut other_credit = None;
    tokio::time::timeout(Duration::from_secs(120), async {
        while accepted.len() < 2 || other_credit.is_none() {
            match client
                .read_frame_or_heartbeat()
                .await
                .map(|r| r.performative)
            {
                Some(Performative::Disposition(d)) => {
                    assert_eq!(d.state, Some(DeliveryState::Accepted));
                    accepted.push(d.first);
                }
                Some(Performative::Flow(flow)) if flow.handle == Some(Handle(OTHER)) => {
                    other_credit = flow.link_credit;
                }
                _ => {}
            }
        }
    })
    .await
    .expect("the link left without credit never got it back");
    accepted.sort();
    assert_eq!(accepted, [DeliveryNumber(held[0]), DeliveryNumber(held[1])]);
    assert_eq!(other_credit, Some(2));

    // And it sends again.
    let id = client.write_delivery(OTHER, 0, false, &[&message]);
    client.flush().await;
    let disposition = tokio::time::timeout(Duration::from_secs(120), async {
        loop {
            if let Some(Performative::Disposition(d)) = client
                .read_frame_or_heartbeat()
                .await
                .map(|r| r.performative)
            {
                return d;
            }
        }
    })
    .await
    .expect("the send was not settled");
    assert_eq!(
        (disposition.first, disposition.state),
        (DeliveryNumber(id), Some(DeliveryState::Accepted))
    );
    assert_eq!(backend.sent().len(), 3);
    client.close_all(&[0, 1, SENDER, OTHER], server).await;
}
