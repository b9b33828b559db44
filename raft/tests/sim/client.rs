//! The workload: writers that propose appends to whichever replica claims to lead, retry on
//! any error, and record every acknowledged entry for the checker.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use openraft::ServerState;
use openraft::async_runtime::WatchReceiver;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tributary_raft::{AppendBatch, LogId, Proposal, ProposalResult};
use tributary_types::GroupId;

use crate::cluster::{Registry, Replica, groups};

/// Concurrent writers per group.
const WRITERS_PER_GROUP: u64 = 2;
/// Pause between a writer's proposals, so a run stays a few thousand entries long.
const WRITE_INTERVAL: Duration = Duration::from_millis(100);
/// How long a writer waits for an unacknowledged proposal before trying again.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a writer waits when no replica claims to lead.
const NO_LEADER_PAUSE: Duration = Duration::from_millis(50);

/// An entry the cluster acknowledged: it must never be lost.
#[derive(Debug, Clone)]
pub struct Ack {
    pub group: GroupId,
    pub log_id: LogId,
    pub events: Bytes,
    /// Simulated time of the acknowledgement.
    pub at: Duration,
}

/// What the writers report to the driver.
#[derive(Default)]
pub struct Workload {
    /// Acknowledged entries not yet taken by the checker.
    pub acks: Mutex<Vec<Ack>>,
    pub attempts: AtomicU64,
    pub failures: AtomicU64,
    /// Set by the driver to end the workload.
    pub stop: AtomicBool,
}

/// The client host's software: runs the writers until [`Workload::stop`] is set.
pub async fn run(registry: Registry, workload: Arc<Workload>, seed: u64) -> turmoil::Result {
    let mut writers = Vec::new();
    for (g, group) in groups().into_iter().enumerate() {
        for w in 0..WRITERS_PER_GROUP {
            let rng = StdRng::seed_from_u64(seed ^ ((g as u64) << 32 | w));
            let writer = write_loop(group, w, registry.clone(), workload.clone(), rng);
            writers.push(tokio::task::spawn_local(writer));
        }
    }
    for writer in writers {
        writer.await?;
    }
    Ok(())
}

async fn write_loop(
    group: GroupId,
    writer: u64,
    registry: Registry,
    workload: Arc<Workload>,
    mut rng: StdRng,
) {
    let mut attempt = 0u64;
    while !workload.stop.load(Ordering::Relaxed) {
        let Some(leader) = pick_leader(&registry, group, &mut rng) else {
            tokio::time::sleep(NO_LEADER_PAUSE).await;
            continue;
        };
        attempt += 1;
        // Unique per attempt, so an entry found in a log names the attempt that proposed it.
        let events = Bytes::from(format!("p{}-w{writer}-a{attempt}", group.partition.0));
        let proposal = Proposal::Append(AppendBatch {
            enqueued_time_ms: sim_time().as_millis() as i64,
            event_count: 1,
            events: events.clone(),
            producer: None,
        });
        workload.attempts.fetch_add(1, Ordering::Relaxed);
        match tokio::time::timeout(WRITE_TIMEOUT, leader.raft.client_write(proposal)).await {
            Ok(Ok(response)) => {
                assert!(
                    matches!(response.data, ProposalResult::Appended(_)),
                    "an append is answered with its outcome"
                );
                workload.acks.lock().expect("acks lock").push(Ack {
                    group,
                    log_id: response.log_id,
                    events,
                    at: sim_time(),
                });
            }
            Ok(Err(_)) | Err(_) => {
                workload.failures.fetch_add(1, Ordering::Relaxed);
            }
        }
        tokio::time::sleep(WRITE_INTERVAL).await;
    }
}

/// A replica of `group` that claims to lead; a random one when a stale leader still claims
/// it too, so stale leaders get proposals as well.
fn pick_leader(registry: &Registry, group: GroupId, rng: &mut StdRng) -> Option<Replica> {
    let leaders: Vec<Replica> = registry
        .lock()
        .expect("registry lock")
        .iter()
        .filter(|r| {
            r.group == group && r.raft.metrics().borrow_watched().state == ServerState::Leader
        })
        .cloned()
        .collect();
    if leaders.is_empty() {
        return None;
    }
    let i = rng.random_range(0..leaders.len());
    leaders.into_iter().nth(i)
}

fn sim_time() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}
