//! Events as the SDK shows them: what a producer sends and what a consumer receives.

use std::collections::BTreeMap;

use bytes::Bytes;
use tributary_proto::v1 as proto;
use tributary_proto::v1::property_value::Value;

/// A typed application property of an event.
#[derive(Debug, Clone, PartialEq)]
pub enum PropertyValue {
    String(String),
    Int64(i64),
    Double(f64),
    Bool(bool),
    Bytes(Bytes),
    /// Milliseconds since the Unix epoch, UTC.
    TimestampMs(i64),
}

/// An event to send: a body and application properties.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventData {
    pub body: Bytes,
    pub properties: BTreeMap<String, PropertyValue>,
}

/// An event read from a partition, with the fields the service stamped on it.
#[derive(Debug, Clone, PartialEq)]
pub struct ReceivedEvent {
    pub body: Bytes,
    pub properties: BTreeMap<String, PropertyValue>,
    /// Per partition: 0, 1, 2, ... without gaps.
    pub sequence_number: i64,
    /// Per partition, growing; a decimal string, as Event Hubs shows it.
    pub offset: String,
    /// When the partition leader accepted the event; milliseconds since the Unix epoch, UTC.
    pub enqueued_time_ms: i64,
    /// The key the event was sent with, if any.
    pub partition_key: Option<String>,
}

impl EventData {
    /// An event with this body and no properties.
    pub fn from_body(body: impl Into<Bytes>) -> EventData {
        EventData {
            body: body.into(),
            properties: BTreeMap::new(),
        }
    }

    /// Adds (or replaces) an application property.
    pub fn with_property(
        mut self,
        key: impl Into<String>,
        value: impl Into<PropertyValue>,
    ) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }
}

impl From<&str> for PropertyValue {
    fn from(value: &str) -> Self {
        PropertyValue::String(value.to_owned())
    }
}

impl From<String> for PropertyValue {
    fn from(value: String) -> Self {
        PropertyValue::String(value)
    }
}

impl From<i64> for PropertyValue {
    fn from(value: i64) -> Self {
        PropertyValue::Int64(value)
    }
}

impl From<f64> for PropertyValue {
    fn from(value: f64) -> Self {
        PropertyValue::Double(value)
    }
}

impl From<bool> for PropertyValue {
    fn from(value: bool) -> Self {
        PropertyValue::Bool(value)
    }
}

impl From<Bytes> for PropertyValue {
    fn from(value: Bytes) -> Self {
        PropertyValue::Bytes(value)
    }
}

// ---------------------------------------------------------------------------------------
// Protobuf conversions: the only place the SDK's event types meet the generated ones.

impl From<PropertyValue> for proto::PropertyValue {
    fn from(value: PropertyValue) -> Self {
        let value = match value {
            PropertyValue::String(v) => Value::StringValue(v),
            PropertyValue::Int64(v) => Value::Int64Value(v),
            PropertyValue::Double(v) => Value::DoubleValue(v),
            PropertyValue::Bool(v) => Value::BoolValue(v),
            PropertyValue::Bytes(v) => Value::BytesValue(v),
            PropertyValue::TimestampMs(v) => Value::TimestampMs(v),
        };
        proto::PropertyValue { value: Some(value) }
    }
}

/// `None` for a property whose value is unset on the wire (a newer kind this SDK does not
/// know): such properties are dropped.
fn property_from_proto(value: proto::PropertyValue) -> Option<PropertyValue> {
    Some(match value.value? {
        Value::StringValue(v) => PropertyValue::String(v),
        Value::Int64Value(v) => PropertyValue::Int64(v),
        Value::DoubleValue(v) => PropertyValue::Double(v),
        Value::BoolValue(v) => PropertyValue::Bool(v),
        Value::BytesValue(v) => PropertyValue::Bytes(v),
        Value::TimestampMs(v) => PropertyValue::TimestampMs(v),
    })
}

impl From<EventData> for proto::EventData {
    fn from(event: EventData) -> Self {
        proto::EventData {
            body: event.body,
            properties: event
                .properties
                .into_iter()
                .map(|(key, value)| (key, value.into()))
                .collect(),
        }
    }
}

impl From<proto::ReceivedEvent> for ReceivedEvent {
    fn from(event: proto::ReceivedEvent) -> Self {
        ReceivedEvent {
            body: event.body,
            properties: event
                .properties
                .into_iter()
                .filter_map(|(key, value)| Some((key, property_from_proto(value)?)))
                .collect(),
            sequence_number: event.sequence_number,
            offset: event.offset,
            enqueued_time_ms: event.enqueued_time_ms,
            partition_key: (!event.partition_key.is_empty()).then_some(event.partition_key),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_data_round_trips_properties_through_proto() {
        let event = EventData::from_body("hello")
            .with_property("s", "text")
            .with_property("i", 42_i64)
            .with_property("d", 1.5)
            .with_property("b", true)
            .with_property("raw", Bytes::from_static(b"\x00\x01"))
            .with_property("t", PropertyValue::TimestampMs(1_700_000_000_000));
        let wire: proto::EventData = event.clone().into();
        let received = ReceivedEvent::from(proto::ReceivedEvent {
            body: wire.body,
            properties: wire.properties,
            sequence_number: 7,
            offset: "4096".into(),
            enqueued_time_ms: 1,
            partition_key: String::new(),
        });
        assert_eq!(received.body, event.body);
        assert_eq!(received.properties, event.properties);
        assert_eq!(received.partition_key, None);
    }
}
