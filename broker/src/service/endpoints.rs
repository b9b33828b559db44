//! Where clients of the protocol front ends find each node and each partition's leader:
//! every node's advertised Kafka addresses and the partitions it leads, asked of every node
//! (the peer port's node status). Kafka's Metadata lists every node as a broker and each
//! partition's leader from it, so clients go straight to leaders.

use std::collections::{BTreeMap, HashMap};

use tributary_types::{GroupId, HubId};

use super::Service;
use crate::broker::KafkaAddrs;
use crate::status::{local_status, remote_status};

/// The cluster as the front ends present it to clients.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Endpoints {
    /// Every node that answered, with its advertised Kafka addresses.
    pub nodes: BTreeMap<u64, KafkaAddrs>,
    /// Each partition's leader as its replicas say (the highest term wins while an old
    /// leader has not heard of its successor), by hub and partition index.
    pub leaders: HashMap<(HubId, u16), u64>,
}

impl Endpoints {
    /// Every node's answer, combined.
    pub fn from_replies(
        replies: impl IntoIterator<Item = tributary_proto::peer::LocalStatusReply>,
    ) -> Endpoints {
        let mut endpoints = Endpoints::default();
        let mut terms: HashMap<(HubId, u16), u64> = HashMap::new();
        for reply in replies {
            let addr = |a: String| (!a.is_empty()).then_some(a);
            endpoints.nodes.insert(
                reply.node,
                KafkaAddrs {
                    plain: addr(reply.kafka_addr),
                    tls: addr(reply.kafka_tls_addr),
                },
            );
            for group in reply.groups.iter().filter(|g| g.leader == reply.node) {
                let id = GroupId::from_u64(group.group);
                let key = (id.hub, id.partition.0);
                if terms.get(&key).is_none_or(|term| *term < group.term) {
                    terms.insert(key, group.term);
                    endpoints.leaders.insert(key, reply.node);
                }
            }
        }
        endpoints
    }
}

impl Service {
    /// Asks every node (this one locally) for its addresses and the partitions it leads; a
    /// node that does not answer within a second is left out.
    pub async fn endpoints(&self) -> Endpoints {
        let runtime = self.broker.runtime();
        let state = runtime.state();
        let broker = &self.broker;
        let replies = futures::future::join_all(state.nodes.values().map(|node| async move {
            if node.id == runtime.me.id {
                Some(local_status(broker))
            } else {
                remote_status(runtime, &node.peer_addr).await
            }
        }))
        .await;
        Endpoints::from_replies(replies.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_proto::peer::{GroupStatus, LocalStatusReply};
    use tributary_types::PartitionId;

    fn group(hub: u32, partition: u16, leader: u64, term: u64) -> GroupStatus {
        GroupStatus {
            group: GroupId::new(HubId(hub), PartitionId(partition), 0).to_u64(),
            leader,
            term,
            ..GroupStatus::default()
        }
    }

    #[test]
    fn leaders_are_the_replicas_that_say_so_with_the_highest_term() {
        let endpoints = Endpoints::from_replies([
            LocalStatusReply {
                node: 1,
                // Node 1 still believes it leads partition 0 in term 3; node 2 leads it in 4.
                groups: vec![group(7, 0, 1, 3), group(7, 1, 2, 4)],
                kafka_addr: "n1:9092".into(),
                ..LocalStatusReply::default()
            },
            LocalStatusReply {
                node: 2,
                groups: vec![group(7, 0, 2, 4), group(7, 1, 2, 4)],
                kafka_tls_addr: "n2:9093".into(),
                ..LocalStatusReply::default()
            },
        ]);
        assert_eq!(endpoints.leaders[&(HubId(7), 0)], 2);
        assert_eq!(endpoints.leaders[&(HubId(7), 1)], 2);
        assert_eq!(
            endpoints.nodes[&1],
            KafkaAddrs {
                plain: Some("n1:9092".into()),
                tls: None
            }
        );
        assert_eq!(endpoints.nodes[&2].tls.as_deref(), Some("n2:9093"));
    }
}
