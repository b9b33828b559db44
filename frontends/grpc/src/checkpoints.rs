//! `CheckpointStore`: consumer-group ownership and checkpoints.

use tonic::{Request, Response, Status};
use tributary_broker::service::{CheckpointUpdate, ClaimRequest};
use tributary_proto::v1 as pb;
use tributary_proto::v1::checkpoint_store_server::CheckpointStore;

use crate::convert::{checkpoint, ownership};
use crate::{GrpcApi, credential};

#[tonic::async_trait]
impl CheckpointStore for GrpcApi {
    async fn list_ownership(
        &self,
        request: Request<pb::ListOwnershipRequest>,
    ) -> Result<Response<pb::ListOwnershipResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let records = self
            .service
            .list_ownership(&credential, &req.event_hub, &req.consumer_group)
            .await?;
        Ok(Response::new(pb::ListOwnershipResponse {
            ownership: records.into_iter().map(|(p, o)| ownership(p, o)).collect(),
        }))
    }

    async fn claim_ownership(
        &self,
        request: Request<pb::ClaimOwnershipRequest>,
    ) -> Result<Response<pb::ClaimOwnershipResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let claims = req
            .claims
            .into_iter()
            .map(|c| ClaimRequest {
                partition_id: c.partition_id,
                owner_id: c.owner_id,
                etag: (!c.etag.is_empty()).then_some(c.etag),
            })
            .collect();
        let won = self
            .service
            .claim_ownership(&credential, &req.event_hub, &req.consumer_group, claims)
            .await?;
        Ok(Response::new(pb::ClaimOwnershipResponse {
            claimed: won.into_iter().map(|(p, o)| ownership(p, o)).collect(),
        }))
    }

    async fn update_checkpoint(
        &self,
        request: Request<pb::UpdateCheckpointRequest>,
    ) -> Result<Response<pb::Checkpoint>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        // A request without a checkpoint names no partition: refused as such.
        let update = req.checkpoint.unwrap_or_default();
        let (partition, stored) = self
            .service
            .update_checkpoint(
                &credential,
                &req.event_hub,
                &req.consumer_group,
                CheckpointUpdate {
                    partition_id: update.partition_id,
                    offset: update.offset,
                    sequence_number: update.sequence_number,
                },
                (!req.owner_id.is_empty()).then_some(req.owner_id.as_str()),
            )
            .await?;
        Ok(Response::new(checkpoint(partition, stored)))
    }

    async fn list_checkpoints(
        &self,
        request: Request<pb::ListCheckpointsRequest>,
    ) -> Result<Response<pb::ListCheckpointsResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let records = self
            .service
            .list_checkpoints(&credential, &req.event_hub, &req.consumer_group)
            .await?;
        Ok(Response::new(pb::ListCheckpointsResponse {
            checkpoints: records.into_iter().map(|(p, c)| checkpoint(p, c)).collect(),
        }))
    }

    async fn list_kafka_offsets(
        &self,
        request: Request<pb::ListKafkaOffsetsRequest>,
    ) -> Result<Response<pb::ListKafkaOffsetsResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let records = self
            .service
            .kafka_offsets(&credential, &req.kafka_group, Some(&req.event_hub))
            .await?;
        Ok(Response::new(pb::ListKafkaOffsetsResponse {
            offsets: records
                .into_iter()
                .map(|r| pb::KafkaOffset {
                    partition_id: r.partition.to_string(),
                    offset: r.offset.offset,
                    metadata: r.offset.metadata,
                    last_modified_ms: r.offset.last_modified_ms,
                })
                .collect(),
        }))
    }
}
