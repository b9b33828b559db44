//! What the workload and the nemesis did and saw, recorded as it happened; the checker
//! (`checker.rs`) judges it afterwards. Times are milliseconds since the run started.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

/// Milliseconds since the run started.
pub type Millis = u64;

/// An event's identity: the workload producer that sent it and its number there. Every event
/// the workload sends is unique, so the checker can follow each one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventId {
    pub producer: u32,
    pub number: u64,
}

/// The prefix of every body the workload sends.
const BODY_PREFIX: &str = "nemesis ";

impl EventId {
    /// The body of this event: its identity in text, then `padding` bytes.
    pub fn body(&self, padding: usize) -> Vec<u8> {
        let mut body = format!("{BODY_PREFIX}{}/{} ", self.producer, self.number).into_bytes();
        body.resize(body.len() + padding, b'.');
        body
    }

    /// The identity in a body made by [`EventId::body`]; `None` for any other body.
    pub fn from_body(body: &[u8]) -> Option<EventId> {
        let text = std::str::from_utf8(body).ok()?.strip_prefix(BODY_PREFIX)?;
        let (id, _padding) = text.split_once(' ')?;
        let (producer, number) = id.split_once('/')?;
        Some(EventId {
            producer: producer.parse().ok()?,
            number: number.parse().ok()?,
        })
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.producer, self.number)
    }
}

/// An event as a reader (or the final read) got it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delivered {
    pub sequence: i64,
    pub offset: i64,
    /// `None`: the body is not one the workload sent.
    pub id: Option<EventId>,
}

/// How a send ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SendOutcome {
    /// The partition acknowledged the batch: the numbers it said it assigned.
    Acked {
        first_sequence: i64,
        /// One per event, in order.
        offsets: Vec<i64>,
    },
    /// Never acknowledged (the run ended while it was still being retried, or the producer
    /// gave up): it may or may not be stored, but if it is, then exactly once.
    Indeterminate { last_error: String },
}

/// One batch sent by an idempotent producer to one partition, with all its attempts (a
/// failed attempt is retried with the same producer sequence until it is acknowledged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SendRecord {
    pub producer: u32,
    pub partition: String,
    pub events: Vec<EventId>,
    /// When the first attempt started.
    pub invoked_ms: Millis,
    /// When the acknowledgement arrived.
    pub acked_ms: Option<Millis>,
    pub attempts: u32,
    pub outcome: SendOutcome,
}

/// Everything one plain reader delivered from one partition, in delivery order. A reader
/// starts at the partition's beginning (sequence number 0) and resumes after the last event
/// it delivered whenever its stream breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReaderRecord {
    pub reader: String,
    pub partition: String,
    pub events: Vec<Delivered>,
}

/// One `process_events` call of an event processor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessorCall {
    pub processor: String,
    pub partition: String,
    /// Counts how many times this processor started on this partition (its tenures).
    pub tenure: u32,
    pub started_ms: Millis,
    pub ended_ms: Millis,
    pub events: Vec<Delivered>,
}

/// A consumer group's checkpoint of one partition, as a sample of the store showed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointSample {
    pub at_ms: Millis,
    pub partition: String,
    pub sequence: i64,
    pub offset: i64,
}

/// A management call of the workload. Each name is used once: created, then maybe deleted.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ManagementOp {
    CreateHub(String),
    DeleteHub(String),
    CreateGroup(String),
    DeleteGroup(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CallOutcome {
    Ok,
    /// Refused for certain (nothing changed).
    Failed(String),
    /// Unknown whether it took effect (the reply never came).
    Indeterminate(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagementRecord {
    pub invoked_ms: Millis,
    pub completed_ms: Millis,
    pub op: ManagementOp,
    pub outcome: CallOutcome,
}

/// One fault the nemesis injected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FaultRecord {
    /// The nemesis (`kill`, `partition`, ...).
    pub kind: String,
    /// What exactly was done, e.g. "isolated leader node 3 of nemesis/2".
    pub description: String,
    pub injected_ms: Millis,
    /// When the fault was undone (the node restarted, the network healed, ...).
    pub healed_ms: Option<Millis>,
    /// When full availability was back after the heal: every partition acknowledged a send
    /// started after the heal, and management and the checkpoint store answered.
    pub recovered_ms: Option<Millis>,
}

/// A partition as read at the end of the run, after every fault was healed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FinalPartition {
    pub partition: String,
    /// Every event from the first retained one, read through the leader.
    pub events: Vec<Delivered>,
    /// Per node holding a replica: a digest of what that replica applied (equal digests:
    /// identical replicas) and its event count.
    pub replicas: BTreeMap<u64, (String, u64)>,
}

/// The whole record of one run.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct History {
    pub sends: Vec<SendRecord>,
    pub readers: Vec<ReaderRecord>,
    pub processor_calls: Vec<ProcessorCall>,
    pub checkpoints: Vec<CheckpointSample>,
    pub management: Vec<ManagementRecord>,
    /// Hubs and consumer groups (of the workload's hub) that exist at the end, among the
    /// names the management workload used; `None` when they could not be listed.
    pub final_hubs: Option<BTreeSet<String>>,
    pub final_groups: Option<BTreeSet<String>>,
    pub faults: Vec<FaultRecord>,
    pub finals: Vec<FinalPartition>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_round_trip_through_bodies() {
        let id = EventId {
            producer: 3,
            number: 41,
        };
        assert_eq!(EventId::from_body(&id.body(0)), Some(id));
        assert_eq!(EventId::from_body(&id.body(100)), Some(id));
        assert_eq!(id.body(10).len(), id.body(0).len() + 10);
        assert_eq!(EventId::from_body(b"hello"), None);
        assert_eq!(EventId::from_body(b"nemesis x/1 "), None);
    }
}
