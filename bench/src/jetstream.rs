//! The same load against NATS JetStream, for side-by-side figures (`bench/compare`). A
//! Tributary partition is one Raft group, and so is a JetStream stream: the bench creates
//! one file-stored stream per partition, with `--replicas` replicas, and producer i
//! publishes to stream i mod partitions, one message per event, awaiting the
//! acknowledgements of a batch before its next send. Consumers read every stream from new
//! messages on (ordered consumers) and time each message end to end, as on Tributary.
//!
//! On acknowledgement JetStream has stored the message on a majority of the stream's
//! replicas; whether that storage was fsynced depends on the servers' `sync_interval`
//! (`always`: before acknowledging; the default: in the background every 2 minutes).

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use async_nats::jetstream::consumer::DeliverPolicy;
use async_nats::jetstream::consumer::pull::OrderedConfig;
use async_nats::jetstream::context::{CreateStreamErrorKind, PublishErrorKind};
use async_nats::jetstream::stream::{Config as StreamConfig, StorageType};
use bytes::Bytes;
use futures::StreamExt as _;

use crate::KeyDistribution;
use crate::consume::{Consumers, Source};
use crate::load::{self, Ack, SendError, Sink};
use crate::report::{self, BenchReport};

/// Connections the producers are spread over.
const CONNECTIONS_MAX: u32 = 8;
/// How long stream creation is retried while the cluster is not ready for it (see
/// [`not_ready_yet`]).
const STREAM_CREATE_WAIT: Duration = Duration::from_secs(60);
/// Pause before asking again for a stream the cluster could not place yet.
const STREAM_CREATE_RETRY: Duration = Duration::from_millis(200);

/// Whether creating a stream failed only because the cluster is not ready yet: no meta
/// leader (the request times out), or peers not yet known to be online (no room for the
/// replicas).
fn not_ready_yet(kind: &CreateStreamErrorKind) -> bool {
    match kind {
        CreateStreamErrorKind::TimedOut => true,
        CreateStreamErrorKind::JetStream(error) => {
            error.error_code() == async_nats::jetstream::ErrorCode::CLUSTER_NO_PEERS
        }
        _ => false,
    }
}

/// `jetstream-bench`: the load of `tributary bench` against a NATS JetStream cluster.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "jetstream-bench")]
pub struct JetStreamArgs {
    /// NATS server URLs, comma-separated, e.g. nats://127.0.0.1:4222.
    #[arg(long, value_delimiter = ',', default_value = "nats://127.0.0.1:4222")]
    pub servers: Vec<String>,
    #[command(flatten)]
    pub load: crate::LoadArgs,
    /// Replicas of each stream (JetStream allows 1 to 5).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=5))]
    pub replicas: u32,
    /// Print the report as one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Runs the bench against the JetStream cluster at `args.servers` and prints the report.
pub async fn run(args: JetStreamArgs) -> anyhow::Result<BenchReport> {
    args.load.check(false)?;
    let servers = args.servers.join(",");
    let addresses = args
        .servers
        .iter()
        .map(|url| {
            url.parse::<async_nats::ServerAddr>()
                .with_context(|| format!("'{url}' is not a NATS server URL"))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let mut contexts = Vec::new();
    for _ in 0..args.load.producers.min(CONNECTIONS_MAX) {
        let client = async_nats::connect(addresses.clone())
            .await
            .with_context(|| format!("cannot connect to NATS at {servers}"))?;
        contexts.push(async_nats::jetstream::new(client));
    }
    let prefix = format!("bench_{:08x}", rand::random::<u32>());
    let subjects: Vec<String> = (0..args.load.partitions)
        .map(|p| format!("{prefix}.{p}"))
        .collect();
    let mut streams = Vec::new();
    let outcome = async {
        for (p, subject) in subjects.iter().enumerate() {
            let name = format!("{prefix}_{p}");
            let config = StreamConfig {
                name: name.clone(),
                subjects: vec![subject.clone()],
                storage: StorageType::File,
                num_replicas: args.replicas as usize,
                ..Default::default()
            };
            // A cluster just started may not have placed its meta leader yet (its API times
            // out until then), nor heard from every peer (it has no peers to place the
            // replicas on until then).
            let give_up = tokio::time::Instant::now() + STREAM_CREATE_WAIT;
            let stream = loop {
                match contexts[0].create_stream(config.clone()).await {
                    Ok(stream) => break stream,
                    Err(error)
                        if not_ready_yet(&error.kind())
                            && tokio::time::Instant::now() < give_up =>
                    {
                        eprintln!("creating '{name}': {error}; trying again");
                        tokio::time::sleep(STREAM_CREATE_RETRY).await;
                    }
                    Err(error) => {
                        return Err(anyhow::Error::new(error)
                            .context(format!("cannot create the stream '{name}'")));
                    }
                }
            };
            streams.push((name, stream));
        }
        measure(&args, &contexts, &prefix, &subjects, &streams).await
    }
    .await;
    for (name, _) in &streams {
        if let Err(error) = contexts[0].delete_stream(name).await {
            eprintln!("warning: could not delete the bench stream '{name}': {error}");
        }
    }
    let report = outcome?;
    crate::emit(&report, args.json, args.load.csv.as_deref())?;
    Ok(report)
}

async fn measure(
    args: &JetStreamArgs,
    contexts: &[async_nats::jetstream::Context],
    prefix: &str,
    subjects: &[String],
    streams: &[(String, async_nats::jetstream::stream::Stream)],
) -> anyhow::Result<BenchReport> {
    let consumers = if args.load.consumers > 0 {
        let mut sources = Vec::new();
        for (index, (name, _)) in streams.iter().enumerate() {
            // Each reader on its own connection's context, spread like the producers.
            let context = &contexts[index % contexts.len().min(args.load.consumers as usize)];
            let stream = context
                .get_stream(name)
                .await
                .with_context(|| format!("cannot open the stream '{name}'"))?;
            let consumer = stream
                .create_consumer(OrderedConfig {
                    deliver_policy: DeliverPolicy::New,
                    ..Default::default()
                })
                .await
                .with_context(|| format!("cannot create a consumer on '{name}'"))?;
            let messages = consumer
                .messages()
                .await
                .with_context(|| format!("cannot read '{name}'"))?;
            sources.push(JetStreamSource(messages));
        }
        Some(Consumers::spawn(sources))
    } else {
        None
    };
    eprintln!(
        "publishing to {} streams '{prefix}_*' ({} replicas) from {} producers{} for {}...",
        subjects.len(),
        args.replicas,
        args.load.producers,
        args.load
            .rate
            .map_or_else(String::new, |rate| format!(" at {rate:.0} messages/s")),
        humantime::format_duration(args.load.duration)
    );
    let sinks = (0..args.load.producers as usize)
        .map(|index| JetStreamSink {
            context: contexts[index % contexts.len()].clone(),
            subject: subjects[index % subjects.len()].clone().into(),
        })
        .collect();
    let shape = args.load.shape(consumers.is_some());
    let outcome = load::run(sinks, &shape)
        .await
        .context("a producer failed")?;
    let consumed =
        crate::consume::finish(consumers, outcome.sends * u64::from(args.load.batch_size))
            .await
            .context("a consumer failed")?;
    Ok(BenchReport::from_measurements(report::Measurements {
        protocol: "nats",
        hub: format!("jetstream:{prefix}"),
        partitions: args.load.partitions,
        replication_factor: args.replicas,
        producers: args.load.producers,
        event_size_bytes: args.load.event_size,
        batch_size: args.load.batch_size,
        in_flight: args.load.in_flight,
        target_events_per_second: args.load.rate,
        key_distribution: KeyDistribution::Partition,
        consumers: args.load.consumers,
        elapsed_seconds: outcome.elapsed.as_secs_f64(),
        sends: outcome.sends,
        errors: outcome.errors,
        latency_us: outcome.latency_us,
        consumed: consumed.map(|c| (c.events_received, c.latency_us)),
        fsyncs: Err("not measured on JetStream".to_owned()),
        nodes: Vec::new(),
    }))
}

struct JetStreamSink {
    context: async_nats::jetstream::Context,
    subject: Arc<str>,
}

impl Sink for JetStreamSink {
    async fn send(&mut self, bodies: Vec<Bytes>) -> Result<(), SendError> {
        let mut acks = Vec::with_capacity(bodies.len());
        for body in bodies {
            let ack = self
                .context
                .publish(self.subject.to_string(), body)
                .await
                .map_err(publish_error)?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await.map_err(publish_error)?;
        }
        Ok(())
    }

    async fn publish(&mut self, body: Bytes) -> Result<Ack, SendError> {
        let ack = self
            .context
            .publish(self.subject.to_string(), body)
            .await
            .map_err(publish_error)?;
        Ok(Box::pin(async move {
            ack.await.map(|_| ()).map_err(publish_error)
        }))
    }
}

/// Timeouts and a full ack window are transient, and so is "no stream found for given
/// subject": right after a stream is created, a server other than the one that answered may
/// not have learned of it yet (CI met this at the start of a 1-stream run).
fn publish_error(error: async_nats::jetstream::context::PublishError) -> SendError {
    match error.kind() {
        PublishErrorKind::TimedOut
        | PublishErrorKind::MaxAckPending
        | PublishErrorKind::StreamNotFound => SendError::Transient(None),
        _ => SendError::Fatal(error.into()),
    }
}

struct JetStreamSource(async_nats::jetstream::consumer::pull::Ordered);

impl Source for JetStreamSource {
    async fn next(&mut self) -> Option<anyhow::Result<Vec<Bytes>>> {
        let message = self.0.next().await?;
        Some(
            message
                .map(|m| vec![m.message.payload.clone()])
                .map_err(Into::into),
        )
    }
}
