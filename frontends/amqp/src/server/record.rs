//! How an [`AmqpEvent`] sits in the broker's `EventRecord` (`partition_key`, `properties`,
//! `body`) and comes back as the same message. Pure. This crate does not depend on the
//! broker: [`EventRecordParts`] has the record's three fields and [`EventProperty`] the
//! variants of its `Property`, so the node converts field for field.
//!
//! | AMQP | record |
//! | --- | --- |
//! | `x-opt-partition-key` | `partition_key` |
//! | data body | `body`, the bytes |
//! | amqp-value / amqp-sequence body, or none | `body`, the encoded sections (marked in the extras) |
//! | application property: string, long, double, boolean, binary, timestamp | a property of the same name and matching variant, in order |
//! | application property of any other AMQP type (int, uuid, symbol, list, …) | a `Bytes` property of the same name holding the encoded AMQP value (its index marked in the extras) |
//! | header, properties section, other message annotations | the extras |
//!
//! The extras are one last property named [`AMQP_EXTRAS_PROPERTY`], a `Bytes` value holding
//! an encoded AMQP map with symbol keys: `sections` (binary: the encoded header,
//! message-annotations and properties sections), `body` (symbol `amqp` for an encoded
//! body) and `encoded-properties` (list of uint: the indexes of properties holding an encoded
//! AMQP value). It is written only when one of those is needed, or when an application
//! property already has that name (so the last property is never mistaken for extras).
//! Events other front ends wrote have none and read back as data bodies with their
//! properties.
//!
//! A record read back gives the event that was stored, except that several data sections
//! come back as one and an empty application-properties section as none.

use bytes::Bytes;

use super::event::{AmqpEvent, EventBody};
use crate::message::Message;
use crate::types::{Map, Value};

/// The name of the property holding what the record has no field for.
pub const AMQP_EXTRAS_PROPERTY: &str = "x-opt-amqp";

/// An application property as the broker stores it (its `Property`, variant for variant).
#[derive(Debug, Clone, PartialEq)]
pub enum EventProperty {
    String(String),
    Int64(i64),
    Double(f64),
    Bool(bool),
    Bytes(Bytes),
    TimestampMs(i64),
}

/// The broker's `EventRecord`, field for field.
#[derive(Debug, Clone, PartialEq)]
pub struct EventRecordParts {
    pub partition_key: Option<String>,
    pub properties: Vec<(String, EventProperty)>,
    pub body: Bytes,
}

const SECTIONS_KEY: &str = "sections";
const BODY_KEY: &str = "body";
const ENCODED_PROPERTIES_KEY: &str = "encoded-properties";
const AMQP_BODY: &str = "amqp";

impl AmqpEvent {
    /// The record the broker stores for this event.
    pub fn to_record(&self) -> EventRecordParts {
        let mut properties = Vec::with_capacity(self.application_properties.len() + 1);
        let mut encoded = Vec::new();
        for (index, (key, value)) in self.application_properties.iter().enumerate() {
            let property = match value {
                Value::String(v) => EventProperty::String(v.clone()),
                Value::Long(v) => EventProperty::Int64(*v),
                Value::Double(v) => EventProperty::Double(*v),
                Value::Boolean(v) => EventProperty::Bool(*v),
                Value::Binary(v) => EventProperty::Bytes(v.clone()),
                Value::Timestamp(v) => EventProperty::TimestampMs(*v),
                other => {
                    encoded.push(Value::Uint(u32::try_from(index).unwrap_or(u32::MAX)));
                    EventProperty::Bytes(other.to_bytes())
                }
            };
            properties.push((key.clone(), property));
        }
        let sections = Message {
            header: self.header.clone(),
            message_annotations: (!self.message_annotations.is_empty())
                .then(|| self.message_annotations.clone()),
            properties: self.properties.clone(),
            ..Message::default()
        }
        .to_bytes();
        let mut extras = Map::new();
        if !sections.is_empty() {
            extras.push((Value::symbol(SECTIONS_KEY), Value::Binary(sections)));
        }
        if matches!(self.body, EventBody::Amqp(_)) {
            extras.push((Value::symbol(BODY_KEY), Value::symbol(AMQP_BODY)));
        }
        if !encoded.is_empty() {
            extras.push((Value::symbol(ENCODED_PROPERTIES_KEY), Value::List(encoded)));
        }
        let name_taken = properties.iter().any(|(k, _)| k == AMQP_EXTRAS_PROPERTY);
        if !extras.is_empty() || name_taken {
            properties.push((
                AMQP_EXTRAS_PROPERTY.to_owned(),
                EventProperty::Bytes(Value::Map(extras).to_bytes()),
            ));
        }
        EventRecordParts {
            partition_key: self.partition_key.clone(),
            properties,
            body: self.body.bytes().clone(),
        }
    }

    /// The event a stored record holds (written by [`AmqpEvent::to_record`] or by another
    /// front end).
    pub fn from_record(record: EventRecordParts) -> AmqpEvent {
        let EventRecordParts {
            partition_key,
            mut properties,
            body,
        } = record;
        let extras = match properties.last() {
            Some((key, EventProperty::Bytes(bytes))) if key == AMQP_EXTRAS_PROPERTY => {
                Extras::decode(bytes.clone())
            }
            _ => None,
        };
        if extras.is_some() {
            properties.pop();
        }
        let extras = extras.unwrap_or_default();
        let sections = Message::decode(extras.sections).unwrap_or_default();
        let application_properties = properties
            .into_iter()
            .enumerate()
            .map(|(index, (key, property))| {
                let value = match property {
                    EventProperty::Bytes(bytes) if extras.encoded.contains(&index) => {
                        match Value::decode(bytes.clone()) {
                            Ok((value, rest)) if rest.is_empty() => value,
                            _ => Value::Binary(bytes),
                        }
                    }
                    EventProperty::String(v) => Value::String(v),
                    EventProperty::Int64(v) => Value::Long(v),
                    EventProperty::Double(v) => Value::Double(v),
                    EventProperty::Bool(v) => Value::Boolean(v),
                    EventProperty::Bytes(v) => Value::Binary(v),
                    EventProperty::TimestampMs(v) => Value::Timestamp(v),
                };
                (key, value)
            })
            .collect();
        AmqpEvent {
            partition_key,
            header: sections.header,
            message_annotations: sections.message_annotations.unwrap_or_default(),
            properties: sections.properties,
            application_properties,
            body: if extras.amqp_body {
                EventBody::Amqp(body)
            } else {
                EventBody::Data(body)
            },
        }
    }
}

/// The extras property, decoded.
#[derive(Default)]
struct Extras {
    sections: Bytes,
    amqp_body: bool,
    encoded: Vec<usize>,
}

impl Extras {
    /// `None` when the bytes are no extras map (a property that only shares the name).
    fn decode(bytes: Bytes) -> Option<Extras> {
        let (Value::Map(pairs), rest) = Value::decode(bytes).ok()? else {
            return None;
        };
        if !rest.is_empty() {
            return None;
        }
        let mut extras = Extras::default();
        for (key, value) in pairs {
            match (key.as_str()?, value) {
                (SECTIONS_KEY, Value::Binary(sections)) => extras.sections = sections,
                (BODY_KEY, body) => extras.amqp_body = body.as_str() == Some(AMQP_BODY),
                (ENCODED_PROPERTIES_KEY, Value::List(indexes)) => {
                    extras.encoded = indexes
                        .iter()
                        .filter_map(|i| usize::try_from(i.as_u64()?).ok())
                        .collect();
                }
                _ => return None,
            }
        }
        Some(extras)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{Body, Header, MessageId, Properties};
    use crate::types::Symbol;

    fn rich_event() -> AmqpEvent {
        AmqpEvent {
            partition_key: Some("device-42".into()),
            header: Some(Header {
                durable: true,
                ..Header::default()
            }),
            message_annotations: vec![(Value::symbol("x-opt-custom"), Value::Int(3))],
            properties: Some(Properties {
                message_id: Some(MessageId::String("m-1".into())),
                content_type: Some(Symbol::from("application/json")),
                creation_time_ms: Some(1_767_225_600_000),
                ..Properties::default()
            }),
            application_properties: vec![
                ("s".into(), Value::String("text".into())),
                ("l".into(), Value::Long(-5)),
                ("i".into(), Value::Int(7)),
                ("d".into(), Value::Double(1.5)),
                ("b".into(), Value::Boolean(true)),
                ("bin".into(), Value::Binary(Bytes::from_static(b"\x00\x01"))),
                ("t".into(), Value::Timestamp(1_767_225_600_123)),
                ("u".into(), Value::Uuid([9; 16])),
                ("sym".into(), Value::symbol("a-symbol")),
            ],
            body: EventBody::Data(Bytes::from_static(b"{\"temp\":21}")),
        }
    }

    #[test]
    fn an_event_stored_and_read_back_is_the_same_message() {
        let event = rich_event();
        let record = event.to_record();
        assert_eq!(record.partition_key.as_deref(), Some("device-42"));
        assert_eq!(record.body, Bytes::from_static(b"{\"temp\":21}"));
        // What other front ends read: every property by name, natural types where they
        // exist, and the extras last.
        let names: Vec<&str> = record.properties.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "s",
                "l",
                "i",
                "d",
                "b",
                "bin",
                "t",
                "u",
                "sym",
                AMQP_EXTRAS_PROPERTY
            ]
        );
        assert_eq!(record.properties[1].1, EventProperty::Int64(-5));
        let back = AmqpEvent::from_record(record);
        assert_eq!(back, event);
        assert_eq!(back.to_message(), event.to_message());
    }

    #[test]
    fn amqp_value_bodies_round_trip() {
        let message = Message {
            body: Body::Value(Value::Map(vec![(Value::String("k".into()), Value::Int(1))])),
            ..Message::default()
        };
        let event = AmqpEvent::from_message(message.clone(), None);
        let back = AmqpEvent::from_record(event.to_record());
        assert_eq!(back.to_message(), message);
    }

    #[test]
    fn records_of_other_front_ends_read_as_data_events() {
        let record = EventRecordParts {
            partition_key: None,
            properties: vec![
                ("n".into(), EventProperty::Int64(1)),
                (
                    AMQP_EXTRAS_PROPERTY.into(),
                    EventProperty::Bytes(Bytes::from_static(b"x")),
                ),
            ],
            body: Bytes::from_static(b"raw"),
        };
        let event = AmqpEvent::from_record(record.clone());
        assert_eq!(event.body, EventBody::Data(Bytes::from_static(b"raw")));
        assert_eq!(event.application_properties.len(), 2);
        // Stored again, the name clash gets extras after it, and reads back unchanged.
        let again = AmqpEvent::from_record(event.to_record());
        assert_eq!(again, event);
        let plain = AmqpEvent {
            body: EventBody::Data(Bytes::from_static(b"raw")),
            ..AmqpEvent::default()
        };
        assert!(plain.to_record().properties.is_empty());
    }
}
