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
//! | application property: byte, short, int, ubyte, ushort, uint, ulong (up to `i64::MAX`); float; symbol, char, uuid (as text) | the nearest variant (`Int64`, `Double`, `String`), so other front ends read a number or text; its AMQP type marked in the extras |
//! | application property of any other AMQP type (decimal, list, map, …) | a `Bytes` property of the same name holding the encoded AMQP value (its index marked in the extras) |
//! | header, properties section, other message annotations | the extras |
//!
//! The extras are one last property named [`AMQP_EXTRAS_PROPERTY`], a `Bytes` value holding
//! an encoded AMQP map with symbol keys: `sections` (binary: the encoded header,
//! message-annotations and properties sections), `body` (symbol `amqp` for an encoded
//! body), `encoded-properties` (list of uint: the indexes of properties holding an encoded
//! AMQP value) and `retyped-properties` (list of index, type-name pairs: the AMQP type of a
//! property stored as its nearest variant). It is written only when one of those is needed, or when an application
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

/// The name of the property holding what the record has no field for (the broker's, so
/// other front ends leave it out).
pub use tributary_broker::service::AMQP_EXTRAS_PROPERTY;

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
const RETYPED_PROPERTIES_KEY: &str = "retyped-properties";
const AMQP_BODY: &str = "amqp";

impl AmqpEvent {
    /// The record the broker stores for this event.
    pub fn to_record(&self) -> EventRecordParts {
        let mut properties = Vec::with_capacity(self.application_properties.len() + 1);
        let mut encoded = Vec::new();
        let mut retyped = Vec::new();
        for (index, (key, value)) in self.application_properties.iter().enumerate() {
            let index_value = Value::Uint(u32::try_from(index).unwrap_or(u32::MAX));
            let property = match value {
                Value::String(v) => EventProperty::String(v.clone()),
                Value::Long(v) => EventProperty::Int64(*v),
                Value::Double(v) => EventProperty::Double(*v),
                Value::Boolean(v) => EventProperty::Bool(*v),
                Value::Binary(v) => EventProperty::Bytes(v.clone()),
                Value::Timestamp(v) => EventProperty::TimestampMs(*v),
                other => match nearest(other) {
                    Some((property, type_name)) => {
                        retyped.push(Value::List(vec![index_value, Value::symbol(type_name)]));
                        property
                    }
                    None => {
                        encoded.push(index_value);
                        EventProperty::Bytes(other.to_bytes())
                    }
                },
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
        if !retyped.is_empty() {
            extras.push((Value::symbol(RETYPED_PROPERTIES_KEY), Value::List(retyped)));
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
                    property if extras.retyped.contains_key(&index) => {
                        restore(&property, extras.retyped[&index].as_str())
                            .unwrap_or_else(|| natural(property))
                    }
                    EventProperty::Bytes(bytes) if extras.encoded.contains(&index) => {
                        match Value::decode(bytes.clone()) {
                            Ok((value, rest)) if rest.is_empty() => value,
                            _ => Value::Binary(bytes),
                        }
                    }
                    property => natural(property),
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

/// A stored property as the AMQP type of its variant.
fn natural(property: EventProperty) -> Value {
    match property {
        EventProperty::String(v) => Value::String(v),
        EventProperty::Int64(v) => Value::Long(v),
        EventProperty::Double(v) => Value::Double(v),
        EventProperty::Bool(v) => Value::Boolean(v),
        EventProperty::Bytes(v) => Value::Binary(v),
        EventProperty::TimestampMs(v) => Value::Timestamp(v),
    }
}

/// The variant nearest to an AMQP value the record has none for, and the name of its type;
/// `None` when there is none (it is stored encoded).
fn nearest(value: &Value) -> Option<(EventProperty, &'static str)> {
    Some(match value {
        Value::Byte(v) => (EventProperty::Int64(i64::from(*v)), "byte"),
        Value::Short(v) => (EventProperty::Int64(i64::from(*v)), "short"),
        Value::Int(v) => (EventProperty::Int64(i64::from(*v)), "int"),
        Value::Ubyte(v) => (EventProperty::Int64(i64::from(*v)), "ubyte"),
        Value::Ushort(v) => (EventProperty::Int64(i64::from(*v)), "ushort"),
        Value::Uint(v) => (EventProperty::Int64(i64::from(*v)), "uint"),
        Value::Ulong(v) => (EventProperty::Int64(i64::try_from(*v).ok()?), "ulong"),
        Value::Float(v) => (EventProperty::Double(f64::from(*v)), "float"),
        Value::Symbol(v) => (EventProperty::String(v.as_str().to_owned()), "symbol"),
        Value::Char(v) => (EventProperty::String(v.to_string()), "char"),
        Value::Uuid(v) => (EventProperty::String(uuid_text(v)), "uuid"),
        _ => return None,
    })
}

/// The AMQP value [`nearest`] stored as `property`; `None` when it does not fit (the
/// record was changed by someone else), and the property reads as its own variant.
fn restore(property: &EventProperty, type_name: &str) -> Option<Value> {
    Some(match (property, type_name) {
        (EventProperty::Int64(v), "byte") => Value::Byte(i8::try_from(*v).ok()?),
        (EventProperty::Int64(v), "short") => Value::Short(i16::try_from(*v).ok()?),
        (EventProperty::Int64(v), "int") => Value::Int(i32::try_from(*v).ok()?),
        (EventProperty::Int64(v), "ubyte") => Value::Ubyte(u8::try_from(*v).ok()?),
        (EventProperty::Int64(v), "ushort") => Value::Ushort(u16::try_from(*v).ok()?),
        (EventProperty::Int64(v), "uint") => Value::Uint(u32::try_from(*v).ok()?),
        (EventProperty::Int64(v), "ulong") => Value::Ulong(u64::try_from(*v).ok()?),
        // Exact: the double was widened from this float.
        #[allow(clippy::cast_possible_truncation)]
        (EventProperty::Double(v), "float") => Value::Float(*v as f32),
        (EventProperty::String(v), "symbol") => Value::symbol(v.clone()),
        (EventProperty::String(v), "char") => {
            let mut chars = v.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Value::Char(c),
                _ => return None,
            }
        }
        (EventProperty::String(v), "uuid") => Value::Uuid(parse_uuid(v)?),
        _ => return None,
    })
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, lower-case hex.
fn uuid_text(bytes: &[u8; 16]) -> String {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    let hex: String = text.chars().filter(|c| *c != '-').collect();
    if hex.len() != 32 || text.len() != 36 {
        return None;
    }
    let mut bytes = [0; 16];
    for (i, byte) in bytes.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(bytes)
}

/// The extras property, decoded.
#[derive(Default)]
struct Extras {
    sections: Bytes,
    amqp_body: bool,
    encoded: Vec<usize>,
    /// Property index to the AMQP type name it was stored from.
    retyped: std::collections::HashMap<usize, String>,
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
                (RETYPED_PROPERTIES_KEY, Value::List(pairs)) => {
                    extras.retyped = pairs
                        .iter()
                        .filter_map(|pair| match pair {
                            Value::List(pair) if pair.len() == 2 => Some((
                                usize::try_from(pair[0].as_u64()?).ok()?,
                                pair[1].as_str()?.to_owned(),
                            )),
                            _ => None,
                        })
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
                ("f".into(), Value::Float(0.25)),
                ("c".into(), Value::Char('é')),
                ("ul".into(), Value::Ulong(u64::MAX)),
                ("list".into(), Value::List(vec![Value::Int(1)])),
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
                "f",
                "c",
                "ul",
                "list",
                AMQP_EXTRAS_PROPERTY
            ]
        );
        let stored = |name: &str| {
            record
                .properties
                .iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(stored("l"), EventProperty::Int64(-5));
        assert_eq!(stored("i"), EventProperty::Int64(7));
        assert_eq!(stored("f"), EventProperty::Double(0.25));
        assert_eq!(stored("sym"), EventProperty::String("a-symbol".into()));
        assert_eq!(stored("c"), EventProperty::String("é".into()));
        assert_eq!(
            stored("u"),
            EventProperty::String("09090909-0909-0909-0909-090909090909".into())
        );
        // Too large for the record's integer: kept encoded.
        assert!(matches!(stored("ul"), EventProperty::Bytes(_)));
        assert!(matches!(stored("list"), EventProperty::Bytes(_)));
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
