//! Consumer groups with the classic protocol: FindCoordinator, JoinGroup, SyncGroup,
//! Heartbeat, LeaveGroup, OffsetCommit, OffsetFetch, ListGroups and DescribeGroups.
//!
//! The coordinator of every group is the node leading the controller group: membership
//! lives in memory there ([`Coordinator`], a state machine this module feeds), committed
//! offsets in the controller's replicated consumer store. FindCoordinator names it, at its
//! advertised address from the node directory Metadata uses; a group request reaching
//! another node gets NOT_COORDINATOR, and the client asks FindCoordinator again. A node that stops
//! leading drops its groups; their members rejoin on the next coordinator.
//!
//! JoinGroup and SyncGroup wait: the request parks a sender here and polls the state
//! machine's clock while it waits, so rebalances and session timeouts move without a task
//! of their own. Every group API needs Listen (on a hub, or the namespace); offsets need
//! Listen on their hub.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_groups_request::DescribeGroupsRequest;
use kafka_protocol::messages::describe_groups_response::{
    DescribeGroupsResponse, DescribedGroup, DescribedGroupMember,
};
use kafka_protocol::messages::find_coordinator_request::FindCoordinatorRequest;
use kafka_protocol::messages::find_coordinator_response::FindCoordinatorResponse;
use kafka_protocol::messages::heartbeat_request::HeartbeatRequest;
use kafka_protocol::messages::heartbeat_response::HeartbeatResponse;
use kafka_protocol::messages::join_group_request::JoinGroupRequest;
use kafka_protocol::messages::join_group_response::{JoinGroupResponse, JoinGroupResponseMember};
use kafka_protocol::messages::leave_group_request::LeaveGroupRequest;
use kafka_protocol::messages::leave_group_response::{LeaveGroupResponse, MemberResponse};
use kafka_protocol::messages::list_groups_request::ListGroupsRequest;
use kafka_protocol::messages::list_groups_response::{ListGroupsResponse, ListedGroup};
use kafka_protocol::messages::offset_commit_request::OffsetCommitRequest;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponse, OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequest;
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponse, OffsetFetchResponseGroup, OffsetFetchResponsePartition,
    OffsetFetchResponsePartitions, OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::sync_group_request::SyncGroupRequest;
use kafka_protocol::messages::sync_group_response::SyncGroupResponse;
use kafka_protocol::messages::{BrokerId, GroupId, RequestKind, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::oneshot;
use tributary_broker::auth::Credential;
use tributary_broker::service::{
    KAFKA_GROUP_ID_LEN_MAX, KAFKA_OFFSET_METADATA_BYTES_MAX, KafkaOffsetCommit, KafkaOffsetRecord,
    Rights,
};

use crate::coordinator::{
    Answer, Coordinator, CoordinatorConfig, Delivery, GroupState, GroupView, Join, Joined, Sync,
    Synced, code,
};
use crate::handlers::error_code;
use crate::{KafkaContext, directory};

/// How often a waiting JoinGroup or SyncGroup moves the coordinator's clock.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// The longest a SyncGroup waits for the leader's.
const SYNC_WAIT_MAX: Duration = Duration::from_secs(300);
/// Beyond a JoinGroup's rebalance timeout, the longest it waits.
const JOIN_WAIT_MARGIN: Duration = Duration::from_secs(5);

/// The groups this node coordinates, and the requests waiting on them.
#[derive(Default)]
pub struct Groups {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    coordinator: Coordinator,
    joins: HashMap<(String, String), oneshot::Sender<Joined>>,
    syncs: HashMap<(String, String), oneshot::Sender<Synced>>,
}

impl Groups {
    pub fn new(config: CoordinatorConfig) -> Groups {
        Groups {
            inner: Mutex::new(Inner {
                coordinator: Coordinator::new(config),
                ..Inner::default()
            }),
        }
    }

    /// Runs `f` on the state machine after moving its clock, and hands out the answers
    /// it gives to waiting requests.
    fn with<R>(&self, now_ms: i64, f: impl FnOnce(&mut Inner) -> (R, Vec<Delivery>)) -> R {
        let mut inner = self.inner.lock().expect("groups lock");
        let ticked = inner.coordinator.tick(now_ms);
        inner.deliver(ticked);
        let (result, deliveries) = f(&mut inner);
        inner.deliver(deliveries);
        result
    }

    /// Forgets every group (this node no longer coordinates): waiting requests end.
    fn clear(&self) {
        let mut inner = self.inner.lock().expect("groups lock");
        inner.coordinator.clear();
        inner.joins.clear();
        inner.syncs.clear();
    }
}

impl Inner {
    fn deliver(&mut self, deliveries: Vec<Delivery>) {
        for delivery in deliveries {
            match delivery {
                Delivery::Join {
                    group,
                    member_id,
                    joined,
                } => {
                    if let Some(tx) = self.joins.remove(&(group, member_id)) {
                        let _ = tx.send(joined);
                    }
                }
                Delivery::Sync {
                    group,
                    member_id,
                    synced,
                } => {
                    if let Some(tx) = self.syncs.remove(&(group, member_id)) {
                        let _ = tx.send(synced);
                    }
                }
            }
        }
    }
}

fn text(value: &str) -> StrBytes {
    StrBytes::from_string(value.to_owned())
}

/// Whether `request` is one of the group APIs [`answer`] serves.
pub fn serves(request: &RequestKind) -> bool {
    matches!(
        request,
        RequestKind::FindCoordinator(_)
            | RequestKind::JoinGroup(_)
            | RequestKind::SyncGroup(_)
            | RequestKind::Heartbeat(_)
            | RequestKind::LeaveGroup(_)
            | RequestKind::OffsetCommit(_)
            | RequestKind::OffsetFetch(_)
            | RequestKind::ListGroups(_)
            | RequestKind::DescribeGroups(_)
    )
}

/// The answer to a group API request (one [`serves`]) of `version`, from a client that
/// calls itself `client_id`.
pub async fn answer(
    context: &KafkaContext,
    credential: &Credential,
    client_id: &str,
    request: RequestKind,
    version: i16,
) -> ResponseKind {
    match request {
        RequestKind::FindCoordinator(request) => ResponseKind::FindCoordinator(
            find_coordinator(context, credential, request, version).await,
        ),
        RequestKind::JoinGroup(request) => ResponseKind::JoinGroup(
            join_group(context, credential, client_id, request, version).await,
        ),
        RequestKind::SyncGroup(request) => {
            ResponseKind::SyncGroup(sync_group(context, credential, request, version).await)
        }
        RequestKind::Heartbeat(request) => {
            ResponseKind::Heartbeat(heartbeat(context, credential, request))
        }
        RequestKind::LeaveGroup(request) => {
            ResponseKind::LeaveGroup(leave_group(context, credential, request, version))
        }
        RequestKind::OffsetCommit(request) => {
            ResponseKind::OffsetCommit(offset_commit(context, credential, request).await)
        }
        RequestKind::OffsetFetch(request) => {
            ResponseKind::OffsetFetch(offset_fetch(context, credential, request, version).await)
        }
        RequestKind::ListGroups(request) => {
            ResponseKind::ListGroups(list_groups(context, credential, request, version))
        }
        RequestKind::DescribeGroups(request) => {
            ResponseKind::DescribeGroups(describe_groups(context, credential, request, version))
        }
        other => unreachable!("not a group request: {:?}", std::mem::discriminant(&other)),
    }
}

/// Why a group request is not served here: NOT_COORDINATOR on a node that does not lead
/// the controller group, GROUP_AUTHORIZATION_FAILED without Listen anywhere.
fn refusal(context: &KafkaContext, credential: &Credential) -> Option<i16> {
    let service = context.node.service();
    if !service.is_kafka_coordinator() {
        context.groups.clear();
        return Some(ResponseError::NotCoordinator.code());
    }
    if !listens_somewhere(context, credential) {
        return Some(ResponseError::GroupAuthorizationFailed.code());
    }
    None
}

/// Whether the credential grants Listen on the namespace or on some hub.
fn listens_somewhere(context: &KafkaContext, credential: &Credential) -> bool {
    let service = context.node.service();
    if !service.auth_enabled() {
        return true;
    }
    let listens = |entity: &str| {
        service
            .granted_rights(credential, entity)
            .is_ok_and(|rights| rights.grants(Rights::LISTEN))
    };
    listens("")
        || service
            .broker()
            .runtime()
            .state()
            .hubs
            .keys()
            .any(|hub| listens(hub))
}

fn group_id_ok(group: &str) -> bool {
    !group.is_empty() && group.len() <= KAFKA_GROUP_ID_LEN_MAX
}

/// FindCoordinator: the node leading the controller group, at its advertised address for
/// this listener's kind (plain text or TLS), from the directory Metadata answers from.
async fn find_coordinator(
    context: &KafkaContext,
    credential: &Credential,
    request: FindCoordinatorRequest,
    version: i16,
) -> FindCoordinatorResponse {
    let service = context.node.service();
    let me = context.me();
    let coordinator = if request.key_type != 0 {
        // Transactions are not served.
        Err((
            ResponseError::CoordinatorNotAvailable.code(),
            "transactions are not served",
        ))
    } else if !listens_somewhere(context, credential) {
        Err((
            ResponseError::GroupAuthorizationFailed.code(),
            "the groups need Listen on an event hub or the namespace",
        ))
    } else {
        match service.kafka_coordinator() {
            Some(node) if node.0 == me => Ok((me, context.advertised.clone())),
            Some(node) => {
                let endpoints = context
                    .directory
                    .get(service, directory::METADATA_AGE_MAX)
                    .await;
                directory::address(&endpoints, node.0, context.tls)
                    .map(|address| (node.0, address))
                    .ok_or((
                        ResponseError::CoordinatorNotAvailable.code(),
                        "the coordinator has no Kafka listener of this kind",
                    ))
            }
            None => Err((
                ResponseError::CoordinatorNotAvailable.code(),
                "the cluster is electing its controller leader, the groups' coordinator",
            )),
        }
    };
    let mut response = FindCoordinatorResponse::default();
    match coordinator {
        Err((code, why)) => {
            response.error_code = code;
            response.node_id = BrokerId(-1);
            response.port = -1;
            if version >= 1 {
                response.error_message = Some(text(why));
            }
        }
        Ok((node, (host, port))) => {
            response.node_id = BrokerId(i32::try_from(node).unwrap_or(i32::MAX));
            response.host = text(&host);
            response.port = i32::from(port);
        }
    }
    response
}

async fn join_group(
    context: &KafkaContext,
    credential: &Credential,
    client_id: &str,
    request: JoinGroupRequest,
    version: i16,
) -> JoinGroupResponse {
    join_response(
        join(context, credential, client_id, request, version).await,
        version,
    )
}

/// A JoinGroup answer in `version`: fields a version lacks keep their defaults, or the
/// response would not encode.
fn join_response(joined: Joined, version: i16) -> JoinGroupResponse {
    let mut response = JoinGroupResponse::default();
    response.error_code = joined.error_code;
    response.generation_id = joined.generation_id;
    if version >= 7 {
        response.protocol_type = joined.protocol_type.as_deref().map(text);
    }
    response.protocol_name = Some(text(joined.protocol_name.as_deref().unwrap_or("")));
    response.leader = text(&joined.leader);
    response.member_id = text(&joined.member_id);
    response.members = joined
        .members
        .into_iter()
        .map(|(id, instance, metadata)| {
            let mut member = JoinGroupResponseMember::default();
            member.member_id = text(&id);
            if version >= 5 {
                member.group_instance_id = instance.as_deref().map(text);
            }
            member.metadata = metadata;
            member
        })
        .collect();
    response
}

async fn join(
    context: &KafkaContext,
    credential: &Credential,
    client_id: &str,
    request: JoinGroupRequest,
    version: i16,
) -> Joined {
    let refused = |error_code| Joined {
        error_code,
        generation_id: -1,
        member_id: request.member_id.to_string(),
        ..Joined::default()
    };
    if let Some(code) = refusal(context, credential) {
        return refused(code);
    }
    let group = request.group_id.0.to_string();
    if !group_id_ok(&group) {
        return refused(code::INVALID_GROUP_ID);
    }
    let rebalance_timeout_ms = if version >= 1 {
        request.rebalance_timeout_ms
    } else {
        request.session_timeout_ms
    };
    let join = Join {
        group: group.clone(),
        member_id: request.member_id.to_string(),
        group_instance_id: request.group_instance_id.as_ref().map(|s| s.to_string()),
        client_id: client_id.to_string(),
        client_host: String::new(),
        session_timeout_ms: request.session_timeout_ms,
        rebalance_timeout_ms,
        protocol_type: request.protocol_type.to_string(),
        protocols: request
            .protocols
            .into_iter()
            .map(|p| (p.name.to_string(), p.metadata))
            .collect(),
        require_known_member_id: version >= 4,
    };
    let (tx, rx) = oneshot::channel();
    let answer = context.groups.with(context.clock.now_ms(), |inner| {
        let (answer, deliveries) = inner.coordinator.join(context.clock.now_ms(), join);
        if let Answer::Parked(member_id) = &answer {
            inner.joins.insert((group.clone(), member_id.clone()), tx);
        }
        (answer, deliveries)
    });
    match answer {
        Answer::Now(joined) => joined,
        Answer::Parked(member_id) => {
            let wait = Duration::from_millis(u64::try_from(rebalance_timeout_ms).unwrap_or(0))
                + JOIN_WAIT_MARGIN;
            park(context, rx, wait).await.unwrap_or_else(|code| Joined {
                error_code: code,
                generation_id: -1,
                member_id,
                ..Joined::default()
            })
        }
    }
}

/// Waits for a parked request's answer, moving the coordinator's clock meanwhile; an error
/// code when the wait ends without one.
async fn park<T>(
    context: &KafkaContext,
    mut rx: oneshot::Receiver<T>,
    wait: Duration,
) -> Result<T, i16> {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        tokio::select! {
            answer = &mut rx => {
                // A sender dropped: the request was replaced by a newer one, or the node
                // stopped coordinating.
                return answer.map_err(|_| code::REBALANCE_IN_PROGRESS);
            }
            () = tokio::time::sleep(POLL_INTERVAL) => {
                if !context.node.service().is_kafka_coordinator() {
                    context.groups.clear();
                    return Err(ResponseError::NotCoordinator.code());
                }
                if tokio::time::Instant::now() >= deadline {
                    return Err(code::REBALANCE_IN_PROGRESS);
                }
                context.groups.with(context.clock.now_ms(), |_| ((), Vec::new()));
            }
        }
    }
}

async fn sync_group(
    context: &KafkaContext,
    credential: &Credential,
    request: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    sync_response(sync(context, credential, request).await, version)
}

/// A SyncGroup answer in `version`.
fn sync_response(synced: Synced, version: i16) -> SyncGroupResponse {
    let mut response = SyncGroupResponse::default();
    response.error_code = synced.error_code;
    if version >= 5 {
        response.protocol_type = synced.protocol_type.as_deref().map(text);
        response.protocol_name = synced.protocol_name.as_deref().map(text);
    }
    response.assignment = synced.assignment;
    response
}

async fn sync(
    context: &KafkaContext,
    credential: &Credential,
    request: SyncGroupRequest,
) -> Synced {
    let refused = |error_code| Synced {
        error_code,
        ..Synced::default()
    };
    if let Some(code) = refusal(context, credential) {
        return refused(code);
    }
    let group = request.group_id.0.to_string();
    if !group_id_ok(&group) {
        return refused(code::INVALID_GROUP_ID);
    }
    let sync = Sync {
        group: group.clone(),
        generation_id: request.generation_id,
        member_id: request.member_id.to_string(),
        assignments: request
            .assignments
            .into_iter()
            .map(|a| (a.member_id.to_string(), a.assignment))
            .collect(),
    };
    let (tx, rx) = oneshot::channel();
    let answer = context.groups.with(context.clock.now_ms(), |inner| {
        let (answer, deliveries) = inner.coordinator.sync(context.clock.now_ms(), sync);
        if let Answer::Parked(member_id) = &answer {
            inner.syncs.insert((group.clone(), member_id.clone()), tx);
        }
        (answer, deliveries)
    });
    match answer {
        Answer::Now(synced) => synced,
        Answer::Parked(_) => park(context, rx, SYNC_WAIT_MAX)
            .await
            .unwrap_or_else(refused),
    }
}

fn heartbeat(
    context: &KafkaContext,
    credential: &Credential,
    request: HeartbeatRequest,
) -> HeartbeatResponse {
    let mut response = HeartbeatResponse::default();
    response.error_code = match refusal(context, credential) {
        Some(code) => code,
        None => context.groups.with(context.clock.now_ms(), |inner| {
            let code = inner.coordinator.heartbeat(
                context.clock.now_ms(),
                &request.group_id.0,
                request.generation_id,
                &request.member_id,
            );
            (code, Vec::new())
        }),
    };
    response
}

fn leave_group(
    context: &KafkaContext,
    credential: &Credential,
    request: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
    let mut response = LeaveGroupResponse::default();
    if let Some(code) = refusal(context, credential) {
        response.error_code = code;
        return response;
    }
    let group = request.group_id.0.to_string();
    let members: Vec<(String, Option<StrBytes>)> = if version >= 3 {
        request
            .members
            .into_iter()
            .map(|m| (m.member_id.to_string(), m.group_instance_id))
            .collect()
    } else {
        vec![(request.member_id.to_string(), None)]
    };
    let codes: Vec<i16> = members
        .iter()
        .map(|(member_id, _)| {
            context.groups.with(context.clock.now_ms(), |inner| {
                inner
                    .coordinator
                    .leave(context.clock.now_ms(), &group, member_id)
            })
        })
        .collect();
    if version >= 3 {
        response.members = members
            .into_iter()
            .zip(&codes)
            .map(|((member_id, instance), code)| {
                let mut member = MemberResponse::default();
                member.member_id = text(&member_id);
                member.group_instance_id = instance;
                member.error_code = *code;
                member
            })
            .collect();
    } else {
        response.error_code = codes.first().copied().unwrap_or_default();
    }
    response
}

async fn offset_commit(
    context: &KafkaContext,
    credential: &Credential,
    request: OffsetCommitRequest,
) -> OffsetCommitResponse {
    let service = context.node.service();
    let group = request.group_id.0.to_string();
    let whole = match refusal(context, credential) {
        Some(code) => Some(code),
        None if !group_id_ok(&group) => Some(code::INVALID_GROUP_ID),
        None => {
            let code = context.groups.with(context.clock.now_ms(), |inner| {
                let code = inner.coordinator.check_commit(
                    context.clock.now_ms(),
                    &group,
                    request.generation_id_or_member_epoch,
                    &request.member_id,
                );
                (code, Vec::new())
            });
            (code != code::NONE).then_some(code)
        }
    };
    let state = service.broker().runtime().state();
    let mut answers: Vec<(String, Vec<CommitOutcome>)> = Vec::new();
    let mut offsets = Vec::new();
    for topic in request.topics {
        let hub = topic.name.0.to_string();
        let hub_record = state.hubs.get(&hub);
        let allowed = service
            .check(
                credential,
                tributary_broker::auth::Scope::Hub(&hub),
                Rights::LISTEN,
            )
            .is_ok();
        let partitions = topic
            .partitions
            .into_iter()
            .map(|p| {
                let index = p.partition_index;
                let metadata = p
                    .committed_metadata
                    .as_ref()
                    .map(|m| m.to_string())
                    .unwrap_or_default();
                let outcome = if let Some(code) = whole {
                    Err(code)
                } else if !allowed {
                    Err(ResponseError::TopicAuthorizationFailed.code())
                } else if hub_record
                    .is_none_or(|h| u16::try_from(index).map_or(true, |i| i >= h.partition_count))
                {
                    Err(ResponseError::UnknownTopicOrPartition.code())
                } else if metadata.len() > KAFKA_OFFSET_METADATA_BYTES_MAX {
                    Err(ResponseError::OffsetMetadataTooLarge.code())
                } else if p.committed_offset < 0 {
                    Err(ResponseError::InvalidCommitOffsetSize.code())
                } else {
                    offsets.push(KafkaOffsetCommit {
                        hub: hub.clone(),
                        partition: u16::try_from(index).unwrap_or_default(),
                        offset: p.committed_offset,
                        metadata,
                    });
                    Ok(())
                };
                (index, outcome)
            })
            .collect();
        answers.push((hub, partitions));
    }
    // One replicated command for every partition of the request.
    let stored = if offsets.is_empty() {
        Ok(())
    } else {
        service
            .commit_kafka_offsets(credential, &group, offsets)
            .await
            .map(drop)
            .map_err(|err| {
                tracing::info!(%err, group = %group, "a Kafka offset commit failed");
                match err.kind {
                    tributary_broker::error::ErrorKind::Unavailable
                    | tributary_broker::error::ErrorKind::NotLeader { .. } => {
                        ResponseError::CoordinatorNotAvailable.code()
                    }
                    _ => error_code(&err),
                }
            })
    };
    let mut response = OffsetCommitResponse::default();
    response.topics = answers
        .into_iter()
        .map(|(hub, partitions)| {
            let mut topic = OffsetCommitResponseTopic::default();
            topic.name = TopicName(text(&hub));
            topic.partitions = partitions
                .into_iter()
                .map(|(index, outcome)| {
                    let mut partition = OffsetCommitResponsePartition::default();
                    partition.partition_index = index;
                    partition.error_code = match (outcome, &stored) {
                        (Err(code), _) => code,
                        (Ok(_), Ok(())) => code::NONE,
                        (Ok(_), Err(code)) => *code,
                    };
                    partition
                })
                .collect();
            topic
        })
        .collect();
    response
}

/// A partition's offset as OffsetFetch answers it: (partition, offset, metadata, error).
type FetchedPartition = (i32, i64, Option<String>, i16);
/// One group's offsets by hub, or the group's error.
type FetchedGroup = Result<Vec<(String, Vec<FetchedPartition>)>, i16>;
/// A partition of an OffsetCommit: its error now, or `Ok` when its offset goes to the store.
type CommitOutcome = (i32, Result<(), i16>);

async fn fetch_group(
    context: &KafkaContext,
    credential: &Credential,
    group: &str,
    topics: Option<Vec<(String, Vec<i32>)>>,
) -> FetchedGroup {
    if let Some(code) = refusal(context, credential) {
        return Err(code);
    }
    if !group_id_ok(group) {
        return Err(code::INVALID_GROUP_ID);
    }
    let service = context.node.service();
    let records: Vec<KafkaOffsetRecord> = service
        .kafka_offsets(credential, group, None)
        .await
        .map_err(|err| {
            tracing::info!(%err, group = %group, "reading Kafka offsets failed");
            ResponseError::CoordinatorNotAvailable.code()
        })?;
    let committed = |hub: &str, partition: i32| {
        records
            .iter()
            .find(|r| r.hub == hub && i32::from(r.partition) == partition)
    };
    Ok(match topics {
        // Every topic the group has offsets in.
        None => {
            let mut by_hub: Vec<(String, Vec<FetchedPartition>)> = Vec::new();
            for r in &records {
                let entry = (
                    i32::from(r.partition),
                    r.offset.offset,
                    Some(r.offset.metadata.clone()),
                    code::NONE,
                );
                match by_hub.last_mut() {
                    Some((hub, partitions)) if *hub == r.hub => partitions.push(entry),
                    _ => by_hub.push((r.hub.clone(), vec![entry])),
                }
            }
            by_hub
        }
        Some(topics) => topics
            .into_iter()
            .map(|(hub, partitions)| {
                let allowed = service
                    .check(
                        credential,
                        tributary_broker::auth::Scope::Hub(&hub),
                        Rights::LISTEN,
                    )
                    .is_ok();
                let partitions = partitions
                    .into_iter()
                    .map(|p| match committed(&hub, p) {
                        _ if !allowed => {
                            (p, -1, None, ResponseError::TopicAuthorizationFailed.code())
                        }
                        Some(r) => (
                            p,
                            r.offset.offset,
                            Some(r.offset.metadata.clone()),
                            code::NONE,
                        ),
                        // Nothing committed: -1, and no error.
                        None => (p, -1, Some(String::new()), code::NONE),
                    })
                    .collect();
                (hub, partitions)
            })
            .collect(),
    })
}

async fn offset_fetch(
    context: &KafkaContext,
    credential: &Credential,
    request: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    let mut response = OffsetFetchResponse::default();
    if version >= 8 {
        for group in request.groups {
            let topics = group.topics.map(|topics| {
                topics
                    .into_iter()
                    .map(|t| (t.name.0.to_string(), t.partition_indexes))
                    .collect()
            });
            let fetched = fetch_group(context, credential, &group.group_id.0, topics).await;
            let mut answer = OffsetFetchResponseGroup::default();
            answer.group_id = group.group_id;
            match fetched {
                Err(code) => answer.error_code = code,
                Ok(topics) => {
                    answer.topics = topics
                        .into_iter()
                        .map(|(hub, partitions)| {
                            let mut topic = OffsetFetchResponseTopics::default();
                            topic.name = TopicName(text(&hub));
                            topic.partitions = partitions
                                .into_iter()
                                .map(|(index, offset, metadata, error)| {
                                    let mut p = OffsetFetchResponsePartitions::default();
                                    p.partition_index = index;
                                    p.committed_offset = offset;
                                    p.committed_leader_epoch = -1;
                                    p.metadata = metadata.as_deref().map(text);
                                    p.error_code = error;
                                    p
                                })
                                .collect();
                            topic
                        })
                        .collect();
                }
            }
            response.groups.push(answer);
        }
        return response;
    }
    let topics: Option<Vec<(String, Vec<i32>)>> = request.topics.map(|topics| {
        topics
            .into_iter()
            .map(|t| (t.name.0.to_string(), t.partition_indexes))
            .collect()
    });
    let fetched = match fetch_group(context, credential, &request.group_id.0, topics.clone()).await
    {
        // Version 1 has no group error: each partition asked for carries it.
        Err(code) if version < 2 => Ok(topics
            .unwrap_or_default()
            .into_iter()
            .map(|(hub, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| (p, -1, None, code))
                    .collect();
                (hub, partitions)
            })
            .collect()),
        other => other,
    };
    match fetched {
        Err(code) => response.error_code = code,
        Ok(topics) => {
            response.topics = topics
                .into_iter()
                .map(|(hub, partitions)| {
                    let mut topic = OffsetFetchResponseTopic::default();
                    topic.name = TopicName(text(&hub));
                    topic.partitions = partitions
                        .into_iter()
                        .map(|(index, offset, metadata, error)| {
                            let mut p = OffsetFetchResponsePartition::default();
                            p.partition_index = index;
                            p.committed_offset = offset;
                            p.committed_leader_epoch = -1;
                            p.metadata = metadata.as_deref().map(text);
                            // Before v2 a group error is reported per partition.
                            p.error_code = error;
                            p
                        })
                        .collect();
                    topic
                })
                .collect();
        }
    }
    response
}

fn list_groups(
    context: &KafkaContext,
    credential: &Credential,
    request: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
    let mut response = ListGroupsResponse::default();
    if let Some(code) = refusal(context, credential) {
        response.error_code = code;
        return response;
    }
    let groups = context.groups.with(context.clock.now_ms(), |inner| {
        (inner.coordinator.list(), Vec::new())
    });
    let states: Vec<String> = request
        .states_filter
        .iter()
        .map(|s| s.to_ascii_lowercase())
        .collect();
    response.groups = groups
        .into_iter()
        .filter(|(_, _, state)| {
            states.is_empty() || states.contains(&state.name().to_ascii_lowercase())
        })
        .map(|(group, protocol_type, state)| listed_group(&group, &protocol_type, state, version))
        .collect();
    response
}

/// A group as ListGroups shows it in `version` (its state from version 4).
fn listed_group(group: &str, protocol_type: &str, state: GroupState, version: i16) -> ListedGroup {
    let mut listed = ListedGroup::default();
    listed.group_id = GroupId(text(group));
    listed.protocol_type = text(protocol_type);
    if version >= 4 {
        listed.group_state = text(state.name());
    }
    listed
}

fn describe_groups(
    context: &KafkaContext,
    credential: &Credential,
    request: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let refused = refusal(context, credential);
    let mut response = DescribeGroupsResponse::default();
    response.groups = request
        .groups
        .into_iter()
        .map(|group_id| match refused {
            Some(code) => {
                let mut described = DescribedGroup::default();
                described.error_code = code;
                described.group_id = group_id;
                described
            }
            None => {
                let view = context.groups.with(context.clock.now_ms(), |inner| {
                    (inner.coordinator.describe(&group_id.0), Vec::new())
                });
                described_group(group_id, view, version)
            }
        })
        .collect();
    response
}

/// A group as DescribeGroups shows it in `version` ("Dead" when not known here).
fn described_group(group_id: GroupId, view: Option<GroupView>, version: i16) -> DescribedGroup {
    let mut described = DescribedGroup::default();
    described.group_id = group_id;
    let Some(view) = view else {
        described.group_state = text("Dead");
        return described;
    };
    described.group_state = text(view.state.name());
    described.protocol_type = text(&view.protocol_type);
    described.protocol_data = text(&view.protocol);
    described.members = view
        .members
        .into_iter()
        .map(|m| {
            let mut member = DescribedGroupMember::default();
            member.member_id = text(&m.member_id);
            if version >= 4 {
                member.group_instance_id = m.group_instance_id.as_deref().map(text);
            }
            member.client_id = text(&m.client_id);
            member.client_host = text(&m.client_host);
            member.member_metadata = m.metadata;
            member.member_assignment = m.assignment;
            member
        })
        .collect();
    described
}

#[cfg(test)]
#[path = "groups_tests.rs"]
mod tests;
