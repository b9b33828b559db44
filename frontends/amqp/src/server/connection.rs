//! One open connection: the frame loop, its timers, and the connection and session
//! performatives (open, begin, end, close). Links are in `links.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::{Instant, sleep_until};

use super::backend::Backend;
use super::error::ConnectionError;
use super::grants::Grants;
use super::handshake::Admission;
use super::hub_links::{OpeningReads, PendingSends, poll_readers};
use super::limits::ConnectionLimits;
use super::metrics;
use super::session::Session;
use super::transport::{Filled, Transport};
use crate::connection::{Begin, Close, End, Open};
use crate::delivery_state::{AmqpError, condition};
use crate::frame::{Frame, FrameType, HEARTBEAT, MIN_MAX_FRAME_SIZE_BYTES, write_performative};
use crate::ids::{Channel, TransferNumber};
use crate::performative::{Performative, decode_frame_body};

/// Conditions the codec does not name because only the server sends them.
pub(crate) const ILLEGAL_STATE: &str = "amqp:illegal-state";
pub(crate) const UNATTACHED_HANDLE: &str = "amqp:session:unattached-handle";
pub(crate) const HANDLE_IN_USE: &str = "amqp:session:handle-in-use";

/// The shortest heartbeat interval, whatever idle-time-out a client asks for.
const HEARTBEAT_INTERVAL_MIN: Duration = Duration::from_millis(100);

pub(crate) struct Connection {
    pub(crate) backend: Arc<dyn Backend>,
    pub(crate) limits: ConnectionLimits,
    /// The namespace host the client named, for `security_token` audiences.
    pub(crate) hostname: String,
    /// The largest frame the client takes.
    pub(crate) peer_max_frame_size_bytes: u32,
    heartbeat_interval: Option<Duration>,
    pub(crate) sessions: HashMap<Channel, Session>,
    /// Channels whose session the client ended: pyamqp still sends detaches on them
    /// afterwards (its CBS links, just before close), which are ignored rather than taken
    /// for a protocol violation. At most one per channel, so bounded by channel-max.
    ended: HashSet<Channel>,
    pub(crate) grants: Grants,
    /// Bytes of partial incoming deliveries and queued replies, bounded by
    /// `limits.buffered_bytes_max`.
    pub(crate) buffered_bytes: usize,
    /// Frames to send, moved to the transport after each frame handled.
    pub(crate) out: Vec<u8>,
    /// The id of the next link attached.
    pub(crate) next_link_id: u64,
    /// Sends awaiting the backend, bounded by `limits.pending_sends_max`.
    pub(crate) sends: PendingSends,
    /// Readers the backend is opening (one per receiver link at most).
    pub(crate) opening: OpeningReads,
    /// A publish link was left without credit because the connection's bounds held it
    /// down: its client cannot send, so only room freed elsewhere on the connection can
    /// give it credit again, and every freed room retries such links.
    pub(crate) publish_credit_starved: bool,
}

/// Whether the connection goes on after a frame.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Step {
    Continue,
    Closed,
}

impl Connection {
    /// Reads the client's open (possibly already buffered) and queues ours.
    pub(crate) async fn open<S: AsyncRead + AsyncWrite + Unpin>(
        transport: &mut Transport<S>,
        backend: Arc<dyn Backend>,
        limits: ConnectionLimits,
        admission: Admission,
    ) -> Result<Connection, ConnectionError> {
        let frame = transport.read_frame().await?;
        let open = match decode_amqp(frame)? {
            Some((_, Performative::Open(open), _)) => open,
            Some((_, other, _)) => {
                return Err(ConnectionError::protocol(
                    ILLEGAL_STATE,
                    format!("expected open, the client sent {}", other.name()),
                ));
            }
            None => {
                return Err(ConnectionError::protocol(
                    ILLEGAL_STATE,
                    "expected open, the client sent a heartbeat",
                ));
            }
        };
        let peer_max_frame_size_bytes = open.max_frame_size_bytes.max(MIN_MAX_FRAME_SIZE_BYTES);
        let max_frame_size_bytes = limits.max_frame_size_bytes.min(peer_max_frame_size_bytes);
        transport.read_frame_max_bytes = max_frame_size_bytes;
        let reply = Open {
            container_id: limits.container_id(),
            max_frame_size_bytes,
            channel_max: limits.channel_max,
            idle_timeout_ms: Some(limits.idle_timeout_ms),
            properties: Some(Vec::new()),
            ..Open::default()
        };
        transport.push(Channel(0), &reply.into(), &[]);
        let heartbeat_interval = open
            .idle_timeout_ms
            .filter(|ms| *ms > 0)
            .map(|ms| (Duration::from_millis(ms.into()) * 2 / 5).max(HEARTBEAT_INTERVAL_MIN));
        let hostname = open
            .hostname
            .or(admission.hostname)
            .unwrap_or_else(|| "localhost".to_owned());
        tracing::debug!(
            container_id = %open.container_id,
            %hostname,
            max_frame_size_bytes,
            client_idle_timeout_ms = ?open.idle_timeout_ms,
            "AMQP connection open"
        );
        let mut grants = Grants::default();
        if let Some(grant) = admission.plain_grant {
            let now = backend.now_unix_ms();
            // The table is empty, so a namespace-wide grant always fits.
            let _ = grants.insert(String::new(), grant, now, limits.grants_max);
        }
        Ok(Connection {
            backend,
            limits,
            hostname,
            peer_max_frame_size_bytes,
            heartbeat_interval,
            sessions: HashMap::new(),
            ended: HashSet::new(),
            grants,
            buffered_bytes: 0,
            out: Vec::new(),
            next_link_id: 0,
            sends: PendingSends::new(),
            opening: OpeningReads::new(),
            publish_credit_starved: false,
        })
    }

    /// Serves frames until the client closes or something fails. Besides the client's
    /// frames and the timers, the loop waits on the backend's answers to sends, on readers
    /// being opened and on open readers' events, so none of them holds up the others.
    pub(crate) async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        transport: &mut Transport<S>,
    ) -> Result<(), ConnectionError> {
        let idle_limit = self.limits.idle_timeout() * 2;
        let queue_max = self.limits.link_queue_max;
        loop {
            while let Some(frame) = transport.take_frame()? {
                let step = self.handle_frame(frame).await;
                transport.push_bytes(&self.out);
                self.out.clear();
                if step? == Step::Closed {
                    return Ok(());
                }
            }
            transport.flush().await?;
            let idle_deadline = transport.last_received + idle_limit;
            let heartbeat_at = self.heartbeat_interval.map(|i| transport.last_sent + i);
            let expiry_at = self.next_link_expiry();
            let buffers_full = self.buffered_bytes >= self.limits.buffered_bytes_max;
            let sessions = &mut self.sessions;
            let readers = std::future::poll_fn(|cx| poll_readers(sessions, queue_max, cx));
            tokio::select! {
                filled = transport.fill() => {
                    if filled? == Filled::Eof {
                        if transport.buffered_bytes() > 0 {
                            return Err(transport.eof_error());
                        }
                        tracing::debug!("the AMQP client went away without close");
                        return Ok(());
                    }
                }
                () = sleep_until(idle_deadline) => {
                    let silent_ms = idle_limit.as_millis() as u64;
                    tracing::info!(silent_ms, "closing a silent AMQP connection");
                    return Err(ConnectionError::Idle { silent_ms });
                }
                () = sleep_until(heartbeat_at.unwrap_or(idle_deadline)), if heartbeat_at.is_some() => {
                    transport.push_bytes(&HEARTBEAT);
                }
                () = sleep_until(expiry_at.unwrap_or(idle_deadline)), if expiry_at.is_some() => {
                    self.expire_links();
                }
                Some(done) = self.sends.next(), if !self.sends.is_empty() => {
                    self.send_done(done);
                }
                Some(opened) = self.opening.next(), if !self.opening.is_empty() => {
                    self.read_opened(opened);
                }
                ready = readers, if !buffers_full => {
                    for ready in ready {
                        self.read_ready(ready);
                    }
                }
            }
            transport.push_bytes(&self.out);
            self.out.clear();
        }
    }

    async fn handle_frame(&mut self, frame: Frame) -> Result<Step, ConnectionError> {
        let Some((channel, performative, payload)) = decode_amqp(frame)? else {
            return Ok(Step::Continue);
        };
        if self.ended.contains(&channel)
            && matches!(
                performative,
                Performative::Attach(_)
                    | Performative::Detach(_)
                    | Performative::Flow(_)
                    | Performative::Transfer(_)
                    | Performative::Disposition(_)
                    | Performative::End(_)
            )
        {
            tracing::debug!(
                channel = channel.0,
                frame = performative.name(),
                "ignoring a frame on a session the client ended"
            );
            return Ok(Step::Continue);
        }
        match performative {
            Performative::Begin(begin) => self.begin(channel, begin)?,
            Performative::End(end) => self.end(channel, end),
            Performative::Close(close) => {
                if let Some(error) = close.error {
                    tracing::info!(condition = %error.condition, description = ?error.description, "the AMQP client closed with an error");
                }
                self.send(Channel(0), Close::default().into(), &[]);
                return Ok(Step::Closed);
            }
            Performative::Attach(attach) => self.attach(channel, *attach)?,
            Performative::Detach(detach) => self.detach(channel, detach)?,
            Performative::Flow(flow) => self.flow(channel, flow)?,
            Performative::Transfer(transfer) => self.transfer(channel, transfer, payload).await?,
            // We send everything settled and settle what we receive on arrival.
            Performative::Disposition(_) => {}
            Performative::Open(_) => {
                return Err(ConnectionError::protocol(
                    ILLEGAL_STATE,
                    "the client sent a second open",
                ));
            }
            other => {
                return Err(ConnectionError::protocol(
                    condition::FRAMING_ERROR,
                    format!("{} is a SASL frame, and SASL is over", other.name()),
                ));
            }
        }
        Ok(Step::Continue)
    }

    fn begin(&mut self, channel: Channel, begin: Begin) -> Result<(), ConnectionError> {
        if channel.0 > self.limits.channel_max {
            return Err(ConnectionError::protocol(
                condition::FRAMING_ERROR,
                format!(
                    "begin on channel {} above our channel-max {}",
                    channel.0, self.limits.channel_max
                ),
            ));
        }
        if self.sessions.contains_key(&channel) {
            return Err(ConnectionError::protocol(
                ILLEGAL_STATE,
                format!("begin on channel {}, which has a session", channel.0),
            ));
        }
        self.ended.remove(&channel);
        let window = self.limits.session_window_frames;
        let mut session = Session::new(window);
        session.next_incoming_id = begin.next_outgoing_id.0;
        session.update_remote_window(Some(0), begin.incoming_window);
        let reply = Begin {
            remote_channel: Some(channel),
            next_outgoing_id: TransferNumber(0),
            incoming_window: window,
            outgoing_window: window,
            handle_max: self.limits.handle_max(),
            properties: Some(Vec::new()),
            ..Begin::default()
        };
        self.send(channel, reply.into(), &[]);
        let active = self.sessions.values().filter(|s| !s.ending).count();
        if active >= self.limits.sessions_per_connection_max {
            let error = AmqpError::new(
                condition::RESOURCE_LIMIT_EXCEEDED,
                format!(
                    "a connection holds at most {} sessions",
                    self.limits.sessions_per_connection_max
                ),
            );
            self.send_end(channel, Some(error));
            session.ending = true;
        }
        self.sessions.insert(channel, session);
        Ok(())
    }

    fn end(&mut self, channel: Channel, end: End) {
        let Some(session) = self.sessions.remove(&channel) else {
            tracing::debug!(channel = channel.0, "end for a session that is gone");
            return;
        };
        if let Some(error) = end.error {
            tracing::info!(condition = %error.condition, description = ?error.description, "the AMQP client ended a session with an error");
        }
        for link in session.links.values() {
            self.forget_link(link);
        }
        self.ended.insert(channel);
        if !session.ending {
            self.send_end(channel, None);
        }
    }

    pub(crate) fn send_end(&mut self, channel: Channel, error: Option<AmqpError>) {
        if let Some(error) = &error {
            metrics::error_sent(error.condition.as_str());
        }
        self.send(channel, End { error }.into(), &[]);
    }

    /// Queues one frame.
    pub(crate) fn send(&mut self, channel: Channel, performative: Performative, payload: &[u8]) {
        write_performative(&mut self.out, channel, &performative, payload);
    }

    /// The session on `channel`, or the protocol error for a frame on a channel without one.
    pub(crate) fn session_mut(
        &mut self,
        channel: Channel,
        what: &str,
    ) -> Result<&mut Session, ConnectionError> {
        self.sessions.get_mut(&channel).ok_or_else(|| {
            ConnectionError::protocol(
                ILLEGAL_STATE,
                format!("{what} on channel {}, which has no session", channel.0),
            )
        })
    }
}

/// Decodes an AMQP frame; `None` for a heartbeat. A SASL frame here is a framing error.
fn decode_amqp(
    frame: Frame,
) -> Result<Option<(Channel, Performative, bytes::Bytes)>, ConnectionError> {
    if frame.frame_type != FrameType::Amqp {
        return Err(ConnectionError::protocol(
            condition::FRAMING_ERROR,
            "a SASL frame after the SASL exchange",
        ));
    }
    if frame.is_heartbeat() {
        return Ok(None);
    }
    let channel = frame.channel;
    let (performative, payload) = decode_frame_body(frame.body).map_err(ConnectionError::Decode)?;
    Ok(Some((channel, performative, payload)))
}

/// The open we send before a close when the client's open never came or was bad.
pub(crate) fn fallback_open(limits: &ConnectionLimits) -> Open {
    Open {
        container_id: limits.container_id(),
        max_frame_size_bytes: limits.max_frame_size_bytes,
        channel_max: limits.channel_max,
        idle_timeout_ms: Some(limits.idle_timeout_ms),
        properties: Some(Vec::new()),
        ..Open::default()
    }
}

/// The deadline of a unix-ms instant, on tokio's clock.
pub(crate) fn instant_at(now_unix_ms: i64, at_unix_ms: i64) -> Instant {
    let wait_ms = at_unix_ms.saturating_sub(now_unix_ms).max(0) as u64;
    Instant::now() + Duration::from_millis(wait_ms)
}
