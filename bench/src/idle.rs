//! `tributary bench idle`: what partitions cost when nothing happens. Creates a hub with
//! many partitions (1,000 by default), times the creation and how long until every
//! partition has a leader, lets the cluster settle, then measures each node's CPU and
//! resident memory while the hub sits idle.

use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;
use tokio::time::Instant;
use tributary_client::Client;

use crate::report::NodeUsage;

#[derive(Debug, Clone, clap::Args)]
pub struct IdleArgs {
    /// Partitions of the idle hub.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub partitions: u32,
    /// Replicas of each partition (default: the cluster's, 3 or the number of nodes if
    /// fewer).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub replication_factor: Option<u32>,
    /// How long every partition may take to get a leader.
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    pub ready_timeout: Duration,
    /// Quiet time after every partition has a leader, before measuring.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// How long to measure the idle nodes.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub measure: Duration,
    /// Prometheus endpoints of the nodes to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "http://127.0.0.1:7402/metrics"
    )]
    pub metrics_url: Vec<String>,
    /// Keep the hub afterwards.
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct IdleReport {
    pub hub: String,
    pub partitions: u32,
    pub replication_factor: u32,
    /// The create call, from request to reply.
    pub create_seconds: f64,
    /// From the create request until every partition had a leader.
    pub all_led_seconds: f64,
    pub measured_seconds: f64,
    /// Each measured node's CPU and memory while the hub was idle.
    pub nodes: Vec<NodeUsage>,
    /// Replicas each node hosts (all hubs), by node id.
    pub replicas_per_node: Vec<(u64, u32)>,
}

pub async fn run(endpoint: &str, args: IdleArgs, json: bool) -> anyhow::Result<IdleReport> {
    let client = Client::connect(endpoint).await?;
    let hub = format!("bench-idle-{:08x}", rand::random::<u32>());
    eprintln!(
        "creating '{hub}' with {} partitions and waiting for their leaders...",
        args.partitions
    );
    let started = Instant::now();
    let created = client
        .create_replicated_event_hub(&hub, args.partitions, None, args.replication_factor)
        .await
        .with_context(|| format!("cannot create the hub '{hub}'"))?;
    let create_seconds = started.elapsed().as_secs_f64();
    let outcome = async {
        let mut last_report = Instant::now();
        loop {
            let status = client.cluster_status().await?;
            let led = status
                .partitions
                .iter()
                .filter(|p| p.event_hub == hub && p.leader != 0)
                .count();
            if led == args.partitions as usize {
                break;
            }
            if started.elapsed() > args.ready_timeout {
                anyhow::bail!(
                    "only {led} of {} partitions had a leader after {}",
                    args.partitions,
                    humantime::format_duration(args.ready_timeout)
                );
            }
            if last_report.elapsed() >= Duration::from_secs(5) {
                eprintln!("{led} of {} partitions led", args.partitions);
                last_report = Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let all_led_seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "every partition led after {all_led_seconds:.1}s; settling for {}, then measuring for {}...",
            humantime::format_duration(args.settle),
            humantime::format_duration(args.measure)
        );
        tokio::time::sleep(args.settle).await;
        let before = crate::sample_nodes(&args.metrics_url).await;
        let measure_started = Instant::now();
        tokio::time::sleep(args.measure).await;
        let after = crate::sample_nodes(&args.metrics_url).await;
        let measured_seconds = measure_started.elapsed().as_secs_f64();
        let nodes = args
            .metrics_url
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(url, (b, a))| crate::node_usage(url, b, a, measured_seconds))
            .collect();
        let status = client.cluster_status().await?;
        Ok(IdleReport {
            hub: hub.clone(),
            partitions: args.partitions,
            replication_factor: created.replication_factor,
            create_seconds,
            all_led_seconds,
            measured_seconds,
            nodes,
            replicas_per_node: status.nodes.iter().map(|n| (n.id, n.replicas)).collect(),
        })
    }
    .await;
    if !args.keep
        && let Err(error) = client.delete_event_hub(&hub).await
    {
        eprintln!("warning: could not delete the bench hub '{hub}': {error}");
    }
    let report = outcome?;
    if json {
        println!(
            "{}",
            serde_json::to_string(&report).expect("the report serializes")
        );
    } else {
        print!("{}", report.to_table());
    }
    Ok(report)
}

impl IdleReport {
    pub fn to_table(&self) -> String {
        let mut rows = vec![
            (
                "hub".to_owned(),
                format!(
                    "{} ({} partitions, replication factor {})",
                    self.hub, self.partitions, self.replication_factor
                ),
            ),
            (
                "create call".to_owned(),
                format!("{:.2}s", self.create_seconds),
            ),
            (
                "every partition led".to_owned(),
                format!("{:.2}s after the create request", self.all_led_seconds),
            ),
            (
                "replicas per node".to_owned(),
                self.replicas_per_node
                    .iter()
                    .map(|(id, n)| format!("node {id}: {n}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
        ];
        for node in &self.nodes {
            rows.push((
                format!("node {}", node.metrics_url),
                format!(
                    "{} (idle, over {:.0}s)",
                    node.describe(),
                    self.measured_seconds
                ),
            ));
        }
        crate::report::key_value_table(&rows)
    }
}
