//! Limits against abuse on the gRPC ports: a cap on open connections (over it, a connection
//! is answered with "server busy" and a message saying why, then closed), and an idle
//! timeout (a connection that sends nothing for that long, not even the HTTP/2 pings every
//! client and this server exchange, is closed). Concurrent streams per connection and
//! request sizes are limited by the gRPC server itself (see `lib.rs`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use futures::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

use tributary_broker::Error;

/// How long accepting pauses after an error (e.g. no file descriptor left).
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);

/// When a refused client should try again.
const REFUSED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// How long a refused connection is kept open to read its calls and answer them.
const REFUSAL_LINGER: Duration = Duration::from_secs(5);

/// Connections of one port: how many are open, and how many may be.
#[derive(Debug, Clone)]
pub struct ConnectionGate {
    port: &'static str,
    open: Arc<AtomicUsize>,
    max: usize,
}

/// One admitted connection; dropping it frees its place.
#[derive(Debug)]
pub struct ConnectionPermit {
    port: &'static str,
    open: Arc<AtomicUsize>,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let now = self.open.fetch_sub(1, Ordering::AcqRel) - 1;
        metrics::gauge!("tributary_connections_open", "port" => self.port).set(now as f64);
    }
}

impl ConnectionGate {
    /// `port` names the port in metrics and messages (`client`, `peer`).
    pub fn new(port: &'static str, max: usize) -> Self {
        Self {
            port,
            open: Arc::default(),
            max,
        }
    }

    /// A place for a new connection, or `None` when `max` are open.
    pub fn admit(&self) -> Option<ConnectionPermit> {
        let mut open = self.open.load(Ordering::Acquire);
        loop {
            if open >= self.max {
                metrics::counter!(
                    "tributary_connections_refused_total",
                    "port" => self.port,
                    "reason" => "limit"
                )
                .increment(1);
                return None;
            }
            match self.open.compare_exchange_weak(
                open,
                open + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break,
                Err(now) => open = now,
            }
        }
        metrics::gauge!("tributary_connections_open", "port" => self.port).set((open + 1) as f64);
        Some(ConnectionPermit {
            port: self.port,
            open: self.open.clone(),
        })
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// What a refused client is told: the node is busy (so the SDK retries after a
    /// pause, and may go to another node), and why.
    pub fn refusal(&self) -> tonic::Status {
        Error::busy(
            format!(
                "this node has {} {} connections open, its limit (--max-connections); close \
                 connections you do not use, or connect to another node",
                self.max, self.port
            ),
            REFUSED_RETRY_AFTER,
        )
        .into()
    }
}

/// A connection that holds its place at the gate and fails with `TimedOut` when nothing
/// has been read from it for `idle_timeout`.
#[derive(Debug)]
pub struct Guarded<IO> {
    io: IO,
    _permit: ConnectionPermit,
    port: &'static str,
    idle_timeout: Duration,
    idle: Pin<Box<Sleep>>,
}

impl<IO> Guarded<IO> {
    pub fn new(io: IO, permit: ConnectionPermit, idle_timeout: Duration) -> Self {
        Self {
            io,
            port: permit.port,
            _permit: permit,
            idle_timeout,
            idle: Box::pin(tokio::time::sleep(idle_timeout)),
        }
    }

    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    let deadline = Instant::now() + this.idle_timeout;
                    this.idle.as_mut().reset(deadline);
                }
                Poll::Ready(result)
            }
            Poll::Pending => {
                ready!(this.idle.as_mut().poll(cx));
                metrics::counter!(
                    "tributary_connections_refused_total",
                    "port" => this.port,
                    "reason" => "idle"
                )
                .increment(1);
                Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "nothing received for {:?} (the idle timeout): connection closed",
                        this.idle_timeout
                    ),
                )))
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Guarded<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// The connections `listener` accepts, each holding a place at `gate` and closed when idle
/// for `idle_timeout`, with Nagle's algorithm off (a reply is a few small HTTP/2 frames;
/// with it on each waited for the peer's delayed acknowledgement). A connection over the
/// limit is answered by [`refuse`] instead, and never reaches the server.
pub fn incoming(
    listener: TcpListener,
    gate: ConnectionGate,
    idle_timeout: Duration,
) -> impl Stream<Item = io::Result<Guarded<TcpStream>>> + Send + 'static {
    futures::stream::unfold((listener, gate), move |(listener, gate)| async move {
        loop {
            match listener.accept().await {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    match gate.admit() {
                        Some(permit) => {
                            let guarded = Guarded::new(stream, permit, idle_timeout);
                            return Some((Ok(guarded), (listener, gate)));
                        }
                        None => {
                            tokio::spawn(refuse(stream, gate.refusal()));
                        }
                    }
                }
                Err(err) => {
                    // Out of file descriptors and the like: the listener stays, and
                    // accepting resumes once connections close.
                    tracing::warn!(port = gate.port, %err, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                }
            }
        }
    })
}

/// Answers every gRPC call on a connection over the limit with `status`, for a few
/// seconds, then closes it: the client sees why instead of a reset.
pub async fn refuse<IO>(io: IO, status: tonic::Status)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service =
        hyper::service::service_fn(move |_request: hyper::Request<hyper::body::Incoming>| {
            let status = status.clone();
            async move {
                Ok::<_, std::convert::Infallible>(
                    status.into_http::<http_body_util::Empty<bytes::Bytes>>(),
                )
            }
        });
    let connection = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(io), service);
    let _ = tokio::time::timeout(REFUSAL_LINGER, connection).await;
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[test]
    fn the_gate_admits_up_to_its_limit_and_frees_places_on_drop() {
        let gate = ConnectionGate::new("client", 2);
        let a = gate.admit().expect("first");
        let _b = gate.admit().expect("second");
        assert!(gate.admit().is_none(), "a third is over the limit");
        drop(a);
        assert_eq!(gate.open(), 1);
        assert!(gate.admit().is_some(), "a place was freed");
        let refusal = gate.refusal();
        assert_eq!(refusal.code(), tonic::Code::Unavailable);
        assert!(
            refusal.message().contains("--max-connections"),
            "{refusal:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_connection_silent_past_the_idle_timeout_fails_and_one_that_talks_does_not() {
        let gate = ConnectionGate::new("client", 8);
        let (near, mut far) = tokio::io::duplex(64);
        let mut guarded = Guarded::new(near, gate.admit().unwrap(), Duration::from_secs(10));
        let mut buf = [0u8; 8];
        // Bytes every 6 s keep it open past the timeout.
        for _ in 0..4 {
            tokio::time::advance(Duration::from_secs(6)).await;
            far.write_all(b"ping").await.unwrap();
            assert_eq!(guarded.read(&mut buf).await.unwrap(), 4);
        }
        // Then silence: the read fails once 10 s have passed.
        let started = Instant::now();
        let err = guarded.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(10));
        assert!(err.to_string().contains("idle timeout"), "{err}");
        drop(guarded);
        assert_eq!(gate.open(), 0, "the place is freed with the connection");
    }
}
