//! The one error type of the SDK, decoded from the gRPC status the service returns.

use std::error::Error as _;
use std::time::Duration;

use prost::Message as _;
use tributary_proto::v1::{ErrorDetail, ErrorReason};

/// Why a call failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClientError {
    /// The service answered with an error. `reason` is the machine-readable cause; `message`
    /// is the service's explanation, meant for a person.
    #[error("{}", service_display(*.reason, *.code, .message, *.retry_after, .leader_hint.as_deref()))]
    Service {
        code: tonic::Code,
        reason: ErrorReason,
        message: String,
        /// With [`ErrorReason::ServerBusy`]: how long to wait before retrying.
        retry_after: Option<Duration>,
        /// With [`ErrorReason::NotLeader`]: the client address of the node believed to lead.
        leader_hint: Option<String>,
    },
    /// The service could not be reached, or the connection broke during the call.
    #[error("cannot reach the Tributary node at {endpoint}: {message}")]
    Transport { endpoint: String, message: String },
    /// A TLS connection cannot be set up, and retrying will not change that: the node's
    /// certificate is not trusted, or its port does not speak TLS.
    #[error("cannot talk to the Tributary node at {endpoint}: {message}")]
    Tls { endpoint: String, message: String },
    /// The call was refused before it was sent, because an argument is not valid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
}

impl ClientError {
    /// The machine-readable reason, when the service gave one (or it follows from the status
    /// code); `None` for transport and client-side validation errors.
    pub fn reason(&self) -> Option<ErrorReason> {
        match self {
            ClientError::Service { reason, .. } => Some(*reason),
            ClientError::Transport { .. }
            | ClientError::Tls { .. }
            | ClientError::InvalidArgument(_) => None,
        }
    }

    /// How long the service asked us to wait before retrying, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Service { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// True for conditions that may clear up by themselves: a busy server, a leader change, an
    /// unreachable node.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Service { reason, .. } => matches!(
                reason,
                ErrorReason::ServerBusy | ErrorReason::NotLeader | ErrorReason::Unavailable
            ),
            ClientError::Transport { .. } => true,
            ClientError::Tls { .. } | ClientError::InvalidArgument(_) => false,
        }
    }

    /// Decodes a status returned by a call to `endpoint`.
    ///
    /// The service puts an encoded [`ErrorDetail`] in every error's details. A status without
    /// one did not come from a Tributary handler: with code `Unavailable`, or `Cancelled` (a
    /// node shutting down refuses new streams), or made here from a broken connection (a
    /// node dying mid-call), it is a transport failure, otherwise the reason is derived from
    /// the code.
    pub fn from_status(status: tonic::Status, endpoint: &str) -> ClientError {
        let detail = if status.details().is_empty() {
            None
        } else {
            ErrorDetail::decode(status.details()).ok()
        };
        let Some(detail) = detail else {
            if let Some(tls) = tls_setup_error(&status) {
                return ClientError::Tls {
                    endpoint: endpoint.to_owned(),
                    message: tls.to_string(),
                };
            }
            if matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Cancelled
            ) || broken_connection(&status)
            {
                return ClientError::Transport {
                    endpoint: endpoint.to_owned(),
                    message: error_chain(&status),
                };
            }
            return ClientError::Service {
                code: status.code(),
                reason: reason_from_code(status.code()),
                message: status.message().to_owned(),
                retry_after: None,
                leader_hint: None,
            };
        };
        let reason = ErrorReason::try_from(detail.reason).unwrap_or(ErrorReason::Unspecified);
        let message = if detail.message.is_empty() {
            status.message().to_owned()
        } else {
            detail.message
        };
        ClientError::Service {
            code: status.code(),
            reason,
            message,
            retry_after: (detail.retry_after_ms > 0)
                .then(|| Duration::from_millis(detail.retry_after_ms)),
            leader_hint: (!detail.leader_hint.is_empty()).then_some(detail.leader_hint),
        }
    }
}

/// A status the client made from a connection that broke during the call: it carries the
/// underlying error as its source, which statuses sent by a server never do.
/// The TLS failure behind a failed call, when retrying cannot help.
fn tls_setup_error(status: &tonic::Status) -> Option<&crate::tls::TlsConnectError> {
    use crate::tls::TlsConnectError;
    let mut source = status.source();
    while let Some(error) = source {
        if let Some(tls) = error.downcast_ref::<TlsConnectError>() {
            return matches!(
                tls,
                TlsConnectError::NotTls { .. }
                    | TlsConnectError::Untrusted { .. }
                    | TlsConnectError::WrongName { .. }
                    | TlsConnectError::BadAddress(_)
            )
            .then_some(tls);
        }
        source = error.source();
    }
    None
}

fn broken_connection(status: &tonic::Status) -> bool {
    matches!(status.code(), tonic::Code::Unknown | tonic::Code::Internal)
        && status.source().is_some()
}

/// The status message followed by its sources, skipping repeats (hyper and tonic often wrap
/// an error whose text they already include).
fn error_chain(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut source = status.source();
    while let Some(error) = source {
        let part = error.to_string();
        if !part.is_empty() && !text.contains(&part) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(&part);
        }
        source = error.source();
    }
    if text.is_empty() {
        text = "the connection failed".to_owned();
    }
    text
}

fn reason_from_code(code: tonic::Code) -> ErrorReason {
    use tonic::Code;
    match code {
        Code::NotFound => ErrorReason::NotFound,
        Code::AlreadyExists => ErrorReason::AlreadyExists,
        Code::InvalidArgument | Code::OutOfRange => ErrorReason::InvalidArgument,
        Code::Unauthenticated | Code::PermissionDenied => ErrorReason::Unauthorized,
        Code::Internal | Code::DataLoss => ErrorReason::Internal,
        Code::Unavailable => ErrorReason::Unavailable,
        _ => ErrorReason::Unspecified,
    }
}

/// "not found: event hub 'x' does not exist", plus what to do about busy servers and leaders.
fn service_display(
    reason: ErrorReason,
    code: tonic::Code,
    message: &str,
    retry_after: Option<Duration>,
    leader_hint: Option<&str>,
) -> String {
    let kind = match reason {
        ErrorReason::NotFound => "not found",
        ErrorReason::AlreadyExists => "already exists",
        ErrorReason::InvalidArgument => "invalid argument",
        ErrorReason::MessageTooLarge => "message too large",
        ErrorReason::ServerBusy => "server busy",
        ErrorReason::NotLeader => "not leader",
        ErrorReason::Unauthorized => "unauthorized",
        ErrorReason::QuotaExceeded => "quota exceeded",
        ErrorReason::Internal => "internal error",
        ErrorReason::Unavailable => "unavailable",
        ErrorReason::OutOfOrderSequence => "out of order",
        ErrorReason::ReaderDisconnected => "reader disconnected",
        ErrorReason::NotOwner => "not the owner",
        ErrorReason::InvalidProducerEpoch => "invalid producer epoch",
        ErrorReason::UnknownProducer => "unknown producer",
        ErrorReason::Unspecified => code.description(),
    };
    let mut text = if message.is_empty() {
        kind.to_owned()
    } else {
        format!("{kind}: {message}")
    };
    if let Some(retry_after) = retry_after {
        text.push_str(&format!(
            " (retry after {})",
            humantime::format_duration(retry_after)
        ));
    }
    if let Some(leader) = leader_hint {
        text.push_str(&format!(" (the leader is believed to be {leader})"));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_with(code: tonic::Code, detail: ErrorDetail) -> tonic::Status {
        tonic::Status::with_details(code, "status text", detail.encode_to_vec().into())
    }

    #[test]
    fn decodes_error_detail_from_status_details() {
        let status = status_with(
            tonic::Code::NotFound,
            ErrorDetail {
                reason: ErrorReason::NotFound as i32,
                message: "event hub 'x' does not exist".into(),
                retry_after_ms: 0,
                leader_hint: String::new(),
                leader_node: 0,
            },
        );
        let error = ClientError::from_status(status, "http://h:1");
        assert_eq!(error.reason(), Some(ErrorReason::NotFound));
        assert_eq!(error.to_string(), "not found: event hub 'x' does not exist");
        let ClientError::Service {
            code,
            retry_after,
            leader_hint,
            ..
        } = error
        else {
            panic!("expected a service error");
        };
        assert_eq!(code, tonic::Code::NotFound);
        assert_eq!(retry_after, None);
        assert_eq!(leader_hint, None);
    }

    #[test]
    fn keeps_retry_after_and_leader_hint() {
        let busy = ClientError::from_status(
            status_with(
                tonic::Code::ResourceExhausted,
                ErrorDetail {
                    reason: ErrorReason::ServerBusy as i32,
                    message: "partition 3 is throttled".into(),
                    retry_after_ms: 1500,
                    leader_hint: String::new(),
                    leader_node: 0,
                },
            ),
            "http://h:1",
        );
        assert_eq!(busy.reason(), Some(ErrorReason::ServerBusy));
        assert_eq!(busy.retry_after(), Some(Duration::from_millis(1500)));
        assert!(busy.is_transient());
        assert_eq!(
            busy.to_string(),
            "server busy: partition 3 is throttled (retry after 1s 500ms)"
        );

        let not_leader = ClientError::from_status(
            status_with(
                tonic::Code::FailedPrecondition,
                ErrorDetail {
                    reason: ErrorReason::NotLeader as i32,
                    message: "this node does not lead partition 0".into(),
                    retry_after_ms: 0,
                    leader_hint: "http://10.0.0.2:7400".into(),
                    leader_node: 0,
                },
            ),
            "http://h:1",
        );
        let ClientError::Service { leader_hint, .. } = &not_leader else {
            panic!("expected a service error");
        };
        assert_eq!(leader_hint.as_deref(), Some("http://10.0.0.2:7400"));
        assert!(not_leader.to_string().contains("http://10.0.0.2:7400"));
    }

    #[test]
    fn unknown_reason_values_become_unspecified() {
        let status = status_with(
            tonic::Code::Internal,
            ErrorDetail {
                reason: 999,
                message: "boom".into(),
                retry_after_ms: 0,
                leader_hint: String::new(),
                leader_node: 0,
            },
        );
        let error = ClientError::from_status(status, "http://h:1");
        assert_eq!(error.reason(), Some(ErrorReason::Unspecified));
        assert!(error.to_string().ends_with(": boom"));
    }

    #[test]
    fn status_without_details_falls_back_to_the_code() {
        let error = ClientError::from_status(
            tonic::Status::already_exists("hub 'a' exists"),
            "http://h:1",
        );
        assert_eq!(error.reason(), Some(ErrorReason::AlreadyExists));
        assert_eq!(error.to_string(), "already exists: hub 'a' exists");

        let garbage = tonic::Status::with_details(
            tonic::Code::InvalidArgument,
            "bad name",
            bytes::Bytes::from_static(&[0xff, 0xff, 0xff]),
        );
        let error = ClientError::from_status(garbage, "http://h:1");
        assert_eq!(error.reason(), Some(ErrorReason::InvalidArgument));
        assert_eq!(error.to_string(), "invalid argument: bad name");
    }

    #[test]
    fn a_connection_broken_mid_call_is_a_transport_error() {
        let reset = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "connection reset");
        let status = tonic::Status::from_error(Box::new(reset));
        assert_eq!(status.code(), tonic::Code::Unknown);
        let error = ClientError::from_status(status, "http://127.0.0.1:7400");
        assert!(matches!(error, ClientError::Transport { .. }), "{error:?}");
        assert!(error.is_transient());
        // The same code sent by a server (no source) is not a transport failure.
        let error = ClientError::from_status(tonic::Status::unknown("boom"), "http://h:1");
        assert_eq!(error.reason(), Some(ErrorReason::Unspecified));
        assert!(!error.is_transient());
    }

    #[test]
    fn unavailable_without_details_is_a_transport_error() {
        let error = ClientError::from_status(
            tonic::Status::unavailable("tcp connect error"),
            "http://127.0.0.1:7400",
        );
        assert!(matches!(error, ClientError::Transport { .. }));
        assert_eq!(error.reason(), None);
        assert!(error.is_transient());
        assert_eq!(
            error.to_string(),
            "cannot reach the Tributary node at http://127.0.0.1:7400: tcp connect error"
        );
    }
}
