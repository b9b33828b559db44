//! The invariants, checked between simulation steps against every replica's metrics, state
//! machine and stored log. A violation panics with what was seen.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use tributary_raft::{LogId, decode_entry};
use tributary_types::GroupId;

use crate::client::Ack;
use crate::cluster::Replica;
use crate::state_machine::Record;

type LeaderId = openraft::impls::leader_id_adv::LeaderId<u64, u64>;

/// What the checker remembers about one replica between checks.
#[derive(Debug, Default)]
struct Seen {
    term: u64,
    committed: Option<LogId>,
    /// State machine records already checked.
    records: usize,
    /// Stored log entries below this index are checked.
    log_checked: u64,
}

#[derive(Default)]
pub struct Checker {
    /// Election safety: the node that led each group under each leader id. openraft's
    /// default leader id (`leader_id_adv`, used by `TypeConfig`) is (term, node), so two
    /// nodes may lead one term in turn; per leader id there is at most one leader.
    leaders: BTreeMap<(GroupId, LeaderId), u64>,
    /// The nodes seen leading each (group, term), reported after the run.
    leaders_by_term: BTreeMap<(GroupId, u64), BTreeSet<u64>>,
    /// Every entry known committed (applied by some replica), by group and index.
    committed: BTreeMap<GroupId, BTreeMap<u64, Record>>,
    /// Every acknowledged entry, by group and index.
    acked: BTreeMap<GroupId, BTreeMap<u64, Ack>>,
    last_ack_at: BTreeMap<GroupId, Duration>,
    /// Entries full scans found beyond a replica's applied index: not yet committed then.
    uncommitted_seen: BTreeSet<(GroupId, LogId)>,
    seen: BTreeMap<(u64, GroupId), Seen>,
}

impl Checker {
    /// Takes new acknowledgements from the client.
    pub fn acknowledged(&mut self, acks: Vec<Ack>) {
        for ack in acks {
            let last = self.last_ack_at.entry(ack.group).or_default();
            *last = (*last).max(ack.at);
            let index = ack.log_id.index;
            if let Some(record) = self.committed(ack.group, index) {
                assert_acked_matches(&ack, record);
            }
            let previous = self
                .acked
                .entry(ack.group)
                .or_default()
                .insert(index, ack.clone());
            if let Some(previous) = previous {
                assert_eq!(
                    (previous.log_id, &previous.events),
                    (ack.log_id, &ack.events),
                    "two different entries were acknowledged at {} index {index}",
                    ack.group
                );
            }
        }
    }

    /// The per-step checks: metrics, new state machine records, new stored log entries.
    pub fn check(&mut self, replicas: &[Replica]) {
        for replica in replicas {
            self.check_metrics(replica);
            self.check_applied(replica);
            self.check_stored_log(replica);
        }
    }

    fn check_metrics(&mut self, replica: &Replica) {
        let key = (replica.node, replica.group);
        let metrics = replica.raft.metrics().borrow_watched().clone();
        let who = format!("node {} group {}", replica.node, replica.group);
        assert!(
            metrics.running_state.is_ok(),
            "{who} stopped: {:?}",
            metrics.running_state
        );
        let seen = self.seen.entry(key).or_default();
        assert!(
            metrics.current_term >= seen.term,
            "{who}: term went back from {} to {}",
            seen.term,
            metrics.current_term
        );
        seen.term = metrics.current_term;
        assert!(
            metrics.local_committed >= seen.committed,
            "{who}: committed went back from {:?} to {:?}",
            seen.committed,
            metrics.local_committed
        );
        seen.committed = metrics.local_committed;

        if metrics.state == ServerState::Leader {
            let leader_id = *metrics.vote.leader_id();
            assert_eq!(
                leader_id.node_id, replica.node,
                "{who} leads under a vote for another node: {}",
                metrics.vote
            );
            assert!(
                metrics.vote.is_committed(),
                "{who} leads under an uncommitted vote: {}",
                metrics.vote
            );
            let first = *self
                .leaders
                .entry((replica.group, leader_id))
                .or_insert(replica.node);
            assert_eq!(
                first, replica.node,
                "two leaders of group {} under leader id {leader_id}: nodes {first} and {}",
                replica.group, replica.node
            );
            self.leaders_by_term
                .entry((replica.group, leader_id.term))
                .or_default()
                .insert(replica.node);
        }
    }

    /// New state machine records: consecutive, and equal to what every other replica applied
    /// at the same index.
    fn check_applied(&mut self, replica: &Replica) {
        let key = (replica.node, replica.group);
        let new: Vec<Record> = {
            let applied = replica.applied.lock().expect("applied lock");
            let checked = self.seen.entry(key).or_default().records;
            assert!(
                applied.records.len() >= checked,
                "node {} group {}: applied records went from {checked} to {}",
                replica.node,
                replica.group,
                applied.records.len()
            );
            applied.records[checked..].to_vec()
        };
        let seen = self.seen.entry(key).or_default();
        let first_index = seen.records as u64;
        seen.records += new.len();
        for (expected_index, record) in (first_index..).zip(new) {
            assert_eq!(
                record.log_id.index, expected_index,
                "node {} group {} applied out of order",
                replica.node, replica.group
            );
            self.learn_committed(replica, record);
        }
    }

    /// Stored log entries up to the replica's applied index are committed: they must match.
    fn check_stored_log(&mut self, replica: &Replica) {
        let key = (replica.node, replica.group);
        let seen = self.seen.entry(key).or_default();
        let applied_end = seen.records as u64;
        if seen.log_checked >= applied_end {
            return;
        }
        let from = seen.log_checked;
        seen.log_checked = applied_end;
        for record in stored_log(replica, from, applied_end) {
            self.assert_committed_matches(replica, "stored log", &record);
        }
    }

    /// The periodic deep check: every replica's whole stored log. Entries up to the applied
    /// index still equal the committed ones (nothing committed was truncated or rewritten),
    /// and any two logs agree up to the last index where their log ids agree (log matching).
    pub fn check_full_logs(&mut self, replicas: &[Replica]) {
        let mut logs: BTreeMap<GroupId, Vec<(u64, Vec<Record>)>> = BTreeMap::new();
        for replica in replicas {
            let applied_end = self
                .seen
                .get(&(replica.node, replica.group))
                .map_or(0, |s| s.records as u64);
            let log = stored_log(replica, 0, u64::MAX);
            for (position, record) in log.iter().enumerate() {
                assert_eq!(
                    record.log_id.index, position as u64,
                    "node {} group {}: stored log has a gap",
                    replica.node, replica.group
                );
                if record.log_id.index < applied_end {
                    self.assert_committed_matches(replica, "stored log (full scan)", record);
                } else {
                    self.uncommitted_seen.insert((replica.group, record.log_id));
                }
            }
            logs.entry(replica.group)
                .or_default()
                .push((replica.node, log));
        }
        for (group, logs) in &logs {
            for (i, (node_a, a)) in logs.iter().enumerate() {
                for (node_b, b) in &logs[i + 1..] {
                    assert_log_matching(*group, (*node_a, a.as_slice()), (*node_b, b.as_slice()));
                }
            }
        }
    }

    /// Whether every group has converged: each replica applied the same entries, its stored
    /// log holds exactly those (nothing uncommitted is left), and every acknowledged entry is
    /// among them.
    pub fn converged(&self, replicas: &[Replica]) -> Result<(), String> {
        let mut by_group: BTreeMap<GroupId, Vec<&Replica>> = BTreeMap::new();
        for replica in replicas {
            by_group.entry(replica.group).or_default().push(replica);
        }
        for (group, replicas) in by_group {
            let reference = replicas[0].applied.lock().expect("applied lock").clone();
            for replica in &replicas {
                let metrics = replica.raft.metrics().borrow_watched().clone();
                let applied = replica.applied.lock().expect("applied lock");
                let last_applied = applied.last_applied.map(|id| id.index);
                if metrics.last_log_index != last_applied {
                    return Err(format!(
                        "node {} group {group}: last log index {:?}, last applied {last_applied:?}",
                        replica.node, metrics.last_log_index
                    ));
                }
                let stored = stored_log(replica, 0, u64::MAX);
                if stored != applied.records {
                    return Err(format!(
                        "node {} group {group}: stored log holds {} entries, applied {}",
                        replica.node,
                        stored.len(),
                        applied.records.len()
                    ));
                }
                if applied.records != reference.records {
                    return Err(format!(
                        "node {} group {group}: applied {} entries, node {} applied {}",
                        replica.node,
                        applied.records.len(),
                        replicas[0].node,
                        reference.records.len()
                    ));
                }
            }
            for (index, ack) in self.acked.get(&group).into_iter().flatten() {
                match reference.records.get(*index as usize) {
                    Some(record) => assert_acked_matches(ack, record),
                    None => return Err(format!("{group}: acknowledged index {index} not applied")),
                }
            }
        }
        Ok(())
    }

    /// (group, term, nodes) where several nodes led one term in turn: legitimate with
    /// `leader_id_adv`, reported so a run shows whether it happened.
    pub fn terms_with_several_leaders(&self) -> Vec<(GroupId, u64, Vec<u64>)> {
        self.leaders_by_term
            .iter()
            .filter(|(_, nodes)| nodes.len() > 1)
            .map(|((group, term), nodes)| (*group, *term, nodes.iter().copied().collect()))
            .collect()
    }

    /// Entries some log held that lost to another leader's entry at their index: how often
    /// the run made Raft truncate a log.
    pub fn discarded_entries(&self) -> usize {
        self.uncommitted_seen
            .iter()
            .filter(|(group, log_id)| {
                self.committed(*group, log_id.index)
                    .is_some_and(|record| record.log_id != *log_id)
            })
            .count()
    }

    pub fn leader_ids_seen(&self) -> usize {
        self.leaders.len()
    }

    pub fn committed_entries(&self) -> usize {
        self.committed.values().map(BTreeMap::len).sum()
    }

    /// Simulated time of the group's latest acknowledgement.
    pub fn last_ack_at(&self, group: GroupId) -> Option<Duration> {
        self.last_ack_at.get(&group).copied()
    }

    pub fn acked_entries(&self) -> usize {
        self.acked.values().map(BTreeMap::len).sum()
    }

    fn committed(&self, group: GroupId, index: u64) -> Option<&Record> {
        self.committed.get(&group)?.get(&index)
    }

    fn learn_committed(&mut self, replica: &Replica, record: Record) {
        let index = record.log_id.index;
        if let Some(ack) = self.acked.get(&replica.group).and_then(|a| a.get(&index)) {
            assert_acked_matches(ack, &record);
        }
        let known = self
            .committed
            .entry(replica.group)
            .or_default()
            .entry(index)
            .or_insert_with(|| record.clone());
        assert_eq!(
            *known, record,
            "node {} group {} applied a different entry at committed index {index}",
            replica.node, replica.group
        );
    }

    fn assert_committed_matches(&self, replica: &Replica, source: &str, record: &Record) {
        let index = record.log_id.index;
        let known = self
            .committed(replica.group, index)
            .unwrap_or_else(|| panic!("{source}: index {index} applied but not recorded"));
        assert_eq!(
            known, record,
            "node {} group {}: committed index {index} changed in the {source}",
            replica.node, replica.group
        );
    }
}

/// A replica's stored log entries with index in `[from, to)`.
fn stored_log(replica: &Replica, from: u64, to: u64) -> Vec<Record> {
    replica
        .shard
        .log_entries(replica.group, from, to)
        .expect("read stored log")
        .iter()
        .map(|(_, bytes)| Record::of(&decode_entry(bytes).expect("decode stored entry")))
        .collect()
}

fn assert_acked_matches(ack: &Ack, record: &Record) {
    assert_eq!(
        ack.log_id, record.log_id,
        "acknowledged entry {:?} of {} was replaced at its index",
        ack.events, ack.group
    );
    assert_eq!(
        record.payload,
        crate::state_machine::Payload::Append(ack.events.clone()),
        "acknowledged entry of {} at {} carries other data",
        ack.group,
        ack.log_id
    );
}

/// Log matching: if two logs hold the same log id at some index, they are identical up to
/// that index.
fn assert_log_matching(group: GroupId, a: (u64, &[Record]), b: (u64, &[Record])) {
    let (node_a, log_a) = a;
    let (node_b, log_b) = b;
    let common = log_a.len().min(log_b.len());
    let Some(last_match) = (0..common)
        .rev()
        .find(|&i| log_a[i].log_id == log_b[i].log_id)
    else {
        return;
    };
    for i in 0..=last_match {
        assert_eq!(
            log_a[i], log_b[i],
            "group {group}: nodes {node_a} and {node_b} agree on index {last_match} but differ at {i}"
        );
    }
}
