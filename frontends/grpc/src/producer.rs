//! `Producer.Send`.

use tonic::{Request, Response, Status};
use tributary_broker::service::{
    Producer as ProducerNumbering, ProducerStamp, SendRequest, Target,
};
use tributary_proto::v1 as pb;
use tributary_proto::v1::producer_server::Producer;

use crate::{GrpcApi, convert, credential};

#[tonic::async_trait]
impl Producer for GrpcApi {
    async fn send(
        &self,
        request: Request<pb::SendRequest>,
    ) -> Result<Response<pb::SendResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let request = SendRequest {
            hub: req.event_hub,
            target: match req.target {
                None => Target::Any,
                Some(pb::send_request::Target::PartitionId(id)) => Target::PartitionId(id),
                Some(pb::send_request::Target::PartitionKey(key)) => Target::PartitionKey(key),
            },
            events: req
                .events
                .into_iter()
                .map(convert::event_record)
                .collect::<Result<_, _>>()?,
            producer: (req.producer_id != 0).then_some(ProducerNumbering::EventHubs(
                ProducerStamp {
                    producer_id: req.producer_id,
                    sequence: req.producer_sequence,
                },
            )),
        };
        let sent = self.service.send(&credential, request).await?;
        Ok(Response::new(pb::SendResponse {
            partition_id: sent.partition.to_string(),
            first_sequence_number: sent.first_sequence.0,
            offsets: sent.offsets.iter().map(ToString::to_string).collect(),
            enqueued_time_ms: sent.enqueued_time_ms,
        }))
    }
}
