//! The clients of a nemesis run, each recording what it did and saw into the history:
//! idempotent producers of uniquely numbered events, plain readers, event processors with
//! checkpoints (and a sampler of the checkpoints), management calls, and operations
//! (leadership drains, decommissions that move replicas).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use rand::Rng as _;
use rand::SeedableRng as _;
use rand::rngs::StdRng;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tributary_client::{
    CheckpointStore as _, Client, ClientError, CloseReason, ErrorReason, EventData, EventHandler,
    EventPosition, EventProcessor, EventProcessorOptions, IdempotentProducer,
    LoadBalancingStrategy, PartitionContext, ReceivedEvent, RunningProcessor,
};

use crate::eventually::poll_until;

use super::history::{
    CallOutcome, CheckpointSample, Delivered, EventId, History, ManagementOp, ManagementRecord,
    Millis, ProcessorCall, ReaderRecord, SendOutcome, SendRecord,
};

/// One attempt of a send may take this long before it is abandoned and retried (an isolated
/// leader may hold a send until the partition heals).
pub const SEND_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);
/// Pause between two attempts of one batch.
const SEND_RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a management or checkpoint-store call may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(20);
/// Checkpoints are sampled this often.
const CHECKPOINT_SAMPLE_INTERVAL: Duration = Duration::from_millis(500);
/// Processor settings: short, so takeovers happen within a run.
pub const PROCESSOR_INTERVAL: Duration = Duration::from_millis(1000);
pub const PROCESSOR_EXPIRATION: Duration = Duration::from_millis(5000);
/// A processor instance is replaced by a new one about this often.
const PROCESSOR_REPLACE_INTERVAL: Duration = Duration::from_secs(25);
/// Workload producer number of the availability probes.
pub const PROBE_PRODUCER: u32 = 1000;
/// The consumer group of the event processors.
pub const PROCESSOR_GROUP: &str = "processors";
/// Consumer groups of the plain readers: one reader per partition in each.
pub const READER_GROUPS: [&str; 2] = ["$Default", "audit"];
/// Name prefixes of what the management workload creates.
pub const MANAGED_HUB_PREFIX: &str = "managed-hub-";
pub const MANAGED_GROUP_PREFIX: &str = "managed-group-";

/// The history being recorded and the run's clock.
pub struct Recorder {
    started: Instant,
    history: Mutex<History>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            started: Instant::now(),
            history: Mutex::new(History::default()),
        })
    }

    /// Milliseconds since the run started.
    pub fn now_ms(&self) -> Millis {
        self.started.elapsed().as_millis() as Millis
    }

    pub fn with<R>(&self, f: impl FnOnce(&mut History) -> R) -> R {
        f(&mut self.history.lock().expect("history lock"))
    }

    pub fn take(&self) -> History {
        std::mem::take(&mut *self.history.lock().expect("history lock"))
    }
}

/// What the workload does.
#[derive(Debug, Clone)]
pub struct WorkloadConfig {
    pub hub: String,
    pub partitions: u32,
    pub producers: u32,
    /// Events per batch: 1 to this.
    pub batch_max: u32,
    /// Bytes added to each body.
    pub padding: usize,
    /// Pause between two batches of one producer to one partition.
    pub send_pause: Duration,
    pub processors: usize,
    pub management: bool,
    /// Leadership drains and decommissions (replica moves, with more nodes than the
    /// replication factor) during the run.
    pub operations: bool,
}

/// Stops the workload's loops: `Stop` ends new work; in-flight sends still finish.
#[derive(Clone)]
pub struct StopSignal {
    tx: Arc<watch::Sender<bool>>,
}

impl StopSignal {
    fn new() -> StopSignal {
        StopSignal {
            tx: Arc::new(watch::channel(false).0),
        }
    }

    fn stop(&self) {
        self.tx.send_replace(true);
    }

    fn is_stopped(&self) -> bool {
        *self.tx.borrow()
    }

    /// Sleeps `duration`; returns false when stopped meanwhile.
    async fn sleep(&self, duration: Duration) -> bool {
        let mut rx = self.tx.subscribe();
        tokio::select! {
            _ = tokio::time::sleep(duration) => {}
            _ = rx.wait_for(|stopped| *stopped) => {}
        }
        !self.is_stopped()
    }

    async fn stopped(&self) {
        let mut rx = self.tx.subscribe();
        let _ = rx.wait_for(|stopped| *stopped).await;
    }
}

/// The running workload.
pub struct Workload {
    recorder: Arc<Recorder>,
    config: WorkloadConfig,
    endpoints: Vec<String>,
    producers_stop: StopSignal,
    /// Sends still being retried must end by this signal.
    producers_abandon: StopSignal,
    producers: JoinSet<()>,
    readers_stop: StopSignal,
    readers: JoinSet<()>,
    others_stop: StopSignal,
    others: JoinSet<()>,
    processors: Arc<tokio::sync::Mutex<Vec<RunningProcessor>>>,
    /// Acknowledged events per partition (to wait for progress).
    acked: Arc<Vec<AtomicU64>>,
}

impl Workload {
    /// Creates the hub and its consumer groups, then starts every client.
    pub async fn start(
        recorder: Arc<Recorder>,
        config: WorkloadConfig,
        endpoints: Vec<String>,
        seed: u64,
    ) -> anyhow::Result<Workload> {
        let admin = Client::connect(&endpoints[0]).await?;
        admin
            .create_replicated_event_hub(&config.hub, config.partitions, None, Some(3))
            .await?;
        for group in [READER_GROUPS[1], PROCESSOR_GROUP] {
            admin.create_consumer_group(&config.hub, group).await?;
        }
        let mut workload = Workload {
            recorder,
            acked: Arc::new((0..config.partitions).map(|_| AtomicU64::new(0)).collect()),
            config,
            endpoints,
            producers_stop: StopSignal::new(),
            producers_abandon: StopSignal::new(),
            producers: JoinSet::new(),
            readers_stop: StopSignal::new(),
            readers: JoinSet::new(),
            others_stop: StopSignal::new(),
            others: JoinSet::new(),
            processors: Arc::default(),
        };
        let mut rng = StdRng::seed_from_u64(seed);
        workload.start_producers(&mut rng).await?;
        workload.start_readers().await?;
        workload.start_processors().await?;
        if workload.config.management {
            let task = management_loop(
                workload.recorder.clone(),
                workload.endpoints.clone(),
                workload.config.hub.clone(),
                workload.others_stop.clone(),
                rng.random(),
            );
            workload.others.spawn(task);
        }
        if workload.config.operations {
            let task = operations_loop(
                workload.endpoints.clone(),
                workload.others_stop.clone(),
                rng.random(),
            );
            workload.others.spawn(task);
        }
        Ok(workload)
    }

    async fn client(&self, i: usize) -> anyhow::Result<Client> {
        Ok(connect_from(&self.endpoints, i).await?)
    }

    async fn start_producers(&mut self, rng: &mut StdRng) -> anyhow::Result<()> {
        for producer in 0..self.config.producers {
            let client = self.client(producer as usize).await?;
            let numbers = Arc::new(AtomicU64::new(0));
            for partition in 0..self.config.partitions {
                let sender = BatchSender {
                    recorder: self.recorder.clone(),
                    client: client.clone(),
                    hub: self.config.hub.clone(),
                    partition: partition.to_string(),
                    producer,
                    numbers: numbers.clone(),
                    padding: self.config.padding,
                    acked: self.acked.clone(),
                };
                self.producers.spawn(produce(
                    sender,
                    self.config.batch_max,
                    self.config.send_pause,
                    self.producers_stop.clone(),
                    self.producers_abandon.clone(),
                    rng.random(),
                ));
            }
        }
        Ok(())
    }

    async fn start_readers(&mut self) -> anyhow::Result<()> {
        for (g, group) in READER_GROUPS.iter().enumerate() {
            for partition in 0..self.config.partitions {
                let client = self.client(g + partition as usize).await?;
                let index = self.recorder.with(|h| {
                    h.readers.push(ReaderRecord {
                        reader: format!("{group}/{partition}"),
                        partition: partition.to_string(),
                        events: Vec::new(),
                    });
                    h.readers.len() - 1
                });
                self.readers.spawn(read(
                    self.recorder.clone(),
                    client,
                    self.config.hub.clone(),
                    (*group).to_owned(),
                    partition.to_string(),
                    index,
                    self.readers_stop.clone(),
                ));
            }
        }
        Ok(())
    }

    async fn start_processors(&mut self) -> anyhow::Result<()> {
        if self.config.processors == 0 {
            return Ok(());
        }
        for i in 0..self.config.processors {
            let processor = start_processor(
                self.recorder.clone(),
                self.client(i).await?,
                &self.config.hub,
                format!("processor-{i}"),
            )
            .await?;
            self.processors.lock().await.push(processor);
        }
        let store = self.client(1).await?.checkpoint_store();
        self.others.spawn(sample_checkpoints(
            self.recorder.clone(),
            store,
            self.config.hub.clone(),
            self.others_stop.clone(),
        ));
        self.others.spawn(replace_processors(
            self.recorder.clone(),
            self.endpoints.clone(),
            self.config.hub.clone(),
            self.processors.clone(),
            self.config.processors,
            self.others_stop.clone(),
        ));
        Ok(())
    }

    /// Events acknowledged so far per partition.
    pub fn acked_per_partition(&self) -> Vec<u64> {
        self.acked
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect()
    }

    /// Stops starting new batches and waits up to `drain` for the batches being retried;
    /// those still unacknowledged then stay indeterminate.
    pub async fn stop_producers(&mut self, drain: Duration) {
        self.producers_stop.stop();
        if tokio::time::timeout(drain, async {
            while self.producers.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            self.producers_abandon.stop();
            while self.producers.join_next().await.is_some() {}
        }
    }

    /// Stops the management and operations loops, the checkpoint sampler and the
    /// processors (gracefully).
    pub async fn stop_others(&mut self) {
        self.others_stop.stop();
        while self.others.join_next().await.is_some() {}
        let processors = std::mem::take(&mut *self.processors.lock().await);
        for processor in processors {
            let _ = tokio::time::timeout(CALL_TIMEOUT, processor.stop()).await;
        }
    }

    /// Waits until every plain reader has delivered through `last_sequence[partition]` (or
    /// `timeout` passes), then stops them.
    pub async fn stop_readers(&mut self, last_sequence: &BTreeMap<String, i64>, timeout: Duration) {
        // Stopped when the timeout passes, caught up or not (the checker judges).
        let _ = poll_until(timeout, async || {
            let behind = self.recorder.with(|h| {
                h.readers.iter().any(|r| {
                    let last = r.events.last().map_or(-1, |e| e.sequence);
                    last_sequence
                        .get(&r.partition)
                        .is_some_and(|end| last < *end)
                })
            });
            if behind { Err(()) } else { Ok(()) }
        })
        .await;
        self.readers_stop.stop();
        while self.readers.join_next().await.is_some() {}
    }
}

/// A client knowing every node, whose calls go to node `first` (modulo the count) first.
pub async fn connect_from(endpoints: &[String], first: usize) -> Result<Client, ClientError> {
    let n = endpoints.len();
    let rotated: Vec<&String> = (0..n).map(|k| &endpoints[(first + k) % n]).collect();
    Client::connect_any(&rotated).await
}

/// Sends batches of one workload producer to one partition.
struct BatchSender {
    recorder: Arc<Recorder>,
    client: Client,
    hub: String,
    partition: String,
    producer: u32,
    numbers: Arc<AtomicU64>,
    padding: usize,
    acked: Arc<Vec<AtomicU64>>,
}

impl BatchSender {
    /// Sends one batch of `count` new events, retrying it with the same producer sequence
    /// until it is acknowledged or `abandon` says to stop; records it either way. Returns
    /// whether it was acknowledged.
    async fn send_batch(
        &self,
        producer: &mut IdempotentProducer,
        count: u32,
        abandon: &StopSignal,
    ) -> bool {
        let events: Vec<EventId> = (0..count)
            .map(|_| EventId {
                producer: self.producer,
                number: self.numbers.fetch_add(1, Ordering::Relaxed),
            })
            .collect();
        let data: Vec<EventData> = events
            .iter()
            .map(|id| EventData::from_body(id.body(self.padding)))
            .collect();
        let index = self.recorder.with(|h| {
            h.sends.push(SendRecord {
                producer: self.producer,
                partition: self.partition.clone(),
                events: events.clone(),
                invoked_ms: self.recorder.now_ms(),
                acked_ms: None,
                attempts: 0,
                outcome: SendOutcome::Indeterminate {
                    last_error: "not acknowledged".into(),
                },
            });
            h.sends.len() - 1
        });
        let mut last_error;
        loop {
            self.recorder.with(|h| h.sends[index].attempts += 1);
            let attempt = tokio::time::timeout(
                SEND_ATTEMPT_TIMEOUT,
                producer.send(&self.hub, &self.partition, data.clone()),
            )
            .await;
            match attempt {
                Ok(Ok(response)) => {
                    let offsets = response
                        .offsets
                        .iter()
                        .map(|o| o.parse::<i64>().unwrap_or(-1))
                        .collect();
                    self.recorder.with(|h| {
                        let record = &mut h.sends[index];
                        record.acked_ms = Some(self.recorder.now_ms());
                        record.outcome = SendOutcome::Acked {
                            first_sequence: response.first_sequence_number,
                            offsets,
                        };
                    });
                    if let Some(acked) = self
                        .partition
                        .parse::<usize>()
                        .ok()
                        .and_then(|p| self.acked.get(p))
                    {
                        acked.fetch_add(u64::from(count), Ordering::Relaxed);
                    }
                    return true;
                }
                Ok(Err(err)) if !retriable(&err) => {
                    // The producer's sequence can no longer be trusted: go on with a new
                    // producer id, and leave this batch indeterminate.
                    last_error = err.to_string();
                    *producer = self.client.idempotent_producer();
                    break;
                }
                Ok(Err(err)) => last_error = err.to_string(),
                Err(_elapsed) => {
                    last_error = format!("no answer within {SEND_ATTEMPT_TIMEOUT:?}");
                }
            }
            if !abandon.sleep(SEND_RETRY_PAUSE).await {
                break;
            }
        }
        self.recorder.with(|h| {
            h.sends[index].outcome = SendOutcome::Indeterminate { last_error };
        });
        false
    }
}

/// Errors after which the same batch is worth sending again.
fn retriable(err: &ClientError) -> bool {
    err.is_transient()
        || matches!(
            err.reason(),
            Some(ErrorReason::NotLeader | ErrorReason::ServerBusy | ErrorReason::Unspecified)
        )
        || matches!(err, ClientError::Service { code, .. } if *code == tonic::Code::Unknown || *code == tonic::Code::Internal || *code == tonic::Code::DeadlineExceeded)
}

async fn produce(
    sender: BatchSender,
    batch_max: u32,
    pause: Duration,
    stop: StopSignal,
    abandon: StopSignal,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut producer = sender.client.idempotent_producer();
    while !stop.is_stopped() {
        let count = rng.random_range(1..=batch_max);
        sender.send_batch(&mut producer, count, &abandon).await;
        let jittered = pause.mul_f64(rng.random_range(0.5..1.5));
        if !stop.sleep(jittered).await {
            break;
        }
    }
}

/// Sends one probe event to `partition` until it is acknowledged or `deadline` passes;
/// recorded like the workload's own sends. Returns when it was acknowledged.
pub async fn probe_send(
    recorder: &Arc<Recorder>,
    client: &Client,
    hub: &str,
    partition: u32,
    numbers: &Arc<AtomicU64>,
    deadline: Instant,
) -> Option<Millis> {
    let sender = BatchSender {
        recorder: recorder.clone(),
        client: client.clone(),
        hub: hub.to_owned(),
        partition: partition.to_string(),
        producer: PROBE_PRODUCER,
        numbers: numbers.clone(),
        padding: 0,
        acked: Arc::new(Vec::new()),
    };
    let abandon = StopSignal::new();
    let abandon_at = abandon.clone();
    let timer = tokio::spawn(async move {
        tokio::time::sleep_until(deadline).await;
        abandon_at.stop();
    });
    let mut producer = client.idempotent_producer();
    let acked = sender.send_batch(&mut producer, 1, &abandon).await;
    timer.abort();
    acked.then(|| recorder.now_ms())
}

/// Reads one partition in one consumer group from the beginning, resuming after the last
/// delivered event whenever the stream ends, until stopped.
async fn read(
    recorder: Arc<Recorder>,
    client: Client,
    hub: String,
    group: String,
    partition: String,
    index: usize,
    stop: StopSignal,
) {
    let consumer = client.consumer();
    let mut last: Option<i64> = None;
    while !stop.is_stopped() {
        let position = match last {
            None => EventPosition::Earliest,
            Some(sequence_number) => EventPosition::SequenceNumber {
                sequence_number,
                inclusive: false,
            },
        };
        let opened = tokio::select! {
            opened = consumer.receive(&hub, &group, &partition, position, 100) => opened,
            _ = stop.stopped() => return,
        };
        let Ok(mut stream) = opened else {
            stop.sleep(Duration::from_millis(500)).await;
            continue;
        };
        loop {
            let batch = tokio::select! {
                batch = stream.next() => batch,
                _ = stop.stopped() => return,
            };
            match batch {
                Some(Ok(events)) => {
                    let delivered: Vec<Delivered> = events.iter().map(delivered).collect();
                    if let Some(e) = delivered.last() {
                        last = Some(e.sequence);
                    }
                    recorder.with(|h| h.readers[index].events.extend(delivered));
                }
                Some(Err(_)) | None => break,
            }
        }
        stop.sleep(Duration::from_millis(200)).await;
    }
}

pub fn delivered(event: &ReceivedEvent) -> Delivered {
    Delivered {
        sequence: event.sequence_number,
        offset: event.offset.parse().unwrap_or(-1),
        id: EventId::from_body(&event.body),
    }
}

/// Records every `process_events` call and checkpoints each batch's last event.
struct RecordingHandler {
    name: String,
    recorder: Arc<Recorder>,
    tenures: Mutex<BTreeMap<String, u32>>,
}

#[tonic::async_trait]
impl EventHandler for RecordingHandler {
    async fn process_events(&self, context: &PartitionContext, events: Vec<ReceivedEvent>) {
        let started_ms = self.recorder.now_ms();
        if let Some(last) = events.last() {
            // Refused once another instance owns the partition; other failures are retried
            // by the next batch's checkpoint.
            let _ = tokio::time::timeout(CALL_TIMEOUT, context.checkpoint(last)).await;
        }
        let tenure = self
            .tenures
            .lock()
            .expect("tenures lock")
            .get(&context.partition_id)
            .copied()
            .unwrap_or(0);
        let call = ProcessorCall {
            processor: self.name.clone(),
            partition: context.partition_id.clone(),
            tenure,
            started_ms,
            ended_ms: self.recorder.now_ms(),
            events: events.iter().map(delivered).collect(),
        };
        self.recorder.with(|h| h.processor_calls.push(call));
    }

    async fn partition_initializing(
        &self,
        context: &PartitionContext,
        _checkpoint: Option<tributary_client::checkpoints::Checkpoint>,
    ) -> Option<EventPosition> {
        *self
            .tenures
            .lock()
            .expect("tenures lock")
            .entry(context.partition_id.clone())
            .or_default() += 1;
        None
    }

    async fn partition_closing(&self, _context: &PartitionContext, _reason: CloseReason) {}
}

async fn start_processor(
    recorder: Arc<Recorder>,
    client: Client,
    hub: &str,
    name: String,
) -> anyhow::Result<RunningProcessor> {
    let handler = Arc::new(RecordingHandler {
        name: name.clone(),
        recorder,
        tenures: Mutex::default(),
    });
    let options = EventProcessorOptions {
        owner_id: name,
        strategy: LoadBalancingStrategy::Greedy,
        load_balancing_interval: PROCESSOR_INTERVAL,
        ownership_expiration: PROCESSOR_EXPIRATION,
        default_start: EventPosition::Earliest,
        max_batch: 50,
        checkpoint_every: None,
    };
    let processor = EventProcessor::new(&client, hub, PROCESSOR_GROUP, handler, options);
    let started = tokio::time::timeout(CALL_TIMEOUT, processor.start()).await;
    match started {
        Ok(Ok(running)) => Ok(running),
        Ok(Err(err)) => Err(err.into()),
        Err(_) => anyhow::bail!("a processor did not start within {CALL_TIMEOUT:?}"),
    }
}

/// Every so often stops one processor gracefully and starts a new instance in its place.
async fn replace_processors(
    recorder: Arc<Recorder>,
    endpoints: Vec<String>,
    hub: String,
    processors: Arc<tokio::sync::Mutex<Vec<RunningProcessor>>>,
    count: usize,
    stop: StopSignal,
) {
    let mut generation = count;
    while stop.sleep(PROCESSOR_REPLACE_INTERVAL).await {
        let old = {
            let mut list = processors.lock().await;
            if list.is_empty() {
                None
            } else {
                Some(list.remove(0))
            }
        };
        if let Some(old) = old {
            let _ = tokio::time::timeout(CALL_TIMEOUT, old.stop()).await;
        }
        // Started while the cluster may be faulty: keep trying until it starts.
        loop {
            let started = match connect_from(&endpoints, generation).await {
                Ok(client) => {
                    start_processor(
                        recorder.clone(),
                        client,
                        &hub,
                        format!("processor-{generation}"),
                    )
                    .await
                }
                Err(err) => Err(err.into()),
            };
            generation += 1;
            if let Ok(processor) = started {
                processors.lock().await.push(processor);
                break;
            }
            if !stop.sleep(Duration::from_secs(1)).await {
                return;
            }
        }
    }
}

async fn sample_checkpoints(
    recorder: Arc<Recorder>,
    store: tributary_client::ClusterCheckpointStore,
    hub: String,
    stop: StopSignal,
) {
    while stop.sleep(CHECKPOINT_SAMPLE_INTERVAL).await {
        let listed =
            tokio::time::timeout(CALL_TIMEOUT, store.list_checkpoints(&hub, PROCESSOR_GROUP)).await;
        if let Ok(Ok(checkpoints)) = listed {
            let at_ms = recorder.now_ms();
            recorder.with(|h| {
                h.checkpoints
                    .extend(
                        checkpoints
                            .into_iter()
                            .map(|(partition, c)| CheckpointSample {
                                at_ms,
                                partition,
                                sequence: c.sequence_number,
                                offset: c.offset,
                            }),
                    )
            });
        }
    }
}

/// Creates and deletes consumer groups and hubs, each name once.
async fn management_loop(
    recorder: Arc<Recorder>,
    endpoints: Vec<String>,
    hub: String,
    stop: StopSignal,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live_hubs: Vec<String> = Vec::new();
    let mut live_groups: Vec<String> = Vec::new();
    let mut n = 0u64;
    while stop
        .sleep(Duration::from_millis(rng.random_range(500..1500)))
        .await
    {
        n += 1;
        let choice = rng.random_range(0..10);
        let op = if choice < 4 {
            ManagementOp::CreateGroup(format!("{MANAGED_GROUP_PREFIX}{n}"))
        } else if choice < 7 && !live_groups.is_empty() {
            let i = rng.random_range(0..live_groups.len());
            ManagementOp::DeleteGroup(live_groups.swap_remove(i))
        } else if choice < 9 && live_hubs.len() < 3 {
            ManagementOp::CreateHub(format!("{MANAGED_HUB_PREFIX}{n}"))
        } else if !live_hubs.is_empty() {
            let i = rng.random_range(0..live_hubs.len());
            ManagementOp::DeleteHub(live_hubs.swap_remove(i))
        } else {
            continue;
        };
        // Management calls go to the node asked (it forwards to the controller): a
        // different one each time.
        let Ok(client) = connect_from(&endpoints, rng.random_range(0..endpoints.len())).await
        else {
            continue;
        };
        let invoked_ms = recorder.now_ms();
        let result = tokio::time::timeout(CALL_TIMEOUT, async {
            match &op {
                ManagementOp::CreateHub(name) => client
                    .create_replicated_event_hub(name, 2, None, Some(3))
                    .await
                    .map(drop),
                ManagementOp::DeleteHub(name) => client.delete_event_hub(name).await,
                ManagementOp::CreateGroup(name) => {
                    client.create_consumer_group(&hub, name).await.map(drop)
                }
                ManagementOp::DeleteGroup(name) => client.delete_consumer_group(&hub, name).await,
            }
        })
        .await;
        let outcome = match result {
            Ok(Ok(())) => CallOutcome::Ok,
            // Names are used once: the call itself took effect on an earlier attempt whose
            // reply was lost (the SDK retried it).
            Ok(Err(err))
                if matches!(
                    (&op, err.reason()),
                    (
                        ManagementOp::CreateHub(_) | ManagementOp::CreateGroup(_),
                        Some(ErrorReason::AlreadyExists)
                    ) | (
                        ManagementOp::DeleteHub(_) | ManagementOp::DeleteGroup(_),
                        Some(ErrorReason::NotFound)
                    )
                ) =>
            {
                CallOutcome::Ok
            }
            Ok(Err(err)) if err.is_transient() => CallOutcome::Indeterminate(err.to_string()),
            Ok(Err(err)) => CallOutcome::Failed(err.to_string()),
            Err(_) => CallOutcome::Indeterminate(format!("no answer within {CALL_TIMEOUT:?}")),
        };
        // Only what surely exists is deleted later; unknown or refused names are left alone.
        if outcome == CallOutcome::Ok {
            match &op {
                ManagementOp::CreateHub(name) => live_hubs.push(name.clone()),
                ManagementOp::CreateGroup(name) => live_groups.push(name.clone()),
                _ => {}
            }
        }
        let completed_ms = recorder.now_ms();
        recorder.with(|h| {
            h.management.push(ManagementRecord {
                invoked_ms,
                completed_ms,
                op,
                outcome,
            })
        });
    }
}

/// Leadership drains and, with more nodes than replicas, decommissions that move replicas,
/// each undone a little later.
async fn operations_loop(endpoints: Vec<String>, stop: StopSignal, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let node_count = endpoints.len() as u64;
    while stop
        .sleep(Duration::from_secs(rng.random_range(4..9)))
        .await
    {
        let Ok(client) = Client::connect(&endpoints[rng.random_range(0..endpoints.len())]).await
        else {
            continue;
        };
        let node = rng.random_range(1..=node_count);
        let decommission = node_count > 3 && rng.random_bool(0.4);
        let done = if decommission {
            tokio::time::timeout(CALL_TIMEOUT, client.decommission_node(node, true)).await
        } else {
            tokio::time::timeout(CALL_TIMEOUT, client.drain_node(node, true)).await
        };
        if !matches!(done, Ok(Ok(()))) {
            continue;
        }
        stop.sleep(Duration::from_secs(rng.random_range(5..12)))
            .await;
        // Always undone, even when the workload is stopping, through any node that answers.
        for attempt in 0..30 {
            let Ok(client) = Client::connect(&endpoints[attempt % endpoints.len()]).await else {
                continue;
            };
            let undone = if decommission {
                tokio::time::timeout(CALL_TIMEOUT, client.decommission_node(node, false)).await
            } else {
                tokio::time::timeout(CALL_TIMEOUT, client.drain_node(node, false)).await
            };
            if matches!(undone, Ok(Ok(()))) {
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}
