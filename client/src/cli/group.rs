//! `tributary group ...`: manage consumer groups.

use serde_json::json;

use super::OutputFormat;
use super::output::{Table, time_json, time_text};
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

fn group_json(group: &ConsumerGroupProperties) -> serde_json::Value {
    json!({
        "event_hub": group.event_hub,
        "name": group.name,
        "created_at": time_json(group.created_at_ms),
    })
}
