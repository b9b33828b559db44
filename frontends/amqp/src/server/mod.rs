//! The server side of one AMQP 1.0 connection in the Event Hubs dialect, over any async
//! byte stream (TLS, if any, is terminated by the caller).
//!
//! - `handshake`: protocol headers and SASL (MSSBCBS, ANONYMOUS, PLAIN).
//! - `connection`: open, the frame loop with its timers (idle, heartbeat, token expiry),
//!   sessions, close.
//! - `links`: attach routing, flow control, request reassembly, reply delivery.
//! - `requests`: `$cbs` put-token and `$management` READ.
//! - `hub_links`: sender links (publishing) and receiver links (consuming) to hubs.
//! - `event`: a published delivery as [`AmqpEvent`]s, a [`StoredEvent`] as the delivered
//!   message; `record`: an `AmqpEvent` in the broker's record and back; `position`: the
//!   selector filter as a [`StartPosition`] (all three pure).
//! - [`Backend`]: what the connection asks of the node (tokens, hub and partition
//!   properties, sends, readers).
//!
//! # Invariants
//! - Everything we write is full length (WIRE-PROTOCOLS A5): the codec guarantees it.
//! - Nothing the client sends can panic the task or grow memory without bound: frames are
//!   capped by our max-frame-size, partial messages, queued replies and events, and sends
//!   awaiting their commit by [`ConnectionLimits::buffered_bytes_max`], queues per link by
//!   [`ConnectionLimits::link_queue_max`], pending sends by
//!   [`ConnectionLimits::pending_sends_per_link_max`] and
//!   [`ConnectionLimits::pending_sends_max`], grants by [`ConnectionLimits::grants_max`].
//! - One task owns the connection. `$cbs` and `$management` requests are answered in
//!   order, awaiting the backend; sends and readers never hold up the frame loop: their
//!   futures and streams are polled by the loop beside the socket and the timers, so a slow
//!   commit delays only its own delivery's disposition.
//! - A link's sends reach the backend in the order they arrived; their dispositions go out
//!   as the backend answers, which may be in another order.

mod address;
mod backend;
mod connection;
mod error;
mod event;
mod grants;
mod handshake;
mod hub_links;
mod limits;
mod links;
mod metrics;
mod position;
mod record;
mod requests;
mod session;
mod transport;

/// The scripted client and fake backend of the server's tests (also tributary-amqp-client's).
#[cfg(any(test, feature = "test-support"))]
#[path = "tests/client.rs"]
pub mod test_backend;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncWrite};

pub use address::{Address, AddressError, covers, entity_path, parse_address};
pub use backend::{
    Backend, BackendError, BackendErrorKind, BackendFuture, EventBatch, EventStream, HubProperties,
    PartitionProperties, ReadRequest, Right, Rights, SendOutcome, SendTarget, TokenGrant,
};
pub use error::ConnectionError;
pub use event::{
    AmqpEvent, ENQUEUED_TIME_ANNOTATION, EventBody, LastEnqueued, OFFSET_ANNOTATION,
    PARTITION_KEY_ANNOTATION, SEQUENCE_NUMBER_ANNOTATION, SYSTEM_ANNOTATIONS, StoredEvent,
};
pub use handshake::SASL_MECHANISMS;
pub use limits::{ConnectionLimits, InvalidLimits};
pub use position::{InvalidFilter, StartPosition, parse_selector};
pub use record::{AMQP_EXTRAS_PROPERTY, EventProperty, EventRecordParts};
pub use requests::{JWT_TOKEN_TYPE, SAS_TOKEN_TYPE};

use crate::connection::Close;
use crate::frame::ProtocolHeader;
use crate::ids::Channel;
use connection::{Connection, fallback_open};
use metrics::ConnectionGauge;
use transport::Transport;

/// Serves one AMQP connection until the client closes it (`Ok`) or it fails (`Err`, after a
/// close frame carrying the error whenever the connection got as far as open).
pub async fn serve_connection<S>(
    io: S,
    backend: Arc<dyn Backend>,
    limits: ConnectionLimits,
) -> Result<(), ConnectionError>
where
    S: AsyncRead + AsyncWrite + Unpin + Send,
{
    let _gauge = ConnectionGauge::open();
    let mut transport = Transport::new(io, limits.max_frame_size_bytes, limits.write_timeout());
    let handshake_timeout = limits.handshake_timeout();
    let handshake = async {
        let admission = handshake::admit(&mut transport, &*backend).await?;
        let opened =
            Connection::open(&mut transport, backend.clone(), limits.clone(), admission).await;
        if let Err(error) = &opened {
            // The client has our AMQP header: a close needs an open before it.
            if error.close_error().is_some() {
                transport.push(Channel(0), &fallback_open(&limits).into(), &[]);
            }
        }
        opened
    };
    let result = match tokio::time::timeout(handshake_timeout, handshake).await {
        Err(_) => Err(ConnectionError::HandshakeTimeout {
            timeout_ms: limits.handshake_timeout_ms,
        }),
        Ok(Err(error)) => Err(error),
        Ok(Ok(mut connection)) => connection.run(&mut transport).await,
    };
    if let Err(error) = &result {
        match error {
            ConnectionError::NotAmqp(_) | ConnectionError::UnsupportedProtocol(_) => {
                transport.push_bytes(&ProtocolHeader::AMQP.to_bytes());
                tracing::info!(%error, "refusing a connection that does not speak AMQP 1.0");
            }
            _ => tracing::debug!(%error, "AMQP connection failed"),
        }
        if let Some(close_error) = error.close_error() {
            self::metrics::error_sent(close_error.condition.as_str());
            let close = Close {
                error: Some(close_error),
            };
            transport.push(Channel(0), &close.into(), &[]);
        }
    }
    transport.finish().await;
    result
}
