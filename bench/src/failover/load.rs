//! Background load while leaders are killed: producers each send one small batch at a time
//! to every partition in turn, moving on to the next partition and node when a send fails.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::task::JoinSet;
use tributary_client::{Client, EventData, SendTarget};

use super::PartitionRef;

/// How long one background send keeps retrying (following hints, riding out a short leader
/// change) before the producer moves on.
const SEND_RETRY_DEADLINE: Duration = Duration::from_secs(1);
/// Pause after a failed send.
const ERROR_PAUSE: Duration = Duration::from_millis(20);

/// The running producers; [`BackgroundLoad::stop`] ends them.
pub(crate) struct BackgroundLoad {
    tasks: JoinSet<()>,
    counts: Arc<Counts>,
}

#[derive(Default)]
struct Counts {
    sends: AtomicU64,
    errors: AtomicU64,
}

impl BackgroundLoad {
    /// Starts `producers` producers sending `batch` through the nodes at `endpoints`.
    pub(crate) async fn start(
        endpoints: &[String],
        targets: Arc<[PartitionRef]>,
        producers: u32,
        batch: Vec<EventData>,
    ) -> anyhow::Result<BackgroundLoad> {
        assert!(!endpoints.is_empty() && !targets.is_empty());
        let mut clients = Vec::with_capacity(endpoints.len());
        for endpoint in endpoints {
            clients.push(
                Client::connect(endpoint)
                    .await?
                    .with_retry_deadline(SEND_RETRY_DEADLINE),
            );
        }
        let clients: Arc<[Client]> = clients.into();
        let batch: Arc<[EventData]> = batch.into();
        let counts = Arc::new(Counts::default());
        let mut tasks = JoinSet::new();
        for index in 0..producers as usize {
            let producer = Producer {
                clients: clients.clone(),
                targets: targets.clone(),
                batch: batch.clone(),
                counts: counts.clone(),
                node: index % clients.len(),
                // Spread the producers' starting partitions over the partitions.
                next: index * targets.len() / producers as usize,
            };
            tasks.spawn(producer.run());
        }
        Ok(BackgroundLoad { tasks, counts })
    }

    /// Acknowledged sends so far.
    pub(crate) fn sends(&self) -> u64 {
        self.counts.sends.load(Ordering::Relaxed)
    }

    /// Stops every producer; returns (acknowledged sends, failed sends).
    pub(crate) async fn stop(mut self) -> (u64, u64) {
        self.tasks.shutdown().await;
        (
            self.counts.sends.load(Ordering::Relaxed),
            self.counts.errors.load(Ordering::Relaxed),
        )
    }
}

struct Producer {
    clients: Arc<[Client]>,
    targets: Arc<[PartitionRef]>,
    batch: Arc<[EventData]>,
    counts: Arc<Counts>,
    /// The node this producer sends through now.
    node: usize,
    /// The next partition, as an index into `targets`.
    next: usize,
}

impl Producer {
    async fn run(mut self) {
        loop {
            let target = &self.targets[self.next % self.targets.len()];
            let result = self.clients[self.node]
                .producer()
                .send(
                    &target.event_hub,
                    SendTarget::PartitionId(target.partition_id.clone()),
                    self.batch.iter().cloned(),
                )
                .await;
            match result {
                Ok(_) => {
                    self.counts.sends.fetch_add(1, Ordering::Relaxed);
                    self.next += 1;
                }
                Err(_) => {
                    // The node may be the one just killed, or the partition may be without
                    // a leader: go on with the next partition, through the next node, so
                    // the load keeps reaching the partitions that are led.
                    self.counts.errors.fetch_add(1, Ordering::Relaxed);
                    self.node = (self.node + 1) % self.clients.len();
                    self.next += 1;
                    tokio::time::sleep(ERROR_PAUSE).await;
                }
            }
        }
    }
}
