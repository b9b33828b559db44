//! The controller's replicated state and the commands that change it. Pure: the controller
//! group applies commands in log order on every voter, so each computes the same state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tributary_types::limits::{CONSUMER_GROUPS_PER_HUB_MAX, RETENTION_MAX, RETENTION_MIN};
use tributary_types::{
    DEFAULT_CONSUMER_GROUP, HubId, validate_consumer_group_name, validate_hub_name,
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
        }
    }

    /// This node's Raft member id in the groups it holds.
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
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    Hub(HubRecord),
    ConsumerGroupCreated { created_at_ms: i64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    NotFound,
    AlreadyExists,
    InvalidArgument,
    QuotaExceeded,
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
            Command::RegisterNode(mut node) => {
                match self.nodes.get(&node.id) {
                    Some(known) if known.data_id == node.data_id => {
                        node.incarnation = known.incarnation;
                        node.incarnation_version = known.incarnation_version;
                        node.draining = known.draining;
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
            Command::DeleteHub { name } => {
                self.hubs
                    .remove(&name)
                    .ok_or_else(|| hub_not_found(&name))?;
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
        let retention = std::time::Duration::from_millis(retention_ms);
        if retention < RETENTION_MIN || retention > RETENTION_MAX {
            return Err(err(
                ErrorKind::InvalidArgument,
                format!(
                    "retention must be between 1h and 90d; {} was requested",
                    humantime::format_duration(retention)
                ),
            ));
        }
        let nodes: Vec<u64> = self
            .nodes
            .keys()
            .copied()
            .filter(|n| !down_nodes.contains(n))
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
        let replicas = place_replicas(&nodes, id, partition_count as u16, replication_factor);
        let record = HubRecord {
            id,
            name: name.clone(),
            partition_count: partition_count as u16,
            retention_ms,
            created_at_ms: now_ms,
            replication_factor,
            consumer_groups: BTreeMap::from([(DEFAULT_CONSUMER_GROUP.to_string(), now_ms)]),
            replicas,
            created_version: self.version,
            throughput_units,
        };
        self.hubs.insert(name, record.clone());
        Ok(Reply::Hub(record))
    }
}

impl ClusterState {
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

/// Spreads replicas evenly: partition p of hub h starts at node (h + p) mod n and takes the
/// next `replication_factor` nodes, so replicas and preferred leaders rotate over the nodes.
/// (The placement issue replaces this with capacity-aware planning.)
pub fn place_replicas(
    nodes: &[u64],
    hub: HubId,
    partitions: u16,
    replication_factor: u8,
) -> Vec<Vec<u64>> {
    assert!(!nodes.is_empty() && usize::from(replication_factor) <= nodes.len());
    (0..partitions)
        .map(|p| {
            let start = (hub.0 as usize + p as usize) % nodes.len();
            (0..usize::from(replication_factor))
                .map(|r| nodes[(start + r) % nodes.len()])
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(nodes: u64) -> ClusterState {
        let mut state = ClusterState::default();
        for id in 1..=nodes {
            state
                .apply(Command::RegisterNode(NodeRecord::new(
                    id,
                    format!("c{id}"),
                    format!("p{id}"),
                    100 + id,
                )))
                .unwrap();
        }
        state
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
        let set = |hub: &str, tu: u32| Command::SetThroughputUnits {
            hub: hub.into(),
            throughput_units: tu,
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
}
