//! The client commands of the `tributary` binary. The binary's `main` (in `node/`) parses
//! [`CliGlobals`] and [`CliCommand`] and calls [`run`]; errors come back as `anyhow` errors
//! for it to print as `error: <message>`.
//!
//! `tributary bench` lives in the `tributary-bench` crate, which depends on this one.

mod amqp_connection;
mod auth;
mod checkpoint_connection;
mod cluster;
mod debug;
mod event_format;
mod group;
mod hub;
mod output;
mod process;
mod receive;
mod send;

pub use auth::{AmqpPortArg, AuthCommand, BlobPortArg, RuleCommand};
pub use debug::{DebugCommand, ReplicaEventsArgs};
pub use group::GroupCommand;
pub use hub::HubCommand;
pub use process::ProcessArgs;
pub use receive::ReceiveArgs;
pub use send::SendArgs;

use crate::{Client, ClientOptions, ConnectOptions, Transport};

/// The endpoint when neither `--endpoint` nor `--connection-string` names one.
pub const ENDPOINT_DEFAULT: &str = "http://127.0.0.1:7400";

/// Options shared by every client command. Flatten into the top-level parser; they are
/// global, so they may also be given after the subcommand.
#[derive(Clone, clap::Args)]
pub struct CliGlobals {
    /// Client endpoint of any node of the cluster. [default: the connection string's
    /// endpoint, else http://127.0.0.1:7400]
    #[arg(long, env = "TRIBUTARY_ENDPOINT", global = true)]
    pub endpoint: Option<String>,
    /// An Event Hubs connection string
    /// (`Endpoint=sb://<node>/;SharedAccessKeyName=<rule>;SharedAccessKey=<key>`, optionally
    /// `;EntityPath=<hub>`): the credential every call carries, and the endpoint unless
    /// --endpoint is given. Nodes with `--auth sas` need one.
    #[arg(
        long,
        env = "TRIBUTARY_CONNECTION_STRING",
        hide_env_values = true,
        global = true
    )]
    pub connection_string: Option<String>,
    /// PEM file of the CA that signed the nodes' client-port certificates; the CLI trusts
    /// it (and only it) for an https:// endpoint, and reaches a connection string's sb://
    /// endpoint over TLS when it is given (plain text otherwise).
    #[arg(long, env = "TRIBUTARY_CA_CERT", value_name = "FILE", global = true)]
    pub ca_cert: Option<std::path::PathBuf>,
    /// Output format: `table` for people, `json` for scripts (`receive` prints one JSON object
    /// per event and line).
    #[arg(long, value_enum, default_value_t = OutputFormat::Table, global = true)]
    pub output: OutputFormat,
}

impl CliGlobals {
    /// `--endpoint`, or the default when not given (the bench's nodes).
    pub fn endpoint_or_default(&self) -> &str {
        self.endpoint.as_deref().unwrap_or(ENDPOINT_DEFAULT)
    }

    /// A client for the command: authorized with `--connection-string` when given.
    pub async fn connect(&self) -> anyhow::Result<Client> {
        Ok(match &self.connection_string {
            None => {
                let options = ClientOptions {
                    ca_cert: self.ca_cert.clone(),
                };
                Client::connect_with(self.endpoint_or_default(), options).await?
            }
            Some(text) => {
                // An sb:// endpoint is reached over TLS when a CA is given to trust.
                let transport = if self.ca_cert.is_some() {
                    Transport::Tls
                } else {
                    Transport::Plaintext
                };
                let options = ConnectOptions {
                    transport,
                    endpoint: self.endpoint.clone(),
                    ca_cert: self.ca_cert.clone(),
                    ..ConnectOptions::default()
                };
                Client::from_connection_string_with(text, options)
                    .await
                    .map_err(|e| anyhow::anyhow!("--connection-string: {e}"))?
            }
        })
    }
}

/// Never shows the connection string's key.
impl std::fmt::Debug for CliGlobals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CliGlobals")
            .field("endpoint", &self.endpoint)
            .field(
                "connection_string",
                &self.connection_string.as_ref().map(|_| "<redacted>"),
            )
            .field("ca_cert", &self.ca_cert)
            .field("output", &self.output)
            .finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, clap::Subcommand)]
pub enum CliCommand {
    /// Create, list, show and delete event hubs.
    #[command(subcommand)]
    Hub(HubCommand),
    /// Create, list and delete consumer groups.
    #[command(subcommand)]
    Group(GroupCommand),
    /// Send events to an event hub.
    Send(SendArgs),
    /// Print the events of one partition.
    Receive(ReceiveArgs),
    /// Process a hub's events together with other instances of this command: partitions
    /// are shared out, checkpointed, and taken over when an instance stops or dies.
    Process(ProcessArgs),
    /// Inspect the cluster.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// Drain a node for maintenance (or let leaders return), or decommission it.
    #[command(subcommand)]
    Node(cluster::NodeCommand),
    /// Look inside the node at --endpoint (e.g. list its replica of a partition).
    #[command(subcommand)]
    Debug(DebugCommand),
    /// Shared access authorization rules (`auth rule create|list|keys|rotate|delete`).
    #[command(subcommand)]
    Auth(AuthCommand),
}

/// Runs one client command against `globals.endpoint`.
pub async fn run(globals: CliGlobals, command: CliCommand) -> anyhow::Result<()> {
    let client = globals.connect().await?;
    let output = globals.output;
    match command {
        CliCommand::Hub(command) => hub::run(&client, output, command).await,
        CliCommand::Group(command) => group::run(&client, output, command).await,
        CliCommand::Send(args) => send::run(&client, output, args).await,
        CliCommand::Receive(args) => receive::run(&client, output, args).await,
        CliCommand::Process(args) => process::run(&client, output, args).await,
        CliCommand::Cluster(command) => cluster::run(&client, output, command).await,
        CliCommand::Node(command) => cluster::run_node(&client, command).await,
        CliCommand::Debug(command) => debug::run(&client, command).await,
        CliCommand::Auth(command) => auth::run(&client, output, command).await,
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory as _, Parser};

    use super::*;
    use crate::EventPosition;

    /// Stands in for the binary's parser in `node/`.
    #[derive(Debug, Parser)]
    struct TestCli {
        #[command(flatten)]
        globals: CliGlobals,
        #[command(subcommand)]
        command: CliCommand,
    }

    fn parse(args: &[&str]) -> Result<TestCli, clap::Error> {
        TestCli::try_parse_from(std::iter::once("tributary").chain(args.iter().copied()))
    }

    #[test]
    fn parser_is_consistent() {
        TestCli::command().debug_assert();
    }

    #[test]
    fn parses_the_documented_commands() {
        let cli = parse(&[
            "hub",
            "create",
            "orders",
            "--partitions",
            "4",
            "--retention",
            "24h",
            "--replication-factor",
            "3",
            "--throughput-units",
            "2",
        ])
        .unwrap();
        let CliCommand::Hub(HubCommand::Create {
            name,
            partitions,
            retention,
            replication_factor,
            throughput_units,
            ..
        }) = cli.command
        else {
            panic!("expected hub create");
        };
        assert_eq!((name.as_str(), partitions), ("orders", 4));
        assert_eq!(retention, Some(std::time::Duration::from_secs(86_400)));
        assert_eq!(replication_factor, Some(3));
        assert_eq!(throughput_units, 2);
        let cli = parse(&[
            "hub",
            "update",
            "orders",
            "--retention",
            "2h",
            "--cleanup-policy",
            "delete-or-compact",
            "--compaction-lag",
            "10m",
        ])
        .unwrap();
        let CliCommand::Hub(HubCommand::Update {
            throughput_units,
            retention,
            cleanup,
            ..
        }) = cli.command
        else {
            panic!("expected hub update");
        };
        assert_eq!(throughput_units, None, "not given: unchanged");
        assert_eq!(retention, Some(std::time::Duration::from_secs(7200)));
        assert_eq!(
            cleanup.cleanup_policy,
            Some(hub::CleanupPolicyArg::DeleteOrCompact)
        );
        assert_eq!(
            cleanup.compaction_lag,
            Some(std::time::Duration::from_secs(600))
        );
        assert_eq!(cleanup.tombstone_retention, None);
        let cli = parse(&["node", "drain", "3"]).unwrap();
        assert!(matches!(
            cli.command,
            CliCommand::Node(cluster::NodeCommand::Drain { node_id: 3 })
        ));

        let cli = parse(&["receive", "orders", "--partition", "0", "--output", "json"]).unwrap();
        assert_eq!(cli.globals.output, OutputFormat::Json);
        let CliCommand::Receive(args) = cli.command else {
            panic!("expected receive");
        };
        assert_eq!(args.group, "$Default");
        assert_eq!(args.from, EventPosition::Earliest);

        let cli = parse(&[
            "receive",
            "orders",
            "--partition",
            "1",
            "--from",
            "seq:5",
            "--count",
            "3",
            "--timeout",
            "2s",
        ])
        .unwrap();
        let CliCommand::Receive(args) = cli.command else {
            panic!("expected receive");
        };
        assert_eq!(
            args.from,
            EventPosition::SequenceNumber {
                sequence_number: 5,
                inclusive: true
            }
        );
        assert_eq!(args.count, Some(3));

        assert!(parse(&["group", "create", "orders", "audit"]).is_ok());
        assert!(
            parse(&[
                "send",
                "orders",
                "--count",
                "10",
                "--size",
                "100",
                "--batch-size",
                "5"
            ])
            .is_ok()
        );
        assert!(parse(&["send", "orders", "--file", "-", "--partition-key", "k"]).is_ok());
    }

    #[test]
    fn send_needs_exactly_one_source() {
        assert!(parse(&["send", "orders"]).is_err());
        assert!(parse(&["send", "orders", "--body", "x", "--file", "f"]).is_err());
        assert!(parse(&["send", "orders", "--count", "10"]).is_err());
        assert!(
            parse(&[
                "send",
                "orders",
                "--body",
                "x",
                "--partition",
                "0",
                "--partition-key",
                "k"
            ])
            .is_err()
        );
    }

    #[test]
    fn bad_position_is_reported_by_the_parser() {
        let error =
            parse(&["receive", "orders", "--partition", "0", "--from", "seq:x"]).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("the sequence number must be a whole number"),
            "{error}"
        );
    }
}
