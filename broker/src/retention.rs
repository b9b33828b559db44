//! The node's retention task: every `--retention-interval`, each local partition replica
//! removes what its hub no longer retains (see [`crate::partition::retention`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tributary_types::HubId;

use crate::broker::Broker;
use crate::partition::compaction::CompactionPolicy;
use crate::partition::retention::{RetentionOutcome, RetentionPolicy};
use tributary_controller::state::HubRecord;

/// Partitions worked on at once in one pass.
const PARTITIONS_IN_FLIGHT_MAX: usize = 8;

/// What a hub's settings ask retention to do.
pub fn policy(hub: &HubRecord) -> RetentionPolicy {
    let settings = &hub.settings;
    RetentionPolicy {
        retention_ms: settings
            .cleanup_policy
            .deletes()
            .then_some(hub.retention_ms),
        bytes_max: (settings.retention_bytes_max > 0).then_some(settings.retention_bytes_max),
        compaction: settings
            .cleanup_policy
            .compacts()
            .then_some(CompactionPolicy {
                lag_ms: settings.compaction_lag_ms as i64,
                tombstone_retention_ms: settings.tombstone_retention_ms as i64,
            }),
        keep_from_sequence: None,
    }
}

/// Runs retention passes until the node shuts down, and records the storage gauges
/// ([`crate::disk::record`]) for `data_dir` after each.
pub async fn run(broker: Arc<Broker>, interval: Duration, data_dir: std::path::PathBuf) {
    let mut closing = broker.closing();
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = closing.wait_for(|c| *c) => return,
        }
        pass(&broker).await;
        let dir = data_dir.clone();
        let _ = tokio::task::spawn_blocking(move || crate::disk::record(&dir)).await;
    }
}

/// One pass over every local replica.
pub async fn pass(broker: &Broker) {
    let state = broker.runtime().state();
    let hubs: HashMap<HubId, &HubRecord> = state.hubs.values().map(|h| (h.id, h)).collect();
    let now_ms = broker.now_ms();
    let work = broker
        .local_partitions()
        .into_iter()
        .filter_map(|partition| {
            let hub = hubs.get(&partition.group.hub)?;
            let mut policy = policy(hub);
            // Events not captured yet stay, whatever their age (Capture back-fills after an
            // outage of its destination).
            if hub.settings.capture.is_some() {
                policy.keep_from_sequence = Some(partition.capture_progress().next_sequence);
            }
            Some((partition, policy))
        });
    futures::stream::iter(work)
        .for_each_concurrent(PARTITIONS_IN_FLIGHT_MAX, |(partition, policy)| async move {
            match partition.enforce_retention(policy, now_ms).await {
                Ok(RetentionOutcome::Cleaned { .. } | RetentionOutcome::Nothing) => {}
                Ok(RetentionOutcome::Waiting) => {
                    tracing::debug!(group = %partition.group, "retention waits for a log purge");
                }
                Err(err) => {
                    tracing::warn!(group = %partition.group, error = %err, "retention pass failed");
                }
            }
        })
        .await;
}
