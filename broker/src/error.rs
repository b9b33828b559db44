//! The one error type of the broker's `Service`: what went wrong,
//! in terms of the domain, with a message a person can act on. Front ends map it to their
//! protocol's errors once each (gRPC status, AMQP condition, Kafka error code); the peer
//! port carries it as the same `ErrorDetail` the gRPC API uses ([`Error::to_detail`],
//! [`Error::from_status`]).

use std::time::Duration;

use tributary_controller::state::{CommandError, ErrorKind as CommandErrorKind};
use tributary_proto::{ErrorDetail, ErrorReason};
use tributary_types::NodeId;

use crate::partition::PartitionError;
use crate::partition::position::PositionError;

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidArgument,
    /// A publication over the largest allowed size.
    MessageTooLarge,
    /// An idempotent producer's sequence number is not the next one.
    OutOfOrderSequence,
    /// A Kafka idempotent producer's epoch is older than the partition has seen.
    InvalidProducerEpoch,
    /// A Kafka idempotent producer the partition has no state for continues a sequence.
    UnknownProducer,
    /// A reader was displaced by one with a higher (or equal) owner level.
    ReaderDisconnected,
    /// A checkpoint by an instance that no longer owns the partition.
    NotOwner,
    /// Overloaded or throttled: try again after `retry_after`.
    ServerBusy {
        retry_after: Duration,
    },
    /// Not served here now, for a reason retrying (elsewhere) may fix.
    Unavailable,
    /// This node does not lead the partition: `node` does (if known), reached by clients at
    /// `client_addr`.
    NotLeader {
        node: Option<NodeId>,
        client_addr: Option<String>,
    },
    /// No credential, or one that is not valid (unknown rule, bad signature, expired).
    Unauthenticated,
    /// A valid credential without the right, or for another resource.
    Unauthorized,
    /// A limit of the namespace or hub (readers, consumer groups, partitions) is reached.
    QuotaExceeded,
    Internal,
}

/// A failed `Service` call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    pub fn busy(message: impl Into<String>, retry_after: Duration) -> Self {
        Self::new(ErrorKind::ServerBusy { retry_after }, message)
    }

    /// How long to wait before retrying, for SERVER_BUSY.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.kind {
            ErrorKind::ServerBusy { retry_after } => Some(retry_after),
            _ => None,
        }
    }

    /// The wire form shared by the gRPC API and the peer port.
    pub fn reason(&self) -> ErrorReason {
        match self.kind {
            ErrorKind::NotFound => ErrorReason::NotFound,
            ErrorKind::AlreadyExists => ErrorReason::AlreadyExists,
            ErrorKind::InvalidArgument => ErrorReason::InvalidArgument,
            ErrorKind::MessageTooLarge => ErrorReason::MessageTooLarge,
            ErrorKind::OutOfOrderSequence => ErrorReason::OutOfOrderSequence,
            ErrorKind::InvalidProducerEpoch => ErrorReason::InvalidProducerEpoch,
            ErrorKind::UnknownProducer => ErrorReason::UnknownProducer,
            ErrorKind::ReaderDisconnected => ErrorReason::ReaderDisconnected,
            ErrorKind::NotOwner => ErrorReason::NotOwner,
            ErrorKind::ServerBusy { .. } => ErrorReason::ServerBusy,
            ErrorKind::Unavailable => ErrorReason::Unavailable,
            ErrorKind::NotLeader { .. } => ErrorReason::NotLeader,
            ErrorKind::Unauthenticated | ErrorKind::Unauthorized => ErrorReason::Unauthorized,
            ErrorKind::QuotaExceeded => ErrorReason::QuotaExceeded,
            ErrorKind::Internal => ErrorReason::Internal,
        }
    }

    /// The `ErrorDetail` a gRPC status (client or peer port) carries.
    pub fn to_detail(&self) -> ErrorDetail {
        let (leader_node, leader_hint) = match &self.kind {
            ErrorKind::NotLeader { node, client_addr } => (
                node.map_or(0, |n| n.0),
                client_addr.clone().unwrap_or_default(),
            ),
            _ => (0, String::new()),
        };
        ErrorDetail {
            reason: self.reason() as i32,
            message: self.message.clone(),
            retry_after_ms: self.retry_after().map_or(0, |d| d.as_millis() as u64),
            leader_hint,
            leader_node,
        }
    }

    /// Reads the error back from a status (a peer's reply); a status without a detail is
    /// UNAVAILABLE with its message.
    pub fn from_status(status: &tonic::Status) -> Self {
        use prost::Message;
        match ErrorDetail::decode(status.details()) {
            Ok(detail) if !detail.message.is_empty() => Self::from_detail(detail),
            _ => Error::unavailable(status.message().to_string()),
        }
    }

    fn from_detail(detail: ErrorDetail) -> Self {
        let reason = ErrorReason::try_from(detail.reason).unwrap_or(ErrorReason::Unavailable);
        let kind = match reason {
            ErrorReason::NotFound => ErrorKind::NotFound,
            ErrorReason::AlreadyExists => ErrorKind::AlreadyExists,
            ErrorReason::InvalidArgument => ErrorKind::InvalidArgument,
            ErrorReason::MessageTooLarge => ErrorKind::MessageTooLarge,
            ErrorReason::OutOfOrderSequence => ErrorKind::OutOfOrderSequence,
            ErrorReason::InvalidProducerEpoch => ErrorKind::InvalidProducerEpoch,
            ErrorReason::UnknownProducer => ErrorKind::UnknownProducer,
            ErrorReason::ReaderDisconnected => ErrorKind::ReaderDisconnected,
            ErrorReason::NotOwner => ErrorKind::NotOwner,
            ErrorReason::ServerBusy => ErrorKind::ServerBusy {
                retry_after: Duration::from_millis(detail.retry_after_ms),
            },
            ErrorReason::NotLeader => ErrorKind::NotLeader {
                node: (detail.leader_node != 0).then_some(NodeId(detail.leader_node)),
                client_addr: (!detail.leader_hint.is_empty()).then_some(detail.leader_hint),
            },
            ErrorReason::Unauthorized => ErrorKind::Unauthorized,
            ErrorReason::QuotaExceeded => ErrorKind::QuotaExceeded,
            ErrorReason::Internal => ErrorKind::Internal,
            ErrorReason::Unavailable | ErrorReason::Unspecified => ErrorKind::Unavailable,
        };
        Error::new(kind, detail.message)
    }

    /// The controller command refusal this error is, if it is one (the peer port passes
    /// such refusals on as the command's own answer).
    pub fn as_command_error(&self) -> Option<CommandError> {
        let kind = match self.kind {
            ErrorKind::NotFound => CommandErrorKind::NotFound,
            ErrorKind::AlreadyExists => CommandErrorKind::AlreadyExists,
            ErrorKind::InvalidArgument => CommandErrorKind::InvalidArgument,
            ErrorKind::QuotaExceeded => CommandErrorKind::QuotaExceeded,
            ErrorKind::NotOwner => CommandErrorKind::NotOwner,
            _ => return None,
        };
        Some(CommandError {
            kind,
            message: self.message.clone(),
        })
    }
}

impl Error {
    /// The gRPC status code, on the client port and the peer port alike.
    pub fn code(&self) -> tonic::Code {
        match self.kind {
            ErrorKind::NotFound => tonic::Code::NotFound,
            ErrorKind::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorKind::InvalidArgument | ErrorKind::MessageTooLarge => tonic::Code::InvalidArgument,
            ErrorKind::OutOfOrderSequence
            | ErrorKind::InvalidProducerEpoch
            | ErrorKind::UnknownProducer
            | ErrorKind::ReaderDisconnected
            | ErrorKind::NotOwner
            | ErrorKind::NotLeader { .. } => tonic::Code::FailedPrecondition,
            ErrorKind::ServerBusy { .. } | ErrorKind::Unavailable => tonic::Code::Unavailable,
            ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
            ErrorKind::Unauthorized => tonic::Code::PermissionDenied,
            ErrorKind::QuotaExceeded => tonic::Code::ResourceExhausted,
            ErrorKind::Internal => tonic::Code::Internal,
        }
    }
}

/// The one mapping to a gRPC status: its code, the message, and an `ErrorDetail` with the
/// reason, retry time and leader the SDK acts on.
impl From<Error> for tonic::Status {
    fn from(err: Error) -> Self {
        use prost::Message;
        let detail = err.to_detail().encode_to_vec();
        tonic::Status::with_details(err.code(), err.message, detail.into())
    }
}

impl From<CommandError> for Error {
    fn from(err: CommandError) -> Self {
        let kind = match err.kind {
            CommandErrorKind::NotFound => ErrorKind::NotFound,
            CommandErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
            CommandErrorKind::InvalidArgument => ErrorKind::InvalidArgument,
            CommandErrorKind::QuotaExceeded => ErrorKind::QuotaExceeded,
            CommandErrorKind::NotOwner => ErrorKind::NotOwner,
        };
        Error::new(kind, err.message)
    }
}

impl Error {
    /// A partition's refusal. NOT_LEADER needs the cluster view to name the leader's client
    /// address, so `not_leader` makes it: callers go through
    /// [`Broker::partition_error`](crate::Broker::partition_error).
    pub(crate) fn from_partition(
        err: PartitionError,
        not_leader: impl FnOnce(Option<NodeId>) -> Error,
    ) -> Self {
        match err {
            PartitionError::NotLeader { leader } => not_leader(leader),
            PartitionError::Busy => Error::busy(
                "the partition has too many sends in flight. Please wait 1 seconds and try again",
                Duration::from_secs(1),
            ),
            PartitionError::NoLeader => Error::busy(
                "the partition is electing a leader. Please wait 1 seconds and try again",
                Duration::from_secs(1),
            ),
            // The replica stopped under the request: it moved to another node, or this node
            // is shutting down. Another node serves it. A send cut off this way may still be
            // committed by the other replicas, as after a lost connection.
            PartitionError::Closed => Error::unavailable(
                "the partition's replica on this node closed (it moved to another node, or the node is shutting down); a send in flight may or may not have been stored; retry",
            ),
            PartitionError::Position(p @ PositionError::Storage(_)) => {
                Error::internal(p.to_string())
            }
            PartitionError::Position(p) => Error::invalid(p.to_string()),
            PartitionError::Storage(s) => Error::internal(format!("storage failure: {s}")),
            e @ PartitionError::OutOfOrder { .. } => {
                Error::new(ErrorKind::OutOfOrderSequence, e.to_string())
            }
            e @ PartitionError::StaleProducerEpoch { .. } => {
                Error::new(ErrorKind::InvalidProducerEpoch, e.to_string())
            }
            e @ PartitionError::UnknownProducer { .. } => {
                Error::new(ErrorKind::UnknownProducer, e.to_string())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_crosses_the_peer_port_unchanged() {
        let kinds = [
            ErrorKind::NotFound,
            ErrorKind::AlreadyExists,
            ErrorKind::InvalidArgument,
            ErrorKind::MessageTooLarge,
            ErrorKind::OutOfOrderSequence,
            ErrorKind::InvalidProducerEpoch,
            ErrorKind::UnknownProducer,
            ErrorKind::ReaderDisconnected,
            ErrorKind::NotOwner,
            ErrorKind::ServerBusy {
                retry_after: Duration::from_millis(1500),
            },
            ErrorKind::Unavailable,
            ErrorKind::NotLeader {
                node: Some(NodeId(3)),
                client_addr: Some("10.0.0.3:7400".into()),
            },
            ErrorKind::NotLeader {
                node: None,
                client_addr: None,
            },
            ErrorKind::Unauthorized,
            ErrorKind::QuotaExceeded,
            ErrorKind::Internal,
        ];
        for kind in kinds {
            let err = Error::new(kind, "what to do");
            let status = tonic::Status::with_details(
                tonic::Code::Unknown,
                "x",
                prost::Message::encode_to_vec(&err.to_detail()).into(),
            );
            assert_eq!(Error::from_status(&status), err);
        }
    }

    #[test]
    fn command_refusals_round_trip() {
        let refusal = CommandError {
            kind: CommandErrorKind::NotOwner,
            message: "owned by b".into(),
        };
        assert_eq!(
            Error::from(refusal.clone()).as_command_error(),
            Some(refusal)
        );
        assert_eq!(Error::unavailable("no").as_command_error(), None);
    }
}
