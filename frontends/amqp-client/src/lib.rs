//! A small AMQP 1.0 client in the Event Hubs dialect, over any async byte stream, written
//! with the crate's codec: the other end of [`crate::serve_connection`], for tests, the
//! benchmark and tools.
//!
//! - [`Connection::open`] (or [`connect`] over TCP): SASL ANONYMOUS or PLAIN, open, one
//!   session.
//! - [`Connection::put_token`] on `$cbs` and [`Connection::management_read`] on
//!   `$management`: a request and its reply, matched by correlation id.
//! - [`Connection::open_sender`]: a [`Sender`] to `hub` or `hub/Partitions/N`. Deliveries are
//!   pipelined: [`Sender::submit`] hands one over and returns its [`PendingOutcome`] at once;
//!   transfers go out as the server grants link credit.
//! - [`Connection::open_receiver`]: a [`Receiver`] on
//!   `hub/ConsumerGroups/G/Partitions/N` with a selector filter, epoch and receiver name; it
//!   grants credit as the application takes events.
//!
//! # Invariants
//! - One task owns the connection (socket, session, links); handles talk to it through a
//!   bounded mailbox and never share its state. It writes while it reads, so neither side's
//!   full buffers can deadlock the pair.
//! - Everything waiting is bounded: deliveries in flight per sender
//!   ([`SenderOptions::in_flight_max`]), events buffered per receiver (its credit), requests
//!   in flight ([`ConnectionOptions::requests_in_flight_max`]), bytes queued for the socket,
//!   incoming messages ([`ConnectionOptions::max_message_size_bytes`]).
//! - Nothing the server sends panics the task: bad input ends the connection (or the link)
//!   with a [`ClientError`] every waiting operation receives.

mod driver;
mod error;
mod handshake;
mod links;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{Semaphore, mpsc, oneshot};
use tributary_types::{Offset, SequenceNumber};

pub use error::ClientError;

use driver::{Command, LinkId, LinkSpec, OutgoingDelivery, RequestNode};
use tributary_amqp::Attach;
use tributary_amqp::DeliveryState;
use tributary_amqp::Open;
use tributary_amqp::server::{
    ENQUEUED_TIME_ANNOTATION, OFFSET_ANNOTATION, PARTITION_KEY_ANNOTATION,
    SEQUENCE_NUMBER_ANNOTATION, StartPosition,
};
use tributary_amqp::{BATCH_MESSAGE_FORMAT, Body, Message, build_batch};
use tributary_amqp::{Value, map_get};

/// How the client authenticates in SASL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sasl {
    /// No SASL layer: the AMQP header at once.
    None,
    /// ANONYMOUS (what pyamqp sends): authorization comes later through `$cbs`.
    Anonymous,
    /// PLAIN with a shared-access rule name and its key: Tributary grants the rule's rights on
    /// the whole namespace, so no `$cbs` token is needed.
    Plain { user: String, password: String },
}

/// A connection's settings and bounds, each with its unit in its name.
#[derive(Debug, Clone)]
pub struct ConnectionOptions {
    pub container_id: String,
    /// Sent in sasl-init and open: the namespace host the server authorizes audiences on.
    pub hostname: Option<String>,
    pub sasl: Sasl,
    /// The largest frame we accept, announced in open.
    pub max_frame_size_bytes: u32,
    pub channel_max: u16,
    /// Announced in open: the server heartbeats at least this often, and a server silent for
    /// twice this long ends the connection. `None`: no limit.
    pub idle_timeout_ms: Option<u32>,
    /// The bound on SASL, open and begin.
    pub handshake_timeout_ms: u64,
    /// The bound on waiting for an attach, a detach, a close or a `$cbs`/`$management` reply.
    pub request_timeout_ms: u64,
    /// The session's incoming window, in transfer frames.
    pub session_window_frames: u32,
    /// Links the session may hold (announced as handle-max + 1).
    pub links_max: u32,
    /// Commands queued for the connection task (sends, flows, attaches).
    pub commands_queue_max: usize,
    /// `$cbs` and `$management` requests awaiting their reply.
    pub requests_in_flight_max: usize,
    /// The largest incoming message reassembled; a larger one detaches its link.
    pub max_message_size_bytes: u64,
}

impl Default for ConnectionOptions {
    fn default() -> ConnectionOptions {
        ConnectionOptions {
            container_id: "tributary-amqp-client".into(),
            hostname: None,
            sasl: Sasl::Anonymous,
            max_frame_size_bytes: 1_048_576,
            channel_max: 255,
            idle_timeout_ms: Some(60_000),
            handshake_timeout_ms: 30_000,
            request_timeout_ms: 60_000,
            session_window_frames: 5_000,
            links_max: 256,
            commands_queue_max: 1_024,
            requests_in_flight_max: 64,
            max_message_size_bytes: 4 * 1_048_576,
        }
    }
}

/// A sender link's bounds.
#[derive(Debug, Clone)]
pub struct SenderOptions {
    /// Deliveries handed over and not yet settled by the server; [`Sender::submit`] waits
    /// for room beyond it.
    pub in_flight_max: usize,
}

impl Default for SenderOptions {
    fn default() -> SenderOptions {
        SenderOptions {
            in_flight_max: 1_000,
        }
    }
}

/// What a receiver link asks of the server.
#[derive(Debug, Clone)]
pub struct ReceiverOptions {
    /// The selector filter's expression, such as `amqp.annotation.x-opt-offset > '-1'`
    /// ([`selector`] writes one). `None`: no filter (the server starts at the latest event).
    pub filter: Option<String>,
    /// `com.microsoft:epoch`: the owner level.
    pub epoch: Option<i64>,
    /// `com.microsoft:receiver-name`.
    pub receiver_name: Option<String>,
    /// Events the server may send ahead of the application: the link credit, and the
    /// receiver's buffer.
    pub credit: u32,
}

impl Default for ReceiverOptions {
    fn default() -> ReceiverOptions {
        ReceiverOptions {
            filter: None,
            epoch: None,
            receiver_name: None,
            credit: 300,
        }
    }
}

/// A `$cbs` or `$management` reply: its status and the whole message, body untouched.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestReply {
    /// The `status-code` application property (200 OK, 202 Accepted, 401, 404, ...).
    pub status_code: i64,
    pub status_description: Option<String>,
    pub message: Message,
}

impl RequestReply {
    pub fn is_success(&self) -> bool {
        (200..300).contains(&self.status_code)
    }

    /// The amqp-value body (a READ's map), as sent.
    pub fn body_value(&self) -> Option<&Value> {
        match &self.message.body {
            Body::Value(value) => Some(value),
            _ => None,
        }
    }

    /// An application property of the reply, as sent.
    pub fn application_property(&self, key: &str) -> Option<&Value> {
        self.message
            .application_properties
            .iter()
            .flatten()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }
}

/// An event a receiver got, with accessors for the Event Hubs annotations.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    pub message: Message,
    pub message_format: u32,
}

impl ReceivedEvent {
    /// A message annotation, as sent.
    pub fn annotation(&self, key: &str) -> Option<&Value> {
        map_get(self.message.message_annotations.as_deref()?, key)
    }

    /// `x-opt-sequence-number`, when it is a long.
    pub fn sequence_number(&self) -> Option<SequenceNumber> {
        match self.annotation(SEQUENCE_NUMBER_ANNOTATION)? {
            Value::Long(n) => Some(SequenceNumber(*n)),
            _ => None,
        }
    }

    /// `x-opt-offset`, when it is a decimal string.
    pub fn offset(&self) -> Option<Offset> {
        match self.annotation(OFFSET_ANNOTATION)? {
            Value::String(text) => text.parse().ok().map(Offset),
            _ => None,
        }
    }

    /// `x-opt-enqueued-time`, when it is a timestamp.
    pub fn enqueued_time_unix_ms(&self) -> Option<i64> {
        match self.annotation(ENQUEUED_TIME_ANNOTATION)? {
            Value::Timestamp(ms) => Some(*ms),
            _ => None,
        }
    }

    /// `x-opt-partition-key`, when set.
    pub fn partition_key(&self) -> Option<&str> {
        self.annotation(PARTITION_KEY_ANNOTATION)?.as_str()
    }

    pub fn body(&self) -> &Body {
        &self.message.body
    }
}

/// One delivery to send: an event, or an Event Hubs batch of events.
#[derive(Debug, Clone, PartialEq)]
pub struct Delivery {
    pub message_format: u32,
    /// The encoded message.
    pub payload: Bytes,
}

impl Delivery {
    /// A single event (message-format 0).
    pub fn event(message: &Message) -> Delivery {
        Delivery {
            message_format: 0,
            payload: message.to_bytes(),
        }
    }

    /// An Event Hubs batch (message-format 0x80013700): one data section per event. With a
    /// key, `x-opt-partition-key` is set on the envelope and on every event, as the Python
    /// SDK does.
    pub fn batch(events: &[Message], partition_key: Option<&str>) -> Delivery {
        let keyed: Vec<Message>;
        let (envelope, events) = match partition_key {
            Some(key) => {
                keyed = events
                    .iter()
                    .map(|e| with_partition_key(e.clone(), key))
                    .collect();
                (with_partition_key(Message::default(), key), &keyed[..])
            }
            None => (Message::default(), events),
        };
        Delivery {
            message_format: BATCH_MESSAGE_FORMAT,
            payload: build_batch(envelope, events).to_bytes(),
        }
    }
}

/// `message` with `x-opt-partition-key` set to `key` (first among its annotations).
pub fn with_partition_key(mut message: Message, key: &str) -> Message {
    let mut annotations = vec![(
        Value::symbol(PARTITION_KEY_ANNOTATION),
        Value::String(key.to_owned()),
    )];
    annotations.extend(
        message
            .message_annotations
            .take()
            .unwrap_or_default()
            .into_iter()
            .filter(|(k, _)| k.as_str() != Some(PARTITION_KEY_ANNOTATION)),
    );
    message.message_annotations = Some(annotations);
    message
}

/// The selector expression of a start position, quoted as the Python SDK writes it.
pub fn selector(position: &StartPosition) -> String {
    let (field, operator, value) = match *position {
        StartPosition::Earliest => ("offset", ">", "-1".to_owned()),
        StartPosition::Latest => ("offset", ">", "@latest".to_owned()),
        StartPosition::Offset { offset, inclusive } => {
            ("offset", operator(inclusive), offset.0.to_string())
        }
        StartPosition::SequenceNumber {
            sequence_number,
            inclusive,
        } => (
            "sequence-number",
            operator(inclusive),
            sequence_number.0.to_string(),
        ),
        StartPosition::EnqueuedTime { unix_ms, inclusive } => {
            ("enqueued-time", operator(inclusive), unix_ms.to_string())
        }
    };
    format!("amqp.annotation.x-opt-{field} {operator} '{value}'")
}

fn operator(inclusive: bool) -> &'static str {
    if inclusive { ">=" } else { ">" }
}

/// Connects over TCP (no Nagle delay) and opens the connection.
pub async fn connect(addr: &str, options: ConnectionOptions) -> Result<Connection, ClientError> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|error| ClientError::Connect {
            addr: addr.to_owned(),
            error: Arc::new(error),
        })?;
    stream.set_nodelay(true)?;
    Connection::open(stream, options).await
}

/// An open connection with its one session. Dropping it (and every sender and receiver)
/// closes the connection; [`Connection::close`] also waits for the server's close.
pub struct Connection {
    shared: Shared,
    peer_open: Open,
    requests: Arc<Semaphore>,
    driver: tokio::task::JoinHandle<()>,
}

/// What every handle holds: the mailbox and why the connection ended.
#[derive(Clone)]
struct Shared {
    commands: mpsc::Sender<Command>,
    ended: Arc<OnceLock<ClientError>>,
    request_timeout: Duration,
}

impl Shared {
    /// Why the connection ended (once the task has stopped).
    fn ended_error(&self) -> ClientError {
        self.ended.get().cloned().unwrap_or(ClientError::Closed)
    }

    async fn command(&self, command: Command) -> Result<(), ClientError> {
        self.commands
            .send(command)
            .await
            .map_err(|_| self.ended_error())
    }

    /// Waits for the task's answer to a command, within the request timeout.
    async fn answer<T>(
        &self,
        what: &'static str,
        answer: oneshot::Receiver<Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        match tokio::time::timeout(self.request_timeout, answer).await {
            Err(_) => Err(ClientError::Timeout {
                what,
                timeout_ms: self.request_timeout.as_millis() as u64,
            }),
            Ok(Err(_)) => Err(self.ended_error()),
            Ok(Ok(result)) => result,
        }
    }
}

impl Connection {
    /// Runs the handshake on `io` and starts the connection's task.
    pub async fn open<S>(mut io: S, options: ConnectionOptions) -> Result<Connection, ClientError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let timeout_ms = options.handshake_timeout_ms;
        let opened = tokio::time::timeout(
            Duration::from_millis(timeout_ms),
            handshake::handshake(&mut io, &options),
        )
        .await
        .map_err(|_| ClientError::Timeout {
            what: "the SASL, open and begin handshake",
            timeout_ms,
        })??;
        let (commands, mailbox) = mpsc::channel(options.commands_queue_max.max(1));
        let ended = Arc::new(OnceLock::new());
        let peer_open = opened.open.clone();
        let driver = driver::Driver::new(io, opened, mailbox, ended.clone(), &options);
        Ok(Connection {
            shared: Shared {
                commands,
                ended,
                request_timeout: Duration::from_millis(options.request_timeout_ms),
            },
            peer_open,
            requests: Arc::new(Semaphore::new(options.requests_in_flight_max.max(1))),
            driver: tokio::spawn(driver.run()),
        })
    }

    /// The server's open: its container id, max-frame-size, idle-time-out.
    pub fn peer_open(&self) -> &Open {
        &self.peer_open
    }

    /// Puts a token on `$cbs` for `audience` (such as `sb://host/hub`); `token_type` is
    /// `servicebus.windows.net:sastoken` or `jwt`.
    pub async fn put_token(
        &self,
        audience: &str,
        token_type: &str,
        token: &str,
    ) -> Result<RequestReply, ClientError> {
        let message = request_message(
            &[
                ("operation", "put-token"),
                ("type", token_type),
                ("name", audience),
            ],
            Body::Value(Value::String(token.to_owned())),
        );
        self.request(RequestNode::Cbs, message).await
    }

    /// A `$management` READ: `kind` is `com.microsoft:eventhub` or
    /// `com.microsoft:partition` (with `partition`).
    pub async fn management_read(
        &self,
        kind: &str,
        hub: &str,
        partition: Option<&str>,
    ) -> Result<RequestReply, ClientError> {
        let mut properties = vec![("operation", "READ"), ("type", kind), ("name", hub)];
        if let Some(partition) = partition {
            properties.push(("partition", partition));
        }
        let message = request_message(&properties, Body::Empty);
        self.request(RequestNode::Management, message).await
    }

    async fn request(
        &self,
        node: RequestNode,
        message: Message,
    ) -> Result<RequestReply, ClientError> {
        let what = node.address();
        // The semaphore is never closed.
        let permit = self
            .requests
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ClientError::Closed)?;
        let (reply, answer) = oneshot::channel();
        self.shared
            .command(Command::Request {
                node,
                message: Box::new(message),
                reply,
                permit,
            })
            .await?;
        let message = self.shared.answer(what, answer).await?;
        let status_code = match message
            .application_properties
            .iter()
            .flatten()
            .find(|(k, _)| k == "status-code")
            .map(|(_, v)| v)
        {
            Some(value) => value
                .as_i64()
                .or_else(|| value.as_u64().and_then(|v| i64::try_from(v).ok()))
                .ok_or_else(|| ClientError::InvalidReply {
                    what,
                    problem: format!("status-code is a {}, not an int", value.kind().name()),
                })?,
            None => {
                return Err(ClientError::InvalidReply {
                    what,
                    problem: "it has no status-code application property".into(),
                });
            }
        };
        let status_description = message
            .application_properties
            .iter()
            .flatten()
            .find(|(k, _)| k == "status-description")
            .and_then(|(_, v)| v.as_str())
            .map(str::to_owned);
        Ok(RequestReply {
            status_code,
            status_description,
            message,
        })
    }

    /// Attaches a sender link to `address` (`hub` or `hub/Partitions/N`).
    pub async fn open_sender(
        &self,
        address: &str,
        options: SenderOptions,
    ) -> Result<Sender, ClientError> {
        let (reply, answer) = oneshot::channel();
        let spec = LinkSpec::Sender {
            address: address.to_owned(),
        };
        self.shared.command(Command::Attach { spec, reply }).await?;
        let attached = self.shared.answer("attaching a sender", answer).await?;
        Ok(Sender {
            link: LinkHandle::new(self.shared.clone(), attached.link, attached.ended),
            in_flight: Arc::new(Semaphore::new(options.in_flight_max.max(1))),
            max_message_size_bytes: attached
                .peer_attach
                .max_message_size_bytes
                .filter(|max| *max > 0),
            peer_attach: attached.peer_attach,
        })
    }

    /// Attaches a receiver link to `address` (`hub/ConsumerGroups/G/Partitions/N`) and
    /// grants its credit.
    pub async fn open_receiver(
        &self,
        address: &str,
        options: ReceiverOptions,
    ) -> Result<Receiver, ClientError> {
        let credit = options.credit.max(1);
        // One slot beyond the credit: the server can never fill it, so the task never waits.
        let (events, inbox) = mpsc::channel(credit as usize + 1);
        let (reply, answer) = oneshot::channel();
        let spec = LinkSpec::Receiver {
            address: address.to_owned(),
            options: ReceiverOptions { credit, ..options },
            events,
        };
        self.shared.command(Command::Attach { spec, reply }).await?;
        let attached = self.shared.answer("attaching a receiver", answer).await?;
        Ok(Receiver {
            link: LinkHandle::new(self.shared.clone(), attached.link, attached.ended),
            inbox,
            credit,
            consumed: 0,
            peer_attach: attached.peer_attach,
        })
    }

    /// Closes the connection and waits for the server's close.
    pub async fn close(self) -> Result<(), ClientError> {
        let (reply, answer) = oneshot::channel();
        let closed = match self.shared.command(Command::Close { reply }).await {
            Ok(()) => self.shared.answer("closing the connection", answer).await,
            // The task has already stopped: report why, unless it was a close.
            Err(_) => match self.shared.ended_error() {
                ClientError::Closed => Ok(()),
                error => Err(error),
            },
        };
        // The task ends by itself once the close is answered or its deadline passes.
        if let Err(error) = self.driver.await
            && error.is_panic()
        {
            std::panic::resume_unwind(error.into_panic());
        }
        closed
    }
}

fn request_message(properties: &[(&str, &str)], body: Body) -> Message {
    Message {
        application_properties: Some(
            properties
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Value::String((*v).to_owned())))
                .collect(),
        ),
        body,
        ..Message::default()
    }
}

/// A link's identity and why it ended; detaches the link when dropped.
struct LinkHandle {
    shared: Shared,
    id: LinkId,
    ended: Arc<OnceLock<ClientError>>,
    closed: bool,
}

impl LinkHandle {
    fn new(shared: Shared, id: LinkId, ended: Arc<OnceLock<ClientError>>) -> LinkHandle {
        LinkHandle {
            shared,
            id,
            ended,
            closed: false,
        }
    }

    /// Why the link (or, failing that, the connection) ended.
    fn ended_error(&self) -> ClientError {
        match self.ended.get() {
            Some(error) => error.clone(),
            None => self.shared.ended_error(),
        }
    }

    fn check(&self) -> Result<(), ClientError> {
        match self.ended.get() {
            Some(error) => Err(error.clone()),
            None => Ok(()),
        }
    }

    async fn close(mut self) -> Result<(), ClientError> {
        self.closed = true;
        let (reply, answer) = oneshot::channel();
        let detach = Command::Detach {
            link: self.id,
            reply: Some(reply),
        };
        self.shared.command(detach).await?;
        self.shared.answer("detaching a link", answer).await
    }
}

impl Drop for LinkHandle {
    fn drop(&mut self) {
        if !self.closed {
            // Best effort: a full mailbox leaves the link to the connection's end.
            let _ = self.shared.commands.try_send(Command::Detach {
                link: self.id,
                reply: None,
            });
        }
    }
}

/// A sender link. [`Sender::submit`] pipelines deliveries; [`Sender::send`] waits for each.
pub struct Sender {
    link: LinkHandle,
    in_flight: Arc<Semaphore>,
    max_message_size_bytes: Option<u64>,
    peer_attach: Attach,
}

impl Sender {
    /// The server's attach (its max-message-size, properties).
    pub fn peer_attach(&self) -> &Attach {
        &self.peer_attach
    }

    /// Sends one delivery and waits for its outcome (accepted, or rejected with the
    /// server's error).
    pub async fn send(&self, delivery: Delivery) -> Result<DeliveryState, ClientError> {
        self.submit(delivery).await?.await
    }

    /// Hands a delivery to the connection, waiting only while [`SenderOptions::in_flight_max`]
    /// deliveries are unsettled; the returned future resolves with its outcome. Deliveries
    /// of one sender are transferred in the order they were submitted.
    pub async fn submit(&self, delivery: Delivery) -> Result<PendingOutcome, ClientError> {
        self.link.check()?;
        let size_bytes = delivery.payload.len() as u64;
        if let Some(max_bytes) = self.max_message_size_bytes
            && size_bytes > max_bytes
        {
            return Err(ClientError::MessageTooLarge {
                size_bytes,
                max_bytes,
            });
        }
        let permit = self
            .in_flight
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| ClientError::Closed)?;
        let (outcome, answer) = oneshot::channel();
        let command = Command::Transfer(OutgoingDelivery {
            link: self.link.id,
            delivery,
            outcome,
            permit,
        });
        if self.link.shared.commands.send(command).await.is_err() {
            return Err(self.link.ended_error());
        }
        Ok(PendingOutcome {
            answer,
            link_ended: self.link.ended.clone(),
            connection_ended: self.link.shared.ended.clone(),
        })
    }

    /// Detaches the link and waits for the server's detach.
    pub async fn close(self) -> Result<(), ClientError> {
        self.link.close().await
    }
}

/// The outcome of a submitted delivery, to come.
pub struct PendingOutcome {
    answer: oneshot::Receiver<Result<DeliveryState, ClientError>>,
    link_ended: Arc<OnceLock<ClientError>>,
    connection_ended: Arc<OnceLock<ClientError>>,
}

impl Future for PendingOutcome {
    type Output = Result<DeliveryState, ClientError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.answer).poll(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(result)) => Poll::Ready(result),
            Poll::Ready(Err(_)) => {
                let error = self
                    .link_ended
                    .get()
                    .or_else(|| self.connection_ended.get())
                    .cloned()
                    .unwrap_or(ClientError::LinkClosed);
                Poll::Ready(Err(error))
            }
        }
    }
}

/// A receiver link: events in order, and the detach that ends it.
pub struct Receiver {
    link: LinkHandle,
    inbox: mpsc::Receiver<Result<ReceivedEvent, ClientError>>,
    credit: u32,
    /// Events taken since credit was last given back.
    consumed: u32,
    peer_attach: Attach,
}

impl Receiver {
    /// The server's attach (its source echoes the filter).
    pub fn peer_attach(&self) -> &Attach {
        &self.peer_attach
    }

    /// The next event. Once the link ends, every call returns why: the server's detach
    /// ([`ClientError::LinkDetached`] with its condition, such as `amqp:link:stolen`) or the
    /// connection's end. Cancel-safe: an event is taken only when the call returns it.
    pub async fn recv(&mut self) -> Result<ReceivedEvent, ClientError> {
        // Credit goes back in halves, for events the application has taken. A send
        // cancelled here is not sent, and the credit goes with the next call.
        if self.consumed >= self.credit.div_ceil(2) {
            let command = Command::Credit {
                link: self.link.id,
                credit: self.consumed,
            };
            if self.link.shared.command(command).await.is_ok() {
                self.consumed = 0;
            }
        }
        let Some(event) = self.inbox.recv().await else {
            return Err(self.link.ended_error());
        };
        self.consumed += 1;
        event
    }

    /// Detaches the link and waits for the server's detach.
    pub async fn close(self) -> Result<(), ClientError> {
        self.link.close().await
    }
}
