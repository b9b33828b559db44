//! Raft member ids. A group's member is a node's replica *in one life*: when a node's data
//! directory is lost, or a replica is added again to a node that dropped an earlier copy,
//! it comes back as a new member, so a replica that forgot its votes and log can never be
//! counted as the one that had them.
//!
//! The id packs both: the low 48 bits are the node id, the high 16 bits the incarnation
//! (the controller counts the node's data incarnation plus the moves of the replica to the
//! node). Incarnation 0 is the node id itself.

use tributary_types::NodeId;

const NODE_BITS: u32 = 48;
const NODE_MASK: u64 = (1 << NODE_BITS) - 1;

/// Largest node id a member id can carry.
pub const NODE_ID_MAX: u64 = NODE_MASK;

/// The member id of `node` in `incarnation`.
pub fn member_id(node: u64, incarnation: u32) -> u64 {
    debug_assert!(node <= NODE_MASK, "node id {node} too large");
    debug_assert!(incarnation <= u32::from(u16::MAX));
    (u64::from(incarnation & 0xffff) << NODE_BITS) | (node & NODE_MASK)
}

/// The node a member lives on.
pub fn member_node(member: u64) -> NodeId {
    NodeId(member & NODE_MASK)
}

/// The incarnation of a member's node data.
pub fn member_incarnation(member: u64) -> u32 {
    (member >> NODE_BITS) as u32
}

/// `node` or `node#incarnation`, for messages.
pub fn describe_member(member: u64) -> String {
    match member_incarnation(member) {
        0 => format!("node {}", member_node(member)),
        i => format!("node {} (incarnation {i})", member_node(member)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn incarnation_zero_is_the_node_id() {
        assert_eq!(member_id(7, 0), 7);
        assert_eq!(member_node(7), NodeId(7));
    }

    proptest! {
        #[test]
        fn round_trips(node in 0..=NODE_ID_MAX, incarnation in 0u32..=65535) {
            let m = member_id(node, incarnation);
            prop_assert_eq!(member_node(m), NodeId(node));
            prop_assert_eq!(member_incarnation(m), incarnation);
            prop_assert_eq!(m == node, incarnation == 0);
        }
    }
}
