//! `Management`: event hubs, consumer groups, nodes, placement, cluster status and
//! authorization rules.

use tonic::{Request, Response, Status};
use tributary_broker::service::RuleKeyKind;
use tributary_proto::v1 as pb;
use tributary_proto::v1::management_server::Management;
use tributary_types::NodeId;

use crate::{GrpcApi, convert, credential};

#[tonic::async_trait]
impl Management for GrpcApi {
    async fn create_event_hub(
        &self,
        request: Request<pb::CreateEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        let credential = credential(&request);
        let hub = convert::new_hub_request(request.get_ref())?;
        let record = self.service.create_hub(&credential, hub).await?;
        Ok(Response::new(convert::hub_properties(&record)))
    }

    async fn drain_node(
        &self,
        request: Request<pb::DrainNodeRequest>,
    ) -> Result<Response<pb::DrainNodeResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        self.service
            .drain_node(&credential, NodeId(req.node_id), req.drain)
            .await?;
        Ok(Response::new(pb::DrainNodeResponse {}))
    }

    async fn decommission_node(
        &self,
        request: Request<pb::DecommissionNodeRequest>,
    ) -> Result<Response<pb::DecommissionNodeResponse>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        self.service
            .decommission_node(&credential, NodeId(req.node_id), req.decommission)
            .await?;
        Ok(Response::new(pb::DecommissionNodeResponse {}))
    }

    async fn plan_rebalance(
        &self,
        request: Request<pb::PlanRebalanceRequest>,
    ) -> Result<Response<pb::PlanRebalanceResponse>, Status> {
        let plan = self.service.plan_rebalance(&credential(&request)).await?;
        Ok(Response::new(pb::PlanRebalanceResponse {
            moves: plan.moves.into_iter().map(convert::planned_move).collect(),
            down_nodes: plan.down_nodes.into_iter().map(|n| n.0).collect(),
        }))
    }

    async fn update_event_hub(
        &self,
        request: Request<pb::UpdateEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        let credential = credential(&request);
        let update = convert::hub_update_request(request.get_ref())?;
        let record = self.service.update_hub(&credential, update).await?;
        Ok(Response::new(convert::hub_properties(&record)))
    }

    async fn get_event_hub(
        &self,
        request: Request<pb::GetEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        let hub = self
            .service
            .get_hub(&credential(&request), &request.get_ref().name)?;
        Ok(Response::new(convert::hub_properties(&hub)))
    }

    async fn list_event_hubs(
        &self,
        request: Request<pb::ListEventHubsRequest>,
    ) -> Result<Response<pb::ListEventHubsResponse>, Status> {
        let hubs = self.service.list_hubs(&credential(&request))?;
        Ok(Response::new(pb::ListEventHubsResponse {
            event_hubs: hubs.iter().map(convert::hub_properties).collect(),
        }))
    }

    async fn delete_event_hub(
        &self,
        request: Request<pb::DeleteEventHubRequest>,
    ) -> Result<Response<pb::DeleteEventHubResponse>, Status> {
        self.service
            .delete_hub(&credential(&request), &request.get_ref().name)
            .await?;
        Ok(Response::new(pb::DeleteEventHubResponse {}))
    }

    async fn create_consumer_group(
        &self,
        request: Request<pb::CreateConsumerGroupRequest>,
    ) -> Result<Response<pb::ConsumerGroupProperties>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let created_at_ms = self
            .service
            .create_consumer_group(&credential, &req.event_hub, &req.name)
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
        let hub = &request.get_ref().event_hub;
        let groups = self
            .service
            .list_consumer_groups(&credential(&request), hub)?;
        Ok(Response::new(pb::ListConsumerGroupsResponse {
            consumer_groups: groups
                .into_iter()
                .map(|(name, created_at_ms)| pb::ConsumerGroupProperties {
                    event_hub: hub.clone(),
                    name,
                    created_at_ms,
                })
                .collect(),
        }))
    }

    async fn delete_consumer_group(
        &self,
        request: Request<pb::DeleteConsumerGroupRequest>,
    ) -> Result<Response<pb::DeleteConsumerGroupResponse>, Status> {
        let req = request.get_ref();
        self.service
            .delete_consumer_group(&credential(&request), &req.event_hub, &req.name)
            .await?;
        Ok(Response::new(pb::DeleteConsumerGroupResponse {}))
    }

    async fn get_partition_properties(
        &self,
        request: Request<pb::GetPartitionPropertiesRequest>,
    ) -> Result<Response<pb::PartitionProperties>, Status> {
        let req = request.get_ref();
        let properties = self
            .service
            .partition_properties(&credential(&request), &req.event_hub, &req.partition_id)
            .await?;
        Ok(Response::new(convert::partition_properties(properties)))
    }

    async fn get_cluster_status(
        &self,
        request: Request<pb::GetClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        let status = self.service.cluster_status(&credential(&request)).await?;
        Ok(Response::new(convert::cluster_status(status)))
    }

    async fn create_authorization_rule(
        &self,
        request: Request<pb::CreateAuthorizationRuleRequest>,
    ) -> Result<Response<pb::AuthorizationRule>, Status> {
        let req = request.get_ref();
        let rule = self
            .service
            .create_rule(
                &credential(&request),
                &req.event_hub,
                &req.name,
                &req.rights,
            )
            .await?;
        Ok(Response::new(convert::rule_properties(
            &req.event_hub,
            &rule,
        )))
    }

    async fn list_authorization_rules(
        &self,
        request: Request<pb::ListAuthorizationRulesRequest>,
    ) -> Result<Response<pb::ListAuthorizationRulesResponse>, Status> {
        let hub = &request.get_ref().event_hub;
        let rules = self.service.list_rules(&credential(&request), hub)?;
        Ok(Response::new(pb::ListAuthorizationRulesResponse {
            rules: rules
                .iter()
                .map(|rule| convert::rule_properties(hub, rule))
                .collect(),
        }))
    }

    async fn get_authorization_rule_keys(
        &self,
        request: Request<pb::GetAuthorizationRuleKeysRequest>,
    ) -> Result<Response<pb::AuthorizationRuleKeys>, Status> {
        let req = request.get_ref();
        let keys = self
            .service
            .rule_keys(&credential(&request), &req.event_hub, &req.name)?;
        Ok(Response::new(convert::rule_keys(&req.event_hub, keys)))
    }

    async fn regenerate_authorization_rule_key(
        &self,
        request: Request<pb::RegenerateAuthorizationRuleKeyRequest>,
    ) -> Result<Response<pb::AuthorizationRuleKeys>, Status> {
        let credential = credential(&request);
        let req = request.into_inner();
        let key = match pb::AuthorizationKey::try_from(req.key) {
            Ok(pb::AuthorizationKey::PrimaryKey) => Some(RuleKeyKind::Primary),
            Ok(pb::AuthorizationKey::SecondaryKey) => Some(RuleKeyKind::Secondary),
            _ => None,
        };
        let keys = self
            .service
            .regenerate_rule_key(&credential, &req.event_hub, &req.name, key, req.key_value)
            .await?;
        Ok(Response::new(convert::rule_keys(&req.event_hub, keys)))
    }

    async fn delete_authorization_rule(
        &self,
        request: Request<pb::DeleteAuthorizationRuleRequest>,
    ) -> Result<Response<pb::DeleteAuthorizationRuleResponse>, Status> {
        let req = request.get_ref();
        self.service
            .delete_rule(&credential(&request), &req.event_hub, &req.name)
            .await?;
        Ok(Response::new(pb::DeleteAuthorizationRuleResponse {}))
    }
}
