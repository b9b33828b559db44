//! `tributary auth rule ...`: shared access authorization rules of the namespace or of a
//! hub.

use serde_json::json;

use super::OutputFormat;
use super::amqp_connection::{AMQP_PORT_DEFAULT, AmqpConnectionStrings};
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
    /// Print a rule's keys and primary and secondary connection strings: for this CLI and
    /// the Rust SDK, and for the Azure Event Hubs SDKs over AMQP (plain text and TLS), all
    /// naming the host of --endpoint.
    Keys {
        /// Name of the rule.
        name: String,
        /// The event hub the rule belongs to; without it, a namespace rule.
        #[arg(long)]
        hub: Option<String>,
        #[command(flatten)]
        amqp: AmqpPortArg,
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
        #[command(flatten)]
        amqp: AmqpPortArg,
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

/// Where the plain-text AMQP connection strings point.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct AmqpPortArg {
    /// Port of the nodes' plain-text AMQP listener (`serve --amqp-addr`), for the printed
    /// AMQP connection strings. (Over TLS the Azure SDKs dial port 5671.)
    #[arg(long, value_name = "PORT", default_value_t = AMQP_PORT_DEFAULT)]
    pub amqp_port: u16,
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
        RuleCommand::Keys { name, hub, amqp } => {
            let keys = client
                .authorization_rule_keys(hub.as_deref(), &name)
                .await?;
            print_keys(output, &keys, client.endpoint(), amqp);
        }
        RuleCommand::Rotate {
            name,
            key,
            hub,
            amqp,
        } => {
            let key = match key {
                KeyArg::Primary => RuleKey::Primary,
                KeyArg::Secondary => RuleKey::Secondary,
            };
            let keys = client
                .regenerate_authorization_rule_key(hub.as_deref(), &name, key, None)
                .await?;
            print_keys(output, &keys, client.endpoint(), amqp);
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

/// The keys and connection strings; the AMQP ones name the host of `endpoint`, the node
/// this CLI talks to.
fn print_keys(output: OutputFormat, keys: &RuleKeys, endpoint: &str, amqp: AmqpPortArg) {
    let amqp_strings = |key: &str| {
        AmqpConnectionStrings::new(
            endpoint,
            amqp.amqp_port,
            &keys.rule.name,
            &keys.rule.event_hub,
            key,
        )
    };
    let primary = amqp_strings(&keys.primary_key);
    let secondary = amqp_strings(&keys.secondary_key);
    match output {
        OutputFormat::Json => println!(
            "{}",
            json!({
                "rule": rule_json(&keys.rule),
                "primary_key": keys.primary_key,
                "secondary_key": keys.secondary_key,
                "primary_connection_string": keys.primary_connection_string,
                "secondary_connection_string": keys.secondary_connection_string,
                "primary_amqp_connection_string": primary.plain_text,
                "secondary_amqp_connection_string": secondary.plain_text,
                "primary_amqps_connection_string": primary.tls,
                "secondary_amqps_connection_string": secondary.tls,
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
                ("primary AMQP connection string", primary.plain_text),
                ("secondary AMQP connection string", secondary.plain_text),
                ("primary AMQPS connection string", primary.tls),
                ("secondary AMQPS connection string", secondary.tls),
            ])
        ),
    }
}
