//! Inspecting one node's replica of a partition (`Diagnostics.ReplicaEvents`), and the
//! checksum and digest that make replicas comparable.

use tributary_proto::v1 as proto;
use tributary_proto::v1::diagnostics_client::DiagnosticsClient as DiagnosticsStub;

use crate::client::require_name;
use crate::{Client, ClientError};

/// What one node's replica of a partition holds, from some sequence number on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaListing {
    /// The node whose replica this is.
    pub node: u64,
    /// Whether it led the partition when the last page was read.
    pub is_leader: bool,
    /// The replica's first retained sequence number.
    pub begin_sequence_number: i64,
    /// Applied events in sequence order.
    pub events: Vec<proto::ReplicaEvent>,
}

/// A short description of a list of replica events: equal summaries mean (but for a 2^-64
/// chance) equal lists of sequence numbers, offsets, enqueued times, keys and body checksums.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSummary {
    pub count: u64,
    /// `None` when the list is empty.
    pub first_sequence_number: Option<i64>,
    pub last_sequence_number: Option<i64>,
    /// FNV-1a (64 bit) over every event's fields in order; see [`replica_digest`].
    pub digest: u64,
}

/// The checksum the service reports for an event body: CRC-32 (IEEE 802.3, as in zlib).
pub fn body_checksum(body: &[u8]) -> u32 {
    crc32fast::hash(body)
}

/// Summarizes `events`. The digest covers, per event in order, the sequence number, offset,
/// enqueued time, body checksum, body size and partition key, each in a fixed-width
/// little-endian encoding (the key and offset with their lengths first).
pub fn replica_digest(events: &[proto::ReplicaEvent]) -> ReplicaSummary {
    let mut digest = Fnv1a::new();
    for event in events {
        digest.write(&event.sequence_number.to_le_bytes());
        digest.write_str(&event.offset);
        digest.write(&event.enqueued_time_ms.to_le_bytes());
        digest.write(&event.body_checksum.to_le_bytes());
        digest.write(&event.body_bytes.to_le_bytes());
        digest.write_str(&event.partition_key);
    }
    ReplicaSummary {
        count: events.len() as u64,
        first_sequence_number: events.first().map(|e| e.sequence_number),
        last_sequence_number: events.last().map(|e| e.sequence_number),
        digest: digest.finish(),
    }
}

impl Client {
    /// One page of what the node this client connects to holds in its own replica of a
    /// partition, leader or not, from `from_sequence_number` on; `max_events` 0 means the
    /// service default (1000), at most 10000. Never redirected to another node.
    pub async fn replica_events_page(
        &self,
        event_hub: &str,
        partition_id: &str,
        from_sequence_number: i64,
        max_events: u32,
    ) -> Result<proto::ReplicaEventsResponse, ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("partition id", partition_id)?;
        if from_sequence_number < 0 {
            return Err(ClientError::InvalidArgument(format!(
                "the first sequence number must be 0 or more, got {from_sequence_number}"
            )));
        }
        let request = proto::ReplicaEventsRequest {
            event_hub: event_hub.to_owned(),
            partition_id: partition_id.to_owned(),
            from_sequence_number,
            max_events,
        };
        DiagnosticsStub::new(self.channel.clone())
            .replica_events(request)
            .await
            .map(tonic::Response::into_inner)
            .map_err(|status| ClientError::from_status(status, &self.endpoint))
    }

    /// Every event the connected node's replica of a partition has applied from
    /// `from_sequence_number` on (at most `limit`), read page by page up to what the replica
    /// had applied when each page was read.
    pub async fn replica_events(
        &self,
        event_hub: &str,
        partition_id: &str,
        from_sequence_number: i64,
        limit: Option<u64>,
    ) -> Result<ReplicaListing, ClientError> {
        let mut listing = ReplicaListing {
            node: 0,
            is_leader: false,
            begin_sequence_number: 0,
            events: Vec::new(),
        };
        let mut next = from_sequence_number;
        loop {
            let wanted = limit.map_or(u64::MAX, |l| l.saturating_sub(listing.events.len() as u64));
            if wanted == 0 {
                return Ok(listing);
            }
            let page_max = u32::try_from(wanted.min(u64::from(REPLICA_EVENTS_PAGE_MAX)))
                .expect("a page size fits in u32");
            let page = self
                .replica_events_page(event_hub, partition_id, next, page_max)
                .await?;
            listing.node = page.node;
            listing.is_leader = page.is_leader;
            listing.begin_sequence_number = page.begin_sequence_number;
            let Some(last) = page.events.last().map(|e| e.sequence_number) else {
                return Ok(listing);
            };
            next = last + 1;
            listing.events.extend(page.events);
            if next >= page.next_sequence_number {
                return Ok(listing);
            }
        }
    }
}

/// The largest page the service serves.
const REPLICA_EVENTS_PAGE_MAX: u32 = 10_000;

/// 64-bit FNV-1a: tiny, stable across platforms and releases.
struct Fnv1a(u64);

impl Fnv1a {
    const OFFSET_BASIS: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Fnv1a {
        Fnv1a(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 ^= u64::from(*byte);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn write_str(&mut self, text: &str) {
        self.write(&(text.len() as u64).to_le_bytes());
        self.write(text.as_bytes());
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(sequence_number: i64, body: &[u8]) -> proto::ReplicaEvent {
        proto::ReplicaEvent {
            sequence_number,
            offset: (sequence_number * 100).to_string(),
            enqueued_time_ms: 1_700_000_000_000,
            partition_key: String::new(),
            body_checksum: body_checksum(body),
            body_bytes: body.len() as u32,
        }
    }

    #[test]
    fn body_checksum_is_crc32() {
        assert_eq!(body_checksum(b"123456789"), 0xCBF4_3926);
    }

    #[test]
    fn fnv1a_matches_the_reference_values() {
        let mut empty = Fnv1a::new();
        empty.write(b"");
        assert_eq!(empty.finish(), 0xcbf2_9ce4_8422_2325);
        let mut a = Fnv1a::new();
        a.write(b"a");
        assert_eq!(a.finish(), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn digest_tells_lists_apart() {
        let list = vec![event(0, b"a"), event(1, b"b")];
        let summary = replica_digest(&list);
        assert_eq!(summary.count, 2);
        assert_eq!(summary.first_sequence_number, Some(0));
        assert_eq!(summary.last_sequence_number, Some(1));
        assert_eq!(summary, replica_digest(&list.clone()));

        let other_body = vec![event(0, b"a"), event(1, b"c")];
        assert_ne!(summary.digest, replica_digest(&other_body).digest);
        let mut other_key = list.clone();
        other_key[1].partition_key = "k".into();
        assert_ne!(summary.digest, replica_digest(&other_key).digest);
        let shorter = &list[..1];
        assert_ne!(summary.digest, replica_digest(shorter).digest);

        let empty = replica_digest(&[]);
        assert_eq!(empty.count, 0);
        assert_eq!(empty.first_sequence_number, None);
    }
}
