//! Serving a listener: each accepted connection (plain TCP or TLS, with the node's connection
//! limits applied) is an HTTP/1.1 connection with keep-alive, served until the node stops.

use std::convert::Infallible;
use std::io;
use std::time::Duration;

use futures::{Stream, StreamExt};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::handler::BlobEndpoint;

/// How long a client may take to send a request's headers.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Accepts connections from `incoming` and serves each until `stop` turns true.
pub async fn serve_listener<S>(
    incoming: impl Stream<Item = io::Result<S>> + Send,
    endpoint: BlobEndpoint,
    mut stop: watch::Receiver<bool>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let mut incoming = std::pin::pin!(incoming);
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = incoming.next() => match accepted {
                Some(Ok(io)) => {
                    let endpoint = endpoint.clone();
                    connections.spawn(serve_connection(io, endpoint));
                }
                Some(Err(err)) => tracing::debug!(%err, "a Blob connection was not accepted"),
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    connections.shutdown().await;
}

/// Serves one connection's requests, one after another (HTTP/1.1 keep-alive).
pub async fn serve_connection<S>(io: S, endpoint: BlobEndpoint)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |request| {
        let endpoint = endpoint.clone();
        async move { Ok::<_, Infallible>(endpoint.handle(request).await) }
    });
    let served = http1::Builder::new()
        .keep_alive(true)
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(err) = served {
        tracing::debug!(%err, "a Blob connection ended with an error");
    }
}
