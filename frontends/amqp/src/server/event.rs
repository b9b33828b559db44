//! Events as the AMQP front end hands them to the backend and gets them back: a published
//! delivery split into [`AmqpEvent`]s (WIRE-PROTOCOLS A8), and a [`StoredEvent`] turned into
//! the message a receiver gets (A9). Pure.
//!
//! What a published message keeps, section by section:
//!
//! | section | kept as |
//! | --- | --- |
//! | header | [`AmqpEvent::header`] |
//! | delivery-annotations, footer | dropped (they belong to one hop) |
//! | message-annotations | `x-opt-partition-key` becomes [`AmqpEvent::partition_key`]; the other system annotations ([`SYSTEM_ANNOTATIONS`]) are dropped (the broker stamps them); the rest are kept in [`AmqpEvent::message_annotations`] |
//! | properties | [`AmqpEvent::properties`] |
//! | application-properties | [`AmqpEvent::application_properties`], typed |
//! | data sections | concatenated into [`EventBody::Data`] (what every other front end sees) |
//! | amqp-value, amqp-sequence, no body | [`EventBody::Amqp`], the encoded body sections |
//!
//! A delivered event is that message again, with the system annotations of its place in
//! the partition. How the node stores an `AmqpEvent` in the broker's record is in
//! `record.rs`.

use bytes::{Bytes, BytesMut};
use tributary_types::{Offset, SequenceNumber};

use crate::delivery_state::{AmqpError, condition};
use crate::message::{
    ApplicationProperties, BATCH_MESSAGE_FORMAT, Body, Header, Message, Properties, split_batch,
};
use crate::types::{Map, Value};

pub const PARTITION_KEY_ANNOTATION: &str = "x-opt-partition-key";
pub const SEQUENCE_NUMBER_ANNOTATION: &str = "x-opt-sequence-number";
pub const OFFSET_ANNOTATION: &str = "x-opt-offset";
pub const ENQUEUED_TIME_ANNOTATION: &str = "x-opt-enqueued-time";

/// The message annotations the broker owns: a publisher's values are not kept.
pub const SYSTEM_ANNOTATIONS: [&str; 4] = [
    PARTITION_KEY_ANNOTATION,
    SEQUENCE_NUMBER_ANNOTATION,
    OFFSET_ANNOTATION,
    ENQUEUED_TIME_ANNOTATION,
];

/// One event as published over AMQP, without what the broker assigns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AmqpEvent {
    /// `x-opt-partition-key` of the delivery (envelope or event).
    pub partition_key: Option<String>,
    pub header: Option<Header>,
    /// The publisher's message annotations other than [`SYSTEM_ANNOTATIONS`], in order.
    pub message_annotations: Map,
    /// The AMQP properties section (message-id, content-type, …).
    pub properties: Option<Properties>,
    /// Application properties with their AMQP types, in order (an empty section is not
    /// kept).
    pub application_properties: ApplicationProperties,
    pub body: EventBody,
}

/// An event's body.
#[derive(Debug, Clone, PartialEq)]
pub enum EventBody {
    /// The data sections, concatenated: delivered back as one data section.
    Data(Bytes),
    /// An amqp-value or amqp-sequence body, kept as its encoded sections; empty for a
    /// message without a body section.
    Amqp(Bytes),
}

/// An event the backend read from a partition, with its place there.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub sequence_number: SequenceNumber,
    pub offset: Offset,
    pub enqueued_time_unix_ms: i64,
    pub event: AmqpEvent,
    /// The partition's last event when this one was read, for the runtime metric.
    pub last_enqueued: LastEnqueued,
}

/// The last event of a partition (delivery annotations of the runtime metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastEnqueued {
    pub sequence_number: SequenceNumber,
    pub offset: Offset,
    pub enqueued_time_unix_ms: i64,
}

/// The events of one delivery and the key they were sent with.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Publication {
    pub(crate) partition_key: Option<String>,
    pub(crate) events: Vec<AmqpEvent>,
}

impl Default for EventBody {
    fn default() -> EventBody {
        EventBody::Data(Bytes::new())
    }
}

impl AmqpEvent {
    /// The event of one message (a bare event or a batch's inner message).
    pub fn from_message(message: Message, partition_key: Option<String>) -> AmqpEvent {
        let message_annotations = message
            .message_annotations
            .unwrap_or_default()
            .into_iter()
            .filter(|(key, _)| {
                !key.as_str()
                    .is_some_and(|k| SYSTEM_ANNOTATIONS.contains(&k))
            })
            .collect();
        AmqpEvent {
            partition_key,
            header: message.header,
            message_annotations,
            properties: message.properties,
            application_properties: message.application_properties.unwrap_or_default(),
            body: EventBody::from_body(message.body),
        }
    }

    /// The message that carries the event: its sections, and `x-opt-partition-key` first
    /// among the annotations when it has a key.
    pub fn to_message(&self) -> Message {
        let mut annotations = Map::new();
        if let Some(key) = &self.partition_key {
            annotations.push((
                Value::symbol(PARTITION_KEY_ANNOTATION),
                Value::String(key.clone()),
            ));
        }
        annotations.extend(self.message_annotations.iter().cloned());
        Message {
            header: self.header.clone(),
            delivery_annotations: None,
            message_annotations: (!annotations.is_empty()).then_some(annotations),
            properties: self.properties.clone(),
            application_properties: (!self.application_properties.is_empty())
                .then(|| self.application_properties.clone()),
            body: self.body.to_body(),
            footer: None,
        }
    }
}

impl EventBody {
    fn from_body(body: Body) -> EventBody {
        match body {
            Body::Data(mut sections) if sections.len() == 1 => {
                EventBody::Data(sections.pop().unwrap_or_default())
            }
            Body::Data(sections) => {
                let mut joined = BytesMut::new();
                for section in sections {
                    joined.extend_from_slice(&section);
                }
                EventBody::Data(joined.freeze())
            }
            Body::Empty => EventBody::Amqp(Bytes::new()),
            body @ (Body::Value(_) | Body::Sequence(_)) => EventBody::Amqp(
                Message {
                    body,
                    ..Message::default()
                }
                .to_bytes(),
            ),
        }
    }

    fn to_body(&self) -> Body {
        match self {
            EventBody::Data(bytes) => Body::Data(vec![bytes.clone()]),
            // Written by `from_body`; sections that no longer decode (a stored record changed
            // under us) are delivered without a body rather than failing the link.
            EventBody::Amqp(sections) => Message::decode(sections.clone())
                .map(|m| m.body)
                .unwrap_or_default(),
        }
    }

    /// The bytes the broker stores as the record's body.
    pub fn bytes(&self) -> &Bytes {
        match self {
            EventBody::Data(bytes) | EventBody::Amqp(bytes) => bytes,
        }
    }
}

/// Splits a complete delivery into events: one for message-format 0, one per inner message
/// for an Event Hubs batch (0x80013700). The partition key is the envelope's; every inner
/// key must equal it (or, without one on the envelope, each other).
pub(crate) fn publication(payload: Bytes, message_format: u32) -> Result<Publication, AmqpError> {
    let decode_error = |error: crate::CodecError| {
        AmqpError::new(
            condition::DECODE_ERROR,
            format!("the message does not decode: {error}"),
        )
    };
    let message = Message::decode(payload).map_err(decode_error)?;
    let envelope_key = partition_key(&message)?;
    match message_format {
        0 => Ok(Publication {
            events: vec![AmqpEvent::from_message(message, envelope_key.clone())],
            partition_key: envelope_key,
        }),
        BATCH_MESSAGE_FORMAT => {
            let inner = split_batch(&message).map_err(decode_error)?;
            let keys = inner
                .iter()
                .map(partition_key)
                .collect::<Result<Vec<_>, _>>()?;
            let consistent = match &envelope_key {
                Some(envelope_key) => keys
                    .iter()
                    .all(|key| key.as_ref().is_none_or(|key| key == envelope_key)),
                None => keys.windows(2).all(|pair| pair[0] == pair[1]),
            };
            if !consistent {
                return Err(AmqpError::new(
                    condition::ARGUMENT_ERROR,
                    "the events of a batch carry different partition keys",
                ));
            }
            let batch_key = envelope_key.or_else(|| keys.into_iter().next().flatten());
            Ok(Publication {
                events: inner
                    .into_iter()
                    .map(|m| AmqpEvent::from_message(m, batch_key.clone()))
                    .collect(),
                partition_key: batch_key,
            })
        }
        other => Err(AmqpError::new(
            condition::ARGUMENT_ERROR,
            format!("message-format {other:#x} is neither 0 (an event) nor 0x80013700 (a batch)"),
        )),
    }
}

/// `x-opt-partition-key` of a message: a string (or symbol), or absent.
fn partition_key(message: &Message) -> Result<Option<String>, AmqpError> {
    let value = message
        .message_annotations
        .iter()
        .flatten()
        .find(|(k, _)| k.as_str() == Some(PARTITION_KEY_ANNOTATION))
        .map(|(_, v)| v);
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(value) => value
            .as_str()
            .map(|key| Some(key.to_owned()))
            .ok_or_else(|| {
                AmqpError::new(
                    condition::ARGUMENT_ERROR,
                    format!(
                        "{PARTITION_KEY_ANNOTATION} must be a string, not a {}",
                        value.kind().name()
                    ),
                )
            }),
    }
}

/// The message a receiver gets for a stored event: `x-opt-sequence-number` (long),
/// `x-opt-offset` (decimal string), `x-opt-enqueued-time` (timestamp) and
/// `x-opt-partition-key` (string, when set) before the publisher's annotations; with
/// `runtime_metric_at_unix_ms`, the runtime metric's delivery annotations.
pub(crate) fn delivered_message(
    stored: &StoredEvent,
    runtime_metric_at_unix_ms: Option<i64>,
) -> Message {
    let mut message = stored.event.to_message();
    let mut annotations = vec![
        (
            Value::symbol(SEQUENCE_NUMBER_ANNOTATION),
            Value::Long(stored.sequence_number.0),
        ),
        (
            Value::symbol(OFFSET_ANNOTATION),
            Value::String(stored.offset.0.to_string()),
        ),
        (
            Value::symbol(ENQUEUED_TIME_ANNOTATION),
            Value::Timestamp(stored.enqueued_time_unix_ms),
        ),
    ];
    annotations.extend(message.message_annotations.take().unwrap_or_default());
    message.message_annotations = Some(annotations);
    if let Some(now_unix_ms) = runtime_metric_at_unix_ms {
        let last = &stored.last_enqueued;
        message.delivery_annotations = Some(vec![
            (
                Value::symbol("last_enqueued_sequence_number"),
                Value::Long(last.sequence_number.0),
            ),
            (
                Value::symbol("last_enqueued_offset"),
                Value::String(last.offset.0.to_string()),
            ),
            (
                Value::symbol("last_enqueued_time_utc"),
                Value::Timestamp(last.enqueued_time_unix_ms),
            ),
            (
                Value::symbol("runtime_info_retrieval_time_utc"),
                Value::Timestamp(now_unix_ms),
            ),
        ]);
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::build_batch;

    fn keyed(key: Option<&str>, body: &'static [u8]) -> Message {
        Message {
            message_annotations: key.map(|k| {
                vec![(
                    Value::symbol(PARTITION_KEY_ANNOTATION),
                    Value::String(k.into()),
                )]
            }),
            ..Message::with_data(Bytes::from_static(body))
        }
    }

    fn batch(envelope_key: Option<&str>, keys: &[Option<&str>]) -> Bytes {
        let events: Vec<Message> = keys.iter().map(|k| keyed(*k, b"e")).collect();
        build_batch(keyed(envelope_key, b""), &events).to_bytes()
    }

    #[test]
    fn batch_keys_must_agree() {
        let key = |p: Result<Publication, AmqpError>| p.map(|p| p.partition_key);
        let k = Some("k".to_owned());
        let cases = [
            (Some("k"), vec![Some("k"), Some("k")], Ok(k.clone())),
            (Some("k"), vec![None, None], Ok(k.clone())),
            (None, vec![Some("k"), Some("k")], Ok(k.clone())),
            (None, vec![None, None], Ok(None)),
        ];
        for (envelope, keys, expected) in cases {
            let published = publication(batch(envelope, &keys), BATCH_MESSAGE_FORMAT);
            assert_eq!(key(published), expected, "{envelope:?} {keys:?}");
        }
        for (envelope, keys) in [
            (Some("k"), vec![Some("k"), Some("j")]),
            (None, vec![Some("k"), Some("j")]),
            (None, vec![None, Some("k")]),
            (None, vec![Some("k"), None]),
        ] {
            let error = publication(batch(envelope, &keys), BATCH_MESSAGE_FORMAT).unwrap_err();
            assert_eq!(error.condition.as_str(), condition::ARGUMENT_ERROR);
        }
    }

    #[test]
    fn system_annotations_are_dropped_and_others_kept() {
        let mut message = keyed(Some("k"), b"body");
        message.message_annotations.as_mut().unwrap().extend([
            (Value::symbol(SEQUENCE_NUMBER_ANNOTATION), Value::Long(7)),
            (Value::symbol("x-opt-custom"), Value::Int(1)),
        ]);
        let published = publication(message.to_bytes(), 0).unwrap();
        let event = &published.events[0];
        assert_eq!(event.partition_key.as_deref(), Some("k"));
        assert_eq!(
            event.message_annotations,
            vec![(Value::symbol("x-opt-custom"), Value::Int(1))]
        );
        let bad_key = Message {
            message_annotations: Some(vec![(
                Value::symbol(PARTITION_KEY_ANNOTATION),
                Value::Int(1),
            )]),
            ..Message::default()
        };
        assert!(publication(bad_key.to_bytes(), 0).is_err());
        assert!(publication(Bytes::from_static(b"\xff"), 0).is_err());
        assert!(publication(Message::default().to_bytes(), 7).is_err());
    }

    #[test]
    fn bodies_keep_their_kind() {
        let data = Message {
            body: Body::Data(vec![Bytes::from_static(b"ab"), Bytes::from_static(b"cd")]),
            ..Message::default()
        };
        let event = AmqpEvent::from_message(data, None);
        assert_eq!(event.body, EventBody::Data(Bytes::from_static(b"abcd")));
        for body in [
            Body::Empty,
            Body::Value(Value::String("text".into())),
            Body::Sequence(vec![vec![Value::Int(1)], vec![Value::Null]]),
        ] {
            let message = Message {
                body: body.clone(),
                ..Message::default()
            };
            let event = AmqpEvent::from_message(message, None);
            assert!(matches!(event.body, EventBody::Amqp(_)));
            assert_eq!(event.to_message().body, body);
        }
    }
}
