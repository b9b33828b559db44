//! The node's [`Backend`]: every AMQP call made on the broker's `Service`, from any node
//! (sends, reads and partition properties go to the partition's leader over the peer
//! port; a reader follows leadership changes).
//!
//! Credentials: a `$cbs` token is checked when it is put and kept in its grant, then
//! presented again with every call the grant authorizes, so the broker checks each call as
//! it checks the gRPC API's. SASL PLAIN (a namespace rule's name and key) becomes a token
//! this backend signs with that key, which stops working when the key is rotated.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tributary_broker::service::{
    self, EventRecord, Position, Property, ReadBatch, SendRequest, Target,
};
use tributary_broker::{Credential, Error, ErrorKind, Service};
use tributary_forward::AnyNode;
use tributary_types::{Clock, Offset, SequenceNumber};

use crate::server::{
    AmqpEvent, Backend, BackendError, BackendErrorKind, BackendFuture, EventBatch, EventProperty,
    EventRecordParts, EventStream, HubProperties, LastEnqueued, PartitionProperties, ReadRequest,
    Rights, SendOutcome, SendTarget, StartPosition, StoredEvent, TokenGrant,
};
use crate::server::{JWT_TOKEN_TYPE, SAS_TOKEN_TYPE};

/// A SASL PLAIN credential's token lasts this long (it is re-signed per connection; key
/// rotation ends it sooner, since every call checks it).
const PLAIN_TOKEN_LIFETIME_S: u64 = 10 * 365 * 24 * 3600;
/// The resource a SASL PLAIN token names: the namespace, on any host.
const PLAIN_TOKEN_RESOURCE: &str = "sb://tributary/";
/// Batches buffered between the broker's reader and the connection.
const READER_BATCHES: usize = 2;

/// The [`Backend`] over the broker's [`Service`], from any node.
pub struct BrokerBackend {
    service: Service,
    any_node: AnyNode,
    clock: Arc<dyn Clock>,
}

impl BrokerBackend {
    pub fn new(service: Service, clock: Arc<dyn Clock>) -> BrokerBackend {
        BrokerBackend {
            any_node: AnyNode::new(service.clone()),
            service,
            clock,
        }
    }

    /// Checks a token for an entity (see [`audience_entity`]) and says what it grants until
    /// when.
    fn grant_for(&self, entity: &str, token: String) -> Result<TokenGrant, BackendError> {
        let credential = Credential::SasToken(token.clone());
        let rights = self
            .service
            .granted_rights(&credential, entity)
            .map_err(backend_error)?;
        let expires_at_unix_ms = if self.service.auth_enabled() {
            tributary_types::parse_token(&token)
                .map(|t| i64::try_from(t.expiry_unix_s()).unwrap_or(i64::MAX / 1000) * 1000)
                .map_err(|e| BackendError::unauthorized(e.to_string()))?
        } else {
            // Nothing is checked: the grant lasts as long as the connection.
            i64::MAX
        };
        let granted = |right| rights.grants(right);
        Ok(TokenGrant {
            rights: Rights {
                send: granted(tributary_types::Rights::SEND),
                listen: granted(tributary_types::Rights::LISTEN),
                manage: granted(tributary_types::Rights::MANAGE),
            },
            expires_at_unix_ms,
            credential: token,
        })
    }
}

fn credential(grant: &TokenGrant) -> Credential {
    if grant.credential.is_empty() {
        Credential::None
    } else {
        Credential::SasToken(grant.credential.clone())
    }
}

/// The entity an audience names: its path without scheme and host (`sb://host/hub/...`
/// gives `hub/...`; the namespace is empty).
fn audience_entity(audience: &str) -> &str {
    let path = match audience.split_once("://") {
        Some((_, rest)) => rest.split_once('/').map_or("", |(_, path)| path),
        None => audience,
    };
    path.trim_matches('/')
}

impl Backend for BrokerBackend {
    fn now_unix_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn sasl_plain<'a>(&'a self, user: &'a str, password: &'a str) -> BackendFuture<'a, TokenGrant> {
        Box::pin(async move {
            let now_s = u64::try_from(self.clock.now_ms() / 1000).unwrap_or(0);
            let token = tributary_types::sign(
                PLAIN_TOKEN_RESOURCE,
                user,
                password,
                now_s + PLAIN_TOKEN_LIFETIME_S,
            );
            self.grant_for("", token)
        })
    }

    fn put_token<'a>(
        &'a self,
        audience: &'a str,
        token_type: &'a str,
        token: &'a str,
    ) -> BackendFuture<'a, TokenGrant> {
        Box::pin(async move {
            if token_type == JWT_TOKEN_TYPE {
                return Err(BackendError::unauthorized(
                    "JSON web tokens are not accepted here: connect with a shared access \
                     key (a connection string with SharedAccessKeyName and SharedAccessKey) \
                     or a shared access signature",
                ));
            }
            if token_type != SAS_TOKEN_TYPE {
                return Err(BackendError::invalid_argument(format!(
                    "unknown token type '{token_type}': put a '{SAS_TOKEN_TYPE}' token"
                )));
            }
            self.grant_for(audience_entity(audience), token.to_string())
        })
    }

    fn hub_properties<'a>(
        &'a self,
        grant: &'a TokenGrant,
        hub: &'a str,
    ) -> BackendFuture<'a, HubProperties> {
        Box::pin(async move {
            let record = self
                .service
                .get_hub(&credential(grant), hub)
                .map_err(backend_error)?;
            Ok(HubProperties {
                name: record.name,
                created_at_unix_ms: record.created_at_ms,
                partition_ids: (0..record.partition_count).map(|p| p.to_string()).collect(),
            })
        })
    }

    fn partition_properties<'a>(
        &'a self,
        grant: &'a TokenGrant,
        hub: &'a str,
        partition: &'a str,
    ) -> BackendFuture<'a, PartitionProperties> {
        Box::pin(async move {
            let p = self
                .any_node
                .partition_properties(&credential(grant), hub, partition)
                .await
                .map_err(backend_error)?;
            Ok(PartitionProperties {
                hub: p.hub,
                partition_id: p.partition.0.to_string(),
                begin_sequence_number: p.begin_sequence.0,
                last_enqueued_sequence_number: p.last_enqueued_sequence.0,
                last_enqueued_offset: if p.is_empty {
                    "-1".to_string()
                } else {
                    p.last_enqueued_offset.0.to_string()
                },
                last_enqueued_time_unix_ms: if p.is_empty {
                    0
                } else {
                    p.last_enqueued_time_ms
                },
                is_empty: p.is_empty,
            })
        })
    }

    fn send(
        &self,
        grant: &TokenGrant,
        hub: &str,
        target: SendTarget,
        events: Vec<AmqpEvent>,
    ) -> BackendFuture<'static, SendOutcome> {
        let any_node = self.any_node.clone();
        let credential = credential(grant);
        let request = SendRequest {
            hub: hub.to_string(),
            target: match target {
                SendTarget::RoundRobin => Target::Any,
                SendTarget::PartitionKey(key) => Target::PartitionKey(key),
                SendTarget::PartitionId(id) => Target::PartitionId(id),
            },
            events: events.iter().map(|e| to_record(e.to_record())).collect(),
            producer: None,
        };
        Box::pin(async move {
            let reply = any_node
                .send(&credential, request)
                .await
                .map_err(backend_error)?;
            Ok(SendOutcome {
                partition_id: reply.partition.0.to_string(),
                first_sequence_number: reply.first_sequence,
            })
        })
    }

    fn read(
        &self,
        grant: &TokenGrant,
        request: ReadRequest,
    ) -> BackendFuture<'static, EventStream> {
        let any_node = self.any_node.clone();
        let credential = credential(grant);
        let request = service::ReadRequest {
            hub: request.hub,
            consumer_group: request.consumer_group,
            partition_id: request.partition,
            position: position(request.start),
            max_batch: 0,
            reader_name: request.receiver_name.unwrap_or_default(),
            owner_level: request.owner_level,
        };
        Box::pin(async move {
            let batches = any_node
                .read(&credential, request)
                .await
                .map_err(backend_error)?;
            let (sender, stream) = EventStream::channel(READER_BATCHES);
            tokio::spawn(pass_on(batches, sender));
            Ok(stream)
        })
    }
}

/// Turns the broker's batches into the connection's until either side goes.
async fn pass_on(
    mut batches: mpsc::Receiver<Result<ReadBatch, Error>>,
    sender: mpsc::Sender<EventBatch>,
) {
    loop {
        let batch = tokio::select! {
            batch = batches.recv() => batch,
            () = sender.closed() => return,
        };
        let Some(batch) = batch else { return };
        let failed = batch.is_err();
        let converted = batch.map(stored_events).map_err(backend_error);
        if sender.send(converted).await.is_err() || failed {
            return;
        }
    }
}

fn stored_events(batch: ReadBatch) -> Vec<StoredEvent> {
    let last_enqueued = LastEnqueued {
        sequence_number: batch.last_enqueued_sequence,
        offset: batch.last_enqueued_offset,
        enqueued_time_unix_ms: batch.last_enqueued_time_ms,
    };
    batch
        .events
        .into_iter()
        .map(|event| StoredEvent {
            sequence_number: SequenceNumber(event.sequence),
            offset: Offset(event.offset),
            enqueued_time_unix_ms: event.enqueued_time_ms,
            event: AmqpEvent::from_record(from_record(event.record)),
            last_enqueued,
        })
        .collect()
}

fn position(start: StartPosition) -> Position {
    match start {
        StartPosition::Earliest => Position::Earliest,
        StartPosition::Latest => Position::Latest,
        StartPosition::Offset { offset, inclusive } => Position::Offset {
            offset: offset.0,
            inclusive,
        },
        StartPosition::SequenceNumber {
            sequence_number,
            inclusive,
        } => Position::Sequence {
            sequence: sequence_number.0,
            inclusive,
        },
        StartPosition::EnqueuedTime { unix_ms, inclusive } => Position::EnqueuedTime {
            time_ms: unix_ms,
            inclusive,
        },
    }
}

fn to_record(parts: EventRecordParts) -> EventRecord {
    EventRecord {
        partition_key: parts.partition_key,
        properties: parts
            .properties
            .into_iter()
            .map(|(key, value)| {
                let value = match value {
                    EventProperty::String(v) => Property::String(v),
                    EventProperty::Int64(v) => Property::Int64(v),
                    EventProperty::Double(v) => Property::Double(v),
                    EventProperty::Bool(v) => Property::Bool(v),
                    EventProperty::Bytes(v) => Property::Bytes(v),
                    EventProperty::TimestampMs(v) => Property::TimestampMs(v),
                };
                (key, value)
            })
            .collect(),
        body: parts.body,
    }
}

fn from_record(record: EventRecord) -> EventRecordParts {
    EventRecordParts {
        partition_key: record.partition_key,
        properties: record
            .properties
            .into_iter()
            .map(|(key, value)| {
                let value = match value {
                    Property::String(v) => EventProperty::String(v),
                    Property::Int64(v) => EventProperty::Int64(v),
                    Property::Double(v) => EventProperty::Double(v),
                    Property::Bool(v) => EventProperty::Bool(v),
                    Property::Bytes(v) => EventProperty::Bytes(v),
                    Property::TimestampMs(v) => EventProperty::TimestampMs(v),
                };
                (key, value)
            })
            .collect(),
        body: Bytes::clone(&record.body),
    }
}

/// The broker's refusal as the AMQP condition the SDKs tell apart.
fn backend_error(err: Error) -> BackendError {
    let kind = match &err.kind {
        ErrorKind::NotFound => BackendErrorKind::NotFound,
        ErrorKind::InvalidArgument if err.message.starts_with("The supplied") => {
            BackendErrorKind::ArgumentOutOfRange
        }
        ErrorKind::AlreadyExists
        | ErrorKind::InvalidArgument
        | ErrorKind::OutOfOrderSequence
        | ErrorKind::InvalidProducerEpoch
        | ErrorKind::UnknownProducer
        | ErrorKind::NotOwner => BackendErrorKind::InvalidArgument,
        ErrorKind::MessageTooLarge => BackendErrorKind::MessageSizeExceeded,
        ErrorKind::ReaderDisconnected => BackendErrorKind::LinkStolen,
        ErrorKind::ServerBusy { .. } | ErrorKind::Unavailable | ErrorKind::NotLeader { .. } => {
            BackendErrorKind::ServerBusy
        }
        ErrorKind::Unauthenticated | ErrorKind::Unauthorized => BackendErrorKind::Unauthorized,
        ErrorKind::QuotaExceeded => BackendErrorKind::QuotaExceeded,
        ErrorKind::Internal => BackendErrorKind::Internal,
    };
    BackendError::new(kind, err.message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_audience_names_the_entity() {
        assert_eq!(audience_entity("sb://127.0.0.1:5672/orders"), "orders");
        assert_eq!(
            audience_entity("sb://ns.example.net/orders/consumergroups/$Default"),
            "orders/consumergroups/$Default"
        );
        assert_eq!(audience_entity("sb://ns.example.net/"), "");
        assert_eq!(audience_entity("sb://ns.example.net"), "");
        assert_eq!(
            audience_entity("Orders/Partitions/1"),
            "Orders/Partitions/1"
        );
    }

    #[test]
    fn records_cross_unchanged() {
        let parts = EventRecordParts {
            partition_key: Some("k".into()),
            properties: vec![
                ("s".into(), EventProperty::String("v".into())),
                ("i".into(), EventProperty::Int64(-3)),
                ("d".into(), EventProperty::Double(1.5)),
                ("b".into(), EventProperty::Bool(true)),
                (
                    "x".into(),
                    EventProperty::Bytes(Bytes::from_static(b"\x00\x01")),
                ),
                ("t".into(), EventProperty::TimestampMs(1_700_000_000_000)),
            ],
            body: Bytes::from_static(b"body"),
        };
        assert_eq!(from_record(to_record(parts.clone())), parts);
    }

    #[test]
    fn refusals_map_to_the_conditions_the_sdks_tell_apart() {
        let cases = [
            (ErrorKind::NotFound, "x", BackendErrorKind::NotFound),
            (
                ErrorKind::InvalidArgument,
                "The supplied sequence number '9' is invalid",
                BackendErrorKind::ArgumentOutOfRange,
            ),
            (
                ErrorKind::InvalidArgument,
                "bad",
                BackendErrorKind::InvalidArgument,
            ),
            (
                ErrorKind::MessageTooLarge,
                "x",
                BackendErrorKind::MessageSizeExceeded,
            ),
            (
                ErrorKind::ReaderDisconnected,
                "x",
                BackendErrorKind::LinkStolen,
            ),
            (
                ErrorKind::ServerBusy {
                    retry_after: std::time::Duration::from_secs(1),
                },
                "x",
                BackendErrorKind::ServerBusy,
            ),
            (ErrorKind::Unauthorized, "x", BackendErrorKind::Unauthorized),
            (
                ErrorKind::Unauthenticated,
                "x",
                BackendErrorKind::Unauthorized,
            ),
            (
                ErrorKind::QuotaExceeded,
                "x",
                BackendErrorKind::QuotaExceeded,
            ),
        ];
        for (kind, message, expected) in cases {
            assert_eq!(backend_error(Error::new(kind, message)).kind, expected);
        }
    }
}
