//! `tributary group ...`: manage consumer groups.

use serde_json::json;

use super::OutputFormat;
use super::output::{Table, time_json, time_text};
use crate::group::{GroupPartition, KafkaGroupPartition};
use crate::{Client, ConsumerGroupProperties};

#[derive(Debug, clap::Subcommand)]
pub enum GroupCommand {
    /// Create a consumer group.
    Create {
        /// The event hub the group reads.
        hub: String,
        /// Name of the new consumer group.
        name: String,
    },
    /// List the consumer groups of an event hub ($Default always exists).
    List {
        /// The event hub.
        hub: String,
    },
    /// Show a consumer group per partition: owner and last claim, checkpoint, lag (events
    /// after the checkpoint) and connected readers. With --kafka, a Kafka consumer group's
    /// committed offsets instead.
    Show {
        /// The event hub the group reads.
        hub: String,
        /// Name of the consumer group (with --kafka, the Kafka group id).
        name: String,
        /// Show the Kafka consumer group of this id (Kafka groups are their own namespace,
        /// apart from the hub's consumer groups): per partition its committed offset (the
        /// next offset it reads), metadata, commit time and lag.
        #[arg(long)]
        kafka: bool,
    },
    /// Delete a consumer group and its checkpoints.
    Delete {
        /// The event hub the group reads.
        hub: String,
        /// Name of the consumer group.
        name: String,
    },
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    command: GroupCommand,
) -> anyhow::Result<()> {
    match command {
        GroupCommand::Create { hub, name } => {
            let group = client.create_consumer_group(&hub, &name).await?;
            match output {
                OutputFormat::Json => println!("{}", group_json(&group)),
                OutputFormat::Table => println!(
                    "created consumer group '{}' of event hub '{}'",
                    group.name, group.event_hub
                ),
            }
        }
        GroupCommand::List { hub } => {
            let mut groups = client.list_consumer_groups(&hub).await?;
            groups.sort_by(|a, b| a.name.cmp(&b.name));
            match output {
                OutputFormat::Json => {
                    let groups: Vec<_> = groups.iter().map(group_json).collect();
                    println!("{}", serde_json::Value::Array(groups));
                }
                OutputFormat::Table => {
                    let mut table = Table::new(&["NAME", "CREATED"]);
                    for group in &groups {
                        table.row(vec![group.name.clone(), time_text(group.created_at_ms)]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        GroupCommand::Show {
            hub,
            name,
            kafka: true,
        } => {
            let partitions = client.describe_kafka_group(&hub, &name).await?;
            match output {
                OutputFormat::Json => {
                    let partitions: Vec<_> = partitions.iter().map(kafka_partition_json).collect();
                    println!(
                        "{}",
                        json!({"event_hub": hub, "kafka_group": name, "partitions": partitions})
                    );
                }
                OutputFormat::Table => {
                    let mut table =
                        Table::new(&["PARTITION", "OFFSET", "LAST COMMIT", "LAG", "METADATA"]);
                    for p in &partitions {
                        table.row(vec![
                            p.partition_id.clone(),
                            p.committed_offset
                                .map_or_else(|| "-".into(), |o| o.to_string()),
                            p.last_modified_ms.map_or_else(|| "-".into(), time_text),
                            p.lag.to_string(),
                            p.metadata
                                .clone()
                                .filter(|m| !m.is_empty())
                                .unwrap_or_else(|| "-".into()),
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        GroupCommand::Show { hub, name, .. } => {
            let mut partitions = client.describe_consumer_group(&hub, &name).await?;
            partitions.sort_by_key(|p| p.partition_id.parse::<u32>().unwrap_or(u32::MAX));
            match output {
                OutputFormat::Json => {
                    let partitions: Vec<_> = partitions.iter().map(partition_json).collect();
                    println!(
                        "{}",
                        json!({"event_hub": hub, "consumer_group": name, "partitions": partitions})
                    );
                }
                OutputFormat::Table => {
                    let mut table = Table::new(&[
                        "PARTITION",
                        "OWNER",
                        "LAST CLAIM",
                        "CHECKPOINT",
                        "LAG",
                        "READERS",
                    ]);
                    for p in &partitions {
                        let readers: Vec<String> = p
                            .readers
                            .iter()
                            .map(|r| match r.owner_level {
                                Some(level) => format!("{} (level {level})", shown(&r.name)),
                                None => shown(&r.name).to_string(),
                            })
                            .collect();
                        table.row(vec![
                            p.partition_id.clone(),
                            p.owner_id.clone().unwrap_or_else(|| "-".into()),
                            p.last_modified_ms.map_or_else(|| "-".into(), time_text),
                            p.checkpoint
                                .map_or_else(|| "-".into(), |c| c.sequence_number.to_string()),
                            p.lag.to_string(),
                            if readers.is_empty() {
                                "-".into()
                            } else {
                                readers.join(", ")
                            },
                        ]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        GroupCommand::Delete { hub, name } => {
            client.delete_consumer_group(&hub, &name).await?;
            match output {
                OutputFormat::Json => {
                    println!("{}", json!({ "event_hub": hub, "deleted": name }));
                }
                OutputFormat::Table => {
                    println!("deleted consumer group '{name}' of event hub '{hub}'");
                }
            }
        }
    }
    Ok(())
}

fn shown(name: &str) -> &str {
    if name.is_empty() { "(unnamed)" } else { name }
}

fn partition_json(p: &GroupPartition) -> serde_json::Value {
    json!({
        "partition_id": p.partition_id,
        "owner_id": p.owner_id,
        "last_modified": p.last_modified_ms.map(time_json),
        "checkpoint_sequence_number": p.checkpoint.map(|c| c.sequence_number),
        "checkpoint_offset": p.checkpoint.map(|c| c.offset.to_string()),
        "last_enqueued_sequence_number": p.last_enqueued_sequence_number,
        "lag": p.lag,
        "readers": p.readers.iter().map(|r| json!({"name": r.name, "owner_level": r.owner_level})).collect::<Vec<_>>(),
    })
}

fn kafka_partition_json(p: &KafkaGroupPartition) -> serde_json::Value {
    json!({
        "partition_id": p.partition_id,
        "committed_offset": p.committed_offset,
        "metadata": p.metadata,
        "last_modified": p.last_modified_ms.map(time_json),
        "last_enqueued_sequence_number": p.last_enqueued_sequence_number,
        "lag": p.lag,
    })
}

fn group_json(group: &ConsumerGroupProperties) -> serde_json::Value {
    json!({
        "event_hub": group.event_hub,
        "name": group.name,
        "created_at": time_json(group.created_at_ms),
    })
}
