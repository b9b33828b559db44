//! Serving a listener: every connection it accepts runs [`serve_connection`] in its own
//! task, until the node stops. The node hands in its accepted streams (plain TCP or TLS,
//! with its connection limits already applied), so this module knows nothing of sockets.

use std::io;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::server::{Backend, ConnectionLimits, serve_connection};

/// Accepts connections from `incoming` and serves each until `stop` turns true; then stops
/// accepting and ends the open connections (their clients reconnect elsewhere).
pub async fn serve_listener<S>(
    incoming: impl Stream<Item = io::Result<S>> + Send,
    backend: Arc<dyn Backend>,
    limits: ConnectionLimits,
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
                    let (backend, limits) = (backend.clone(), limits.clone());
                    connections.spawn(async move {
                        let _ = serve_connection(io, backend, limits).await;
                    });
                }
                Some(Err(err)) => tracing::debug!(%err, "an AMQP connection was not accepted"),
                None => break,
            },
            // Finished connections leave the set as they end, so it holds only open ones.
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    connections.shutdown().await;
}
