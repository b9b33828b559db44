//! The protocol headers and the SASL exchange (WIRE-PROTOCOLS A3): everything before open.
//!
//! SASL only admits the client (MSSBCBS and ANONYMOUS always; PLAIN when the backend accepts
//! the rule name and key); authorization happens later through CBS. Bytes a client pipelines
//! after its headers (pyamqp sends header, open, begin and attaches at once) stay buffered in
//! the transport for the connection to read.

use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use super::backend::{Backend, TokenGrant};
use super::error::ConnectionError;
use super::metrics;
use super::transport::Transport;
use crate::delivery_state::condition;
use crate::frame::{FrameType, ProtocolHeader, ProtocolId};
use crate::ids::Channel;
use crate::performative::{Performative, decode_frame_body};
use crate::sasl::{SaslCode, SaslMechanisms, SaslOutcome};
use crate::types::Symbol;

/// The mechanisms offered, in order of preference.
pub const SASL_MECHANISMS: [&str; 3] = ["MSSBCBS", "ANONYMOUS", "PLAIN"];

/// Who the handshake admitted.
#[derive(Debug, Default)]
pub(crate) struct Admission {
    /// SASL PLAIN's namespace-wide grant.
    pub(crate) plain_grant: Option<TokenGrant>,
    /// The host name the client gave in sasl-init.
    pub(crate) hostname: Option<String>,
}

/// Reads the client's headers, runs SASL when asked, and sends our AMQP header: at once,
/// since a client may wait for it before it sends its open (uamqp does; pyamqp pipelines).
pub(crate) async fn admit<S: AsyncRead + AsyncWrite + Unpin>(
    transport: &mut Transport<S>,
    backend: &dyn Backend,
) -> Result<Admission, ConnectionError> {
    let header = transport.read_header().await?;
    let admission = match header {
        ProtocolHeader {
            protocol: ProtocolId::Sasl,
            ..
        } if header.is_version_1_0() => {
            let admission = sasl(transport, backend).await?;
            let header = transport.read_header().await?;
            if header != ProtocolHeader::AMQP {
                return Err(ConnectionError::UnsupportedProtocol(header.to_bytes()));
            }
            admission
        }
        ProtocolHeader::AMQP => Admission::default(),
        other => return Err(ConnectionError::UnsupportedProtocol(other.to_bytes())),
    };
    transport.push_bytes(&ProtocolHeader::AMQP.to_bytes());
    transport.flush().await?;
    Ok(admission)
}

async fn sasl<S: AsyncRead + AsyncWrite + Unpin>(
    transport: &mut Transport<S>,
    backend: &dyn Backend,
) -> Result<Admission, ConnectionError> {
    transport.push_bytes(&ProtocolHeader::SASL.to_bytes());
    let mechanisms = SaslMechanisms {
        sasl_server_mechanisms: SASL_MECHANISMS.iter().map(|m| Symbol::from(*m)).collect(),
    };
    transport.push(Channel(0), &mechanisms.into(), &[]);
    transport.flush().await?;
    let frame = transport.read_frame().await?;
    if frame.frame_type != FrameType::Sasl {
        return Err(ConnectionError::Authentication(
            "the client sent an AMQP frame where sasl-init was expected".into(),
        ));
    }
    let (performative, _) = decode_frame_body(frame.body).map_err(ConnectionError::Decode)?;
    let Performative::SaslInit(init) = performative else {
        return Err(ConnectionError::Authentication(format!(
            "the client sent {} where sasl-init was expected",
            performative.name()
        )));
    };
    let verdict = match init.mechanism.as_str() {
        "MSSBCBS" | "ANONYMOUS" => Ok(None),
        "PLAIN" => plain(backend, init.initial_response.unwrap_or_default())
            .await
            .map(Some),
        other => Err(format!("mechanism {other:?} is not offered")),
    };
    let code = if verdict.is_ok() {
        SaslCode::Ok
    } else {
        metrics::error_sent(condition::UNAUTHORIZED_ACCESS);
        SaslCode::Auth
    };
    let outcome = SaslOutcome {
        code,
        additional_data: None,
    };
    transport.push(Channel(0), &outcome.into(), &[]);
    transport.flush().await?;
    Ok(Admission {
        plain_grant: verdict.map_err(ConnectionError::Authentication)?,
        hostname: init.hostname,
    })
}

/// PLAIN's response is `authzid \0 user \0 password`: here a rule name and its key.
async fn plain(backend: &dyn Backend, response: Bytes) -> Result<TokenGrant, String> {
    let mut parts = response.split(|b| *b == 0);
    let (Some(_authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the PLAIN response is not authzid\\0user\\0password".into());
    };
    let (Ok(user), Ok(password)) = (std::str::from_utf8(user), std::str::from_utf8(password))
    else {
        return Err("the PLAIN user or password is not UTF-8".into());
    };
    backend
        .sasl_plain(user, password)
        .await
        .map_err(|error| format!("PLAIN user {user:?} refused: {}", error.description))
}
