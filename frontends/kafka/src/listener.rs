//! Serving a listener: each accepted connection (plain TCP or TLS, with the node's
//! connection limits applied) in a task of its own, until the node stops.

use std::io;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::KafkaContext;
use crate::connection::serve_connection;

/// Accepts connections from `incoming` and serves each until `stop` turns true.
pub async fn serve_listener<S>(
    incoming: impl Stream<Item = io::Result<S>> + Send,
    context: Arc<KafkaContext>,
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
                    let context = context.clone();
                    connections.spawn(async move { serve_connection(io, &context).await });
                }
                Some(Err(err)) => tracing::debug!(%err, "a Kafka connection was not accepted"),
                None => break,
            },
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            _ = stop.wait_for(|stop| *stop) => break,
        }
    }
    connections.shutdown().await;
}
