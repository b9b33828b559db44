//! Measuring how long a partition takes to accept writes again: a probe send every interval
//! through the surviving nodes, each following NOT_LEADER hints itself (the SDK's retries
//! and backoff would blur the measurement), until the first one is acknowledged.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tributary_client::{Client, ClientError, ErrorReason, EventData, SendTarget};

use super::PartitionRef;

/// Probes in flight at once; a tick with this many outstanding sends none.
const PROBES_IN_FLIGHT_MAX: usize = 32;
/// How long one probe (with its hint hops) may take before it counts as failed.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// NOT_LEADER hints one probe follows.
const HINT_HOPS_MAX: u32 = 3;

/// Clients without retries, one per node endpoint, shared by all probes.
#[derive(Clone)]
pub(crate) struct Prober {
    clients: Arc<HashMap<String, Client>>,
}

impl Prober {
    pub(crate) async fn new(endpoints: &[String]) -> anyhow::Result<Prober> {
        let mut clients = HashMap::new();
        for endpoint in endpoints {
            let client = Client::connect(endpoint)
                .await?
                .with_retry_deadline(Duration::ZERO);
            clients.insert(endpoint.clone(), client);
        }
        Ok(Prober {
            clients: Arc::new(clients),
        })
    }

    /// The time from `killed_at` until a send to `target` is acknowledged, probing every
    /// `interval` through the nodes of `via` in turn; `Err` with the last probe's error if
    /// none is acknowledged within `timeout` of `killed_at`.
    pub(crate) async fn measure(
        &self,
        target: &PartitionRef,
        via: &[String],
        killed_at: Instant,
        interval: Duration,
        timeout: Duration,
    ) -> Result<Duration, String> {
        assert!(!via.is_empty(), "probes need a node to go through");
        let deadline = killed_at + timeout;
        let mut ticks = tokio::time::interval(interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut probes = JoinSet::new();
        let mut sent = 0usize;
        let mut last_error = "no probe finished".to_owned();
        loop {
            tokio::select! {
                _ = ticks.tick() => {
                    if probes.len() < PROBES_IN_FLIGHT_MAX {
                        let first = via[sent % via.len()].clone();
                        sent += 1;
                        probes.spawn(self.clone().probe(target.clone(), first));
                    }
                }
                Some(joined) = probes.join_next() => {
                    match joined.expect("a probe task panicked") {
                        Ok(acked_at) => return Ok(acked_at.saturating_duration_since(killed_at)),
                        Err(error) => last_error = error,
                    }
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(last_error);
                }
            }
        }
    }

    /// One send to `target` starting at `endpoint`; the instant it was acknowledged.
    async fn probe(self, target: PartitionRef, endpoint: String) -> Result<Instant, String> {
        match tokio::time::timeout(PROBE_TIMEOUT, self.send_following_hints(&target, endpoint))
            .await
        {
            Ok(Ok(())) => Ok(Instant::now()),
            Ok(Err(error)) => Err(error.to_string()),
            Err(_elapsed) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        }
    }

    async fn send_following_hints(
        &self,
        target: &PartitionRef,
        mut endpoint: String,
    ) -> Result<(), ClientError> {
        let mut hops = 0;
        loop {
            let client = match self.clients.get(&endpoint) {
                Some(client) => client.clone(),
                None => Client::connect(&endpoint)
                    .await?
                    .with_retry_deadline(Duration::ZERO),
            };
            let result = client
                .producer()
                .send(
                    &target.event_hub,
                    SendTarget::PartitionId(target.partition_id.clone()),
                    [EventData::from_body("failover probe")],
                )
                .await;
            match result {
                Ok(_) => return Ok(()),
                Err(ClientError::Service {
                    reason: ErrorReason::NotLeader,
                    leader_hint: Some(hint),
                    ..
                }) if hops < HINT_HOPS_MAX => {
                    hops += 1;
                    endpoint = if hint.contains("://") {
                        hint
                    } else {
                        format!("http://{hint}")
                    };
                }
                Err(error) => return Err(error),
            }
        }
    }
}
