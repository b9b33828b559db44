//! `tributary auth rule ...`: shared access authorization rules of the namespace or of a
//! hub.

use serde_json::json;

use super::OutputFormat;
use super::amqp_connection::{AMQP_PORT_DEFAULT, AmqpConnectionStrings};
use super::checkpoint_connection::{BLOB_PORT_DEFAULT, checkpoint_connection_string};
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
    /// the Rust SDK, for the Azure Event Hubs SDKs over AMQP (plain text and TLS), and for
    /// their Blob checkpoint store, all naming the host of --endpoint.
    Keys {
        /// Name of the rule.
        name: String,
        /// The event hub the rule belongs to; without it, a namespace rule.
        #[arg(long)]
        hub: Option<String>,
        #[command(flatten)]
        amqp: AmqpPortArg,
        #[command(flatten)]
        blob: BlobPortArg,
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
        #[command(flatten)]
        blob: BlobPortArg,
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

/// Where the checkpoint-store connection strings point.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct BlobPortArg {
    /// Port of the nodes' Blob checkpoint endpoint (`serve --blob-addr`), for the printed
    /// checkpoint-store connection strings (HTTPS when --endpoint is https://).
    #[arg(long, value_name = "PORT", default_value_t = BLOB_PORT_DEFAULT)]
    pub blob_port: u16,
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
        RuleCommand::Keys {
            name,
            hub,
            amqp,
            blob,
        } => {
            let keys = client
                .authorization_rule_keys(hub.as_deref(), &name)
                .await?;
            print_keys(output, &keys, client.endpoint(), amqp, blob);
        }
        RuleCommand::Rotate {
            name,
            key,
            hub,
            amqp,
            blob,
        } => {
            let key = match key {
                KeyArg::Primary => RuleKey::Primary,
                KeyArg::Secondary => RuleKey::Secondary,
            };
            let keys = client
                .regenerate_authorization_rule_key(hub.as_deref(), &name, key, None)
                .await?;
            print_keys(output, &keys, client.endpoint(), amqp, blob);
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

/// The keys and connection strings; the AMQP and checkpoint-store ones name the host of
/// `endpoint`, the node this CLI talks to.
fn print_keys(
    output: OutputFormat,
    keys: &RuleKeys,
    endpoint: &str,
    amqp: AmqpPortArg,
    blob: BlobPortArg,
) {
    let strings = KeyStrings::new(keys, endpoint, amqp, blob);
    match output {
        OutputFormat::Json => println!("{}", keys_json(keys, strings)),
        OutputFormat::Table => print!("{}", keys_table(keys, strings)),
    }
}

/// The connection strings made here, for each key.
struct KeyStrings {
    primary_amqp: AmqpConnectionStrings,
    secondary_amqp: AmqpConnectionStrings,
    primary_checkpoint: String,
    secondary_checkpoint: String,
}

impl KeyStrings {
    fn new(keys: &RuleKeys, endpoint: &str, amqp: AmqpPortArg, blob: BlobPortArg) -> KeyStrings {
        let amqp_strings = |key: &str| {
            AmqpConnectionStrings::new(
                endpoint,
                amqp.amqp_port,
                &keys.rule.name,
                &keys.rule.event_hub,
                key,
            )
        };
        let checkpoint_string = |key: &str| {
            checkpoint_connection_string(endpoint, blob.blob_port, &keys.rule.name, key)
        };
        KeyStrings {
            primary_amqp: amqp_strings(&keys.primary_key),
            secondary_amqp: amqp_strings(&keys.secondary_key),
            primary_checkpoint: checkpoint_string(&keys.primary_key),
            secondary_checkpoint: checkpoint_string(&keys.secondary_key),
        }
    }
}

fn keys_json(keys: &RuleKeys, strings: KeyStrings) -> serde_json::Value {
    json!({
        "rule": rule_json(&keys.rule),
        "primary_key": keys.primary_key,
        "secondary_key": keys.secondary_key,
        "primary_connection_string": keys.primary_connection_string,
        "secondary_connection_string": keys.secondary_connection_string,
        "primary_amqp_connection_string": strings.primary_amqp.plain_text,
        "secondary_amqp_connection_string": strings.secondary_amqp.plain_text,
        "primary_amqps_connection_string": strings.primary_amqp.tls,
        "secondary_amqps_connection_string": strings.secondary_amqp.tls,
        "primary_checkpoint_connection_string": strings.primary_checkpoint,
        "secondary_checkpoint_connection_string": strings.secondary_checkpoint,
    })
}

fn keys_table(keys: &RuleKeys, strings: KeyStrings) -> String {
    render_fields(&[
        ("rule", keys.rule.name.clone()),
        ("scope", scope_text(&keys.rule.event_hub)),
        ("rights", keys.rule.rights.join(", ")),
        ("primary key", keys.primary_key.clone()),
        ("secondary key", keys.secondary_key.clone()),
        (
            "primary connection string",
            keys.primary_connection_string.clone(),
        ),
        (
            "secondary connection string",
            keys.secondary_connection_string.clone(),
        ),
        (
            "primary AMQP connection string",
            strings.primary_amqp.plain_text,
        ),
        (
            "secondary AMQP connection string",
            strings.secondary_amqp.plain_text,
        ),
        ("primary AMQPS connection string", strings.primary_amqp.tls),
        (
            "secondary AMQPS connection string",
            strings.secondary_amqp.tls,
        ),
        (
            "primary checkpoint connection string",
            strings.primary_checkpoint,
        ),
        (
            "secondary checkpoint connection string",
            strings.secondary_checkpoint,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub_rule_keys() -> RuleKeys {
        RuleKeys {
            rule: AuthorizationRule {
                name: "sender".to_owned(),
                event_hub: "orders".to_owned(),
                rights: vec!["send".to_owned()],
            },
            primary_key: "cHJpbWFyeQ==".to_owned(),
            secondary_key: "c2Vjb25kYXJ5".to_owned(),
            primary_connection_string: "Endpoint=sb://n:7400/;p".to_owned(),
            secondary_connection_string: "Endpoint=sb://n:7400/;s".to_owned(),
        }
    }

    const AMQP: AmqpPortArg = AmqpPortArg { amqp_port: 5672 };
    const BLOB: BlobPortArg = BlobPortArg { blob_port: 10000 };

    /// A hub rule's AMQP strings name its hub; its checkpoint strings cannot (a storage
    /// connection string has no such field: the endpoint finds the rule by name), so they
    /// name the rule as the account, with each key.
    #[test]
    fn json_has_each_keys_checkpoint_string_beside_the_amqp_ones() {
        let keys = hub_rule_keys();
        let json = keys_json(
            &keys,
            KeyStrings::new(&keys, "http://10.1.2.3:7400", AMQP, BLOB),
        );
        assert_eq!(
            json["primary_checkpoint_connection_string"],
            "DefaultEndpointsProtocol=http;AccountName=sender;AccountKey=cHJpbWFyeQ==;\
             BlobEndpoint=http://10.1.2.3:10000/sender;"
        );
        assert_eq!(
            json["secondary_checkpoint_connection_string"],
            "DefaultEndpointsProtocol=http;AccountName=sender;AccountKey=c2Vjb25kYXJ5;\
             BlobEndpoint=http://10.1.2.3:10000/sender;"
        );
        assert_eq!(
            json["primary_amqp_connection_string"],
            "Endpoint=sb://10.1.2.3:5672/;SharedAccessKeyName=sender;\
             SharedAccessKey=cHJpbWFyeQ==;EntityPath=orders;UseDevelopmentEmulator=true"
        );
        assert_eq!(json["primary_connection_string"], "Endpoint=sb://n:7400/;p");
    }

    #[test]
    fn the_table_has_a_checkpoint_line_per_key_on_the_given_port_over_tls() {
        let keys = hub_rule_keys();
        let table = keys_table(
            &keys,
            KeyStrings::new(
                &keys,
                "https://tributary.example:7400",
                AMQP,
                BlobPortArg { blob_port: 443 },
            ),
        );
        let line = |field: &str| {
            table
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .map(str::trim)
                .unwrap_or_else(|| panic!("no '{field}' line in\n{table}"))
                .to_owned()
        };
        assert_eq!(
            line("primary checkpoint connection string:"),
            "DefaultEndpointsProtocol=https;AccountName=sender;AccountKey=cHJpbWFyeQ==;\
             BlobEndpoint=https://tributary.example:443/sender;"
        );
        assert_eq!(
            line("secondary checkpoint connection string:"),
            "DefaultEndpointsProtocol=https;AccountName=sender;AccountKey=c2Vjb25kYXJ5;\
             BlobEndpoint=https://tributary.example:443/sender;"
        );
        assert_eq!(line("scope:"), "event hub 'orders'");
    }
}
