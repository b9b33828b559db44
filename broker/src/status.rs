//! `cluster status`: each node reports the groups it runs (peer `NodeStatus` service); the
//! node asked by a client gathers every node's report into one picture.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use openraft::type_config::async_runtime::WatchReceiver;
use tonic::{Request, Response, Status};
use tributary_controller::state::ClusterState;
use tributary_proto::peer::node_status_client::NodeStatusClient;
use tributary_proto::peer::node_status_server::NodeStatus as NodeStatusApi;
use tributary_proto::peer::{GroupStatus, LocalStatusReply, LocalStatusRequest};
use tributary_raft::member_node;
use tributary_types::{GroupId, PartitionId};

use crate::broker::Broker;
use crate::cluster::ClusterRuntime;

/// How long the gathering node waits for each node's report; a node that does not answer
/// in time is shown as down.
const NODE_STATUS_TIMEOUT: Duration = Duration::from_secs(1);

/// How long the gathering node waits for its view of the cluster state to reach the
/// newest one a node reported (see [`assemble_status`]).
const VIEW_CATCH_UP_MAX: Duration = Duration::from_secs(2);

/// Status requests a node may miss before placement counts it as down.
const LIVENESS_PROBES: u32 = 3;
const LIVENESS_PROBE_PAUSE: Duration = Duration::from_millis(300);

/// The local report of the groups this node runs, with the traffic of its partitions.
pub fn local_status(broker: &Broker) -> LocalStatusReply {
    let host = broker.runtime().host();
    let partitions: HashMap<GroupId, _> = broker
        .local_partitions()
        .into_iter()
        .map(|p| (p.group, p))
        .collect();
    let groups = host
        .group_ids()
        .into_iter()
        .filter_map(|group| host.get(group).map(|raft| (group, raft)))
        .map(|(group, raft)| {
            let metrics = raft.metrics();
            let m = metrics.borrow_watched();
            let index = |id: Option<u64>| id.map_or(-1, |i| i as i64);
            let membership = m.membership_config.membership();
            let traffic = partitions.get(&group).map(|p| p.traffic());
            let rebuild = host.rebuilds().receiving(group);
            let count = |pick: fn(&crate::partition::Traffic) -> &AtomicU64| {
                traffic.map_or(0, |t| pick(t).load(Ordering::Relaxed))
            };
            GroupStatus {
                group: group.to_u64(),
                leader: m.current_leader.map_or(0, |l| member_node(l).0),
                term: m.current_term,
                last_applied_index: index(m.last_applied.map(|l| l.index)),
                last_log_index: index(m.last_log_index),
                matched_index: m
                    .replication
                    .iter()
                    .flatten()
                    .map(|(node, matched)| (*node, index(matched.map(|l| l.index))))
                    .collect(),
                voters: membership.voter_ids().collect(),
                learners: membership.learner_ids().collect(),
                joint: membership.get_joint_config().len() > 1,
                membership_index: index(m.membership_config.log_id().map(|l| l.index)),
                bytes_in: count(|t| &t.bytes_in),
                events_in: count(|t| &t.events_in),
                bytes_out: count(|t| &t.bytes_out),
                events_out: count(|t| &t.events_out),
                rebuild_bytes_done: rebuild.map_or(0, |r| r.bytes_done),
                rebuild_bytes_total: rebuild.map_or(0, |r| r.bytes_total),
            }
        })
        .collect();
    LocalStatusReply {
        node: host.node_id().0,
        groups,
        ready: broker.is_ready(),
        release: tributary_types::format::running_release(),
        feature_level: tributary_types::format::supported_level(),
        kafka_addr: broker.kafka_addrs().plain.clone().unwrap_or_default(),
        kafka_tls_addr: broker.kafka_addrs().tls.clone().unwrap_or_default(),
        state_version: broker.runtime().state().version,
    }
}

pub struct NodeStatusService {
    pub broker: Arc<Broker>,
}

#[tonic::async_trait]
impl NodeStatusApi for NodeStatusService {
    async fn local_status(
        &self,
        _request: Request<LocalStatusRequest>,
    ) -> Result<Response<LocalStatusReply>, Status> {
        Ok(Response::new(local_status(&self.broker)))
    }
}

pub(crate) async fn remote_status(
    runtime: &ClusterRuntime,
    peer_addr: &str,
) -> Option<LocalStatusReply> {
    let channel = runtime.peer_channel(peer_addr).ok()?;
    let mut request = Request::new(LocalStatusRequest {});
    request.set_timeout(NODE_STATUS_TIMEOUT);
    let mut client = NodeStatusClient::new(channel);
    match tokio::time::timeout(NODE_STATUS_TIMEOUT, client.local_status(request)).await {
        Ok(Ok(reply)) => Some(reply.into_inner()),
        Ok(Err(status)) => {
            tracing::debug!(%peer_addr, %status, "node status request failed");
            None
        }
        Err(_) => {
            tracing::debug!(%peer_addr, "node status request timed out");
            None
        }
    }
}

/// The nodes this node knows of that do not answer now.
pub async fn down_nodes(runtime: &ClusterRuntime) -> Vec<u64> {
    let state = runtime.state();
    let answers = futures::future::join_all(state.nodes.values().map(|node| async move {
        if node.id == runtime.me.id {
            return (node.id, true);
        }
        // A few tries: one missed answer must not make a node look dead.
        for attempt in 0..LIVENESS_PROBES {
            if remote_status(runtime, &node.peer_addr).await.is_some() {
                return (node.id, true);
            }
            if attempt + 1 < LIVENESS_PROBES {
                tokio::time::sleep(LIVENESS_PROBE_PAUSE).await;
            }
        }
        tracing::info!(node = node.id, addr = %node.peer_addr, "node does not answer: counted as down");
        (node.id, false)
    }))
    .await;
    answers
        .into_iter()
        .filter(|(_, up)| !*up)
        .map(|(id, _)| id)
        .collect()
}

/// The cluster as its nodes report it (`tributary cluster status`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ClusterStatus {
    pub cluster_id: String,
    /// 0: no leader known.
    pub controller_leader: u64,
    pub nodes: Vec<NodeStatus>,
    pub partitions: Vec<PartitionStatus>,
    /// Partitions with fewer up, caught-up voters than their replication factor.
    pub under_replicated: u32,
    /// Replica moves under way.
    pub moves: Vec<ReplicaMoveStatus>,
    /// The cluster's feature level and the first release that supports it.
    pub feature_level: u32,
    pub feature_release: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaMoveStatus {
    pub event_hub: String,
    pub partition_id: String,
    /// 0: a replica added where one was missing.
    pub from: u64,
    pub to: u64,
    pub started_ms: i64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStatus {
    pub id: u64,
    pub client_addr: String,
    pub peer_addr: String,
    pub up: bool,
    pub controller_voter: bool,
    pub capacity_units: u32,
    pub zone: String,
    pub replicas: u32,
    pub leaders: u32,
    pub draining: bool,
    pub decommissioning: bool,
    /// Throughput units of the partitions it leads.
    pub reserved_throughput_units: f64,
    pub bytes_in: u64,
    pub events_in: u64,
    pub bytes_out: u64,
    pub events_out: u64,
    /// The node's release and the highest feature level it supports (`None`: it did not
    /// answer).
    pub release: Option<String>,
    pub feature_level: Option<u32>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PartitionStatus {
    pub event_hub: String,
    pub partition_id: String,
    /// 0: no leader known.
    pub leader: u64,
    pub replicas: Vec<ReplicaStatus>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaStatus {
    pub node: u64,
    pub up: bool,
    /// A voter holding (nearly) everything the leader has.
    pub caught_up: bool,
    pub last_applied_index: i64,
    /// While the replica is being rebuilt from a snapshot: bytes received so far and in all.
    pub rebuild_bytes_done: u64,
    pub rebuild_bytes_total: u64,
}

/// Asks every node for its report and assembles the cluster's status.
pub async fn cluster_status(broker: &Broker) -> ClusterStatus {
    let runtime = broker.runtime();
    assemble_status(runtime.view(), |state| async move {
        futures::future::join_all(state.nodes.values().map(|node| async move {
            let report = if node.id == runtime.me.id {
                Some(local_status(broker))
            } else {
                remote_status(runtime, &node.peer_addr).await
            };
            (node.id, report)
        }))
        .await
    })
    .await
}

/// Gathers the nodes' reports (`gather`, given the state whose nodes to ask) and judges
/// them by a cluster state at least as new as any reporting node holds. A node's own
/// state may trail the others' (it has just restarted, or its watch stream is slow): a
/// replica moved meanwhile would then be judged by its old assignment, its new voter
/// missing and a removed one counted out, so a healthy partition would look
/// under-replicated. The node waits for its view to catch up, at most
/// [`VIEW_CATCH_UP_MAX`], and otherwise answers from the newest view it has.
async fn assemble_status<F, Fut>(
    mut view: tokio::sync::watch::Receiver<Arc<ClusterState>>,
    gather: F,
) -> ClusterStatus
where
    F: FnOnce(Arc<ClusterState>) -> Fut,
    Fut: Future<Output = Vec<(u64, Option<LocalStatusReply>)>>,
{
    let asked = view.borrow_and_update().clone();
    let reports = gather(asked).await;
    let newest = reports
        .iter()
        .filter_map(|(_, r)| r.as_ref())
        .map(|r| r.state_version)
        .max()
        .unwrap_or(0);
    let _ = tokio::time::timeout(VIEW_CATCH_UP_MAX, view.wait_for(|s| s.version >= newest)).await;
    let state = view.borrow().clone();
    assemble(&state, reports)
}

/// The cluster's status from `state` and the nodes' reports (`None`: no answer).
fn assemble(state: &ClusterState, reports: Vec<(u64, Option<LocalStatusReply>)>) -> ClusterStatus {
    // Each answering node's release and the highest feature level it supports.
    let releases: HashMap<u64, (String, u32)> = reports
        .iter()
        .filter_map(|(id, report)| {
            let r = report.as_ref()?;
            Some((*id, (r.release.clone(), r.feature_level)))
        })
        .collect();
    let reports: HashMap<u64, Option<HashMap<u64, GroupStatus>>> = reports
        .into_iter()
        .map(|(id, report)| {
            (
                id,
                report.map(|r| r.groups.into_iter().map(|g| (g.group, g)).collect()),
            )
        })
        .collect();
    let up = |node: u64| reports.get(&node).is_some_and(Option::is_some);
    let group_on = |node: u64, group: GroupId| {
        reports
            .get(&node)
            .and_then(Option::as_ref)
            .and_then(|groups| groups.get(&group.to_u64()))
    };
    // The controller leader as the voters that answered see it (the highest term wins).
    let controller_leader = state
        .controller_voters
        .iter()
        .filter_map(|v| group_on(*v, GroupId::CONTROLLER))
        .max_by_key(|g| g.term)
        .map_or(0, |g| g.leader);
    let mut nodes: Vec<NodeStatus> = state
        .nodes
        .values()
        .map(|n| NodeStatus {
            id: n.id,
            client_addr: n.client_addr.clone(),
            peer_addr: n.peer_addr.clone(),
            up: up(n.id),
            controller_voter: state.controller_voters.contains(&n.id),
            capacity_units: n.capacity_units,
            zone: n.zone.clone().unwrap_or_default(),
            replicas: state
                .hubs
                .values()
                .flat_map(|h| h.replicas.iter())
                .filter(|r| r.contains(&n.id))
                .count() as u32,
            leaders: 0,
            draining: n.draining,
            decommissioning: n.decommissioning,
            // Release 0.1.0 does not say (its nodes support level 1).
            release: releases.get(&n.id).map(|(release, level)| {
                if *level == 0 {
                    tributary_types::format::release_for_level(1)
                } else {
                    release.clone()
                }
            }),
            feature_level: releases.get(&n.id).map(|(_, level)| (*level).max(1)),
            ..Default::default()
        })
        .collect();
    let mut partitions = Vec::new();
    // Partitions with fewer up-to-date voters than their replication factor.
    let mut under_replicated = 0u32;
    for hub in state.hubs.values() {
        for (p, assigned) in hub.replicas.iter().enumerate() {
            let group = GroupId::new(hub.id, PartitionId(p as u16), 0);
            // A replica moving in is listed too: once its leader has changed the voters it
            // is part of the partition's quorum before the controller records the move done.
            let mut replicas = assigned.clone();
            if let Some(mv) = state.move_of(hub.id, p as u16)
                && !replicas.contains(&mv.to)
            {
                replicas.push(mv.to);
            }
            let leader = replicas
                .iter()
                .filter_map(|r| group_on(*r, group))
                .max_by_key(|g| g.term)
                .map_or(0, |g| g.leader);
            let leader_view = group_on(leader, group).filter(|g| g.leader == leader);
            let replicas: Vec<ReplicaStatus> = replicas
                .iter()
                .map(|&node| {
                    let own = group_on(node, group);
                    let caught_up = match leader_view {
                        Some(_) if node == leader => true,
                        Some(view) => {
                            let lag = tributary_raft::PROMOTE_LAG_MAX as i64;
                            let near =
                                |index: i64| index >= 0 && index + lag >= view.last_log_index;
                            // Matched indexes are by member: this replica's current life.
                            let member = state.replica_member(hub, p as u16, node);
                            let matched = member.is_some_and(|member| {
                                view.matched_index.get(&member).is_some_and(|m| near(*m))
                            });
                            // A leader elected a moment ago does not know its followers'
                            // progress yet; what a follower has applied is committed, so
                            // it counts as stored.
                            let applied = own.is_some_and(|g| near(g.last_applied_index));
                            // Only a voter counts: a learner still being brought in is
                            // no part of a quorum, however far it has got. Nor does a node
                            // whose earlier incarnation is still a voter too: that member
                            // can never answer, so the group has a voter too many until it
                            // is removed, and losing another node then leaves no majority.
                            let voter = member.is_some_and(|member| {
                                view.voters.contains(&member)
                                    && !view.voters.iter().any(|&v| {
                                        v != member && tributary_raft::member_node(v).0 == node
                                    })
                            });
                            voter && (matched || applied)
                        }
                        None => false,
                    };
                    ReplicaStatus {
                        node,
                        up: up(node),
                        caught_up,
                        last_applied_index: own.map_or(-1, |g| g.last_applied_index),
                        rebuild_bytes_done: own.map_or(0, |g| g.rebuild_bytes_done),
                        rebuild_bytes_total: own.map_or(0, |g| g.rebuild_bytes_total),
                    }
                })
                .collect();
            if let Some(node) = nodes.iter_mut().find(|n| n.id == leader) {
                node.leaders += 1;
                if hub.throughput_units > 0 {
                    node.reserved_throughput_units +=
                        f64::from(hub.throughput_units) / f64::from(hub.partition_count.max(1));
                }
                if let Some(view) = leader_view {
                    node.bytes_in += view.bytes_in;
                    node.events_in += view.events_in;
                    node.bytes_out += view.bytes_out;
                    node.events_out += view.events_out;
                }
            }
            let healthy = replicas.iter().filter(|r| r.up && r.caught_up).count();
            if healthy < usize::from(hub.replication_factor) {
                under_replicated += 1;
            }
            partitions.push(PartitionStatus {
                event_hub: hub.name.clone(),
                partition_id: p.to_string(),
                leader,
                replicas,
            });
        }
    }
    let moves = state
        .moves
        .iter()
        .map(|m| ReplicaMoveStatus {
            event_hub: state.hub_name(m.hub),
            partition_id: m.partition.to_string(),
            from: m.from.unwrap_or(0),
            to: m.to,
            started_ms: m.started_ms,
        })
        .collect();
    ClusterStatus {
        moves,
        under_replicated,
        cluster_id: state.cluster_id.clone(),
        controller_leader,
        nodes,
        partitions,
        feature_level: state.feature.level,
        feature_release: state.feature.release.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_controller::state::{Command, ReplicaMove, test_cluster};

    /// Three nodes hold a one-partition hub; node 4 has joined. Returns the state and the
    /// hub's replicas.
    fn before_the_move() -> (ClusterState, Vec<u64>) {
        let mut state = test_cluster(3);
        let hub = tributary_controller::state::test_create_hub(&mut state, 1, 3);
        tributary_controller::state::test_register(&mut state, 4);
        (state, hub.replicas[0].clone())
    }

    /// `from`'s replica of the partition moved to node 4, and the move finished.
    fn moved(before: &ClusterState, from: u64) -> ClusterState {
        let mut state = before.clone();
        let hub = state.hubs["h"].id;
        let mv = ReplicaMove {
            hub,
            partition: 0,
            from: Some(from),
            to: 4,
            started_ms: 0,
        };
        state.apply(Command::StartMoves(vec![mv])).unwrap();
        state
            .apply(Command::FinishMove {
                hub,
                partition: 0,
                to: 4,
            })
            .unwrap();
        state
    }

    /// What every node reports after the move: the leader (the first replica) names the
    /// new voters, each fully matched; the removed replica stopped two entries short.
    fn reports_after(after: &ClusterState, removed: u64) -> Vec<(u64, Option<LocalStatusReply>)> {
        let hub = &after.hubs["h"];
        let group = GroupId::new(hub.id, PartitionId(0), 0).to_u64();
        let voters = &hub.replicas[0];
        let leader = voters[0];
        let members: Vec<u64> = voters
            .iter()
            .map(|n| after.replica_member(hub, 0, *n).unwrap())
            .collect();
        (1..=4)
            .map(|node| {
                let applied = if node == removed { 8 } else { 10 };
                let own = GroupStatus {
                    group,
                    leader,
                    term: 2,
                    last_applied_index: applied,
                    last_log_index: applied,
                    matched_index: if node == leader {
                        members.iter().map(|m| (*m, 10)).collect()
                    } else {
                        HashMap::new()
                    },
                    voters: members.clone(),
                    ..Default::default()
                };
                let report = LocalStatusReply {
                    node,
                    groups: vec![own],
                    ready: true,
                    state_version: after.version,
                    ..Default::default()
                };
                (node, Some(report))
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_node_whose_view_trails_waits_for_the_newest_before_judging_replicas() {
        let (before, replicas) = before_the_move();
        let from = replicas[1];
        let after = moved(&before, from);
        assert!(after.version > before.version);
        let (publish, view) = tokio::sync::watch::channel(Arc::new(before));
        let reports = reports_after(&after, from);
        let later = Arc::new(after.clone());
        let status = assemble_status(view, |_asked| async move {
            // The node's view reaches the newest state a moment after the reports.
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                publish.send_replace(later);
            });
            reports
        })
        .await;
        let partition = &status.partitions[0];
        let mut nodes: Vec<u64> = partition.replicas.iter().map(|r| r.node).collect();
        nodes.sort_unstable();
        let mut expected = after.hubs["h"].replicas[0].clone();
        expected.sort_unstable();
        assert_eq!(
            nodes, expected,
            "judged by the state before the move: {partition:?}"
        );
        assert!(
            partition.replicas.iter().all(|r| r.up && r.caught_up),
            "{partition:?}"
        );
        assert_eq!(status.under_replicated, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_view_that_does_not_catch_up_is_answered_from_after_the_wait() {
        let (before, replicas) = before_the_move();
        let after = moved(&before, replicas[1]);
        let (_publish, view) = tokio::sync::watch::channel(Arc::new(before.clone()));
        let reports = reports_after(&after, replicas[1]);
        let started = tokio::time::Instant::now();
        let status = assemble_status(view, |_| async move { reports }).await;
        assert_eq!(started.elapsed(), VIEW_CATCH_UP_MAX);
        // The old assignment, as this node knows it: the removed replica no voter.
        let partition = &status.partitions[0];
        let removed = partition.replicas.iter().find(|r| r.node == replicas[1]);
        assert!(removed.is_some_and(|r| !r.caught_up), "{partition:?}");
    }
}
