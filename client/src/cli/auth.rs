//! `tributary auth rule ...`: shared access authorization rules of the namespace or of a
//! hub.

use serde_json::json;

use super::OutputFormat;
use super::output::{Table, render_fields};
use crate::{AuthorizationRule, Client, Rights, RuleKey, RuleKeys};

#[derive(Debug, clap::Subcommand)]
pub enum AuthCommand {
    /// Shared access authorization rules: a name, two keys, and rights.
    #[command(subcommand)]
    Rule(RuleCommand),
}

#[derive(Debug, clap::Subcommand)]
pub enum RuleCommand {
    /// Create a rule with two random keys (`auth rule keys` shows them).
    Create {
        /// Name of the rule: letters, digits, '.', '-' or '_'.
        name: String,
        /// Comma-separated rights: send, listen, manage (manage implies both others).
        #[arg(long)]
        rights: Rights,
        /// The event hub the rule belongs to; without it, a namespace rule (every hub).
        #[arg(long)]
        hub: Option<String>,
    },
    /// List rules: names and rights, no keys.
    List {
        /// The event hub whose rules to list; without it, the namespace's.
        #[arg(long)]
        hub: Option<String>,
    },
    /// Print a rule's keys and primary and secondary connection strings.
    Keys {
        /// Name of the rule.
        name: String,
        /// The event hub the rule belongs to; without it, a namespace rule.
        #[arg(long)]
        hub: Option<String>,
    },
    /// Replace one of a rule's keys with a new random one: tokens signed with the old key
    /// stop working at once, the other key's go on.
    Rotate {
        /// Name of the rule.
        name: String,
        /// Which key to replace: primary or secondary.
        #[arg(long, value_enum)]
        key: KeyArg,
        /// The event hub the rule belongs to; without it, a namespace rule.
        #[arg(long)]
        hub: Option<String>,
    },
    /// Delete a rule; tokens signed with its keys stop working.
    Delete {
        /// Name of the rule.
        name: String,
        /// The event hub the rule belongs to; without it, a namespace rule.
        #[arg(long)]
        hub: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyArg {
    Primary,
    Secondary,
}

pub(crate) async fn run(
    client: &Client,
    output: OutputFormat,
    command: AuthCommand,
) -> anyhow::Result<()> {
    let AuthCommand::Rule(command) = command;
    match command {
        RuleCommand::Create { name, rights, hub } => {
            let rule = client
                .create_authorization_rule(hub.as_deref(), &name, rights)
                .await?;
            match output {
                OutputFormat::Json => println!("{}", rule_json(&rule)),
                OutputFormat::Table => println!(
                    "created rule '{}' of {} with rights {}",
                    rule.name,
                    scope_text(&rule.event_hub),
                    rule.rights.join(", ")
                ),
            }
        }
        RuleCommand::List { hub } => {
            let rules = client.list_authorization_rules(hub.as_deref()).await?;
            match output {
                OutputFormat::Json => {
                    let rules: Vec<_> = rules.iter().map(rule_json).collect();
                    println!("{}", serde_json::Value::Array(rules));
                }
                OutputFormat::Table => {
                    let mut table = Table::new(&["NAME", "RIGHTS"]);
                    for rule in &rules {
                        table.row(vec![rule.name.clone(), rule.rights.join(", ")]);
                    }
                    print!("{}", table.render());
                }
            }
        }
        RuleCommand::Keys { name, hub } => {
            let keys = client
                .authorization_rule_keys(hub.as_deref(), &name)
                .await?;
            print_keys(output, &keys);
        }
        RuleCommand::Rotate { name, key, hub } => {
            let key = match key {
                KeyArg::Primary => RuleKey::Primary,
                KeyArg::Secondary => RuleKey::Secondary,
            };
            let keys = client
                .regenerate_authorization_rule_key(hub.as_deref(), &name, key, None)
                .await?;
            print_keys(output, &keys);
        }
        RuleCommand::Delete { name, hub } => {
            client
                .delete_authorization_rule(hub.as_deref(), &name)
                .await?;
            if output == OutputFormat::Table {
                println!(
                    "deleted rule '{name}' of {}",
                    scope_text(hub.as_deref().unwrap_or_default())
                );
            }
        }
    }
    Ok(())
}

fn scope_text(hub: &str) -> String {
    if hub.is_empty() {
        "the namespace".to_owned()
    } else {
        format!("event hub '{hub}'")
    }
}

fn rule_json(rule: &AuthorizationRule) -> serde_json::Value {
    json!({
        "name": rule.name,
        "event_hub": (!rule.event_hub.is_empty()).then_some(&rule.event_hub),
        "rights": rule.rights,
    })
}

fn print_keys(output: OutputFormat, keys: &RuleKeys) {
    match output {
        OutputFormat::Json => println!(
            "{}",
            json!({
                "rule": rule_json(&keys.rule),
                "primary_key": keys.primary_key,
                "secondary_key": keys.secondary_key,
                "primary_connection_string": keys.primary_connection_string,
                "secondary_connection_string": keys.secondary_connection_string,
            })
        ),
        OutputFormat::Table => print!(
            "{}",
            render_fields(&[
                ("rule", keys.rule.name.clone()),
                ("scope", scope_text(&keys.rule.event_hub)),
                ("rights", keys.rule.rights.join(", ")),
                ("primary key", keys.primary_key.clone()),
                ("secondary key", keys.secondary_key.clone()),
                (
                    "primary connection string",
                    keys.primary_connection_string.clone()
                ),
                (
                    "secondary connection string",
                    keys.secondary_connection_string.clone()
                ),
            ])
        ),
    }
}
