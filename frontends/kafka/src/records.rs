//! Kafka records as events: the key is the event's partition key (UTF-8; other bytes are
//! kept in the `x-opt-kafka-key` property), the value its body, headers its properties
//! (bytes), the producer's timestamp the `x-opt-kafka-timestamp` property.
//!
//! Record batches (magic 2) are read here rather than by kafka-protocol's decoder, which
//! reserves room for the counts a batch and each record declare and decompresses without a
//! limit: every count is checked against the bytes left, and decompression stops at the
//! request's budget (a gzip or zstd "bomb" is refused after `budget` bytes, not once it has
//! filled the memory).

use std::io::Read;

use bytes::{Buf, Bytes};
use tributary_broker::service::{EventRecord, Property};

/// The property a key that is not UTF-8 travels in.
pub const KAFKA_KEY_PROPERTY: &str = "x-opt-kafka-key";
/// The property a record's own (create) timestamp travels in, in milliseconds.
pub const KAFKA_TIMESTAMP_PROPERTY: &str = "x-opt-kafka-timestamp";

/// Why a partition's records were refused (as a whole).
#[derive(Debug, PartialEq, Eq)]
pub enum RecordsError {
    Corrupt(String),
    /// Decompressed, the records would exceed what one request may carry.
    TooLarge(usize),
    Transactional,
}

impl std::fmt::Display for RecordsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordsError::Corrupt(why) => write!(f, "corrupt record batch: {why}"),
            RecordsError::TooLarge(max) => write!(
                f,
                "the records, decompressed, exceed the {max} bytes one request may carry"
            ),
            RecordsError::Transactional => {
                write!(
                    f,
                    "transactional batches are not supported (no transactions here)"
                )
            }
        }
    }
}

fn corrupt(why: impl Into<String>) -> RecordsError {
    RecordsError::Corrupt(why.into())
}

/// One record batch as a producer sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// -1 unless the producer is idempotent.
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub records: Vec<KafkaRecord>,
}

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    /// The producer's timestamp (milliseconds), or the broker's when the batch says
    /// LogAppendTime.
    pub timestamp: Option<i64>,
    pub key: Option<Bytes>,
    pub value: Option<Bytes>,
    pub headers: Vec<(String, Option<Bytes>)>,
}

/// Bytes of a v2 batch header after `baseOffset` and `batchLength`, up to the records.
const BATCH_HEADER_AFTER_LENGTH: usize = 49;

/// Decodes a partition's record batches (any codec: none, gzip, snappy, lz4, zstd).
/// `budget` is what the records may still take decompressed; it shrinks by what they took
/// when they are accepted (refused ones are dropped at once).
pub fn decode(records: &Bytes, budget: &mut usize) -> Result<Vec<Batch>, RecordsError> {
    let mut left = *budget;
    let batches = decode_within(records, &mut left)?;
    *budget = left;
    Ok(batches)
}

fn decode_within(records: &Bytes, budget: &mut usize) -> Result<Vec<Batch>, RecordsError> {
    let mut buf = records.clone();
    let mut batches = Vec::new();
    while buf.has_remaining() {
        if buf.remaining() < 12 {
            return Err(corrupt("a truncated batch header"));
        }
        let _base_offset = buf.get_i64();
        let length = buf.get_i32();
        let length = usize::try_from(length)
            .ok()
            .filter(|l| *l >= BATCH_HEADER_AFTER_LENGTH && *l <= buf.remaining())
            .ok_or_else(|| {
                corrupt(format!(
                    "a batch length of {length} with {} bytes left",
                    buf.remaining()
                ))
            })?;
        let mut batch = buf.split_to(length);
        let _leader_epoch = batch.get_i32();
        let magic = batch.get_i8();
        if magic != 2 {
            return Err(corrupt(format!(
                "message format v{magic} (only v2 record batches are accepted)"
            )));
        }
        let crc = batch.get_u32();
        if crc32c::crc32c(&batch) != crc {
            return Err(corrupt("the batch CRC does not match its bytes"));
        }
        let attributes = batch.get_i16();
        let _last_offset_delta = batch.get_i32();
        let base_timestamp = batch.get_i64();
        let _max_timestamp = batch.get_i64();
        let producer_id = batch.get_i64();
        let producer_epoch = batch.get_i16();
        let base_sequence = batch.get_i32();
        let count = batch.get_i32();
        if attributes & (1 << 4) != 0 {
            return Err(RecordsError::Transactional);
        }
        let control = attributes & (1 << 5) != 0;
        let log_append_time = attributes & (1 << 3) != 0;
        let body = decompress(attributes & 0x7, batch, budget)?;
        let count = usize::try_from(count)
            .map_err(|_| corrupt(format!("a batch declaring {count} records")))?;
        let mut records = Vec::with_capacity(count.min(body.len()));
        let mut body = body;
        for _ in 0..count {
            let record = read_record(&mut body, base_timestamp)?;
            if !control {
                records.push(KafkaRecord {
                    timestamp: (!log_append_time).then_some(record.timestamp).flatten(),
                    ..record
                });
            }
        }
        if body.has_remaining() {
            return Err(corrupt(format!(
                "{} bytes after the batch's {count} records",
                body.remaining()
            )));
        }
        if !control {
            batches.push(Batch {
                producer_id,
                producer_epoch,
                base_sequence,
                records,
            });
        }
    }
    Ok(batches)
}

/// A batch's records, decompressed within `budget` (and the budget reduced by their size).
fn decompress(codec: i16, compressed: Bytes, budget: &mut usize) -> Result<Bytes, RecordsError> {
    let limit = *budget;
    let too_large = || RecordsError::TooLarge(limit);
    let bytes = match codec {
        0 => compressed,
        1 => read_capped(flate2::read::MultiGzDecoder::new(&compressed[..]), limit)?,
        2 => snappy(&compressed, limit)?,
        3 => read_capped(
            lz4::Decoder::new(&compressed[..]).map_err(|e| corrupt(format!("lz4: {e}")))?,
            limit,
        )?,
        4 => read_capped(
            zstd::stream::read::Decoder::new(&compressed[..])
                .map_err(|e| corrupt(format!("zstd: {e}")))?,
            limit,
        )?,
        other => return Err(corrupt(format!("unknown compression codec {other}"))),
    };
    if bytes.len() > limit {
        return Err(too_large());
    }
    *budget -= bytes.len();
    Ok(bytes)
}

/// Reads a decompressing reader to its end, refusing more than `limit` bytes.
fn read_capped(reader: impl Read, limit: usize) -> Result<Bytes, RecordsError> {
    let mut out = Vec::new();
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    reader
        .take(cap)
        .read_to_end(&mut out)
        .map_err(|e| corrupt(format!("decompressing: {e}")))?;
    if out.len() > limit {
        return Err(RecordsError::TooLarge(limit));
    }
    Ok(Bytes::from(out))
}

/// Java's (xerial) snappy framing, which Kafka clients write, or a raw snappy block.
fn snappy(compressed: &[u8], limit: usize) -> Result<Bytes, RecordsError> {
    const XERIAL: &[u8] = b"\x82SNAPPY\x00";
    const XERIAL_HEADER: usize = 16;
    let block = |raw: &[u8], out: &mut Vec<u8>| -> Result<(), RecordsError> {
        let len = snap::raw::decompress_len(raw).map_err(|e| corrupt(format!("snappy: {e}")))?;
        if out.len().saturating_add(len) > limit {
            return Err(RecordsError::TooLarge(limit));
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new()
            .decompress(raw, &mut out[start..])
            .map_err(|e| corrupt(format!("snappy: {e}")))?;
        Ok(())
    };
    let mut out = Vec::new();
    if !compressed.starts_with(XERIAL) {
        block(compressed, &mut out)?;
        return Ok(Bytes::from(out));
    }
    let mut rest = compressed
        .get(XERIAL_HEADER..)
        .ok_or_else(|| corrupt("a truncated snappy header"))?;
    while !rest.is_empty() {
        if rest.len() < 4 {
            return Err(corrupt("a truncated snappy block length"));
        }
        let len = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let raw = rest
            .get(4..4 + len)
            .ok_or_else(|| corrupt("a truncated snappy block"))?;
        block(raw, &mut out)?;
        rest = &rest[4 + len..];
    }
    Ok(Bytes::from(out))
}

/// A zig-zag varint of at most `max_bytes` bytes.
fn varint(buf: &mut Bytes, max_bytes: usize) -> Result<i64, RecordsError> {
    let mut value: u64 = 0;
    for i in 0..max_bytes {
        if !buf.has_remaining() {
            return Err(corrupt("a truncated varint"));
        }
        let byte = buf.get_u8();
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err(corrupt("a varint longer than its type"))
}

/// A length-prefixed field: -1 is null, anything else must fit in what is left.
fn field(buf: &mut Bytes) -> Result<Option<Bytes>, RecordsError> {
    match varint(buf, 5)? {
        -1 => Ok(None),
        len => usize::try_from(len)
            .ok()
            .filter(|l| *l <= buf.remaining())
            .map(|l| Some(buf.split_to(l)))
            .ok_or_else(|| {
                corrupt(format!(
                    "a field of {len} bytes with {} left",
                    buf.remaining()
                ))
            }),
    }
}

fn read_record(buf: &mut Bytes, base_timestamp: i64) -> Result<KafkaRecord, RecordsError> {
    let len = varint(buf, 5)?;
    let mut record = usize::try_from(len)
        .ok()
        .filter(|l| *l <= buf.remaining())
        .map(|l| buf.split_to(l))
        .ok_or_else(|| {
            corrupt(format!(
                "a record of {len} bytes with {} left",
                buf.remaining()
            ))
        })?;
    if !record.has_remaining() {
        return Err(corrupt("an empty record"));
    }
    let _attributes = record.get_i8();
    let timestamp_delta = varint(&mut record, 10)?;
    let _offset_delta = varint(&mut record, 5)?;
    let key = field(&mut record)?;
    let value = field(&mut record)?;
    let count = varint(&mut record, 5)?;
    // Each header takes at least two bytes (its two lengths).
    let count = usize::try_from(count)
        .ok()
        .filter(|c| c.saturating_mul(2) <= record.remaining())
        .ok_or_else(|| corrupt(format!("a record declaring {count} headers")))?;
    let mut headers = Vec::with_capacity(count);
    for _ in 0..count {
        let name = field(&mut record)?.ok_or_else(|| corrupt("a header without a name"))?;
        let name = String::from_utf8(name.to_vec())
            .map_err(|_| corrupt("a header name that is not UTF-8"))?;
        headers.push((name, field(&mut record)?));
    }
    if record.has_remaining() {
        return Err(corrupt("bytes after a record's headers"));
    }
    Ok(KafkaRecord {
        timestamp: base_timestamp.checked_add(timestamp_delta),
        key,
        value,
        headers,
    })
}

/// A record as the event stored.
pub fn event(record: KafkaRecord) -> EventRecord {
    let mut properties: Vec<(String, Property)> = record
        .headers
        .into_iter()
        .map(|(name, value)| (name, Property::Bytes(value.unwrap_or_default())))
        .collect();
    let partition_key = match record.key {
        None => None,
        Some(key) => match std::str::from_utf8(&key) {
            Ok(text) => Some(text.to_owned()),
            Err(_) => {
                properties.push((KAFKA_KEY_PROPERTY.to_owned(), Property::Bytes(key)));
                None
            }
        },
    };
    if let Some(timestamp) = record.timestamp.filter(|t| *t >= 0) {
        properties.push((
            KAFKA_TIMESTAMP_PROPERTY.to_owned(),
            Property::TimestampMs(timestamp),
        ));
    }
    EventRecord {
        partition_key,
        properties,
        body: record.value.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::indexmap::IndexMap;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };
    use proptest::prelude::*;

    const BUDGET: usize = 1 << 20;

    fn record(key: Option<&[u8]>, value: &[u8], producer_id: i64) -> Record {
        let mut headers = IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from_static(b"v")),
        );
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id,
            producer_epoch: if producer_id >= 0 { 3 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: 0,
            sequence: if producer_id >= 0 { 40 } else { -1 },
            timestamp: 1_700_000_000_000,
            key: key.map(Bytes::copy_from_slice),
            value: Some(Bytes::copy_from_slice(value)),
            headers,
        }
    }

    fn batch(records: &[Record], compression: Compression) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records.iter(),
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn events(bytes: &Bytes) -> Vec<EventRecord> {
        let mut budget = BUDGET;
        decode(bytes, &mut budget)
            .unwrap()
            .into_iter()
            .flat_map(|b| b.records)
            .map(event)
            .collect()
    }

    /// A batch's CRC-32C (bytes 17..21) recomputed over bytes 21 on, after an edit.
    fn reseal(batch: &mut BytesMut) {
        let crc = crc32c::crc32c(&batch[21..]);
        batch[17..21].copy_from_slice(&crc.to_be_bytes());
    }

    #[test]
    fn records_of_every_codec_become_events() {
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let bytes = batch(
                &[
                    record(Some(b"customer-7"), b"one", -1),
                    record(None, b"two", -1),
                ],
                compression,
            );
            let events = events(&bytes);
            assert_eq!(events.len(), 2, "{compression:?}");
            assert_eq!(events[0].partition_key.as_deref(), Some("customer-7"));
            assert_eq!(&events[0].body[..], b"one");
            assert_eq!(
                events[0].properties,
                vec![
                    ("h".to_string(), Property::Bytes(Bytes::from_static(b"v"))),
                    (
                        KAFKA_TIMESTAMP_PROPERTY.to_string(),
                        Property::TimestampMs(1_700_000_000_000)
                    )
                ]
            );
            assert_eq!(events[1].partition_key, None);
        }
        let binary = event(KafkaRecord {
            timestamp: None,
            key: Some(Bytes::from_static(&[0xff, 0x00])),
            value: None,
            headers: Vec::new(),
        });
        assert_eq!(binary.partition_key, None);
        assert_eq!(
            binary.properties,
            vec![(
                KAFKA_KEY_PROPERTY.to_string(),
                Property::Bytes(Bytes::from_static(&[0xff, 0x00]))
            )]
        );
    }

    #[test]
    fn a_batch_carries_its_producer_and_the_budget_shrinks_by_its_size() {
        let bytes = batch(&[record(None, b"one", 7)], Compression::None);
        let mut budget = BUDGET;
        let batches = decode(&bytes, &mut budget).unwrap();
        assert_eq!(
            (
                batches[0].producer_id,
                batches[0].producer_epoch,
                batches[0].base_sequence
            ),
            (7, 3, 40)
        );
        assert_eq!(BUDGET - budget, bytes.len() - 61);
    }

    #[test]
    fn corrupt_batches_are_refused() {
        let good = batch(&[record(None, b"one", -1)], Compression::None);
        let mut corrupt = BytesMut::from(&good[..]);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        let mut budget = BUDGET;
        assert!(matches!(
            decode(&corrupt.freeze(), &mut budget),
            Err(RecordsError::Corrupt(why)) if why.contains("CRC")
        ));
        // A batch declaring more records than it holds (the count sits at bytes 57..61).
        let mut huge = BytesMut::from(&good[..]);
        huge[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        reseal(&mut huge);
        assert!(matches!(
            decode(&huge.freeze(), &mut budget),
            Err(RecordsError::Corrupt(why)) if why.contains("truncated")
        ));
        // A record declaring a billion headers: its last byte is the header count (the one
        // header "h"="v" takes 4 bytes after it; rewrite the record without them).
        let bare = Record {
            headers: IndexMap::new(),
            ..record(None, b"one", -1)
        };
        let mut headers = BytesMut::from(&batch(&[bare], Compression::None)[..]);
        let last = headers.len() - 1;
        assert_eq!(headers[last], 0, "zero headers");
        headers.truncate(last);
        headers.extend_from_slice(&[0x80, 0xa8, 0xd6, 0xb9, 0x07]); // 1e9 zig-zag
        // The record's length (byte 61) and the batch's (bytes 8..12) grow by 4.
        headers[61] += 8;
        let length = i32::from_be_bytes(headers[8..12].try_into().unwrap()) + 4;
        headers[8..12].copy_from_slice(&length.to_be_bytes());
        reseal(&mut headers);
        assert!(matches!(
            decode(&headers.freeze(), &mut budget),
            Err(RecordsError::Corrupt(why)) if why.contains("1000000000 headers")
        ));
        let mut transactional = BytesMut::from(&good[..]);
        transactional[22] |= 1 << 4;
        reseal(&mut transactional);
        assert_eq!(
            decode(&transactional.freeze(), &mut budget),
            Err(RecordsError::Transactional)
        );
        assert_eq!(budget, BUDGET, "nothing refused takes from the budget");
    }

    #[test]
    fn decompression_stops_at_the_budget() {
        // 4 MiB of zeros: a few KiB compressed with every codec.
        let zeros = vec![0u8; 4 << 20];
        for compression in [
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let bytes = batch(&[record(None, &zeros, -1)], compression);
            assert!(bytes.len() < 256 << 10, "{compression:?}: {}", bytes.len());
            let mut budget = BUDGET;
            assert_eq!(
                decode(&bytes, &mut budget),
                Err(RecordsError::TooLarge(BUDGET)),
                "{compression:?}"
            );
            let mut budget = 8 << 20;
            let decoded = decode(&bytes, &mut budget).unwrap();
            assert_eq!(decoded[0].records[0].value.as_ref().unwrap().len(), 4 << 20);
        }
    }

    proptest! {
        /// Random bytes, and valid batches with random bytes changed (the CRC mended, so the
        /// record walk sees them), are decoded or refused: never a panic or an allocation
        /// beyond what the bytes hold.
        #[test]
        fn arbitrary_batches_are_decoded_or_refused(
            noise in proptest::collection::vec(any::<u8>(), 0..200),
            edits in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8),
            codec in 0usize..5,
        ) {
            let mut budget = BUDGET;
            let _ = decode(&Bytes::from(noise), &mut budget);
            let compression = [
                Compression::None,
                Compression::Gzip,
                Compression::Snappy,
                Compression::Lz4,
                Compression::Zstd,
            ][codec];
            let good = batch(
                &[record(Some(b"k"), b"value", -1), record(None, b"second", -1)],
                compression,
            );
            let mut bad = BytesMut::from(&good[..]);
            for (at, byte) in edits {
                let at = 21 + at % (bad.len() - 21);
                bad[at] = byte;
            }
            reseal(&mut bad);
            let _ = decode(&bad.freeze(), &mut budget);
        }
    }
}
