//! `Diagnostics.ReplicaEvents`: what this node's own replica of a partition has applied,
//! leader or not, so operators and tests can compare the replicas of a partition.

use std::sync::Arc;

use tonic::{Request, Response, Status};
use tributary_types::Rights;

use crate::api::auth::{Auth, Scope};
use tributary_proto::v1 as pb;
use tributary_proto::v1::diagnostics_server::Diagnostics;

use crate::api::error::ApiError;
use crate::broker::Broker;
use crate::partition::ReadEvent;

/// Events per page when the request does not say.
pub const REPLICA_EVENTS_PAGE_DEFAULT: u32 = 1000;
/// Events per page at most: a page of checksums stays far below the message size limit.
pub const REPLICA_EVENTS_PAGE_MAX: u32 = 10_000;

pub struct DiagnosticsService {
    pub broker: Arc<Broker>,
    pub auth: Auth,
}

#[tonic::async_trait]
impl Diagnostics for DiagnosticsService {
    async fn replica_events(
        &self,
        request: Request<pb::ReplicaEventsRequest>,
    ) -> Result<Response<pb::ReplicaEventsResponse>, Status> {
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
        let req = request.into_inner();
        let max_events = page_size(req.max_events)?;
        if req.from_sequence_number < 0 {
            return Err(ApiError::invalid(format!(
                "from_sequence_number must be 0 or more, got {}",
                req.from_sequence_number
            ))
            .into());
        }
        let hub = self.broker.hub(&req.event_hub)?;
        let index = self.broker.partition_index(&hub, &req.partition_id)?;
        let node = self.broker.runtime().me.id;
        let replicas = &hub.replicas[usize::from(index)];
        if !replicas.contains(&node) {
            return Err(ApiError::not_found(format!(
                "node {node} holds no replica of partition {} of event hub '{}'; its replicas \
                 are on nodes {replicas:?}: ask one of those (tributary --endpoint <its client \
                 address> debug replica-events ...)",
                req.partition_id, hub.name
            ))
            .into());
        }
        let partition = self.broker.local_partition(&hub, index)?;
        // The progress first: the events read next are then at least up to it, and a replica
        // that applies more meanwhile only makes the page longer, never inconsistent.
        let progress = partition.progress();
        let events = partition
            .read(req.from_sequence_number, max_events as usize)
            .map_err(ApiError::from)?;
        Ok(Response::new(pb::ReplicaEventsResponse {
            node,
            is_leader: partition.is_leader(),
            begin_sequence_number: progress.begin_sequence,
            next_sequence_number: progress.next_sequence,
            events: events.into_iter().map(replica_event).collect(),
        }))
    }
}

fn page_size(requested: u32) -> Result<u32, ApiError> {
    match requested {
        0 => Ok(REPLICA_EVENTS_PAGE_DEFAULT),
        n if n > REPLICA_EVENTS_PAGE_MAX => Err(ApiError::invalid(format!(
            "max_events {n} is over the limit of {REPLICA_EVENTS_PAGE_MAX} events per page"
        ))),
        n => Ok(n),
    }
}

fn replica_event(event: ReadEvent) -> pb::ReplicaEvent {
    let body = &event.record.body;
    pb::ReplicaEvent {
        sequence_number: event.sequence,
        offset: event.offset.to_string(),
        enqueued_time_ms: event.enqueued_time_ms,
        partition_key: event.record.partition_key.unwrap_or_default(),
        body_checksum: crc32fast::hash(body),
        body_bytes: u32::try_from(body.len()).expect("an event body is at most 1 MiB"),
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::partition::codec::EventRecord;

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

    #[test]
    fn an_event_is_listed_with_its_numbers_key_and_body_checksum() {
        let event = ReadEvent {
            sequence: 4,
            offset: 812,
            enqueued_time_ms: 1_700_000_000_123,
            record: EventRecord {
                partition_key: Some("customer-7".into()),
                properties: vec![],
                body: Bytes::from_static(b"123456789"),
            },
        };
        let listed = replica_event(event);
        assert_eq!(listed.sequence_number, 4);
        assert_eq!(listed.offset, "812");
        assert_eq!(listed.enqueued_time_ms, 1_700_000_000_123);
        assert_eq!(listed.partition_key, "customer-7");
        // The CRC-32 check value of "123456789".
        assert_eq!(listed.body_checksum, 0xCBF4_3926);
        assert_eq!(listed.body_bytes, 9);
    }
}
