//! A capture file: an Avro object container file of `EventData` records, the schema Event
//! Hubs Capture writes, so tools that read Event Hubs capture files read ours.

use std::collections::HashMap;
use std::sync::LazyLock;

use apache_avro::types::Value;
use apache_avro::{Codec, DeflateSettings, Schema, Writer};
use tributary_types::UtcDateTime;

use crate::capture::CaptureError;
use crate::partition::ReadEvent;
use crate::partition::codec::Property;

/// The record schema of every capture file, exactly as Event Hubs Capture writes it.
pub const SCHEMA_JSON: &str = r#"{
    "type": "record",
    "name": "EventData",
    "namespace": "Microsoft.ServiceBus.Messaging",
    "fields": [
        {"name": "SequenceNumber", "type": "long"},
        {"name": "Offset", "type": "string"},
        {"name": "EnqueuedTimeUtc", "type": "string"},
        {"name": "SystemProperties", "type": {"type": "map", "values": ["long", "double", "string", "bytes"]}},
        {"name": "Properties", "type": {"type": "map", "values": ["long", "double", "string", "bytes", "null"]}},
        {"name": "Body", "type": ["null", "bytes"]}
    ]
}"#;

static SCHEMA: LazyLock<Schema> =
    LazyLock::new(|| Schema::parse_str(SCHEMA_JSON).expect("the capture schema is valid Avro"));

/// Branches of the `SystemProperties` values' union, in schema order.
const SYSTEM_LONG: u32 = 0;
const SYSTEM_STRING: u32 = 2;
/// Branches of the `Properties` values' union, in schema order.
const PROPERTY_LONG: u32 = 0;
const PROPERTY_DOUBLE: u32 = 1;
const PROPERTY_STRING: u32 = 2;
const PROPERTY_BYTES: u32 = 3;
/// The `bytes` branch of `Body`.
const BODY_BYTES: u32 = 1;

/// Encodes `events` as one Avro object container file (deflate codec) of [`SCHEMA_JSON`]
/// records, in the order given. No events give a file with only the header, as Event Hubs
/// writes for an idle window.
///
/// Each event's properties become the `Properties` map (a name given twice keeps its last
/// value); its sequence number, offset, enqueued time and partition key become
/// `SystemProperties` under the AMQP annotation names Event Hubs uses.
pub fn encode_file(events: &[ReadEvent]) -> Result<Vec<u8>, CaptureError> {
    let encode_error = |err| CaptureError::Encode(Box::new(err));
    let codec = Codec::Deflate(DeflateSettings::default());
    let mut writer = Writer::with_codec(&SCHEMA, Vec::new(), codec);
    for event in events {
        writer.append(record(event)).map_err(encode_error)?;
    }
    writer.into_inner().map_err(encode_error)
}

/// `ms` milliseconds since the Unix epoch as Event Hubs Capture writes `EnqueuedTimeUtc`:
/// .NET's invariant format `M/d/yyyy h:mm:ss tt` in UTC, e.g. "1/27/2019 11:04:48 PM"
/// (12-hour clock, hour 0 written as 12, no milliseconds).
pub fn format_enqueued_time_utc(ms: i64) -> String {
    let UtcDateTime {
        year,
        month,
        day,
        hour,
        minute,
        second,
        ..
    } = UtcDateTime::from_unix_ms(ms);
    let hour_12 = match hour % 12 {
        0 => 12,
        h => h,
    };
    let meridiem = if hour < 12 { "AM" } else { "PM" };
    format!("{month}/{day}/{year:04} {hour_12}:{minute:02}:{second:02} {meridiem}")
}

fn record(event: &ReadEvent) -> Value {
    let mut system = HashMap::from([
        (
            "x-opt-sequence-number".to_owned(),
            union(SYSTEM_LONG, Value::Long(event.sequence)),
        ),
        (
            "x-opt-offset".to_owned(),
            union(SYSTEM_STRING, Value::String(event.offset.to_string())),
        ),
        (
            "x-opt-enqueued-time".to_owned(),
            union(SYSTEM_LONG, Value::Long(event.enqueued_time_ms)),
        ),
    ]);
    if let Some(key) = &event.record.partition_key {
        system.insert(
            "x-opt-partition-key".to_owned(),
            union(SYSTEM_STRING, Value::String(key.clone())),
        );
    }
    let properties = event
        .record
        .properties
        .iter()
        .map(|(name, value)| (name.clone(), property(value)))
        .collect();
    Value::Record(vec![
        ("SequenceNumber".to_owned(), Value::Long(event.sequence)),
        ("Offset".to_owned(), Value::String(event.offset.to_string())),
        (
            "EnqueuedTimeUtc".to_owned(),
            Value::String(format_enqueued_time_utc(event.enqueued_time_ms)),
        ),
        ("SystemProperties".to_owned(), Value::Map(system)),
        ("Properties".to_owned(), Value::Map(properties)),
        (
            "Body".to_owned(),
            union(BODY_BYTES, Value::Bytes(event.record.body.to_vec())),
        ),
    ])
}

/// A property as the `Properties` union has it: Avro has no boolean or timestamp branch
/// there, so a boolean is the string "true"/"false" and a timestamp its milliseconds.
fn property(value: &Property) -> Value {
    match value {
        Property::String(s) => union(PROPERTY_STRING, Value::String(s.clone())),
        Property::Int64(n) => union(PROPERTY_LONG, Value::Long(*n)),
        Property::Double(x) => union(PROPERTY_DOUBLE, Value::Double(*x)),
        Property::Bool(b) => union(PROPERTY_STRING, Value::String(b.to_string())),
        Property::Bytes(bytes) => union(PROPERTY_BYTES, Value::Bytes(bytes.to_vec())),
        Property::TimestampMs(ms) => union(PROPERTY_LONG, Value::Long(*ms)),
    }
}

fn union(branch: u32, value: Value) -> Value {
    Value::Union(branch, Box::new(value))
}

#[cfg(test)]
mod tests {
    use apache_avro::Reader;
    use bytes::Bytes;

    use super::*;
    use crate::partition::codec::EventRecord;

    /// 2019-01-27T23:04:48.250Z
    const LATE_EVENING_MS: i64 = 1_548_630_288_250;

    fn sample_events() -> Vec<ReadEvent> {
        vec![
            ReadEvent {
                sequence: 0,
                offset: 0,
                enqueued_time_ms: LATE_EVENING_MS,
                record: EventRecord {
                    partition_key: Some("device-7".to_owned()),
                    properties: vec![
                        ("s".to_owned(), Property::String("text".to_owned())),
                        ("i".to_owned(), Property::Int64(-42)),
                        ("d".to_owned(), Property::Double(2.5)),
                        ("t".to_owned(), Property::Bool(true)),
                        ("f".to_owned(), Property::Bool(false)),
                        (
                            "b".to_owned(),
                            Property::Bytes(Bytes::from_static(&[0, 255])),
                        ),
                        ("at".to_owned(), Property::TimestampMs(LATE_EVENING_MS)),
                    ],
                    body: Bytes::from_static(b"first"),
                },
            },
            ReadEvent {
                sequence: 1,
                offset: 4096,
                enqueued_time_ms: 0,
                record: EventRecord {
                    partition_key: None,
                    properties: vec![],
                    body: Bytes::new(),
                },
            },
        ]
    }

    fn field<'a>(record: &'a Value, name: &str) -> &'a Value {
        let Value::Record(fields) = record else {
            panic!("not a record: {record:?}");
        };
        &fields.iter().find(|(n, _)| n == name).unwrap().1
    }

    fn map(value: &Value) -> &HashMap<String, Value> {
        let Value::Map(map) = value else {
            panic!("not a map: {value:?}");
        };
        map
    }

    fn read_back(file: &[u8]) -> (Schema, Vec<Value>) {
        let reader = Reader::new(file).unwrap();
        let schema = reader.writer_schema().clone();
        let records = reader.map(Result::unwrap).collect();
        (schema, records)
    }

    #[test]
    fn writes_the_event_hubs_schema() {
        let file = encode_file(&sample_events()).unwrap();
        let (schema, _) = read_back(&file);
        let expected = Schema::parse_str(SCHEMA_JSON).unwrap();
        assert_eq!(schema.canonical_form(), expected.canonical_form());
        // The header's JSON, not only its canonical form: the namespace is kept.
        let written: serde_json::Value = serde_json::to_value(&schema).unwrap();
        assert_eq!(written["name"], "EventData");
        assert_eq!(written["namespace"], "Microsoft.ServiceBus.Messaging");
        let names: Vec<&str> = written["fields"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            names,
            [
                "SequenceNumber",
                "Offset",
                "EnqueuedTimeUtc",
                "SystemProperties",
                "Properties",
                "Body"
            ]
        );
    }

    #[test]
    fn uses_the_deflate_codec() {
        let file = encode_file(&sample_events()).unwrap();
        // In the header's metadata map, the key is followed by its value: a length (7,
        // zig-zag encoded as 14) and the codec's name.
        let key = b"avro.codec";
        let at = file
            .windows(key.len())
            .position(|window| window == key)
            .expect("the header names its codec")
            + key.len();
        assert_eq!(&file[at..at + 8], b"\x0edeflate");
    }

    #[test]
    fn every_field_reads_back() {
        let file = encode_file(&sample_events()).unwrap();
        let (_, records) = read_back(&file);
        assert_eq!(records.len(), 2);

        let first = &records[0];
        assert_eq!(field(first, "SequenceNumber"), &Value::Long(0));
        assert_eq!(field(first, "Offset"), &Value::String("0".to_owned()));
        assert_eq!(
            field(first, "EnqueuedTimeUtc"),
            &Value::String("1/27/2019 11:04:48 PM".to_owned())
        );
        assert_eq!(
            field(first, "Body"),
            &union(BODY_BYTES, Value::Bytes(b"first".to_vec()))
        );
        let system = map(field(first, "SystemProperties"));
        assert_eq!(
            system,
            &HashMap::from([
                (
                    "x-opt-sequence-number".to_owned(),
                    union(SYSTEM_LONG, Value::Long(0))
                ),
                (
                    "x-opt-offset".to_owned(),
                    union(SYSTEM_STRING, Value::String("0".to_owned()))
                ),
                (
                    "x-opt-enqueued-time".to_owned(),
                    union(SYSTEM_LONG, Value::Long(LATE_EVENING_MS))
                ),
                (
                    "x-opt-partition-key".to_owned(),
                    union(SYSTEM_STRING, Value::String("device-7".to_owned()))
                ),
            ])
        );
        let properties = map(field(first, "Properties"));
        let text = |s: &str| union(PROPERTY_STRING, Value::String(s.to_owned()));
        assert_eq!(
            properties,
            &HashMap::from([
                ("s".to_owned(), text("text")),
                ("i".to_owned(), union(PROPERTY_LONG, Value::Long(-42))),
                ("d".to_owned(), union(PROPERTY_DOUBLE, Value::Double(2.5))),
                ("t".to_owned(), text("true")),
                ("f".to_owned(), text("false")),
                (
                    "b".to_owned(),
                    union(PROPERTY_BYTES, Value::Bytes(vec![0, 255]))
                ),
                (
                    "at".to_owned(),
                    union(PROPERTY_LONG, Value::Long(LATE_EVENING_MS))
                ),
            ])
        );

        let second = &records[1];
        assert_eq!(field(second, "SequenceNumber"), &Value::Long(1));
        assert_eq!(field(second, "Offset"), &Value::String("4096".to_owned()));
        assert_eq!(
            field(second, "EnqueuedTimeUtc"),
            &Value::String("1/1/1970 12:00:00 AM".to_owned())
        );
        // An empty body is empty bytes, not null.
        assert_eq!(
            field(second, "Body"),
            &union(BODY_BYTES, Value::Bytes(vec![]))
        );
        let system = map(field(second, "SystemProperties"));
        assert!(!system.contains_key("x-opt-partition-key"), "{system:?}");
        assert_eq!(system["x-opt-offset"], text("4096"));
        assert!(map(field(second, "Properties")).is_empty());
    }

    #[test]
    fn no_events_is_a_valid_empty_file() {
        let file = encode_file(&[]).unwrap();
        let (schema, records) = read_back(&file);
        assert!(records.is_empty());
        assert_eq!(schema, *SCHEMA);
    }

    #[test]
    fn many_events_span_several_blocks() {
        let events: Vec<ReadEvent> = (0..2000)
            .map(|i| ReadEvent {
                sequence: i,
                offset: i * 100,
                enqueued_time_ms: LATE_EVENING_MS + i,
                record: EventRecord {
                    partition_key: None,
                    properties: vec![],
                    body: Bytes::from(format!("event {i} {}", "x".repeat(40))),
                },
            })
            .collect();
        let (_, records) = read_back(&encode_file(&events).unwrap());
        let sequences: Vec<&Value> = records.iter().map(|r| field(r, "SequenceNumber")).collect();
        let expected: Vec<Value> = (0..2000).map(Value::Long).collect();
        assert_eq!(sequences, expected.iter().collect::<Vec<_>>());
    }

    #[test]
    fn enqueued_time_is_the_dotnet_invariant_format() {
        let cases = [
            (LATE_EVENING_MS, "1/27/2019 11:04:48 PM"),
            (0, "1/1/1970 12:00:00 AM"),
            // 2026-11-22T12:00:05Z: noon is 12 PM.
            (1_795_348_805_000, "11/22/2026 12:00:05 PM"),
            // 2026-11-22T00:59:09.999Z: just before 1 AM, milliseconds dropped.
            (1_795_309_149_999, "11/22/2026 12:59:09 AM"),
            // 2000-02-29T11:59:59Z: the last second before noon.
            (951_825_599_000, "2/29/2000 11:59:59 AM"),
            // 2024-10-05T13:07:00Z
            (1_728_133_620_000, "10/5/2024 1:07:00 PM"),
        ];
        for (ms, text) in cases {
            assert_eq!(format_enqueued_time_utc(ms), text, "{ms}");
        }
    }
}
