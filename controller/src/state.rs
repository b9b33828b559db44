//! The controller's replicated state and the commands that change it. Pure: the controller
//! group applies commands in log order on every voter, so each computes the same state.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::rules::RuleCommand;
use super::store::{StoreCommand, StoreReply};

use super::planner;
use crate::capture::CaptureDestination;
use tributary_types::limits::{CONSUMER_GROUPS_PER_HUB_MAX, RETENTION_MAX};
use tributary_types::{
    AuthorizationRule, DEFAULT_CONSUMER_GROUP, HubId, validate_consumer_group_name,
    validate_hub_name,
};

/// Replication factors a hub may have.
pub const REPLICATION_FACTOR_MAX: u8 = 5;
/// Throughput units one node capacity unit can carry.
pub const THROUGHPUT_UNITS_PER_CAPACITY_UNIT: u64 = 10;
/// Most throughput units one hub may reserve (as an Event Hubs namespace).
pub const THROUGHPUT_UNITS_PER_HUB_MAX: u32 = 40;

/// Replication factor when none is asked for (capped at the number of nodes).
pub const REPLICATION_FACTOR_DEFAULT: u8 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: u64,
    pub client_addr: String,
    pub peer_addr: String,
    /// Random id of the node's data directory, made when the directory was first used.
    pub data_id: u64,
    /// Bumped whenever the node comes back with a different data directory (its data was
    /// lost): its replicas then rejoin their groups as new Raft members
    /// (`tributary_raft::member_id`).
    pub incarnation: u32,
    /// The state version at which the current incarnation registered. Groups created
    /// after it never held data on this node in an earlier incarnation.
    pub incarnation_version: u64,
    /// The node's share of the cluster's work (`--capacity-units`).
    pub capacity_units: u32,
    /// Failure domain (`--zone`).
    pub zone: Option<String>,
    /// Drained for maintenance: leads no partition (its replicas stay and keep up).
    pub draining: bool,
    /// Being removed: the placement controller moves every replica off it.
    pub decommissioning: bool,
}

impl NodeRecord {
    /// A node as it introduces itself; the controller assigns the incarnation.
    pub fn new(id: u64, client_addr: String, peer_addr: String, data_id: u64) -> Self {
        Self {
            id,
            client_addr,
            peer_addr,
            data_id,
            incarnation: 0,
            incarnation_version: 0,
            capacity_units: 1,
            zone: None,
            draining: false,
            decommissioning: false,
        }
    }

    /// This node's Raft member id in the controller group. Partition replicas run as
    /// [`ClusterState::replica_member`], which also counts the times a replica was re-added.
    pub fn member(&self) -> u64 {
        tributary_raft::member_id(self.id, self.incarnation)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubRecord {
    pub id: HubId,
    pub name: String,
    pub partition_count: u16,
    pub retention_ms: u64,
    pub created_at_ms: i64,
    pub replication_factor: u8,
    /// Consumer group name → created time. `$Default` is always present.
    pub consumer_groups: BTreeMap<String, i64>,
    /// Per partition, the nodes holding a replica; the first is the preferred leader.
    pub replicas: Vec<Vec<u64>>,
    /// The state version that created the hub.
    pub created_version: u64,
    /// Reserved throughput units (1 MB/s or 1,000 events/s in, 2 MB/s or 4,096 events/s
    /// out each); 0: unthrottled.
    pub throughput_units: u32,
    /// Partitions whose replica set has changed since creation: their groups already run,
    /// so a replica that starts on a node never initializes one (even as the preferred
    /// leader).
    pub moved: BTreeSet<u16>,
    /// Per partition, how many times a replica move to each node has started. A replica's
    /// Raft member id counts these together with its node's data incarnation
    /// ([`HubRecord::member_incarnation`]): a replica added again to a node that once held
    /// one (it moved away, or an earlier move there was rolled back) is a new member, never
    /// taken for the copy the node dropped, whose log the leader remembers as stored.
    #[serde(default)]
    pub joins: BTreeMap<u16, BTreeMap<u64, u32>>,
    /// Per partition, the Raft member ids of the replicas it was created with. Any of them
    /// may initialize the new group, always with exactly this membership (openraft allows
    /// several nodes to initialize with the same one): a group whose first replica was down
    /// when the hub was created, and whose preferred leader has since changed, still starts.
    #[serde(default)]
    pub founders: Vec<Vec<u64>>,
    /// Retention and cleanup settings, changeable with `UpdateHub`.
    pub settings: HubSettings,
    /// The hub's shared access authorization rules (the namespace's apply too).
    #[serde(default)]
    pub rules: Vec<AuthorizationRule>,
}

/// What happens to a hub's old events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum CleanupPolicy {
    /// Events are removed once they are older than the hub's retention.
    #[default]
    Delete,
    /// Only the latest event of each partition key is kept (after the compaction lag); a
    /// key whose latest event has an empty body (a tombstone) goes after the tombstone
    /// retention. Time-based retention does not apply.
    Compact,
    /// Both: compaction, and removal once past the retention.
    DeleteOrCompact,
}

impl CleanupPolicy {
    pub fn deletes(self) -> bool {
        matches!(self, CleanupPolicy::Delete | CleanupPolicy::DeleteOrCompact)
    }

    pub fn compacts(self) -> bool {
        matches!(
            self,
            CleanupPolicy::Compact | CleanupPolicy::DeleteOrCompact
        )
    }
}

/// Default time a tombstone stays readable in a compacted hub.
pub const TOMBSTONE_RETENTION_DEFAULT_MS: u64 = 24 * 3600 * 1000;

/// A hub's retention and cleanup settings (its retention time is `HubRecord::retention_ms`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HubSettings {
    pub cleanup_policy: CleanupPolicy,
    /// How long a tombstone stays after it became its key's latest event (compaction).
    pub tombstone_retention_ms: u64,
    /// Events younger than this are never compacted away.
    pub compaction_lag_ms: u64,
    /// Per partition, the oldest events are removed while the retained events take more
    /// than this many bytes (0: no cap).
    pub retention_bytes_max: u64,
    /// Capture, when enabled: every partition's events also go to Avro files.
    pub capture: Option<CaptureSettings>,
}

impl Default for HubSettings {
    fn default() -> Self {
        Self {
            cleanup_policy: CleanupPolicy::Delete,
            tombstone_retention_ms: TOMBSTONE_RETENTION_DEFAULT_MS,
            compaction_lag_ms: 0,
            retention_bytes_max: 0,
            capture: None,
        }
    }
}

/// Capture's time window when none is given (as Event Hubs).
pub const CAPTURE_WINDOW_DEFAULT_MS: u64 = 5 * 60 * 1000;
/// Shortest time window. Event Hubs allows 1 minute; shorter windows serve tests.
pub const CAPTURE_WINDOW_MIN_MS: u64 = 1000;
/// Longest time window (as Event Hubs).
pub const CAPTURE_WINDOW_MAX_MS: u64 = 15 * 60 * 1000;
/// Capture's size window when none is given (as Event Hubs: 300 MiB).
pub const CAPTURE_WINDOW_DEFAULT_BYTES: u64 = 300 * 1024 * 1024;
/// Smallest size window. Event Hubs allows 10 MiB; smaller windows serve tests.
pub const CAPTURE_WINDOW_MIN_BYTES: u64 = 1024;
/// Largest size window (as Event Hubs: 500 MiB). A window's events are held in memory
/// while its file is written, one window at a time per node, so this bounds that memory.
pub const CAPTURE_WINDOW_MAX_BYTES: u64 = 500 * 1024 * 1024;
/// Longest capture namespace name (Event Hubs namespaces have at most 50 characters).
pub const CAPTURE_NAMESPACE_MAX_CHARS: usize = 64;

/// A hub's Capture settings: where its files go and when a window closes (whichever of
/// the time and size windows closes first).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CaptureSettings {
    pub destination: CaptureDestination,
    /// A window closes once its first event is this old.
    pub window_ms: u64,
    /// A window closes once its events take this many bytes (bodies, keys and properties).
    pub window_bytes: u64,
    /// The first segment of every file's path (Event Hubs: the namespace's name).
    pub namespace: String,
    /// When capture was enabled (by the proposer's clock): only events enqueued at or after
    /// it are captured. Kept when the settings of an enabled capture change.
    pub enabled_at_ms: i64,
}

/// The settings an `UpdateHub` changes; `None` leaves one as it is.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct HubUpdate {
    pub throughput_units: Option<u32>,
    pub retention_ms: Option<u64>,
    pub cleanup_policy: Option<CleanupPolicy>,
    pub tombstone_retention_ms: Option<u64>,
    pub compaction_lag_ms: Option<u64>,
    pub retention_bytes_max: Option<u64>,
    /// `Some(None)` disables Capture, `Some(Some(..))` enables it or changes its settings.
    pub capture: Option<Option<CaptureSettings>>,
}

impl HubRecord {
    /// The incarnation part of the member id `node`'s replica of `partition` runs as: the
    /// node's data incarnation plus the moves to it that have started. Both only grow, so
    /// every new life of a replica gets a larger one.
    pub fn member_incarnation(&self, partition: u16, node: &NodeRecord) -> u32 {
        let joins = self
            .joins
            .get(&partition)
            .and_then(|j| j.get(&node.id))
            .copied()
            .unwrap_or(0);
        node.incarnation + joins
    }

    /// A partition's weight for placement: its share of the hub's throughput units, or one
    /// unit when none are reserved.
    pub fn partition_weight(&self) -> u32 {
        if self.throughput_units == 0 {
            1
        } else {
            self.throughput_units
                .div_ceil(u32::from(self.partition_count.max(1)))
                .max(1)
        }
    }
}

/// A replica being moved by the placement controller: `to` is added (as a learner that
/// catches up, then a voter in the same membership change that drops `from`). The move is
/// stored so that a new controller leader resumes it, or rolls it back while `to` has not
/// become a voter.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaMove {
    pub hub: HubId,
    pub partition: u16,
    /// `None`: the partition gains a replica (it had fewer than its replication factor).
    pub from: Option<u64>,
    pub to: u64,
    /// Wall-clock time the move started, for status and timeouts.
    pub started_ms: i64,
}

impl ReplicaMove {
    /// The replica set once the move is done: `to` takes `from`'s place (keeping the
    /// preferred leader's position), or is appended.
    pub fn target(&self, replicas: &[u64]) -> Vec<u64> {
        let mut set = replicas.to_vec();
        match self.from.and_then(|f| set.iter().position(|r| *r == f)) {
            Some(i) => set[i] = self.to,
            None => {
                if !set.contains(&self.to) {
                    set.push(self.to)
                }
            }
        }
        set
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Set once, by the node that bootstraps the controller.
    pub cluster_id: String,
    /// The controller group's voters.
    pub controller_voters: Vec<u64>,
    pub nodes: BTreeMap<u64, NodeRecord>,
    pub hubs: BTreeMap<String, HubRecord>,
    /// Hub ids are never reused, so a re-created hub never meets an old hub's state.
    pub next_hub_id: u32,
    /// Counts applied commands; a newer state has a larger version.
    pub version: u64,
    /// Replica moves under way (at most one per partition).
    pub moves: Vec<ReplicaMove>,
    /// The namespace's shared access authorization rules: they apply to every hub.
    #[serde(default)]
    pub rules: Vec<AuthorizationRule>,
    /// The cluster's feature level. Not part of this type's encoding (which stays the one
    /// release 0.1.0 reads): stored beside it in format 2 (see
    /// [`crate::state_machine::encode_applied`]) and sent beside it in cluster views.
    #[serde(skip)]
    pub feature: ClusterFeature,
}

/// The cluster's feature level ([`tributary_types::format`]): raised by the controller
/// leader once every registered node supports a higher one, never lowered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFeature {
    pub level: u32,
    /// The first release that supports `level`, for messages to operators.
    pub release: String,
}

impl Default for ClusterFeature {
    /// A cluster that has never raised its level runs release 0.1.0's.
    fn default() -> Self {
        Self {
            level: 1,
            release: tributary_types::format::release_for_level(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Command {
    /// The first command of a cluster's controller log.
    Bootstrap {
        cluster_id: String,
        voters: Vec<u64>,
    },
    RegisterNode(NodeRecord),
    CreateHub(NewHub),
    DeleteHub {
        name: String,
    },
    /// Moves every partition leader off a node (maintenance, rolling restarts), or lets
    /// leaders return.
    SetDraining {
        node: u64,
        draining: bool,
    },
    /// Starts moving replicas off a node so that it can be removed (`decommissioning:
    /// false` cancels what has not moved yet).
    SetDecommissioning {
        node: u64,
        decommissioning: bool,
    },
    /// Starts replica moves (placement controller). Moves that no longer fit the state (a
    /// partition already moving, a replica gone) are skipped.
    StartMoves(Vec<ReplicaMove>),
    /// A move whose membership change is done: the replica set takes its target.
    FinishMove {
        hub: HubId,
        partition: u16,
        to: u64,
    },
    /// Abandons a move (its target died or left): the replica set stays as it was.
    AbortMove {
        hub: HubId,
        partition: u16,
        to: u64,
    },
    /// Makes each listed node its partition's preferred leader (first replica); the
    /// partition's leader hands leadership over once the node has caught up.
    SetPreferredLeaders(Vec<(HubId, u16, u64)>),
    /// Changes a hub's reserved throughput units (0: unthrottled); applies at once.
    SetThroughputUnits {
        hub: String,
        throughput_units: u32,
    },
    CreateConsumerGroup {
        hub: String,
        name: String,
        now_ms: i64,
    },
    DeleteConsumerGroup {
        hub: String,
        name: String,
    },
    /// A checkpoint store operation; applied to the [`ConsumerStore`](crate::store::ConsumerStore), not to this state.
    Store(StoreCommand),
    /// Changes a hub's settings; each applies at once.
    UpdateHub {
        hub: String,
        update: HubUpdate,
    },
    /// Creates, deletes or rekeys a shared access authorization rule.
    Rule(RuleCommand),
    /// Raises the cluster's feature level (never lowers it). Proposed by the controller
    /// leader only once every registered node supports `level`, so only nodes that can
    /// read this command ever apply it; it is the first command of feature level 2.
    SetFeatureLevel {
        level: u32,
        release: String,
    },
}

/// What `CreateHub` asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewHub {
    pub name: String,
    pub partition_count: u32,
    pub retention_ms: u64,
    /// `None`: the default, capped at the number of live nodes.
    pub replication_factor: Option<u8>,
    pub partitions_max: u16,
    pub now_ms: i64,
    /// Nodes the proposing node found down: no replicas are placed on them. (Nodes it
    /// did not know of yet count as up.)
    pub down_nodes: Vec<u64>,
    /// 0: unthrottled.
    pub throughput_units: u32,
    pub settings: HubSettings,
}

/// A command's reply: made once per command and decoded once by its proposer, so the size
/// of the hub variant (a whole `HubRecord`) costs nothing worth a box at every use.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Hub(HubRecord),
    ConsumerGroupCreated {
        created_at_ms: i64,
    },
    Store(StoreReply),
    /// A rule as created or rekeyed.
    Rule(AuthorizationRule),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidArgument,
    QuotaExceeded,
    /// A conditional checkpoint store update by an instance that no longer owns the
    /// partition.
    NotOwner,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{message}")]
pub struct CommandError {
    pub kind: ErrorKind,
    pub message: String,
}

fn err(kind: ErrorKind, message: impl Into<String>) -> CommandError {
    CommandError {
        kind,
        message: message.into(),
    }
}

pub fn hub_not_found(name: &str) -> CommandError {
    err(
        ErrorKind::NotFound,
        format!(
            "The messaging entity '{name}' could not be found: no event hub of that name exists"
        ),
    )
}

impl ClusterState {
    pub fn apply(&mut self, command: Command) -> Result<Reply, CommandError> {
        self.version += 1;
        match command {
            Command::Bootstrap { cluster_id, voters } => {
                if self.cluster_id.is_empty() {
                    self.cluster_id = cluster_id;
                    self.controller_voters = voters;
                }
                Ok(Reply::Done)
            }
            Command::SetDraining { node, draining } => {
                let record = self.nodes.get_mut(&node).ok_or_else(|| {
                    err(
                        ErrorKind::NotFound,
                        format!(
                            "node {node} is not part of this cluster; `tributary cluster status` lists its nodes"
                        ),
                    )
                })?;
                record.draining = draining;
                Ok(Reply::Done)
            }
            Command::SetDecommissioning {
                node,
                decommissioning,
            } => {
                let record = self.nodes.get_mut(&node).ok_or_else(|| {
                    err(
                        ErrorKind::NotFound,
                        format!(
                            "node {node} is not part of this cluster; `tributary cluster status` lists its nodes"
                        ),
                    )
                })?;
                record.decommissioning = decommissioning;
                Ok(Reply::Done)
            }
            Command::StartMoves(moves) => {
                for mv in moves {
                    if self.move_fits(&mv) {
                        if let Some(hub) = self.hubs.values_mut().find(|h| h.id == mv.hub) {
                            *hub.joins
                                .entry(mv.partition)
                                .or_default()
                                .entry(mv.to)
                                .or_default() += 1;
                        }
                        self.moves.push(mv);
                    }
                }
                Ok(Reply::Done)
            }
            Command::FinishMove { hub, partition, to } => {
                let Some(i) = self
                    .moves
                    .iter()
                    .position(|m| m.hub == hub && m.partition == partition && m.to == to)
                else {
                    return Ok(Reply::Done);
                };
                let mv = self.moves.remove(i);
                if let Some(record) = self.hubs.values_mut().find(|h| h.id == hub)
                    && let Some(replicas) = record.replicas.get_mut(usize::from(partition))
                {
                    *replicas = mv.target(replicas);
                    record.moved.insert(partition);
                }
                Ok(Reply::Done)
            }
            Command::AbortMove { hub, partition, to } => {
                self.moves
                    .retain(|m| !(m.hub == hub && m.partition == partition && m.to == to));
                Ok(Reply::Done)
            }
            Command::SetPreferredLeaders(changes) => {
                for (hub, partition, node) in changes {
                    if let Some(record) = self.hubs.values_mut().find(|h| h.id == hub)
                        && let Some(replicas) = record.replicas.get_mut(usize::from(partition))
                        && let Some(i) = replicas.iter().position(|r| *r == node)
                    {
                        replicas[..=i].rotate_right(1);
                    }
                }
                Ok(Reply::Done)
            }
            Command::RegisterNode(mut node) => {
                match self.nodes.get(&node.id) {
                    Some(known) if known.data_id == node.data_id => {
                        node.incarnation = known.incarnation;
                        node.incarnation_version = known.incarnation_version;
                        node.draining = known.draining;
                        node.decommissioning = known.decommissioning;
                    }
                    Some(known) => {
                        // The node lost its data: its replicas come back as new members.
                        node.incarnation = known.incarnation + 1;
                        node.incarnation_version = self.version;
                    }
                    None => {
                        node.incarnation = 0;
                        node.incarnation_version = self.version;
                    }
                }
                if node.incarnation > u32::from(u16::MAX) {
                    return Err(err(
                        ErrorKind::QuotaExceeded,
                        format!(
                            "node {} has re-joined with new data too many times; give it a new --node-id",
                            node.id
                        ),
                    ));
                }
                self.nodes.insert(node.id, node);
                Ok(Reply::Done)
            }
            Command::CreateHub(hub) => self.create_hub(hub),
            Command::SetThroughputUnits {
                hub,
                throughput_units,
            } => {
                self.check_reservation(Some(&hub), throughput_units)?;
                let record = self.hubs.get_mut(&hub).ok_or_else(|| hub_not_found(&hub))?;
                record.throughput_units = throughput_units;
                Ok(Reply::Hub(record.clone()))
            }
            Command::UpdateHub { hub, update } => {
                if let Some(units) = update.throughput_units {
                    self.check_reservation(Some(&hub), units)?;
                }
                let record = self.hubs.get(&hub).ok_or_else(|| hub_not_found(&hub))?;
                let mut settings = record.settings.clone();
                let mut retention_ms = record.retention_ms;
                if let Some(value) = update.retention_ms {
                    check_retention(value)?;
                    retention_ms = value;
                }
                if let Some(policy) = update.cleanup_policy {
                    settings.cleanup_policy = policy;
                }
                if let Some(value) = update.tombstone_retention_ms {
                    settings.tombstone_retention_ms = value;
                }
                if let Some(value) = update.compaction_lag_ms {
                    settings.compaction_lag_ms = value;
                }
                if let Some(value) = update.retention_bytes_max {
                    settings.retention_bytes_max = value;
                }
                if let Some(capture) = update.capture {
                    // Changing an enabled capture's settings keeps its start: events
                    // enqueued since are still captured.
                    let enabled_at_ms = settings.capture.as_ref().map(|c| c.enabled_at_ms);
                    settings.capture = capture.map(|mut capture| {
                        if let Some(enabled_at_ms) = enabled_at_ms {
                            capture.enabled_at_ms = enabled_at_ms;
                        }
                        capture
                    });
                }
                check_settings(&settings)?;
                let record = self.hubs.get_mut(&hub).expect("looked up above");
                if let Some(units) = update.throughput_units {
                    record.throughput_units = units;
                }
                record.retention_ms = retention_ms;
                record.settings = settings;
                Ok(Reply::Hub(record.clone()))
            }
            Command::DeleteHub { name } => {
                let hub = self
                    .hubs
                    .remove(&name)
                    .ok_or_else(|| hub_not_found(&name))?;
                self.moves.retain(|m| m.hub != hub.id);
                Ok(Reply::Done)
            }
            Command::CreateConsumerGroup { hub, name, now_ms } => {
                validate_consumer_group_name(&name)
                    .map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
                let record = self.hubs.get_mut(&hub).ok_or_else(|| hub_not_found(&hub))?;
                if record.consumer_groups.contains_key(&name) {
                    return Err(err(
                        ErrorKind::AlreadyExists,
                        format!("consumer group '{name}' already exists in event hub '{hub}'"),
                    ));
                }
                if record.consumer_groups.len() >= CONSUMER_GROUPS_PER_HUB_MAX {
                    return Err(err(
                        ErrorKind::QuotaExceeded,
                        format!(
                            "event hub '{hub}' already has the maximum of {CONSUMER_GROUPS_PER_HUB_MAX} consumer groups"
                        ),
                    ));
                }
                record.consumer_groups.insert(name, now_ms);
                Ok(Reply::ConsumerGroupCreated {
                    created_at_ms: now_ms,
                })
            }
            Command::Rule(command) => self.apply_rule(command),
            Command::SetFeatureLevel { level, release } => {
                if level > self.feature.level {
                    self.feature = ClusterFeature { level, release };
                }
                Ok(Reply::Done)
            }
            Command::Store(_) => Err(err(
                ErrorKind::InvalidArgument,
                "checkpoint store operations apply to the consumer store",
            )),
            Command::DeleteConsumerGroup { hub, name } => {
                if name == DEFAULT_CONSUMER_GROUP {
                    return Err(err(
                        ErrorKind::InvalidArgument,
                        "the $Default consumer group always exists and cannot be deleted",
                    ));
                }
                let record = self.hubs.get_mut(&hub).ok_or_else(|| hub_not_found(&hub))?;
                if record.consumer_groups.remove(&name).is_none() {
                    return Err(err(
                        ErrorKind::NotFound,
                        format!("consumer group '{name}' does not exist in event hub '{hub}'"),
                    ));
                }
                Ok(Reply::Done)
            }
        }
    }

    fn create_hub(&mut self, hub: NewHub) -> Result<Reply, CommandError> {
        let NewHub {
            name,
            partition_count,
            retention_ms,
            replication_factor,
            partitions_max,
            now_ms,
            down_nodes,
            throughput_units,
            settings,
        } = hub;
        validate_hub_name(&name).map_err(|e| err(ErrorKind::InvalidArgument, e.to_string()))?;
        if partition_count == 0 || partition_count > u32::from(partitions_max) {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "an event hub needs between 1 and {partitions_max} partitions; {partition_count} were requested"
                ),
            ));
        }
        check_retention(retention_ms)?;
        check_settings(&settings)?;
        let nodes: Vec<u64> = self
            .nodes
            .values()
            .filter(|n| !down_nodes.contains(&n.id) && !n.decommissioning)
            .map(|n| n.id)
            .collect();
        let down: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|n| down_nodes.contains(n))
            .collect();
        let replication_factor = match replication_factor {
            None => REPLICATION_FACTOR_DEFAULT.min(nodes.len().max(1) as u8),
            Some(rf) if !(1..=REPLICATION_FACTOR_MAX).contains(&rf) => {
                return Err(err(
                    ErrorKind::InvalidArgument,
                    format!(
                        "the replication factor must be between 1 and {REPLICATION_FACTOR_MAX}; {rf} was requested"
                    ),
                ));
            }
            Some(rf) => rf,
        };
        if usize::from(replication_factor) > nodes.len() {
            let down = if down.is_empty() {
                String::new()
            } else {
                format!(" (down: nodes {down:?})")
            };
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "replication factor {replication_factor} needs at least {replication_factor} live nodes; {} of the cluster's {} nodes are up{down}. Use a smaller --replication-factor or start more nodes",
                    nodes.len(),
                    self.nodes.len()
                ),
            ));
        }
        if self.hubs.contains_key(&name) {
            return Err(err(
                ErrorKind::AlreadyExists,
                format!("an event hub named '{name}' already exists"),
            ));
        }
        self.check_reservation(None, throughput_units)?;
        self.next_hub_id = self.next_hub_id.max(1);
        let id = HubId(self.next_hub_id);
        self.next_hub_id += 1;
        // Capacity-aware: replicas and preferred leaders per capacity unit even out over
        // the nodes that may hold them, and replicas of a partition spread over zones.
        let replicas = planner::place_new(
            &planner_nodes(self, &down),
            &planner_partitions(self),
            replication_factor,
            partition_count as usize,
        );
        let record = HubRecord {
            id,
            name: name.clone(),
            partition_count: partition_count as u16,
            retention_ms,
            created_at_ms: now_ms,
            replication_factor,
            consumer_groups: BTreeMap::from([(DEFAULT_CONSUMER_GROUP.to_string(), now_ms)]),
            created_version: self.version,
            throughput_units,
            founders: replicas
                .iter()
                .map(|set| {
                    set.iter()
                        .filter_map(|n| self.nodes.get(n).map(NodeRecord::member))
                        .collect()
                })
                .collect(),
            replicas,
            moved: BTreeSet::new(),
            joins: BTreeMap::new(),
            settings,
            rules: Vec::new(),
        };
        self.hubs.insert(name, record.clone());
        Ok(Reply::Hub(record))
    }
}

impl ClusterState {
    /// Whether `mv` can start now: its partition exists and is not moving, `from` (if any)
    /// holds a replica and `to` is a registered node that holds none.
    fn move_fits(&self, mv: &ReplicaMove) -> bool {
        let Some(hub) = self.hub_by_id(mv.hub) else {
            return false;
        };
        let Some(replicas) = hub.replicas.get(usize::from(mv.partition)) else {
            return false;
        };
        // Member ids have 16 bits for the incarnation.
        let ids_left = self
            .nodes
            .get(&mv.to)
            .is_some_and(|n| hub.member_incarnation(mv.partition, n) < u32::from(u16::MAX));
        ids_left
            && !self
                .moves
                .iter()
                .any(|m| m.hub == mv.hub && m.partition == mv.partition)
            && mv.from.is_none_or(|f| replicas.contains(&f))
            && !replicas.contains(&mv.to)
            && self.nodes.contains_key(&mv.to)
    }

    /// The hub with this id.
    pub fn hub_by_id(&self, id: HubId) -> Option<&HubRecord> {
        self.hubs.values().find(|h| h.id == id)
    }

    /// The name of the hub with this id ("" when it is gone).
    pub fn hub_name(&self, id: HubId) -> String {
        self.hub_by_id(id)
            .map(|h| h.name.clone())
            .unwrap_or_default()
    }

    /// A partition's replica set (preferred leader first).
    pub fn replicas_of(&self, hub: HubId, partition: u16) -> Option<&Vec<u64>> {
        self.hub_by_id(hub)
            .and_then(|h| h.replicas.get(usize::from(partition)))
    }

    /// The Raft member id `node`'s replica of a partition runs as (None: unknown node).
    pub fn replica_member(&self, hub: &HubRecord, partition: u16, node: u64) -> Option<u64> {
        self.nodes
            .get(&node)
            .map(|n| tributary_raft::member_id(n.id, hub.member_incarnation(partition, n)))
    }

    /// [`ClusterState::replica_member`] for a hub known by id.
    pub fn replica_member_by_id(&self, hub: HubId, partition: u16, node: u64) -> Option<u64> {
        self.hub_by_id(hub)
            .and_then(|h| self.replica_member(h, partition, node))
    }

    /// Partition replicas assigned to `node`, with the moves under way to it.
    pub fn replicas_on(&self, node: u64) -> usize {
        let assigned = self
            .hubs
            .values()
            .flat_map(|h| h.replicas.iter())
            .filter(|r| r.contains(&node))
            .count();
        assigned + self.moves.iter().filter(|m| m.to == node).count()
    }

    /// The move under way for a partition, if any.
    pub fn move_of(&self, hub: HubId, partition: u16) -> Option<&ReplicaMove> {
        self.moves
            .iter()
            .find(|m| m.hub == hub && m.partition == partition)
    }

    /// Throughput units the cluster can reserve: [`THROUGHPUT_UNITS_PER_CAPACITY_UNIT`]
    /// per capacity unit of its nodes.
    pub fn throughput_capacity(&self) -> u64 {
        self.nodes
            .values()
            .map(|n| u64::from(n.capacity_units) * THROUGHPUT_UNITS_PER_CAPACITY_UNIT)
            .sum()
    }

    /// Refuses a reservation of `throughput_units` for `hub` (None: a new hub) that would
    /// take the cluster's reservations past its capacity.
    fn check_reservation(
        &self,
        hub: Option<&str>,
        throughput_units: u32,
    ) -> Result<(), CommandError> {
        if throughput_units > THROUGHPUT_UNITS_PER_HUB_MAX {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "an event hub reserves at most {THROUGHPUT_UNITS_PER_HUB_MAX} throughput units; {throughput_units} were requested"
                ),
            ));
        }
        let others: u64 = self
            .hubs
            .values()
            .filter(|h| Some(h.name.as_str()) != hub)
            .map(|h| u64::from(h.throughput_units))
            .sum();
        let capacity = self.throughput_capacity();
        if others + u64::from(throughput_units) > capacity {
            return Err(err(
                ErrorKind::QuotaExceeded,
                format!(
                    "reserving {throughput_units} throughput units would exceed the cluster's capacity: {capacity} units ({THROUGHPUT_UNITS_PER_CAPACITY_UNIT} per node capacity unit), {others} already reserved by other event hubs. Reserve fewer or add capacity"
                ),
            ));
        }
        Ok(())
    }
}

/// The planner's picture of the nodes: decommissioning nodes and `down` nodes (found not
/// answering) hold no new replicas.
pub fn planner_nodes(state: &ClusterState, down: &[u64]) -> Vec<planner::PlannerNode> {
    state
        .nodes
        .values()
        .map(|n| planner::PlannerNode {
            id: n.id,
            capacity_units: n.capacity_units.max(1),
            zone: n.zone.clone(),
            state: if n.decommissioning {
                planner::NodeState::Decommissioning
            } else if down.contains(&n.id) {
                planner::NodeState::Dead
            } else {
                // A draining node keeps its place as preferred leader: the partition
                // leaders move leadership off it while it drains and back afterwards.
                planner::NodeState::Up
            },
        })
        .collect()
}

/// The planner's picture of the partitions, each led by its preferred replica (the
/// partitions' leaders follow their preferred replica; see `Broker::move_leadership`) and
/// with every other replica counted as caught up.
pub fn planner_partitions(state: &ClusterState) -> Vec<planner::PlannerPartition> {
    state
        .hubs
        .values()
        .flat_map(|hub| {
            hub.replicas
                .iter()
                .enumerate()
                .map(|(p, replicas)| planner::PlannerPartition {
                    id: planner::PartitionRef {
                        hub: hub.id,
                        partition: tributary_types::PartitionId(p as u16),
                    },
                    replication_factor: hub.replication_factor,
                    weight: hub.partition_weight(),
                    replicas: replicas.clone(),
                    leader: replicas.first().copied(),
                    caught_up: replicas.iter().skip(1).copied().collect(),
                    last_moved_ms: None,
                })
        })
        .collect()
}

/// A cluster state with nodes 1..=`nodes` registered (one CU each, no zones), for tests
/// (feature `test-util` for other crates' tests).
#[cfg(any(test, feature = "test-util"))]
pub fn test_cluster(nodes: u64) -> ClusterState {
    let mut state = ClusterState::default();
    for id in 1..=nodes {
        test_register(&mut state, id);
    }
    state
}

/// Node `id` registers (joins) with one CU and no zone, for tests.
#[cfg(any(test, feature = "test-util"))]
pub fn test_register(state: &mut ClusterState, id: u64) {
    state
        .apply(Command::RegisterNode(NodeRecord::new(
            id,
            format!("c{id}"),
            format!("p{id}"),
            100 + id,
        )))
        .unwrap();
}

/// Creates hub "h" with `partitions` partitions of `rf` replicas (a day's retention, no
/// throughput units), for tests.
#[cfg(any(test, feature = "test-util"))]
pub fn test_create_hub(state: &mut ClusterState, partitions: u32, rf: u8) -> HubRecord {
    let Ok(Reply::Hub(hub)) = state.apply(Command::CreateHub(NewHub {
        name: "h".into(),
        partition_count: partitions,
        retention_ms: 24 * 3600 * 1000,
        replication_factor: Some(rf),
        partitions_max: 1024,
        now_ms: 0,
        down_nodes: Vec::new(),
        throughput_units: 0,
        settings: Default::default(),
    })) else {
        panic!("hub h is created");
    };
    hub
}

/// The shortest retention the controller accepts. Nodes refuse anything below their
/// operator's floor (`--retention-min`, 1 hour unless set lower) before proposing; this
/// bound only keeps the state sane.
pub const RETENTION_FLOOR_MS: u64 = 1000;

fn check_retention(retention_ms: u64) -> Result<(), CommandError> {
    let retention = std::time::Duration::from_millis(retention_ms);
    if retention_ms < RETENTION_FLOOR_MS || retention > RETENTION_MAX {
        return Err(err(
            ErrorKind::InvalidArgument,
            format!(
                "retention must be between 1s and 90d; {} was requested",
                humantime::format_duration(retention)
            ),
        ));
    }
    Ok(())
}

fn check_settings(settings: &HubSettings) -> Result<(), CommandError> {
    let max = RETENTION_MAX.as_millis() as u64;
    for (name, value) in [
        ("tombstone retention", settings.tombstone_retention_ms),
        ("compaction lag", settings.compaction_lag_ms),
    ] {
        if value > max {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "the {name} must be at most 90d; {} was requested",
                    humantime::format_duration(std::time::Duration::from_millis(value))
                ),
            ));
        }
    }
    if let Some(capture) = &settings.capture {
        check_capture(capture)?;
    }
    Ok(())
}

fn check_capture(capture: &CaptureSettings) -> Result<(), CommandError> {
    let invalid = |message: String| Err(err(ErrorKind::InvalidArgument, message));
    let duration = |ms: u64| humantime::format_duration(std::time::Duration::from_millis(ms));
    if !(CAPTURE_WINDOW_MIN_MS..=CAPTURE_WINDOW_MAX_MS).contains(&capture.window_ms) {
        return invalid(format!(
            "the capture time window must be between {} and {}; {} was requested",
            duration(CAPTURE_WINDOW_MIN_MS),
            duration(CAPTURE_WINDOW_MAX_MS),
            duration(capture.window_ms)
        ));
    }
    if !(CAPTURE_WINDOW_MIN_BYTES..=CAPTURE_WINDOW_MAX_BYTES).contains(&capture.window_bytes) {
        return invalid(format!(
            "the capture size window must be between {CAPTURE_WINDOW_MIN_BYTES} bytes (1 KiB) \
             and {CAPTURE_WINDOW_MAX_BYTES} bytes (500 MiB); {} bytes were requested",
            capture.window_bytes
        ));
    }
    let namespace = &capture.namespace;
    let well_formed = !namespace.is_empty()
        && namespace.chars().count() <= CAPTURE_NAMESPACE_MAX_CHARS
        && namespace
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && namespace != "."
        && namespace != "..";
    if !well_formed {
        return invalid(format!(
            "invalid capture namespace {namespace:?}: it names the first folder of every capture \
             file, so use 1 to {CAPTURE_NAMESPACE_MAX_CHARS} letters, digits, '-', '_' or '.'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(nodes: u64) -> ClusterState {
        test_cluster(nodes)
    }

    fn create(
        state: &mut ClusterState,
        name: &str,
        partitions: u32,
        rf: Option<u8>,
    ) -> Result<Reply, CommandError> {
        state.apply(Command::CreateHub(NewHub {
            name: name.into(),
            partition_count: partitions,
            retention_ms: 24 * 3600 * 1000,
            replication_factor: rf,
            partitions_max: 1024,
            now_ms: 5,
            down_nodes: Vec::new(),
            throughput_units: 0,
            settings: Default::default(),
        }))
    }

    #[test]
    fn replicas_are_spread_evenly_and_distinct() {
        let mut state = cluster(5);
        let Reply::Hub(hub) = create(&mut state, "h", 10, Some(3)).unwrap() else {
            panic!("hub expected");
        };
        let mut per_node = BTreeMap::<u64, usize>::new();
        let mut leaders = BTreeMap::<u64, usize>::new();
        for replicas in &hub.replicas {
            let mut distinct = replicas.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 3);
            for r in replicas {
                *per_node.entry(*r).or_default() += 1;
            }
            *leaders.entry(replicas[0]).or_default() += 1;
        }
        assert!(per_node.values().all(|n| *n == 6));
        assert!(leaders.values().all(|n| *n == 2));
    }

    #[test]
    fn replication_factor_defaults_to_three_capped_by_nodes_and_is_checked() {
        let mut one = cluster(1);
        let Reply::Hub(hub) = create(&mut one, "a", 2, None).unwrap() else {
            panic!()
        };
        assert_eq!(hub.replication_factor, 1);
        let err = create(&mut one, "b", 2, Some(3)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(
            err.message.contains("1 of the cluster's 1 nodes are up"),
            "{}",
            err.message
        );
        let mut four = cluster(4);
        let Reply::Hub(hub) = create(&mut four, "a", 2, None).unwrap() else {
            panic!()
        };
        assert_eq!(hub.replication_factor, 3);
        assert_eq!(
            create(&mut four, "z", 1, Some(6)).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        assert_eq!(
            create(&mut four, "z", 1, Some(0)).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn a_node_with_new_data_gets_a_new_incarnation() {
        let mut state = cluster(3);
        let before = state.nodes[&2].clone();
        assert_eq!(before.incarnation, 0);
        // A restart with the same data keeps the incarnation (and so its Raft members).
        state
            .apply(Command::RegisterNode(NodeRecord::new(
                2,
                "c2".into(),
                "p2".into(),
                102,
            )))
            .unwrap();
        assert_eq!(state.nodes[&2], before);
        create(&mut state, "old", 1, None).unwrap();
        // Its data directory was wiped: a new data id.
        state
            .apply(Command::RegisterNode(NodeRecord::new(
                2,
                "c2".into(),
                "p2".into(),
                999,
            )))
            .unwrap();
        let after = state.nodes[&2].clone();
        assert_eq!(after.incarnation, 1);
        assert_ne!(after.member(), before.member());
        assert_eq!(tributary_raft::member_node(after.member()).0, 2);
        // Hubs created before the wipe are older than the incarnation, later ones newer.
        assert!(state.hubs["old"].created_version < after.incarnation_version);
        let Reply::Hub(new) = create(&mut state, "new", 1, None).unwrap() else {
            panic!()
        };
        assert!(new.created_version > after.incarnation_version);
        // Retried registration of the same data is idempotent.
        let again = state.nodes[&2].clone();
        state
            .apply(Command::RegisterNode(NodeRecord::new(
                2,
                "c2".into(),
                "p2".into(),
                999,
            )))
            .unwrap();
        assert_eq!(state.nodes[&2], again);
    }

    #[test]
    fn replicas_go_to_live_nodes_only() {
        let mut state = cluster(4);
        let mut command = |rf: u8, down: Vec<u64>| {
            state.apply(Command::CreateHub(NewHub {
                name: format!("h{rf}{}", down.len()),
                partition_count: 8,
                retention_ms: 24 * 3600 * 1000,
                replication_factor: Some(rf),
                partitions_max: 1024,
                now_ms: 5,
                down_nodes: down,
                throughput_units: 0,
                settings: Default::default(),
            }))
        };
        let err = command(3, vec![2, 3]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(
            err.message
                .contains("2 of the cluster's 4 nodes are up (down: nodes [2, 3])"),
            "{}",
            err.message
        );
        let Reply::Hub(hub) = command(3, vec![3]).unwrap() else {
            panic!()
        };
        assert!(hub.replicas.iter().flatten().all(|n| *n != 3));
    }

    #[test]
    fn throughput_reservations_stay_within_capacity() {
        let mut state = cluster(2); // 2 CUs: 20 TUs
        let new = |name: &str, tu: u32| {
            Command::CreateHub(NewHub {
                name: name.into(),
                partition_count: 2,
                retention_ms: 24 * 3600 * 1000,
                replication_factor: Some(1),
                partitions_max: 1024,
                now_ms: 1,
                down_nodes: Vec::new(),
                throughput_units: tu,
                settings: Default::default(),
            })
        };
        state.apply(new("a", 12)).unwrap();
        let err = state.apply(new("b", 9)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::QuotaExceeded);
        assert!(
            err.message.contains("capacity: 20 units"),
            "{}",
            err.message
        );
        assert!(
            err.message.contains("12 already reserved"),
            "{}",
            err.message
        );
        state.apply(new("b", 8)).unwrap();
        // Changing a hub's own reservation does not count its old one twice.
        let set = |hub: &str, tu: u32| Command::UpdateHub {
            hub: hub.into(),
            update: HubUpdate {
                throughput_units: Some(tu),
                ..HubUpdate::default()
            },
        };
        let Reply::Hub(hub) = state.apply(set("a", 12)).unwrap() else {
            panic!()
        };
        assert_eq!(hub.throughput_units, 12);
        assert_eq!(
            state.apply(set("a", 13)).unwrap_err().kind,
            ErrorKind::QuotaExceeded
        );
        state.apply(set("a", 2)).unwrap();
        assert_eq!(state.hubs["a"].throughput_units, 2);
        assert_eq!(
            state.apply(set("zz", 1)).unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            state.apply(set("a", 41)).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }

    fn hub(state: &ClusterState, name: &str) -> HubRecord {
        state.hubs[name].clone()
    }

    #[test]
    fn hub_updates_change_only_the_settings_given_and_refuse_bad_ones() {
        let mut state = cluster(1);
        state
            .apply(Command::CreateHub(NewHub {
                name: "h".into(),
                partition_count: 1,
                retention_ms: 24 * 3600 * 1000,
                replication_factor: Some(1),
                partitions_max: 1024,
                now_ms: 1,
                down_nodes: Vec::new(),
                throughput_units: 1,
                settings: HubSettings::default(),
            }))
            .unwrap();
        let update = |update: HubUpdate| Command::UpdateHub {
            hub: "h".into(),
            update,
        };
        let Reply::Hub(record) = state
            .apply(update(HubUpdate {
                retention_ms: Some(3_600_000),
                cleanup_policy: Some(CleanupPolicy::DeleteOrCompact),
                compaction_lag_ms: Some(60_000),
                ..HubUpdate::default()
            }))
            .unwrap()
        else {
            panic!("an update replies with the hub")
        };
        assert_eq!(record.retention_ms, 3_600_000);
        assert_eq!(record.throughput_units, 1, "not given: unchanged");
        assert_eq!(
            record.settings,
            HubSettings {
                cleanup_policy: CleanupPolicy::DeleteOrCompact,
                compaction_lag_ms: 60_000,
                ..HubSettings::default()
            }
        );
        assert_eq!(hub(&state, "h"), record);
        // A refused update changes nothing, not even the settings given with it that were
        // fine.
        let err = state
            .apply(update(HubUpdate {
                retention_ms: Some(91 * 24 * 3_600_000),
                cleanup_policy: Some(CleanupPolicy::Compact),
                ..HubUpdate::default()
            }))
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains("retention"), "{}", err.message);
        let err = state
            .apply(update(HubUpdate {
                tombstone_retention_ms: Some(91 * 24 * 3_600_000),
                cleanup_policy: Some(CleanupPolicy::Compact),
                ..HubUpdate::default()
            }))
            .unwrap_err();
        assert!(
            err.message.contains("tombstone retention"),
            "{}",
            err.message
        );
        assert_eq!(hub(&state, "h"), record);
        let err = state
            .apply(Command::UpdateHub {
                hub: "nope".into(),
                update: HubUpdate::default(),
            })
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
    }

    fn mv(hub: HubId, partition: u16, from: Option<u64>, to: u64) -> ReplicaMove {
        ReplicaMove {
            hub,
            partition,
            from,
            to,
            started_ms: 7,
        }
    }

    #[test]
    fn replica_moves_start_once_per_partition_then_finish_or_abort() {
        let mut state = cluster(4);
        create(&mut state, "h", 2, Some(3)).unwrap();
        let h = hub(&state, "h");
        let before = h.replicas.clone();
        let outside = |p: usize| (1..=4).find(|n| !before[p].contains(n)).unwrap();
        let first = before[0][0];
        state
            .apply(Command::StartMoves(vec![
                mv(h.id, 0, Some(first), outside(0)),
                // A second move of the same partition waits for the first.
                mv(h.id, 0, Some(before[0][1]), outside(0)),
                // `from` holds no replica: skipped.
                mv(h.id, 1, Some(outside(1)), outside(1)),
                // `to` already holds one: skipped.
                mv(h.id, 1, None, before[1][1]),
                // Unknown node: skipped.
                mv(h.id, 1, Some(before[1][0]), 99),
            ]))
            .unwrap();
        assert_eq!(state.moves, vec![mv(h.id, 0, Some(first), outside(0))]);
        // The replica set is unchanged until the move finishes.
        assert_eq!(hub(&state, "h").replicas, before);
        assert!(state.move_of(h.id, 0).is_some() && state.move_of(h.id, 1).is_none());
        state
            .apply(Command::FinishMove {
                hub: h.id,
                partition: 0,
                to: outside(0),
            })
            .unwrap();
        let after = hub(&state, "h");
        // The new replica takes the old one's place (here: preferred leader).
        assert_eq!(after.replicas[0][0], outside(0));
        assert_eq!(&after.replicas[0][1..], &before[0][1..]);
        assert!(after.moved.contains(&0) && !after.moved.contains(&1));
        assert!(state.moves.is_empty());

        state
            .apply(Command::StartMoves(vec![mv(h.id, 1, None, outside(1))]))
            .unwrap();
        // Aborting another target does nothing; aborting this one leaves the set as it was.
        state
            .apply(Command::AbortMove {
                hub: h.id,
                partition: 1,
                to: 42,
            })
            .unwrap();
        assert_eq!(state.moves.len(), 1);
        state
            .apply(Command::AbortMove {
                hub: h.id,
                partition: 1,
                to: outside(1),
            })
            .unwrap();
        assert!(state.moves.is_empty());
        assert_eq!(hub(&state, "h").replicas[1], before[1]);
        assert!(!hub(&state, "h").moved.contains(&1));

        // Deleting a hub ends its moves.
        state
            .apply(Command::StartMoves(vec![mv(h.id, 1, None, outside(1))]))
            .unwrap();
        state
            .apply(Command::DeleteHub { name: "h".into() })
            .unwrap();
        assert!(state.moves.is_empty());
    }

    #[test]
    fn a_replica_added_again_to_a_node_is_a_new_member() {
        let mut state = cluster(4);
        create(&mut state, "h", 1, Some(3)).unwrap();
        let h = hub(&state, "h");
        let start = h.replicas[0].clone();
        let spare = (1..=4).find(|n| !start.contains(n)).unwrap();
        let member = |state: &ClusterState, node| state.replica_member_by_id(h.id, 0, node);
        assert_eq!(
            member(&state, spare),
            Some(tributary_raft::member_id(spare, 0))
        );
        // Every member id each node has had so far.
        let mut seen: Vec<u64> = (1..=4).map(|n| member(&state, n).unwrap()).collect();
        let mut fresh = |state: &ClusterState, node| {
            let m = member(state, node).unwrap();
            assert!(!seen.contains(&m), "member {m} of node {node} used before");
            assert_eq!(tributary_raft::member_node(m).0, node);
            seen.push(m);
        };
        let move_to_spare = Command::StartMoves(vec![mv(h.id, 0, Some(start[0]), spare)]);
        // A move to the spare node: its replica is a member it never was.
        state.apply(move_to_spare.clone()).unwrap();
        fresh(&state, spare);
        let moved_in = member(&state, spare).unwrap();
        // Rolled back and started again: another new member.
        state
            .apply(Command::AbortMove {
                hub: h.id,
                partition: 0,
                to: spare,
            })
            .unwrap();
        state.apply(move_to_spare).unwrap();
        fresh(&state, spare);
        let moved_in_again = member(&state, spare).unwrap();
        assert!(
            tributary_raft::member_incarnation(moved_in_again)
                > tributary_raft::member_incarnation(moved_in)
        );
        // Finishing the move keeps the member that was brought in.
        state
            .apply(Command::FinishMove {
                hub: h.id,
                partition: 0,
                to: spare,
            })
            .unwrap();
        assert_eq!(member(&state, spare), Some(moved_in_again));
        // The node that left and comes back is a new member too, and so is every replica of
        // a node that lost its data; the other replicas keep theirs.
        let stays = start[1];
        let kept = member(&state, stays).unwrap();
        state
            .apply(Command::StartMoves(vec![mv(
                h.id,
                0,
                Some(spare),
                start[0],
            )]))
            .unwrap();
        fresh(&state, start[0]);
        assert_eq!(member(&state, stays), Some(kept));
        let mut wiped = state.nodes[&start[0]].clone();
        wiped.data_id += 1;
        state.apply(Command::RegisterNode(wiped)).unwrap();
        fresh(&state, start[0]);
        assert_eq!(member(&state, stays), Some(kept));
    }

    #[test]
    fn moves_stop_when_a_node_has_used_up_its_member_ids() {
        let mut state = cluster(4);
        create(&mut state, "h", 1, Some(3)).unwrap();
        let h = hub(&state, "h");
        let spare = (1..=4).find(|n| !h.replicas[0].contains(n)).unwrap();
        state
            .hubs
            .get_mut("h")
            .unwrap()
            .joins
            .insert(0, BTreeMap::from([(spare, u32::from(u16::MAX))]));
        state
            .apply(Command::StartMoves(vec![mv(h.id, 0, None, spare)]))
            .unwrap();
        assert!(state.moves.is_empty());
    }

    #[test]
    fn move_targets_append_or_replace_in_place() {
        let m = mv(HubId(1), 0, Some(2), 9);
        assert_eq!(m.target(&[1, 2, 3]), vec![1, 9, 3]);
        assert_eq!(mv(HubId(1), 0, None, 9).target(&[1, 2]), vec![1, 2, 9]);
        // A source that already left: the target is added.
        assert_eq!(mv(HubId(1), 0, Some(7), 9).target(&[1, 2]), vec![1, 2, 9]);
    }

    #[test]
    fn preferred_leaders_move_to_the_front() {
        let mut state = cluster(3);
        create(&mut state, "h", 1, Some(3)).unwrap();
        let h = hub(&state, "h");
        let [a, b, c] = <[u64; 3]>::try_from(h.replicas[0].clone()).unwrap();
        state
            .apply(Command::SetPreferredLeaders(vec![
                (h.id, 0, c),
                // Not a replica, or no such partition: ignored.
                (h.id, 0, 77),
                (h.id, 5, a),
            ]))
            .unwrap();
        assert_eq!(hub(&state, "h").replicas[0], vec![c, a, b]);
    }

    #[test]
    fn decommissioning_nodes_take_no_new_replicas_and_stay_decommissioning() {
        let mut state = cluster(4);
        state
            .apply(Command::SetDecommissioning {
                node: 4,
                decommissioning: true,
            })
            .unwrap();
        state
            .apply(Command::RegisterNode(NodeRecord::new(
                4,
                "c4".into(),
                "p4".into(),
                104,
            )))
            .unwrap();
        assert!(state.nodes[&4].decommissioning);
        let Reply::Hub(h) = create(&mut state, "h", 12, Some(3)).unwrap() else {
            panic!("hub expected");
        };
        assert!(
            h.replicas.iter().all(|r| !r.contains(&4)),
            "{:?}",
            h.replicas
        );
        // Three nodes are left: RF 4 no longer fits.
        let err = create(&mut state, "big", 1, Some(4)).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        let err = state
            .apply(Command::SetDecommissioning {
                node: 9,
                decommissioning: true,
            })
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
    }

    #[test]
    fn new_hubs_spread_replicas_and_leaders_by_capacity_units() {
        let mut state = ClusterState::default();
        for (id, cu) in [(1, 1), (2, 1), (3, 2)] {
            state
                .apply(Command::RegisterNode(NodeRecord {
                    capacity_units: cu,
                    ..NodeRecord::new(id, format!("c{id}"), format!("p{id}"), 100 + id)
                }))
                .unwrap();
        }
        let Reply::Hub(h) = create(&mut state, "h", 16, Some(2)).unwrap() else {
            panic!("hub expected");
        };
        let count = |n: u64| h.replicas.iter().filter(|r| r.contains(&n)).count();
        let leads = |n: u64| h.replicas.iter().filter(|r| r[0] == n).count();
        // 32 replicas over 4 CUs: 8 per CU; 16 leaders: 4 per CU.
        assert_eq!((count(1), count(2), count(3)), (8, 8, 16));
        assert_eq!((leads(1), leads(2), leads(3)), (4, 4, 8));
    }

    #[test]
    fn draining_is_remembered_across_registrations_and_unknown_nodes_are_refused() {
        let mut state = cluster(3);
        state
            .apply(Command::SetDraining {
                node: 2,
                draining: true,
            })
            .unwrap();
        // A restart (same data) keeps the node drained.
        state
            .apply(Command::RegisterNode(NodeRecord::new(
                2,
                "c2".into(),
                "p2".into(),
                102,
            )))
            .unwrap();
        assert!(state.nodes[&2].draining);
        let err = state
            .apply(Command::SetDraining {
                node: 9,
                draining: true,
            })
            .unwrap_err();
        assert_eq!(err.kind, ErrorKind::NotFound);
        assert!(err.message.contains("node 9 is not part of this cluster"));
    }

    #[test]
    fn hub_ids_are_never_reused() {
        let mut state = cluster(1);
        let Reply::Hub(first) = create(&mut state, "a", 1, None).unwrap() else {
            panic!()
        };
        state
            .apply(Command::DeleteHub { name: "a".into() })
            .unwrap();
        let Reply::Hub(second) = create(&mut state, "a", 1, None).unwrap() else {
            panic!()
        };
        assert!(second.id > first.id);
        assert_eq!(
            create(&mut state, "a", 1, None).unwrap_err().kind,
            ErrorKind::AlreadyExists
        );
    }

    #[test]
    fn consumer_groups() {
        let mut state = cluster(1);
        create(&mut state, "a", 1, None).unwrap();
        let group = |name: &str| Command::CreateConsumerGroup {
            hub: "a".into(),
            name: name.into(),
            now_ms: 9,
        };
        state.apply(group("g")).unwrap();
        assert_eq!(
            state.apply(group("g")).unwrap_err().kind,
            ErrorKind::AlreadyExists
        );
        assert_eq!(
            state.apply(group("bad name")).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        let delete = |name: &str| Command::DeleteConsumerGroup {
            hub: "a".into(),
            name: name.into(),
        };
        assert_eq!(
            state.apply(delete("$Default")).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        state.apply(delete("g")).unwrap();
        assert_eq!(
            state.apply(delete("g")).unwrap_err().kind,
            ErrorKind::NotFound
        );
    }

    #[test]
    fn capture_is_enabled_changed_and_disabled_keeping_its_start() {
        let mut state = cluster(3);
        create(&mut state, "h", 2, None).unwrap();
        let settings = |window_ms: u64, enabled_at_ms: i64| CaptureSettings {
            destination: CaptureDestination::Directory {
                path: "/var/lib/capture".into(),
            },
            window_ms,
            window_bytes: 4096,
            namespace: "ns".into(),
            enabled_at_ms,
        };
        let update = |capture: Option<Option<CaptureSettings>>| Command::UpdateHub {
            hub: "h".into(),
            update: HubUpdate {
                capture,
                ..HubUpdate::default()
            },
        };
        state
            .apply(update(Some(Some(settings(2000, 100)))))
            .unwrap();
        assert_eq!(state.hubs["h"].settings.capture, Some(settings(2000, 100)));
        // Changing an enabled capture keeps its start.
        state
            .apply(update(Some(Some(settings(5000, 900)))))
            .unwrap();
        assert_eq!(state.hubs["h"].settings.capture, Some(settings(5000, 100)));
        // Other updates leave it alone.
        state.apply(update(None)).unwrap();
        assert_eq!(state.hubs["h"].settings.capture, Some(settings(5000, 100)));
        state.apply(update(Some(None))).unwrap();
        assert_eq!(state.hubs["h"].settings.capture, None);
        // Enabled again: from the new start.
        state
            .apply(update(Some(Some(settings(5000, 900)))))
            .unwrap();
        assert_eq!(state.hubs["h"].settings.capture, Some(settings(5000, 900)));

        let refused = [
            (
                CaptureSettings {
                    window_ms: 999,
                    ..settings(0, 0)
                },
                "time window must be between 1s and 15m",
            ),
            (settings(15 * 60 * 1000 + 1, 0), "time window"),
            (
                CaptureSettings {
                    window_bytes: 1023,
                    ..settings(1000, 0)
                },
                "size window must be between 1024 bytes",
            ),
            (
                CaptureSettings {
                    window_bytes: CAPTURE_WINDOW_MAX_BYTES + 1,
                    ..settings(1000, 0)
                },
                "500 MiB",
            ),
            (
                CaptureSettings {
                    namespace: "a/b".into(),
                    ..settings(1000, 0)
                },
                "invalid capture namespace",
            ),
            (
                CaptureSettings {
                    namespace: String::new(),
                    ..settings(1000, 0)
                },
                "invalid capture namespace",
            ),
        ];
        for (capture, why) in refused {
            let err = state.apply(update(Some(Some(capture)))).unwrap_err();
            assert_eq!(err.kind, ErrorKind::InvalidArgument);
            assert!(err.message.contains(why), "{why}: {}", err.message);
        }
        assert_eq!(state.hubs["h"].settings.capture, Some(settings(5000, 900)));
    }
}
