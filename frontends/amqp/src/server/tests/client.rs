//! A scripted AMQP client written with the codec, and a backend with fixed answers: the
//! helpers of the server tests (the backend also serves the client's, in `client/tests`), so
//! an API change touches one place.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tributary_types::SequenceNumber;

use crate::server::{
    AmqpEvent, Backend, BackendError, BackendFuture, ConnectionError, ConnectionLimits, EventBatch,
    EventStream, HubProperties, PartitionProperties, ReadRequest, Rights, SendOutcome, SendTarget,
    TokenGrant, serve_connection,
};
use crate::*;

pub const HOST: &str = "ns.example.com";
pub const GOOD_TOKEN: &str = "SharedAccessSignature sr=good&sig=x&se=1&skn=rule";
/// The fake clock starts here (2026-01-01).
pub const START_UNIX_MS: i64 = 1_767_225_600_000;
pub const TOKEN_LIFETIME_MS: i64 = 3_600_000;

/// Knows the hub `hub` with partitions 0 and 1, the token [`GOOD_TOKEN`] and the PLAIN user
/// `rule` with key `key`. Its clock follows tokio's (paused in tests). It records sends and
/// answers them as [`FakeBackend::send_answer`] says; readers it opens are fed by the test
/// through [`FakeBackend::readers`].
pub struct FakeBackend {
    start: Instant,
    /// Every send, in the order the connection called `send`.
    pub sends: Mutex<Vec<SentCall>>,
    pub send_answer: Mutex<SendAnswer>,
    /// Every reader opened, with the sender that feeds its stream.
    pub readers: Mutex<Vec<(ReadRequest, mpsc::Sender<EventBatch>)>>,
}

/// One call of `send`.
#[derive(Debug, Clone, PartialEq)]
pub struct SentCall {
    pub hub: String,
    pub target: SendTarget,
    pub events: Vec<AmqpEvent>,
}

/// How the fake answers sends.
#[derive(Debug, Clone)]
pub enum SendAnswer {
    Commit,
    /// Commits after this long (on tokio's clock).
    CommitAfter(Duration),
    Refuse(BackendError),
}

impl FakeBackend {
    pub fn new() -> Arc<FakeBackend> {
        Arc::new(FakeBackend {
            start: Instant::now(),
            sends: Mutex::new(Vec::new()),
            send_answer: Mutex::new(SendAnswer::Commit),
            readers: Mutex::new(Vec::new()),
        })
    }

    pub fn answer_sends(&self, answer: SendAnswer) {
        *self.send_answer.lock().unwrap() = answer;
    }

    pub fn sent(&self) -> Vec<SentCall> {
        self.sends.lock().unwrap().clone()
    }

    /// The feeding end of the `index`th reader opened.
    pub fn reader(&self, index: usize) -> (ReadRequest, mpsc::Sender<EventBatch>) {
        self.readers.lock().unwrap()[index].clone()
    }

    fn grant(&self) -> TokenGrant {
        TokenGrant {
            rights: Rights::MANAGE,
            credential: String::new(),
            expires_at_unix_ms: self.now_unix_ms() + TOKEN_LIFETIME_MS,
        }
    }
}

impl Backend for FakeBackend {
    fn now_unix_ms(&self) -> i64 {
        START_UNIX_MS + self.start.elapsed().as_millis() as i64
    }

    fn sasl_plain<'a>(&'a self, user: &'a str, password: &'a str) -> BackendFuture<'a, TokenGrant> {
        Box::pin(async move {
            if (user, password) == ("rule", "key") {
                Ok(self.grant())
            } else {
                Err(BackendError::unauthorized("unknown rule or wrong key"))
            }
        })
    }

    fn put_token<'a>(
        &'a self,
        _audience: &'a str,
        _token_type: &'a str,
        token: &'a str,
    ) -> BackendFuture<'a, TokenGrant> {
        Box::pin(async move {
            if token == GOOD_TOKEN {
                Ok(self.grant())
            } else {
                Err(BackendError::unauthorized("the signature does not match"))
            }
        })
    }

    fn hub_properties<'a>(
        &'a self,
        _grant: &'a TokenGrant,
        hub: &'a str,
    ) -> BackendFuture<'a, HubProperties> {
        Box::pin(async move {
            if !hub.eq_ignore_ascii_case("hub") {
                return Err(BackendError::not_found(format!(
                    "The messaging entity '{hub}' could not be found"
                )));
            }
            Ok(HubProperties {
                name: hub.to_owned(),
                created_at_unix_ms: START_UNIX_MS - 1000,
                partition_ids: vec!["0".into(), "1".into()],
            })
        })
    }

    fn partition_properties<'a>(
        &'a self,
        _grant: &'a TokenGrant,
        hub: &'a str,
        partition: &'a str,
    ) -> BackendFuture<'a, PartitionProperties> {
        Box::pin(async move {
            if !hub.eq_ignore_ascii_case("hub") || !["0", "1"].contains(&partition) {
                return Err(BackendError::not_found(format!(
                    "The messaging entity '{hub}/Partitions/{partition}' could not be found"
                )));
            }
            Ok(PartitionProperties {
                hub: hub.to_owned(),
                partition_id: partition.to_owned(),
                begin_sequence_number: 0,
                last_enqueued_sequence_number: 41,
                last_enqueued_offset: "4096".into(),
                last_enqueued_time_unix_ms: START_UNIX_MS,
                is_empty: false,
            })
        })
    }

    fn send(
        &self,
        _grant: &TokenGrant,
        hub: &str,
        target: SendTarget,
        events: Vec<AmqpEvent>,
    ) -> BackendFuture<'static, SendOutcome> {
        let mut sends = self.sends.lock().unwrap();
        let first_sequence_number = SequenceNumber(sends.len() as i64);
        let partition_id = match &target {
            SendTarget::PartitionId(id) => id.clone(),
            _ => "0".to_owned(),
        };
        sends.push(SentCall {
            hub: hub.to_owned(),
            target,
            events,
        });
        let answer = self.send_answer.lock().unwrap().clone();
        Box::pin(async move {
            let outcome = SendOutcome {
                partition_id,
                first_sequence_number,
            };
            match answer {
                SendAnswer::Commit => Ok(outcome),
                SendAnswer::CommitAfter(delay) => {
                    tokio::time::sleep(delay).await;
                    Ok(outcome)
                }
                SendAnswer::Refuse(error) => Err(error),
            }
        })
    }

    fn read(
        &self,
        _grant: &TokenGrant,
        request: ReadRequest,
    ) -> BackendFuture<'static, EventStream> {
        let known = request.hub.eq_ignore_ascii_case("hub")
            && ["0", "1"].contains(&request.partition.as_str());
        let (sender, stream) = EventStream::channel(8);
        if known {
            self.readers.lock().unwrap().push((request.clone(), sender));
        }
        Box::pin(async move {
            if !known {
                return Err(BackendError::not_found(format!(
                    "The messaging entity '{}/Partitions/{}' could not be found",
                    request.hub, request.partition
                )));
            }
            Ok(stream)
        })
    }
}

/// A frame the server sent, with the field count of its list on the wire.
#[derive(Debug)]
pub struct Received {
    pub channel: Channel,
    pub performative: Performative,
    pub payload: Bytes,
    /// The frame's size on the wire.
    pub frame_bytes: usize,
}

/// A client over an in-memory stream; frames are buffered by `write` and sent by `flush`,
/// so a test can pipeline like pyamqp.
pub struct TestClient {
    io: DuplexStream,
    input: BytesMut,
    pending: Vec<u8>,
    next_delivery_id: u32,
}

pub type Server = JoinHandle<Result<(), ConnectionError>>;

pub fn start(limits: ConnectionLimits) -> (TestClient, Server) {
    let (client, server, _) = start_with_backend(limits);
    (client, server)
}

/// [`start`], keeping the fake backend for the test to drive.
pub fn start_with_backend(limits: ConnectionLimits) -> (TestClient, Server, Arc<FakeBackend>) {
    let (client, server) = tokio::io::duplex(1 << 20);
    let fake = FakeBackend::new();
    let backend: Arc<dyn Backend> = fake.clone();
    let task = tokio::spawn(serve_connection(server, backend, limits));
    let client = TestClient {
        io: client,
        input: BytesMut::new(),
        pending: Vec::new(),
        next_delivery_id: 0,
    };
    (client, task, fake)
}

/// The field count A5 requires of every performative (by descriptor code).
fn required_field_count(code: u8) -> usize {
    match code {
        0x10 => 10,
        0x11 => 8,
        0x12 => 14,
        0x13 => 11,
        0x14 => 11,
        0x15 => 6,
        0x16 => 3,
        0x17 | 0x18 => 1,
        0x40 => 1,
        0x44 => 2,
        other => panic!("the server sent descriptor 0x{other:02x}"),
    }
}

/// Checks the list header of a performative as pyamqp reads it: `00 53 <code>`, then list8
/// or list32 with the full count.
fn assert_full_length(body: &[u8]) {
    assert_eq!(body[..2], [0x00, 0x53], "smallulong descriptor");
    let code = body[2];
    let count = match body[3] {
        0xc0 => usize::from(body[5]),
        0xd0 => u32::from_be_bytes([body[8], body[9], body[10], body[11]]) as usize,
        other => panic!("performative 0x{code:02x} written with constructor 0x{other:02x}"),
    };
    assert_eq!(count, required_field_count(code), "fields of 0x{code:02x}");
}

impl TestClient {
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        self.pending.extend_from_slice(bytes);
    }

    pub fn write(&mut self, channel: u16, performative: impl Into<Performative>) {
        write_performative(
            &mut self.pending,
            Channel(channel),
            &performative.into(),
            &[],
        );
    }

    pub async fn flush(&mut self) {
        let bytes = std::mem::take(&mut self.pending);
        self.io.write_all(&bytes).await.unwrap();
    }

    pub async fn shutdown(&mut self) {
        self.flush().await;
        self.io.shutdown().await.unwrap();
    }

    async fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 4096];
        let read = self.io.read(&mut chunk).await.unwrap_or(0);
        self.input.extend_from_slice(&chunk[..read]);
        read > 0
    }

    /// Reads and drops everything until the server hangs up.
    pub async fn drain_to_eof(&mut self) {
        while self.fill().await {
            self.input.clear();
        }
        self.input.clear();
    }

    pub async fn read_header(&mut self) -> ProtocolHeader {
        loop {
            if let Some(header) = ProtocolHeader::parse(&self.input).unwrap() {
                let _ = self.input.split_to(8);
                return header;
            }
            assert!(self.fill().await, "EOF before a protocol header");
        }
    }

    /// The next frame, heartbeats included (`None` for one); panics at EOF.
    pub async fn read_frame_or_heartbeat(&mut self) -> Option<Received> {
        loop {
            if let Some(frame) = read_frame(&mut self.input, u32::MAX).unwrap() {
                if frame.is_heartbeat() {
                    return None;
                }
                assert_full_length(&frame.body);
                let channel = frame.channel;
                let frame_bytes = FRAME_HEADER_BYTES + frame.body.len();
                let (performative, payload) = decode_frame_body(frame.body).unwrap();
                return Some(Received {
                    channel,
                    performative,
                    payload,
                    frame_bytes,
                });
            }
            assert!(self.fill().await, "EOF before a frame");
        }
    }

    /// The next frame that is not a heartbeat.
    pub async fn read(&mut self) -> Received {
        loop {
            if let Some(received) = self.read_frame_or_heartbeat().await {
                return received;
            }
        }
    }

    /// True when the server closed its side, after anything still unread.
    pub async fn at_eof(&mut self) -> bool {
        self.input.is_empty() && !self.fill().await
    }

    pub async fn read_sasl_mechanisms(&mut self) -> Vec<Symbol> {
        assert_eq!(self.read_header().await, ProtocolHeader::SASL);
        loop {
            let Some(frame) = read_frame(&mut self.input, u32::MAX).unwrap() else {
                assert!(self.fill().await);
                continue;
            };
            assert_eq!(frame.frame_type, FrameType::Sasl);
            assert_full_length(&frame.body);
            // pyamqp tests `mechanism in fields[0]`: the list must be an array.
            let (value, _) = Value::decode(frame.body).unwrap();
            let Value::Described(described) = value else {
                panic!("not a performative")
            };
            let Value::List(fields) = &described.value else {
                panic!("not a list")
            };
            assert_eq!(fields[0].kind(), ValueKind::Array);
            let Value::Array(array) = &fields[0] else {
                unreachable!()
            };
            return array
                .items()
                .iter()
                .map(|m| Symbol::from(m.as_str().unwrap()))
                .collect();
        }
    }

    /// SASL with `mechanism`, returning the outcome code.
    pub async fn sasl(&mut self, mechanism: &str, response: Option<&[u8]>) -> SaslCode {
        self.write_bytes(&ProtocolHeader::SASL.to_bytes());
        self.flush().await;
        let mechanisms = self.read_sasl_mechanisms().await;
        assert!(mechanisms.iter().any(|m| m.as_str() == mechanism));
        self.write(
            0,
            SaslInit {
                mechanism: mechanism.into(),
                initial_response: response.map(Bytes::copy_from_slice),
                hostname: Some(HOST.into()),
            },
        );
        self.flush().await;
        let outcome = self.read().await;
        let Performative::SaslOutcome(outcome) = outcome.performative else {
            panic!("expected sasl-outcome, got {:?}", outcome.performative)
        };
        outcome.code
    }

    /// pyamqp's pipelined start: AMQP header, open and begin on channel 1 (not flushed).
    pub fn write_open_and_begin(&mut self, idle_timeout_ms: Option<u32>) {
        self.write_open_and_begin_with(idle_timeout_ms, 1 << 20);
    }

    /// [`TestClient::write_open_and_begin`] with our max-frame-size.
    pub fn write_open_and_begin_with(
        &mut self,
        idle_timeout_ms: Option<u32>,
        max_frame_size_bytes: u32,
    ) {
        self.write_bytes(&ProtocolHeader::AMQP.to_bytes());
        self.write(
            0,
            Open {
                container_id: "eventhub.pysdk-0a1b2c3d".into(),
                hostname: Some(HOST.into()),
                max_frame_size_bytes,
                channel_max: 65535,
                idle_timeout_ms,
                properties: Some(vec![(
                    "product".into(),
                    Value::String("azsdk-python-eventhubs".into()),
                )]),
                ..Open::default()
            },
        );
        self.write(
            1,
            Begin {
                next_outgoing_id: TransferNumber(0),
                incoming_window: 65536,
                outgoing_window: 65536,
                ..Begin::default()
            },
        );
    }

    /// Reads the server's header, open and begin, checking what pyamqp computes with.
    pub async fn read_open_and_begin(&mut self) -> Open {
        assert_eq!(self.read_header().await, ProtocolHeader::AMQP);
        let Performative::Open(open) = self.read().await.performative else {
            panic!("expected open")
        };
        assert!(open.max_frame_size_bytes >= 512);
        assert_eq!(open.properties, Some(Vec::new()));
        let begin = self.read().await;
        assert_eq!(begin.channel, Channel(1));
        let Performative::Begin(begin) = begin.performative else {
            panic!("expected begin")
        };
        assert_eq!(begin.remote_channel, Some(Channel(1)));
        assert!(begin.incoming_window > 0 && begin.outgoing_window > 0);
        assert_eq!(begin.handle_max, 255);
        open
    }

    /// The attach pair of `$cbs` or `$management` on session 1: receiver on `handle`,
    /// sender on `handle + 1` (not flushed).
    pub fn write_attach_pair(&mut self, address: &str, handle: u32) {
        self.write(
            1,
            attach(
                &format!("receiver-link-{handle}"),
                handle,
                Role::Receiver,
                address,
            ),
        );
        self.write(
            1,
            attach(
                &format!("sender-link-{handle}"),
                handle + 1,
                Role::Sender,
                address,
            ),
        );
    }

    /// Reads the server's attaches for a pair and the flow granting credit on the request
    /// link; then gives credit on the reply link.
    pub async fn read_attach_pair(&mut self, handle: u32) {
        let reply = self.read_attach(Handle(handle)).await;
        assert_eq!(reply.role, Role::Sender);
        assert_eq!(reply.initial_delivery_count, Some(0));
        let reply = self.read_attach(Handle(handle + 1)).await;
        assert_eq!(reply.role, Role::Receiver);
        let Performative::Flow(flow) = self.read().await.performative else {
            panic!("expected flow")
        };
        assert_eq!(flow.handle, Some(Handle(handle + 1)));
        assert_eq!(flow.link_credit, Some(100));
        self.write(
            1,
            Flow {
                next_incoming_id: Some(TransferNumber(0)),
                incoming_window: 65536,
                next_outgoing_id: TransferNumber(self.next_delivery_id),
                outgoing_window: 65536,
                handle: Some(Handle(handle)),
                delivery_count: Some(0),
                link_credit: Some(300),
                ..Flow::default()
            },
        );
    }

    pub async fn read_attach(&mut self, handle: Handle) -> Attach {
        let Performative::Attach(attach) = self.read().await.performative else {
            panic!("expected attach")
        };
        assert_eq!(attach.handle, handle);
        assert!(attach.source.is_some() && attach.target.is_some());
        assert!(attach.max_message_size_bytes.is_some());
        assert_eq!(attach.properties, Some(Vec::new()));
        *attach
    }

    /// Sends a request message on `handle` of session 1, unsettled.
    pub fn write_request(&mut self, handle: u32, message: &Message) {
        self.write_delivery(handle, 0, false, &[&message.to_bytes()]);
    }

    /// Sends one delivery on `handle` of session 1 in as many transfer frames as `frames`
    /// has parts (only the first carries id and tag); returns its delivery id.
    pub fn write_delivery(
        &mut self,
        handle: u32,
        message_format: u32,
        settled: bool,
        frames: &[&[u8]],
    ) -> u32 {
        let id = self.next_delivery_id;
        self.next_delivery_id += 1;
        for (index, part) in frames.iter().enumerate() {
            let first = index == 0;
            let transfer = Transfer {
                handle: Handle(handle),
                delivery_id: first.then_some(DeliveryNumber(id)),
                delivery_tag: first.then(|| Bytes::copy_from_slice(&id.to_be_bytes())),
                message_format: first.then_some(message_format),
                settled: first.then_some(settled),
                more: index + 1 < frames.len(),
                rcv_settle_mode: None,
                state: None,
                resume: false,
                aborted: false,
                batchable: false,
            };
            write_performative(&mut self.pending, Channel(1), &transfer.into(), part);
        }
        id
    }

    /// Attaches a sender link to `address` on `handle` and reads our attach and the flow
    /// granting credit; returns both.
    pub async fn attach_sender(&mut self, handle: u32, address: &str) -> (Attach, Flow) {
        self.write(1, attach("sender", handle, Role::Sender, address));
        self.flush().await;
        let reply = self.read_attach(Handle(handle)).await;
        let Performative::Flow(flow) = self.read().await.performative else {
            panic!("expected the flow granting credit")
        };
        assert_eq!(flow.handle, Some(Handle(handle)));
        (reply, flow)
    }

    /// The next disposition.
    pub async fn read_disposition(&mut self) -> Disposition {
        let received = self.read().await;
        let Performative::Disposition(disposition) = received.performative else {
            panic!("expected disposition, got {:?}", received.performative)
        };
        assert!(disposition.settled);
        disposition
    }

    /// Gives `credit` on link `handle` (delivery-count as the server last said).
    pub fn write_flow(&mut self, handle: u32, delivery_count: u32, credit: u32, echo: bool) {
        self.write(
            1,
            Flow {
                next_incoming_id: Some(TransferNumber(0)),
                incoming_window: 65536,
                next_outgoing_id: TransferNumber(self.next_delivery_id),
                outgoing_window: 65536,
                handle: Some(Handle(handle)),
                delivery_count: Some(delivery_count),
                link_credit: Some(credit),
                echo,
                ..Flow::default()
            },
        );
    }

    /// Reads one delivery's transfers and decodes the message; returns the first transfer
    /// and how many frames it took.
    pub async fn read_delivery(&mut self) -> (Transfer, Message, usize) {
        let mut payload = BytesMut::new();
        let mut first = None;
        let mut frames = 0;
        loop {
            let received = self.read().await;
            let Performative::Transfer(transfer) = received.performative else {
                panic!("expected transfer, got {:?}", received.performative)
            };
            frames += 1;
            payload.extend_from_slice(&received.payload);
            let more = transfer.more;
            first.get_or_insert(transfer);
            if !more {
                break;
            }
        }
        let message = Message::decode(payload.freeze()).unwrap();
        (first.unwrap(), message, frames)
    }

    /// Reads the disposition settling a request and the reply transfer on `reply_handle`.
    pub async fn read_reply(&mut self, reply_handle: u32) -> Message {
        let Performative::Disposition(disposition) = self.read().await.performative else {
            panic!("expected disposition")
        };
        assert!(disposition.settled);
        assert_eq!(disposition.state, Some(DeliveryState::Accepted));
        let reply = self.read().await;
        let Performative::Transfer(transfer) = reply.performative else {
            panic!("expected transfer, got {:?}", reply.performative)
        };
        assert_eq!(transfer.handle, Handle(reply_handle));
        assert_eq!(transfer.settled, Some(true));
        assert!(transfer.delivery_id.is_some() && transfer.delivery_tag.is_some());
        assert!(!transfer.more);
        Message::decode(reply.payload).unwrap()
    }

    /// Detaches `handles`, ends session 1 and closes, without waiting (as pyamqp does), then
    /// checks the server's answers and that it hung up.
    pub async fn close_all(mut self, handles: &[u32], server: Server) {
        for handle in handles {
            self.write(
                1,
                Detach {
                    handle: Handle(*handle),
                    closed: true,
                    error: None,
                },
            );
        }
        self.write(1, End::default());
        self.write(0, Close::default());
        self.flush().await;
        for handle in handles {
            let Performative::Detach(detach) = self.read().await.performative else {
                panic!("expected detach")
            };
            assert_eq!(detach.handle, Handle(*handle));
        }
        assert!(matches!(
            self.read().await.performative,
            Performative::End(_)
        ));
        assert_eq!(
            self.read().await.performative,
            Performative::Close(Close::default())
        );
        assert!(self.at_eof().await);
        server.await.unwrap().unwrap();
    }

    /// Reads the close the server sends on an error and the error `serve_connection` returns.
    pub async fn expect_close(mut self, condition: &str, server: Server) -> ConnectionError {
        loop {
            if let Performative::Close(close) = self.read().await.performative {
                let error = close.error.expect("the close carries an error");
                assert_eq!(error.condition.as_str(), condition);
                assert!(error.description.is_some());
                break;
            }
        }
        assert!(self.at_eof().await);
        server.await.unwrap().unwrap_err()
    }
}

pub fn attach(name: &str, handle: u32, role: Role, address: &str) -> Attach {
    let terminus = |a: &str| Some(a.to_owned());
    let (source, target) = match role {
        Role::Sender => (format!("sender-link-{handle}"), address.to_owned()),
        Role::Receiver => (address.to_owned(), format!("receiver-link-{handle}")),
    };
    Attach {
        name: name.into(),
        handle: Handle(handle),
        role,
        snd_settle_mode: SenderSettleMode::Unsettled,
        rcv_settle_mode: ReceiverSettleMode::First,
        source: Some(Source {
            address: terminus(&source),
            ..Source::default()
        }),
        target: Some(Target {
            address: terminus(&target),
            ..Target::default()
        }),
        unsettled: None,
        incomplete_unsettled: false,
        initial_delivery_count: (role == Role::Sender).then_some(0),
        max_message_size_bytes: Some(0),
        offered_capabilities: Vec::new(),
        desired_capabilities: Vec::new(),
        properties: None,
    }
}

pub fn request(message_id: [u8; 16], properties: &[(&str, Value)], body: Body) -> Message {
    Message {
        properties: Some(Properties {
            message_id: Some(MessageId::Uuid(message_id)),
            ..Properties::default()
        }),
        application_properties: Some(
            properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect(),
        ),
        body,
        ..Message::default()
    }
}

/// pyamqp's put-token request.
pub fn put_token(message_id: [u8; 16], token: &str) -> Message {
    request(
        message_id,
        &[
            ("operation", Value::String("put-token".into())),
            (
                "type",
                Value::String("servicebus.windows.net:sastoken".into()),
            ),
            ("name", Value::String(format!("sb://{HOST}/hub"))),
            (
                "expiration",
                Value::Timestamp(START_UNIX_MS + TOKEN_LIFETIME_MS),
            ),
        ],
        Body::Value(Value::String(token.into())),
    )
}

/// A READ request; `security_token` as pyamqp adds it, or none.
pub fn read_request(
    message_id: [u8; 16],
    entity_type: &str,
    partition: Option<&str>,
    security_token: Option<&str>,
) -> Message {
    let mut properties = vec![
        ("operation", Value::String("READ".into())),
        ("name", Value::String("hub".into())),
        ("type", Value::String(entity_type.into())),
    ];
    if let Some(partition) = partition {
        properties.push(("partition", Value::String(partition.into())));
    }
    if let Some(token) = security_token {
        properties.push(("security_token", Value::String(token.into())));
    }
    request(message_id, &properties, Body::Empty)
}

/// An application property of a reply.
pub fn app<'a>(message: &'a Message, key: &str) -> &'a Value {
    message
        .application_properties
        .iter()
        .flatten()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no application property {key}"))
}

/// The body map of a READ reply, asserting string keys.
pub fn body_map(message: &Message) -> Vec<(String, Value)> {
    let Body::Value(Value::Map(pairs)) = &message.body else {
        panic!("the body is not an amqp-value map: {:?}", message.body)
    };
    pairs
        .iter()
        .map(|(k, v)| {
            let Value::String(key) = k else {
                panic!("key {k:?} is not a string")
            };
            (key.clone(), v.clone())
        })
        .collect()
}
