//! `tributary bench`: a load generator that measures send throughput, send latency and how
//! well the node shares fsyncs between sends, over gRPC or (`--amqp-addr`) AMQP 1.0; `tributary bench failover` measures how long a
//! partition takes to accept writes again after its leader's node is killed; `tributary bench
//! checkpoints` measures the checkpoint store, event processors and load balancing; `tributary
//! bench retention` soaks a hub with retention under steady load and shows its disk use stays
//! flat; `tributary bench rebuild` wipes a replica of a large partition and measures its
//! rebuild from a snapshot: time, throughput, memory, and sends meanwhile.
//!
//! The binary's `main` (in `node/`) adds a `Bench(BenchArgs)` subcommand and calls
//! [`main`] with the CLI's endpoint and output format. (This crate depends on the client, so
//! the client's `CliCommand` cannot include it.)

mod amqp;
mod breakdown;
mod checkpoints;
mod consume;
mod failover;
mod idle;
#[cfg(feature = "jetstream")]
pub mod jetstream;
mod load;
mod local_cluster;
mod metrics;
mod rebuild;
mod report;
mod retention;

pub use breakdown::{Breakdown, StageRow};
pub use checkpoints::{CheckpointsArgs, CheckpointsReport};
pub use failover::{FailoverArgs, FailoverReport};
pub use idle::{IdleArgs, IdleReport};
pub use load::KeyDistribution;
pub use rebuild::{RebuildArgs, RebuildRecord, RebuildReport, SendWindow};
pub use report::{BenchReport, LatencyReport};
pub use retention::{DiskSample, Flatness, RetentionArgs, RetentionReport};

use std::time::Duration;

use anyhow::Context as _;
use tokio::time::Instant;
use tributary_client::{Client, ClientError, ErrorReason};

/// Connections the producers are spread over; one HTTP/2 connection per few dozen producers
/// keeps the client from being the bottleneck.
const CONNECTIONS_MAX: u32 = 8;

#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BenchArgs {
    /// Other benchmarks; without one, `bench` measures send throughput against --endpoint.
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    #[command(flatten)]
    pub load: LoadArgs,
    /// Replicas of each partition of the hub the bench creates (default: the cluster's,
    /// 3 or the number of nodes if fewer).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub replication_factor: Option<u32>,
    /// How sends pick their partition.
    #[arg(long, value_enum, default_value_t = KeyDistribution::Partition)]
    pub key_distribution: KeyDistribution,
    /// Distinct keys with --key-distribution random-key.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub key_count: u32,
    /// Event hub to send to. Without it, a fresh hub `bench-<random>` with --partitions
    /// partitions is created. A hub the bench created (also a named one that did not exist)
    /// is deleted afterwards unless --keep; an existing hub is never deleted.
    #[arg(long)]
    pub hub: Option<String>,
    /// Keep the hub the bench created.
    #[arg(long)]
    pub keep: bool,
    /// Prometheus endpoints of the nodes to watch, comma-separated (one per node of the
    /// cluster): their fsyncs are summed (`tributary_storage_fsyncs_total`), and each
    /// node's CPU (% of one core) and resident memory are reported
    /// (`process_cpu_seconds_total`, `process_resident_memory_bytes`). A figure that cannot
    /// be read is reported as unavailable, with why.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7402/metrics"
    )]
    pub metrics_url: Vec<String>,
    /// After the run, show where a send's time went: each node's histograms of the stages
    /// of a send (`tributary_send_stage_seconds`), read from --metrics-url before and after
    /// the run, as a table of stage, count, mean, p50, p99 and share of the mean send time:
    /// on the leader front end, appender wait, commit (within it the leader's log write and
    /// the replication round trip, the follower's handling and log write), apply and reply;
    /// what the transport adds; and the storage shards' queue, log write with fsync and
    /// index commit of every durable log write. List every node of the cluster in
    /// --metrics-url. With --output json: the report's `breakdown` object.
    #[arg(long)]
    pub breakdown: bool,
    /// Send over AMQP 1.0 instead of gRPC, to these AMQP listeners (the nodes'
    /// `--amqp-addr`), comma-separated; connection i goes to address i mod count. Each
    /// producer has a sender link; with --batch-size above 1 each delivery is an Event Hubs
    /// batch of that many events, and --in-flight counts deliveries. The hub is still
    /// created and deleted, and consumers still read, over gRPC at --endpoint.
    #[arg(long, value_delimiter = ',', value_name = "HOST:PORT")]
    pub amqp_addr: Vec<String>,
    /// With --amqp-addr listing node 1's address first, node 2's next and so on: connect
    /// each producer of a partition to the node leading it (as a client that knows the
    /// cluster's topology does, and as the gRPC producers do). Without it connections go
    /// round robin, and sends to partitions led elsewhere are forwarded by the node.
    #[arg(long)]
    pub amqp_to_leaders: bool,
    /// The shared-access rule --amqp-key belongs to.
    #[arg(long, default_value = "root")]
    pub amqp_key_name: String,
    /// The rule's key: AMQP producers then authenticate with SASL PLAIN. Without it they
    /// use SASL ANONYMOUS and put a token signed with a placeholder key on `$cbs`, which
    /// only nodes run with `--auth none` accept.
    #[arg(long, env = "TRIBUTARY_BENCH_AMQP_KEY", hide_env_values = true)]
    pub amqp_key: Option<String>,
}

/// The shape of a load, the same for Tributary and a peer system.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Partitions to spread the load over (of the hub the bench creates, ignored with an
    /// existing --hub; on a peer, one stream each).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..))]
    pub partitions: u32,
    /// Concurrent producers; producer i sends to partition i mod partitions (with the
    /// default key distribution), one send in flight each.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub producers: u32,
    /// Body size of each event, in bytes.
    #[arg(long, default_value_t = 1024)]
    pub event_size: usize,
    /// Events per send request.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
    /// Events each producer keeps unacknowledged. Above 1, producers publish events one by
    /// one without waiting and the client batches them (Tributary's buffered producer,
    /// JetStream's asynchronous publish); latency is then per event, from publish to
    /// acknowledgement. Over AMQP with --batch-size above 1: deliveries of --batch-size
    /// events each producer keeps unsettled. 1: each producer waits for every send (of
    /// --batch-size events).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    pub in_flight: u32,
    /// How long to send, e.g. 10s, 1m.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Target rate in events per second over all producers, each sending on a fixed
    /// schedule (latency counts from when a send was due). Without it, every producer sends
    /// as fast as replies come (the maximum rate).
    #[arg(long, value_parser = positive_rate)]
    pub rate: Option<f64>,
    /// Consumer connections reading every partition from the latest position while the
    /// producers send; they measure end-to-end latency (send to delivery) from the send
    /// time written into each body's first 8 bytes (so --event-size must be at least 8).
    /// 0: no consumers.
    #[arg(long, default_value_t = 0)]
    pub consumers: u32,
    /// Also append the report as one CSV row to this file (with a header line first when
    /// the file is new or empty).
    #[arg(long)]
    pub csv: Option<std::path::PathBuf>,
}

impl LoadArgs {
    /// Refuses consumers without room for the send time in each body, and batches in
    /// flight where the client batches (all but AMQP, whose deliveries are pipelined whole).
    fn check(&self, pipelines_batches: bool) -> anyhow::Result<()> {
        if self.in_flight > 1 && self.batch_size > 1 && !pipelines_batches {
            anyhow::bail!(
                "--in-flight {} publishes events one by one and lets the client batch them: \
                 leave --batch-size at 1",
                self.in_flight
            );
        }
        if self.consumers > 0 && self.event_size < load::TIMESTAMP_BYTES {
            anyhow::bail!(
                "--consumers measure end-to-end latency from a send time in each body's first \
                 {} bytes: use --event-size {} or more, or --consumers 0",
                load::TIMESTAMP_BYTES,
                load::TIMESTAMP_BYTES
            );
        }
        Ok(())
    }

    fn shape(&self, timestamps: bool) -> load::Shape {
        load::Shape {
            batch_size: self.batch_size,
            in_flight: self.in_flight,
            event_size: self.event_size,
            duration: self.duration,
            rate: self.rate,
            timestamps,
        }
    }
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum BenchCommand {
    /// Start a local cluster, kill partition leaders under load and measure how long each
    /// partition takes to accept writes again (ignores --endpoint).
    Failover(FailoverArgs),
    /// Measure the cluster's checkpoint store (checkpoints/s), event processors draining a
    /// backlog while checkpointing, and load-balancing time, on a scratch hub at --endpoint.
    Checkpoints(CheckpointsArgs),
    /// Create a hub with many partitions (1,000 by default) at --endpoint, time how long
    /// until every partition has a leader, then measure each node's CPU and memory while
    /// it sits idle.
    Idle(IdleArgs),
    /// Start a local cluster, send a steady load to a hub with retention for well past one
    /// retention period, sample each node's disk use, and check it stays flat once the
    /// first events have expired (ignores --endpoint).
    Retention(RetentionArgs),
    /// Start a local cluster, fill a one-partition hub past a retention cut, wipe a
    /// follower and measure its rebuild from a snapshot: time, throughput (MB/s), the
    /// leader's and the rebuilt node's resident memory, and paced sends' latency before and
    /// during it; the replicas must end identical (ignores --endpoint).
    Rebuild(RebuildArgs),
}

/// Runs the benchmark `args` selects and prints its report: a table, or one JSON object if
/// `json`.
pub async fn main(endpoint: &str, args: BenchArgs, json: bool) -> anyhow::Result<()> {
    match args.command.clone() {
        Some(BenchCommand::Failover(failover)) => failover::run(failover, json).await.map(drop),
        Some(BenchCommand::Checkpoints(checkpoints)) => {
            checkpoints::run(endpoint, checkpoints, json)
                .await
                .map(drop)
        }
        Some(BenchCommand::Idle(idle)) => idle::run(endpoint, idle, json).await.map(drop),
        Some(BenchCommand::Retention(retention)) => retention::run(retention, json).await.map(drop),
        Some(BenchCommand::Rebuild(rebuild)) => rebuild::run(rebuild, json).await.map(drop),
        None => run(endpoint, args, json).await.map(drop),
    }
}

/// Runs the bench against the node at `endpoint` and prints the report on stdout: a table,
/// or one JSON object if `json`. Progress notes go to stderr.
pub async fn run(endpoint: &str, args: BenchArgs, json: bool) -> anyhow::Result<BenchReport> {
    args.load.check(!args.amqp_addr.is_empty())?;
    let connections = args.load.producers.min(CONNECTIONS_MAX);
    let mut clients = Vec::with_capacity(connections as usize);
    for _ in 0..connections {
        clients.push(Client::connect(endpoint).await?);
    }
    let hub = prepare_hub(&clients[0], &args).await?;
    // A hub this run created (which took Manage rights, as reading the cluster status
    // does) is measured once its partitions have elected their leaders.
    let ready = if hub.created {
        await_leaders(&clients[0], &hub.name).await.map(drop)
    } else {
        Ok(())
    };
    let outcome = match ready {
        Ok(()) => measure(endpoint, &clients, &hub, &args).await,
        Err(error) => Err(error),
    };
    if hub.created
        && !args.keep
        && let Err(error) = clients[0].delete_event_hub(&hub.name).await
    {
        eprintln!(
            "warning: could not delete the bench hub '{}': {error}",
            hub.name
        );
    }
    let report = outcome?;
    emit(&report, json, args.load.csv.as_deref())?;
    Ok(report)
}

/// Prints `report` (a table, or one JSON object if `json`) and appends it to `csv`.
pub(crate) fn emit(
    report: &BenchReport,
    json: bool,
    csv: Option<&std::path::Path>,
) -> anyhow::Result<()> {
    if json {
        println!("{}", report.to_json());
    } else {
        print!("{}", report.to_table());
    }
    if let Some(path) = csv {
        report::append_csv(path, report)
            .with_context(|| format!("cannot append the report to {}", path.display()))?;
    }
    Ok(())
}

/// How long a new hub's partitions may take to elect their leaders before a run.
const HUB_LEADERS_WAIT: Duration = Duration::from_secs(120);

/// The leader (node id) of each partition of `hub`, per the cluster status, once every
/// partition has one: a run measures the hub's traffic, not its first elections (hundreds
/// of partitions created at once take seconds to elect on a busy cluster). Waits up to
/// [`HUB_LEADERS_WAIT`], noting progress on stderr every 5 s.
async fn await_leaders(
    client: &Client,
    hub: &str,
) -> anyhow::Result<std::collections::HashMap<String, u64>> {
    let start = std::time::Instant::now();
    let mut noted = start;
    loop {
        let status = client
            .cluster_status()
            .await
            .context("cannot read the cluster status for the partitions' leaders")?;
        let leaders: std::collections::HashMap<String, u64> = status
            .partitions
            .iter()
            .filter(|p| p.event_hub == hub)
            .map(|p| (p.partition_id.clone(), p.leader))
            .collect();
        let led = leaders.values().filter(|leader| **leader > 0).count();
        if !leaders.is_empty() && led == leaders.len() {
            return Ok(leaders);
        }
        if start.elapsed() >= HUB_LEADERS_WAIT {
            anyhow::bail!(
                "{led} of the {} partitions of '{hub}' have a leader after {}s: the cluster \
                 is still electing (its nodes' logs say why)",
                leaders.len(),
                HUB_LEADERS_WAIT.as_secs()
            );
        }
        if noted.elapsed() >= Duration::from_secs(5) {
            eprintln!(
                "waiting for the partitions of '{hub}' to elect leaders: {led} of {} have one",
                leaders.len()
            );
            noted = std::time::Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The index in --amqp-addr (node id - 1) of each partition's leader.
fn leader_indexes(
    leaders: &std::collections::HashMap<String, u64>,
    hub: &str,
    nodes: usize,
) -> anyhow::Result<std::collections::HashMap<String, usize>> {
    let mut indexes = std::collections::HashMap::new();
    for (partition, leader) in leaders {
        let index = usize::try_from(*leader)
            .ok()
            .and_then(|id| id.checked_sub(1))
            .filter(|index| *index < nodes)
            .with_context(|| {
                format!(
                    "partition {partition} of '{hub}' is led by node {leader}, which has no \
                     address among the {nodes} of --amqp-addr (list node 1's first)"
                )
            })?;
        indexes.insert(partition.clone(), index);
    }
    Ok(indexes)
}

/// Runs the consumers (if any) and the producers against `hub` and measures them.
async fn measure(
    endpoint: &str,
    clients: &[Client],
    hub: &BenchHub,
    args: &BenchArgs,
) -> anyhow::Result<BenchReport> {
    let consumers = if args.load.consumers > 0 {
        let sources = consume::tributary_sources(
            endpoint,
            &hub.name,
            &hub.partition_ids,
            args.load.consumers,
        )
        .await
        .with_context(|| format!("cannot start reading '{}'", hub.name))?;
        Some(consume::Consumers::spawn(sources))
    } else {
        None
    };
    let amqp_sinks = if args.amqp_addr.is_empty() {
        None
    } else {
        let leaders = if args.amqp_to_leaders {
            let leaders = await_leaders(&clients[0], &hub.name).await?;
            leader_indexes(&leaders, &hub.name, args.amqp_addr.len())?
        } else {
            Default::default()
        };
        let target = amqp::AmqpTarget {
            addrs: args.amqp_addr.clone(),
            hub: hub.name.clone(),
            key_name: args.amqp_key_name.clone(),
            key: args.amqp_key.clone(),
            leaders,
        };
        let sinks = amqp::sinks(
            &target,
            &hub.partition_ids,
            args.load.producers as usize,
            args.key_distribution,
            args.key_count,
            args.load.in_flight,
        )
        .await
        .with_context(|| format!("cannot start the AMQP producers of '{}'", hub.name))?;
        Some(sinks)
    };
    let protocol = if amqp_sinks.is_some() { "amqp" } else { "grpc" };
    eprintln!(
        "sending to '{}' ({} partitions, replication factor {}) over {protocol} from {} \
         producers{} for {}...",
        hub.name,
        hub.partition_ids.len(),
        hub.replication_factor,
        args.load.producers,
        args.load
            .rate
            .map_or_else(String::new, |rate| format!(" at {rate:.0} events/s")),
        humantime::format_duration(args.load.duration)
    );

    let before = sample_nodes(&args.metrics_url).await;
    let stages_before = if args.breakdown {
        Some(breakdown::read_nodes(&args.metrics_url).await)
    } else {
        None
    };
    let before_at = Instant::now();
    let hub_name: std::sync::Arc<str> = hub.name.as_str().into();
    let shape = args.load.shape(consumers.is_some());
    let outcome = match amqp_sinks {
        Some(sinks) => load::run(sinks, &shape).await,
        None => {
            let sinks = (0..args.load.producers as usize)
                .map(|index| {
                    load::TributarySink::new(
                        &clients[index % clients.len()],
                        hub_name.clone(),
                        &hub.partition_ids,
                        index,
                        args.key_distribution,
                        args.key_count,
                    )
                })
                .collect();
            load::run(sinks, &shape).await
        }
    };
    let after = sample_nodes(&args.metrics_url).await;
    let metrics_window = before_at.elapsed().as_secs_f64();
    let stages_after = if args.breakdown {
        Some(breakdown::read_nodes(&args.metrics_url).await)
    } else {
        None
    };
    let outcome =
        outcome.with_context(|| format!("a producer failed while sending to '{}'", hub.name))?;
    let breakdown = stages_before.zip(stages_after).map(|(before, after)| {
        breakdown::Breakdown::new(&args.metrics_url, &before, &after, &outcome.latency_us)
    });
    let consumed = consume::finish(consumers, outcome.sends * u64::from(args.load.batch_size))
        .await
        .with_context(|| format!("a consumer failed while reading '{}'", hub.name))?;

    let fsyncs =
        fsyncs_between(&args.metrics_url, &before, &after).map(|fsyncs| (fsyncs, metrics_window));
    let nodes = args
        .metrics_url
        .iter()
        .zip(before.iter().zip(&after))
        .map(|(url, (before, after))| node_usage(url, before, after, metrics_window))
        .collect();
    let mut report = BenchReport::from_measurements(report::Measurements {
        protocol,
        hub: hub.name.clone(),
        partitions: hub.partition_ids.len() as u32,
        replication_factor: hub.replication_factor,
        producers: args.load.producers,
        event_size_bytes: args.load.event_size,
        batch_size: args.load.batch_size,
        in_flight: args.load.in_flight,
        target_events_per_second: args.load.rate,
        key_distribution: args.key_distribution,
        consumers: args.load.consumers,
        elapsed_seconds: outcome.elapsed.as_secs_f64(),
        sends: outcome.sends,
        errors: outcome.errors,
        latency_us: outcome.latency_us,
        consumed: consumed.map(|c| (c.events_received, c.latency_us)),
        fsyncs,
        nodes,
    });
    report.breakdown = breakdown;
    Ok(report)
}

/// How long consumers may take, once the producers stop, to receive what was sent.
pub(crate) const CONSUMER_GRACE: Duration = Duration::from_secs(10);

pub(crate) fn positive_rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "'{text}' is not a rate: give events per second, a number above 0"
        )),
    }
}

struct BenchHub {
    name: String,
    partition_ids: Vec<String>,
    replication_factor: u32,
    /// Whether this run created it (and so may delete it).
    created: bool,
}

async fn prepare_hub(client: &Client, args: &BenchArgs) -> anyhow::Result<BenchHub> {
    let (name, existing) = match &args.hub {
        None => (format!("bench-{:08x}", rand::random::<u32>()), None),
        Some(name) => match client.get_event_hub(name).await {
            Ok(hub) => (name.clone(), Some(hub)),
            Err(error) if error.reason() == Some(ErrorReason::NotFound) => (name.clone(), None),
            Err(error) => return Err(error.into()),
        },
    };
    let (properties, created) = match existing {
        Some(hub) => (hub, false),
        None => {
            let hub = client
                .create_replicated_event_hub(
                    &name,
                    args.load.partitions,
                    None,
                    args.replication_factor,
                )
                .await
                .with_context(|| format!("cannot create the bench hub '{name}'"))?;
            (hub, true)
        }
    };
    let replication_factor = properties.replication_factor;
    let mut partition_ids = properties.partition_ids;
    if partition_ids.is_empty() {
        partition_ids = (0..properties.partition_count)
            .map(|p| p.to_string())
            .collect();
    }
    if partition_ids.is_empty() {
        return Err(
            ClientError::InvalidArgument(format!("event hub '{name}' has no partitions")).into(),
        );
    }
    Ok(BenchHub {
        name,
        partition_ids,
        replication_factor,
        created,
    })
}

/// One read of every node's metrics page, in order.
pub(crate) async fn sample_nodes(urls: &[String]) -> Vec<Result<metrics::NodeSample, String>> {
    let reads = urls.iter().map(|url| async move {
        metrics::sample(url)
            .await
            .map_err(|error| format!("{error:#}"))
    });
    futures::future::join_all(reads).await
}

/// fsyncs between two reads, summed over the nodes; why not, if any node's is unknown.
fn fsyncs_between(
    urls: &[String],
    before: &[Result<metrics::NodeSample, String>],
    after: &[Result<metrics::NodeSample, String>],
) -> Result<f64, String> {
    let mut total = 0.0;
    for (url, (before, after)) in urls.iter().zip(before.iter().zip(after)) {
        let (before, after) = match (before, after) {
            (Ok(before), Ok(after)) => (before, after),
            (Err(error), _) | (_, Err(error)) => return Err(error.clone()),
        };
        match after.fsyncs {
            // A counter appears once first incremented: absent before means 0.
            Some(after) => total += after - before.fsyncs.unwrap_or(0.0),
            None => return Err(format!("{url} has no {}", metrics::FSYNCS_METRIC)),
        }
    }
    Ok(total)
}

/// A node's CPU use over the run and its resident memory at the end.
pub(crate) fn node_usage(
    url: &str,
    before: &Result<metrics::NodeSample, String>,
    after: &Result<metrics::NodeSample, String>,
    seconds: f64,
) -> report::NodeUsage {
    let (before, after) = match (before, after) {
        (Ok(before), Ok(after)) => (before, after),
        (Err(error), _) | (_, Err(error)) => {
            return report::NodeUsage::unavailable(url, error.clone());
        }
    };
    let cpu_percent = before
        .cpu_seconds
        .zip(after.cpu_seconds)
        .map(|(before, after)| (after - before) / seconds.max(f64::EPSILON) * 100.0);
    let resident_mib = after.resident_bytes.map(|b| b / (1024.0 * 1024.0));
    let missing = match (cpu_percent, resident_mib) {
        (None, None) => Some(format!(
            "{url} has neither {} nor {}",
            metrics::CPU_METRIC,
            metrics::RSS_METRIC
        )),
        (None, Some(_)) => Some(format!("{url} has no {}", metrics::CPU_METRIC)),
        (Some(_), None) => Some(format!("{url} has no {}", metrics::RSS_METRIC)),
        (Some(_), Some(_)) => None,
    };
    report::NodeUsage {
        metrics_url: url.to_owned(),
        cpu_percent,
        resident_mib,
        unavailable_reason: missing,
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser as _};

    use super::*;
    use metrics::NodeSample;

    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    #[test]
    fn amqp_sends_may_pipeline_batches_and_grpc_sends_may_not() {
        Cli::command().debug_assert();
        let parse = |extra: &[&str]| {
            let args = ["bench", "--batch-size", "16", "--in-flight", "8"];
            Cli::try_parse_from(args.iter().chain(extra)).unwrap().bench
        };
        let amqp = parse(&["--amqp-addr", "127.0.0.1:5672,127.0.0.1:5673"]);
        assert_eq!(amqp.amqp_addr, ["127.0.0.1:5672", "127.0.0.1:5673"]);
        assert_eq!(amqp.amqp_key_name, "root");
        assert!(amqp.load.check(!amqp.amqp_addr.is_empty()).is_ok());
        let grpc = parse(&[]);
        assert!(grpc.load.check(!grpc.amqp_addr.is_empty()).is_err());
    }

    fn sample(fsyncs: Option<f64>, cpu: Option<f64>, rss: Option<f64>) -> NodeSample {
        NodeSample {
            fsyncs,
            cpu_seconds: cpu,
            resident_bytes: rss,
        }
    }

    #[test]
    fn fsyncs_are_summed_over_nodes_and_unknown_if_any_is() {
        let urls = vec!["http://a/metrics".to_owned(), "http://b/metrics".to_owned()];
        let before = vec![
            Ok(sample(None, None, None)),
            Ok(sample(Some(10.0), None, None)),
        ];
        let after = vec![
            Ok(sample(Some(5.0), None, None)),
            Ok(sample(Some(30.0), None, None)),
        ];
        assert_eq!(fsyncs_between(&urls, &before, &after), Ok(25.0));
        let after = vec![Ok(sample(Some(5.0), None, None)), Err("refused".to_owned())];
        assert_eq!(
            fsyncs_between(&urls, &before, &after),
            Err("refused".to_owned())
        );
        let after = vec![
            Ok(sample(Some(5.0), None, None)),
            Ok(sample(None, None, None)),
        ];
        assert_eq!(
            fsyncs_between(&urls, &before, &after),
            Err("http://b/metrics has no tributary_storage_fsyncs_total".to_owned())
        );
    }

    #[test]
    fn node_usage_is_cpu_over_wall_time_and_memory_at_the_end() {
        let usage = node_usage(
            "http://a/metrics",
            &Ok(sample(None, Some(10.0), Some(1.0))),
            &Ok(sample(None, Some(13.0), Some(200.0 * 1024.0 * 1024.0))),
            2.0,
        );
        assert_eq!(usage.cpu_percent, Some(150.0));
        assert_eq!(usage.resident_mib, Some(200.0));
        assert_eq!(usage.unavailable_reason, None);
        let usage = node_usage(
            "http://a/metrics",
            &Ok(sample(None, None, None)),
            &Ok(sample(None, None, Some(1024.0 * 1024.0))),
            2.0,
        );
        assert_eq!(usage.cpu_percent, None);
        assert_eq!(
            usage.unavailable_reason.as_deref(),
            Some("http://a/metrics has no process_cpu_seconds_total")
        );
        let usage = node_usage(
            "http://a/metrics",
            &Err("refused".to_owned()),
            &Ok(sample(None, None, None)),
            2.0,
        );
        assert_eq!(usage.unavailable_reason.as_deref(), Some("refused"));
    }
}
