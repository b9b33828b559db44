//! How events sit inside a Raft entry: a sequence of frames `[u32 little-endian length]
//! [postcard EventRecord]`. An event's offset is the byte position of its frame in the
//! partition stream, so offsets grow with the bytes written and are the same on every
//! replica.

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

/// A typed application property value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Property {
    String(String),
    Int64(i64),
    Double(f64),
    Bool(bool),
    Bytes(Bytes),
    TimestampMs(i64),
}

/// What a producer sent for one event; the system fields are derived when read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub partition_key: Option<String>,
    pub properties: Vec<(String, Property)>,
    pub body: Bytes,
}

const FRAME_HEADER_BYTES: usize = 4;

/// Encodes a batch of events into one buffer of frames.
pub fn encode_batch(records: &[EventRecord]) -> Bytes {
    let mut out = BytesMut::new();
    for record in records {
        let payload = postcard::to_allocvec(record).expect("event records always encode");
        out.put_u32_le(payload.len() as u32);
        out.extend_from_slice(&payload);
    }
    out.freeze()
}

/// Byte position of each frame within the batch, in order.
pub fn frame_positions(batch: &[u8]) -> Result<Vec<usize>, CodecError> {
    let mut positions = Vec::new();
    let mut at = 0;
    while at < batch.len() {
        positions.push(at);
        at = next_frame(batch, at)?.1;
    }
    Ok(positions)
}

/// Decodes every event of the batch with its byte position in the batch.
pub fn decode_batch(batch: &[u8]) -> Result<Vec<(usize, EventRecord)>, CodecError> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < batch.len() {
        let (payload, next) = next_frame(batch, at)?;
        let record = postcard::from_bytes(payload).map_err(|e| CodecError(e.to_string()))?;
        out.push((at, record));
        at = next;
    }
    Ok(out)
}

fn next_frame(batch: &[u8], at: usize) -> Result<(&[u8], usize), CodecError> {
    let header = batch
        .get(at..at + FRAME_HEADER_BYTES)
        .ok_or_else(|| CodecError(format!("truncated frame header at byte {at}")))?;
    let len = u32::from_le_bytes(header.try_into().expect("4 bytes")) as usize;
    let start = at + FRAME_HEADER_BYTES;
    let payload = batch
        .get(start..start + len)
        .ok_or_else(|| CodecError(format!("truncated frame at byte {at}")))?;
    Ok((payload, start + len))
}

#[derive(Debug, thiserror::Error)]
#[error("stored event batch is corrupt: {0}")]
pub struct CodecError(String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_round_trips_with_frame_positions() {
        let records = vec![
            EventRecord {
                partition_key: Some("k".into()),
                properties: vec![
                    ("s".into(), Property::String("v".into())),
                    ("i".into(), Property::Int64(-3)),
                    ("d".into(), Property::Double(1.5)),
                    ("b".into(), Property::Bool(true)),
                    ("x".into(), Property::Bytes(Bytes::from_static(b"\x00\x01"))),
                    ("t".into(), Property::TimestampMs(1_700_000_000_000)),
                ],
                body: Bytes::from_static(b"hello"),
            },
            EventRecord {
                partition_key: None,
                properties: vec![],
                body: Bytes::new(),
            },
        ];
        let batch = encode_batch(&records);
        let decoded = decode_batch(&batch).unwrap();
        let positions = frame_positions(&batch).unwrap();
        assert_eq!(decoded.len(), 2);
        assert_eq!(
            positions,
            decoded.iter().map(|(p, _)| *p).collect::<Vec<_>>()
        );
        assert_eq!(positions[0], 0);
        assert_eq!(decoded[0].1, records[0]);
        assert_eq!(decoded[1].1, records[1]);
    }

    #[test]
    fn truncated_batch_is_an_error_not_a_panic() {
        let batch = encode_batch(&[EventRecord {
            partition_key: None,
            properties: vec![],
            body: Bytes::from_static(b"abcdef"),
        }]);
        assert!(decode_batch(&batch[..batch.len() - 1]).is_err());
        assert!(frame_positions(&batch[..2]).is_err());
    }
}
