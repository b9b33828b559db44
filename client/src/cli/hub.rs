//! `tributary hub ...`: manage event hubs.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde_json::json;

use super::OutputFormat;
use super::output::{Table, duration_text, render_fields, time_json, time_text};
use crate::{
    CaptureOptions, CaptureSettings, CleanupPolicy, Client, EventHubProperties, HubChanges,
    HubOptions, PartitionProperties,
};

/// `--cleanup-policy` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CleanupPolicyArg {
    /// Events are removed once older than the retention.
    Delete,
    /// Only each partition key's latest event is kept (no time-based retention).
    Compact,
    /// Both: compaction, and removal once older than the retention.
    DeleteOrCompact,
}

impl From<CleanupPolicyArg> for CleanupPolicy {
    fn from(arg: CleanupPolicyArg) -> Self {
        match arg {
            CleanupPolicyArg::Delete => CleanupPolicy::Delete,
            CleanupPolicyArg::Compact => CleanupPolicy::Compact,
            CleanupPolicyArg::DeleteOrCompact => CleanupPolicy::DeleteOrCompact,
        }
    }
}

/// Retention and cleanup flags shared by `hub create` and `hub update`.
#[derive(Debug, Clone, clap::Args)]
pub struct CleanupArgs {
    /// What happens to old events: delete (after the retention), compact (keep each
    /// partition key's latest event) or delete-or-compact (both) [create default: delete].
    #[arg(long, value_enum)]
    pub(crate) cleanup_policy: Option<CleanupPolicyArg>,
    /// Compacted hubs: how long a key's tombstone (latest event with an empty body) stays,
    /// e.g. 1d [create default: 24h].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) tombstone_retention: Option<Duration>,
    /// Compacted hubs: events younger than this are never compacted away, e.g. 10m
    /// [create default: 0s].
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) compaction_lag: Option<Duration>,
    /// Per partition, the oldest events go while the retained ones take more than this
    /// many bytes; 0 removes the cap [create default: no cap].
    #[arg(long)]
    pub(crate) retention_bytes_max: Option<u64>,
}

/// Capture flags shared by `hub create` and `hub update`.
#[derive(Debug, Clone, clap::Args)]
pub struct CaptureArgs {
    /// Capture the hub's events to Avro files (Event Hubs Capture) at
    /// file:///absolute/dir (each node's file system: share it, or read every node's) or
    /// s3://bucket/prefix?region=REGION[&endpoint=http://HOST:PORT] (credentials from the
    /// nodes' AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY). Only events enqueued from now
    /// on are captured.
    #[arg(long, value_name = "URL")]
    pub(crate) capture_destination: Option<String>,
    /// Capture's time window, 1s to 15m: a file is written once its first event is this
    /// old [default: 5m].
    #[arg(long, value_parser = humantime::parse_duration, requires = "capture_destination")]
    pub(crate) capture_window: Option<Duration>,
    /// Capture's size window in bytes, 1024 to 524288000: a file is written once its
    /// events take this many bytes, if its time window has not closed first
    /// [default: 314572800, 300 MiB].
    #[arg(long, requires = "capture_destination")]
    pub(crate) capture_window_bytes: Option<u64>,
    /// The first folder of every capture file's path [default: the cluster id].
    #[arg(long, requires = "capture_destination")]
    pub(crate) capture_namespace: Option<String>,
}

impl CaptureArgs {
    fn options(&self) -> Option<CaptureOptions> {
        self.capture_destination
            .as_ref()
            .map(|destination| CaptureOptions {
                destination: destination.clone(),
                window: self.capture_window,
                window_bytes: self.capture_window_bytes,
                namespace: self.capture_namespace.clone(),
            })
    }
}

/// Partition property requests in flight at once for `hub show`.
const PARTITION_REQUESTS_IN_FLIGHT_MAX: usize = 16;

#[derive(Debug, clap::Subcommand)]
pub enum HubCommand {
    /// Create an event hub.
    Create {
        /// Name of the new event hub.
        name: String,
        /// Number of partitions; fixed for the hub's lifetime.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        partitions: u32,
        /// How long events are kept, e.g. 24h, 7d [default: the service default, 24h].
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Option<Duration>,
        /// Replicas per partition, 1 to 5, at most the number of nodes [default: 3, or the
        /// number of nodes when fewer].
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=5))]
        replication_factor: Option<u32>,
        /// Throughput units to reserve: each allows 1 MB/s or 1,000 events/s in and 2 MB/s
        /// or 4,096 events/s out; excess sends get SERVER_BUSY, reads slow down
        /// [default: 0, unthrottled].
        #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=40))]
        throughput_units: u32,
        #[command(flatten)]
        cleanup: CleanupArgs,
        #[command(flatten)]
        capture: CaptureArgs,
    },
    /// Change an event hub's settings; the ones given apply at once, the others stay.
    Update {
        /// Name of the event hub.
        name: String,
        /// Throughput units to reserve (0: unthrottled).
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=40))]
        throughput_units: Option<u32>,
        /// How long events are kept, e.g. 24h, 7d.
        #[arg(long, value_parser = humantime::parse_duration)]
        retention: Option<Duration>,
        #[command(flatten)]
        cleanup: CleanupArgs,
        /// Enable Capture, or replace its settings (an enabled capture goes on from where
        /// it is).
        #[command(flatten)]
        capture: CaptureArgs,
        /// Stop capturing the hub's events (files already written stay).
        #[arg(long, conflicts_with = "capture_destination")]
        capture_off: bool,
    },
    /// List the event hubs of the cluster.
    List,
    /// Show an event hub and the state of each of its partitions.
    Show {
        /// Name of the event hub.
        name: String,
    },
    /// Delete an event hub with all its events, consumer groups and checkpoints.
    Delete {
        /// Name of the event hub.
        name: String,
    },
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    command: HubCommand,
) -> anyhow::Result<()> {
    match command {
        HubCommand::Create {
            name,
            partitions,
            retention,
            replication_factor,
            throughput_units,
            cleanup,
            capture,
        } => {
            let options = HubOptions {
                capture: capture.options(),
                retention,
                replication_factor,
                throughput_units,
                cleanup_policy: cleanup.cleanup_policy.map(Into::into),
                tombstone_retention: cleanup.tombstone_retention,
                compaction_lag: cleanup.compaction_lag,
                retention_bytes_max: cleanup.retention_bytes_max,
            };
            let hub = client
                .create_event_hub_with_options(&name, partitions, &options)
                .await?;
            match output {
                OutputFormat::Json => println!("{}", hub_json(&hub)),
                OutputFormat::Table => {
                    println!("created event hub '{}'", hub.name);
                    print!("{}", render_fields(&hub_fields(&hub)));
                }
            }
        }
        HubCommand::Update {
            name,
            throughput_units,
            retention,
            cleanup,
            capture,
            capture_off,
        } => {
            let changes = HubChanges {
                capture: if capture_off {
                    Some(None)
                } else {
                    capture.options().map(Some)
                },
                throughput_units,
                retention,
                cleanup_policy: cleanup.cleanup_policy.map(Into::into),
                tombstone_retention: cleanup.tombstone_retention,
                compaction_lag: cleanup.compaction_lag,
                retention_bytes_max: cleanup.retention_bytes_max,
            };
            if changes.throughput_units.is_none()
                && changes.retention.is_none()
                && changes.cleanup_policy.is_none()
                && changes.tombstone_retention.is_none()
                && changes.compaction_lag.is_none()
                && changes.retention_bytes_max.is_none()
                && changes.capture.is_none()
            {
                anyhow::bail!(
                    "nothing to change: give at least one of --throughput-units, --retention, --cleanup-policy, --tombstone-retention, --compaction-lag, --retention-bytes-max, --capture-destination, --capture-off"
                );
            }
            let hub = client.update_event_hub(&name, &changes).await?;
            match output {
                OutputFormat::Json => println!("{}", hub_json(&hub)),
                OutputFormat::Table => {
                    println!("updated event hub '{}'", hub.name);
                    print!("{}", render_fields(&hub_fields(&hub)));
                }
            }
        }
        HubCommand::List => {
            let mut hubs = client.list_event_hubs().await?;
            hubs.sort_by(|a, b| a.name.cmp(&b.name));
            match output {
                OutputFormat::Json => {
                    let hubs: Vec<_> = hubs.iter().map(hub_json).collect();
                    println!("{}", serde_json::Value::Array(hubs));
                }
                OutputFormat::Table => {
                    let mut table = Table::new(&["NAME", "PARTITIONS", "RETENTION", "CREATED"]);
                    for hub in &hubs {
                        table.row(vec![
                            hub.name.clone(),
                            hub.partition_count.to_string(),
                            duration_text(hub.retention_ms),
                            time_text(hub.created_at_ms),
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        HubCommand::Show { name } => {
            let hub = client.get_event_hub(&name).await?;
            let partitions: Vec<PartitionProperties> = futures::stream::iter(&hub.partition_ids)
                .map(|id| client.get_partition_properties(&hub.name, id))
                .buffered(PARTITION_REQUESTS_IN_FLIGHT_MAX)
                .try_collect()
                .await?;
            match output {
                OutputFormat::Json => {
                    let mut value = hub_json(&hub);
                    value["partitions"] = partitions.iter().map(partition_json).collect();
                    println!("{value}");
                }
                OutputFormat::Table => {
                    print!("{}", render_fields(&hub_fields(&hub)));
                    println!();
                    print!("{}", partition_table(&partitions).render());
                }
            }
        }
        HubCommand::Delete { name } => {
            client.delete_event_hub(&name).await?;
            match output {
                OutputFormat::Json => println!("{}", json!({ "deleted": name })),
                OutputFormat::Table => println!("deleted event hub '{name}'"),
            }
        }
    }
    Ok(())
}

fn hub_fields(hub: &EventHubProperties) -> Vec<(&'static str, String)> {
    vec![
        ("name", hub.name.clone()),
        ("partitions", hub.partition_count.to_string()),
        ("retention", duration_text(hub.retention_ms)),
        ("replicas", hub.replication_factor.to_string()),
        (
            "throughput units",
            match hub.throughput_units {
                0 => "unthrottled".to_string(),
                tu => tu.to_string(),
            },
        ),
        (
            "cleanup policy",
            cleanup_policy_text(hub.cleanup_policy()).to_string(),
        ),
        (
            "tombstone retention",
            duration_text(hub.tombstone_retention_ms),
        ),
        ("compaction lag", duration_text(hub.compaction_lag_ms)),
        (
            "retained bytes max",
            match hub.retention_bytes_max {
                0 => "no cap".to_string(),
                bytes => format!("{bytes} per partition"),
            },
        ),
        ("capture", capture_text(hub.capture.as_ref())),
        ("created", time_text(hub.created_at_ms)),
    ]
}

fn capture_text(capture: Option<&CaptureSettings>) -> String {
    match capture {
        None => "off".to_owned(),
        Some(c) => format!(
            "{} (namespace {}, window {} or {} bytes, since {})",
            c.destination,
            c.namespace,
            duration_text(c.window_ms),
            c.window_bytes,
            time_text(c.enabled_at_ms)
        ),
    }
}

fn cleanup_policy_text(policy: CleanupPolicy) -> &'static str {
    match policy {
        CleanupPolicy::Unspecified | CleanupPolicy::Delete => "delete",
        CleanupPolicy::Compact => "compact",
        CleanupPolicy::DeleteOrCompact => "delete-or-compact",
    }
}

fn hub_json(hub: &EventHubProperties) -> serde_json::Value {
    json!({
        "name": hub.name,
        "partition_count": hub.partition_count,
        "retention_ms": hub.retention_ms,
        "replication_factor": hub.replication_factor,
        "throughput_units": hub.throughput_units,
        "cleanup_policy": cleanup_policy_text(hub.cleanup_policy()),
        "tombstone_retention_ms": hub.tombstone_retention_ms,
        "compaction_lag_ms": hub.compaction_lag_ms,
        "retention_bytes_max": hub.retention_bytes_max,
        "created_at": time_json(hub.created_at_ms),
        "partition_ids": hub.partition_ids,
        "capture_destination": hub.capture.as_ref().map(|c| c.destination.clone()),
        "capture_window_ms": hub.capture.as_ref().map(|c| c.window_ms),
        "capture_window_bytes": hub.capture.as_ref().map(|c| c.window_bytes),
        "capture_namespace": hub.capture.as_ref().map(|c| c.namespace.clone()),
        "capture_enabled_at": hub.capture.as_ref().map(|c| time_json(c.enabled_at_ms)),
    })
}

fn partition_table(partitions: &[PartitionProperties]) -> Table {
    let mut table = Table::new(&[
        "PARTITION",
        "BEGIN SEQ",
        "LAST SEQ",
        "LAST OFFSET",
        "LAST ENQUEUED",
        "EMPTY",
        "CAPTURED THROUGH",
    ]);
    for p in partitions {
        let last_enqueued = if p.is_empty {
            "-".to_owned()
        } else {
            time_text(p.last_enqueued_time_ms)
        };
        table.row(vec![
            p.partition_id.clone(),
            p.begin_sequence_number.to_string(),
            p.last_enqueued_sequence_number.to_string(),
            p.last_enqueued_offset.clone(),
            last_enqueued,
            if p.is_empty { "yes" } else { "no" }.to_owned(),
            match p.capture_next_sequence_number {
                0 => "-".to_owned(),
                next => (next - 1).to_string(),
            },
        ]);
    }
    table
}

fn partition_json(p: &PartitionProperties) -> serde_json::Value {
    json!({
        "partition_id": p.partition_id,
        "begin_sequence_number": p.begin_sequence_number,
        "last_enqueued_sequence_number": p.last_enqueued_sequence_number,
        "last_enqueued_offset": p.last_enqueued_offset,
        "last_enqueued_time": if p.is_empty { serde_json::Value::Null } else { time_json(p.last_enqueued_time_ms) },
        "is_empty": p.is_empty,
        "captured_through_sequence_number": p.capture_next_sequence_number - 1,
    })
}
