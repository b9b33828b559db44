//! Kafka records as events: the key is the event's partition key (UTF-8; other bytes are
//! kept in the `x-opt-kafka-key` property), the value its body, headers its properties
//! (bytes).

use bytes::Bytes;
use kafka_protocol::records::{BatchDecodeInfo, Compression, Record, RecordBatchDecoder};
use tributary_broker::service::{EventRecord, KafkaProducerStamp, Property};

/// The property a key that is not UTF-8 travels in.
pub const KAFKA_KEY_PROPERTY: &str = "x-opt-kafka-key";

/// A produce request's records for one partition, refused as a whole when malformed or
/// from a transactional producer (not served).
#[derive(Debug, PartialEq, Eq)]
pub enum RecordsError {
    Corrupt(String),
    Transactional,
}

/// A partition's records, and the idempotent producer's numbering of them (its batches'
/// producer id, epoch and first sequence; `None` for a producer without idempotence).
#[derive(Debug)]
pub struct Decoded {
    pub records: Vec<Record>,
    pub producer: Option<KafkaProducerStamp>,
}

/// Records one batch may declare (kafka-protocol reserves the declared count up front).
const RECORDS_PER_BATCH_MAX: i32 = 200_000;

/// Decodes a partition's record batches (any codec: none, gzip, snappy, lz4, zstd).
pub fn decode(records: &Bytes) -> Result<Decoded, RecordsError> {
    // Each batch's declared record count, checked before the decoder reserves room for it:
    // an uncompressed record takes at least a byte, and no batch may declare more than
    // RECORDS_PER_BATCH_MAX.
    let infos = RecordBatchDecoder::decode_batch_info(&mut records.clone())
        .map_err(|err| RecordsError::Corrupt(err.to_string()))?;
    for info in &infos {
        let bound = match info.compression {
            Compression::None => {
                RECORDS_PER_BATCH_MAX.min(i32::try_from(records.len()).unwrap_or(i32::MAX))
            }
            _ => RECORDS_PER_BATCH_MAX,
        };
        if info.record_count > bound {
            return Err(RecordsError::Corrupt(format!(
                "a batch declaring {} records (at most {bound} here)",
                info.record_count
            )));
        }
    }
    let producer = producer(&infos)?;
    let mut buf = records.clone();
    let sets = RecordBatchDecoder::decode_all(&mut buf)
        .map_err(|err| RecordsError::Corrupt(err.to_string()))?;
    let mut out = Vec::new();
    for set in sets {
        for record in set.records {
            if record.transactional {
                return Err(RecordsError::Transactional);
            }
            if !record.control {
                out.push(record);
            }
        }
    }
    Ok(Decoded {
        records: out,
        producer,
    })
}

/// The idempotent producer's numbering of a partition's batches: every batch of one
/// producer and epoch, each starting where the one before ends (the partition checks them
/// as one run of sequence numbers), or none from an idempotent producer.
fn producer(infos: &[BatchDecodeInfo]) -> Result<Option<KafkaProducerStamp>, RecordsError> {
    let Some(first) = infos.first().filter(|info| info.producer_id >= 0) else {
        if infos.iter().any(|info| info.producer_id >= 0) {
            return Err(RecordsError::Corrupt(
                "batches with and without a producer id in one partition".into(),
            ));
        }
        return Ok(None);
    };
    let mut next = i64::from(first.base_sequence);
    for info in infos {
        if info.producer_id != first.producer_id || info.producer_epoch != first.producer_epoch {
            return Err(RecordsError::Corrupt(
                "batches of several producers or epochs in one partition".into(),
            ));
        }
        if i64::from(info.base_sequence) != next || info.base_sequence < 0 {
            return Err(RecordsError::Corrupt(format!(
                "a batch starting at sequence {} where {next} was next",
                info.base_sequence
            )));
        }
        // Kafka's sequences wrap to 0 after i32::MAX.
        next = (next + i64::from(info.record_count.max(0))) % (i64::from(i32::MAX) + 1);
    }
    Ok(Some(KafkaProducerStamp {
        producer_id: first.producer_id,
        epoch: first.producer_epoch,
        base_sequence: first.base_sequence,
    }))
}

/// A record as the event stored.
pub fn event(record: Record) -> EventRecord {
    let mut properties: Vec<(String, Property)> = record
        .headers
        .into_iter()
        .map(|(name, value)| (name.to_string(), Property::Bytes(value.unwrap_or_default())))
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
    use kafka_protocol::records::{RecordBatchEncoder, RecordEncodeOptions, TimestampType};

    fn record(key: Option<&[u8]>, value: &[u8], producer_id: i64) -> Record {
        numbered(key, value, producer_id, -1)
    }

    fn numbered(key: Option<&[u8]>, value: &[u8], producer_id: i64, sequence: i32) -> Record {
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
            sequence,
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
            let events: Vec<EventRecord> = decode(&bytes)
                .unwrap()
                .records
                .into_iter()
                .map(event)
                .collect();
            assert_eq!(events.len(), 2, "{compression:?}");
            assert_eq!(events[0].partition_key.as_deref(), Some("customer-7"));
            assert_eq!(&events[0].body[..], b"one");
            assert_eq!(
                events[0].properties,
                vec![("h".to_string(), Property::Bytes(Bytes::from_static(b"v")))]
            );
            assert_eq!(events[1].partition_key, None);
        }
        let binary = event(record(Some(&[0xff, 0x00]), b"x", -1));
        assert_eq!(binary.partition_key, None);
        assert_eq!(
            binary.properties.last().unwrap(),
            &(
                KAFKA_KEY_PROPERTY.to_string(),
                Property::Bytes(Bytes::from_static(&[0xff, 0x00]))
            )
        );
    }

    #[test]
    fn corrupt_batches_are_refused() {
        let good = batch(&[record(None, b"one", -1)], Compression::None);
        let mut corrupt = BytesMut::from(&good[..]);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0xff;
        assert!(matches!(
            decode(&corrupt.freeze()),
            Err(RecordsError::Corrupt(_))
        ));
        // A batch declaring more records than it could hold, with a valid CRC (the count sits
        // at bytes 57..61 of a v2 batch; the CRC-32C at 17..21 covers bytes 21 on).
        let mut huge = BytesMut::from(&good[..]);
        huge[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&huge[21..]);
        huge[17..21].copy_from_slice(&crc.to_be_bytes());
        let err = decode(&huge.freeze()).unwrap_err();
        assert!(
            matches!(&err, RecordsError::Corrupt(why) if why.contains("2147483647")),
            "{err:?}"
        );
    }

    #[test]
    fn an_idempotent_producers_batches_carry_its_numbering() {
        let first = batch(
            &[numbered(None, b"a", 7, 40), numbered(None, b"b", 7, 41)],
            Compression::None,
        );
        let second = batch(&[numbered(None, b"c", 7, 42)], Compression::Gzip);
        let both = Bytes::from([&first[..], &second[..]].concat());
        let decoded = decode(&both).unwrap();
        assert_eq!(decoded.records.len(), 3);
        assert_eq!(
            decoded.producer,
            Some(KafkaProducerStamp {
                producer_id: 7,
                epoch: 3,
                base_sequence: 40,
            })
        );
        let plain = batch(&[record(None, b"x", -1)], Compression::None);
        assert_eq!(decode(&plain).unwrap().producer, None);
        // A gap between batches, or batches of two producers, are refused.
        let gap = batch(&[numbered(None, b"d", 7, 44)], Compression::None);
        let gapped = Bytes::from([&first[..], &gap[..]].concat());
        assert!(matches!(decode(&gapped), Err(RecordsError::Corrupt(_))));
        let mixed = Bytes::from([&first[..], &plain[..]].concat());
        assert!(matches!(decode(&mixed), Err(RecordsError::Corrupt(_))));
    }
}
