use std::sync::Arc;
use std::time::Duration;

use tonic::{Request, Response, Status};
use tributary_types::Rights;

use crate::api::auth::{Auth, Scope};
use tributary_proto::v1 as pb;
use tributary_proto::v1::management_server::Management;

use crate::api::convert;
use crate::api::error::ApiError;
use crate::broker::Broker;
use crate::controller::rules::{KeyKind, RuleCommand, RuleScope, random_key};
use crate::controller::state::{Command, Reply};
use tributary_types::AuthorizationRule;
use tributary_types::sas::RightsParseError;

pub struct ManagementService {
    pub broker: Arc<Broker>,
    pub placement: Arc<crate::placement::Placement>,
    pub auth: Auth,
}

#[tonic::async_trait]
impl Management for ManagementService {
    async fn create_event_hub(
        &self,
        request: Request<pb::CreateEventHubRequest>,
    ) -> Result<Response<pb::EventHubProperties>, Status> {
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
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
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
        let req = request.into_inner();
        self.broker.set_draining(req.node_id, req.drain).await?;
        Ok(Response::new(pb::DrainNodeResponse {}))
    }

    async fn decommission_node(
        &self,
        request: Request<pb::DecommissionNodeRequest>,
    ) -> Result<Response<pb::DecommissionNodeResponse>, Status> {
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
        let req = request.into_inner();
        self.broker
            .set_decommissioning(req.node_id, req.decommission)
            .await?;
        Ok(Response::new(pb::DecommissionNodeResponse {}))
    }

    async fn plan_rebalance(
        &self,
        request: Request<pb::PlanRebalanceRequest>,
    ) -> Result<Response<pb::PlanRebalanceResponse>, Status> {
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
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
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().name),
            Rights::MANAGE,
        )?;
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
        self.auth
            .check(&request, Scope::Hub(&request.get_ref().name), Rights::NONE)?;
        let hub = self.broker.hub(&request.into_inner().name)?;
        Ok(Response::new(convert::hub_properties(&hub)))
    }

    async fn list_event_hubs(
        &self,
        request: Request<pb::ListEventHubsRequest>,
    ) -> Result<Response<pb::ListEventHubsResponse>, Status> {
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
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
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().name),
            Rights::MANAGE,
        )?;
        self.broker.delete_hub(&request.into_inner().name).await?;
        Ok(Response::new(pb::DeleteEventHubResponse {}))
    }

    async fn create_consumer_group(
        &self,
        request: Request<pb::CreateConsumerGroupRequest>,
    ) -> Result<Response<pb::ConsumerGroupProperties>, Status> {
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::MANAGE,
        )?;
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
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::MANAGE,
        )?;
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
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::MANAGE,
        )?;
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
        self.auth.check(
            &request,
            Scope::Hub(&request.get_ref().event_hub),
            Rights::NONE,
        )?;
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
        request: Request<pb::GetClusterStatusRequest>,
    ) -> Result<Response<pb::ClusterStatus>, Status> {
        self.auth
            .check(&request, Scope::Namespace, Rights::MANAGE)?;
        Ok(Response::new(
            crate::status::cluster_status(&self.broker).await,
        ))
    }

    async fn create_authorization_rule(
        &self,
        request: Request<pb::CreateAuthorizationRuleRequest>,
    ) -> Result<Response<pb::AuthorizationRule>, Status> {
        let scope = rule_scope(&request.get_ref().event_hub);
        self.auth
            .check(&request, auth_scope(&scope), Rights::MANAGE)?;
        let req = request.into_inner();
        let rights = parse_rights(&req.rights)?;
        let rule = AuthorizationRule {
            name: req.name.clone(),
            primary_key: random_key(),
            secondary_key: random_key(),
            rights,
        };
        let Reply::Rule(rule) = self
            .run_rule(RuleCommand::Create {
                scope: scope.clone(),
                rule,
            })
            .await?
        else {
            return Err(ApiError::internal("creating a rule replied without the rule").into());
        };
        self.await_rule(&scope, &rule.name, |r| r.is_some()).await;
        Ok(Response::new(rule_properties(&scope, &rule)))
    }

    async fn list_authorization_rules(
        &self,
        request: Request<pb::ListAuthorizationRulesRequest>,
    ) -> Result<Response<pb::ListAuthorizationRulesResponse>, Status> {
        let scope = rule_scope(&request.get_ref().event_hub);
        self.auth
            .check(&request, auth_scope(&scope), Rights::MANAGE)?;
        let state = self.broker.runtime().state();
        let rules = state
            .rules(&scope)
            .map_err(ApiError::from)?
            .iter()
            .map(|rule| rule_properties(&scope, rule))
            .collect();
        Ok(Response::new(pb::ListAuthorizationRulesResponse { rules }))
    }

    async fn get_authorization_rule_keys(
        &self,
        request: Request<pb::GetAuthorizationRuleKeysRequest>,
    ) -> Result<Response<pb::AuthorizationRuleKeys>, Status> {
        let scope = rule_scope(&request.get_ref().event_hub);
        self.auth
            .check(&request, auth_scope(&scope), Rights::MANAGE)?;
        let req = request.into_inner();
        let state = self.broker.runtime().state();
        let rule = find_rule(
            state.rules(&scope).map_err(ApiError::from)?,
            &scope,
            &req.name,
        )?;
        Ok(Response::new(self.rule_keys(&scope, rule)))
    }

    async fn regenerate_authorization_rule_key(
        &self,
        request: Request<pb::RegenerateAuthorizationRuleKeyRequest>,
    ) -> Result<Response<pb::AuthorizationRuleKeys>, Status> {
        let scope = rule_scope(&request.get_ref().event_hub);
        self.auth
            .check(&request, auth_scope(&scope), Rights::MANAGE)?;
        let req = request.into_inner();
        let key = match pb::AuthorizationKey::try_from(req.key) {
            Ok(pb::AuthorizationKey::PrimaryKey) => KeyKind::Primary,
            Ok(pb::AuthorizationKey::SecondaryKey) => KeyKind::Secondary,
            _ => {
                return Err(ApiError::invalid(
                    "say which key to regenerate: the primary or the secondary",
                )
                .into());
            }
        };
        let new_key = if req.key_value.is_empty() {
            random_key()
        } else {
            req.key_value
        };
        let Reply::Rule(rule) = self
            .run_rule(RuleCommand::RegenerateKey {
                scope: scope.clone(),
                name: req.name,
                key,
                new_key,
            })
            .await?
        else {
            return Err(ApiError::internal("rekeying a rule replied without the rule").into());
        };
        self.await_rule(&scope, &rule.name, |r| r == Some(&rule))
            .await;
        Ok(Response::new(self.rule_keys(&scope, &rule)))
    }

    async fn delete_authorization_rule(
        &self,
        request: Request<pb::DeleteAuthorizationRuleRequest>,
    ) -> Result<Response<pb::DeleteAuthorizationRuleResponse>, Status> {
        let scope = rule_scope(&request.get_ref().event_hub);
        self.auth
            .check(&request, auth_scope(&scope), Rights::MANAGE)?;
        let req = request.into_inner();
        self.run_rule(RuleCommand::Delete {
            scope: scope.clone(),
            name: req.name.clone(),
        })
        .await?;
        self.await_rule(&scope, &req.name, |r| r.is_none()).await;
        Ok(Response::new(pb::DeleteAuthorizationRuleResponse {}))
    }
}

impl ManagementService {
    async fn run_rule(&self, command: RuleCommand) -> Result<Reply, ApiError> {
        self.broker.runtime().propose(Command::Rule(command)).await
    }

    /// Waits (bounded) until this node's view shows the rule as `done` says, so a token
    /// made with a key just created or rotated works here at once.
    async fn await_rule(
        &self,
        scope: &RuleScope,
        name: &str,
        done: impl Fn(Option<&AuthorizationRule>) -> bool,
    ) {
        self.broker
            .await_view(|state| {
                state
                    .rules(scope)
                    .is_ok_and(|rules| done(rules.iter().find(|r| r.name == name)))
            })
            .await;
    }

    fn rule_keys(&self, scope: &RuleScope, rule: &AuthorizationRule) -> pb::AuthorizationRuleKeys {
        let client_addr = &self.broker.runtime().me.client_addr;
        let connection_string = |key: &str| {
            let mut text = format!(
                "Endpoint=sb://{client_addr}/;SharedAccessKeyName={};SharedAccessKey={key}",
                rule.name
            );
            if let RuleScope::Hub(hub) = scope {
                text.push_str(&format!(";EntityPath={hub}"));
            }
            text
        };
        pb::AuthorizationRuleKeys {
            rule: Some(rule_properties(scope, rule)),
            primary_key: rule.primary_key.clone(),
            secondary_key: rule.secondary_key.clone(),
            primary_connection_string: connection_string(&rule.primary_key),
            secondary_connection_string: connection_string(&rule.secondary_key),
        }
    }
}

/// An empty hub name means the namespace.
fn rule_scope(event_hub: &str) -> RuleScope {
    if event_hub.is_empty() {
        RuleScope::Namespace
    } else {
        RuleScope::Hub(event_hub.to_owned())
    }
}

fn auth_scope(scope: &RuleScope) -> Scope<'_> {
    match scope {
        RuleScope::Namespace => Scope::Namespace,
        RuleScope::Hub(hub) => Scope::Hub(hub),
    }
}

fn parse_rights(names: &[String]) -> Result<Rights, ApiError> {
    let mut rights = Rights::NONE;
    for name in names {
        let parsed: Rights = name
            .parse()
            .map_err(|e: RightsParseError| ApiError::invalid(e.to_string()))?;
        rights = rights.union(parsed);
    }
    Ok(rights)
}

fn rule_properties(scope: &RuleScope, rule: &AuthorizationRule) -> pb::AuthorizationRule {
    pb::AuthorizationRule {
        name: rule.name.clone(),
        event_hub: match scope {
            RuleScope::Namespace => String::new(),
            RuleScope::Hub(hub) => hub.clone(),
        },
        rights: rule
            .rights
            .to_string()
            .split(", ")
            .filter(|name| *name != "none")
            .map(str::to_owned)
            .collect(),
    }
}

fn find_rule<'a>(
    rules: &'a [AuthorizationRule],
    scope: &RuleScope,
    name: &str,
) -> Result<&'a AuthorizationRule, ApiError> {
    rules.iter().find(|r| r.name == name).ok_or_else(|| {
        ApiError::not_found(format!(
            "{scope} has no authorization rule '{name}'; `tributary auth rule list` shows its rules"
        ))
    })
}
