//! `tributary hub ...`: manage event hubs.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use serde_json::json;

use super::OutputFormat;
use super::output::{Table, duration_text, render_fields, time_json, time_text};
use crate::{Client, EventHubProperties, PartitionProperties};

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
    },
    /// Change an event hub's settings; they apply at once.
    Update {
        /// Name of the event hub.
        name: String,
        /// Throughput units to reserve (0: unthrottled).
        #[arg(long, value_parser = clap::value_parser!(u32).range(0..=40))]
        throughput_units: u32,
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
        } => {
            let hub = client
                .create_event_hub_with(
                    &name,
                    partitions,
                    retention,
                    replication_factor,
                    throughput_units,
                )
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
        } => {
            let hub = client.set_throughput_units(&name, throughput_units).await?;
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
        ("created", time_text(hub.created_at_ms)),
    ]
}

fn hub_json(hub: &EventHubProperties) -> serde_json::Value {
    json!({
        "name": hub.name,
        "partition_count": hub.partition_count,
        "retention_ms": hub.retention_ms,
        "replication_factor": hub.replication_factor,
        "throughput_units": hub.throughput_units,
        "created_at": time_json(hub.created_at_ms),
        "partition_ids": hub.partition_ids,
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
    })
}
