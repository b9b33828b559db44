//! `CheckpointStore`: consumer-group ownership and checkpoints.

use tonic::{Request, Response, Status};
use tributary_broker::service::Claim;
use tributary_proto::v1 as pb;
use tributary_proto::v1::checkpoint_store_server::CheckpointStore;

use crate::convert::{checkpoint, offset, ownership, partition_index};
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
            .map(|c| {
                Ok(Claim {
                    partition: partition_index(&c.partition_id)?,
                    owner_id: c.owner_id,
                    etag: (!c.etag.is_empty()).then_some(c.etag),
                })
            })
            .collect::<Result<Vec<Claim>, tributary_broker::Error>>()?;
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
        let Some(update) = req.checkpoint else {
            return Err(tributary_broker::Error::invalid("the request has no checkpoint").into());
        };
        let partition = partition_index(&update.partition_id)?;
        let stored = self
            .service
            .update_checkpoint(
                &credential,
                &req.event_hub,
                &req.consumer_group,
                partition,
                offset(&update.offset)?,
                update.sequence_number,
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
}
