//! The groups a node runs, keyed by [`GroupId`]. Starting, finding and stopping a group
//! goes through here; the peer transport (replication issue) dispatches incoming messages
//! with [`GroupHost::get`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use openraft::BasicNode;
use openraft::storage::RaftStateMachine;
use tributary_storage::{Durability, MetaKey, Mutation, Shard};
use tributary_types::{GroupId, NodeId};

use crate::log_store::LogStore;
use crate::network::{NetworkFactory, PeerRouter};
use crate::quiet::{BeatsHeard, Hibernation};
use crate::types::{
    Raft, RaftSettings, SnapshotData, TypeConfig, controller_config_with, group_config_with,
};

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("group {0} is already running on this node")]
    AlreadyRunning(GroupId),
    #[error("cannot start group {group}: {message}")]
    Start { group: GroupId, message: String },
}

/// One running group: this node's member id in it, its Raft handle, its sleep switch.
type Running<SM> = (u64, Raft<SM>, Hibernation);

/// Runs many Raft groups of one state-machine type on one node, sharing one router.
pub struct GroupHost<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    node_id: NodeId,
    router: PeerRouter,
    config: Arc<openraft::Config>,
    /// The controller group's: it keeps little log behind its snapshots.
    controller_config: Arc<openraft::Config>,
    /// Each running group's Raft handle, this node's member id in it and whether its
    /// timers are stopped.
    groups: RwLock<HashMap<GroupId, Running<SM>>>,
    /// Node beats from peers: which of the groups they lead sleep.
    beats: BeatsHeard,
    /// The shard each running group's log lives in (snapshots being received are staged
    /// there).
    shards: RwLock<HashMap<GroupId, Shard>>,
}

impl<SM> GroupHost<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    pub fn new(node_id: NodeId, router: PeerRouter) -> Arc<Self> {
        Self::with_settings(node_id, router, RaftSettings::default())
    }

    /// A host whose groups use `settings` for snapshots and log retention.
    pub fn with_settings(node_id: NodeId, router: PeerRouter, settings: RaftSettings) -> Arc<Self> {
        router
            .rebuilds()
            .set_bytes_per_second(settings.rebuild_bytes_per_second);
        Arc::new(Self {
            node_id,
            router,
            config: group_config_with("tributary", &settings),
            controller_config: controller_config_with("tributary", &settings),
            groups: RwLock::new(HashMap::new()),
            beats: BeatsHeard::default(),
            shards: RwLock::new(HashMap::new()),
        })
    }

    /// The replica rebuilds this node sends and receives.
    pub fn rebuilds(&self) -> &crate::rebuild::Rebuilds {
        self.router.rebuilds()
    }

    /// The shard a running group's log lives in.
    pub(crate) fn shard_of(&self, group: GroupId) -> Option<Shard> {
        self.shards
            .read()
            .expect("shards lock")
            .get(&group)
            .cloned()
    }

    /// Lets this host's idle groups sleep (see [`crate::quiet`]): from now on, until the
    /// host is dropped, it beats to its peers and stops or restarts its groups' timers.
    pub fn hibernate_idle(self: &Arc<Self>) {
        tokio::spawn(crate::quiet::run(Arc::downgrade(self), self.router.clone()));
    }

    pub(crate) fn beats(&self) -> &BeatsHeard {
        &self.beats
    }

    /// A group's sleep switch: a caller about to write to the group wakes it first.
    pub fn hibernation(&self, group: GroupId) -> Option<Hibernation> {
        self.groups
            .read()
            .expect("groups lock")
            .get(&group)
            .map(|(_, _, h)| h.clone())
    }

    /// Every running group with this node's member id in it and its sleep switch.
    pub(crate) fn hibernations(&self) -> Vec<(GroupId, u64, Raft<SM>, Hibernation)> {
        self.groups
            .read()
            .expect("groups lock")
            .iter()
            .map(|(group, (member, raft, h))| (*group, *member, raft.clone(), h.clone()))
            .collect()
    }

    /// How many of this node's groups sleep now.
    pub fn asleep_count(&self) -> usize {
        self.groups
            .read()
            .expect("groups lock")
            .values()
            .filter(|(_, _, h)| h.is_asleep())
            .count()
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// Starts a group whose log lives in `shard`, as member `member` (see
    /// [`crate::member_id`]). A group that has never run is initialized with
    /// `initial_members` (member id → peer address) as its voters; with no members given it
    /// waits to be contacted by a leader that has it in its membership.
    pub async fn start(
        &self,
        group: GroupId,
        member: u64,
        shard: Shard,
        state_machine: SM,
        initial_members: BTreeMap<u64, String>,
    ) -> Result<Raft<SM>, HostError> {
        self.start_founding(
            group,
            member,
            shard,
            state_machine,
            initial_members,
            Duration::ZERO,
        )
        .await
    }

    /// [`GroupHost::start`], initializing a group that has never run only after
    /// `init_delay`, and only if no leader has reached this replica by then. Every founding
    /// replica of a new group may initialize it, and each campaigns as soon as it has: the
    /// one that should lead initializes at once and the others wait, so it wins, while the
    /// group still starts without it when it is down.
    pub async fn start_founding(
        &self,
        group: GroupId,
        member: u64,
        shard: Shard,
        state_machine: SM,
        initial_members: BTreeMap<u64, String>,
        init_delay: Duration,
    ) -> Result<Raft<SM>, HostError> {
        let start_error = |message: String| HostError::Start { group, message };
        if self.get(group).is_some() {
            return Err(HostError::AlreadyRunning(group));
        }
        let stored = Self::stored_member(&shard, group).map_err(|e| start_error(e.to_string()))?;
        if stored != Some(member) {
            if let Some(stored) = stored {
                return Err(start_error(format!(
                    "its stored state belongs to {}, not {}",
                    crate::describe_member(stored),
                    crate::describe_member(member)
                )));
            }
            shard
                .write(
                    vec![Mutation::PutMeta {
                        group,
                        key: MetaKey::Member,
                        value: crate::encode(&member).map_err(|e| start_error(e.to_string()))?,
                    }],
                    Durability::Immediate,
                )
                .await
                .map_err(|e| start_error(e.to_string()))?;
        }
        let log_store = LogStore::new(group, shard.clone())
            .map_err(|e| start_error(e.to_string()))?
            .for_member(member);
        let network = NetworkFactory::new(self.router.clone(), group);
        debug_assert_eq!(crate::member_node(member), self.node_id);
        let config = if group == GroupId::CONTROLLER {
            &self.controller_config
        } else {
            &self.config
        };
        let raft = Raft::new(member, config.clone(), network, log_store, state_machine)
            .await
            .map_err(|e| start_error(e.to_string()))?;
        let members: BTreeMap<u64, BasicNode> = initial_members
            .into_iter()
            .map(|(id, addr)| (id, BasicNode::new(addr)))
            .collect();
        if !members.is_empty() && init_delay.is_zero() {
            initialize(&raft, members)
                .await
                .map_err(|e| start_error(e.to_string()))?;
        } else if !members.is_empty() {
            let raft = raft.clone();
            tokio::spawn(async move {
                tokio::time::sleep(init_delay).await;
                // A leader that has reached this replica meanwhile leaves it nothing to do
                // (openraft refuses to initialize once it has voted or holds a log).
                if let Err(err) = initialize(&raft, members).await {
                    tracing::debug!(%group, %err, "not initializing a group a leader has reached");
                }
            });
        }
        let mut groups = self.groups.write().expect("groups lock");
        if groups.contains_key(&group) {
            return Err(HostError::AlreadyRunning(group));
        }
        groups.insert(group, (member, raft.clone(), Hibernation::default()));
        self.shards
            .write()
            .expect("shards lock")
            .insert(group, shard);
        Ok(raft)
    }

    /// The member id a group's replica stored in `shard` last ran as.
    pub fn stored_member(shard: &Shard, group: GroupId) -> std::io::Result<Option<u64>> {
        match shard.meta(group, MetaKey::Member)? {
            Some(bytes) => Ok(Some(crate::decode(&bytes)?)),
            None => Ok(None),
        }
    }

    pub fn get(&self, group: GroupId) -> Option<Raft<SM>> {
        self.get_member(group).map(|(_, raft)| raft)
    }

    /// A running group and this node's member id in it.
    pub fn get_member(&self, group: GroupId) -> Option<(u64, Raft<SM>)> {
        self.groups
            .read()
            .expect("groups lock")
            .get(&group)
            .map(|(member, raft, _)| (*member, raft.clone()))
    }

    pub fn group_ids(&self) -> Vec<GroupId> {
        self.groups
            .read()
            .expect("groups lock")
            .keys()
            .copied()
            .collect()
    }

    /// Stops a group; its stored state stays until the caller deletes it.
    pub async fn stop(&self, group: GroupId) {
        let raft = self.groups.write().expect("groups lock").remove(&group);
        self.shards.write().expect("shards lock").remove(&group);
        if let Some((_, raft, _)) = raft
            && let Err(err) = raft.shutdown().await
        {
            tracing::warn!(%group, %err, "raft group did not shut down cleanly");
        }
    }

    /// Stops every group.
    pub async fn stop_all(&self) {
        futures::future::join_all(self.group_ids().into_iter().map(|g| self.stop(g))).await;
    }
}

/// Initializes a group that has never run with `members` as its voters; nothing when it
/// already has.
async fn initialize<SM>(raft: &Raft<SM>, members: BTreeMap<u64, BasicNode>) -> Result<(), String>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    if raft.is_initialized().await.map_err(|e| e.to_string())? {
        return Ok(());
    }
    raft.initialize(members).await.map_err(|e| e.to_string())
}
