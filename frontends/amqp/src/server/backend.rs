//! What a connection asks of the rest of the node: SASL PLAIN credentials, tokens, and the
//! properties of hubs and partitions. The node implements [`Backend`] over the broker; the
//! tests implement it with fixed answers.

use futures::future::BoxFuture;

use crate::delivery_state::condition;

/// A boxed future of a backend answer: `async fn` in a trait object needs a box, and the
/// workspace boxes futures by hand rather than with a macro.
pub type BackendFuture<'a, T> = BoxFuture<'a, Result<T, BackendError>>;

/// The services an AMQP connection calls. Every method may refuse with a [`BackendError`],
/// which the connection turns into a SASL outcome, a status code or an AMQP error.
pub trait Backend: Send + Sync + 'static {
    /// Wall-clock time, milliseconds since the Unix epoch: injected so tests drive token
    /// expiry.
    fn now_unix_ms(&self) -> i64;

    /// SASL PLAIN: `user` is a shared-access rule name and `password` its key. The grant
    /// covers the whole namespace (generic AMQP clients do no CBS).
    fn sasl_plain<'a>(&'a self, user: &'a str, password: &'a str) -> BackendFuture<'a, TokenGrant>;

    /// Verifies a CBS token (`token_type` `servicebus.windows.net:sastoken` or `jwt`) for
    /// `audience` (such as `sb://host/hub`) and says what it grants until when.
    fn put_token<'a>(
        &'a self,
        audience: &'a str,
        token_type: &'a str,
        token: &'a str,
    ) -> BackendFuture<'a, TokenGrant>;

    /// The `$management` READ of `com.microsoft:eventhub`.
    fn hub_properties<'a>(
        &'a self,
        grant: &'a TokenGrant,
        hub: &'a str,
    ) -> BackendFuture<'a, HubProperties>;

    /// The `$management` READ of `com.microsoft:partition`.
    fn partition_properties<'a>(
        &'a self,
        grant: &'a TokenGrant,
        hub: &'a str,
        partition: &'a str,
    ) -> BackendFuture<'a, PartitionProperties>;
}

/// The shared-access rights a token or rule grants (SPEC §6; Manage implies both others).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rights {
    pub send: bool,
    pub listen: bool,
    pub manage: bool,
}

/// What an accepted token grants, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenGrant {
    pub rights: Rights,
    /// Milliseconds since the Unix epoch; links authorized by the grant are detached then.
    pub expires_at_unix_ms: i64,
}

/// The answer to a READ of `com.microsoft:eventhub`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubProperties {
    pub name: String,
    pub created_at_unix_ms: i64,
    pub partition_ids: Vec<String>,
}

/// The answer to a READ of `com.microsoft:partition`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionProperties {
    pub hub: String,
    pub partition_id: String,
    pub begin_sequence_number: i64,
    /// −1 when the partition is empty.
    pub last_enqueued_sequence_number: i64,
    /// The decimal offset of the last event (Event Hubs sends offsets as strings).
    pub last_enqueued_offset: String,
    /// 0 when the partition is empty.
    pub last_enqueued_time_unix_ms: i64,
    pub is_empty: bool,
}

/// Why the backend refused, with text a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {description}")]
pub struct BackendError {
    pub kind: BackendErrorKind,
    pub description: String,
}

/// The kinds of refusal the SDKs tell apart (WIRE-PROTOCOLS A7, A10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum BackendErrorKind {
    /// 400: a malformed request.
    InvalidArgument,
    /// 401: a bad, expired or missing token, or a missing right.
    Unauthorized,
    /// 403: a quota is exceeded.
    QuotaExceeded,
    /// 404: no such hub, consumer group or partition.
    NotFound,
    /// 500: a bug.
    Internal,
    /// 503: overloaded or not ready; the client backs off and retries.
    ServerBusy,
}

impl BackendError {
    pub fn new(kind: BackendErrorKind, description: impl Into<String>) -> BackendError {
        BackendError {
            kind,
            description: description.into(),
        }
    }

    pub fn unauthorized(description: impl Into<String>) -> BackendError {
        BackendError::new(BackendErrorKind::Unauthorized, description)
    }

    pub fn not_found(description: impl Into<String>) -> BackendError {
        BackendError::new(BackendErrorKind::NotFound, description)
    }

    pub fn invalid_argument(description: impl Into<String>) -> BackendError {
        BackendError::new(BackendErrorKind::InvalidArgument, description)
    }
}

impl BackendErrorKind {
    /// The HTTP-like status code of a `$cbs` or `$management` reply.
    pub fn status_code(self) -> i32 {
        match self {
            BackendErrorKind::InvalidArgument => 400,
            BackendErrorKind::Unauthorized => 401,
            BackendErrorKind::QuotaExceeded => 403,
            BackendErrorKind::NotFound => 404,
            BackendErrorKind::Internal => 500,
            BackendErrorKind::ServerBusy => 503,
        }
    }

    /// The AMQP error condition, as .NET's `AmqpError.StatusCodeMap` pairs it with the code.
    pub fn condition(self) -> &'static str {
        match self {
            BackendErrorKind::InvalidArgument => condition::ARGUMENT_ERROR,
            BackendErrorKind::Unauthorized => condition::UNAUTHORIZED_ACCESS,
            BackendErrorKind::QuotaExceeded => condition::RESOURCE_LIMIT_EXCEEDED,
            BackendErrorKind::NotFound => condition::NOT_FOUND,
            BackendErrorKind::Internal => condition::INTERNAL_ERROR,
            BackendErrorKind::ServerBusy => condition::SERVER_BUSY,
        }
    }
}

impl Rights {
    /// Manage, which implies Send and Listen.
    pub const MANAGE: Rights = Rights {
        send: true,
        listen: true,
        manage: true,
    };

    /// True when these rights include `needed`, counting Manage as both others.
    pub fn allow(self, needed: Right) -> bool {
        match needed {
            Right::Send => self.send || self.manage,
            Right::Listen => self.listen || self.manage,
            Right::Manage => self.manage,
            Right::ManageOrListen => self.manage || self.listen,
        }
    }
}

/// A right an operation needs (WIRE-PROTOCOLS A6 "Claims").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Right {
    Send,
    Listen,
    Manage,
    /// `$management` reads.
    ManageOrListen,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_map_to_the_status_codes_and_conditions_of_a7() {
        let table = [
            (
                BackendErrorKind::InvalidArgument,
                400,
                "com.microsoft:argument-error",
            ),
            (
                BackendErrorKind::Unauthorized,
                401,
                "amqp:unauthorized-access",
            ),
            (
                BackendErrorKind::QuotaExceeded,
                403,
                "amqp:resource-limit-exceeded",
            ),
            (BackendErrorKind::NotFound, 404, "amqp:not-found"),
            (BackendErrorKind::Internal, 500, "amqp:internal-error"),
            (
                BackendErrorKind::ServerBusy,
                503,
                "com.microsoft:server-busy",
            ),
        ];
        for (kind, code, condition) in table {
            assert_eq!((kind.status_code(), kind.condition()), (code, condition));
        }
    }

    #[test]
    fn manage_implies_send_and_listen() {
        let listen = Rights {
            listen: true,
            ..Rights::default()
        };
        assert!(listen.allow(Right::Listen) && listen.allow(Right::ManageOrListen));
        assert!(!listen.allow(Right::Send) && !listen.allow(Right::Manage));
        for right in [
            Right::Send,
            Right::Listen,
            Right::Manage,
            Right::ManageOrListen,
        ] {
            assert!(Rights::MANAGE.allow(right));
            assert!(!Rights::default().allow(right));
        }
    }
}
