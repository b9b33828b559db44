//! How `tributary receive` prints an event: one JSON object per line, or one readable line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::Serialize;

use super::output::{time_json, time_text};
use crate::{PropertyValue, ReceivedEvent};

/// The JSON form of a received event. Field order is the order people read in.
#[derive(Serialize)]
struct EventLine<'a> {
    partition: &'a str,
    sequence_number: i64,
    offset: &'a str,
    enqueued_time: serde_json::Value,
    partition_key: Option<&'a str>,
    properties: BTreeMap<&'a str, serde_json::Value>,
    body: String,
    /// Set only when the body was not UTF-8 and `--base64` was not asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    body_encoding: Option<&'static str>,
}

/// One line of JSON (no trailing newline). Bodies are UTF-8 text, or base64 with
/// `base64_body`; a body that is not UTF-8 is base64 anyway, flagged by
/// `"body_encoding":"base64"`.
pub(crate) fn event_json_line(partition: &str, event: &ReceivedEvent, base64_body: bool) -> String {
    let (body, body_encoding) = match body_text(event, base64_body) {
        Body::Text(text) => (text.to_owned(), None),
        Body::Base64(encoded) => (encoded, (!base64_body).then_some("base64")),
    };
    let line = EventLine {
        partition,
        sequence_number: event.sequence_number,
        offset: &event.offset,
        enqueued_time: time_json(event.enqueued_time_ms),
        partition_key: event.partition_key.as_deref(),
        properties: event
            .properties
            .iter()
            .map(|(key, value)| (key.as_str(), property_json(value)))
            .collect(),
        body,
        body_encoding,
    };
    serde_json::to_string(&line).expect("an event line is always serializable")
}

/// `seq=5  offset=1234  2024-05-01T12:00:00.250Z  key=k  color="red" n=5  hello`; control
/// characters in the body are escaped so that one event stays on one line.
pub(crate) fn event_text_line(event: &ReceivedEvent, base64_body: bool) -> String {
    let mut parts = vec![
        format!("seq={}", event.sequence_number),
        format!("offset={}", event.offset),
        time_text(event.enqueued_time_ms),
    ];
    if let Some(key) = &event.partition_key {
        parts.push(format!("key={}", escape_controls(key)));
    }
    if !event.properties.is_empty() {
        let properties: Vec<String> = event
            .properties
            .iter()
            .map(|(key, value)| format!("{}={}", escape_controls(key), property_text(value)))
            .collect();
        parts.push(properties.join(" "));
    }
    parts.push(match body_text(event, base64_body) {
        Body::Text(text) => escape_controls(text),
        Body::Base64(encoded) => format!("base64:{encoded}"),
    });
    parts.join("  ")
}

enum Body<'a> {
    Text(&'a str),
    Base64(String),
}

fn body_text(event: &ReceivedEvent, base64_body: bool) -> Body<'_> {
    match std::str::from_utf8(&event.body) {
        Ok(text) if !base64_body => Body::Text(text),
        _ => Body::Base64(BASE64.encode(&event.body)),
    }
}

fn property_json(value: &PropertyValue) -> serde_json::Value {
    match value {
        PropertyValue::String(v) => serde_json::Value::from(v.as_str()),
        PropertyValue::Int64(v) => serde_json::Value::from(*v),
        // JSON has no NaN or infinity: those are shown as strings ("NaN", "inf", "-inf").
        PropertyValue::Double(v) => serde_json::Number::from_f64(*v).map_or_else(
            || serde_json::Value::from(v.to_string()),
            serde_json::Value::Number,
        ),
        PropertyValue::Bool(v) => serde_json::Value::from(*v),
        PropertyValue::Bytes(v) => serde_json::Value::from(BASE64.encode(v)),
        PropertyValue::TimestampMs(v) => time_json(*v),
    }
}

fn property_text(value: &PropertyValue) -> String {
    match value {
        PropertyValue::String(v) => format!("{v:?}"),
        PropertyValue::Int64(v) => v.to_string(),
        PropertyValue::Double(v) => v.to_string(),
        PropertyValue::Bool(v) => v.to_string(),
        PropertyValue::Bytes(v) => format!("base64:{}", BASE64.encode(v)),
        PropertyValue::TimestampMs(v) => time_text(*v),
    }
}

fn escape_controls(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            let _ = write!(escaped, "{}", c.escape_default());
        } else {
            escaped.push(c);
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use serde_json::json;

    use super::*;

    fn event(body: &'static [u8]) -> ReceivedEvent {
        ReceivedEvent {
            body: Bytes::from_static(body),
            properties: BTreeMap::new(),
            sequence_number: 42,
            offset: "8192".into(),
            enqueued_time_ms: 1_714_564_800_250,
            partition_key: None,
        }
    }

    fn parse(line: &str) -> serde_json::Value {
        assert!(!line.contains('\n'), "one event must be one line: {line}");
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn json_line_has_every_field_and_property_kind() {
        let mut event = event(b"hello");
        event.partition_key = Some("device-42".into());
        event.properties = BTreeMap::from([
            ("s".to_owned(), PropertyValue::String("red".into())),
            ("i".to_owned(), PropertyValue::Int64(-7)),
            ("d".to_owned(), PropertyValue::Double(2.5)),
            ("nan".to_owned(), PropertyValue::Double(f64::NAN)),
            ("b".to_owned(), PropertyValue::Bool(true)),
            (
                "raw".to_owned(),
                PropertyValue::Bytes(Bytes::from_static(&[0, 1, 255])),
            ),
            (
                "t".to_owned(),
                PropertyValue::TimestampMs(1_714_564_800_000),
            ),
        ]);
        let line = event_json_line("3", &event, false);
        assert_eq!(
            parse(&line),
            json!({
                "partition": "3",
                "sequence_number": 42,
                "offset": "8192",
                "enqueued_time": "2024-05-01T12:00:00.250Z",
                "partition_key": "device-42",
                "properties": {
                    "s": "red",
                    "i": -7,
                    "d": 2.5,
                    "nan": "NaN",
                    "b": true,
                    "raw": "AAH/",
                    "t": "2024-05-01T12:00:00.000Z",
                },
                "body": "hello",
            })
        );
        assert!(line.starts_with(r#"{"partition":"3","sequence_number":42,"offset":"8192""#));
    }

    #[test]
    fn json_line_without_key_has_null_and_empty_properties() {
        let value = parse(&event_json_line("0", &event(b"x"), false));
        assert_eq!(value["partition_key"], serde_json::Value::Null);
        assert_eq!(value["properties"], json!({}));
        assert_eq!(value.get("body_encoding"), None);
    }

    #[test]
    fn base64_bodies() {
        let asked = parse(&event_json_line("0", &event(b"hello"), true));
        assert_eq!(asked["body"], "aGVsbG8=");
        assert_eq!(asked.get("body_encoding"), None);

        let binary = parse(&event_json_line("0", &event(&[0xff, 0xfe]), false));
        assert_eq!(binary["body"], "//4=");
        assert_eq!(binary["body_encoding"], "base64");
    }

    #[test]
    fn text_line_is_one_readable_line() {
        let mut event = event(b"two\nlines");
        event.partition_key = Some("k".into());
        event.properties = BTreeMap::from([
            ("color".to_owned(), PropertyValue::String("red".into())),
            ("n".to_owned(), PropertyValue::Int64(5)),
        ]);
        assert_eq!(
            event_text_line(&event, false),
            r#"seq=42  offset=8192  2024-05-01T12:00:00.250Z  key=k  color="red" n=5  two\nlines"#
        );
        assert!(event_text_line(&event, true).ends_with("base64:dHdvCmxpbmVz"));
    }
}
