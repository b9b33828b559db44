//! What this node's own replica of a partition has applied, leader or not, so operators and
//! tests can compare the replicas of a partition. Needs Manage on the namespace.

use tributary_types::{NodeId, Rights, SequenceNumber};

use super::Service;
use crate::auth::{Credential, Scope};
use crate::error::Error;
use crate::partition::ReadEvent;

/// Events per page when the request does not say.
pub const REPLICA_EVENTS_PAGE_DEFAULT: u32 = 1000;
/// Events per page at most: a page of checksums stays far below the message size limit.
pub const REPLICA_EVENTS_PAGE_MAX: u32 = 10_000;

/// A page of this node's replica's events.
#[derive(Debug, Clone)]
pub struct ReplicaEvents {
    pub node: NodeId,
    pub is_leader: bool,
    pub begin_sequence: SequenceNumber,
    pub next_sequence: SequenceNumber,
    pub events: Vec<ReadEvent>,
}

impl Service {
    /// Up to `max_events` (0: the default page) of this node's replica's events from
    /// `from_sequence`.
    pub fn replica_events(
        &self,
        credential: &Credential,
        hub: &str,
        partition_id: &str,
        from_sequence: SequenceNumber,
        max_events: u32,
    ) -> Result<ReplicaEvents, Error> {
        self.check(credential, Scope::Namespace, Rights::MANAGE)?;
        let max_events = page_size(max_events)?;
        if from_sequence.0 < 0 {
            return Err(Error::invalid(format!(
                "from_sequence_number must be 0 or more, got {from_sequence}"
            )));
        }
        let record = self.broker.hub(hub)?;
        let index = self.broker.partition_index(&record, partition_id)?;
        let node = self.broker.runtime().me.id;
        let replicas = &record.replicas[usize::from(index)];
        if !replicas.contains(&node) {
            return Err(Error::not_found(format!(
                "node {node} holds no replica of partition {partition_id} of event hub '{}'; \
                 its replicas are on nodes {replicas:?}: ask one of those (tributary \
                 --endpoint <its client address> debug replica-events ...)",
                record.name
            )));
        }
        let partition = self.broker.local_partition(&record, index)?;
        // The progress first: the events read next are then at least up to it, and a replica
        // that applies more meanwhile only makes the page longer, never inconsistent.
        let progress = partition.progress();
        let events = partition
            .read(from_sequence.0, max_events as usize)
            .map_err(|e| self.broker.partition_error(e))?;
        Ok(ReplicaEvents {
            node: NodeId(node),
            is_leader: partition.is_leader(),
            begin_sequence: SequenceNumber(progress.begin_sequence),
            next_sequence: SequenceNumber(progress.next_sequence),
            events,
        })
    }
}

fn page_size(requested: u32) -> Result<u32, Error> {
    match requested {
        0 => Ok(REPLICA_EVENTS_PAGE_DEFAULT),
        n if n > REPLICA_EVENTS_PAGE_MAX => Err(Error::invalid(format!(
            "max_events {n} is over the limit of {REPLICA_EVENTS_PAGE_MAX} events per page"
        ))),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_size_defaults_and_is_bounded() {
        assert_eq!(page_size(0).unwrap(), REPLICA_EVENTS_PAGE_DEFAULT);
        assert_eq!(page_size(7).unwrap(), 7);
        assert_eq!(
            page_size(REPLICA_EVENTS_PAGE_MAX).unwrap(),
            REPLICA_EVENTS_PAGE_MAX
        );
        let error = page_size(REPLICA_EVENTS_PAGE_MAX + 1).unwrap_err();
        assert!(error.message.contains("over the limit"), "{error}");
    }
}
