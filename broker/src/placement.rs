//! The placement controller at work: on the controller leader, every `--placement-interval`
//! it gathers every node's report (the groups it runs: leaders, membership, replication
//! progress, traffic), counts a node silent for `--node-dead-timeout` as dead, follows the
//! replica moves under way, and plans the next moves ([`tributary_controller::planner`]).
//!
//! A replica move is stored in the controller (`ClusterState::moves`) before anything
//! happens, so a new controller leader finds it. The move's target node starts an empty
//! replica; the partition's leader makes the move's target set its voters (the new replica
//! joins as a learner, catches up, and replaces the old one in one joint membership change;
//! see `Broker::reconcile_members`). Once a leader reports the target voters, the move is
//! finished: the replica set takes the target and the old replica's node drops its copy.
//! A move whose target dies or is decommissioned before it became a voter is rolled back.
//! Leadership moves change a partition's preferred leader; the partition's leader hands
//! leadership over once that replica has caught up.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;
use std::time::Instant;

use tributary_proto::peer::{GroupStatus, LocalStatusReply};
use tributary_types::{Clock, GroupId, HubId, PartitionId};

use crate::broker::Broker;
use crate::cluster::ClusterRuntime;
use crate::error::Error;
use tributary_controller::planner::{self, Limits, Move, PartitionRef, PlanInput};
use tributary_controller::state::{
    ClusterState, Command, ReplicaMove, planner_nodes, planner_partitions,
};

/// Every node's latest report, by node id; a node that did not answer has none.
#[derive(Debug, Default, Clone)]
pub struct Reports {
    pub by_node: HashMap<u64, HashMap<u64, GroupStatus>>,
    /// Nodes that may receive replicas (see `Broker::is_ready`).
    pub ready: BTreeSet<u64>,
    /// The highest feature level each node supports (release 0.1.0 nodes do not say:
    /// level 1).
    pub feature_levels: HashMap<u64, u32>,
}

impl Reports {
    /// Asks every known node (this one locally) for its report.
    pub async fn gather(broker: &Broker) -> Reports {
        let runtime = broker.runtime();
        let state = runtime.state();
        let replies = futures::future::join_all(state.nodes.values().map(|node| async move {
            if node.id == runtime.me.id {
                Some(crate::status::local_status(broker))
            } else {
                crate::status::remote_status(runtime, &node.peer_addr).await
            }
        }))
        .await;
        Reports::from_replies(replies.into_iter().flatten())
    }

    pub fn from_replies(replies: impl IntoIterator<Item = LocalStatusReply>) -> Reports {
        let mut reports = Reports::default();
        for reply in replies {
            if reply.ready {
                reports.ready.insert(reply.node);
            }
            reports
                .feature_levels
                .insert(reply.node, reply.feature_level.max(1));
            reports.by_node.insert(
                reply.node,
                reply.groups.into_iter().map(|g| (g.group, g)).collect(),
            );
        }
        reports
    }

    pub fn answered(&self, node: u64) -> bool {
        self.by_node.contains_key(&node)
    }

    /// The report of the replica that leads `group` (as it says itself; the highest term
    /// wins when an old leader has not heard of its successor yet).
    pub fn leader_view(&self, group: GroupId) -> Option<&GroupStatus> {
        self.by_node
            .iter()
            .filter_map(|(node, groups)| groups.get(&group.to_u64()).filter(|g| g.leader == *node))
            .max_by_key(|g| g.term)
    }
}

/// The member ids `nodes`' replicas of a partition run as now (None if one is unknown).
fn members(
    state: &ClusterState,
    hub: HubId,
    partition: u16,
    nodes: &[u64],
) -> Option<BTreeSet<u64>> {
    let hub = state.hub_by_id(hub)?;
    nodes
        .iter()
        .map(|n| state.replica_member(hub, partition, *n))
        .collect()
}

fn group_of(hub: HubId, partition: u16) -> GroupId {
    GroupId::new(hub, PartitionId(partition), 0)
}

/// Whether a partition's leader reports exactly `nodes` as its voters, committed, with no
/// change under way and no learners left.
fn voters_are(
    state: &ClusterState,
    view: &GroupStatus,
    (hub, partition): (HubId, u16),
    nodes: &[u64],
) -> bool {
    !view.joint
        && view.learners.is_empty()
        && view.last_applied_index >= view.membership_index
        && members(state, hub, partition, nodes)
            .is_some_and(|wanted| view.voters.iter().copied().collect::<BTreeSet<_>>() == wanted)
}

/// What the placement controller would do next.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Decision {
    /// Replica moves to start.
    pub moves: Vec<ReplicaMove>,
    /// New preferred leaders: (hub, partition, node).
    pub leaders: Vec<(HubId, u16, u64)>,
}

/// Plans the next moves from the controller state, the nodes' reports and the nodes
/// counted dead. A replica move is only started on a partition whose leader reports its
/// voters equal to its replica set (no change under way).
pub fn decide(
    state: &ClusterState,
    reports: &Reports,
    dead: &[u64],
    last_moved: &HashMap<(HubId, u16), i64>,
    limits: Limits,
    now_ms: i64,
) -> Decision {
    let mut partitions = planner_partitions(state);
    for p in &mut partitions {
        let key = (p.id.hub, p.id.partition.0);
        p.last_moved_ms = last_moved.get(&key).copied();
        // A move under way counts as done (it completes, or is rolled back only when its
        // target is gone): planning around the old replica set would move other partitions
        // to fix the same imbalance again.
        if let Some(mv) = state.move_of(key.0, key.1) {
            p.last_moved_ms = Some(mv.started_ms.max(p.last_moved_ms.unwrap_or(i64::MIN)));
            p.replicas = mv.target(&p.replicas);
            p.leader = p.replicas.first().copied();
            p.caught_up = p.replicas.iter().skip(1).copied().collect();
        }
    }
    let in_flight = state
        .moves
        .iter()
        .map(|m| Move::Replica {
            partition: PartitionRef {
                hub: m.hub,
                partition: PartitionId(m.partition),
            },
            from: m.from,
            to: m.to,
        })
        .collect();
    let input = PlanInput {
        nodes: planner_nodes(state, dead),
        partitions,
        in_flight,
        limits,
        now_ms,
    };
    let mut decision = Decision::default();
    for mv in planner::plan(&input) {
        match mv {
            Move::Replica {
                partition,
                from,
                to,
            } => {
                let (hub, index) = (partition.hub, partition.partition.0);
                let settled = state.replicas_of(hub, index).is_some_and(|replicas| {
                    reports
                        .leader_view(group_of(hub, index))
                        .is_some_and(|view| voters_are(state, view, (hub, index), replicas))
                });
                // A node that has just (re)started may still hold stale copies.
                if settled && reports.ready.contains(&to) {
                    decision.moves.push(ReplicaMove {
                        hub,
                        partition: index,
                        from,
                        to,
                        started_ms: now_ms,
                    });
                }
            }
            Move::Leader { partition, to, .. } => {
                decision
                    .leaders
                    .push((partition.hub, partition.partition.0, to));
            }
        }
    }
    decision
}

/// What the executor does about a move under way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoveStep {
    /// The partition's leader reports the target voters: the move is done.
    Finish,
    /// The target is gone (dead, decommissioning or removed) and never became a voter.
    RollBack,
    /// Still catching up or changing membership.
    Wait,
}

pub fn move_step(
    state: &ClusterState,
    reports: &Reports,
    dead: &[u64],
    mv: &ReplicaMove,
) -> MoveStep {
    let Some(replicas) = state.replicas_of(mv.hub, mv.partition) else {
        return MoveStep::RollBack;
    };
    let view = reports.leader_view(group_of(mv.hub, mv.partition));
    if view.is_some_and(|v| voters_are(state, v, (mv.hub, mv.partition), &mv.target(replicas))) {
        return MoveStep::Finish;
    }
    let target_gone = state
        .nodes
        .get(&mv.to)
        .is_none_or(|n| n.decommissioning || dead.contains(&n.id));
    // Rolled back only while the target is certainly not a voter: its copy is dropped
    // when the move goes, and a voter must never lose what it stored.
    let target_member = state.replica_member_by_id(mv.hub, mv.partition, mv.to);
    let not_a_voter =
        view.is_some_and(|v| !v.joint && target_member.is_none_or(|m| !v.voters.contains(&m)));
    if target_gone && not_a_voter {
        MoveStep::RollBack
    } else {
        MoveStep::Wait
    }
}

/// The executor's memory; a new controller leader starts afresh.
#[derive(Default)]
struct Tracker {
    leader_since: Option<Instant>,
    last_seen: HashMap<u64, Instant>,
    dead: BTreeSet<u64>,
    last_moved: HashMap<(HubId, u16), i64>,
}

pub struct Placement {
    broker: Arc<Broker>,
    runtime: Arc<ClusterRuntime>,
    settings: PlacementSettings,
    clock: Arc<dyn Clock>,
}

impl Placement {
    pub fn new(
        broker: Arc<Broker>,
        settings: PlacementSettings,
        clock: Arc<dyn Clock>,
    ) -> Arc<Self> {
        Arc::new(Self {
            runtime: broker.runtime().clone(),
            broker,
            settings,
            clock,
        })
    }

    pub fn limits(&self) -> Limits {
        Limits {
            moves_per_node: self.settings.moves_per_node,
            moves_total: self.settings.moves_max,
            cooldown_ms: self.settings.cooldown.as_millis() as i64,
        }
    }

    /// Runs on every node; acts only while the node leads the controller.
    pub async fn run(self: Arc<Self>) {
        let runtime = self.runtime.clone();
        tokio::select! {
            _ = self.run_forever() => {}
            _ = runtime.stopped() => {}
        }
    }

    async fn run_forever(&self) {
        let mut tracker = Tracker::default();
        let mut tick = tokio::time::interval(self.settings.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            if !self.runtime.is_controller_leader() {
                tracker = Tracker::default();
                continue;
            }
            if let Err(err) = self.step(&mut tracker).await {
                tracing::warn!(%err, "placement step failed; will retry");
            }
        }
    }

    async fn step(&self, tracker: &mut Tracker) -> Result<(), Error> {
        let now = Instant::now();
        let since = *tracker.leader_since.get_or_insert(now);
        let reports = Reports::gather(&self.broker).await;
        let state = self.runtime.state();
        if let Some(level) = level_to_raise(&state, &reports) {
            let release = tributary_types::format::release_for_level(level);
            tracing::info!(
                level,
                %release,
                "every node supports cluster feature level {level}: raising the cluster's"
            );
            self.runtime
                .propose(Command::SetFeatureLevel { level, release })
                .await?;
        }
        for node in state.nodes.keys() {
            if reports.answered(*node) {
                tracker.last_seen.insert(*node, now);
            }
        }
        // A node never heard from since this node took over counts from then.
        let dead: BTreeSet<u64> = state
            .nodes
            .keys()
            .copied()
            .filter(|n| {
                let seen = tracker.last_seen.get(n).copied().unwrap_or(since);
                now.duration_since(seen) >= self.settings.node_dead_timeout
            })
            .collect();
        for node in dead.difference(&tracker.dead) {
            tracing::warn!(
                node,
                timeout = %humantime::format_duration(self.settings.node_dead_timeout),
                "node silent past the dead-node timeout: its replicas are re-created elsewhere"
            );
        }
        for node in tracker.dead.difference(&dead) {
            tracing::info!(node, "node is back: placement uses it again");
        }
        tracker.dead = dead.clone();
        let dead: Vec<u64> = dead.into_iter().collect();
        let now_ms = self.clock.now_ms();

        for mv in &state.moves {
            let key = (mv.hub, mv.partition);
            match move_step(&state, &reports, &dead, mv) {
                MoveStep::Wait => {}
                MoveStep::Finish => {
                    self.runtime
                        .propose(Command::FinishMove {
                            hub: mv.hub,
                            partition: mv.partition,
                            to: mv.to,
                        })
                        .await?;
                    tracker.last_moved.insert(key, now_ms);
                    metrics::counter!("tributary_replica_moves_finished_total").increment(1);
                    tracing::info!(group = %group_of(mv.hub, mv.partition), from = ?mv.from, to = mv.to, took_ms = now_ms - mv.started_ms, "replica move finished");
                }
                MoveStep::RollBack => {
                    self.runtime
                        .propose(Command::AbortMove {
                            hub: mv.hub,
                            partition: mv.partition,
                            to: mv.to,
                        })
                        .await?;
                    tracker.last_moved.insert(key, now_ms);
                    metrics::counter!("tributary_replica_moves_rolled_back_total").increment(1);
                    tracing::warn!(group = %group_of(mv.hub, mv.partition), from = ?mv.from, to = mv.to, "replica move rolled back: its target is gone");
                }
            }
        }

        let state = self.runtime.state();
        let decision = decide(
            &state,
            &reports,
            &dead,
            &tracker.last_moved,
            self.limits(),
            now_ms,
        );
        if !decision.leaders.is_empty() {
            self.runtime
                .propose(Command::SetPreferredLeaders(decision.leaders.clone()))
                .await?;
            for (hub, partition, to) in &decision.leaders {
                tracker.last_moved.insert((*hub, *partition), now_ms);
                tracing::info!(group = %group_of(*hub, *partition), to, "preferred leader moves");
            }
        }
        if !decision.moves.is_empty() {
            self.runtime
                .propose(Command::StartMoves(decision.moves.clone()))
                .await?;
            // Logged once stored; a move that no longer fit the state was skipped there.
            for mv in &decision.moves {
                tracker.last_moved.insert((mv.hub, mv.partition), now_ms);
                tracing::info!(group = %group_of(mv.hub, mv.partition), from = ?mv.from, to = mv.to, "replica move starts");
            }
            metrics::counter!("tributary_replica_moves_started_total")
                .increment(decision.moves.len() as u64);
        }
        metrics::gauge!("tributary_replica_moves_in_flight").set(state.moves.len() as f64);
        metrics::gauge!("tributary_nodes_dead").set(dead.len() as f64);
        Ok(())
    }

    /// The moves the controller would plan now (`cluster rebalance --dry-run`), from fresh
    /// reports. Nodes that do not answer count as dead, so the plan shows what re-replication
    /// would do were they to stay away past the timeout.
    pub async fn dry_run(&self) -> (Decision, Vec<u64>) {
        let reports = Reports::gather(&self.broker).await;
        let state = self.runtime.state();
        let down: Vec<u64> = state
            .nodes
            .keys()
            .copied()
            .filter(|n| !reports.answered(*n))
            .collect();
        let decision = decide(
            &state,
            &reports,
            &down,
            &HashMap::new(),
            self.limits(),
            self.clock.now_ms(),
        );
        (decision, down)
    }
}

/// The feature level the cluster can rise to: the lowest level any registered node
/// supports, when every registered node has reported and that is above the cluster's.
/// A node that does not answer (down, or stopped for an upgrade) holds the level where it
/// is: it might be of an older release. Only a decommissioned node that holds no replica
/// any more is left out: it has left the cluster.
pub fn level_to_raise(state: &ClusterState, reports: &Reports) -> Option<u32> {
    let lowest = state
        .nodes
        .values()
        .filter(|node| !node.decommissioning || state.replicas_on(node.id) > 0)
        .map(|node| reports.feature_levels.get(&node.id).copied())
        .collect::<Option<Vec<u32>>>()?
        .into_iter()
        .min()?;
    (lowest > state.feature.level).then_some(lowest)
}

/// How the placement controller works (`--node-dead-timeout`, `--placement-*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlacementSettings {
    pub node_dead_timeout: Duration,
    pub interval: Duration,
    pub moves_per_node: u32,
    pub moves_max: u32,
    pub cooldown: Duration,
}

impl Default for PlacementSettings {
    fn default() -> Self {
        Self {
            node_dead_timeout: Duration::from_secs(300),
            interval: Duration::from_secs(2),
            moves_per_node: 4,
            moves_max: 16,
            cooldown: Duration::from_secs(10),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(nodes: u64) -> ClusterState {
        tributary_controller::state::test_cluster(nodes)
    }

    /// Node `id` joins (registers) the cluster.
    fn join(state: &mut ClusterState, id: u64) {
        tributary_controller::state::test_register(state, id);
    }

    fn create(state: &mut ClusterState, partitions: u32, rf: u8) -> HubId {
        tributary_controller::state::test_create_hub(state, partitions, rf).id
    }

    /// Every partition led by its preferred replica, whose report lists the members of
    /// the nodes `voters(p)`.
    fn reports(state: &ClusterState, voters: impl Fn(u16, &[u64]) -> Vec<u64>) -> Reports {
        let mut by_node: HashMap<u64, HashMap<u64, GroupStatus>> = HashMap::new();
        for hub in state.hubs.values() {
            for (p, replicas) in hub.replicas.iter().enumerate() {
                let group = group_of(hub.id, p as u16);
                let leader = replicas[0];
                by_node.entry(leader).or_default().insert(
                    group.to_u64(),
                    GroupStatus {
                        group: group.to_u64(),
                        leader,
                        term: 1,
                        // Reports name members: each node's replica as it runs now.
                        voters: voters(p as u16, replicas)
                            .iter()
                            .map(|n| state.replica_member(hub, p as u16, *n).unwrap())
                            .collect(),
                        ..Default::default()
                    },
                );
            }
        }
        for node in state.nodes.keys() {
            by_node.entry(*node).or_default();
        }
        Reports {
            ready: by_node.keys().copied().collect(),
            by_node,
            ..Default::default()
        }
    }

    fn limits() -> Limits {
        Limits {
            moves_per_node: 100,
            moves_total: 1000,
            cooldown_ms: 0,
        }
    }

    #[test]
    fn a_new_node_receives_replicas_only_of_settled_partitions() {
        let mut state = cluster(3);
        create(&mut state, 12, 3);
        // A fourth node joins: a quarter of the replicas should move to it.
        join(&mut state, 4);
        let settled = reports(&state, |_, replicas| replicas.to_vec());
        let decision = decide(&state, &settled, &[], &HashMap::new(), limits(), 50);
        assert_eq!(decision.moves.len(), 9, "{decision:?}");
        assert!(
            decision
                .moves
                .iter()
                .all(|m| m.to == 4 && m.started_ms == 50)
        );
        // Partitions whose leader still reports another membership are left alone.
        let unsettled = reports(&state, |p, replicas| {
            if p % 2 == 0 {
                replicas[..2].to_vec()
            } else {
                replicas.to_vec()
            }
        });
        let decision = decide(&state, &unsettled, &[], &HashMap::new(), limits(), 50);
        assert!(!decision.moves.is_empty());
        assert!(
            decision.moves.iter().all(|m| m.partition % 2 == 1),
            "{decision:?}"
        );
        // Not before the new node is ready.
        let mut not_ready = settled.clone();
        not_ready.ready.remove(&4);
        let decision = decide(&state, &not_ready, &[], &HashMap::new(), limits(), 50);
        assert!(decision.moves.is_empty(), "{decision:?}");
        // Without reports nothing moves.
        let decision = decide(
            &state,
            &Reports::default(),
            &[],
            &HashMap::new(),
            limits(),
            50,
        );
        assert!(decision.moves.is_empty());
    }

    #[test]
    fn a_dead_node_is_replaced_and_decommissioned_nodes_are_emptied() {
        let mut state = cluster(4);
        let hub = create(&mut state, 8, 3);
        let settled = reports(&state, |_, replicas| replicas.to_vec());
        let decision = decide(&state, &settled, &[4], &HashMap::new(), limits(), 0);
        let on_four = state.hubs["h"]
            .replicas
            .iter()
            .filter(|r| r.contains(&4))
            .count();
        let from_four: Vec<_> = decision
            .moves
            .iter()
            .filter(|m| m.from == Some(4))
            .collect();
        assert_eq!(from_four.len(), on_four, "{decision:?}");
        // Preferred leaderships on the dead node move to another replica, or to the new
        // replica that takes the dead one's place.
        for (p, replicas) in state.hubs["h"].replicas.iter().enumerate() {
            if replicas[0] == 4 {
                let leader_moves = decision
                    .leaders
                    .iter()
                    .any(|(h, q, to)| *h == hub && usize::from(*q) == p && *to != 4);
                let replaced = decision
                    .moves
                    .iter()
                    .any(|m| usize::from(m.partition) == p && m.target(replicas)[0] != 4);
                assert!(leader_moves || replaced, "{decision:?}");
            }
        }
        state
            .apply(Command::SetDecommissioning {
                node: 2,
                decommissioning: true,
            })
            .unwrap();
        let decision = decide(&state, &settled, &[], &HashMap::new(), limits(), 0);
        assert!(decision.moves.iter().any(|m| m.from == Some(2)));
        assert!(decision.moves.iter().all(|m| m.to != 2));
    }

    #[test]
    fn moves_under_way_count_as_done() {
        let mut state = cluster(3);
        create(&mut state, 12, 3);
        join(&mut state, 4);
        let settled = reports(&state, |_, replicas| replicas.to_vec());
        let all = decide(&state, &settled, &[], &HashMap::new(), limits(), 0);
        // Start the first few; the plan then holds only the rest, on other partitions.
        let (first, rest) = all.moves.split_at(4);
        state.apply(Command::StartMoves(first.to_vec())).unwrap();
        let again = decide(&state, &settled, &[], &HashMap::new(), limits(), 0);
        assert_eq!(again.moves.len(), rest.len(), "{again:?}");
        assert!(
            again
                .moves
                .iter()
                .all(|m| first.iter().all(|f| f.partition != m.partition)),
            "{again:?}"
        );
    }

    #[test]
    fn a_recently_moved_partition_waits_for_its_cooldown() {
        let mut state = cluster(3);
        let hub = create(&mut state, 3, 3);
        join(&mut state, 4);
        let settled = reports(&state, |_, replicas| replicas.to_vec());
        let limits = Limits {
            cooldown_ms: 1000,
            ..limits()
        };
        let recent: HashMap<_, _> = (0..3).map(|p| ((hub, p), 500)).collect();
        assert!(
            decide(&state, &settled, &[], &recent, limits, 1000)
                .moves
                .is_empty()
        );
        assert!(
            !decide(&state, &settled, &[], &recent, limits, 1600)
                .moves
                .is_empty()
        );
    }

    #[test]
    fn moves_finish_when_the_leader_reports_the_target_and_roll_back_only_before() {
        let mut state = cluster(4);
        let hub = create(&mut state, 1, 3);
        let replicas = state.hubs["h"].replicas[0].clone();
        let to = (1..=4).find(|n| !replicas.contains(n)).unwrap();
        let m = ReplicaMove {
            hub,
            partition: 0,
            from: Some(replicas[2]),
            to,
            started_ms: 0,
        };
        state.apply(Command::StartMoves(vec![m.clone()])).unwrap();
        let target = m.target(&replicas);
        let old = reports(&state, |_, r| r.to_vec());
        let new = reports(&state, |_, _| target.clone());
        assert_eq!(move_step(&state, &old, &[], &m), MoveStep::Wait);
        assert_eq!(move_step(&state, &new, &[], &m), MoveStep::Finish);
        // A report naming the target node's earlier member (a copy it dropped) is not it.
        let mut earlier = new.clone();
        for groups in earlier.by_node.values_mut() {
            for g in groups.values_mut() {
                for v in &mut g.voters {
                    if tributary_raft::member_node(*v).0 == to {
                        *v = tributary_raft::member_id(to, 0);
                    }
                }
            }
        }
        assert_eq!(move_step(&state, &earlier, &[], &m), MoveStep::Wait);
        // The same membership not yet committed (applied) on the leader: not yet.
        let mut uncommitted = new.clone();
        for groups in uncommitted.by_node.values_mut() {
            for g in groups.values_mut() {
                g.membership_index = g.last_applied_index + 1;
            }
        }
        assert_eq!(move_step(&state, &uncommitted, &[], &m), MoveStep::Wait);
        // The target died before it became a voter: roll back.
        assert_eq!(move_step(&state, &old, &[to], &m), MoveStep::RollBack);
        // ... but not once it may be a voter (in a joint change), nor without a leader.
        let mut joint = reports(&state, |_, r| {
            let mut v = r.to_vec();
            v.push(to);
            v
        });
        for groups in joint.by_node.values_mut() {
            for g in groups.values_mut() {
                g.joint = true;
            }
        }
        assert_eq!(move_step(&state, &joint, &[to], &m), MoveStep::Wait);
        assert_eq!(
            move_step(&state, &Reports::default(), &[to], &m),
            MoveStep::Wait
        );
        // A leftover learner keeps the move from finishing.
        let mut learner = reports(&state, |_, _| target.clone());
        for groups in learner.by_node.values_mut() {
            for g in groups.values_mut() {
                g.learners = vec![99];
            }
        }
        assert_eq!(move_step(&state, &learner, &[], &m), MoveStep::Wait);
    }

    #[test]
    fn the_leader_view_is_the_self_declared_leader_with_the_highest_term() {
        let group = group_of(HubId(1), 0);
        let status = |leader, term| GroupStatus {
            group: group.to_u64(),
            leader,
            term,
            ..Default::default()
        };
        let reports = Reports::from_replies([
            LocalStatusReply {
                node: 1,
                groups: vec![status(1, 3)],
                ready: true,
                ..Default::default()
            },
            LocalStatusReply {
                node: 2,
                groups: vec![status(2, 4)],
                ready: false,
                ..Default::default()
            },
            // Node 3 believes node 3 leads? No: it names node 2, so it is no leader view.
            LocalStatusReply {
                node: 3,
                groups: vec![status(2, 4)],
                ready: true,
                ..Default::default()
            },
        ]);
        assert_eq!(
            reports.leader_view(group).map(|g| (g.leader, g.term)),
            Some((2, 4))
        );
        assert!(reports.answered(3) && !reports.answered(4));
        assert_eq!(reports.ready, BTreeSet::from([1, 3]));
    }

    #[test]
    fn the_level_rises_only_once_every_registered_node_supports_it() {
        let mut state = ClusterState::default();
        for id in 1..=3 {
            state.nodes.insert(
                id,
                tributary_controller::state::NodeRecord::new(id, String::new(), String::new(), 0),
            );
        }
        let reply = |node: u64, feature_level: u32| LocalStatusReply {
            node,
            feature_level,
            ..Default::default()
        };
        // Two upgraded nodes and one of release 0.1.0 (which reports no level).
        let reports = Reports::from_replies([reply(1, 2), reply(2, 2), reply(3, 0)]);
        assert_eq!(level_to_raise(&state, &reports), None);
        // The third upgraded but not answering: still held.
        let reports = Reports::from_replies([reply(1, 2), reply(2, 2)]);
        assert_eq!(level_to_raise(&state, &reports), None);
        let reports = Reports::from_replies([reply(1, 2), reply(2, 3), reply(3, 2)]);
        assert_eq!(level_to_raise(&state, &reports), Some(2));
        // A node that left (decommissioned, no replicas) does not hold the level back.
        state.nodes.get_mut(&3).unwrap().decommissioning = true;
        let reports = Reports::from_replies([reply(1, 2), reply(2, 2)]);
        assert_eq!(level_to_raise(&state, &reports), Some(2));
        state.feature.level = 2;
        assert_eq!(level_to_raise(&state, &reports), None, "already there");
    }
}
