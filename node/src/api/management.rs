use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};
use tributary_proto::v1 as pb;
use tributary_proto::v1::management_server::Management;

use crate::api::convert;
use crate::broker::Broker;

pub struct ManagementService {
    pub broker: Arc<Broker>,
    pub placement: Arc<crate::placement::Placement>,
}

#[tonic::async_trait]
impl Management for ManagementService {
    async fn create_event_hub(
        &self,
        request: Request<pb::CreateEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        let req = request.into_inner();
        let retention = (req.retention_ms > 0).then(|| Duration::from_millis(req.retention_ms));
        let replication_factor = match req.replication_factor {
            0 => None,
            rf => Some(u8::try_from(rf).unwrap_or(u8::MAX)),
        };
        let cluster_id = self.broker.runtime().state().cluster_id.clone();
        let settings = convert::hub_settings(&req, self.broker.now_ms(), &cluster_id)?;
        let record = self
            .broker
            .create_hub(
                &req.name,
                req.partition_count,
                retention,
                replication_factor,
                req.throughput_units,
                settings,
            )
            .await?;
        Ok(Response::new(convert::hub_properties(&record)))
    }

    async fn drain_node(
        &self,
        request: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::DrainNodeResponse>, Status> {
        let req = request.into_inner();
        self.broker.set_draining(req.node_id, req.drain).await?;
        Ok(Response::new(pb::DrainNodeResponse {}))
    }

    async fn decommission_node(
        &self,
        request: Request<pb::DecommissionNodeRequest>,
    ) -> Result<Response<pb::DecommissionNodeResponse>, Status> {
        let req = request.into_inner();
        self.broker
            .set_decommissioning(req.node_id, req.decommission)
            .await?;
        Ok(Response::new(pb::DecommissionNodeResponse {}))
    }

    async fn plan_rebalance(
        &self,
        _request: Request<pb::PlanRebalanceRequest>,
    ) -> Result<Response<pb::PlanRebalanceResponse>, Status> {
        let (decision, down_nodes) = self.placement.dry_run().await;
        let state = self.broker.runtime().state();
        let mut moves: Vec<pb::PlannedMove> = decision
            .moves
            .iter()
            .map(|m| pb::PlannedMove {
                kind: "replica".into(),
                event_hub: state.hub_name(m.hub),
                partition_id: m.partition.to_string(),
                from: m.from.unwrap_or(0),
                to: m.to,
            })
            .collect();
        moves.extend(decision.leaders.iter().map(|(hub, partition, to)| {
            let from = state
                .replicas_of(*hub, *partition)
                .and_then(|r| r.first().copied())
                .unwrap_or(0);
            pb::PlannedMove {
                kind: "leader".into(),
                event_hub: state.hub_name(*hub),
                partition_id: partition.to_string(),
                from,
                to: *to,
            }
        }));
        Ok(Response::new(pb::PlanRebalanceResponse {
            moves,
            down_nodes,
        }))
    }

    async fn update_event_hub(
        &self,
        request: Request<pb::UpdateEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        let req = request.into_inner();
        self.broker.hub(&req.name)?;
        let cluster_id = self.broker.runtime().state().cluster_id.clone();
        let update = convert::hub_update(&req, self.broker.now_ms(), &cluster_id)?;
        let record = self.broker.update_hub(&req.name, update).await?;
        Ok(Response::new(convert::hub_properties(&record)))
    }

    async fn get_event_hub(
        &self,
        request: Request<pb::GetEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        let hub = self.broker.hub(&request.into_inner().name)?;
        Ok(Response::new(convert::hub_properties(&hub)))
    }

    async fn list_event_hubs(
        &self,
        _request: Request<pb::ListEventHubsRequest>,
    ) -> Result<Response<pb::ListEventHubsResponse>, Status> {
        let event_hubs = self
            .broker
            .hub_records()
            .iter()
            .map(convert::hub_properties)
            .collect();
        Ok(Response::new(pb::ListEventHubsResponse { event_hubs }))
    }

    async fn delete_event_hub(
        &self,
        request: Request<pb::DeleteEventHubRequest>,
    ) -> Result<Response<pb::DeleteEventHubResponse>, Status> {
        self.broker.delete_hub(&request.into_inner().name).await?;
        Ok(Response::new(pb::DeleteEventHubResponse {}))
    }

    async fn create_consumer_group(
        &self,
        request: Request<pb::CreateConsumerGroupRequest>,
    ) -> Result<Response<pb::ConsumerGroupProperties>, Status> {
        let req = request.into_inner();
        let created_at_ms = self
            .broker
            .create_consumer_group(&req.event_hub, &req.name)
            .await?;
        Ok(Response::new(pb::ConsumerGroupProperties {
            event_hub: req.event_hub,
            name: req.name,
            created_at_ms,
        }))
    }

    async fn list_consumer_groups(
        &self,
        request: Request<pb::ListConsumerGroupsRequest>,
    ) -> Result<Response<pb::ListConsumerGroupsResponse>, Status> {
        let req = request.into_inner();
        let record = self.broker.hub(&req.event_hub)?;
        let consumer_groups = record
            .consumer_groups
            .iter()
            .map(|(name, created)| pb::ConsumerGroupProperties {
                event_hub: record.name.clone(),
                name: name.clone(),
                created_at_ms: *created,
            })
            .collect();
        Ok(Response::new(pb::ListConsumerGroupsResponse {
            consumer_groups,
        }))
    }

    async fn delete_consumer_group(
        &self,
        request: Request<pb::DeleteConsumerGroupRequest>,
    ) -> Result<Response<pb::DeleteConsumerGroupResponse>, Status> {
        let req = request.into_inner();
        self.broker
            .delete_consumer_group(&req.event_hub, &req.name)
            .await?;
        Ok(Response::new(pb::DeleteConsumerGroupResponse {}))
    }

    async fn get_partition_properties(
        &self,
        request: Request<pb::GetPartitionPropertiesRequest>,
    ) -> Result<Response<pb::PartitionProperties>, Status> {
        let req = request.into_inner();
        let hub = self.broker.hub(&req.event_hub)?;
        let index = self.broker.partition_index(&hub, &req.partition_id)?;
        let partition = self.broker.leader_partition(&hub, index).await?;
        Ok(Response::new(convert::partition_properties(
            &req.event_hub,
            &req.partition_id,
            &partition.settled_progress().await,
            &partition.capture_progress(),
        )))
    }

    async fn get_cluster_status(
        &self,
        _request: Request<pb::GetClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        Ok(Response::new(
            crate::status::cluster_status(&self.broker).await,
        ))
    }
}
