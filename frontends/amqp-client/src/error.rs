//! Why a client operation failed. One enum for the whole client: a connection's failure
//! reaches every operation waiting on it, so the error is `Clone` (i/o errors are shared).

use std::sync::Arc;

use tributary_amqp::AmqpError;
use tributary_amqp::CodecError;
use tributary_amqp::SaslCode;
use tributary_amqp::Symbol;

/// A client operation's failure, with text a person can act on.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("cannot connect to {addr}: {error}")]
    Connect {
        addr: String,
        error: Arc<std::io::Error>,
    },
    #[error("AMQP connection i/o failed: {0}")]
    Io(Arc<std::io::Error>),
    #[error("the server's bytes are not AMQP 1.0 frames: {0}")]
    Framing(CodecError),
    #[error("the server sent an undecodable frame: {0}")]
    Decode(CodecError),
    #[error(
        "the server does not offer SASL {mechanism}; it offers {offered:?} (pick one of them \
         in ConnectionOptions::sasl)"
    )]
    MechanismNotOffered {
        mechanism: &'static str,
        offered: Vec<Symbol>,
    },
    #[error("SASL {mechanism} was refused with outcome {code:?}: check the user and password")]
    Authentication {
        mechanism: &'static str,
        code: SaslCode,
    },
    #[error("the server broke the AMQP protocol: {0}")]
    Protocol(String),
    #[error("the server closed the connection{}", describe(.0))]
    ConnectionClosed(Option<AmqpError>),
    #[error("the server ended the session{}", describe(.0))]
    SessionEnded(Option<AmqpError>),
    #[error("the server detached the link{}", describe(.0))]
    LinkDetached(Option<AmqpError>),
    #[error("the server sent nothing for {silent_ms} ms (twice our idle-time-out)")]
    Idle { silent_ms: u64 },
    #[error("{what} got no answer within {timeout_ms} ms")]
    Timeout { what: &'static str, timeout_ms: u64 },
    #[error("a {what} reply is malformed: {problem}")]
    InvalidReply { what: &'static str, problem: String },
    #[error(
        "a delivery of {size_bytes} bytes exceeds the link's max-message-size of {max_bytes} \
         bytes: send fewer or smaller events"
    )]
    MessageTooLarge { size_bytes: u64, max_bytes: u64 },
    #[error(
        "the session holds at most {links_max} links: close a sender or receiver before \
         opening another"
    )]
    TooManyLinks { links_max: usize },
    #[error("the link was closed by this client")]
    LinkClosed,
    #[error("the connection was closed by this client")]
    Closed,
}

impl ClientError {
    /// The AMQP error condition the server gave, if any.
    pub fn condition(&self) -> Option<&str> {
        match self {
            ClientError::ConnectionClosed(error)
            | ClientError::SessionEnded(error)
            | ClientError::LinkDetached(error) => error.as_ref().map(|e| e.condition.as_str()),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    fn from(error: std::io::Error) -> ClientError {
        ClientError::Io(Arc::new(error))
    }
}

fn describe(error: &Option<AmqpError>) -> String {
    match error {
        None => String::new(),
        Some(error) => match &error.description {
            Some(description) => format!(" with {}: {description}", error.condition),
            None => format!(" with {}", error.condition),
        },
    }
}
