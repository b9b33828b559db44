//! Peer sessions: one long-lived bidirectional stream (`RaftPeer.Session`) per peer node
//! carries replication. A unary call per AppendEntries opened and closed an HTTP/2 stream
//! per message (headers with HPACK both ways, trailers, a task on the receiver), which
//! was most of the nodes' transport CPU under waiting producers. On a session each message
//! is one DATA frame tagged with a call id, its reply comes back tagged with the same id as
//! soon as it is handled (in any order), and messages queued together leave in one write.
//!
//! A session that fails (its connection dropped, the peer restarted) fails the calls it
//! holds, and the next call opens a new one. One that answers nothing while a call times
//! out is taken for dead and closed (a connection cut without a reset). A peer of an
//! earlier release answers UNIMPLEMENTED: its calls go as unary `Call`s, and the session is
//! tried again after [`SESSION_RETRY_AFTER`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tributary_proto::peer::raft_peer_client::RaftPeerClient;
use tributary_proto::peer::{GroupMessage, GroupReply, SessionMessage};

use crate::network::PEER_MESSAGE_BYTES_MAX;

/// How long a peer that answered UNIMPLEMENTED (a node of an earlier release, during a
/// rolling upgrade) is sent unary calls instead before a session is tried again.
pub(crate) const SESSION_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Messages queued for a session's stream at most; beyond, callers wait (backpressure).
const SESSION_QUEUE_MAX: usize = 4096;

/// Why a call on a session got no reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SessionError {
    /// The peer does not know sessions (an earlier release): send the message as a `Call`.
    Unsupported,
    /// The session failed or the reply did not come in time.
    Failed(String),
}

type Waiter = oneshot::Sender<Result<GroupReply, SessionError>>;

/// The session to one peer node, opened on first use. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Session {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("target", &self.inner.target)
            .finish()
    }
}

struct Inner {
    channel: Channel,
    target: u64,
    state: Mutex<State>,
    next_id: AtomicU64,
}

enum State {
    Closed,
    /// The open session and its stream's queue. Only the state holds the queue's sender
    /// (and calls, while they send): once the session is dropped the stream ends.
    Open(Arc<Open>, mpsc::Sender<SessionMessage>),
    /// The peer answered UNIMPLEMENTED at this time.
    Unsupported(Instant),
}

/// One open session: the calls waiting for replies.
struct Open {
    pending: Mutex<HashMap<u64, Waiter>>,
    /// Replies received so far: a call that times out while this stood still closes the
    /// session.
    replies: AtomicU64,
    /// Set when the session ends: a call that finds it set after queuing its waiter fails
    /// with it (the calls failed at the end may have missed that waiter).
    ended: OnceLock<SessionError>,
    /// The task running the stream (set once it is spawned).
    driver: OnceLock<tokio::task::AbortHandle>,
}

impl Open {
    /// Fails every call waiting on this session, and every call that comes to it later.
    fn fail_all(&self, error: &SessionError) {
        let _ = self.ended.set(error.clone());
        let waiters: Vec<Waiter> = self
            .pending
            .lock()
            .expect("pending lock")
            .drain()
            .map(|(_, waiter)| waiter)
            .collect();
        for waiter in waiters {
            let _ = waiter.send(Err(error.clone()));
        }
    }
}

impl Session {
    /// The session to node `target` over `channel` (opened on the first call).
    pub(crate) fn new(channel: Channel, target: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                channel,
                target,
                state: Mutex::new(State::Closed),
                next_id: AtomicU64::new(1),
            }),
        }
    }

    /// Sends `message` on the session and waits up to `timeout` for its reply.
    pub(crate) async fn call(
        &self,
        message: GroupMessage,
        timeout: Duration,
    ) -> Result<GroupReply, SessionError> {
        let (open, tx) = self.open()?;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, reply) = oneshot::channel();
        open.pending
            .lock()
            .expect("pending lock")
            .insert(id, waiter);
        if let Some(error) = open.ended.get() {
            open.pending.lock().expect("pending lock").remove(&id);
            return Err(error.clone());
        }
        let replies_before = open.replies.load(Ordering::Relaxed);
        let sent_and_answered = async {
            tx.send(SessionMessage {
                id,
                message: Some(message),
            })
            .await
            .map_err(|_| SessionError::Failed(self.describe("session closed")))?;
            reply
                .await
                .map_err(|_| SessionError::Failed(self.describe("session closed")))?
        };
        match tokio::time::timeout(timeout, sent_and_answered).await {
            Ok(result) => result,
            Err(_) => {
                open.pending.lock().expect("pending lock").remove(&id);
                if open.replies.load(Ordering::Relaxed) == replies_before {
                    // Nothing came back on this session while the call waited: the
                    // connection may be gone without a reset. The next call opens anew.
                    self.close(&open, "it answered nothing while a call waited");
                }
                Err(SessionError::Failed(
                    self.describe(&format!("no reply within {timeout:?}")),
                ))
            }
        }
    }

    fn describe(&self, what: &str) -> String {
        format!("{}: {what}", crate::describe_member(self.inner.target))
    }

    /// The open session, opening one if there is none; `Unsupported` while the peer is
    /// known not to take sessions.
    fn open(&self) -> Result<(Arc<Open>, mpsc::Sender<SessionMessage>), SessionError> {
        let mut state = self.inner.state.lock().expect("session state lock");
        match &*state {
            State::Open(open, tx) => return Ok((open.clone(), tx.clone())),
            State::Unsupported(since) if since.elapsed() < SESSION_RETRY_AFTER => {
                return Err(SessionError::Unsupported);
            }
            State::Unsupported(_) | State::Closed => {}
        }
        let (tx, rx) = mpsc::channel(SESSION_QUEUE_MAX);
        let open = Arc::new(Open {
            pending: Mutex::new(HashMap::new()),
            replies: AtomicU64::new(0),
            ended: OnceLock::new(),
            driver: OnceLock::new(),
        });
        let driver = tokio::spawn(drive(
            Arc::downgrade(&self.inner),
            self.inner.channel.clone(),
            self.inner.target,
            open.clone(),
            rx,
        ));
        let _ = open.driver.set(driver.abort_handle());
        metrics::counter!("tributary_peer_sessions_opened_total").increment(1);
        *state = State::Open(open.clone(), tx.clone());
        Ok((open, tx))
    }

    /// Closes `open` if it is still this peer's session, failing the calls it holds.
    fn close(&self, open: &Arc<Open>, why: &str) {
        replace_if_current(&self.inner, open, State::Closed);
        if let Some(driver) = open.driver.get() {
            driver.abort();
        }
        open.fail_all(&SessionError::Failed(
            self.describe(&format!("session closed: {why}")),
        ));
    }
}

/// Replaces `open` with `next` if `open` is still the session of `inner`.
fn replace_if_current(inner: &Inner, open: &Arc<Open>, next: State) {
    let mut state = inner.state.lock().expect("session state lock");
    if matches!(&*state, State::Open(current, _) if Arc::ptr_eq(current, open)) {
        *state = next;
    }
}

/// Runs one session: streams its queue to the peer and hands each reply to its call.
/// When the session ends, every call still waiting fails (or, if the peer does not know
/// sessions, is told to go as a `Call`). Holds the session only weakly: once the session
/// is dropped, its queue's sender goes with it and the stream ends.
async fn drive(
    inner: Weak<Inner>,
    channel: Channel,
    target: u64,
    open: Arc<Open>,
    mut rx: mpsc::Receiver<SessionMessage>,
) {
    let describe = |what: &str| format!("{}: {what}", crate::describe_member(target));
    let mut client = RaftPeerClient::new(channel)
        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
    let outgoing = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let error = match client.session(outgoing).await {
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::info!(
                target = %crate::describe_member(target),
                "peer does not know sessions (an earlier release): replication goes as \
                 unary calls"
            );
            if let Some(inner) = inner.upgrade() {
                replace_if_current(&inner, &open, State::Unsupported(Instant::now()));
            }
            SessionError::Unsupported
        }
        Err(status) => SessionError::Failed(describe(status.message())),
        Ok(replies) => {
            let mut replies = replies.into_inner();
            let why = loop {
                match replies.next().await {
                    Some(Ok(reply)) => {
                        open.replies.fetch_add(1, Ordering::Relaxed);
                        let waiter = open.pending.lock().expect("pending lock").remove(&reply.id);
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(Ok(reply.reply.unwrap_or_default()));
                        }
                    }
                    Some(Err(status)) => break status.message().to_string(),
                    None => break "the peer ended the session".to_string(),
                }
            };
            SessionError::Failed(describe(&why))
        }
    };
    if let Some(inner) = inner.upgrade() {
        replace_if_current(&inner, &open, State::Closed);
    }
    open.fail_all(&error);
}

/// A stand-in peer for tests: a `RaftPeer` server on loopback whose sessions echo each
/// message's payload (after the number of milliseconds its first byte gives), stay silent,
/// or are unknown to it, as a test sets; and a proxy in front of it whose connections a
/// test can cut.
#[cfg(test)]
pub(crate) mod stub {
    use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use futures::StreamExt;
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::Notify;
    use tonic::{Request, Response, Status, Streaming};
    use tributary_proto::peer::raft_peer_server::{RaftPeer, RaftPeerServer};
    use tributary_proto::peer::{
        GroupBatch, GroupBatchReply, GroupMessage, GroupReply, IndexedReply, SessionMessage,
        SessionReply, group_reply,
    };

    pub(crate) const ECHO: u8 = 0;
    pub(crate) const SILENT: u8 = 1;
    pub(crate) const UNIMPLEMENTED: u8 = 2;

    #[derive(Clone, Default)]
    pub(crate) struct Peer {
        /// How sessions answer: [`ECHO`], [`SILENT`] or [`UNIMPLEMENTED`].
        pub(crate) mode: Arc<AtomicU8>,
        pub(crate) sessions: Arc<AtomicUsize>,
        pub(crate) session_messages: Arc<AtomicUsize>,
        pub(crate) calls: Arc<AtomicUsize>,
        pub(crate) received: Arc<Notify>,
    }

    fn echo(message: &GroupMessage) -> GroupReply {
        GroupReply {
            result: Some(group_reply::Result::Payload(message.payload.clone())),
        }
    }

    #[tonic::async_trait]
    impl RaftPeer for Peer {
        async fn call(
            &self,
            request: Request<GroupMessage>,
        ) -> Result<Response<GroupReply>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            Ok(Response::new(echo(request.get_ref())))
        }

        async fn batch(&self, _: Request<GroupBatch>) -> Result<Response<GroupBatchReply>, Status> {
            Err(Status::unimplemented("not in this stub"))
        }

        type BatchStreamStream = futures::stream::BoxStream<'static, Result<IndexedReply, Status>>;

        async fn batch_stream(
            &self,
            _: Request<GroupBatch>,
        ) -> Result<Response<Self::BatchStreamStream>, Status> {
            Err(Status::unimplemented("not in this stub"))
        }

        type SessionStream = futures::stream::BoxStream<'static, Result<SessionReply, Status>>;

        async fn session(
            &self,
            request: Request<Streaming<SessionMessage>>,
        ) -> Result<Response<Self::SessionStream>, Status> {
            self.sessions.fetch_add(1, Ordering::SeqCst);
            let mode = self.mode.load(Ordering::SeqCst);
            if mode == UNIMPLEMENTED {
                return Err(Status::unimplemented("an earlier release"));
            }
            let peer = self.clone();
            let replies = request
                .into_inner()
                .map(move |message| {
                    let peer = peer.clone();
                    async move {
                        let SessionMessage { id, message } = message?;
                        let message = message.unwrap_or_default();
                        peer.session_messages.fetch_add(1, Ordering::SeqCst);
                        peer.received.notify_waiters();
                        if mode == SILENT {
                            std::future::pending::<()>().await;
                        }
                        let delay = message.payload.first().copied().unwrap_or(0);
                        tokio::time::sleep(Duration::from_millis(u64::from(delay))).await;
                        Ok(SessionReply {
                            id,
                            reply: Some(echo(&message)),
                        })
                    }
                })
                .buffer_unordered(64);
            Ok(Response::new(replies.boxed()))
        }
    }

    /// Serves `peer` on a loopback port behind a proxy; returns the proxy's address and a
    /// handle that cuts every connection through it.
    pub(crate) async fn serve(peer: Peer) -> (String, Cutter) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let server_addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(RaftPeerServer::new(peer))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        let proxy = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy_addr = proxy.local_addr().unwrap();
        let cutter = Cutter::default();
        let connections = cutter.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = proxy.accept().await {
                let mut outbound = TcpStream::connect(server_addr).await.unwrap();
                let task = tokio::spawn(async move {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
                connections.0.lock().unwrap().push(task.abort_handle());
            }
        });
        (proxy_addr.to_string(), cutter)
    }

    /// Cuts the connections through a stub's proxy.
    #[derive(Clone, Default)]
    pub(crate) struct Cutter(Arc<Mutex<Vec<tokio::task::AbortHandle>>>);

    impl Cutter {
        pub(crate) fn cut(&self) {
            for connection in self.0.lock().unwrap().drain(..) {
                connection.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use bytes::Bytes;
    use tributary_proto::peer::{GroupMessage, GroupReply, group_reply};

    use super::stub::{self, Peer};
    use super::{Session, SessionError};
    use crate::network::peer_endpoint;

    fn message(payload: &[u8]) -> GroupMessage {
        GroupMessage {
            payload: Bytes::copy_from_slice(payload),
            ..GroupMessage::default()
        }
    }

    fn payload(reply: GroupReply) -> Vec<u8> {
        match reply.result {
            Some(group_reply::Result::Payload(bytes)) => bytes.to_vec(),
            other => panic!("not a payload: {other:?}"),
        }
    }

    async fn session_to(peer: Peer) -> (Session, stub::Cutter) {
        let (addr, cutter) = stub::serve(peer).await;
        let channel = peer_endpoint("http", &addr).unwrap().connect_lazy();
        (Session::new(channel, 2), cutter)
    }

    /// Calls on one session each get their own reply, whatever order the peer answers in,
    /// and share one stream.
    #[tokio::test]
    async fn each_call_gets_its_own_reply_in_any_order() {
        let peer = Peer::default();
        let (session, _cutter) = session_to(peer.clone()).await;
        let timeout = Duration::from_secs(30);
        // The first byte is the peer's delay in milliseconds: the later calls answer first.
        let calls = [200u8, 100, 0, 50].map(|delay| {
            let session = session.clone();
            tokio::spawn(async move { session.call(message(&[delay, 7]), timeout).await })
        });
        for (call, delay) in calls.into_iter().zip([200u8, 100, 0, 50]) {
            let reply = call.await.unwrap().expect("a reply");
            assert_eq!(payload(reply), vec![delay, 7]);
        }
        assert_eq!(peer.sessions.load(Ordering::SeqCst), 1);
        assert_eq!(peer.session_messages.load(Ordering::SeqCst), 4);
    }

    /// A session whose connection is cut fails the calls waiting on it at once (not at
    /// their timeout), and the next call opens a new session that works.
    #[tokio::test]
    async fn a_cut_connection_fails_waiting_calls_and_the_next_call_reopens() {
        let peer = Peer::default();
        peer.mode.store(stub::SILENT, Ordering::SeqCst);
        let (session, cutter) = session_to(peer.clone()).await;
        let timeout = Duration::from_secs(600);
        let received = peer.received.notified();
        let waiting = {
            let session = session.clone();
            tokio::spawn(async move { session.call(message(&[0]), timeout).await })
        };
        received.await;
        let cut_at = Instant::now();
        cutter.cut();
        let failed = waiting.await.unwrap();
        assert!(matches!(failed, Err(SessionError::Failed(_))), "{failed:?}");
        assert!(
            cut_at.elapsed() < timeout / 2,
            "the call waited for its timeout"
        );
        peer.mode.store(stub::ECHO, Ordering::SeqCst);
        let reply = session.call(message(&[0, 9]), timeout).await.unwrap();
        assert_eq!(payload(reply), vec![0, 9]);
        assert_eq!(peer.sessions.load(Ordering::SeqCst), 2);
    }

    /// A session that answers nothing while a call times out is closed (the connection
    /// may be gone without a reset): the next call opens a new one.
    #[tokio::test]
    async fn a_session_silent_through_a_timeout_is_replaced() {
        let peer = Peer::default();
        peer.mode.store(stub::SILENT, Ordering::SeqCst);
        let (session, _cutter) = session_to(peer.clone()).await;
        let failed = session
            .call(message(&[0]), Duration::from_millis(300))
            .await;
        assert!(
            matches!(&failed, Err(SessionError::Failed(e)) if e.contains("no reply")),
            "{failed:?}"
        );
        peer.mode.store(stub::ECHO, Ordering::SeqCst);
        let reply = session
            .call(message(&[0, 3]), Duration::from_secs(30))
            .await
            .unwrap();
        assert_eq!(payload(reply), vec![0, 3]);
        assert_eq!(peer.sessions.load(Ordering::SeqCst), 2);
    }

    /// A peer that does not know sessions (an earlier release) is not asked again for a
    /// while: its calls are told to go as unary calls, the first one included.
    #[tokio::test]
    async fn a_peer_without_sessions_is_asked_once() {
        let peer = Peer::default();
        peer.mode.store(stub::UNIMPLEMENTED, Ordering::SeqCst);
        let (session, _cutter) = session_to(peer.clone()).await;
        for _ in 0..3 {
            let result = session.call(message(&[0]), Duration::from_secs(30)).await;
            assert_eq!(result.unwrap_err(), SessionError::Unsupported);
        }
        assert_eq!(peer.sessions.load(Ordering::SeqCst), 1);
    }
}
