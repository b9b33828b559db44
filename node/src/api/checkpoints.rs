use std::sync::Arc;

use crate::api::convert::consumer_group as group;
use tonic::{Request, Response, Status};
use tributary_types::Rights;

use crate::api::auth::{Auth, Scope};
use tributary_proto::v1 as pb;
use tributary_proto::v1::checkpoint_store_server::CheckpointStore as CheckpointStoreApi;

use crate::api::error::ApiError;
use crate::checkpoints::CheckpointStore;
use crate::controller::store::{Checkpoint, Claim, Ownership};

pub struct CheckpointStoreService {
    pub store: Arc<dyn CheckpointStore>,
    pub auth: Auth,
}

/// A partition id as this API writes it: the partition's index in decimal.
fn partition_index(partition_id: &str) -> Result<u16, ApiError> {
    partition_id
        .parse::<u16>()
        .ok()
        .filter(|p| p.to_string() == partition_id)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "partition id '{partition_id}' is not a partition id: ids are 0, 1, 2, ... up to the hub's partition count minus one"
            ))
        })
}

fn ownership(partition: u16, record: Ownership) -> pb::Ownership {
    pb::Ownership {
        partition_id: partition.to_string(),
        owner_id: record.owner_id,
        last_modified_ms: record.last_modified_ms,
        etag: record.etag,
    }
}

fn checkpoint(partition: u16, record: Checkpoint) -> pb::Checkpoint {
    pb::Checkpoint {
        partition_id: partition.to_string(),
        offset: record.offset.to_string(),
        sequence_number: record.sequence_number,
        last_modified_ms: record.last_modified_ms,
    }
}

#[tonic::async_trait]
impl CheckpointStoreApi for CheckpointStoreService {
    async fn list_ownership(
        &self,
        request: Request<pb::ListOwnershipRequest>,
    ) -> Result<Response<pb::ListOwnershipResponse>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::LISTEN,
        )?;
        let req = request.into_inner();
        let records = self
            .store
            .list_ownership(&req.event_hub, group(&req.consumer_group))
            .await?;
        Ok(Response::new(pb::ListOwnershipResponse {
            ownership: records.into_iter().map(|(p, o)| ownership(p, o)).collect(),
        }))
    }

    async fn claim_ownership(
        &self,
        request: Request<pb::ClaimOwnershipRequest>,
    ) -> Result<Response<pb::ClaimOwnershipResponse>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::LISTEN,
        )?;
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
            .collect::<Result<Vec<Claim>, ApiError>>()?;
        let won = self
            .store
            .claim_ownership(&req.event_hub, group(&req.consumer_group), claims)
            .await?;
        Ok(Response::new(pb::ClaimOwnershipResponse {
            claimed: won.into_iter().map(|(p, o)| ownership(p, o)).collect(),
        }))
    }

    async fn update_checkpoint(
        &self,
        request: Request<pb::UpdateCheckpointRequest>,
    ) -> Result<Response<pb::Checkpoint>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::LISTEN,
        )?;
        let req = request.into_inner();
        let Some(update) = req.checkpoint else {
            return Err(ApiError::invalid("the request has no checkpoint").into());
        };
        let partition = partition_index(&update.partition_id)?;
        let offset = update.offset.parse::<i64>().map_err(|_| {
            ApiError::invalid(format!(
                "offset '{}' is not an offset: offsets are decimal integers, as events carry them",
                update.offset
            ))
        })?;
        let stored = self
            .store
            .update_checkpoint(
                &req.event_hub,
                group(&req.consumer_group),
                partition,
                offset,
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
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::LISTEN,
        )?;
        let req = request.into_inner();
        let records = self
            .store
            .list_checkpoints(&req.event_hub, group(&req.consumer_group))
            .await?;
        Ok(Response::new(pb::ListCheckpointsResponse {
            checkpoints: records.into_iter().map(|(p, c)| checkpoint(p, c)).collect(),
        }))
    }
}
