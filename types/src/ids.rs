//! Typed identifiers. Raw integers never cross a crate boundary.

use serde::{Deserialize, Serialize};
use std::fmt;

/// A node of the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeId(pub u64);

/// An event hub's internal id. Never reused: a re-created hub gets a new id, so state left by
/// an earlier life of a hub is never mistaken for the current one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct HubId(pub u32);

/// A partition's index within its hub: `0..partition_count`. Shown as a decimal string at the
/// API edge ("0", "1", ...), as Event Hubs does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct PartitionId(pub u16);

/// Identifies one Raft group: a hub's partition in one incarnation. The controller is
/// [`GroupId::CONTROLLER`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct GroupId {
    pub hub: HubId,
    pub partition: PartitionId,
    pub incarnation: u16,
}

/// Per-partition sequence number: 0, 1, 2, ... gap-free.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SequenceNumber(pub i64);

/// Per-partition byte position of an event in the partition stream; monotonic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Offset(pub i64);

impl GroupId {
    /// The controller's metadata group. Hub id 0 is never given to a hub.
    pub const CONTROLLER: GroupId = GroupId {
        hub: HubId(0),
        partition: PartitionId(0),
        incarnation: 0,
    };

    pub fn new(hub: HubId, partition: PartitionId, incarnation: u16) -> Self {
        Self {
            hub,
            partition,
            incarnation,
        }
    }

    /// Packs the id into one integer, ordered by hub, then partition, then incarnation; used
    /// as the storage key prefix.
    pub fn to_u64(self) -> u64 {
        (u64::from(self.hub.0) << 32)
            | (u64::from(self.partition.0) << 16)
            | u64::from(self.incarnation)
    }

    pub fn from_u64(raw: u64) -> Self {
        Self {
            hub: HubId((raw >> 32) as u32),
            partition: PartitionId((raw >> 16) as u16),
            incarnation: raw as u16,
        }
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for HubId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for PartitionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}#{}",
            self.hub.0, self.partition.0, self.incarnation
        )
    }
}

impl fmt::Display for SequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_id_round_trips_through_u64_and_keeps_order() {
        let a = GroupId::new(HubId(7), PartitionId(3), 1);
        let b = GroupId::new(HubId(7), PartitionId(4), 0);
        let c = GroupId::new(HubId(8), PartitionId(0), 0);
        for g in [a, b, c, GroupId::CONTROLLER] {
            assert_eq!(GroupId::from_u64(g.to_u64()), g);
        }
        assert!(a.to_u64() < b.to_u64() && b.to_u64() < c.to_u64());
    }
}
