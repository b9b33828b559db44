//! Cluster membership on the peer port: discovery through seeds, bootstrapping the
//! controller group once the expected nodes see each other, running controller commands on
//! the controller leader, and keeping every node's view of the cluster state current.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};
use tributary_proto::peer::cluster_client::ClusterClient;
use tributary_proto::peer::cluster_server::Cluster;
use tributary_proto::peer::{
    ClusterView, HelloReply, HelloRequest, NodeInfo, ProposeReply, ProposeRequest, WatchRequest,
    propose_reply,
};
use tributary_raft::openraft_api::{ClientWriteError, RaftError};
use tributary_raft::{GroupHost, Proposal, ProposalResult, Raft};
use tributary_storage::{MetaKey, Shard};
use tributary_types::{GroupId, HubId};

use crate::error::{Error, ErrorKind};
use crate::group::GroupStateMachine;
use tributary_controller::rules::{RuleCommand, random_key};
use tributary_controller::state::{ClusterFeature, ClusterState, Command, NodeRecord, Reply};
use tributary_controller::state_machine::{
    ControllerStateMachine, decode_result, encode_command, encode_result,
};
use tributary_types::format;

/// Forwarding hops a controller command may take while leadership settles.
const PROPOSE_HOPS_MAX: u32 = 3;
/// How often discovery and registration retry.
const RETRY_INTERVAL: Duration = Duration::from_millis(300);
/// How long a controller command waits for a controller leader it can reach: longer
/// than an election after the leader dies.
const PROPOSE_WAIT: Duration = Duration::from_secs(10);
/// How often a Watch stream carries a heartbeat when the view has not changed.
const WATCH_HEARTBEAT: Duration = Duration::from_secs(1);
/// A Watch stream silent this long is dead: the watcher follows another voter.
const WATCH_SILENCE_MAX: Duration = Duration::from_secs(5);

/// How a node finds its cluster.
#[derive(Debug, Clone)]
pub struct MembershipConfig {
    pub seeds: Vec<String>,
    pub bootstrap_expect: usize,
    pub controller_voters: usize,
    pub cluster_id: Option<String>,
    /// The root rule's primary key if this node creates it (`TRIBUTARY_ROOT_KEY`); random
    /// when unset.
    pub root_key: Option<RootKey>,
}

/// A key from the operator; never shown in logs or debug output.
#[derive(Clone, PartialEq, Eq)]
pub struct RootKey(pub String);

impl std::fmt::Debug for RootKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RootKey(<redacted>)")
    }
}

pub struct ClusterRuntime {
    pub me: NodeRecord,
    config: MembershipConfig,
    host: Arc<GroupHost<GroupStateMachine>>,
    controller_shard: Shard,
    /// Dials other nodes' peer ports (plain text or mutual TLS).
    connector: Arc<dyn tributary_raft::Connector>,
    known: RwLock<BTreeMap<u64, NodeRecord>>,
    controller: RwLock<Option<Raft<GroupStateMachine>>>,
    view: watch::Sender<Arc<ClusterState>>,
    /// Set at shutdown: background tasks end.
    stopping: watch::Sender<bool>,
}

/// How a node presents `node` to another: this node's own record carries its release and
/// feature level; other nodes' are passed on without them.
fn to_info(node: &NodeRecord) -> NodeInfo {
    NodeInfo {
        id: node.id,
        client_addr: node.client_addr.clone(),
        peer_addr: node.peer_addr.clone(),
        release: String::new(),
        feature_level: 0,
    }
}

/// This node as it introduces itself: with its release and the feature level it supports.
fn my_info(node: &NodeRecord) -> NodeInfo {
    NodeInfo {
        release: format::running_release(),
        feature_level: format::supported_level(),
        ..to_info(node)
    }
}

/// Why a node that supports feature levels up to `supported` (0: release 0.1.0, which
/// does not say) cannot run in a cluster at `cluster`, if it cannot.
pub fn level_refusal(
    node: u64,
    release: &str,
    supported: u32,
    cluster: &ClusterFeature,
) -> Option<String> {
    let supported = supported.max(1);
    (cluster.level > supported).then(|| {
        let release = if release.is_empty() {
            format::release_for_level(1)
        } else {
            release.to_string()
        };
        format!(
            "node {node} runs release {release}, which supports cluster feature levels up to {supported}, but this cluster runs feature level {} and needs release {} or later: start node {node} with release {} or later",
            cluster.level, cluster.release, cluster.release
        )
    })
}

/// The feature level a cluster view or hello reply carries (0: a release 0.1.0 node's,
/// which runs level 1).
fn feature_from(level: u32, release: &str) -> ClusterFeature {
    if level <= 1 {
        ClusterFeature::default()
    } else {
        ClusterFeature {
            level,
            release: release.to_string(),
        }
    }
}

fn from_info(info: &NodeInfo) -> NodeRecord {
    NodeRecord::new(info.id, info.client_addr.clone(), info.peer_addr.clone(), 0)
}

impl ClusterRuntime {
    pub fn new(
        me: NodeRecord,
        config: MembershipConfig,
        host: Arc<GroupHost<GroupStateMachine>>,
        controller_shard: Shard,
        connector: Arc<dyn tributary_raft::Connector>,
    ) -> Arc<Self> {
        let known = BTreeMap::from([(me.id, me.clone())]);
        Arc::new(Self {
            me,
            config,
            host,
            controller_shard,
            connector,
            known: RwLock::new(known),
            controller: RwLock::new(None),
            view: watch::channel(Arc::new(ClusterState::default())).0,
            stopping: watch::channel(false).0,
        })
    }

    /// A channel to the peer port at `addr`, dialed as every peer connection of this node.
    /// A channel to another node's peer port (plain text, mutual TLS, cluster key: as the
    /// node dials its peers).
    pub fn peer_channel(&self, addr: &str) -> Result<Channel, Error> {
        self.connector.channel(addr).map_err(Error::unavailable)
    }

    /// Ends the background tasks (view following, remote watch).
    pub fn stop(&self) {
        self.stopping.send_replace(true);
    }

    /// Resolves once [`ClusterRuntime::stop`] has been called.
    pub async fn stopped(&self) {
        let mut stopping = self.stopping.subscribe();
        let _ = stopping.wait_for(|s| *s).await;
    }

    /// The latest cluster state this node knows, and its changes.
    pub fn view(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.view.subscribe()
    }

    pub fn state(&self) -> Arc<ClusterState> {
        self.view.borrow().clone()
    }

    fn controller(&self) -> Option<Raft<GroupStateMachine>> {
        self.controller.read().expect("controller lock").clone()
    }

    /// The controller's Raft handle with its timers running (a write to a sleeping group
    /// wakes it; see [`tributary_raft::quiet`]).
    async fn awake(&self, raft: Raft<GroupStateMachine>) -> Raft<GroupStateMachine> {
        if let Some(hibernation) = self.host.hibernation(GroupId::CONTROLLER) {
            hibernation.wake_for_write(&raft).await;
        }
        raft
    }

    /// Every checkpoint in this node's replica of the controller's consumer store (hub,
    /// consumer group, partition index, sequence number); `None` on nodes that are not
    /// controller voters. A local read: it may trail the leader by a moment.
    pub async fn checkpoint_sequences(&self) -> Option<Vec<(HubId, String, u16, i64)>> {
        let raft = self.controller()?;
        raft.with_state_machine(|sm: &mut GroupStateMachine| {
            let sequences = match sm {
                GroupStateMachine::Controller(controller) => {
                    Some(controller.store().checkpoint_sequences())
                }
                GroupStateMachine::Partition(_) => None,
            };
            Box::pin(async move { sequences })
        })
        .await
        .ok()
        .flatten()
    }

    /// Whether this node leads the controller group now.
    pub fn is_controller_leader(&self) -> bool {
        use openraft::type_config::async_runtime::WatchReceiver;
        let Some(raft) = self.controller() else {
            return false;
        };
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        m.current_leader.is_some() && m.current_leader == Some(m.id)
    }

    /// The controller group's leader as this node's replica knows it; `None` on nodes that
    /// are not controller voters, or while there is none.
    pub fn controller_leader(&self) -> Option<u64> {
        use openraft::type_config::async_runtime::WatchReceiver;
        let raft = self.controller()?;
        let metrics = raft.metrics();
        metrics.borrow_watched().current_leader
    }

    /// On the controller leader: hands the controller's leadership to another voter that
    /// is not draining and has everything, so a node about to stop does not leave the
    /// controller leaderless for an election timeout. `Ok(None)`: not the leader, or no
    /// voter has caught up yet.
    pub async fn hand_over_controller(&self) -> Result<Option<u64>, String> {
        let Some(raft) = self.controller() else {
            return Ok(None);
        };
        let state = self.state();
        let Some(me) = state.nodes.get(&self.me.id).map(NodeRecord::member) else {
            return Ok(None);
        };
        let candidates: Vec<u64> = state
            .controller_voters
            .iter()
            .filter(|v| **v != self.me.id)
            .filter_map(|v| state.nodes.get(v))
            .filter(|n| !n.draining)
            .map(NodeRecord::member)
            .collect();
        let hibernation = self
            .host
            .hibernation(GroupId::CONTROLLER)
            .unwrap_or_default();
        tributary_raft::transfer_leadership(&raft, &hibernation, me, &candidates).await
    }

    fn has_controller_state(&self) -> bool {
        matches!(
            self.controller_shard
                .meta(GroupId::CONTROLLER, MetaKey::Vote),
            Ok(Some(_))
        )
    }

    /// This node's record in the cluster state, once the controller has registered this
    /// incarnation of its data.
    pub fn my_record(&self) -> Option<NodeRecord> {
        self.state()
            .nodes
            .get(&self.me.id)
            .filter(|n| n.data_id == self.me.data_id)
            .cloned()
    }

    /// Starts this node's controller replica; `initial_voters` (member id → peer address)
    /// initializes a new group. `member` is this node's member id, or `None` to take it
    /// from the controller state stored here.
    async fn start_controller(
        self: &Arc<Self>,
        member: Option<u64>,
        initial_voters: BTreeMap<u64, String>,
    ) -> anyhow::Result<()> {
        let (sm, view) = ControllerStateMachine::open(self.controller_shard.clone())?;
        let member = match member {
            Some(member) => member,
            None => GroupHost::<GroupStateMachine>::stored_member(
                &self.controller_shard,
                GroupId::CONTROLLER,
            )?
            .unwrap_or(self.me.id),
        };
        let raft = self
            .host
            .start(
                GroupId::CONTROLLER,
                member,
                self.controller_shard.clone(),
                GroupStateMachine::Controller(sm),
                initial_voters,
            )
            .await?;
        *self.controller.write().expect("controller lock") = Some(raft.clone());
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = this.follow_local_view(view) => {}
                _ = this.stopped() => {}
            }
        });
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = this.reconcile_controller_voters(raft, member) => {}
                _ = this.stopped() => {}
            }
        });
        Ok(())
    }

    /// On the controller leader: keeps the controller group's voters at the current
    /// incarnation of each voter node, so a voter that lost its data is replaced by its new
    /// incarnation once that has caught up.
    async fn reconcile_controller_voters(&self, raft: Raft<GroupStateMachine>, me: u64) {
        let mut view = self.view();
        loop {
            let state = view.borrow_and_update().clone();
            let desired: Option<BTreeMap<u64, String>> = state
                .controller_voters
                .iter()
                .map(|v| {
                    state
                        .nodes
                        .get(v)
                        .map(|n| (n.member(), n.peer_addr.clone()))
                })
                .collect();
            let mut again = false;
            if let Some(desired) = desired {
                let hibernation = self
                    .host
                    .hibernation(GroupId::CONTROLLER)
                    .unwrap_or_default();
                match tributary_raft::reconcile_voters(&raft, &hibernation, me, &desired).await {
                    Ok(tributary_raft::VoterChange::Nothing) => {}
                    Ok(change) => {
                        tracing::info!(?change, "controller voters changing");
                        again = true;
                    }
                    Err(err) => {
                        tracing::warn!(%err, "changing controller voters failed; will retry");
                        again = true;
                    }
                }
            }
            // Leadership changes are not in the view: look again now and then.
            let wait = if again {
                Duration::from_millis(200)
            } else {
                Duration::from_secs(2)
            };
            let _ = tokio::time::timeout(wait, view.changed()).await;
        }
    }

    async fn follow_local_view(&self, mut view: watch::Receiver<Arc<ClusterState>>) {
        loop {
            let state = view.borrow_and_update().clone();
            self.publish(state);
            if view.changed().await.is_err() {
                return;
            }
        }
    }

    /// Takes a state from the local controller replica or a remote watch; older states
    /// than the one held are ignored, so the view never goes back.
    fn publish(&self, state: Arc<ClusterState>) {
        format::follow_cluster_level(state.feature.level);
        {
            let mut known = self.known.write().expect("known lock");
            for node in state.nodes.values() {
                known.insert(node.id, node.clone());
            }
        }
        self.view.send_if_modified(|current| {
            if **current == *state || state.version < current.version {
                false
            } else {
                *current = state;
                true
            }
        });
    }

    /// Joins or forms the cluster, then keeps the view current. Returns once this node is
    /// registered with the controller.
    pub async fn run(self: &Arc<Self>) -> anyhow::Result<()> {
        let mut rejoin_controller = false;
        if self.has_controller_state() {
            // A controller voter restarting: its group is already initialized.
            self.start_controller(None, BTreeMap::new()).await?;
        } else {
            rejoin_controller = self.discover().await?;
        }
        if self.controller().is_none() {
            let this = self.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = this.clone().watch_remote() => {}
                    _ = this.stopped() => {}
                }
            });
        }
        self.register().await;
        self.ensure_root_rule();
        if rejoin_controller {
            // A voter whose data was lost rejoins the controller group as a new member;
            // the controller leader adds it as a learner and promotes it once caught up.
            let mut view = self.view();
            let me = self.me.clone();
            let record = view
                .wait_for(|s| s.nodes.get(&me.id).is_some_and(|n| n.data_id == me.data_id))
                .await?
                .nodes[&me.id]
                .clone();
            tracing::info!(
                incarnation = record.incarnation,
                "rejoining the controller group with new data"
            );
            self.start_controller(Some(record.member()), BTreeMap::new())
                .await?;
        }
        Ok(())
    }

    /// Talks to the seeds until the cluster exists (join it) or the expected number of
    /// nodes see each other (form it). Returns whether this node is a controller voter that
    /// lost its data and must rejoin the controller group.
    async fn discover(self: &Arc<Self>) -> anyhow::Result<bool> {
        let mut logged = false;
        let mut unreachable: std::collections::HashMap<String, u32> = Default::default();
        loop {
            let mut voters_seen: Option<Vec<u64>> = None;
            for seed in self.config.seeds.clone() {
                match self.hello(&seed).await {
                    Ok(reply) => {
                        if !reply.controller_voters.is_empty() {
                            voters_seen = Some(reply.controller_voters.clone());
                        }
                    }
                    Err(err) if err.kind == ErrorKind::InvalidArgument => {
                        anyhow::bail!("{}", err.message)
                    }
                    Err(err) => {
                        // Say so at once, then every 30 s or so: a wrong seed address is a
                        // common mistake, and the node keeps trying meanwhile.
                        let failures = unreachable.entry(seed.clone()).or_insert(0u32);
                        if failures.is_multiple_of(100) {
                            tracing::warn!(%seed, %err, "seed does not answer; still trying");
                        }
                        *failures += 1;
                    }
                }
            }
            if let Some(voters) = voters_seen {
                tracing::info!(?voters, "joining a running cluster");
                return Ok(voters.contains(&self.me.id));
            }
            if self.controller().is_some() {
                return Ok(false);
            }
            let known: Vec<NodeRecord> = self
                .known
                .read()
                .expect("known lock")
                .values()
                .cloned()
                .collect();
            if known.len() >= self.config.bootstrap_expect {
                let voters: Vec<&NodeRecord> =
                    known.iter().take(self.config.controller_voters).collect();
                if voters.iter().any(|v| v.id == self.me.id) {
                    // Every node of a new cluster is in its first incarnation.
                    let members: BTreeMap<u64, String> = voters
                        .iter()
                        .map(|v| (tributary_raft::member_id(v.id, 0), v.peer_addr.clone()))
                        .collect();
                    let first = voters[0].id == self.me.id;
                    tracing::info!(voters = ?members.keys().collect::<Vec<_>>(), initializing = first, "forming the controller group");
                    self.start_controller(
                        Some(tributary_raft::member_id(self.me.id, 0)),
                        if first {
                            members.clone()
                        } else {
                            BTreeMap::new()
                        },
                    )
                    .await?;
                    if first {
                        let cluster_id = self
                            .config
                            .cluster_id
                            .clone()
                            .unwrap_or_else(|| format!("{:016x}", rand::random::<u64>()));
                        let voters = voters.iter().map(|v| v.id).collect();
                        self.propose_with_retry(Command::Bootstrap { cluster_id, voters })
                            .await;
                    }
                    return Ok(false);
                }
                // Not a voter: wait until the voters have formed the controller.
            } else if !logged {
                tracing::info!(
                    known = known.len(),
                    expected = self.config.bootstrap_expect,
                    "waiting for the expected nodes to see each other"
                );
                logged = true;
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
    }

    async fn hello(&self, addr: &str) -> Result<HelloReply, Error> {
        let mut client = ClusterClient::new(self.peer_channel(addr)?);
        let reply = client
            .hello(HelloRequest {
                cluster_id: self.cluster_id().unwrap_or_default(),
                node: Some(my_info(&self.me)),
            })
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner();
        // A node of a later release refuses this one (it says so itself); one of this
        // release may only say what level the cluster runs.
        let feature = feature_from(reply.feature_level, &reply.feature_release);
        if let Some(refusal) = level_refusal(
            self.me.id,
            &format::running_release(),
            format::supported_level(),
            &feature,
        ) {
            return Err(Error::invalid(refusal));
        }
        if let Some(node) = &reply.node {
            self.learn(from_info(node));
        }
        for node in &reply.known {
            self.learn(from_info(node));
        }
        Ok(reply)
    }

    fn learn(&self, node: NodeRecord) {
        self.known
            .write()
            .expect("known lock")
            .insert(node.id, node);
    }

    /// The cluster this node belongs to: from the controller's state, or the data
    /// directory's record (or `--cluster-id`) before that state arrives.
    pub fn cluster_id(&self) -> Option<String> {
        let state = self.state();
        if state.cluster_id.is_empty() {
            self.config.cluster_id.clone()
        } else {
            Some(state.cluster_id.clone())
        }
    }

    async fn register(&self) {
        self.propose_with_retry(Command::RegisterNode(self.me.clone()))
            .await;
        tracing::info!(node = self.me.id, "registered with the controller");
    }

    /// A new cluster, or one whose state predates authorization rules, gets its root rule.
    /// Any node may be first; the command does nothing once the namespace has a rule, so the
    /// others' proposals (and those of later starts) are no-ops. In the background, so a
    /// controller that cannot run it yet (an older version during an upgrade) never holds
    /// the node's start up.
    fn ensure_root_rule(self: &Arc<Self>) {
        if !self.state().rules.is_empty() {
            return;
        }
        let primary_key = match &self.config.root_key {
            Some(RootKey(key)) => key.clone(),
            None => random_key(),
        };
        let command = Command::Rule(RuleCommand::EnsureRoot {
            primary_key,
            secondary_key: random_key(),
        });
        let this = self.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = this.propose_with_retry(command) => {}
                _ = this.stopped() => {}
            }
        });
    }

    async fn propose_with_retry(&self, command: Command) {
        loop {
            match self.propose(command.clone()).await {
                Ok(_) => return,
                Err(err) => {
                    tracing::debug!(%err, "controller not ready yet");
                    tokio::time::sleep(RETRY_INTERVAL).await;
                }
            }
        }
    }

    /// Runs a controller command on the controller leader and returns its reply. While
    /// the controller has no leader, or the one this node knows is unreachable (it died,
    /// and the others have not elected a new one yet), the command has not run: it is
    /// tried again until `PROPOSE_WAIT` has passed, so a management call made just after
    /// a controller node dies waits out the election instead of failing.
    pub async fn propose(&self, command: Command) -> Result<Reply, Error> {
        let command = encode_command(&command);
        let deadline = Instant::now() + PROPOSE_WAIT;
        loop {
            match self.propose_encoded(command.clone(), 0).await {
                Ok(reply) => return Ok(reply),
                Err(Proposing::NotRun(err)) if Instant::now() + RETRY_INTERVAL < deadline => {
                    tracing::debug!(%err, "controller command not run yet; trying again");
                    tokio::time::sleep(RETRY_INTERVAL).await;
                }
                Err(Proposing::NotRun(err) | Proposing::Failed(err)) => return Err(err),
            }
        }
    }

    /// One attempt at running an encoded command: here if this node leads the controller,
    /// else through the leader (or, on a non-voter, through any voter).
    async fn propose_encoded(&self, command: bytes::Bytes, hops: u32) -> Result<Reply, Proposing> {
        let targets: Vec<String> = match self.controller() {
            Some(raft) => match self
                .awake(raft)
                .await
                .client_write(Proposal::Controller(command.clone()))
                .await
            {
                Ok(response) => {
                    return self
                        .command_reply(response.data)
                        .await
                        .map_err(Proposing::Failed);
                }
                Err(RaftError::APIError(ClientWriteError::ForwardToLeader(forward))) => {
                    match forward.leader_node {
                        Some(node) => vec![node.addr],
                        None => return Err(Proposing::NotRun(no_controller_leader())),
                    }
                }
                Err(err) => return Err(Proposing::Failed(Error::internal(err.to_string()))),
            },
            // Not a voter (or a voter that lost its data and has not rejoined yet): any
            // other voter forwards to the leader.
            None => {
                let voters = self.state().controller_voters.clone();
                let known = self.known.read().expect("known lock").clone();
                voters
                    .iter()
                    .filter(|v| **v != self.me.id)
                    .filter_map(|v| known.get(v))
                    .map(|n| n.peer_addr.clone())
                    .collect()
            }
        };
        if hops >= PROPOSE_HOPS_MAX {
            return Err(Proposing::NotRun(no_controller_leader()));
        }
        let mut last_error = no_controller_leader();
        for target in targets {
            match self.forward_to(&target, command.clone(), hops).await {
                Err(Proposing::NotRun(err)) => last_error = err,
                Err(failed @ Proposing::Failed(_)) => return Err(failed),
                Ok(reply) => return Ok(reply),
            }
        }
        Err(Proposing::NotRun(last_error))
    }

    /// Runs a command through the node at `target`; only an unreachable node, or one that
    /// says it did not run the command, may be retried (a node that answered otherwise may
    /// have run it).
    async fn forward_to(
        &self,
        target: &str,
        command: bytes::Bytes,
        hops: u32,
    ) -> Result<Reply, Proposing> {
        let mut client = ClusterClient::new(self.peer_channel(target).map_err(Proposing::NotRun)?);
        let reply = client
            .propose(ProposeRequest {
                command,
                hops: hops + 1,
            })
            .await
            .map_err(|s| {
                let err = Error::new(
                    ErrorKind::Unavailable,
                    format!("controller at {target}: {}", s.message()),
                );
                if s.code() == tonic::Code::Unavailable {
                    Proposing::NotRun(err)
                } else {
                    Proposing::Failed(err)
                }
            })?
            .into_inner();
        match reply.result {
            Some(propose_reply::Result::Reply(bytes)) => {
                let result = decode_result(&bytes)
                    .map_err(|e| Proposing::Failed(Error::internal(e.to_string())))?;
                result.map_err(|e| Proposing::Failed(command_error(e)))
            }
            Some(propose_reply::Result::Unavailable(message)) => Err(Proposing::Failed(
                Error::new(ErrorKind::Unavailable, message),
            )),
            Some(propose_reply::Result::NotRun(message)) => Err(Proposing::NotRun(Error::busy(
                message,
                Duration::from_secs(1),
            ))),
            None => Err(Proposing::Failed(no_controller_leader())),
        }
    }

    async fn command_reply(&self, result: ProposalResult) -> Result<Reply, Error> {
        match result {
            ProposalResult::Controller(bytes) => {
                let result = decode_result(&bytes).map_err(|e| Error::internal(e.to_string()))?;
                result.map_err(command_error)
            }
            other => Err(Error::internal(format!(
                "controller command applied without a reply: {other:?}"
            ))),
        }
    }

    /// Non-voters follow the controller through a Watch stream from any voter. The voters
    /// are looked up afresh before each stream: a list taken once (the seeds, at startup)
    /// would in time lead to another non-voter, two of which would follow each other's
    /// frozen views for ever.
    async fn watch_remote(self: Arc<Self>) {
        let mut turn = 0usize;
        loop {
            let candidates = self.watch_candidates();
            if let Some(addr) = candidates.get(turn % candidates.len().max(1)) {
                if let Err(err) = self.watch_from(addr).await {
                    tracing::info!(%addr, %err, "cluster watch ended; following another voter");
                }
                turn = turn.wrapping_add(1);
            }
            tokio::time::sleep(RETRY_INTERVAL).await;
        }
    }

    /// The peer addresses of the controller voters (the seeds until the voters are known),
    /// never this node's own.
    fn watch_candidates(&self) -> Vec<String> {
        let voters = self.state().controller_voters.clone();
        let known = self.known.read().expect("known lock");
        let mut list: Vec<String> = voters
            .iter()
            .filter_map(|v| known.get(v))
            .map(|n| n.peer_addr.clone())
            .collect();
        if list.is_empty() {
            list = self.config.seeds.clone();
        }
        // Never follow itself: its own view is what it is waiting for.
        list.retain(|addr| *addr != self.me.peer_addr);
        list
    }

    async fn watch_from(&self, addr: &str) -> Result<(), Error> {
        let mut client = ClusterClient::new(self.peer_channel(addr)?);
        let mut stream = client
            .watch(WatchRequest {})
            .await
            .map_err(|s| Error::from_status(&s))?
            .into_inner();
        loop {
            // The voter sends a heartbeat at least every WATCH_HEARTBEAT: silence means the
            // stream is dead though its connection looks open (a voter killed, frozen or cut
            // off): follow another voter rather than keep a view that no longer moves.
            let view = match tokio::time::timeout(WATCH_SILENCE_MAX, stream.next()).await {
                Ok(Some(view)) => view,
                Ok(None) => return Ok(()),
                Err(_elapsed) => {
                    return Err(Error::new(
                        ErrorKind::Unavailable,
                        format!(
                            "no cluster view or heartbeat from {addr} in {WATCH_SILENCE_MAX:?}"
                        ),
                    ));
                }
            };
            let view = view.map_err(|s| Error::from_status(&s))?;
            if view.state.is_empty() {
                continue;
            }
            let mut state: ClusterState =
                format::decode(&view.state).map_err(|e| Error::internal(e.to_string()))?;
            state.feature = feature_from(view.feature_level, &view.feature_release);
            self.publish(Arc::new(state));
        }
    }

    pub fn host(&self) -> &Arc<GroupHost<GroupStateMachine>> {
        &self.host
    }
}

/// Why a controller command failed.
enum Proposing {
    /// It did not run: no leader was known, or the node it went to could not be reached
    /// or had no leader either. Safe to try again.
    NotRun(Error),
    /// It failed, or may have run (the node it went to answered otherwise).
    Failed(Error),
}

fn no_controller_leader() -> Error {
    Error::busy(
        "the controller has no leader right now. Please wait 1 seconds and try again",
        Duration::from_secs(1),
    )
}

fn command_error(err: tributary_controller::state::CommandError) -> Error {
    Error::from(err)
}

/// The Cluster service on the peer port.
pub struct ClusterService {
    pub runtime: Arc<ClusterRuntime>,
}

#[tonic::async_trait]
impl Cluster for ClusterService {
    async fn hello(&self, request: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        if let Some(node) = &request.get_ref().node {
            tributary_raft::PeerCaller::check_sender(&request, node.id)?;
        }
        let req = request.into_inner();
        let rt = &self.runtime;
        let ours = rt.cluster_id();
        if let (Some(ours), false) = (&ours, req.cluster_id.is_empty())
            && *ours != req.cluster_id
        {
            return Err(Error::invalid(format!(
                "node {} belongs to cluster '{}', but this cluster is '{ours}'; a node cannot join another cluster's seeds",
                req.node.as_ref().map_or(0, |n| n.id),
                req.cluster_id
            ))
            .into());
        }
        let state = rt.state();
        if let Some(node) = &req.node {
            if let Some(refusal) =
                level_refusal(node.id, &node.release, node.feature_level, &state.feature)
            {
                tracing::warn!(node = node.id, "{refusal}");
                return Err(Error::invalid(refusal).into());
            }
            if node.id == rt.me.id && node.peer_addr != rt.me.peer_addr {
                return Err(Error::invalid(format!(
                    "node id {} is already used by the node at {}; give every node its own --node-id",
                    node.id, rt.me.peer_addr
                ))
                .into());
            }
            rt.learn(from_info(node));
        }
        let known = rt
            .known
            .read()
            .expect("known lock")
            .values()
            .map(to_info)
            .collect();
        Ok(Response::new(HelloReply {
            cluster_id: ours.unwrap_or_default(),
            node: Some(my_info(&rt.me)),
            known,
            controller_voters: state.controller_voters.clone(),
            feature_level: state.feature.level,
            feature_release: state.feature.release.clone(),
        }))
    }

    async fn propose(
        &self,
        request: Request<ProposeRequest>,
    ) -> Result<Response<ProposeReply>, Status> {
        let req = request.into_inner();
        let result = match self.runtime.propose_encoded(req.command, req.hops).await {
            Err(Proposing::NotRun(err)) => propose_reply::Result::NotRun(err.message),
            Ok(reply) => propose_reply::Result::Reply(encode_result(&Ok(reply))),
            Err(Proposing::Failed(err)) => match err.as_command_error() {
                Some(refusal) => propose_reply::Result::Reply(encode_result(&Err(refusal))),
                None => propose_reply::Result::Unavailable(err.message),
            },
        };
        Ok(Response::new(ProposeReply {
            result: Some(result),
        }))
    }

    type WatchStream = ReceiverStream<Result<ClusterView, Status>>;

    async fn watch(
        &self,
        _request: Request<WatchRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        // Only a controller voter's view comes from the controller itself; a non-voter
        // would pass on its own copy, which stops moving when its source does.
        if self.runtime.controller().is_none() {
            return Err(Status::failed_precondition(format!(
                "node {} is not a controller voter; watch a voter",
                self.runtime.me.id
            )));
        }
        let mut view = self.runtime.view();
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let state = view.borrow_and_update().clone();
                let bytes = format::encode(&*state).expect("state encodes");
                if tx
                    .send(Ok(ClusterView {
                        state: bytes.into(),
                        feature_level: state.feature.level,
                        feature_release: state.feature.release.clone(),
                    }))
                    .await
                    .is_err()
                {
                    return;
                }
                // An unchanged view is answered with a heartbeat (an empty view), so the
                // watcher can tell a quiet cluster from a dead stream.
                loop {
                    tokio::select! {
                        changed = view.changed() => {
                            if changed.is_err() {
                                return;
                            }
                            break;
                        }
                        _ = tx.closed() => return,
                        _ = tokio::time::sleep(WATCH_HEARTBEAT) => {
                            let heartbeat = ClusterView::default();
                            if tx.send(Ok(heartbeat)).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
