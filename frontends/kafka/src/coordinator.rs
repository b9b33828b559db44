//! Kafka consumer groups' membership, the classic protocol (JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup), as a state machine: requests and the clock in, answers out, no I/O. It runs
//! in memory on the coordinator (the node leading the controller group); committed offsets
//! are replicated elsewhere (the controller's consumer store).
//!
//! A group's life: members join; once every known member has joined (or the rebalance
//! timeout has passed, dropping those that did not), the generation is bumped, a protocol
//! every member supports is chosen, and each member's JoinGroup is answered, the members
//! list only to the leader. The leader's SyncGroup hands out the assignments, which every
//! member's SyncGroup then receives. A member that leaves, or misses heartbeats for its
//! session timeout, is evicted and the others rebalance.
//!
//! JoinGroup and SyncGroup wait: they are *parked* here and answered later by a
//! [`Delivery`], which the runtime routes to the waiting request.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

/// Kafka error codes the coordinator answers.
pub mod code {
    pub const NONE: i16 = 0;
    pub const COORDINATOR_NOT_AVAILABLE: i16 = 15;
    pub const ILLEGAL_GENERATION: i16 = 22;
    pub const INCONSISTENT_GROUP_PROTOCOL: i16 = 23;
    pub const INVALID_GROUP_ID: i16 = 24;
    pub const UNKNOWN_MEMBER_ID: i16 = 25;
    pub const INVALID_SESSION_TIMEOUT: i16 = 26;
    pub const REBALANCE_IN_PROGRESS: i16 = 27;
    pub const MEMBER_ID_REQUIRED: i16 = 79;
    pub const GROUP_MAX_SIZE_REACHED: i16 = 81;
}

/// Limits and delays of the coordinator.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    /// A new group waits this long for more members before its first generation
    /// (Kafka's `group.initial.rebalance.delay.ms`), within the rebalance timeout.
    pub initial_rebalance_delay_ms: i64,
    /// Session timeouts accepted (Event Hubs allows 6 s to 300 s; clients' defaults are
    /// 10 s to 45 s).
    pub session_timeout_min_ms: i32,
    pub session_timeout_max_ms: i32,
    /// Groups held in memory at most.
    pub groups_max: usize,
    /// Members of one group at most.
    pub members_per_group_max: usize,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            initial_rebalance_delay_ms: 3_000,
            session_timeout_min_ms: 6_000,
            session_timeout_max_ms: 300_000,
            groups_max: 10_000,
            members_per_group_max: 1_000,
        }
    }
}

/// A JoinGroup, as the coordinator needs it.
#[derive(Debug, Clone)]
pub struct Join {
    pub group: String,
    /// Empty for a member joining for the first time.
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// (name, metadata), in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// v4 and later: a first join gets MEMBER_ID_REQUIRED and its id, and joins again.
    pub require_known_member_id: bool,
}

/// A JoinGroup's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Joined {
    pub error_code: i16,
    pub generation_id: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Only to the leader: every member's id, instance id and metadata for the protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

impl Joined {
    fn error(error_code: i16, member_id: &str) -> Joined {
        Joined {
            error_code,
            generation_id: -1,
            member_id: member_id.to_string(),
            ..Joined::default()
        }
    }
}

/// A SyncGroup, as the coordinator needs it.
#[derive(Debug, Clone)]
pub struct Sync {
    pub group: String,
    pub generation_id: i32,
    pub member_id: String,
    /// The leader's assignments, by member id (empty from the others).
    pub assignments: Vec<(String, Bytes)>,
}

/// A SyncGroup's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Synced {
    pub error_code: i16,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl Synced {
    fn error(error_code: i16) -> Synced {
        Synced {
            error_code,
            ..Synced::default()
        }
    }
}

/// An answer now, or later: a [`Delivery`] to the parked request of the member named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer<T> {
    Now(T),
    Parked(String),
}

/// An answer to a parked request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    Join {
        group: String,
        member_id: String,
        joined: Joined,
    },
    Sync {
        group: String,
        member_id: String,
        synced: Synced,
    },
}

/// A group's state, as DescribeGroups and ListGroups name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// A member as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberView {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    /// Its metadata for the group's protocol.
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupView {
    pub group: String,
    pub state: GroupState,
    pub protocol_type: String,
    pub protocol: String,
    pub generation_id: i32,
    pub members: Vec<MemberView>,
}

#[derive(Debug, Clone)]
struct Member {
    group_instance_id: Option<String>,
    client_id: String,
    client_host: String,
    session_timeout_ms: i32,
    rebalance_timeout_ms: i32,
    protocols: Vec<(String, Bytes)>,
    assignment: Bytes,
    last_seen_ms: i64,
    /// Its JoinGroup waits for the rebalance to complete.
    join_parked: bool,
    /// Its SyncGroup waits for the leader's.
    sync_parked: bool,
}

#[derive(Debug, Clone)]
struct Group {
    state: GroupState,
    generation_id: i32,
    protocol_type: String,
    protocol: String,
    leader: String,
    members: BTreeMap<String, Member>,
    /// Ids handed out with MEMBER_ID_REQUIRED, by when they lapse unused.
    pending: BTreeMap<String, i64>,
    /// While preparing: the rebalance ends by then, whoever has not joined.
    rebalance_deadline_ms: i64,
    /// While preparing a new group's first generation: not before then.
    initial_delay_until_ms: i64,
}

impl Group {
    fn new() -> Group {
        Group {
            state: GroupState::Empty,
            generation_id: 0,
            protocol_type: String::new(),
            protocol: String::new(),
            leader: String::new(),
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            rebalance_deadline_ms: 0,
            initial_delay_until_ms: 0,
        }
    }
}

/// Every group this node coordinates.
#[derive(Debug, Default)]
pub struct Coordinator {
    config: CoordinatorConfig,
    groups: BTreeMap<String, Group>,
    /// Makes member ids unique on this coordinator.
    next_member: u64,
}

impl Coordinator {
    pub fn new(config: CoordinatorConfig) -> Coordinator {
        Coordinator {
            config,
            groups: BTreeMap::new(),
            next_member: 0,
        }
    }

    /// A JoinGroup at `now_ms`.
    pub fn join(&mut self, now_ms: i64, join: Join) -> (Answer<Joined>, Vec<Delivery>) {
        let refuse = |code| {
            (
                Answer::Now(Joined::error(code, &join.member_id)),
                Vec::new(),
            )
        };
        if join.group.is_empty() {
            return refuse(code::INVALID_GROUP_ID);
        }
        if join.session_timeout_ms < self.config.session_timeout_min_ms
            || join.session_timeout_ms > self.config.session_timeout_max_ms
        {
            return refuse(code::INVALID_SESSION_TIMEOUT);
        }
        if join.protocol_type.is_empty() || join.protocols.is_empty() {
            return refuse(code::INCONSISTENT_GROUP_PROTOCOL);
        }
        if !self.groups.contains_key(&join.group) && self.groups.len() >= self.config.groups_max {
            return refuse(code::COORDINATOR_NOT_AVAILABLE);
        }
        let members_max = self.config.members_per_group_max;
        let member_id = if join.member_id.is_empty() {
            self.next_member += 1;
            format!("{}-{:016x}", client_part(&join.client_id), self.next_member)
        } else {
            join.member_id.clone()
        };
        let group = self
            .groups
            .entry(join.group.clone())
            .or_insert_with(Group::new);
        let known = group.members.contains_key(&member_id);
        if !known && !join.member_id.is_empty() && !group.pending.contains_key(&member_id) {
            return refuse(code::UNKNOWN_MEMBER_ID);
        }
        if !group.members.is_empty() {
            let others_share_one = group
                .members
                .iter()
                .filter(|(id, _)| **id != member_id)
                .all(|(_, m)| m.protocols.iter().any(|(p, _)| offers(&join.protocols, p)));
            if join.protocol_type != group.protocol_type || !others_share_one {
                return refuse(code::INCONSISTENT_GROUP_PROTOCOL);
            }
        }
        if !known && group.members.len() >= members_max {
            return refuse(code::GROUP_MAX_SIZE_REACHED);
        }
        if join.member_id.is_empty() && join.require_known_member_id {
            group.pending.insert(
                member_id.clone(),
                now_ms + i64::from(join.session_timeout_ms),
            );
            return (
                Answer::Now(Joined::error(code::MEMBER_ID_REQUIRED, &member_id)),
                Vec::new(),
            );
        }
        group.pending.remove(&member_id);
        if group.members.is_empty() {
            group.protocol_type = join.protocol_type.clone();
        }
        let (assignment, sync_parked) = group
            .members
            .get(&member_id)
            .map(|m| (m.assignment.clone(), m.sync_parked))
            .unwrap_or_default();
        group.members.insert(
            member_id.clone(),
            Member {
                group_instance_id: join.group_instance_id,
                client_id: join.client_id,
                client_host: join.client_host,
                session_timeout_ms: join.session_timeout_ms,
                rebalance_timeout_ms: join.rebalance_timeout_ms.max(join.session_timeout_ms),
                protocols: join.protocols,
                assignment,
                last_seen_ms: now_ms,
                join_parked: true,
                // A SyncGroup it left waiting is answered by the rebalance below.
                sync_parked,
            },
        );
        let mut deliveries = Vec::new();
        if group.state != GroupState::PreparingRebalance {
            prepare_rebalance(group, &join.group, now_ms, &self.config, &mut deliveries);
        }
        try_complete(group, &join.group, now_ms, &mut deliveries);
        (Answer::Parked(member_id), deliveries)
    }

    /// A SyncGroup at `now_ms`.
    pub fn sync(&mut self, now_ms: i64, sync: Sync) -> (Answer<Synced>, Vec<Delivery>) {
        let Some(group) = self.groups.get_mut(&sync.group) else {
            return (
                Answer::Now(Synced::error(code::UNKNOWN_MEMBER_ID)),
                Vec::new(),
            );
        };
        let Some(member) = group.members.get_mut(&sync.member_id) else {
            return (
                Answer::Now(Synced::error(code::UNKNOWN_MEMBER_ID)),
                Vec::new(),
            );
        };
        member.last_seen_ms = now_ms;
        if sync.generation_id != group.generation_id {
            return (
                Answer::Now(Synced::error(code::ILLEGAL_GENERATION)),
                Vec::new(),
            );
        }
        match group.state {
            GroupState::Empty | GroupState::PreparingRebalance => (
                Answer::Now(Synced::error(code::REBALANCE_IN_PROGRESS)),
                Vec::new(),
            ),
            GroupState::Stable => {
                let assignment = member.assignment.clone();
                (Answer::Now(synced(group, assignment)), Vec::new())
            }
            GroupState::CompletingRebalance if sync.member_id != group.leader => {
                member.sync_parked = true;
                (Answer::Parked(sync.member_id), Vec::new())
            }
            GroupState::CompletingRebalance => {
                let assignments: BTreeMap<String, Bytes> = sync.assignments.into_iter().collect();
                for (id, member) in group.members.iter_mut() {
                    member.assignment = assignments.get(id).cloned().unwrap_or_default();
                }
                group.state = GroupState::Stable;
                let mut deliveries = Vec::new();
                let ids: Vec<String> = group
                    .members
                    .iter()
                    .filter(|(id, m)| m.sync_parked && **id != sync.member_id)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in ids {
                    let member = group.members.get_mut(&id).expect("listed above");
                    member.sync_parked = false;
                    let assignment = member.assignment.clone();
                    deliveries.push(Delivery::Sync {
                        group: sync.group.clone(),
                        member_id: id,
                        synced: synced(group, assignment),
                    });
                }
                let assignment = group.members[&sync.member_id].assignment.clone();
                (Answer::Now(synced(group, assignment)), deliveries)
            }
        }
    }

    /// A Heartbeat at `now_ms`: its error code.
    pub fn heartbeat(
        &mut self,
        now_ms: i64,
        group: &str,
        generation_id: i32,
        member_id: &str,
    ) -> i16 {
        let Some(group) = self.groups.get_mut(group) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        let Some(member) = group.members.get_mut(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        member.last_seen_ms = now_ms;
        if group.state == GroupState::PreparingRebalance {
            return code::REBALANCE_IN_PROGRESS;
        }
        if generation_id != group.generation_id {
            return code::ILLEGAL_GENERATION;
        }
        code::NONE
    }

    /// A member's LeaveGroup at `now_ms`: its error code, and the answers the rebalance it
    /// starts gives.
    pub fn leave(&mut self, now_ms: i64, group_id: &str, member_id: &str) -> (i16, Vec<Delivery>) {
        let Some(group) = self.groups.get_mut(group_id) else {
            return (code::UNKNOWN_MEMBER_ID, Vec::new());
        };
        if !group.members.contains_key(member_id) {
            return (code::UNKNOWN_MEMBER_ID, Vec::new());
        }
        let mut deliveries = Vec::new();
        evict(
            group,
            group_id,
            member_id,
            now_ms,
            &self.config,
            &mut deliveries,
        );
        (code::NONE, deliveries)
    }

    /// Whether an OffsetCommit of `generation_id` by `member_id` may be stored: its error
    /// code. Generation -1 with no member is a commit outside group management, taken while
    /// the group has no members.
    pub fn check_commit(
        &mut self,
        now_ms: i64,
        group: &str,
        generation_id: i32,
        member_id: &str,
    ) -> i16 {
        let Some(group) = self.groups.get_mut(group) else {
            return if generation_id < 0 && member_id.is_empty() {
                code::NONE
            } else {
                code::UNKNOWN_MEMBER_ID
            };
        };
        if generation_id < 0 && member_id.is_empty() && group.members.is_empty() {
            return code::NONE;
        }
        let Some(member) = group.members.get_mut(member_id) else {
            return code::UNKNOWN_MEMBER_ID;
        };
        member.last_seen_ms = now_ms;
        if generation_id != group.generation_id {
            return code::ILLEGAL_GENERATION;
        }
        if group.state == GroupState::CompletingRebalance {
            return code::REBALANCE_IN_PROGRESS;
        }
        code::NONE
    }

    /// Time passes: members whose sessions lapsed are evicted, rebalances whose timeout
    /// passed complete without the members that did not rejoin, groups left empty are
    /// forgotten.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Delivery> {
        let mut deliveries = Vec::new();
        for (id, group) in self.groups.iter_mut() {
            group.pending.retain(|_, until| *until > now_ms);
            let expired: Vec<String> = group
                .members
                .iter()
                .filter(|(_, m)| !m.join_parked)
                .filter(|(_, m)| m.last_seen_ms + i64::from(m.session_timeout_ms) <= now_ms)
                .map(|(member, _)| member.clone())
                .collect();
            for member in expired {
                evict(group, id, &member, now_ms, &self.config, &mut deliveries);
            }
            if group.state == GroupState::PreparingRebalance {
                try_complete(group, id, now_ms, &mut deliveries);
            }
        }
        self.groups
            .retain(|_, g| g.state != GroupState::Empty || !g.pending.is_empty());
        deliveries
    }

    /// Groups and their states, for ListGroups.
    pub fn list(&self) -> Vec<(String, String, GroupState)> {
        self.groups
            .iter()
            .map(|(id, g)| (id.clone(), g.protocol_type.clone(), g.state))
            .collect()
    }

    /// A group, for DescribeGroups; `None` for one not known here.
    pub fn describe(&self, group_id: &str) -> Option<GroupView> {
        let group = self.groups.get(group_id)?;
        let members = group
            .members
            .iter()
            .map(|(id, m)| MemberView {
                member_id: id.clone(),
                group_instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: metadata_for(m, &group.protocol),
                assignment: m.assignment.clone(),
            })
            .collect();
        Some(GroupView {
            group: group_id.to_string(),
            state: group.state,
            protocol_type: group.protocol_type.clone(),
            protocol: group.protocol.clone(),
            generation_id: group.generation_id,
            members,
        })
    }

    /// The answers of every parked request, when this node stops coordinating: each gets
    /// NOT_COORDINATOR-like refusal from the runtime; here the state is simply dropped.
    pub fn clear(&mut self) {
        self.groups.clear();
    }
}

/// A readable prefix of a member id: the client id, bounded and without odd characters.
fn client_part(client_id: &str) -> String {
    let part: String = client_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .take(64)
        .collect();
    if part.is_empty() {
        "member".to_string()
    } else {
        part
    }
}

fn offers(protocols: &[(String, Bytes)], name: &str) -> bool {
    protocols.iter().any(|(p, _)| p == name)
}

fn metadata_for(member: &Member, protocol: &str) -> Bytes {
    member
        .protocols
        .iter()
        .find(|(p, _)| p == protocol)
        .map(|(_, m)| m.clone())
        .unwrap_or_default()
}

fn synced(group: &Group, assignment: Bytes) -> Synced {
    Synced {
        error_code: code::NONE,
        protocol_type: Some(group.protocol_type.clone()),
        protocol_name: Some(group.protocol.clone()),
        assignment,
    }
}

/// Starts a rebalance: members must join again by the largest rebalance timeout; the
/// SyncGroups still waiting are told to rejoin.
fn prepare_rebalance(
    group: &mut Group,
    group_id: &str,
    now_ms: i64,
    config: &CoordinatorConfig,
    deliveries: &mut Vec<Delivery>,
) {
    let timeout_ms = group
        .members
        .values()
        .map(|m| i64::from(m.rebalance_timeout_ms))
        .max()
        .unwrap_or(0);
    if group.state == GroupState::Empty {
        group.initial_delay_until_ms = now_ms + config.initial_rebalance_delay_ms.min(timeout_ms);
    } else {
        group.initial_delay_until_ms = now_ms;
    }
    group.rebalance_deadline_ms = now_ms + timeout_ms;
    group.state = GroupState::PreparingRebalance;
    for (id, member) in group.members.iter_mut() {
        if member.sync_parked {
            member.sync_parked = false;
            deliveries.push(Delivery::Sync {
                group: group_id.to_string(),
                member_id: id.clone(),
                synced: Synced::error(code::REBALANCE_IN_PROGRESS),
            });
        }
    }
}

/// Completes a rebalance once every member has joined (after a new group's initial delay),
/// or once its timeout has passed (without the members that did not join).
fn try_complete(group: &mut Group, group_id: &str, now_ms: i64, deliveries: &mut Vec<Delivery>) {
    if group.state != GroupState::PreparingRebalance {
        return;
    }
    let all_joined = group.members.values().all(|m| m.join_parked);
    let timed_out = now_ms >= group.rebalance_deadline_ms;
    if !(timed_out || all_joined && now_ms >= group.initial_delay_until_ms) {
        return;
    }
    group.members.retain(|_, m| m.join_parked);
    if group.members.is_empty() {
        group.state = GroupState::Empty;
        group.generation_id += 1;
        group.leader.clear();
        group.protocol.clear();
        return;
    }
    group.generation_id += 1;
    group.protocol = choose_protocol(group);
    if !group.members.contains_key(&group.leader) {
        group.leader = group.members.keys().next().cloned().unwrap_or_default();
    }
    group.state = GroupState::CompletingRebalance;
    let members: Vec<(String, Option<String>, Bytes)> = group
        .members
        .iter()
        .map(|(id, m)| {
            (
                id.clone(),
                m.group_instance_id.clone(),
                metadata_for(m, &group.protocol),
            )
        })
        .collect();
    for (id, member) in group.members.iter_mut() {
        member.join_parked = false;
        member.last_seen_ms = now_ms;
        deliveries.push(Delivery::Join {
            group: group_id.to_string(),
            member_id: id.clone(),
            joined: Joined {
                error_code: code::NONE,
                generation_id: group.generation_id,
                protocol_type: Some(group.protocol_type.clone()),
                protocol_name: Some(group.protocol.clone()),
                leader: group.leader.clone(),
                member_id: id.clone(),
                members: if *id == group.leader {
                    members.clone()
                } else {
                    Vec::new()
                },
            },
        });
    }
}

/// The protocol every member supports that most members prefer (each member votes for
/// the first of its protocols all support; ties go to the leader's or first member's order).
fn choose_protocol(group: &Group) -> String {
    let mut candidates: BTreeSet<&str> = BTreeSet::new();
    if let Some(first) = group.members.values().next() {
        candidates = first.protocols.iter().map(|(p, _)| p.as_str()).collect();
    }
    for member in group.members.values() {
        candidates.retain(|c| offers(&member.protocols, c));
    }
    let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
    for member in group.members.values() {
        if let Some((p, _)) = member
            .protocols
            .iter()
            .find(|(p, _)| candidates.contains(p.as_str()))
        {
            *votes.entry(p.as_str()).or_default() += 1;
        }
    }
    let most = votes.values().copied().max().unwrap_or(0);
    let order = group
        .members
        .get(&group.leader)
        .or_else(|| group.members.values().next())
        .map(|m| m.protocols.clone())
        .unwrap_or_default();
    order
        .iter()
        .map(|(p, _)| p.as_str())
        .find(|p| votes.get(p) == Some(&most))
        .unwrap_or_default()
        .to_string()
}

/// Removes a member (it left, or its session lapsed): its parked requests are told it is
/// unknown, and the others rebalance.
fn evict(
    group: &mut Group,
    group_id: &str,
    member_id: &str,
    now_ms: i64,
    config: &CoordinatorConfig,
    deliveries: &mut Vec<Delivery>,
) {
    let Some(member) = group.members.remove(member_id) else {
        return;
    };
    if member.join_parked {
        deliveries.push(Delivery::Join {
            group: group_id.to_string(),
            member_id: member_id.to_string(),
            joined: Joined::error(code::UNKNOWN_MEMBER_ID, member_id),
        });
    }
    if member.sync_parked {
        deliveries.push(Delivery::Sync {
            group: group_id.to_string(),
            member_id: member_id.to_string(),
            synced: Synced::error(code::UNKNOWN_MEMBER_ID),
        });
    }
    if group.members.is_empty() {
        group.state = GroupState::Empty;
        group.generation_id += 1;
        group.leader.clear();
        group.protocol.clear();
        return;
    }
    if group.state != GroupState::PreparingRebalance {
        prepare_rebalance(group, group_id, now_ms, config, deliveries);
    }
    try_complete(group, group_id, now_ms, deliveries);
}

#[cfg(test)]
#[path = "coordinator_tests.rs"]
mod tests;
