//! How events sit inside a Raft entry: a sequence of frames `[u32 little-endian length]
//! [postcard EventRecord]`. An event's offset is the byte position of its frame in the
//! partition stream, so offsets grow with the bytes written and are the same on every
//! replica.
//!
//! Compaction ([`compact_batch`]) removes events from a stored batch without renumbering
//! the rest: every run of removed events becomes one *hole frame*
//!
//! ```text
//! [u32 LE 0xFFFF_FFFF][LEB128 skipped_events][LEB128 skipped_bytes]
//! ```
//!
//! standing for `skipped_events` events (at least one) whose frames took `skipped_bytes`
//! bytes (at least one) of the batch as first written. An ordinary frame never has length
//! `u32::MAX` (no event record is that large). The counts are unsigned LEB128 varints (as
//! postcard writes a `u32`), so a hole takes 6 to 14 bytes and is never longer than the
//! frames it replaces (a frame takes at least 7 bytes). Kept frames stay byte for byte as
//! they were, adjacent holes are merged, and [`decode_batch`] gives each kept event its
//! index and byte position in the original batch, so its sequence number and offset never
//! change.

use bytes::{Bytes, BytesMut};
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

/// The name of the property the AMQP front end keeps what a record has no field for in
/// (the message's header and properties sections, exact AMQP types), always last. Other
/// front ends do not show it: [`EventRecord::shown_properties`].
pub const AMQP_EXTRAS_PROPERTY: &str = "x-opt-amqp";

/// What a producer sent for one event; the system fields are derived when read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventRecord {
    pub partition_key: Option<String>,
    pub properties: Vec<(String, Property)>,
    #[serde(deserialize_with = "tributary_types::format::shared_bytes::deserialize")]
    pub body: Bytes,
}

impl EventRecord {
    /// The application properties another front end than AMQP shows: all but a last
    /// [`AMQP_EXTRAS_PROPERTY`] holding bytes.
    pub fn shown_properties(self) -> impl Iterator<Item = (String, Property)> {
        let mut properties = self.properties;
        if matches!(properties.last(), Some((name, Property::Bytes(_))) if name == AMQP_EXTRAS_PROPERTY)
        {
            properties.pop();
        }
        properties.into_iter()
    }
}

/// One event of a stored batch, where the batch as first written had it.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedEvent {
    /// The event's index among the batch's events (its sequence number less the entry's
    /// first); events removed by compaction still count.
    pub index: u32,
    /// The byte position of the event's frame (its offset less the entry's first).
    pub position: usize,
    pub record: EventRecord,
}

const FRAME_HEADER_BYTES: usize = 4;
/// The length field that marks a hole frame instead of an event.
const HOLE_MARKER: u32 = u32::MAX;
/// A hole's two varints take at most 5 bytes each.
const HOLE_BYTES_MAX: usize = FRAME_HEADER_BYTES + 10;

/// Encodes a batch of events into one buffer of frames.
pub fn encode_batch(records: &[EventRecord]) -> Bytes {
    // Sized first, then written once into one buffer of the batch's size: no copy of an
    // event through a buffer of its own, and none through a growing one (a 64 KiB event
    // was copied four times over before it reached the log). Each frame's length is
    // filled in once its record is written.
    let size: usize = records
        .iter()
        .map(|record| {
            postcard::experimental::serialized_size(record).expect("event records always encode")
                + FRAME_HEADER_BYTES
        })
        .sum();
    let mut out = Vec::with_capacity(size);
    for record in records {
        let at = out.len();
        out.extend_from_slice(&[0; FRAME_HEADER_BYTES]);
        out = postcard::to_extend(record, out).expect("event records always encode");
        let len = u32::try_from(out.len() - at - FRAME_HEADER_BYTES)
            .ok()
            .filter(|len| *len != HOLE_MARKER)
            .expect("an event record is smaller than 4 GiB");
        out[at..at + FRAME_HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
    }
    Bytes::from(out)
}

/// Byte position of each frame within the batch, in order. Used on batches as first
/// written (a send's batch, an entry being applied), which never hold holes: a batch with a
/// hole is refused, since its positions and length no longer describe the batch as written.
pub fn frame_positions(batch: &[u8]) -> Result<Vec<usize>, CodecError> {
    let mut positions = Vec::new();
    let mut at = 0;
    while at < batch.len() {
        positions.push(at);
        match next_frame(batch, at)? {
            Frame::Event { next, .. } => at = next,
            Frame::Hole { .. } => {
                return Err(CodecError(format!(
                    "a hole at byte {at} in a batch that must be as first written"
                )));
            }
        }
    }
    Ok(positions)
}

/// Decodes every event the batch still holds, with its index and byte position in the
/// batch as first written (holes count for the events and bytes they stand for).
pub fn decode_batch(batch: &[u8]) -> Result<Vec<DecodedEvent>, CodecError> {
    decode_batch_with(batch, |payload| {
        postcard::from_bytes(payload).map_err(|e| CodecError(e.to_string()))
    })
}

/// [`decode_batch`] with the events' bodies sharing `batch`'s buffer instead of copied.
pub fn decode_batch_shared(batch: &Bytes) -> Result<Vec<DecodedEvent>, CodecError> {
    decode_batch_with(batch, |payload| {
        tributary_types::format::decode_payload_shared(batch, payload)
            .map_err(|e| CodecError(e.to_string()))
    })
}

fn decode_batch_with(
    batch: &[u8],
    decode: impl Fn(&[u8]) -> Result<EventRecord, CodecError>,
) -> Result<Vec<DecodedEvent>, CodecError> {
    let mut out = Vec::new();
    let mut cursor = Cursor::default();
    while cursor.at < batch.len() {
        let frame = next_frame(batch, cursor.at)?;
        if let Frame::Event { payload, .. } = frame {
            let record = decode(payload)?;
            out.push(DecodedEvent {
                index: cursor.index,
                position: cursor.position,
                record,
            });
        }
        cursor.advance(&frame)?;
    }
    Ok(out)
}

/// Rewrites `batch` keeping the events whose index (as in [`decode_batch`]) `keep` accepts:
/// kept frames are copied unchanged, and each run of removed events, together with any
/// holes already next to it, becomes one hole. `keep` is asked only about events the batch
/// still holds. Compacting a compacted batch again with the same choice returns it
/// unchanged, and the result is never longer than `batch`.
pub fn compact_batch(batch: &[u8], keep: impl Fn(u32) -> bool) -> Result<Bytes, CodecError> {
    let mut out = BytesMut::with_capacity(batch.len());
    let mut cursor = Cursor::default();
    let mut hole = Hole::default();
    while cursor.at < batch.len() {
        let frame = next_frame(batch, cursor.at)?;
        match frame {
            Frame::Event { next, .. } if keep(cursor.index) => {
                hole.flush(&mut out);
                out.extend_from_slice(&batch[cursor.at..next]);
            }
            Frame::Event { next, .. } => hole.add(1, next - cursor.at)?,
            Frame::Hole { events, bytes, .. } => hole.add(events, bytes as usize)?,
        }
        cursor.advance(&frame)?;
    }
    hole.flush(&mut out);
    Ok(out.freeze())
}

/// One frame of a stored batch; `next` is where the frame after it starts.
enum Frame<'a> {
    Event {
        payload: &'a [u8],
        next: usize,
    },
    Hole {
        events: u32,
        bytes: u32,
        next: usize,
    },
}

/// Where a walk over a stored batch is: in the stored bytes (`at`), and in the batch as
/// first written (`index`, `position`).
#[derive(Default)]
struct Cursor {
    at: usize,
    index: u32,
    position: usize,
}

impl Cursor {
    fn advance(&mut self, frame: &Frame<'_>) -> Result<(), CodecError> {
        let (events, bytes, next) = match *frame {
            Frame::Event { next, .. } => (1, next - self.at, next),
            Frame::Hole {
                events,
                bytes,
                next,
            } => (events, bytes as usize, next),
        };
        self.index = self
            .index
            .checked_add(events)
            .ok_or_else(|| CodecError(format!("too many events before byte {next}")))?;
        self.position = self
            .position
            .checked_add(bytes)
            .ok_or_else(|| CodecError(format!("too many bytes before byte {next}")))?;
        self.at = next;
        Ok(())
    }
}

/// A run of removed events not yet written out.
#[derive(Default)]
struct Hole {
    events: u32,
    bytes: u32,
}

impl Hole {
    fn add(&mut self, events: u32, bytes: usize) -> Result<(), CodecError> {
        let too_large = || CodecError("a hole would stand for more than 4 GiB".into());
        self.events = self.events.checked_add(events).ok_or_else(too_large)?;
        self.bytes = u32::try_from(bytes)
            .ok()
            .and_then(|bytes| self.bytes.checked_add(bytes))
            .ok_or_else(too_large)?;
        Ok(())
    }

    fn flush(&mut self, out: &mut BytesMut) {
        if self.events == 0 {
            return;
        }
        let mut buf = [0u8; HOLE_BYTES_MAX];
        buf[..FRAME_HEADER_BYTES].copy_from_slice(&HOLE_MARKER.to_le_bytes());
        let counts = postcard::to_slice(&(self.events, self.bytes), &mut buf[FRAME_HEADER_BYTES..])
            .expect("two u32 varints fit in 10 bytes")
            .len();
        out.extend_from_slice(&buf[..FRAME_HEADER_BYTES + counts]);
        *self = Hole::default();
    }
}

fn next_frame(batch: &[u8], at: usize) -> Result<Frame<'_>, CodecError> {
    let header = batch
        .get(at..at + FRAME_HEADER_BYTES)
        .ok_or_else(|| CodecError(format!("truncated frame header at byte {at}")))?;
    let len = u32::from_le_bytes(header.try_into().expect("4 bytes"));
    let start = at + FRAME_HEADER_BYTES;
    if len == HOLE_MARKER {
        let rest = &batch[start..];
        let ((events, bytes), after): ((u32, u32), _) = postcard::take_from_bytes(rest)
            .map_err(|e| CodecError(format!("hole at byte {at}: {e}")))?;
        if events == 0 || bytes == 0 {
            return Err(CodecError(format!(
                "hole at byte {at} stands for {events} events of {bytes} bytes"
            )));
        }
        let next = batch.len() - after.len();
        return Ok(Frame::Hole {
            events,
            bytes,
            next,
        });
    }
    let len = len as usize;
    let payload = batch
        .get(start..start + len)
        .ok_or_else(|| CodecError(format!("truncated frame at byte {at}")))?;
    Ok(Frame::Event {
        payload,
        next: start + len,
    })
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
            decoded.iter().map(|e| e.position).collect::<Vec<_>>()
        );
        assert_eq!(positions[0], 0);
        assert_eq!(decoded[0].index, 0);
        assert_eq!(decoded[1].index, 1);
        assert_eq!(decoded[0].record, records[0]);
        assert_eq!(decoded[1].record, records[1]);
    }

    /// A batch is each record's length (u32, little-endian) and postcard bytes, back to
    /// back, exactly as written before batches were sized up front: stored batches and
    /// offsets do not change with how they are built.
    #[test]
    fn a_batch_is_its_frames_back_to_back() {
        let mut records = sample(5);
        records.push(event(Some("large"), &"y".repeat(64 * 1024)));
        let batch = encode_batch(&records);
        let mut expected = Vec::new();
        for record in &records {
            let payload = postcard::to_allocvec(record).unwrap();
            expected.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            expected.extend_from_slice(&payload);
        }
        assert_eq!(&batch[..], &expected[..]);
        assert!(encode_batch(&[]).is_empty());
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

    fn event(key: Option<&str>, body: &str) -> EventRecord {
        EventRecord {
            partition_key: key.map(String::from),
            properties: vec![],
            body: Bytes::from(body.to_string()),
        }
    }

    fn sample(count: usize) -> Vec<EventRecord> {
        (0..count)
            .map(|i| event(Some(&format!("k{i}")), &"x".repeat(i * 3)))
            .collect()
    }

    /// (index, position, record) of every event still held.
    fn contents(batch: &[u8]) -> Vec<(u32, usize, EventRecord)> {
        decode_batch(batch)
            .unwrap()
            .into_iter()
            .map(|e| (e.index, e.position, e.record))
            .collect()
    }

    #[test]
    fn compaction_keeps_the_index_and_position_of_every_kept_event() {
        let records = sample(7);
        let batch = encode_batch(&records);
        let original = contents(&batch);
        let kept = [0u32, 3, 4, 6];
        let compacted = compact_batch(&batch, |i| kept.contains(&i)).unwrap();
        assert!(compacted.len() < batch.len());
        let expected: Vec<_> = original
            .iter()
            .filter(|(i, _, _)| kept.contains(i))
            .cloned()
            .collect();
        assert_eq!(contents(&compacted), expected);
        // Kept frames are the original bytes.
        let first_len = original[1].1;
        assert_eq!(compacted[..first_len], batch[..first_len]);
    }

    #[test]
    fn a_run_of_removed_events_becomes_one_hole_and_holes_merge() {
        let records = sample(6);
        let batch = encode_batch(&records);
        // Events 1 and 2 go: one hole of the documented shape.
        let once = compact_batch(&batch, |i| i != 1 && i != 2).unwrap();
        let positions = frame_positions(&batch).unwrap();
        let (removed_bytes, start) = (positions[3] - positions[1], positions[1]);
        let hole = &once[start..];
        assert_eq!(hole[..4], u32::MAX.to_le_bytes());
        assert_eq!(hole[4], 2, "skipped events");
        assert_eq!(usize::from(hole[5]), removed_bytes, "skipped bytes");
        assert_eq!(once[start + 6..], batch[positions[3]..]);
        // Removing event 3 next to it, then 0 before it, still leaves one hole.
        let twice = compact_batch(&once, |i| i != 3).unwrap();
        let thrice = compact_batch(&twice, |i| i != 0).unwrap();
        let holes = thrice.windows(4).filter(|w| *w == u32::MAX.to_le_bytes());
        assert_eq!(holes.count(), 1);
        assert_eq!(thrice[..4], u32::MAX.to_le_bytes());
        assert_eq!(thrice[4], 4);
        assert_eq!(usize::from(thrice[5]), positions[4]);
        let remaining: Vec<u32> = contents(&thrice).iter().map(|e| e.0).collect();
        assert_eq!(remaining, vec![4, 5]);
        // Nothing more to remove: the same bytes, never asked about removed events.
        let again = compact_batch(&thrice, |i| {
            assert!(i >= 4, "asked about removed event {i}");
            true
        })
        .unwrap();
        assert_eq!(again, thrice);
    }

    #[test]
    fn a_batch_with_every_event_removed_is_one_hole() {
        let batch = encode_batch(&sample(3));
        let empty = compact_batch(&batch, |_| false).unwrap();
        assert_eq!(empty.len(), 6);
        assert!(decode_batch(&empty).unwrap().is_empty());
        assert_eq!(compact_batch(&empty, |_| false).unwrap(), empty);
        assert_eq!(compact_batch(&empty, |_| true).unwrap(), empty);
    }

    #[test]
    fn a_hole_is_never_longer_than_what_it_replaces() {
        let smallest = encode_batch(&[event(None, "")]);
        assert_eq!(smallest.len(), 7);
        assert_eq!(compact_batch(&smallest, |_| false).unwrap().len(), 6);
        let large = encode_batch(&[event(None, &"y".repeat(70_000)), event(None, "z")]);
        let compacted = compact_batch(&large, |i| i == 1).unwrap();
        assert!(compacted.len() < 20, "{} bytes", compacted.len());
        let second = frame_positions(&large).unwrap()[1];
        assert_eq!(decode_batch(&compacted).unwrap()[0].position, second);
    }

    #[test]
    fn frame_positions_refuses_a_compacted_batch() {
        let batch = encode_batch(&sample(3));
        let compacted = compact_batch(&batch, |i| i != 1).unwrap();
        assert!(frame_positions(&compacted).is_err());
        assert_eq!(frame_positions(&batch).unwrap().len(), 3);
    }

    #[test]
    fn damaged_holes_are_errors_not_panics() {
        let batch = encode_batch(&sample(3));
        let compacted = compact_batch(&batch, |i| i == 2).unwrap();
        for cut in 1..compacted.len() {
            let _ = decode_batch(&compacted[..cut]);
            let _ = compact_batch(&compacted[..cut], |_| true);
        }
        assert!(decode_batch(&compacted[..5]).is_err());
        let mut zero = compacted.to_vec();
        zero[4] = 0; // a hole standing for no events
        assert!(decode_batch(&zero).is_err());
        assert!(compact_batch(&zero, |_| true).is_err());
    }
}
