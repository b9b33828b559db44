//! Idle groups fall asleep: their Raft timers stop, so a node with a thousand idle
//! replicas does no per-group work at all (openraft ticks every group about 30 times a
//! second otherwise: election checks on followers, heartbeats from leaders).
//!
//! A leader whose log has not grown for [`ASLEEP_AFTER`], with every member holding its
//! whole log, stops ticking (no heartbeats). Its followers must then not time out, so they
//! stop ticking too, but only while they hear from the leader's node: every
//! [`BEAT_INTERVAL`] each node sends each peer one small message (a node beat) naming the
//! sleeping groups it leads there, with their terms. A follower sleeps only while the
//! latest beat from a node, no older than [`BEAT_TIMEOUT`], names its group and current
//! term; otherwise it ticks again, finds its leader lease long expired and campaigns at
//! once. So a group whose leader's node dies or is cut off elects a new leader about
//! [`BEAT_TIMEOUT`] later, as quickly as an awake group would.
//!
//! Any write wakes a leader at once ([`Hibernation::wake_for_write`]; openraft replicates
//! entries whether or not it ticks; a write reaching a follower wakes nothing), and a leader whose beats a member stops acknowledging wakes
//! the groups it shares with it, so heartbeats tell a follower that moved on to a newer
//! term. Sleeping is only ever a liveness matter: a replica that ticks when it need not
//! costs CPU, never safety.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use openraft::ServerState;
use openraft::storage::RaftStateMachine;
use openraft::type_config::async_runtime::WatchReceiver;
use tokio::time::Instant;
use tributary_types::GroupId;

use crate::host::GroupHost;
use crate::member::member_node;
use crate::network::PeerRouter;
use crate::types::{Raft, SnapshotData, TypeConfig};

/// How long a leader's log must stay unchanged, with every member caught up, before the
/// group sleeps.
pub const ASLEEP_AFTER: Duration = Duration::from_secs(2);
/// How often a node sends each peer a beat and re-decides which groups sleep.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(100);
/// A follower whose leader's node has not been heard from for this long wakes; a leader
/// whose beats a peer has not acknowledged for this long wakes the groups it shares with it.
pub const BEAT_TIMEOUT: Duration = Duration::from_millis(600);

/// What a node beat carries: the sleeping groups the sender leads, with their terms.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct QuietBeat {
    pub(crate) asleep: Vec<(u64, u64)>,
}

/// Whether one group's timers are stopped. Changing it goes through the lock, so a wake
/// and a sleep decided at the same moment leave flag and timer in agreement.
#[derive(Debug, Clone, Default)]
pub struct Hibernation {
    asleep: Arc<Mutex<bool>>,
}

impl Hibernation {
    /// Starts the group's timers again if they were stopped; whether they were.
    pub fn wake<SM>(&self, raft: &Raft<SM>) -> bool
    where
        SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
    {
        let mut asleep = self.asleep.lock().expect("hibernation lock");
        if *asleep {
            raft.runtime_config().tick(true);
            *asleep = false;
            return true;
        }
        false
    }

    /// Wakes the group before a write. A leader that slept sent no heartbeats, so its
    /// leader lease has lapsed and openraft would refuse the write: it first confirms its
    /// leadership with one heartbeat round (bounded by [`BEAT_TIMEOUT`]; a failure shows
    /// in the write that follows).
    ///
    /// A follower stays asleep: openraft turns the write away naming the leader without
    /// ticking, while a follower woken here would find its leader lease long expired,
    /// campaign at once and unseat a healthy leader (a client with out-of-date routing, or a
    /// node trying a send here before passing it on, would then move leaderships around).
    pub async fn wake_for_write<SM>(&self, raft: &Raft<SM>)
    where
        SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
    {
        if raft.metrics().borrow_watched().state != ServerState::Leader {
            return;
        }
        if self.wake(raft) {
            let confirm = raft.ensure_linearizable(openraft::ReadPolicy::ReadIndex);
            let _ = tokio::time::timeout(BEAT_TIMEOUT, confirm).await;
        }
    }

    fn sleep<SM>(&self, raft: &Raft<SM>)
    where
        SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
    {
        let mut asleep = self.asleep.lock().expect("hibernation lock");
        if !*asleep {
            raft.runtime_config().tick(false);
            *asleep = true;
        }
    }

    pub fn is_asleep(&self) -> bool {
        *self.asleep.lock().expect("hibernation lock")
    }
}

/// The latest beat from a node: when it arrived and the (group, term) pairs it named.
type Heard = (Instant, HashSet<(u64, u64)>);

/// Beats received, by sending node: when the latest arrived and the (group, term) pairs it
/// named.
#[derive(Debug, Default)]
pub(crate) struct BeatsHeard {
    by_node: Mutex<HashMap<u64, Heard>>,
}

impl BeatsHeard {
    pub(crate) fn record(&self, from: u64, beat: QuietBeat) {
        self.by_node
            .lock()
            .expect("beats lock")
            .insert(from, (Instant::now(), beat.asleep.into_iter().collect()));
    }

    /// Whether a beat younger than [`BEAT_TIMEOUT`] names `group` in `term`.
    fn names(&self, now: Instant, group: GroupId, term: u64) -> bool {
        let by_node = self.by_node.lock().expect("beats lock");
        by_node.values().any(|(at, pairs)| {
            now.duration_since(*at) < BEAT_TIMEOUT && pairs.contains(&(group.to_u64(), term))
        })
    }
}

/// What one pass saw of a group this node leads: its log's end and since when it is so.
struct Stillness {
    term: u64,
    last_log: Option<u64>,
    since: Instant,
    /// The pass that last saw the group leading here.
    pass: u64,
}

/// One group as a pass sees it.
enum Seen {
    /// Leading: whether it may sleep now (its peers' node ids were put in `peers`), its
    /// term and log end.
    Leading {
        idle: bool,
        term: u64,
        last_log: Option<u64>,
    },
    /// Following (or campaigning) in this term.
    Other { term: u64 },
}

fn see<SM>(raft: &Raft<SM>, member: u64, peers: &mut Vec<u64>) -> Seen
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let metrics = raft.metrics();
    let m = metrics.borrow_watched();
    if m.state != ServerState::Leader || m.current_leader != Some(member) {
        return Seen::Other {
            term: m.current_term,
        };
    }
    let membership = m.membership_config.membership();
    let joint = membership.get_joint_config().len() > 1;
    let last_log = m.last_log_index;
    let applied = m.last_applied.map(|id| id.index);
    let replicas_caught_up = m.replication.as_ref().is_some_and(|replication| {
        replication
            .iter()
            .all(|(_, matched)| matched.map(|id| id.index) == last_log)
    });
    let me = member_node(member).0;
    peers.clear();
    peers.extend(
        membership
            .nodes()
            .map(|(id, _)| member_node(*id).0)
            .filter(|node| *node != me),
    );
    Seen::Leading {
        idle: !joint && applied == last_log && replicas_caught_up,
        term: m.current_term,
        last_log,
    }
}

/// Runs the passes for `host` until the host is dropped.
pub(crate) async fn run<SM>(host: Weak<GroupHost<SM>>, router: PeerRouter)
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let mut still: HashMap<GroupId, Stillness> = HashMap::new();
    // When each peer last acknowledged a beat, and peers with a beat still on its way.
    let acked: Arc<Mutex<HashMap<u64, Instant>>> = Arc::default();
    let sending: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let mut peers = Vec::new();
    let mut pass = 0u64;
    let mut interval = tokio::time::interval(BEAT_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        interval.tick().await;
        let Some(host) = host.upgrade() else {
            return;
        };
        let now = Instant::now();
        pass += 1;
        let acked_now = acked.lock().expect("acked lock").clone();
        let reachable = |node: &u64| {
            acked_now
                .get(node)
                .is_some_and(|at| now.duration_since(*at) < BEAT_TIMEOUT)
        };
        let mut beats: HashMap<u64, QuietBeat> = HashMap::new();
        let mut asleep_count = 0u64;
        for (group, member, raft, hibernation) in host.hibernations() {
            match see(&raft, member, &mut peers) {
                Seen::Leading {
                    idle,
                    term,
                    last_log,
                } => {
                    let entry = still.entry(group).or_insert(Stillness {
                        term,
                        last_log,
                        since: now,
                        pass,
                    });
                    if entry.term != term || entry.last_log != last_log {
                        entry.term = term;
                        entry.last_log = last_log;
                        entry.since = now;
                    }
                    entry.pass = pass;
                    let may_sleep = idle
                        && now.duration_since(entry.since) >= ASLEEP_AFTER
                        && peers.iter().all(reachable);
                    if may_sleep {
                        hibernation.sleep(&raft);
                    } else {
                        hibernation.wake(&raft);
                    }
                    let asleep = hibernation.is_asleep();
                    for peer in &peers {
                        let beat = beats.entry(*peer).or_default();
                        if asleep {
                            beat.asleep.push((group.to_u64(), term));
                        }
                    }
                }
                Seen::Other { term } => {
                    if host.beats().names(now, group, term) {
                        hibernation.sleep(&raft);
                    } else {
                        hibernation.wake(&raft);
                    }
                }
            }
            if hibernation.is_asleep() {
                asleep_count += 1;
            }
        }
        // Groups no longer led here (or stopped) start over if they lead again.
        still.retain(|_, entry| entry.pass == pass);
        metrics::gauge!("tributary_raft_groups_asleep").set(asleep_count as f64);
        for (peer, beat) in beats {
            if !sending.lock().expect("sending lock").insert(peer) {
                continue;
            }
            let router = router.clone();
            let acked = acked.clone();
            let sending = sending.clone();
            tokio::spawn(async move {
                if router.quiet_beat(peer, &beat, BEAT_TIMEOUT).await.is_ok() {
                    acked
                        .lock()
                        .expect("acked lock")
                        .insert(peer, Instant::now());
                }
                sending.lock().expect("sending lock").remove(&peer);
            });
        }
    }
}
