//! Azure's error answers: a status, an `x-ms-error-code`, and (except for HEAD) an
//! `application/xml` body with both `Code` and `Message`, which .NET needs to see the code.

use hyper::StatusCode;
use tributary_broker::error::{Error, ErrorKind};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl BlobError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        BlobError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn invalid_uri(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "InvalidUri", message)
    }

    pub fn invalid_header(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "InvalidHeaderValue", message)
    }

    pub fn invalid_name(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "InvalidResourceName", message)
    }

    pub fn invalid_query(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "InvalidQueryParameterValue",
            message,
        )
    }

    pub fn authentication(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "AuthenticationFailed", message)
    }

    pub fn blob_not_found() -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "BlobNotFound",
            "The specified blob does not exist.",
        )
    }

    pub fn condition_not_met() -> Self {
        Self::new(
            StatusCode::PRECONDITION_FAILED,
            "ConditionNotMet",
            "The condition specified using HTTP conditional header(s) is not met.",
        )
    }

    pub fn blob_exists() -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "BlobAlreadyExists",
            "The specified blob already exists.",
        )
    }

    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "UnsupportedHttpVerb",
            message,
        )
    }
}

impl From<Error> for BlobError {
    fn from(error: Error) -> Self {
        let (status, code) = match error.kind {
            ErrorKind::Unauthenticated => (StatusCode::FORBIDDEN, "AuthenticationFailed"),
            ErrorKind::Unauthorized => (StatusCode::FORBIDDEN, "AuthorizationPermissionMismatch"),
            ErrorKind::NotFound => (StatusCode::NOT_FOUND, "ResourceNotFound"),
            ErrorKind::InvalidArgument | ErrorKind::MessageTooLarge => {
                (StatusCode::BAD_REQUEST, "InvalidInput")
            }
            ErrorKind::Internal => (StatusCode::INTERNAL_SERVER_ERROR, "InternalError"),
            // Not led here, electing, throttled, quota: the SDK retries 503s.
            _ => (StatusCode::SERVICE_UNAVAILABLE, "ServerBusy"),
        };
        BlobError::new(status, code, error.message)
    }
}
