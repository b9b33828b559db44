//! Send sessions: a client's sends to one node go on one long-lived stream
//! (`Producer.SendStream`) instead of a unary call each. A unary call opens and closes an
//! HTTP/2 stream per send (headers both ways, trailers, a task on the node); on a session
//! each send is one DATA frame tagged with an id, and its reply comes back tagged with the
//! same id as soon as its batch is stored, in any order.
//!
//! - A session that fails (its connection dropped, the node stopped) fails the sends
//!   waiting on it as transport errors, which the caller's routing retries like a failed
//!   call; the next send opens a new session.
//! - Each send is authorized with the token the session was opened with: when the client's
//!   token is renewed, the next send opens a new session with it (the old one ends once its
//!   sends are answered).
//! - A node of an earlier release answers UNIMPLEMENTED: the send goes as a unary `Send`,
//!   and so do that node's sends for [`SESSION_RETRY_AFTER`].

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tributary_proto::v1 as proto;
use tributary_proto::v1::producer_client::ProducerClient as ProducerStub;

use crate::ClientError;
use crate::credential::Authorizer;
use crate::routing::Channel;

/// How long a node that answered UNIMPLEMENTED (an earlier release) gets unary sends before
/// a session is tried again.
pub(crate) const SESSION_RETRY_AFTER: Duration = Duration::from_secs(60);

/// Sends queued for a session's stream at most; beyond, senders wait.
const SESSION_QUEUE_MAX: usize = 1024;

/// How a session ended, for the sends it still held.
#[derive(Debug, Clone)]
enum Ended {
    /// The node does not know sessions: send as a unary call.
    Unsupported,
    Failed(ClientError),
}

type Waiter = oneshot::Sender<Result<proto::SendStreamReply, Ended>>;

/// The send session to one node, opened on first use and reopened after it ends.
pub(crate) struct SendSession {
    endpoint: Arc<str>,
    channel: Channel,
    authorizer: Authorizer,
    state: Mutex<State>,
    next_id: AtomicU64,
}

impl std::fmt::Debug for SendSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendSession")
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

enum State {
    Closed,
    /// The open session, its stream's queue and the token it was opened with. Only the
    /// state holds the queue's sender (and sends, while they queue): once the state lets
    /// go of it, the stream ends after the sends already queued.
    Open {
        open: Arc<Open>,
        queue: mpsc::Sender<proto::SendStreamRequest>,
        token: Option<String>,
    },
    /// The node answered UNIMPLEMENTED at this time.
    Unsupported(Instant),
}

/// One open session: the sends waiting for replies.
struct Open {
    pending: Mutex<HashMap<u64, Waiter>>,
    /// The node accepted the stream: it knows sessions, and a send need not keep a copy to
    /// resend as a unary call.
    accepted: AtomicBool,
    /// Set when the session ends: a send that finds it set after queuing its waiter fails
    /// with it (failing the waiters at the end may have missed that one).
    ended: OnceLock<Ended>,
}

impl Open {
    fn fail_all(&self, ended: &Ended) {
        let _ = self.ended.set(ended.clone());
        let waiters: Vec<Waiter> = self
            .pending
            .lock()
            .expect("pending lock")
            .drain()
            .map(|(_, waiter)| waiter)
            .collect();
        for waiter in waiters {
            let _ = waiter.send(Err(ended.clone()));
        }
    }
}

/// Takes a send's waiter out of its session when the send ends, answered or not (a caller
/// that gives up on a send leaves nothing behind).
struct Forget<'a> {
    open: &'a Open,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.open
            .pending
            .lock()
            .expect("pending lock")
            .remove(&self.id);
    }
}

impl SendSession {
    /// The session to `endpoint` over `channel`, whose calls `authorizer` signs.
    pub(crate) fn new(endpoint: Arc<str>, channel: Channel, authorizer: Authorizer) -> Self {
        SendSession {
            endpoint,
            channel,
            authorizer,
            state: Mutex::new(State::Closed),
            next_id: AtomicU64::new(1),
        }
    }

    /// Sends `request` on the session (or as a unary call to a node without sessions) and
    /// waits for its reply.
    pub(crate) async fn send(
        self: &Arc<Self>,
        request: proto::SendRequest,
    ) -> Result<proto::SendResponse, ClientError> {
        let Some((open, queue)) = self.open() else {
            return self.send_unary(request).await;
        };
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, reply) = oneshot::channel();
        open.pending
            .lock()
            .expect("pending lock")
            .insert(id, waiter);
        let _forget = Forget { open: &open, id };
        // Until the node has accepted the stream it may turn out not to know sessions.
        let copy = (!open.accepted.load(Ordering::Acquire)).then(|| request.clone());
        let reply = match open.ended.get() {
            Some(ended) => Err(ended.clone()),
            None => {
                let queued = queue
                    .send(proto::SendStreamRequest {
                        id,
                        request: Some(request),
                    })
                    .await;
                drop(queue);
                match queued {
                    Ok(()) => reply
                        .await
                        .unwrap_or_else(|_| Err(Ended::Failed(self.cut_short()))),
                    Err(_) => Err(Ended::Failed(self.cut_short())),
                }
            }
        };
        match reply {
            Ok(reply) => self.decode(reply),
            Err(Ended::Failed(err)) => Err(err),
            Err(Ended::Unsupported) => match copy {
                Some(request) => self.send_unary(request).await,
                // Cannot happen (an accepted stream was not refused); retried as a failed
                // call would be.
                None => Err(self.cut_short()),
            },
        }
    }

    /// A send whose session ended before its reply: retried as a failed call would be.
    fn cut_short(&self) -> ClientError {
        ClientError::Transport {
            endpoint: self.endpoint.to_string(),
            message: "the send stream ended before the reply".into(),
        }
    }

    fn decode(&self, reply: proto::SendStreamReply) -> Result<proto::SendResponse, ClientError> {
        match reply.result {
            Some(proto::send_stream_reply::Result::Response(response)) => Ok(response),
            Some(proto::send_stream_reply::Result::Error(error)) => {
                let status = tonic::Status::with_details(
                    tonic::Code::from_i32(error.code),
                    error.message,
                    error.details,
                );
                Err(ClientError::from_status(status, &self.endpoint))
            }
            None => Err(ClientError::Service {
                code: tonic::Code::Internal,
                reason: tributary_proto::v1::ErrorReason::Unspecified,
                message: "the node sent a send stream reply without a result".into(),
                retry_after: None,
                leader_hint: None,
            }),
        }
    }

    async fn send_unary(
        &self,
        request: proto::SendRequest,
    ) -> Result<proto::SendResponse, ClientError> {
        ProducerStub::new(self.channel.clone())
            .send(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| ClientError::from_status(status, &self.endpoint))
    }

    /// The open session with the client's current token, opening one if there is none;
    /// `None` while the node is known not to take sessions.
    fn open(self: &Arc<Self>) -> Option<(Arc<Open>, mpsc::Sender<proto::SendStreamRequest>)> {
        let current = self.authorizer.token();
        let mut state = self.state.lock().expect("session state lock");
        match &*state {
            State::Open { open, queue, token } if *token == current => {
                return Some((open.clone(), queue.clone()));
            }
            State::Unsupported(since) if since.elapsed() < SESSION_RETRY_AFTER => return None,
            // A renewed token: a new session carries it; the old one ends once its sends
            // are answered.
            State::Open { .. } | State::Unsupported(_) | State::Closed => {}
        }
        let (queue, rx) = mpsc::channel(SESSION_QUEUE_MAX);
        let open = Arc::new(Open {
            pending: Mutex::new(HashMap::new()),
            accepted: AtomicBool::new(false),
            ended: OnceLock::new(),
        });
        tokio::spawn(drive(Arc::downgrade(self), open.clone(), rx));
        *state = State::Open {
            open: open.clone(),
            queue: queue.clone(),
            token: current,
        };
        Some((open, queue))
    }

    /// Replaces `open` with `next` if `open` is still the session.
    fn replace_if_current(&self, open: &Arc<Open>, next: State) {
        let mut state = self.state.lock().expect("session state lock");
        if matches!(&*state, State::Open { open: current, .. } if Arc::ptr_eq(current, open)) {
            *state = next;
        }
    }
}

/// Runs one session: streams its queue to the node and hands each reply to its send. When
/// the session ends every send still waiting fails (or, if the node does not know
/// sessions, is told to go as a unary call). Holds the session only weakly: once the
/// client is dropped, the queue's sender goes with it and the stream ends.
async fn drive(
    session: Weak<SendSession>,
    open: Arc<Open>,
    mut rx: mpsc::Receiver<proto::SendStreamRequest>,
) {
    let Some((channel, endpoint)) = session
        .upgrade()
        .map(|s| (s.channel.clone(), s.endpoint.clone()))
    else {
        return;
    };
    let outgoing = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let ended = match ProducerStub::new(channel).send_stream(outgoing).await {
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            if let Some(session) = session.upgrade() {
                session.replace_if_current(&open, State::Unsupported(Instant::now()));
            }
            Ended::Unsupported
        }
        Err(status) => Ended::Failed(ClientError::from_status(status, &endpoint)),
        Ok(replies) => {
            open.accepted.store(true, Ordering::Release);
            let mut replies = replies.into_inner();
            loop {
                match replies.next().await {
                    Some(Ok(reply)) => {
                        let waiter = open.pending.lock().expect("pending lock").remove(&reply.id);
                        if let Some(waiter) = waiter {
                            let _ = waiter.send(Ok(reply));
                        }
                    }
                    Some(Err(status)) => {
                        break Ended::Failed(ClientError::from_status(status, &endpoint));
                    }
                    None => {
                        break Ended::Failed(ClientError::Transport {
                            endpoint: endpoint.to_string(),
                            message: "the node ended the send stream".into(),
                        });
                    }
                }
            }
        }
    };
    if let Some(session) = session.upgrade() {
        session.replace_if_current(&open, State::Closed);
    }
    open.fail_all(&ended);
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU8, AtomicUsize};
    use std::time::Duration;

    use prost::Message as _;
    use tokio::net::TcpListener;
    use tokio::sync::Notify;
    use tonic::{Request, Response, Status, Streaming};
    use tributary_proto::v1::producer_server::{Producer, ProducerServer};
    use tributary_proto::v1::{ErrorDetail, ErrorReason};
    use tributary_types::ConnectionString;

    use super::*;
    use crate::credential::{TOKEN_LIFETIME_S, TOKEN_RENEW_BEFORE_S, TokenSource};
    use crate::routing::make_channel;

    /// The stand-in node's mode that refuses send streams (its default takes them).
    const UNIMPLEMENTED: u8 = 1;

    /// A stand-in node: its sessions answer each send after the number of milliseconds its
    /// `producer_sequence` gives, with the send's event hub as the partition id; a send to
    /// hub `refuse` gets a NOT_LEADER error, one to `silent` no reply. `cut` fails every
    /// open stream.
    #[derive(Clone, Default)]
    struct Node {
        mode: Arc<AtomicU8>,
        /// The token each session was opened with, in order.
        sessions: Arc<Mutex<Vec<Option<String>>>>,
        /// Told each time a session opens.
        opened: Arc<Notify>,
        unary: Arc<AtomicUsize>,
        cut: Arc<Notify>,
    }

    fn answer(request: &proto::SendRequest) -> Option<proto::send_stream_reply::Result> {
        match request.event_hub.as_str() {
            "silent" => None,
            "refuse" => Some(proto::send_stream_reply::Result::Error(proto::SendError {
                code: tonic::Code::FailedPrecondition as i32,
                message: "not the leader".into(),
                details: ErrorDetail {
                    reason: ErrorReason::NotLeader as i32,
                    message: "not the leader".into(),
                    leader_hint: "10.0.0.2:7400".into(),
                    ..Default::default()
                }
                .encode_to_vec()
                .into(),
            })),
            hub => Some(proto::send_stream_reply::Result::Response(
                proto::SendResponse {
                    partition_id: hub.to_owned(),
                    ..Default::default()
                },
            )),
        }
    }

    #[tonic::async_trait]
    impl Producer for Node {
        async fn send(
            &self,
            request: Request<proto::SendRequest>,
        ) -> Result<Response<proto::SendResponse>, Status> {
            self.unary.fetch_add(1, Ordering::SeqCst);
            match answer(request.get_ref()) {
                Some(proto::send_stream_reply::Result::Response(response)) => {
                    Ok(Response::new(response))
                }
                _ => Err(Status::failed_precondition("refused")),
            }
        }

        type SendStreamStream =
            tokio_stream::wrappers::ReceiverStream<Result<proto::SendStreamReply, Status>>;

        async fn send_stream(
            &self,
            request: Request<Streaming<proto::SendStreamRequest>>,
        ) -> Result<Response<Self::SendStreamStream>, Status> {
            if self.mode.load(Ordering::SeqCst) == UNIMPLEMENTED {
                return Err(Status::unimplemented("no send streams here"));
            }
            let token = request
                .metadata()
                .get("authorization")
                .map(|v| v.to_str().unwrap().to_owned());
            self.sessions.lock().unwrap().push(token);
            self.opened.notify_one();
            let (tx, rx) = mpsc::channel(64);
            let mut incoming = request.into_inner();
            let cut = self.cut.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        () = cut.notified() => {
                            let _ = tx.send(Err(Status::unavailable("cut"))).await;
                            return;
                        }
                        next = incoming.next() => {
                            let Some(Ok(message)) = next else { return };
                            let request = message.request.unwrap();
                            let tx = tx.clone();
                            tokio::spawn(async move {
                                let delay = u64::try_from(request.producer_sequence).unwrap();
                                tokio::time::sleep(Duration::from_millis(delay)).await;
                                if let Some(result) = answer(&request) {
                                    let reply = proto::SendStreamReply {
                                        id: message.id,
                                        result: Some(result),
                                    };
                                    let _ = tx.send(Ok(reply)).await;
                                }
                            });
                        }
                    }
                }
            });
            Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
                rx,
            )))
        }
    }

    /// Serves `node` on loopback; returns its endpoint.
    async fn serve(node: Node) -> Arc<str> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ProducerServer::new(node))
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
        );
        format!("http://{addr}").into()
    }

    fn session(endpoint: &Arc<str>, authorizer: Authorizer) -> Arc<SendSession> {
        let channel = make_channel(endpoint, &authorizer, &None).unwrap();
        Arc::new(SendSession::new(endpoint.clone(), channel, authorizer))
    }

    fn request(hub: &str, delay_ms: i64) -> proto::SendRequest {
        proto::SendRequest {
            event_hub: hub.into(),
            producer_sequence: delay_ms,
            ..Default::default()
        }
    }

    /// Concurrent sends go on one stream, and each gets its own reply whatever order the
    /// node answers them in.
    #[tokio::test]
    async fn concurrent_sends_share_one_stream_and_each_gets_its_own_reply() {
        let node = Node::default();
        let session = session(&serve(node.clone()).await, Authorizer::none());
        let sends = (0..20).map(|i| {
            let session = session.clone();
            // Later sends are answered first.
            async move {
                session
                    .send(request(&format!("hub-{i}"), 100 - 5 * i))
                    .await
            }
        });
        let replies = futures::future::join_all(sends).await;
        for (i, reply) in replies.into_iter().enumerate() {
            assert_eq!(reply.unwrap().partition_id, format!("hub-{i}"));
        }
        assert_eq!(node.sessions.lock().unwrap().len(), 1);
        assert_eq!(node.unary.load(Ordering::SeqCst), 0);
    }

    /// A refusal comes back as the error a unary call would have failed with, and the
    /// session goes on.
    #[tokio::test]
    async fn a_refused_send_fails_with_the_nodes_reason_and_the_session_goes_on() {
        let node = Node::default();
        let session = session(&serve(node.clone()).await, Authorizer::none());
        let err = session.send(request("refuse", 0)).await.unwrap_err();
        match &err {
            ClientError::Service {
                reason: ErrorReason::NotLeader,
                leader_hint: Some(hint),
                ..
            } => assert_eq!(hint, "10.0.0.2:7400"),
            other => panic!("{other:?}"),
        }
        assert!(err.is_transient());
        assert_eq!(
            session.send(request("a", 0)).await.unwrap().partition_id,
            "a"
        );
        assert_eq!(node.sessions.lock().unwrap().len(), 1);
    }

    /// A node of an earlier release answers UNIMPLEMENTED: the send that found out goes as
    /// a unary call, and so do the next ones, without asking again.
    #[tokio::test]
    async fn a_node_without_send_streams_gets_unary_sends() {
        let node = Node::default();
        node.mode.store(UNIMPLEMENTED, Ordering::SeqCst);
        let session = session(&serve(node.clone()).await, Authorizer::none());
        assert_eq!(
            session.send(request("a", 0)).await.unwrap().partition_id,
            "a"
        );
        assert_eq!(
            session.send(request("b", 0)).await.unwrap().partition_id,
            "b"
        );
        assert_eq!(node.unary.load(Ordering::SeqCst), 2);
        assert!(matches!(
            *session.state.lock().unwrap(),
            State::Unsupported(_)
        ));
    }

    /// A stream that fails fails the send waiting on it at once, as a transport error the
    /// routing retries; the next send opens a new stream.
    #[tokio::test]
    async fn a_failed_stream_fails_its_sends_and_the_next_send_opens_another() {
        let node = Node::default();
        let session = session(&serve(node.clone()).await, Authorizer::none());
        let waiting = tokio::spawn({
            let session = session.clone();
            async move { session.send(request("silent", 0)).await }
        });
        // Cut once the node holds the session.
        node.opened.notified().await;
        node.cut.notify_one();
        let err = waiting.await.unwrap().unwrap_err();
        assert!(
            matches!(err, ClientError::Transport { .. }),
            "a transport error, retried by the routing: {err:?}"
        );
        assert_eq!(
            session.send(request("a", 0)).await.unwrap().partition_id,
            "a"
        );
        assert_eq!(node.sessions.lock().unwrap().len(), 2);
    }

    /// A send given up by its caller leaves nothing waiting in the session.
    #[tokio::test]
    async fn a_send_given_up_leaves_no_waiter_behind() {
        let node = Node::default();
        let session = session(&serve(node.clone()).await, Authorizer::none());
        let gave_up = tokio::time::timeout(
            Duration::from_millis(50),
            session.send(request("silent", 0)),
        )
        .await;
        assert!(gave_up.is_err());
        let State::Open { open, .. } = &*session.state.lock().unwrap() else {
            panic!("the session is open");
        };
        assert!(open.pending.lock().unwrap().is_empty());
    }

    /// Each send is authorized with the session's token: once the client renews its token,
    /// the next send opens a session carrying the new one.
    #[tokio::test]
    async fn a_renewed_token_opens_a_new_session() {
        let node = Node::default();
        let endpoint = serve(node.clone()).await;
        let now = Arc::new(std::sync::atomic::AtomicU64::new(1_700_000_000));
        let clock = {
            let now = now.clone();
            Arc::new(move || now.load(Ordering::SeqCst))
        };
        let connection_string = ConnectionString::parse(
            "Endpoint=sb://tributary.test/;SharedAccessKeyName=send;SharedAccessKey=secret",
        )
        .unwrap();
        let authorizer = Authorizer::new(TokenSource::new(connection_string, clock));
        let session = session(&endpoint, authorizer);
        session.send(request("a", 0)).await.unwrap();
        session.send(request("a", 0)).await.unwrap();
        now.fetch_add(
            TOKEN_LIFETIME_S - TOKEN_RENEW_BEFORE_S + 1,
            Ordering::SeqCst,
        );
        session.send(request("a", 0)).await.unwrap();
        let sessions = node.sessions.lock().unwrap().clone();
        assert_eq!(sessions.len(), 2, "{sessions:?}");
        assert!(sessions.iter().all(Option::is_some));
        assert_ne!(
            sessions[0], sessions[1],
            "the second carries the renewed token"
        );
    }
}
