//! What a connection asks of the rest of the node: SASL PLAIN credentials, tokens, the
//! properties of hubs and partitions, sends and reads. The node implements [`Backend`] over
//! the broker; the tests implement it with fixed answers.

use futures::future::BoxFuture;
use tokio::sync::mpsc;

use super::event::{AmqpEvent, StoredEvent};
use super::position::StartPosition;
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

    /// Appends `events` (one delivery: an event or a batch) to a partition of `hub` and
    /// resolves once they are committed, or refuses them all.
    ///
    /// The connection keeps serving other links while the future is pending, so it owns
    /// what it needs (`'static`). The call is the hand-off: a link's sends are called in
    /// the order they arrived, so an implementation that must keep that order takes its
    /// place in line (such as a partition's mailbox) before returning the future.
    fn send(
        &self,
        grant: &TokenGrant,
        hub: &str,
        target: SendTarget,
        events: Vec<AmqpEvent>,
    ) -> BackendFuture<'static, SendOutcome>;

    /// Opens a reader on a partition for a consumer group (checking owner level and the
    /// reader limit, SPEC §3). The stream then carries the partition's events from
    /// `request.start` on, in order, until it ends with an error (such as
    /// [`BackendErrorKind::LinkStolen`]); the connection drops the stream when the link
    /// goes, which must release the reader.
    fn read(&self, grant: &TokenGrant, request: ReadRequest)
    -> BackendFuture<'static, EventStream>;
}

/// Where a send goes (SPEC §2): key and partition id are exclusive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendTarget {
    /// Neither: the service picks a partition.
    RoundRobin,
    /// `x-opt-partition-key`, hashed to a partition.
    PartitionKey(String),
    /// A `<hub>/Partitions/<id>` link.
    PartitionId(String),
}

/// Where a committed send landed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendOutcome {
    pub partition_id: String,
    /// The sequence number of the delivery's first event.
    pub first_sequence_number: tributary_types::SequenceNumber,
}

/// A receiver link's reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadRequest {
    pub hub: String,
    pub consumer_group: String,
    pub partition: String,
    pub start: StartPosition,
    /// `com.microsoft:epoch`: an epoch reader displaces readers of a lower or equal level.
    pub owner_level: Option<i64>,
    /// `com.microsoft:receiver-name`, for the texts of stolen-link and quota errors.
    pub receiver_name: Option<String>,
}

/// One step of an [`EventStream`]: events in partition order, or why the reader ended.
pub type EventBatch = Result<Vec<StoredEvent>, BackendError>;

/// The events of an open reader: a bounded channel the backend fills. The connection takes
/// a batch only while the link has credit for more, so a slow client slows its reader and
/// holds no more than one batch beyond its credit.
#[derive(Debug)]
pub struct EventStream {
    receiver: mpsc::Receiver<EventBatch>,
}

impl EventStream {
    pub fn new(receiver: mpsc::Receiver<EventBatch>) -> EventStream {
        EventStream { receiver }
    }

    /// A stream and the sender the backend fills, holding up to `capacity` batches.
    pub fn channel(capacity: usize) -> (mpsc::Sender<EventBatch>, EventStream) {
        let (sender, receiver) = mpsc::channel(capacity);
        (sender, EventStream::new(receiver))
    }

    pub(crate) fn poll_next(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<EventBatch>> {
        self.receiver.poll_recv(cx)
    }
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
    /// What the backend needs to act on the grant's behalf later (such as the token
    /// itself, presented again with every call the grant authorizes); empty when nothing.
    pub credential: String,
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
    /// 408: the commit did not come in time.
    Timeout,
    /// 410: a reader displaced by one of a higher (or equal) owner level.
    LinkStolen,
    /// 413: an event or batch above the size limit.
    MessageSizeExceeded,
    /// 400: a position past the end of the partition.
    ArgumentOutOfRange,
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

    /// The AMQP error a rejected delivery or a detach carries.
    pub fn to_amqp_error(&self) -> crate::delivery_state::AmqpError {
        crate::delivery_state::AmqpError::new(self.kind.condition(), self.description.clone())
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
            BackendErrorKind::Timeout => 408,
            BackendErrorKind::LinkStolen => 410,
            BackendErrorKind::MessageSizeExceeded => 413,
            BackendErrorKind::ArgumentOutOfRange => 400,
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
            BackendErrorKind::Timeout => condition::TIMEOUT,
            BackendErrorKind::LinkStolen => condition::LINK_STOLEN,
            BackendErrorKind::MessageSizeExceeded => condition::MESSAGE_SIZE_EXCEEDED,
            BackendErrorKind::ArgumentOutOfRange => condition::ARGUMENT_OUT_OF_RANGE,
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
            (BackendErrorKind::Timeout, 408, "com.microsoft:timeout"),
            (BackendErrorKind::LinkStolen, 410, "amqp:link:stolen"),
            (
                BackendErrorKind::MessageSizeExceeded,
                413,
                "amqp:link:message-size-exceeded",
            ),
            (
                BackendErrorKind::ArgumentOutOfRange,
                400,
                "com.microsoft:argument-out-of-range",
            ),
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
