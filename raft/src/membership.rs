//! Moving a group's voters to the set its owner wants: new members join as learners,
//! catch up (from the log, or from a snapshot when the log they need is purged), and only
//! then become voters, in one joint change that also drops members no longer wanted.

use std::collections::{BTreeMap, BTreeSet};

use openraft::BasicNode;
use openraft::storage::RaftStateMachine;
use openraft::type_config::async_runtime::WatchReceiver;

use crate::quiet::Hibernation;
use crate::types::{Raft, SnapshotData, TypeConfig};

/// How far (in log entries) a learner may trail the leader and still be promoted; under
/// continuous writes a learner is never exactly caught up.
pub const PROMOTE_LAG_MAX: u64 = 64;

/// What one reconciliation pass did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VoterChange {
    /// This replica does not lead the group, or the voters already match (and no change is
    /// left half-done).
    Nothing,
    /// Members were added as learners, or learners are still catching up.
    CatchingUp(Vec<u64>),
    /// Learners no longer wanted were removed.
    LearnersRemoved(Vec<u64>),
    /// The voters were replaced.
    Replaced { from: Vec<u64>, to: Vec<u64> },
}

/// One pass towards `desired` voters (member id → peer address). Runs only on the leader;
/// call it again until it returns [`VoterChange::Nothing`]. A sleeping group is woken before
/// a change (a leader that slept refuses changes until it has confirmed its leadership).
pub async fn reconcile_voters<SM>(
    raft: &Raft<SM>,
    hibernation: &Hibernation,
    me: u64,
    desired: &BTreeMap<u64, String>,
) -> Result<VoterChange, String>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    if desired.is_empty() {
        return Ok(VoterChange::Nothing);
    }
    let (voters, learners, joint, matched, last_log) = {
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        if m.current_leader != Some(me) {
            return Ok(VoterChange::Nothing);
        }
        let membership = m.membership_config.membership();
        (
            membership.voter_ids().collect::<BTreeSet<u64>>(),
            membership.learner_ids().collect::<BTreeSet<u64>>(),
            membership.get_joint_config().len() > 1,
            m.replication.clone().unwrap_or_default(),
            m.last_log_index.unwrap_or(0),
        )
    };
    let wanted: BTreeSet<u64> = desired.keys().copied().collect();
    // A joint config seen here is a change left half-done: its leader lost leadership
    // between the joint and the final config (openraft does not finish it by itself), so
    // it is driven on to `wanted` below (openraft changes from a joint config directly).
    if voters == wanted && !joint {
        // Learners left over from an abandoned change (a replica move rolled back) stop
        // receiving the log.
        let stray: BTreeSet<u64> = learners.difference(&wanted).copied().collect();
        if stray.is_empty() {
            return Ok(VoterChange::Nothing);
        }
        hibernation.wake_for_write(raft).await;
        raft.change_membership(openraft::ChangeMembers::RemoveNodes(stray.clone()), false)
            .await
            .map_err(|e| format!("removing learners {stray:?}: {e}"))?;
        return Ok(VoterChange::LearnersRemoved(stray.into_iter().collect()));
    }
    let mut waiting = Vec::new();
    for (&member, addr) in desired {
        if voters.contains(&member) {
            continue;
        }
        if !learners.contains(&member) {
            hibernation.wake_for_write(raft).await;
            raft.add_learner(member, BasicNode::new(addr.clone()), false)
                .await
                .map_err(|e| format!("adding learner {member}: {e}"))?;
            waiting.push(member);
            continue;
        }
        let caught_up = matched
            .get(&member)
            .copied()
            .flatten()
            .is_some_and(|id| id.index + PROMOTE_LAG_MAX >= last_log);
        if !caught_up {
            waiting.push(member);
        }
    }
    if !waiting.is_empty() {
        return Ok(VoterChange::CatchingUp(waiting));
    }
    hibernation.wake_for_write(raft).await;
    raft.change_membership(wanted.clone(), false)
        .await
        .map_err(|e| format!("replacing voters: {e}"))?;
    Ok(VoterChange::Replaced {
        from: voters.into_iter().collect(),
        to: wanted.into_iter().collect(),
    })
}

/// On the leader: hands leadership to the first of `candidates` (member ids, in order of
/// preference) that is a voter and has stored everything the leader has. Returns the
/// member it was handed to, or `None` when this replica does not lead or no candidate is
/// ready yet (call again later).
pub async fn transfer_leadership<SM>(
    raft: &Raft<SM>,
    hibernation: &Hibernation,
    me: u64,
    candidates: &[u64],
) -> Result<Option<u64>, String>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let target = {
        let metrics = raft.metrics();
        let m = metrics.borrow_watched();
        if m.current_leader != Some(me) {
            return Ok(None);
        }
        let voters: BTreeSet<u64> = m.membership_config.membership().voter_ids().collect();
        let last_log = m.last_log_index;
        let matched = m.replication.clone().unwrap_or_default();
        candidates.iter().copied().find(|c| {
            *c != me
                && voters.contains(c)
                && matched.get(c).copied().flatten().map(|id| id.index) == last_log
        })
    };
    let Some(target) = target else {
        return Ok(None);
    };
    hibernation.wake_for_write(raft).await;
    raft.trigger()
        .transfer_leader(target)
        .await
        .map_err(|e| format!("transferring leadership to {target}: {e}"))?;
    Ok(Some(target))
}
