//! Errors as the client sees them: a gRPC status whose details carry an `ErrorDetail` with a
//! machine-readable reason and a message a person can act on.

use std::time::Duration;

use prost::Message;
use tributary_proto::{ErrorDetail, ErrorReason};

use crate::partition::PartitionError;
use crate::partition::position::PositionError;

#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct ApiError {
    pub reason: ErrorReason,
    pub message: String,
    pub retry_after: Option<Duration>,
    pub leader_hint: Option<String>,
}

impl ApiError {
    pub fn new(reason: ErrorReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            retry_after: None,
            leader_hint: None,
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorReason::NotFound, message)
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorReason::InvalidArgument, message)
    }

    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(ErrorReason::AlreadyExists, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorReason::Internal, message)
    }

    pub fn busy(message: impl Into<String>, retry_after: Duration) -> Self {
        Self {
            retry_after: Some(retry_after),
            ..Self::new(ErrorReason::ServerBusy, message)
        }
    }

    /// Reads the reason and message back from a status (a peer's reply).
    pub fn from_status(status: &tonic::Status) -> Self {
        use prost::Message;
        match ErrorDetail::decode(status.details()) {
            Ok(detail) if !detail.message.is_empty() => ApiError {
                reason: ErrorReason::try_from(detail.reason).unwrap_or(ErrorReason::Unavailable),
                message: detail.message,
                retry_after: (detail.retry_after_ms > 0)
                    .then(|| Duration::from_millis(detail.retry_after_ms)),
                leader_hint: (!detail.leader_hint.is_empty()).then_some(detail.leader_hint),
            },
            _ => ApiError::new(ErrorReason::Unavailable, status.message().to_string()),
        }
    }

    fn code(&self) -> tonic::Code {
        match self.reason {
            ErrorReason::NotFound => tonic::Code::NotFound,
            ErrorReason::AlreadyExists => tonic::Code::AlreadyExists,
            ErrorReason::InvalidArgument | ErrorReason::MessageTooLarge => {
                tonic::Code::InvalidArgument
            }
            ErrorReason::OutOfOrderSequence
            | ErrorReason::ReaderDisconnected
            | ErrorReason::NotOwner => tonic::Code::FailedPrecondition,
            ErrorReason::ServerBusy | ErrorReason::Unavailable => tonic::Code::Unavailable,
            ErrorReason::NotLeader => tonic::Code::FailedPrecondition,
            ErrorReason::Unauthorized => tonic::Code::PermissionDenied,
            ErrorReason::QuotaExceeded => tonic::Code::ResourceExhausted,
            ErrorReason::Internal | ErrorReason::Unspecified => tonic::Code::Internal,
        }
    }
}

impl From<ApiError> for tonic::Status {
    fn from(err: ApiError) -> Self {
        let detail = ErrorDetail {
            reason: err.reason as i32,
            message: err.message.clone(),
            retry_after_ms: err.retry_after.map_or(0, |d| d.as_millis() as u64),
            leader_hint: err.leader_hint.clone().unwrap_or_default(),
        };
        tonic::Status::with_details(err.code(), err.message, detail.encode_to_vec().into())
    }
}

impl From<crate::controller::state::CommandError> for ApiError {
    fn from(err: crate::controller::state::CommandError) -> Self {
        ApiError::new(err.kind.reason(), err.message)
    }
}

impl From<PartitionError> for ApiError {
    fn from(err: PartitionError) -> Self {
        match err {
            PartitionError::NotLeader { leader } => ApiError {
                leader_hint: leader.map(|l| l.to_string()),
                ..ApiError::new(
                    ErrorReason::NotLeader,
                    format!("this node does not lead the partition (leader: {leader:?})"),
                )
            },
            PartitionError::Busy => ApiError::busy(
                "the partition has too many sends in flight. Please wait 1 seconds and try again",
                Duration::from_secs(1),
            ),
            PartitionError::NoLeader => ApiError::busy(
                "the partition is electing a leader. Please wait 1 seconds and try again",
                Duration::from_secs(1),
            ),
            // The replica stopped under the request: it moved to another node, or this node
            // is shutting down. Another node serves it. A send cut off this way may still be
            // committed by the other replicas, as after a lost connection.
            PartitionError::Closed => ApiError::new(
                ErrorReason::Unavailable,
                "the partition's replica on this node closed (it moved to another node, or the node is shutting down); a send in flight may or may not have been stored; retry",
            ),
            PartitionError::Position(p @ PositionError::Storage(_)) => {
                ApiError::internal(p.to_string())
            }
            PartitionError::Position(p) => ApiError::invalid(p.to_string()),
            PartitionError::Storage(s) => ApiError::internal(format!("storage failure: {s}")),
            e @ PartitionError::OutOfOrder { .. } => {
                ApiError::new(ErrorReason::OutOfOrderSequence, e.to_string())
            }
        }
    }
}
