//! `Diagnostics.ReplicaEvents`: what this node's own replica of a partition has applied,
//! leader or not, so operators and tests can compare the replicas of a partition.

use tonic::{Request, Response, Status};
use tributary_broker::service::ReadEvent;
use tributary_proto::v1 as pb;
use tributary_proto::v1::diagnostics_server::Diagnostics;
use tributary_types::SequenceNumber;

use crate::{GrpcApi, credential};

#[tonic::async_trait]
impl Diagnostics for GrpcApi {
    async fn replica_events(
        &self,
        request: Request<pb::ReplicaEventsRequest>,
    ) -> Result<Response<pb::ReplicaEventsResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let page = self.service.replica_events(
            &credential,
            &req.event_hub,
            &req.partition_id,
            SequenceNumber(req.from_sequence_number),
            req.max_events,
        )?;
        Ok(Response::new(pb::ReplicaEventsResponse {
            node: page.node.0,
            is_leader: page.is_leader,
            begin_sequence_number: page.begin_sequence.0,
            next_sequence_number: page.next_sequence.0,
            events: page.events.into_iter().map(replica_event).collect(),
        }))
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
    use tributary_broker::service::EventRecord;

    use super::*;

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
