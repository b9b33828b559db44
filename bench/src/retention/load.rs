//! The soak's steady load: producers each send a batch every [`SEND_INTERVAL`], sized so all
//! of them together send the target rate. A send that falls behind delays the producer's
//! schedule rather than being made up in a burst; a failed send is counted and the producer
//! goes on with its next batch.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};
use tributary_client::{Client, EventData, SendTarget};

/// How often each producer sends one batch.
pub(crate) const SEND_INTERVAL: Duration = Duration::from_millis(100);
/// The most event bytes one send may carry (half the nodes' default publish limit).
pub(crate) const SEND_BYTES_MAX: usize = 512 * 1024;
/// How long one send keeps retrying (following leader hints, riding out an election)
/// before it counts as failed.
const SEND_RETRY_DEADLINE: Duration = Duration::from_secs(5);

/// What the producers have done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LoadCounts {
    pub(crate) events_sent: u64,
    pub(crate) sends_failed: u64,
    pub(crate) events_failed: u64,
}

/// The running producers; [`SteadyLoad::stop`] ends them.
pub(crate) struct SteadyLoad {
    tasks: JoinSet<()>,
    counters: Arc<Counters>,
}

#[derive(Default)]
struct Counters {
    events_sent: AtomicU64,
    sends_failed: AtomicU64,
    events_failed: AtomicU64,
}

/// The load to run: `producers` producers sending `rate` events/s of `event_bytes` each to
/// `partition_ids` of `hub`, through the nodes at `endpoints` in turn.
pub(crate) struct LoadPlan<'a> {
    pub(crate) endpoints: &'a [String],
    pub(crate) hub: &'a str,
    pub(crate) partition_ids: &'a [String],
    pub(crate) producers: u32,
    pub(crate) rate: f64,
    pub(crate) event_bytes: usize,
}

/// Events one producer sends per [`SEND_INTERVAL`] on average.
pub(crate) fn events_per_send(rate: f64, producers: u32) -> f64 {
    rate / f64::from(producers) * SEND_INTERVAL.as_secs_f64()
}

impl SteadyLoad {
    /// Connects to every node and starts the producers, their schedules starting at
    /// `start` (spread over one send interval).
    pub(crate) async fn start(plan: LoadPlan<'_>, start: Instant) -> anyhow::Result<SteadyLoad> {
        assert!(!plan.endpoints.is_empty() && !plan.partition_ids.is_empty());
        let mut clients = Vec::with_capacity(plan.endpoints.len());
        for endpoint in plan.endpoints {
            clients.push(
                Client::connect(endpoint)
                    .await?
                    .with_retry_deadline(SEND_RETRY_DEADLINE),
            );
        }
        // Random bodies, so the bytes stored are the bytes sent whatever the storage does.
        let body: Bytes = (0..plan.event_bytes)
            .map(|_| rand::random::<u8>())
            .collect::<Vec<u8>>()
            .into();
        let hub: Arc<str> = plan.hub.into();
        let partition_ids: Arc<[String]> = plan.partition_ids.into();
        let counters = Arc::new(Counters::default());
        let per_send = events_per_send(plan.rate, plan.producers);
        let mut tasks = JoinSet::new();
        for index in 0..plan.producers as usize {
            let offset = SEND_INTERVAL.mul_f64(index as f64 / f64::from(plan.producers));
            let producer = Producer {
                client: clients[index % clients.len()].clone(),
                hub: hub.clone(),
                partition_ids: partition_ids.clone(),
                next_partition: index,
                body: body.clone(),
                per_send,
                counters: counters.clone(),
            };
            tasks.spawn(producer.run(start + offset));
        }
        Ok(SteadyLoad { tasks, counters })
    }

    pub(crate) fn counts(&self) -> LoadCounts {
        LoadCounts {
            events_sent: self.counters.events_sent.load(Ordering::Relaxed),
            sends_failed: self.counters.sends_failed.load(Ordering::Relaxed),
            events_failed: self.counters.events_failed.load(Ordering::Relaxed),
        }
    }

    /// Stops every producer (a send in flight is abandoned); returns the final counts.
    pub(crate) async fn stop(mut self) -> LoadCounts {
        self.tasks.shutdown().await;
        self.counts()
    }
}

struct Producer {
    client: Client,
    hub: Arc<str>,
    partition_ids: Arc<[String]>,
    /// The next partition, as an index into `partition_ids` (producers take them in turn).
    next_partition: usize,
    body: Bytes,
    /// Events per send on average; each send carries the whole events owed so far.
    per_send: f64,
    counters: Arc<Counters>,
}

impl Producer {
    async fn run(mut self, start: Instant) {
        let mut schedule = tokio::time::interval_at(start, SEND_INTERVAL);
        schedule.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut owed = 0.0;
        loop {
            schedule.tick().await;
            owed += self.per_send;
            let count = owed.floor();
            owed -= count;
            if count < 1.0 {
                continue;
            }
            let count = count as u64;
            let partition = &self.partition_ids[self.next_partition % self.partition_ids.len()];
            self.next_partition += 1;
            let events = (0..count).map(|_| EventData::from_body(self.body.clone()));
            let result = self
                .client
                .producer()
                .send(
                    &self.hub,
                    SendTarget::PartitionId(partition.clone()),
                    events,
                )
                .await;
            match result {
                Ok(_) => {
                    self.counters
                        .events_sent
                        .fetch_add(count, Ordering::Relaxed);
                }
                Err(_) => {
                    self.counters.sends_failed.fetch_add(1, Ordering::Relaxed);
                    self.counters
                        .events_failed
                        .fetch_add(count, Ordering::Relaxed);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn producers_share_the_rate_over_send_intervals() {
        assert!((events_per_send(1000.0, 4) - 25.0).abs() < 1e-9);
        assert!((events_per_send(300.0, 4) - 7.5).abs() < 1e-9);
    }
}
