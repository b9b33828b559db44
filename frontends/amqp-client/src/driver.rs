//! The connection's task: the frame loop, its timers, the connection and session frames, and
//! the commands handles send. Links are in `links.rs`.
//!
//! The loop reads, writes and takes commands at once: a write that cannot finish never keeps
//! frames from being read. Commands are taken only while fewer than
//! [`OUTPUT_HIGH_WATER_BYTES`] wait for the socket, which is how a slow socket pushes back on
//! senders.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{OwnedSemaphorePermit, mpsc, oneshot};
use tokio::time::{Instant, sleep_until};

use super::error::ClientError;
use super::handshake::{Opened, SESSION_CHANNEL};
use super::links::Links;
use super::{ConnectionOptions, Delivery, ReceivedEvent, ReceiverOptions};
use tributary_amqp::Message;
use tributary_amqp::{AmqpError, DeliveryState, condition};
use tributary_amqp::{Attach, Flow};
use tributary_amqp::{Channel, TransferNumber};
use tributary_amqp::{Close, End};
use tributary_amqp::{
    FrameType, HEARTBEAT, MIN_MAX_FRAME_SIZE_BYTES, read_frame, write_performative,
};
use tributary_amqp::{Performative, decode_frame_body};

/// Bytes waiting for the socket beyond which no more commands are taken.
pub(crate) const OUTPUT_HIGH_WATER_BYTES: usize = 1_048_576;
/// The shortest heartbeat interval, whatever idle-time-out the server announces.
const HEARTBEAT_INTERVAL_MIN: Duration = Duration::from_millis(100);

/// A link's number on this connection, never reused (handles are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct LinkId(pub(crate) u64);

/// The request-reply nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RequestNode {
    Cbs,
    Management,
}

impl RequestNode {
    pub(crate) fn address(self) -> &'static str {
        match self {
            RequestNode::Cbs => "$cbs",
            RequestNode::Management => "$management",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// What handles ask of the task.
pub(crate) enum Command {
    Attach {
        spec: LinkSpec,
        reply: oneshot::Sender<Result<Attached, ClientError>>,
    },
    Transfer(OutgoingDelivery),
    Request {
        node: RequestNode,
        /// Boxed: a message is several times larger than the other commands.
        message: Box<Message>,
        reply: oneshot::Sender<Result<Message, ClientError>>,
        permit: OwnedSemaphorePermit,
    },
    /// A receiver made room for `credit` more events.
    Credit {
        link: LinkId,
        credit: u32,
    },
    Detach {
        link: LinkId,
        reply: Option<oneshot::Sender<Result<(), ClientError>>>,
    },
    Close {
        reply: oneshot::Sender<Result<(), ClientError>>,
    },
}

pub(crate) enum LinkSpec {
    Sender {
        address: String,
    },
    Receiver {
        address: String,
        options: ReceiverOptions,
        events: mpsc::Sender<Result<ReceivedEvent, ClientError>>,
    },
}

/// A link the server attached.
pub(crate) struct Attached {
    pub(crate) link: LinkId,
    pub(crate) ended: Arc<OnceLock<ClientError>>,
    pub(crate) peer_attach: Attach,
}

/// A delivery handed to the task; the permit counts it against its sender's bound until the
/// outcome is known.
pub(crate) struct OutgoingDelivery {
    pub(crate) link: LinkId,
    pub(crate) delivery: Delivery,
    pub(crate) outcome: oneshot::Sender<Result<DeliveryState, ClientError>>,
    pub(crate) permit: OwnedSemaphorePermit,
}

/// The session's flow state (part 2 §2.5.6).
pub(crate) struct Session {
    pub(crate) next_outgoing_id: u32,
    /// Transfer frames the server can still take.
    pub(crate) remote_incoming_window: u32,
    pub(crate) next_incoming_id: u32,
    /// Transfer frames we can still take before we widen the window.
    pub(crate) incoming_window: u32,
    pub(crate) window_frames: u32,
    pub(crate) next_delivery_id: u32,
}

impl Session {
    /// The session flow announcing our window.
    pub(crate) fn flow(&self) -> Flow {
        Flow {
            next_incoming_id: Some(TransferNumber(self.next_incoming_id)),
            incoming_window: self.incoming_window,
            next_outgoing_id: TransferNumber(self.next_outgoing_id),
            outgoing_window: self.window_frames,
            ..Flow::default()
        }
    }

    fn update_remote_window(&mut self, next_incoming_id: Option<TransferNumber>, window: u32) {
        let next_incoming_id = next_incoming_id.map_or(0, |n| n.0);
        self.remote_incoming_window = next_incoming_id
            .wrapping_add(window)
            .wrapping_sub(self.next_outgoing_id)
            .min(window);
    }
}

/// Frames waiting for the socket.
#[derive(Default)]
pub(crate) struct Output {
    bytes: Vec<u8>,
    written: usize,
}

impl Output {
    pub(crate) fn push(&mut self, performative: Performative, payload: &[u8]) {
        write_performative(&mut self.bytes, SESSION_CHANNEL, &performative, payload);
    }

    pub(crate) fn pending_bytes(&self) -> usize {
        self.bytes.len() - self.written
    }

    fn advance(&mut self, written: usize) {
        self.written += written;
        if self.written == self.bytes.len() {
            self.bytes.clear();
            self.written = 0;
        }
    }
}

/// How the loop ends.
enum Closing {
    Open,
    /// We sent close: the server's close is awaited until the deadline.
    Sent {
        reply: Option<oneshot::Sender<Result<(), ClientError>>>,
        deadline: Instant,
    },
}

pub(crate) struct Driver<S> {
    reader: ReadHalf<S>,
    writer: WriteHalf<S>,
    input: BytesMut,
    pub(crate) out: Output,
    commands: mpsc::Receiver<Command>,
    ended: Arc<OnceLock<ClientError>>,
    max_frame_size_bytes: u32,
    heartbeat_interval: Option<Duration>,
    idle_limit: Option<Duration>,
    request_timeout: Duration,
    last_sent: Instant,
    last_received: Instant,
    closing: Closing,
    pub(crate) session: Session,
    pub(crate) links: Links,
}

impl<S: AsyncRead + AsyncWrite + Send + 'static> Driver<S> {
    pub(crate) fn new(
        io: S,
        opened: Opened,
        commands: mpsc::Receiver<Command>,
        ended: Arc<OnceLock<ClientError>>,
        options: &ConnectionOptions,
    ) -> Driver<S> {
        let (reader, writer) = tokio::io::split(io);
        let peer_max_frame_size_bytes = opened
            .open
            .max_frame_size_bytes
            .max(MIN_MAX_FRAME_SIZE_BYTES);
        let heartbeat_interval = opened
            .open
            .idle_timeout_ms
            .filter(|ms| *ms > 0)
            .map(|ms| (Duration::from_millis(ms.into()) / 2).max(HEARTBEAT_INTERVAL_MIN));
        let links_max = (opened.begin.handle_max as usize)
            .saturating_add(1)
            .min(options.links_max as usize);
        let session = Session {
            next_outgoing_id: 0,
            remote_incoming_window: opened.begin.incoming_window,
            next_incoming_id: opened.begin.next_outgoing_id.0,
            incoming_window: options.session_window_frames,
            window_frames: options.session_window_frames,
            next_delivery_id: 0,
        };
        let now = Instant::now();
        Driver {
            reader,
            writer,
            input: opened.input,
            out: Output::default(),
            commands,
            ended,
            max_frame_size_bytes: options.max_frame_size_bytes,
            heartbeat_interval,
            idle_limit: options
                .idle_timeout_ms
                .filter(|ms| *ms > 0)
                .map(|ms| Duration::from_millis(ms.into()) * 2),
            request_timeout: Duration::from_millis(options.request_timeout_ms),
            last_sent: now,
            last_received: now,
            closing: Closing::Open,
            session,
            links: Links::new(
                options.container_id.clone(),
                links_max,
                peer_max_frame_size_bytes,
                options.max_message_size_bytes,
            ),
        }
    }

    /// Serves the connection until it closes or fails; every waiting handle then learns why
    /// through `ended`.
    pub(crate) async fn run(mut self) {
        let outcome = self.serve().await;
        let reply = match std::mem::replace(&mut self.closing, Closing::Open) {
            Closing::Sent { reply, .. } => reply,
            Closing::Open => None,
        };
        let error = match outcome {
            Ok(()) => ClientError::Closed,
            Err(error) => {
                tracing::debug!(%error, "AMQP client connection failed");
                error
            }
        };
        let _ = self.ended.set(error.clone());
        if let Some(reply) = reply {
            let _ = reply.send(match error {
                ClientError::Closed => Ok(()),
                error => Err(error),
            });
        }
        // Dropping the links drops every waiter, which then reads `ended`.
        self.links.clear();
        self.commands.close();
        let flush = async {
            self.writer
                .write_all(&self.out.bytes[self.out.written..])
                .await?;
            self.writer.shutdown().await
        };
        let _ = tokio::time::timeout(self.request_timeout, flush).await;
    }

    async fn serve(&mut self) -> Result<(), ClientError> {
        loop {
            while let Some(frame) = read_frame(&mut self.input, self.max_frame_size_bytes)
                .map_err(ClientError::Framing)?
            {
                if frame.frame_type != FrameType::Amqp {
                    return Err(self.fail_protocol("a SASL frame after the handshake"));
                }
                if frame.is_heartbeat() {
                    continue;
                }
                let (performative, payload) =
                    decode_frame_body(frame.body).map_err(|error| self.fail_decode(error))?;
                if self.handle(frame.channel, performative, payload)? {
                    return Ok(());
                }
            }
            self.links.pump(&mut self.session, &mut self.out);
            let taking_commands = matches!(self.closing, Closing::Open)
                && self.out.pending_bytes() < OUTPUT_HIGH_WATER_BYTES;
            let writing = self.out.pending_bytes() > 0;
            let far = Instant::now() + Duration::from_secs(3600);
            let heartbeat_at = self.heartbeat_interval.map(|i| self.last_sent + i);
            let idle_at = self.idle_limit.map(|limit| self.last_received + limit);
            let close_deadline = match &self.closing {
                Closing::Sent { deadline, .. } => Some(*deadline),
                Closing::Open => None,
            };
            tokio::select! {
                read = self.reader.read_buf(&mut self.input) => {
                    if read? == 0 {
                        return match self.closing {
                            Closing::Sent { .. } => Ok(()),
                            Closing::Open => Err(std::io::Error::new(
                                std::io::ErrorKind::UnexpectedEof,
                                "the server hung up without closing the connection",
                            )
                            .into()),
                        };
                    }
                    self.last_received = Instant::now();
                }
                written = self.writer.write(&self.out.bytes[self.out.written..]), if writing => {
                    self.out.advance(written?);
                    if self.out.pending_bytes() == 0 {
                        self.writer.flush().await?;
                    }
                    self.last_sent = Instant::now();
                }
                command = self.commands.recv(), if taking_commands => match command {
                    Some(command) => self.command(command),
                    // Every handle is gone.
                    None => self.send_close(None, None),
                },
                () = sleep_until(heartbeat_at.unwrap_or(far)), if heartbeat_at.is_some() && !writing => {
                    self.out.bytes.extend_from_slice(&HEARTBEAT);
                }
                () = sleep_until(idle_at.unwrap_or(far)), if idle_at.is_some() => {
                    let silent_ms = self.idle_limit.map_or(0, |l| l.as_millis() as u64);
                    let error = AmqpError::new(
                        condition::RESOURCE_LIMIT_EXCEEDED,
                        format!("nothing received for {silent_ms} ms"),
                    );
                    self.send_close(Some(error), None);
                    return Err(ClientError::Idle { silent_ms });
                }
                () = sleep_until(close_deadline.unwrap_or(far)), if close_deadline.is_some() => {
                    return Err(ClientError::Timeout {
                        what: "closing the connection",
                        timeout_ms: self.request_timeout.as_millis() as u64,
                    });
                }
            }
        }
    }

    /// Handles one frame; `true` once the connection is closed.
    fn handle(
        &mut self,
        channel: Channel,
        performative: Performative,
        payload: bytes::Bytes,
    ) -> Result<bool, ClientError> {
        if let Performative::Close(close) = performative {
            return match &self.closing {
                Closing::Sent { .. } => Ok(true),
                Closing::Open => {
                    self.out.push(Close::default().into(), &[]);
                    Err(ClientError::ConnectionClosed(close.error))
                }
            };
        }
        if matches!(self.closing, Closing::Sent { .. }) {
            // Everything but the server's close is moot once ours is out.
            return Ok(false);
        }
        if channel != SESSION_CHANNEL {
            return Err(self.fail_protocol(&format!(
                "{} on channel {}, where no session was begun",
                performative.name(),
                channel.0
            )));
        }
        match performative {
            Performative::End(end) => {
                self.out.push(End::default().into(), &[]);
                self.send_close(None, None);
                Err(ClientError::SessionEnded(end.error))
            }
            Performative::Attach(attach) => {
                self.links.attached(*attach, &mut self.out);
                Ok(false)
            }
            Performative::Detach(detach) => {
                self.links.detached(detach, &mut self.out);
                Ok(false)
            }
            Performative::Flow(flow) => {
                self.session
                    .update_remote_window(flow.next_incoming_id, flow.incoming_window);
                self.links.flow(flow, &self.session, &mut self.out);
                Ok(false)
            }
            Performative::Transfer(transfer) => {
                self.session.next_incoming_id = self.session.next_incoming_id.wrapping_add(1);
                self.session.incoming_window = self.session.incoming_window.saturating_sub(1);
                if self.session.incoming_window < self.session.window_frames / 2 {
                    self.session.incoming_window = self.session.window_frames;
                    self.out.push(self.session.flow().into(), &[]);
                }
                self.links
                    .transfer(transfer, payload, &self.session, &mut self.out)
                    .map_err(|error| self.fail_protocol(&error))?;
                Ok(false)
            }
            Performative::Disposition(disposition) => {
                self.links.disposition(disposition, &mut self.out);
                Ok(false)
            }
            other => Err(self.fail_protocol(&format!("{} after the session began", other.name()))),
        }
    }

    fn command(&mut self, command: Command) {
        match command {
            Command::Attach { spec, reply } => {
                self.links.attach(spec, reply, &self.session, &mut self.out);
            }
            Command::Transfer(delivery) => self.links.queue(delivery),
            Command::Request {
                node,
                message,
                reply,
                permit,
            } => self
                .links
                .request(node, message, reply, permit, &self.session, &mut self.out),
            Command::Credit { link, credit } => {
                self.links
                    .add_credit(link, credit, &self.session, &mut self.out);
            }
            Command::Detach { link, reply } => self.links.detach(link, reply, &mut self.out),
            Command::Close { reply } => self.send_close(None, Some(reply)),
        }
    }

    /// Queues our close; the loop then waits for the server's.
    fn send_close(
        &mut self,
        error: Option<AmqpError>,
        reply: Option<oneshot::Sender<Result<(), ClientError>>>,
    ) {
        if let Closing::Sent { .. } = self.closing {
            if let Some(reply) = reply {
                let _ = reply.send(Ok(()));
            }
            return;
        }
        self.out.push(Close { error }.into(), &[]);
        self.closing = Closing::Sent {
            reply,
            deadline: Instant::now() + self.request_timeout,
        };
    }

    /// A protocol violation: the close carries it, and the loop ends with it.
    fn fail_protocol(&mut self, problem: &str) -> ClientError {
        let error = AmqpError::new(condition::FRAMING_ERROR, problem.to_owned());
        self.out.push(Close { error: Some(error) }.into(), &[]);
        ClientError::Protocol(problem.to_owned())
    }

    fn fail_decode(&mut self, error: tributary_amqp::CodecError) -> ClientError {
        let close = AmqpError::new(condition::DECODE_ERROR, error.to_string());
        self.out.push(Close { error: Some(close) }.into(), &[]);
        ClientError::Decode(error)
    }
}
