//! The event processor: many instances of an application read one event hub together in a
//! consumer group. Partitions are spread over the running instances through ownership
//! records in a checkpoint store (the cluster's by default); each owned partition is read
//! with owner level 0, so a new owner displaces the old one's reader at once; events are
//! handed to the application per partition, in order, one batch at a time (partitions
//! concurrently); checkpoints say where a new owner starts. Load balancing follows Event
//! Hubs' (SPEC.md section 4), see [`plan_claims`].

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rand::Rng as _;
use rand::seq::IndexedRandom as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::checkpoints::{CheckpointStore, Claim, Ownership};
use crate::{Client, ClientError, EventPosition, ReceiveOptions, ReceivedEvent};

/// Event Hubs' JavaScript defaults, the tighter of the SDKs'.
pub const LOAD_BALANCING_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
pub const OWNERSHIP_EXPIRATION_DEFAULT: Duration = Duration::from_secs(30);
/// Owner level of every processor reader: equal levels displace, so a new owner takes over.
pub const PROCESSOR_OWNER_LEVEL: i64 = 0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadBalancingStrategy {
    /// Claims one partition per interval until balanced.
    Balanced,
    /// Claims every partition it is short of at once (and steals as many as it is short of
    /// expected, one from the busiest owner at a time).
    Greedy,
}

/// Why a partition stopped being processed here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Another instance claimed it (or displaced this instance's reader).
    OwnershipLost,
    /// This instance is stopping.
    Shutdown,
}

/// A partition being processed: where events come from and how to checkpoint them.
#[derive(Clone)]
pub struct PartitionContext {
    pub event_hub: String,
    pub consumer_group: String,
    pub partition_id: String,
    /// This instance: checkpoints apply only while it owns the partition.
    owner_id: String,
    store: Arc<dyn CheckpointStore>,
}

impl std::fmt::Debug for PartitionContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionContext")
            .field("event_hub", &self.event_hub)
            .field("consumer_group", &self.consumer_group)
            .field("partition_id", &self.partition_id)
            .finish_non_exhaustive()
    }
}

impl PartitionContext {
    /// Records `event` as processed: a new owner of the partition starts after it. Refused
    /// with [`crate::ErrorReason::NotOwner`] once another instance has claimed the partition
    /// (a late checkpoint must not move the new owner's back).
    pub async fn checkpoint(&self, event: &ReceivedEvent) -> Result<(), ClientError> {
        let offset = event.offset.parse::<i64>().map_err(|_| {
            ClientError::InvalidArgument(format!("event offset '{}' is not a number", event.offset))
        })?;
        self.store
            .update_checkpoint(
                &self.event_hub,
                &self.consumer_group,
                &self.partition_id,
                offset,
                event.sequence_number,
                Some(&self.owner_id),
            )
            .await
            .map(drop)
    }
}

/// What the application does with events. Calls for one partition never overlap; calls for
/// different partitions do.
#[tonic::async_trait]
pub trait EventHandler: Send + Sync + 'static {
    async fn process_events(&self, context: &PartitionContext, events: Vec<ReceivedEvent>);

    /// Before a partition is read: may choose where to start. `None` (the default) starts
    /// after the checkpoint, or at the processor's default start without one.
    async fn partition_initializing(
        &self,
        _context: &PartitionContext,
        _checkpoint: Option<crate::checkpoints::Checkpoint>,
    ) -> Option<EventPosition> {
        None
    }

    /// After the last `process_events` call for a partition here.
    async fn partition_closing(&self, _context: &PartitionContext, _reason: CloseReason) {}

    /// A failure the processor works around (it retries); `partition_id` when it concerns
    /// one partition.
    async fn process_error(&self, _partition_id: Option<&str>, _error: &ClientError) {}
}

#[derive(Debug, Clone)]
pub struct EventProcessorOptions {
    /// This instance's id in ownership records; unique per instance (a random one by
    /// default).
    pub owner_id: String,
    pub strategy: LoadBalancingStrategy,
    pub load_balancing_interval: Duration,
    /// An ownership record not renewed for this long is free to claim.
    pub ownership_expiration: Duration,
    /// Where a partition without a checkpoint starts.
    pub default_start: EventPosition,
    /// Events per `process_events` call at most (0: the service default, 300).
    pub max_batch: u32,
    /// Checkpoints the last processed event after every this many events (and when a
    /// partition closes); `None` leaves checkpoints to the handler.
    pub checkpoint_every: Option<u64>,
}

impl Default for EventProcessorOptions {
    fn default() -> Self {
        EventProcessorOptions {
            owner_id: format!("processor-{:016x}", rand::random::<u64>()),
            strategy: LoadBalancingStrategy::Greedy,
            load_balancing_interval: LOAD_BALANCING_INTERVAL_DEFAULT,
            ownership_expiration: OWNERSHIP_EXPIRATION_DEFAULT,
            default_start: EventPosition::Earliest,
            max_batch: 0,
            checkpoint_every: None,
        }
    }
}

/// The claims one load-balancing round makes (SPEC.md section 4), from the ownership
/// records listed at `now_ms`:
/// 1. unclaimed partitions (no record) and released ones (no owner, or not renewed for
///    `expiration_ms`) are claimable; the others are active, grouped by owner;
/// 2. with `owners` the active owners (this one counted even when it owns nothing),
///    `expected = P / owners` and `max = ceil(P / owners)`;
/// 3. every partition this instance actively owns is claimed again (the claim renews it);
/// 4. below `max`: greedy claims as many claimable partitions as it is short of `max`,
///    balanced one, chosen at random; when it took none and is below `expected`, it steals
///    a random partition of the owner holding the most (greedy: as many as it is short of
///    `expected`, each from the owner holding the most at that point, never taking an owner
///    down to `expected`).
pub fn plan_claims(
    records: &[Ownership],
    partition_ids: &[String],
    owner_id: &str,
    now_ms: i64,
    expiration_ms: i64,
    strategy: LoadBalancingStrategy,
    rng: &mut impl rand::Rng,
) -> Vec<Claim> {
    let by_partition: BTreeMap<&str, &Ownership> = records
        .iter()
        .map(|r| (r.partition_id.as_str(), r))
        .collect();
    let mut claimable: Vec<Claim> = Vec::new();
    let mut active: BTreeMap<&str, Vec<&Ownership>> = BTreeMap::new();
    for id in partition_ids {
        match by_partition.get(id.as_str()) {
            None => claimable.push(Claim {
                partition_id: id.clone(),
                owner_id: owner_id.to_string(),
                etag: None,
            }),
            Some(r) if r.owner_id.is_empty() || r.last_modified_ms + expiration_ms < now_ms => {
                claimable.push(Claim {
                    partition_id: id.clone(),
                    owner_id: owner_id.to_string(),
                    etag: Some(r.etag.clone()),
                })
            }
            Some(r) => active.entry(r.owner_id.as_str()).or_default().push(r),
        }
    }
    let claim_of = |r: &Ownership| Claim {
        partition_id: r.partition_id.clone(),
        owner_id: owner_id.to_string(),
        etag: Some(r.etag.clone()),
    };
    let mine: Vec<&Ownership> = active.remove(owner_id).unwrap_or_default();
    let owners = active.len() + 1;
    let partitions = partition_ids.len();
    let expected = partitions / owners;
    let max = partitions.div_ceil(owners);
    let own = mine.len();
    let mut claims: Vec<Claim> = mine.iter().map(|r| claim_of(r)).collect();
    let mut took = 0;
    if own < max && !claimable.is_empty() {
        let want = match strategy {
            LoadBalancingStrategy::Greedy => (max - own).min(claimable.len()),
            LoadBalancingStrategy::Balanced => 1,
        };
        claims.extend(claimable.choose_multiple(rng, want).cloned());
        took = want;
    }
    if took == 0 && own < expected {
        let steals = match strategy {
            LoadBalancingStrategy::Greedy => expected - own,
            LoadBalancingStrategy::Balanced => 1,
        };
        for _ in 0..steals {
            let most = active.values().map(Vec::len).max().unwrap_or(0);
            if most <= expected {
                break;
            }
            let busiest: Vec<&str> = active
                .iter()
                .filter(|(_, owned)| owned.len() == most)
                .map(|(owner, _)| *owner)
                .collect();
            let victim = *busiest.choose(rng).expect("an owner holds the most");
            let owned = active.get_mut(victim).expect("a listed owner");
            let index = rng.random_range(0..owned.len());
            let record = owned.swap_remove(index);
            claims.push(claim_of(record));
        }
    }
    claims
}

/// Builds and starts an [`EventProcessor`].
pub struct EventProcessor {
    client: Client,
    event_hub: String,
    consumer_group: String,
    handler: Arc<dyn EventHandler>,
    store: Arc<dyn CheckpointStore>,
    options: EventProcessorOptions,
}

impl EventProcessor {
    /// A processor of `event_hub` in `consumer_group` using the cluster's checkpoint store.
    /// Store calls go over a connection of their own: on the readers' connection they could
    /// wait behind event data that handlers have not consumed yet, while the handlers wait
    /// for their checkpoints (HTTP/2 flow control is per connection).
    pub fn new(
        client: &Client,
        event_hub: &str,
        consumer_group: &str,
        handler: Arc<dyn EventHandler>,
        options: EventProcessorOptions,
    ) -> Self {
        let store_client = client
            .separate_connection()
            .unwrap_or_else(|_| client.clone());
        EventProcessor {
            client: client.clone(),
            event_hub: event_hub.to_string(),
            consumer_group: consumer_group.to_string(),
            handler,
            store: Arc::new(store_client.checkpoint_store()),
            options,
        }
    }

    /// Uses another checkpoint store (e.g. [`crate::InMemoryCheckpointStore`]).
    pub fn with_store(mut self, store: Arc<dyn CheckpointStore>) -> Self {
        self.store = store;
        self
    }

    /// Looks up the hub's partitions and starts load balancing (the first round at once).
    pub async fn start(self) -> Result<RunningProcessor, ClientError> {
        let hub = self.client.get_event_hub(&self.event_hub).await?;
        let (stop, stopped) = watch::channel(false);
        let (owned_tx, owned) = watch::channel(BTreeSet::new());
        let owner_id = self.options.owner_id.clone();
        let balancer = Balancer {
            processor: self,
            partition_ids: hub.partition_ids,
            pumps: BTreeMap::new(),
            held: BTreeMap::new(),
            owned: Arc::new(owned_tx),
        };
        let task = tokio::spawn(balancer.run(stopped));
        Ok(RunningProcessor {
            owner_id,
            stop,
            task: Some(task),
            owned,
        })
    }
}

/// A started processor. Dropping it without [`RunningProcessor::stop`] leaves its
/// partitions to expire.
pub struct RunningProcessor {
    owner_id: String,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
    owned: watch::Receiver<BTreeSet<String>>,
}

impl RunningProcessor {
    pub fn owner_id(&self) -> &str {
        &self.owner_id
    }

    /// The partitions this instance owns after its last load-balancing round.
    pub fn owned_partitions(&self) -> BTreeSet<String> {
        self.owned.borrow().clone()
    }

    /// Changes whenever the owned partitions do.
    pub fn watch_owned(&self) -> watch::Receiver<BTreeSet<String>> {
        self.owned.clone()
    }

    /// Stops gracefully: each partition finishes the batch in hand (and checkpoints it with
    /// `checkpoint_every`), closes with [`CloseReason::Shutdown`], and its ownership is
    /// released so other instances take it over at their next round.
    pub async fn stop(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for RunningProcessor {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

struct Pump {
    /// Set to why the partition closes.
    stop: watch::Sender<Option<CloseReason>>,
    /// Until when this instance surely owns the partition: the start of the last claim that
    /// renewed it plus the ownership expiration (no other instance can claim it earlier by
    /// expiry). The pump hands no batch to the handler after it.
    lease: watch::Sender<Instant>,
    task: JoinHandle<()>,
}

struct Balancer {
    processor: EventProcessor,
    partition_ids: Vec<String>,
    pumps: BTreeMap<String, Pump>,
    /// Ownership records this instance won last, by partition id.
    held: BTreeMap<String, Ownership>,
    /// Shared with the pumps: a displaced reader leaves the set at once.
    owned: Arc<watch::Sender<BTreeSet<String>>>,
}

impl Balancer {
    async fn run(mut self, mut stopped: watch::Receiver<bool>) {
        loop {
            self.round().await;
            let interval = self.processor.options.load_balancing_interval;
            let jitter = interval.mul_f64(rand::rng().random_range(0.0..0.2));
            tokio::select! {
                _ = tokio::time::sleep(interval + jitter) => {}
                _ = stopped.wait_for(|s| *s) => break,
            }
        }
        self.shutdown().await;
    }

    fn context(&self, partition_id: &str) -> PartitionContext {
        PartitionContext {
            event_hub: self.processor.event_hub.clone(),
            consumer_group: self.processor.consumer_group.clone(),
            partition_id: partition_id.to_string(),
            owner_id: self.processor.options.owner_id.clone(),
            store: self.processor.store.clone(),
        }
    }

    async fn round(&mut self) {
        let p = &self.processor;
        let records = match p
            .store
            .list_ownership(&p.event_hub, &p.consumer_group)
            .await
        {
            Ok(records) => records,
            Err(err) => {
                p.handler.process_error(None, &err).await;
                return;
            }
        };
        // A partition another instance owns now was lost since the last round, even if this
        // round takes it back: its pump read on from where this instance was, not from the
        // other owner's checkpoints, so it stops and a new one starts from the checkpoint.
        let lost: Vec<String> = records
            .iter()
            .filter(|r| {
                r.owner_id != p.options.owner_id && self.pumps.contains_key(&r.partition_id)
            })
            .map(|r| r.partition_id.clone())
            .collect();
        for id in lost {
            self.held.remove(&id);
            let pump = self.pumps.remove(&id).expect("listed pump");
            pump.stop.send_replace(Some(CloseReason::OwnershipLost));
            let _ = pump.task.await;
        }
        let p = &self.processor;
        let claims = plan_claims(
            &records,
            &self.partition_ids,
            &p.options.owner_id,
            crate::time::now_ms(),
            p.options.ownership_expiration.as_millis() as i64,
            p.options.strategy,
            &mut rand::rng(),
        );
        let claimed_at = Instant::now();
        let won = match p
            .store
            .claim_ownership(&p.event_hub, &p.consumer_group, claims)
            .await
        {
            Ok(won) => won,
            Err(err) => {
                // Keep the current work; the next round tries again.
                p.handler.process_error(None, &err).await;
                return;
            }
        };
        self.held = won
            .into_iter()
            .map(|o| (o.partition_id.clone(), o))
            .collect();
        // Partitions lost, or whose reader ended (displaced, or failed): close them.
        let gone: Vec<String> = self
            .pumps
            .iter()
            .filter(|(id, pump)| !self.held.contains_key(*id) || pump.task.is_finished())
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let pump = self.pumps.remove(&id).expect("listed pump");
            pump.stop.send_replace(Some(CloseReason::OwnershipLost));
            let _ = pump.task.await;
        }
        let new: Vec<String> = self
            .held
            .keys()
            .filter(|id| !self.pumps.contains_key(*id))
            .cloned()
            .collect();
        let lease_end = claimed_at + self.processor.options.ownership_expiration;
        for pump in self.pumps.values() {
            pump.lease.send_replace(lease_end);
        }
        for id in new {
            let (stop, stopped) = watch::channel(None);
            let (lease, leased) = watch::channel(lease_end);
            let task = tokio::spawn(pump(
                self.processor.client.clone(),
                self.context(&id),
                self.processor.handler.clone(),
                self.processor.options.clone(),
                PumpSignals {
                    stop: stopped,
                    lease: leased,
                },
                self.owned.clone(),
            ));
            self.pumps.insert(id, Pump { stop, lease, task });
        }
        self.owned.send_replace(self.held.keys().cloned().collect());
    }

    async fn shutdown(&mut self) {
        for pump in self.pumps.values() {
            pump.stop.send_replace(Some(CloseReason::Shutdown));
        }
        for (_, pump) in std::mem::take(&mut self.pumps) {
            let _ = pump.task.await;
        }
        // Release what is still ours, so others need not wait for expiry.
        let p = &self.processor;
        let releases: Vec<Claim> = self
            .held
            .values()
            .map(|o| Claim {
                partition_id: o.partition_id.clone(),
                owner_id: String::new(),
                etag: Some(o.etag.clone()),
            })
            .collect();
        if !releases.is_empty()
            && let Err(err) = p
                .store
                .claim_ownership(&p.event_hub, &p.consumer_group, releases)
                .await
        {
            p.handler.process_error(None, &err).await;
        }
        self.held.clear();
        self.owned.send_replace(BTreeSet::new());
    }
}

/// What the balancer tells a pump: stop (and why), and until when its ownership holds.
struct PumpSignals {
    stop: watch::Receiver<Option<CloseReason>>,
    lease: watch::Receiver<Instant>,
}

/// Waits until the lease ends (a renewal moves its end later).
async fn lease_ended(lease: &mut watch::Receiver<Instant>) {
    loop {
        let end = *lease.borrow_and_update();
        tokio::select! {
            _ = tokio::time::sleep_until(end) => {
                if *lease.borrow() <= Instant::now() {
                    return;
                }
            }
            changed = lease.changed() => {
                if changed.is_err() {
                    // The balancer is gone: it told the stop signal too.
                    std::future::pending::<()>().await;
                }
            }
        }
    }
}

/// Reads one owned partition and hands its events to the handler until told to stop, its
/// reader ends, or its ownership could not be renewed in time (the store unreachable): then
/// another instance may own it, so this one stops rather than process alongside it.
async fn pump(
    client: Client,
    context: PartitionContext,
    handler: Arc<dyn EventHandler>,
    options: EventProcessorOptions,
    signals: PumpSignals,
    owned: Arc<watch::Sender<BTreeSet<String>>>,
) {
    let PumpSignals {
        mut stop,
        mut lease,
    } = signals;
    let checkpoint = match context
        .store
        .list_checkpoints(&context.event_hub, &context.consumer_group)
        .await
    {
        Ok(mut all) => all.remove(&context.partition_id),
        Err(err) => {
            handler
                .process_error(Some(&context.partition_id), &err)
                .await;
            return;
        }
    };
    let start = match handler.partition_initializing(&context, checkpoint).await {
        Some(position) => position,
        None => match checkpoint {
            Some(c) => EventPosition::SequenceNumber {
                sequence_number: c.sequence_number,
                inclusive: false,
            },
            None => options.default_start,
        },
    };
    let reader = client
        .consumer()
        .receive_with(
            &context.event_hub,
            &context.consumer_group,
            &context.partition_id,
            start,
            ReceiveOptions {
                max_batch: options.max_batch,
                owner_level: Some(PROCESSOR_OWNER_LEVEL),
                reader_name: options.owner_id.clone(),
            },
        )
        .await;
    let mut stream = match reader {
        Ok(stream) => stream,
        Err(err) => {
            handler
                .process_error(Some(&context.partition_id), &err)
                .await;
            return;
        }
    };
    let mut since_checkpoint = 0u64;
    let mut last: Option<ReceivedEvent> = None;
    let reason = loop {
        let batch = tokio::select! {
            batch = stream.next() => batch,
            told = stop.wait_for(Option::is_some) => {
                // A dropped balancer (the processor was dropped) is a shutdown too.
                break told.map_or(CloseReason::Shutdown, |reason| reason.unwrap_or(CloseReason::Shutdown));
            }
            () = lease_ended(&mut lease) => break lease_lost(&owned, &context),
        };
        match batch {
            Some(Ok(events)) => {
                if let Some(reason) = *stop.borrow() {
                    break reason;
                }
                if *lease.borrow() <= Instant::now() {
                    break lease_lost(&owned, &context);
                }
                since_checkpoint += events.len() as u64;
                let newest = events.last().cloned();
                handler.process_events(&context, events).await;
                if newest.is_some() {
                    last = newest;
                }
                if let (Some(every), Some(event)) = (options.checkpoint_every, &last)
                    && since_checkpoint >= every
                {
                    match context.checkpoint(event).await {
                        Ok(()) => since_checkpoint = 0,
                        // Claimed by another instance: its reader displaces ours shortly.
                        Err(err)
                            if err.reason() == Some(tributary_proto::ErrorReason::NotOwner) => {}
                        Err(err) => {
                            handler
                                .process_error(Some(&context.partition_id), &err)
                                .await
                        }
                    }
                }
            }
            Some(Err(err)) => {
                let displaced =
                    err.reason() == Some(tributary_proto::ErrorReason::ReaderDisconnected);
                if displaced {
                    // Another instance's reader took over: it owns the partition now.
                    owned.send_modify(|set| {
                        set.remove(&context.partition_id);
                    });
                } else {
                    handler
                        .process_error(Some(&context.partition_id), &err)
                        .await;
                }
                break CloseReason::OwnershipLost;
            }
            None => break CloseReason::OwnershipLost,
        }
    };
    // A stop also comes when ownership was lost at a round; only a processor shutdown is
    // a shutdown, and only then is a final checkpoint useful (the partition is released).
    if reason == CloseReason::Shutdown
        && since_checkpoint > 0
        && options.checkpoint_every.is_some()
        && let Some(event) = &last
        && let Err(err) = context.checkpoint(event).await
    {
        handler
            .process_error(Some(&context.partition_id), &err)
            .await;
    }
    handler.partition_closing(&context, reason).await;
}

/// The pump's ownership may have passed to another instance: it leaves the owned set.
fn lease_lost(owned: &watch::Sender<BTreeSet<String>>, context: &PartitionContext) -> CloseReason {
    owned.send_modify(|set| {
        set.remove(&context.partition_id);
    });
    CloseReason::OwnershipLost
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn ids(n: usize) -> Vec<String> {
        (0..n).map(|i| i.to_string()).collect()
    }

    fn record(partition: usize, owner: &str, at: i64) -> Ownership {
        Ownership {
            partition_id: partition.to_string(),
            owner_id: owner.into(),
            last_modified_ms: at,
            etag: format!("e{partition}"),
        }
    }

    fn count(claims: &[Claim]) -> usize {
        claims.len()
    }

    #[test]
    fn greedy_takes_its_share_of_unclaimed_partitions_and_balanced_one() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let records: Vec<Ownership> = (0..6).map(|p| record(p, "a", 1000)).collect();
        let greedy = plan_claims(
            &records,
            &ids(16),
            "b",
            1000,
            30_000,
            LoadBalancingStrategy::Greedy,
            &mut rng,
        );
        // Two owners: max 8; 10 unclaimed, so it claims 8.
        assert_eq!(count(&greedy), 8);
        assert!(greedy.iter().all(|c| c.etag.is_none()));
        let balanced = plan_claims(
            &records,
            &ids(16),
            "b",
            1000,
            30_000,
            LoadBalancingStrategy::Balanced,
            &mut rng,
        );
        assert_eq!(count(&balanced), 1);
    }

    #[test]
    fn own_records_are_renewed_and_expired_ones_are_claimable() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut records: Vec<Ownership> = (0..4).map(|p| record(p, "me", 1000)).collect();
        records.push(record(4, "gone", 1000 - 40_000));
        records.push(record(5, "", 1000));
        let claims = plan_claims(
            &records,
            &ids(6),
            "me",
            1000,
            30_000,
            LoadBalancingStrategy::Greedy,
            &mut rng,
        );
        let claimed: BTreeSet<&str> = claims.iter().map(|c| c.partition_id.as_str()).collect();
        assert_eq!(
            claimed,
            ["0", "1", "2", "3", "4", "5"].into_iter().collect()
        );
        assert!(claims.iter().all(|c| c.etag.is_some()));
    }

    #[test]
    fn stealing_takes_from_the_busiest_and_never_below_expected() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        // 16 partitions: a 6, b 5, c 5; d new. expected 4.
        let mut records = Vec::new();
        for p in 0..16 {
            let owner = match p {
                0..=5 => "a",
                6..=10 => "b",
                _ => "c",
            };
            records.push(record(p, owner, 1000));
        }
        let claims = plan_claims(
            &records,
            &ids(16),
            "d",
            1000,
            30_000,
            LoadBalancingStrategy::Greedy,
            &mut rng,
        );
        assert_eq!(claims.len(), 4);
        let from = |owner: &str| {
            claims
                .iter()
                .filter(|c| {
                    records
                        .iter()
                        .any(|r| r.partition_id == c.partition_id && r.owner_id == owner)
                })
                .count()
        };
        // a (the busiest) gives 2 (6 → 4), b and c one each (5 → 4).
        assert_eq!((from("a"), from("b"), from("c")), (2, 1, 1));
        let balanced = plan_claims(
            &records,
            &ids(16),
            "d",
            1000,
            30_000,
            LoadBalancingStrategy::Balanced,
            &mut rng,
        );
        assert_eq!(balanced.len(), 1);
        let stolen = &balanced[0].partition_id;
        assert!(
            records
                .iter()
                .any(|r| &r.partition_id == stolen && r.owner_id == "a")
        );
        // Balanced state: nobody claims anything but their own.
        let settled: Vec<Ownership> = (0..16)
            .map(|p| record(p, ["a", "b", "c", "d"][p % 4], 1000))
            .collect();
        for me in ["a", "b", "c", "d"] {
            let claims = plan_claims(
                &settled,
                &ids(16),
                me,
                1000,
                30_000,
                LoadBalancingStrategy::Greedy,
                &mut rng,
            );
            assert_eq!(claims.len(), 4);
            assert!(claims.iter().all(|c| {
                settled
                    .iter()
                    .any(|r| r.partition_id == c.partition_id && r.owner_id == me)
            }));
        }
    }
}
