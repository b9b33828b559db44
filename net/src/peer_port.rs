//! Who may open a connection to the peer port, and how this node opens its own.
//!
//! A peer connection is admitted in up to two steps, each in a task per connection with a
//! time limit (as the client port's TLS handshakes, see [`crate::tls`]): the mutual TLS
//! handshake when `--peer-ca` is set, then the cluster-key handshake when
//! `--cluster-key-file` is set ([`tributary_raft::peer_key`]). Only then does the gRPC
//! server see the connection, so no peer RPC (Raft, Hello, Propose, Watch, NodeStatus)
//! reaches an unauthenticated caller. A plain gRPC client on a keyed port is answered with
//! UNAUTHENTICATED saying what it lacks.
//!
//! Refusals are counted in `tributary_peer_refused_total{reason}` and logged at most once
//! per source address per minute, so a scanner or a misconfigured node cannot flood the
//! log.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::Uri;
use tonic::transport::server::Connected;
use tributary_raft::PeerCaller;
use tributary_raft::peer_key::{self, ClusterKey, Refused};

use crate::limits::{ConnectionGate, Guarded};
use crate::tls::{HANDSHAKE_TIMEOUT, HANDSHAKES_MAX, TlsPort};

/// Finished handshakes waiting for the gRPC server to take them.
const ACCEPTED_QUEUE_MAX: usize = 64;
/// Pause after the listener fails to accept (e.g. out of file descriptors).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// A source refused again within this long is counted, not logged again.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(60);
/// Sources remembered for [`REFUSAL_LOG_INTERVAL`] at most; past it the oldest are
/// forgotten (and may be logged again).
const REFUSAL_LOG_SOURCES_MAX: usize = 4096;

/// What a gRPC client without the cluster key hears from a keyed peer port (ASCII, no '%':
/// a valid `grpc-message` as it is).
pub const NO_KEY_ANSWER: &str = "this peer port admits only the nodes of its cluster: a \
    node proves it with the cluster key (start it with --cluster-key-file FILE, the same \
    key as the other nodes); clients use the client port";

/// Any stream a peer connection can run over.
pub trait PeerIo: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> PeerIo for T {}

/// How the peer port admits connections: the TLS server settings (mutual TLS) and the
/// cluster key, either, both or neither.
#[derive(Clone, Default)]
pub struct PeerDoor {
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub key: Option<ClusterKey>,
}

impl PeerDoor {
    /// Whether anything authenticates the nodes that connect.
    pub fn is_protected(&self) -> bool {
        self.tls.is_some() || self.key.is_some()
    }
}

/// An admitted peer connection, for tonic.
pub struct PeerConnection {
    io: Box<dyn PeerIo>,
    caller: PeerCaller,
}

impl Connected for PeerConnection {
    type ConnectInfo = PeerCaller;

    fn connect_info(&self) -> PeerCaller {
        self.caller.clone()
    }
}

impl AsyncRead for PeerConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for PeerConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

/// The peer connections `listener` admits through `door`, for
/// `serve_with_incoming_shutdown`; each holds a place at `gate` and is closed when idle for
/// `idle_timeout`. Accepting stops when the stream is dropped.
pub fn incoming(
    listener: TcpListener,
    door: PeerDoor,
    gate: ConnectionGate,
    idle_timeout: Duration,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Guarded<PeerConnection>>> {
    let (accepted, stream) = mpsc::channel(ACCEPTED_QUEUE_MAX);
    tokio::spawn(accept_loop(
        listener,
        Arc::new(door),
        (gate, idle_timeout),
        accepted,
    ));
    tokio_stream::wrappers::ReceiverStream::new(stream)
}

async fn accept_loop(
    listener: TcpListener,
    door: Arc<PeerDoor>,
    (gate, idle_timeout): (ConnectionGate, Duration),
    accepted: mpsc::Sender<io::Result<Guarded<PeerConnection>>>,
) {
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let (tcp, remote) = tokio::select! {
            () = accepted.closed() => return,
            result = listener.accept() => match result {
                Ok(connection) => connection,
                Err(error) => {
                    tracing::warn!(port = "peer", %error, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let mut caller = PeerCaller {
            remote_addr: Some(remote),
            node: None,
        };
        if !door.is_protected() {
            // Nothing to check: no task per connection.
            match gate.admit() {
                Some(place) => {
                    let connection = PeerConnection {
                        io: Box::new(tcp),
                        caller,
                    };
                    let _ = accepted
                        .send(Ok(Guarded::new(connection, place, idle_timeout)))
                        .await;
                }
                None => {
                    tokio::spawn(crate::limits::refuse(tcp, gate.refusal()));
                }
            }
            continue;
        }
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            refused(remote, "busy", "too many peer handshakes under way");
            continue;
        };
        // Its place is taken before the handshake: handshakes count as connections.
        let place = gate.admit();
        let door = door.clone();
        let accepted = accepted.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, admit(tcp, &door)).await {
                Ok(Ok((io, node))) => match place {
                    Some(place) => {
                        caller.node = node;
                        let connection = PeerConnection { io, caller };
                        let guarded = Guarded::new(connection, place, idle_timeout);
                        let _ = accepted.send(Ok(guarded)).await;
                    }
                    None => crate::limits::refuse(io, gate.refusal()).await,
                },
                Ok(Err((reason, detail))) => refused(remote, reason, &detail),
                Err(_elapsed) => refused(
                    remote,
                    "timeout",
                    &format!("no handshake within {HANDSHAKE_TIMEOUT:?}"),
                ),
            }
        });
    }
}

/// Runs the door's handshakes on one connection: the stream to serve and the node its
/// certificate names, or why not (the `reason` label and a description).
async fn admit(
    tcp: TcpStream,
    door: &PeerDoor,
) -> Result<(Box<dyn PeerIo>, Option<u64>), (&'static str, String)> {
    let mut node = None;
    let mut io: Box<dyn PeerIo> = match &door.tls {
        Some(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config.clone());
            let stream = crate::tls::handshake(tcp, acceptor, TlsPort::Peer)
                .await
                .map_err(|reason| {
                    crate::tls::count_refusal(TlsPort::Peer);
                    if reason.contains(crate::tls::NAMES_NO_NODE) {
                        ("no_node_id", reason)
                    } else {
                        ("tls", reason)
                    }
                })?;
            node = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| crate::cert::certificate_node_id(cert));
            Box::new(stream)
        }
        None => Box::new(tcp),
    };
    if let Some(key) = &door.key {
        match peer_key::accept(&mut io, key).await {
            Ok(()) => {}
            Err(refusal) => {
                let refused = (refusal.reason(), refusal.to_string());
                // The HTTP/2 connection preface starts "PRI * HT": a gRPC client, told why
                // in its own protocol.
                if let Refused::NotKeyed { first } = refusal
                    && first.starts_with(b"PRI")
                {
                    let status = tonic::Status::unauthenticated(NO_KEY_ANSWER);
                    crate::limits::refuse(Prefixed::new(first, io), status).await;
                }
                return Err(refused);
            }
        }
    }
    Ok((io, node))
}

/// Counts a refused peer connection and logs it, once per source per minute.
fn refused(remote: SocketAddr, reason: &'static str, detail: &str) {
    metrics::counter!("tributary_peer_refused_total", "reason" => reason).increment(1);
    if refusal_log().should_log(remote.ip(), Instant::now()) {
        tracing::warn!(
            %remote,
            reason,
            detail,
            "refused a peer connection (further refusals of this source within a minute are \
             counted in tributary_peer_refused_total, not logged)"
        );
    }
}

fn refusal_log() -> &'static RefusalLog {
    static LOG: std::sync::OnceLock<RefusalLog> = std::sync::OnceLock::new();
    LOG.get_or_init(RefusalLog::default)
}

/// When each source was last logged.
#[derive(Default)]
struct RefusalLog {
    last: Mutex<HashMap<IpAddr, Instant>>,
}

impl RefusalLog {
    /// Whether a refusal of `source` at `now` is logged: not when one was within the last
    /// [`REFUSAL_LOG_INTERVAL`].
    fn should_log(&self, source: IpAddr, now: Instant) -> bool {
        let mut last = self.last.lock().expect("refusal log lock");
        if let Some(at) = last.get(&source)
            && now.saturating_duration_since(*at) < REFUSAL_LOG_INTERVAL
        {
            return false;
        }
        if last.len() >= REFUSAL_LOG_SOURCES_MAX {
            last.retain(|_, at| now.saturating_duration_since(*at) < REFUSAL_LOG_INTERVAL);
            if last.len() >= REFUSAL_LOG_SOURCES_MAX {
                last.clear();
            }
        }
        last.insert(source, now);
        true
    }
}

/// A stream whose first bytes were already read: they are read again first.
struct Prefixed<IO> {
    first: Vec<u8>,
    at: usize,
    io: IO,
}

impl<IO> Prefixed<IO> {
    fn new(first: Vec<u8>, io: IO) -> Self {
        Self { first, at: 0, io }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.first.len() {
            let n = (self.first.len() - self.at).min(buf.remaining());
            let at = self.at;
            buf.put_slice(&self.first[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Dials a peer port: TCP, then mutual TLS when configured, then the cluster-key handshake
/// when configured. A tower service for [`tonic::transport::Endpoint`].
#[derive(Clone)]
pub struct PeerDialer {
    pub tls: Option<tributary_client::tls::TlsConnector>,
    pub key: Option<ClusterKey>,
}

/// Why dialing a peer failed.
pub type DialError = Box<dyn std::error::Error + Send + Sync>;

impl tonic::codegen::Service<Uri> for PeerDialer {
    type Response = TokioIo<Box<dyn PeerIo>>;
    type Error = DialError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, DialError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), DialError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let mut tls = self.tls.clone();
        let key = self.key.clone();
        Box::pin(async move {
            let dial = async {
                let mut io: Box<dyn PeerIo> = match &mut tls {
                    Some(connector) => Box::new(connector.call(uri).await?.into_inner()),
                    None => {
                        let host = uri.host().ok_or("a peer address without a host")?;
                        let port = uri.port_u16().ok_or("a peer address without a port")?;
                        let tcp = TcpStream::connect((host.trim_matches(['[', ']']), port)).await?;
                        let _ = tcp.set_nodelay(true);
                        Box::new(tcp)
                    }
                };
                if let Some(key) = &key {
                    peer_key::dial(&mut io, key).await?;
                }
                Ok::<_, DialError>(TokioIo::new(io))
            };
            tokio::time::timeout(HANDSHAKE_TIMEOUT, dial)
                .await
                .map_err(|_| format!("no peer handshake within {HANDSHAKE_TIMEOUT:?}"))?
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_no_key_answer_is_a_valid_grpc_message() {
        assert!(
            NO_KEY_ANSWER
                .bytes()
                .all(|b| (b' '..=b'~').contains(&b) && b != b'%')
        );
    }

    #[test]
    fn a_source_is_logged_once_a_minute() {
        let log = RefusalLog::default();
        let start = Instant::now();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        assert!(log.should_log(a, start));
        assert!(!log.should_log(a, start + Duration::from_secs(1)));
        assert!(
            log.should_log(b, start + Duration::from_secs(1)),
            "another source"
        );
        assert!(!log.should_log(a, start + Duration::from_secs(59)));
        assert!(log.should_log(a, start + Duration::from_secs(61)));
    }

    #[test]
    fn the_log_remembers_a_bounded_number_of_sources() {
        let log = RefusalLog::default();
        let start = Instant::now();
        for i in 0..(REFUSAL_LOG_SOURCES_MAX as u32 + 10) {
            assert!(log.should_log(IpAddr::from(i.to_be_bytes()), start));
        }
        assert!(log.last.lock().unwrap().len() <= REFUSAL_LOG_SOURCES_MAX);
    }

    #[tokio::test]
    async fn prefixed_bytes_are_read_again_first() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let (near, mut far) = tokio::io::duplex(64);
        far.write_all(b" world").await.unwrap();
        drop(far);
        let mut prefixed = Prefixed::new(b"hello".to_vec(), near);
        let mut text = String::new();
        prefixed.read_to_string(&mut text).await.unwrap();
        assert_eq!(text, "hello world");
    }
}
