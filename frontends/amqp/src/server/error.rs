//! Why a connection ended other than by an orderly close.

use crate::delivery_state::{AmqpError, condition};
use crate::error::CodecError;

/// How [`super::serve_connection`] failed. Each is an operating condition caused by the
/// client or the network; the caller logs it. When the connection was open, the client got a
/// close carrying [`ConnectionError::close_error`] first.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionError {
    #[error("AMQP connection i/o failed: {0}")]
    Io(#[from] std::io::Error),
    #[error("the client does not speak AMQP 1.0 here: {0}")]
    NotAmqp(CodecError),
    #[error(
        "the client asked for protocol header {0:02x?}; only AMQP 0 1.0.0 and SASL 3 1.0.0 are \
         served (TLS is terminated before this layer)"
    )]
    UnsupportedProtocol([u8; 8]),
    #[error("SASL authentication failed: {0}")]
    Authentication(String),
    #[error("AMQP framing error: {0}")]
    Framing(CodecError),
    #[error("undecodable AMQP frame: {0}")]
    Decode(CodecError),
    #[error("AMQP protocol violation ({condition}): {description}")]
    Protocol {
        condition: &'static str,
        description: String,
    },
    #[error("the client sent nothing for {silent_ms} ms (twice our idle-time-out)")]
    Idle { silent_ms: u64 },
    #[error("the client did not finish SASL and open within {timeout_ms} ms")]
    HandshakeTimeout { timeout_ms: u64 },
    #[error("the client did not read our frames for {timeout_ms} ms")]
    WriteTimeout { timeout_ms: u64 },
    #[error("the connection ended inside a frame ({buffered_bytes} bytes of it had arrived)")]
    Truncated { buffered_bytes: usize },
}

impl ConnectionError {
    pub(crate) fn protocol(condition: &'static str, description: impl Into<String>) -> Self {
        ConnectionError::Protocol {
            condition,
            description: description.into(),
        }
    }

    /// The error a close frame carries for this failure; `None` when no close can be sent
    /// (the socket failed, or the client never reached open).
    pub fn close_error(&self) -> Option<AmqpError> {
        let condition = match self {
            ConnectionError::Framing(_) | ConnectionError::Truncated { .. } => {
                condition::FRAMING_ERROR
            }
            ConnectionError::Decode(_) => condition::DECODE_ERROR,
            ConnectionError::Protocol { condition, .. } => condition,
            ConnectionError::Idle { .. } => condition::CONNECTION_FORCED,
            ConnectionError::Io(_)
            | ConnectionError::NotAmqp(_)
            | ConnectionError::UnsupportedProtocol(_)
            | ConnectionError::Authentication(_)
            | ConnectionError::HandshakeTimeout { .. }
            | ConnectionError::WriteTimeout { .. } => return None,
        };
        Some(AmqpError::new(condition, self.to_string()))
    }
}
