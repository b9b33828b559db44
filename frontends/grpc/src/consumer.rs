//! `Consumer`: partition readers and the receive stream.

use std::pin::Pin;

use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tributary_broker::service::{ReadBatch, ReadRequest};
use tributary_proto::v1 as pb;
use tributary_proto::v1::consumer_server::Consumer;

use crate::{GrpcApi, convert, credential};

#[tonic::async_trait]
impl Consumer for GrpcApi {
    type ReceiveStream = Pin<Box<dyn Stream<Item = Result<pb::ReceiveResponse, Status>> + Send>>;

    async fn get_partition_readers(
        &self,
        request: Request<pb::GetPartitionReadersRequest>,
    ) -> Result<Response<pb::PartitionReaders>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let found = self
            .service
            .partition_readers(
                &credential,
                &req.event_hub,
                &req.consumer_group,
                &req.partition_id,
            )
            .await?;
        Ok(Response::new(pb::PartitionReaders {
            properties: Some(convert::partition_properties(found.properties)),
            readers: found
                .readers
                .into_iter()
                .map(|r| pb::ConnectedReader {
                    name: r.name,
                    owner_level: r.owner_level,
                })
                .collect(),
        }))
    }

    async fn receive(
        &self,
        request: Request<pb::ReceiveRequest>,
    ) -> Result<Response<Self::ReceiveStream>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let request = ReadRequest {
            position: convert::position(req.position)?,
            hub: req.event_hub,
            consumer_group: req.consumer_group,
            partition_id: req.partition_id,
            max_batch: req.max_batch,
            reader_name: req.reader_name,
            owner_level: req.owner_level,
        };
        let batches = self.service.read(&credential, request).await?;
        let responses = ReceiverStream::new(batches).map(|batch| {
            batch
                .map(
                    |ReadBatch {
                         events,
                         last_enqueued_sequence,
                         ..
                     }| pb::ReceiveResponse {
                        events: events.into_iter().map(convert::received_event).collect(),
                        last_enqueued_sequence_number: last_enqueued_sequence.0,
                    },
                )
                .map_err(Status::from)
        });
        Ok(Response::new(Box::pin(responses)))
    }
}
