//! Messages (AMQP 1.0 part 3 §3.2): the sections of a bare message with its annotations, and
//! the Event Hubs batch format.
//!
//! Sections are written in the spec's order with smallulong descriptors `00 53 70..78`
//! (pyamqp reads the code at byte 2 of each section). Header and properties are written with
//! all their fields. Decoding accepts the sections in any order and symbolic descriptors, but
//! refuses a section given twice and a body mixing kinds.

use bytes::Bytes;

use crate::decode::Decoder;
use crate::error::CodecError;
use crate::fields::{
    Descriptor, FieldReader, FromValue, map_value, opt, timestamp_value, unexpected,
    unknown_descriptor,
};
use crate::types::{Described, Map, Symbol, Value};

/// The transfer `message-format` of an Event Hubs batch: the body is one `data` section per
/// event, each holding a complete encoded message.
pub const BATCH_MESSAGE_FORMAT: u32 = 0x8001_3700;

/// A message: the bare message plus its annotations.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    pub header: Option<Header>,
    pub delivery_annotations: Option<Map>,
    /// Symbol keys such as `x-opt-partition-key`, `x-opt-sequence-number`.
    pub message_annotations: Option<Map>,
    pub properties: Option<Properties>,
    pub application_properties: Option<ApplicationProperties>,
    pub body: Body,
    pub footer: Option<Map>,
}

/// Application properties: string keys, simple values, in wire order.
pub type ApplicationProperties = Vec<(String, Value)>;

/// The header section (0x70, 5 fields).
#[derive(Debug, Clone, PartialEq)]
pub struct Header {
    pub durable: bool,
    /// Default 4.
    pub priority: u8,
    pub ttl_ms: Option<u32>,
    pub first_acquirer: bool,
    pub delivery_count: u32,
}

/// The properties section (0x73, 13 fields).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Properties {
    pub message_id: Option<MessageId>,
    pub user_id: Option<Bytes>,
    pub to: Option<String>,
    pub subject: Option<String>,
    pub reply_to: Option<String>,
    /// A reply carries the request's message id here, with the same AMQP type
    /// (WIRE-PROTOCOLS A6).
    pub correlation_id: Option<MessageId>,
    pub content_type: Option<Symbol>,
    pub content_encoding: Option<Symbol>,
    /// Milliseconds since the Unix epoch.
    pub absolute_expiry_time_ms: Option<i64>,
    /// Milliseconds since the Unix epoch.
    pub creation_time_ms: Option<i64>,
    pub group_id: Option<String>,
    pub group_sequence: Option<u32>,
    pub reply_to_group_id: Option<String>,
}

/// A message id or correlation id, keeping its AMQP type.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum MessageId {
    Ulong(u64),
    Uuid([u8; 16]),
    Binary(Bytes),
    String(String),
}

/// The body: data sections, sequence sections or one value. `Empty` for a message without a
/// body section (pyamqp's management requests).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Body {
    #[default]
    Empty,
    Data(Vec<Bytes>),
    Sequence(Vec<Vec<Value>>),
    Value(Value),
}

const HEADER: Descriptor = Descriptor::new(0x70, "amqp:header:list");
const DELIVERY_ANNOTATIONS: Descriptor = Descriptor::new(0x71, "amqp:delivery-annotations:map");
const MESSAGE_ANNOTATIONS: Descriptor = Descriptor::new(0x72, "amqp:message-annotations:map");
const PROPERTIES: Descriptor = Descriptor::new(0x73, "amqp:properties:list");
const APPLICATION_PROPERTIES: Descriptor = Descriptor::new(0x74, "amqp:application-properties:map");
const DATA: Descriptor = Descriptor::new(0x75, "amqp:data:binary");
const SEQUENCE: Descriptor = Descriptor::new(0x76, "amqp:amqp-sequence:list");
const VALUE: Descriptor = Descriptor::new(0x77, "amqp:amqp-value:*");
const FOOTER: Descriptor = Descriptor::new(0x78, "amqp:footer:map");

impl Default for Header {
    fn default() -> Header {
        Header {
            durable: false,
            priority: 4,
            ttl_ms: None,
            first_acquirer: false,
            delivery_count: 0,
        }
    }
}

impl Message {
    /// A message whose body is one data section.
    pub fn with_data(data: Bytes) -> Message {
        Message {
            body: Body::Data(vec![data]),
            ..Message::default()
        }
    }

    /// Appends the encoded sections.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let mut put =
            |d: Descriptor, value: Value| Value::described(Value::Ulong(d.code), value).encode(out);
        if let Some(header) = &self.header {
            put(HEADER, header.to_value());
        }
        if self.delivery_annotations.is_some() {
            put(DELIVERY_ANNOTATIONS, map_value(&self.delivery_annotations));
        }
        if self.message_annotations.is_some() {
            put(MESSAGE_ANNOTATIONS, map_value(&self.message_annotations));
        }
        if let Some(properties) = &self.properties {
            put(PROPERTIES, properties.to_value());
        }
        if let Some(application_properties) = &self.application_properties {
            let pairs = application_properties
                .iter()
                .map(|(key, value)| (Value::String(key.clone()), value.clone()));
            put(APPLICATION_PROPERTIES, Value::Map(pairs.collect()));
        }
        match &self.body {
            Body::Empty => {}
            Body::Data(sections) => {
                for data in sections {
                    put(DATA, Value::Binary(data.clone()));
                }
            }
            Body::Sequence(sections) => {
                for items in sections {
                    put(SEQUENCE, Value::List(items.clone()));
                }
            }
            Body::Value(value) => put(VALUE, value.clone()),
        }
        if self.footer.is_some() {
            put(FOOTER, map_value(&self.footer));
        }
    }

    /// The encoded sections.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::new();
        self.encode(&mut out);
        Bytes::from(out)
    }

    /// Decodes a whole message (a transfer's payload, reassembled).
    pub fn decode(input: Bytes) -> Result<Message, CodecError> {
        let mut decoder = Decoder::new(input);
        let mut message = Message::default();
        while !decoder.is_empty() {
            message.add_section(decoder.value()?)?;
        }
        Ok(message)
    }

    fn add_section(&mut self, section: Value) -> Result<(), CodecError> {
        let Value::Described(described) = section else {
            return Err(unexpected("message", "section", &section));
        };
        let Described { descriptor, value } = *described;
        let is = |d: Descriptor| descriptor.is_descriptor(d.code, d.name);
        if is(HEADER) {
            let header = Header::read(FieldReader::from_body(value, "header")?)?;
            set_once(&mut self.header, header, "two header sections")
        } else if is(DELIVERY_ANNOTATIONS) {
            let map = Map::from_value(value, "delivery-annotations")?;
            set_once(
                &mut self.delivery_annotations,
                map,
                "two delivery-annotations sections",
            )
        } else if is(MESSAGE_ANNOTATIONS) {
            let map = Map::from_value(value, "message-annotations")?;
            set_once(
                &mut self.message_annotations,
                map,
                "two message-annotations sections",
            )
        } else if is(PROPERTIES) {
            let properties = Properties::read(FieldReader::from_body(value, "properties")?)?;
            set_once(&mut self.properties, properties, "two properties sections")
        } else if is(APPLICATION_PROPERTIES) {
            let pairs = Map::from_value(value, "application-properties")?
                .into_iter()
                .map(|(key, item)| {
                    Ok((String::from_value(key, "application-properties key")?, item))
                })
                .collect::<Result<_, CodecError>>()?;
            set_once(
                &mut self.application_properties,
                pairs,
                "two application-properties sections",
            )
        } else if is(DATA) {
            let data = Bytes::from_value(value, "data")?;
            match &mut self.body {
                Body::Empty => self.body = Body::Data(vec![data]),
                Body::Data(sections) => sections.push(data),
                _ => return Err(mixed_body()),
            }
            Ok(())
        } else if is(SEQUENCE) {
            let Value::List(items) = value else {
                return Err(unexpected("amqp-sequence", "list", &value));
            };
            match &mut self.body {
                Body::Empty => self.body = Body::Sequence(vec![items]),
                Body::Sequence(sections) => sections.push(items),
                _ => return Err(mixed_body()),
            }
            Ok(())
        } else if is(VALUE) {
            match self.body {
                Body::Empty => self.body = Body::Value(value),
                _ => return Err(mixed_body()),
            }
            Ok(())
        } else if is(FOOTER) {
            let map = Map::from_value(value, "footer")?;
            set_once(&mut self.footer, map, "two footer sections")
        } else {
            Err(unknown_descriptor("message section", &descriptor))
        }
    }
}

fn set_once<T>(slot: &mut Option<T>, value: T, problem: &'static str) -> Result<(), CodecError> {
    if slot.is_some() {
        return Err(CodecError::InvalidMessage { problem });
    }
    *slot = Some(value);
    Ok(())
}

fn mixed_body() -> CodecError {
    CodecError::InvalidMessage {
        problem: "the body mixes data, amqp-sequence and amqp-value sections",
    }
}

/// The events of an Event Hubs batch (a message sent with [`BATCH_MESSAGE_FORMAT`]): each data
/// section decoded as a message. A batch without data sections holds no events.
pub fn split_batch(batch: &Message) -> Result<Vec<Message>, CodecError> {
    match &batch.body {
        Body::Data(sections) => sections.iter().cloned().map(Message::decode).collect(),
        Body::Empty => Ok(Vec::new()),
        _ => Err(CodecError::InvalidMessage {
            problem: "a batch body must be data sections, one encoded message each",
        }),
    }
}

/// A batch: `envelope` (its header, annotations and properties, such as
/// `x-opt-partition-key`) with one data section per event. Send it with
/// `message-format` [`BATCH_MESSAGE_FORMAT`].
pub fn build_batch(envelope: Message, events: &[Message]) -> Message {
    Message {
        body: Body::Data(events.iter().map(Message::to_bytes).collect()),
        ..envelope
    }
}

impl Header {
    fn to_value(&self) -> Value {
        Value::List(vec![
            self.durable.into(),
            self.priority.into(),
            opt(self.ttl_ms),
            self.first_acquirer.into(),
            self.delivery_count.into(),
        ])
    }

    fn read(mut r: FieldReader) -> Result<Header, CodecError> {
        Ok(Header {
            durable: r.or("header.durable", false)?,
            priority: r.or("header.priority", 4)?,
            ttl_ms: r.optional("header.ttl")?,
            first_acquirer: r.or("header.first-acquirer", false)?,
            delivery_count: r.or("header.delivery-count", 0)?,
        })
    }
}

impl Properties {
    fn to_value(&self) -> Value {
        Value::List(vec![
            opt(self.message_id.clone()),
            opt(self.user_id.clone()),
            opt(self.to.clone()),
            opt(self.subject.clone()),
            opt(self.reply_to.clone()),
            opt(self.correlation_id.clone()),
            opt(self.content_type.clone()),
            opt(self.content_encoding.clone()),
            timestamp_value(self.absolute_expiry_time_ms),
            timestamp_value(self.creation_time_ms),
            opt(self.group_id.clone()),
            opt(self.group_sequence),
            opt(self.reply_to_group_id.clone()),
        ])
    }

    fn read(mut r: FieldReader) -> Result<Properties, CodecError> {
        Ok(Properties {
            message_id: r.optional("properties.message-id")?,
            user_id: r.optional("properties.user-id")?,
            to: r.optional("properties.to")?,
            subject: r.optional("properties.subject")?,
            reply_to: r.optional("properties.reply-to")?,
            correlation_id: r.optional("properties.correlation-id")?,
            content_type: r.optional("properties.content-type")?,
            content_encoding: r.optional("properties.content-encoding")?,
            absolute_expiry_time_ms: r.timestamp("properties.absolute-expiry-time")?,
            creation_time_ms: r.timestamp("properties.creation-time")?,
            group_id: r.optional("properties.group-id")?,
            group_sequence: r.optional("properties.group-sequence")?,
            reply_to_group_id: r.optional("properties.reply-to-group-id")?,
        })
    }
}

impl From<MessageId> for Value {
    fn from(id: MessageId) -> Value {
        match id {
            MessageId::Ulong(v) => Value::Ulong(v),
            MessageId::Uuid(v) => Value::Uuid(v),
            MessageId::Binary(v) => Value::Binary(v),
            MessageId::String(v) => Value::String(v),
        }
    }
}

impl FromValue for MessageId {
    fn from_value(value: Value, field: &'static str) -> Result<MessageId, CodecError> {
        match value {
            Value::Ulong(v) => Ok(MessageId::Ulong(v)),
            Value::Uuid(v) => Ok(MessageId::Uuid(v)),
            Value::Binary(v) => Ok(MessageId::Binary(v)),
            Value::String(v) => Ok(MessageId::String(v)),
            other => Err(unexpected(field, "ulong, uuid, binary or string", &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::map_get;
    use crate::test_support::{arb_message, config, hex, mutate};

    fn partition_key(key: &str) -> Option<Map> {
        Some(vec![(
            Value::symbol("x-opt-partition-key"),
            Value::String(key.into()),
        )])
    }

    #[test]
    fn sections_use_smallulong_descriptors_in_order() {
        let message = Message {
            header: Some(Header {
                durable: true,
                ..Header::default()
            }),
            message_annotations: partition_key("k"),
            properties: Some(Properties {
                message_id: Some(MessageId::Uuid([7; 16])),
                ..Properties::default()
            }),
            application_properties: Some(vec![("operation".into(), Value::String("READ".into()))]),
            ..Message::with_data(Bytes::from_static(b"hi"))
        };
        let bytes = message.to_bytes();
        assert_eq!(bytes[..12], hex("00 53 70 c0 07 05 41 50 04 40 42 43")[..]);
        assert_eq!(bytes[12..15], hex("00 53 72")[..]);
        let properties_at = bytes
            .windows(3)
            .position(|w| w == [0x00, 0x53, 0x73])
            .unwrap();
        assert_eq!(bytes[properties_at + 3..properties_at + 6], hex("c0 1e 0d"));
        assert!(bytes.ends_with(&hex("00 53 75 a0 02 68 69")));
        assert_eq!(Message::decode(bytes), Ok(message));
    }

    #[test]
    fn ids_keep_their_amqp_type() {
        for id in [
            MessageId::Ulong(1),
            MessageId::Uuid([1; 16]),
            MessageId::Binary(Bytes::from_static(b"id")),
            MessageId::String("1".into()),
        ] {
            let reply = Message {
                properties: Some(Properties {
                    correlation_id: Some(id.clone()),
                    ..Properties::default()
                }),
                ..Message::default()
            };
            let decoded = Message::decode(reply.to_bytes()).unwrap();
            assert_eq!(decoded.properties.unwrap().correlation_id, Some(id));
        }
    }

    #[test]
    fn batches_split_into_their_events() {
        let events: Vec<Message> = (0..3)
            .map(|i| Message {
                message_annotations: partition_key("k"),
                application_properties: Some(vec![("i".into(), Value::Int(i))]),
                ..Message::with_data(Bytes::from(format!("event {i}")))
            })
            .collect();
        let envelope = Message {
            message_annotations: partition_key("k"),
            ..Message::default()
        };
        let batch = build_batch(envelope, &events);
        let decoded = Message::decode(batch.to_bytes()).unwrap();
        let key = map_get(
            decoded.message_annotations.as_ref().unwrap(),
            "x-opt-partition-key",
        );
        assert_eq!(key, Some(&Value::String("k".into())));
        assert_eq!(split_batch(&decoded), Ok(events));
        assert_eq!(split_batch(&Message::default()), Ok(Vec::new()));
        let not_a_batch = Message {
            body: Body::Value(Value::Null),
            ..Message::default()
        };
        assert!(split_batch(&not_a_batch).is_err());
        let garbage = Message::with_data(Bytes::from_static(b"\xff"));
        assert!(split_batch(&garbage).is_err());
    }

    #[test]
    fn lenient_and_strict_parts_of_message_decoding() {
        // Symbolic descriptor, sections out of order, a short header.
        let mut header = vec![0x00, 0xa3, 0x10];
        header.extend_from_slice(b"amqp:header:list");
        header.extend_from_slice(&hex("c0 02 01 41"));
        let mut input = hex("00 53 75 a0 01 61");
        input.extend_from_slice(&header);
        let decoded = Message::decode(Bytes::from(input)).unwrap();
        assert!(decoded.header.unwrap().durable);
        assert_eq!(decoded.body, Body::Data(vec![Bytes::from_static(b"a")]));
        let twice = hex("00 53 70 45 00 53 70 45");
        assert!(matches!(
            Message::decode(Bytes::from(twice)),
            Err(CodecError::InvalidMessage { .. })
        ));
        let mixed = hex("00 53 75 a0 00 00 53 77 40");
        assert!(matches!(
            Message::decode(Bytes::from(mixed)),
            Err(CodecError::InvalidMessage { .. })
        ));
        let unknown = hex("00 53 79 40");
        assert!(matches!(
            Message::decode(Bytes::from(unknown)),
            Err(CodecError::UnknownDescriptor { .. })
        ));
    }

    proptest! {
        #![proptest_config(config(256))]

        #[test]
        fn messages_round_trip(message in arb_message()) {
            prop_assert_eq!(Message::decode(message.to_bytes()), Ok(message));
        }

        #[test]
        fn mutated_messages_never_panic(
            message in arb_message(),
            edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0..3u8), 1..8),
        ) {
            let mut bytes = message.to_bytes().to_vec();
            mutate(&mut bytes, &edits);
            let batch = Message::with_data(Bytes::from(bytes.clone()));
            let _ = split_batch(&batch);
            let _ = Message::decode(Bytes::from(bytes));
        }
    }
}
