//! `tributary serve` settings: flags, then `TRIBUTARY_*` environment variables, then an
//! optional TOML file, then defaults.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
pub use tributary_broker::placement::PlacementSettings;
use tributary_types::limits::{PARTITIONS_PER_HUB_MAX_DEFAULT, PUBLISH_BYTES_MAX_DEFAULT};

/// The environment variable giving the root rule's primary key to a node that creates it.
pub const ROOT_KEY_ENV: &str = "TRIBUTARY_ROOT_KEY";

/// Most capacity units one node may declare.
pub const CAPACITY_UNITS_MAX: u32 = 1000;

/// Flags of `tributary serve`. Every flag can also be set through its environment variable
/// or the TOML file given with --config (keys are the flag names with '_' for '-').
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ServeArgs {
    /// Directory holding this node's data; created if missing.
    /// [env: TRIBUTARY_DATA_DIR] [default: ./data]
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Address for client gRPC (producers, consumers, management).
    /// [env: TRIBUTARY_CLIENT_ADDR] [default: 127.0.0.1:7400]
    #[arg(long)]
    pub client_addr: Option<SocketAddr>,
    /// Address for HTTP: /healthz, /readyz and /metrics.
    /// [env: TRIBUTARY_HTTP_ADDR] [default: 127.0.0.1:7402]
    #[arg(long)]
    pub http_addr: Option<SocketAddr>,
    /// Address for AMQP 1.0 in plain text (the Azure Event Hubs SDKs, with a connection
    /// string ending in `UseDevelopmentEmulator=true`), or `none` to turn it off.
    /// [env: TRIBUTARY_AMQP_ADDR] [default: 127.0.0.1:5672]
    #[arg(long, value_name = "HOST:PORT|none")]
    pub amqp_addr: Option<Listen>,
    /// Address for AMQP 1.0 over TLS (AMQPS, what the Azure SDKs use by default), with the
    /// client port's certificate (--tls-cert), or `none` to turn it off.
    /// [env: TRIBUTARY_AMQPS_ADDR] [default: 127.0.0.1:5671 when --tls-cert is given, else
    /// none]
    #[arg(long, value_name = "HOST:PORT|none")]
    pub amqps_addr: Option<Listen>,
    /// Address for the Blob checkpoint endpoint (the Azure SDKs' `BlobCheckpointStore`,
    /// with `BlobEndpoint=http://HOST:PORT/<rule name>`), or `none` to turn it off. HTTPS
    /// with the client port's certificate when --tls-cert is given.
    /// [env: TRIBUTARY_BLOB_ADDR] [default: 127.0.0.1:10000]
    #[arg(long, value_name = "HOST:PORT|none")]
    pub blob_addr: Option<Listen>,
    /// Address for the Kafka protocol in plain text (Kafka clients: librdkafka, kcat,
    /// kafka-python, aiokafka), or `none` to turn it off.
    /// [env: TRIBUTARY_KAFKA_ADDR] [default: 127.0.0.1:9092]
    #[arg(long, value_name = "HOST:PORT|none")]
    pub kafka_addr: Option<Listen>,
    /// Address for the Kafka protocol over TLS, with the client port's certificate
    /// (--tls-cert), or `none` to turn it off.
    /// [env: TRIBUTARY_KAFKA_TLS_ADDR] [default: 127.0.0.1:9093 when --tls-cert is given,
    /// else none]
    #[arg(long, value_name = "HOST:PORT|none")]
    pub kafka_tls_addr: Option<Listen>,
    /// The plain-text Kafka address clients are told to connect to (Metadata's broker
    /// address, FindCoordinator's) instead of the bound --kafka-addr: `host:port`. Every
    /// node lists every node's advertised address.
    /// [env: TRIBUTARY_ADVERTISE_KAFKA_ADDR] [default: the bound address; for 0.0.0.0, the
    /// host of --advertise-client-addr]
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_kafka_addr: Option<String>,
    /// The Kafka-over-TLS address clients are told to connect to instead of the bound
    /// --kafka-tls-addr: `host:port` (the host must match the certificate).
    /// [env: TRIBUTARY_ADVERTISE_KAFKA_TLS_ADDR] [default: the host of
    /// --advertise-kafka-addr (or the bound address) with the bound TLS port]
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_kafka_tls_addr: Option<String>,
    /// Address for node-to-node traffic (Raft replication, cluster membership).
    /// [env: TRIBUTARY_PEER_ADDR] [default: 127.0.0.1:7401]
    #[arg(long)]
    pub peer_addr: Option<SocketAddr>,
    /// The client address other nodes hand to clients (in NOT_LEADER answers and cluster
    /// status) instead of the bound --client-addr: `host:port`, a DNS name or an IP. For
    /// nodes bound to 0.0.0.0 or whose IP changes across restarts (Kubernetes pods).
    /// [env: TRIBUTARY_ADVERTISE_CLIENT_ADDR] [default: the bound address]
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_client_addr: Option<String>,
    /// The peer address other nodes dial for Raft and membership instead of the bound
    /// --peer-addr: `host:port`, a DNS name or an IP that stays the same across restarts.
    /// [env: TRIBUTARY_ADVERTISE_PEER_ADDR] [default: the bound address]
    #[arg(long, value_name = "HOST:PORT")]
    pub advertise_peer_addr: Option<String>,
    /// Peer addresses of other nodes to join or form a cluster with, comma-separated.
    /// [env: TRIBUTARY_SEEDS]
    #[arg(long, value_delimiter = ',')]
    pub seeds: Vec<String>,
    /// Nodes that must see each other before a new cluster forms; 1 forms a single-node
    /// cluster at once. Ignored once the cluster exists. [env: TRIBUTARY_BOOTSTRAP_EXPECT]
    /// [default: 1]
    #[arg(long)]
    pub bootstrap_expect: Option<usize>,
    /// Voters of the controller group when a cluster forms: 3 or 5 (fewer on a smaller
    /// cluster). [env: TRIBUTARY_CONTROLLER_VOTERS] [default: 3]
    #[arg(long)]
    pub controller_voters: Option<usize>,
    /// This node's id within its cluster. [env: TRIBUTARY_NODE_ID] [default: 1]
    #[arg(long)]
    pub node_id: Option<u64>,
    /// This node's capacity units: its share of the cluster's work. Replicas and leaders
    /// are balanced per capacity unit. [env: TRIBUTARY_CAPACITY_UNITS] [default: 1]
    #[arg(long)]
    pub capacity_units: Option<u32>,
    /// Failure-domain label (rack, availability zone); replicas of a partition go to
    /// different zones when there are enough. [env: TRIBUTARY_ZONE]
    #[arg(long)]
    pub zone: Option<String>,
    /// Cluster id the data directory must belong to; a fresh directory is given this id
    /// (random when unset). [env: TRIBUTARY_CLUSTER_ID]
    #[arg(long)]
    pub cluster_id: Option<String>,
    /// Number of storage shards (redb databases, each with one group-committing writer).
    /// [env: TRIBUTARY_STORAGE_SHARDS] [default: 1]
    #[arg(long)]
    pub storage_shards: Option<usize>,
    /// Largest publication (one send's batch) in bytes. [env: TRIBUTARY_PUBLISH_BYTES_MAX]
    /// [default: 1048576]
    #[arg(long)]
    pub publish_bytes_max: Option<usize>,
    /// Most connections open at once on each of the client and peer ports; a connection
    /// over it is answered with RESOURCE_EXHAUSTED saying so, then closed.
    /// [env: TRIBUTARY_MAX_CONNECTIONS] [default: 10000]
    #[arg(long)]
    pub max_connections: Option<usize>,
    /// Most concurrent calls (streams) on one connection, announced to clients in HTTP/2's
    /// settings: a client's further calls wait for one to end. Also the most sends of one
    /// send stream handled at once (further ones wait to be read).
    /// [env: TRIBUTARY_MAX_STREAMS_PER_CONNECTION] [default: 1000]
    #[arg(long)]
    pub max_streams_per_connection: Option<u32>,
    /// A connection that sends nothing for this long is closed (clients and nodes ping
    /// every 30 s, so only dead or stuck ones are). [env: TRIBUTARY_IDLE_TIMEOUT]
    /// [default: 10m]
    #[arg(long)]
    pub idle_timeout: Option<humantime::Duration>,
    /// Most partitions one event hub may have. [env: TRIBUTARY_PARTITIONS_PER_HUB_MAX]
    /// [default: 1024]
    #[arg(long)]
    pub partitions_per_hub_max: Option<u16>,
    /// Entries after which each partition records a snapshot point (cheap: the log is the
    /// data), and the controller stores its state (a restart re-applies the entries after
    /// it). [env: TRIBUTARY_RAFT_SNAPSHOT_ENTRIES] [default: 10000]
    #[arg(long)]
    pub raft_snapshot_entries: Option<u64>,
    /// Entries before the latest snapshot point that leaders still send as log to a
    /// replica catching up; a replica further behind, or one whose data was lost, is
    /// rebuilt from a snapshot instead. The controller group keeps at most 1000 (its
    /// snapshot is its whole state; the entries behind it are deleted).
    /// [env: TRIBUTARY_RAFT_LOG_KEEP_ENTRIES] [default: 1000000]
    #[arg(long)]
    pub raft_log_keep_entries: Option<u64>,
    /// Bandwidth for rebuilding replicas from snapshots (a replaced disk, a new or moved
    /// replica), sent and received together, shared by every rebuild the node takes part
    /// in, so rebuilds do not starve live traffic; 0: unlimited.
    /// [env: TRIBUTARY_REBUILD_BYTES_PER_SECOND] [default: 104857600 (100 MiB/s)]
    #[arg(long)]
    pub rebuild_bytes_per_second: Option<u64>,
    /// How long a node may stay silent before the placement controller counts it dead and
    /// re-creates its replicas on other nodes (e.g. 5m, 30s). [env: TRIBUTARY_NODE_DEAD_TIMEOUT]
    /// [default: 5m]
    #[arg(long)]
    pub node_dead_timeout: Option<humantime::Duration>,
    /// How often the placement controller gathers the nodes' reports and plans moves.
    /// [env: TRIBUTARY_PLACEMENT_INTERVAL] [default: 2s]
    #[arg(long)]
    pub placement_interval: Option<humantime::Duration>,
    /// Most replica moves under way that involve one node (as source or target).
    /// [env: TRIBUTARY_PLACEMENT_MOVES_PER_NODE] [default: 4]
    #[arg(long)]
    pub placement_moves_per_node: Option<u32>,
    /// Most replica moves under way in the whole cluster.
    /// [env: TRIBUTARY_PLACEMENT_MOVES_MAX] [default: 16]
    #[arg(long)]
    pub placement_moves_max: Option<u32>,
    /// How long a partition whose replicas or leader moved is left alone by the balancer
    /// (restoring its replication factor does not wait). [env: TRIBUTARY_PLACEMENT_COOLDOWN]
    /// [default: 10s]
    #[arg(long)]
    pub placement_cooldown: Option<humantime::Duration>,
    /// Shortest retention an event hub may be given (e.g. 1h; lower it only for tests and
    /// demonstrations). [env: TRIBUTARY_RETENTION_MIN] [default: 1h]
    #[arg(long)]
    pub retention_min: Option<humantime::Duration>,
    /// How often each replica removes the events its hub no longer retains, and compacts
    /// compacted hubs. [env: TRIBUTARY_RETENTION_INTERVAL] [default: 30s]
    #[arg(long)]
    pub retention_interval: Option<humantime::Duration>,
    /// Size a storage log segment file grows to before the next one starts; space returns
    /// to the operating system a whole segment at a time, once none of its entries is kept.
    /// [env: TRIBUTARY_SEGMENT_BYTES] [default: 67108864]
    #[arg(long)]
    pub segment_bytes: Option<u64>,
    /// How long the storage writer may keep a logged batch's index commit open for later
    /// batches to share, when nothing else is queued (0s: commit each batch at once). Sends
    /// are durable and acknowledged without it; readers see events up to this much later, and
    /// a node whose producers wait for each send spends less CPU per send.
    /// [env: TRIBUTARY_INDEX_COMMIT_LINGER] [default: 2ms]
    #[arg(long)]
    pub index_commit_linger: Option<humantime::Duration>,
    /// PEM certificate (chain) the client port presents: with --tls-key, the client port
    /// speaks TLS only. Re-read when the file changes. [env: TRIBUTARY_TLS_CERT]
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert. [env: TRIBUTARY_TLS_KEY]
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// PEM certificate of the cluster CA: with --peer-cert and --peer-key, the peer port
    /// speaks mutual TLS, accepting only nodes with a certificate from this CA, and this
    /// node's connections to other nodes verify them against it. [env: TRIBUTARY_PEER_CA]
    #[arg(long, value_name = "FILE")]
    pub peer_ca: Option<PathBuf>,
    /// PEM certificate (chain) from --peer-ca this node presents on the peer port, as
    /// server and as client. Re-read when the file changes. [env: TRIBUTARY_PEER_CERT]
    #[arg(long, value_name = "FILE")]
    pub peer_cert: Option<PathBuf>,
    /// PEM private key of --peer-cert. [env: TRIBUTARY_PEER_KEY]
    #[arg(long, value_name = "FILE")]
    pub peer_key: Option<PathBuf>,
    /// File holding the cluster key, a secret every node of the cluster shares (make one
    /// with `tributary cert cluster-key --out FILE`): every peer connection, both ways,
    /// proves knowledge of it before any peer call is served. With or instead of mutual
    /// TLS. [env: TRIBUTARY_CLUSTER_KEY_FILE]
    #[arg(long, value_name = "FILE")]
    pub cluster_key_file: Option<PathBuf>,
    /// Serve the peer port on a non-loopback --peer-addr with nothing authenticating the
    /// nodes that connect (no mutual TLS, no cluster key): anyone who reaches it can run
    /// controller commands and read the cluster's keys. Only for isolated test networks;
    /// the node warns at startup and reports tributary_peer_insecure 1 in /metrics.
    /// [env: TRIBUTARY_PEER_INSECURE]
    #[arg(long)]
    pub peer_insecure: bool,
    /// Log as JSON lines instead of human-readable text. [env: TRIBUTARY_LOG_JSON]
    #[arg(long)]
    pub log_json: bool,
    /// How clients are authorized: `sas` (shared access signatures checked on every call)
    /// or `none` (no checks at all: only for development; the node warns at startup).
    /// [env: TRIBUTARY_AUTH] [default: sas]
    #[arg(long)]
    pub auth: Option<AuthMode>,
    /// Optional TOML file with any of the settings above. [env: TRIBUTARY_CONFIG]
    #[arg(long)]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    data_dir: Option<PathBuf>,
    peer_addr: Option<SocketAddr>,
    advertise_client_addr: Option<String>,
    advertise_peer_addr: Option<String>,
    seeds: Option<Vec<String>>,
    bootstrap_expect: Option<usize>,
    controller_voters: Option<usize>,
    client_addr: Option<SocketAddr>,
    http_addr: Option<SocketAddr>,
    amqp_addr: Option<Listen>,
    amqps_addr: Option<Listen>,
    blob_addr: Option<Listen>,
    kafka_addr: Option<Listen>,
    kafka_tls_addr: Option<Listen>,
    advertise_kafka_addr: Option<String>,
    advertise_kafka_tls_addr: Option<String>,
    node_id: Option<u64>,
    capacity_units: Option<u32>,
    zone: Option<String>,
    cluster_id: Option<String>,
    storage_shards: Option<usize>,
    publish_bytes_max: Option<usize>,
    max_connections: Option<usize>,
    max_streams_per_connection: Option<u32>,
    idle_timeout: Option<String>,
    partitions_per_hub_max: Option<u16>,
    raft_snapshot_entries: Option<u64>,
    raft_log_keep_entries: Option<u64>,
    rebuild_bytes_per_second: Option<u64>,
    node_dead_timeout: Option<String>,
    placement_interval: Option<String>,
    placement_moves_per_node: Option<u32>,
    placement_moves_max: Option<u32>,
    placement_cooldown: Option<String>,
    retention_min: Option<String>,
    retention_interval: Option<String>,
    segment_bytes: Option<u64>,
    index_commit_linger: Option<String>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    peer_ca: Option<PathBuf>,
    peer_cert: Option<PathBuf>,
    peer_key: Option<PathBuf>,
    cluster_key_file: Option<PathBuf>,
    peer_insecure: Option<bool>,
    log_json: Option<bool>,
    auth: Option<AuthMode>,
}

/// How retention runs (`--retention-min`, `--retention-interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionSettings {
    pub min: Duration,
    pub interval: Duration,
}

impl Default for RetentionSettings {
    fn default() -> Self {
        Self {
            min: tributary_types::limits::RETENTION_MIN,
            interval: Duration::from_secs(30),
        }
    }
}

/// Limits on the client and peer ports' connections (`--max-connections`,
/// `--max-streams-per-connection`, `--idle-timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionSettings {
    pub max_connections: usize,
    pub max_streams_per_connection: u32,
    pub idle_timeout: Duration,
}

impl Default for ConnectionSettings {
    fn default() -> Self {
        Self {
            max_connections: 10_000,
            max_streams_per_connection: 1_000,
            idle_timeout: Duration::from_secs(600),
        }
    }
}

/// Whether the client port checks shared access signatures (`--auth`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every call needs a token granting its rights.
    #[default]
    Sas,
    /// No checks: anyone who reaches the client port may do anything.
    None,
}

impl std::str::FromStr for AuthMode {
    type Err = String;

    fn from_str(text: &str) -> Result<AuthMode, String> {
        match text.to_ascii_lowercase().as_str() {
            "sas" => Ok(AuthMode::Sas),
            "none" => Ok(AuthMode::None),
            _ => Err(format!("expected sas or none, not {text:?}")),
        }
    }
}

/// Default size of a storage log segment.
pub const SEGMENT_BYTES_DEFAULT: u64 = 64 * 1024 * 1024;

/// A duration from a flag, an environment variable or the file (in that order).
fn duration(
    flag: Option<humantime::Duration>,
    env_name: &str,
    file: Option<&String>,
    name: &str,
) -> anyhow::Result<Option<Duration>> {
    if let Some(d) = flag {
        return Ok(Some(d.into()));
    }
    if let Some(d) = env::<humantime::Duration>(env_name)? {
        return Ok(Some(d.into()));
    }
    file.map(|text| {
        humantime::parse_duration(text)
            .with_context(|| format!("{name} = {text:?} in the config file is invalid"))
    })
    .transpose()
}

/// Validated node settings.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    pub data_dir: PathBuf,
    pub peer_addr: SocketAddr,
    pub seeds: Vec<String>,
    pub bootstrap_expect: usize,
    pub controller_voters: usize,
    pub client_addr: SocketAddr,
    pub http_addr: SocketAddr,
    /// Registered instead of the bound client and peer addresses when set (`host:port`).
    pub advertise_client_addr: Option<String>,
    pub advertise_peer_addr: Option<String>,
    /// The plain-text AMQP listener, if on.
    pub amqp_addr: Option<SocketAddr>,
    /// The AMQP-over-TLS listener, if on (it needs the client port's certificate).
    pub amqps_addr: Option<SocketAddr>,
    /// The Blob checkpoint endpoint, if on (HTTPS when the client port has a certificate).
    pub blob_addr: Option<SocketAddr>,
    /// The Kafka listeners, plain text and TLS, if on.
    pub kafka_addr: Option<SocketAddr>,
    pub kafka_tls_addr: Option<SocketAddr>,
    /// The Kafka addresses clients are told (`host:port`), plain text and TLS, when not
    /// the bound ones.
    pub advertise_kafka_addr: Option<String>,
    pub advertise_kafka_tls_addr: Option<String>,
    pub node_id: u64,
    pub capacity_units: u32,
    pub zone: Option<String>,
    pub cluster_id: Option<String>,
    pub storage_shards: usize,
    pub publish_bytes_max: usize,
    pub connections: ConnectionSettings,
    pub partitions_per_hub_max: u16,
    pub raft: tributary_raft::RaftSettings,
    pub placement: PlacementSettings,
    pub retention: RetentionSettings,
    pub segment_bytes: u64,
    /// `--index-commit-linger`.
    pub index_commit_linger: Duration,
    pub tls: crate::tls::TlsSettings,
    /// The cluster key's file (`--cluster-key-file`).
    pub cluster_key_file: Option<PathBuf>,
    /// `--peer-insecure`: the peer port may face the network with nothing authenticating it.
    pub peer_insecure: bool,
    pub log_json: bool,
    pub auth: AuthMode,
    /// The root rule's primary key when this node creates it: `TRIBUTARY_ROOT_KEY`, an
    /// environment variable only (a flag would show in process listings).
    pub root_key: Option<tributary_broker::cluster::RootKey>,
}

impl NodeConfig {
    /// Settings for tests: everything default but the data directory and ports, and
    /// authorization off (`AuthMode::None`).
    pub fn for_data_dir(data_dir: &Path) -> Self {
        Self {
            data_dir: data_dir.to_path_buf(),
            peer_addr: "127.0.0.1:0".parse().expect("valid"),
            seeds: Vec::new(),
            bootstrap_expect: 1,
            controller_voters: 3,
            client_addr: "127.0.0.1:0".parse().expect("valid"),
            http_addr: "127.0.0.1:0".parse().expect("valid"),
            advertise_client_addr: None,
            advertise_peer_addr: None,
            amqp_addr: Some("127.0.0.1:0".parse().expect("valid")),
            amqps_addr: None,
            blob_addr: Some("127.0.0.1:0".parse().expect("valid")),
            kafka_addr: Some("127.0.0.1:0".parse().expect("valid")),
            kafka_tls_addr: None,
            advertise_kafka_addr: None,
            advertise_kafka_tls_addr: None,
            node_id: 1,
            capacity_units: 1,
            zone: None,
            cluster_id: None,
            storage_shards: 1,
            publish_bytes_max: PUBLISH_BYTES_MAX_DEFAULT,
            connections: ConnectionSettings::default(),
            partitions_per_hub_max: PARTITIONS_PER_HUB_MAX_DEFAULT,
            raft: tributary_raft::RaftSettings::default(),
            placement: PlacementSettings::default(),
            retention: RetentionSettings::default(),
            segment_bytes: SEGMENT_BYTES_DEFAULT,
            index_commit_linger: tributary_storage::INDEX_COMMIT_LINGER,
            tls: crate::tls::TlsSettings::default(),
            cluster_key_file: None,
            peer_insecure: false,
            log_json: false,
            auth: AuthMode::None,
            root_key: None,
        }
    }
}

fn env<T: std::str::FromStr>(name: &str) -> anyhow::Result<Option<T>>
where
    T::Err: std::fmt::Display,
{
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .map(Some)
            .map_err(|e| anyhow::anyhow!("environment variable {name}={text:?} is invalid: {e}")),
        Err(_) => Ok(None),
    }
}

impl ServeArgs {
    pub fn resolve(self) -> anyhow::Result<NodeConfig> {
        let config_path = self.config.clone().or(env("TRIBUTARY_CONFIG")?);
        let file: FileConfig = match &config_path {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("cannot read config file {}", path.display()))?;
                toml::from_str(&text)
                    .with_context(|| format!("config file {} is invalid", path.display()))?
            }
            None => FileConfig::default(),
        };
        let seeds = if !self.seeds.is_empty() {
            self.seeds.clone()
        } else if let Ok(text) = std::env::var("TRIBUTARY_SEEDS") {
            text.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        } else {
            file.seeds.clone().unwrap_or_default()
        };
        let defaults = PlacementSettings::default();
        let placement = PlacementSettings {
            node_dead_timeout: duration(
                self.node_dead_timeout,
                "TRIBUTARY_NODE_DEAD_TIMEOUT",
                file.node_dead_timeout.as_ref(),
                "node_dead_timeout",
            )?
            .unwrap_or(defaults.node_dead_timeout),
            interval: duration(
                self.placement_interval,
                "TRIBUTARY_PLACEMENT_INTERVAL",
                file.placement_interval.as_ref(),
                "placement_interval",
            )?
            .unwrap_or(defaults.interval),
            moves_per_node: self
                .placement_moves_per_node
                .or(env("TRIBUTARY_PLACEMENT_MOVES_PER_NODE")?)
                .or(file.placement_moves_per_node)
                .unwrap_or(defaults.moves_per_node),
            moves_max: self
                .placement_moves_max
                .or(env("TRIBUTARY_PLACEMENT_MOVES_MAX")?)
                .or(file.placement_moves_max)
                .unwrap_or(defaults.moves_max),
            cooldown: duration(
                self.placement_cooldown,
                "TRIBUTARY_PLACEMENT_COOLDOWN",
                file.placement_cooldown.as_ref(),
                "placement_cooldown",
            )?
            .unwrap_or(defaults.cooldown),
        };
        let retention_defaults = RetentionSettings::default();
        let retention = RetentionSettings {
            min: duration(
                self.retention_min,
                "TRIBUTARY_RETENTION_MIN",
                file.retention_min.as_ref(),
                "retention_min",
            )?
            .unwrap_or(retention_defaults.min),
            interval: duration(
                self.retention_interval,
                "TRIBUTARY_RETENTION_INTERVAL",
                file.retention_interval.as_ref(),
                "retention_interval",
            )?
            .unwrap_or(retention_defaults.interval),
        };
        let connection_defaults = ConnectionSettings::default();
        let connections = ConnectionSettings {
            max_connections: self
                .max_connections
                .or(env("TRIBUTARY_MAX_CONNECTIONS")?)
                .or(file.max_connections)
                .unwrap_or(connection_defaults.max_connections),
            max_streams_per_connection: self
                .max_streams_per_connection
                .or(env("TRIBUTARY_MAX_STREAMS_PER_CONNECTION")?)
                .or(file.max_streams_per_connection)
                .unwrap_or(connection_defaults.max_streams_per_connection),
            idle_timeout: duration(
                self.idle_timeout,
                "TRIBUTARY_IDLE_TIMEOUT",
                file.idle_timeout.as_ref(),
                "idle_timeout",
            )?
            .unwrap_or(connection_defaults.idle_timeout),
        };
        if connections.max_connections == 0 {
            bail!("--max-connections must be at least 1");
        }
        if connections.max_streams_per_connection == 0 {
            bail!("--max-streams-per-connection must be at least 1");
        }
        if connections.idle_timeout < Duration::from_secs(1) {
            bail!("--idle-timeout must be at least 1s");
        }
        let tls = tls_settings(
            self.tls_cert
                .or(env("TRIBUTARY_TLS_CERT")?)
                .or(file.tls_cert),
            self.tls_key.or(env("TRIBUTARY_TLS_KEY")?).or(file.tls_key),
            self.peer_ca.or(env("TRIBUTARY_PEER_CA")?).or(file.peer_ca),
            self.peer_cert
                .or(env("TRIBUTARY_PEER_CERT")?)
                .or(file.peer_cert),
            self.peer_key
                .or(env("TRIBUTARY_PEER_KEY")?)
                .or(file.peer_key),
        )?;
        let amqp_addr = self
            .amqp_addr
            .or(env("TRIBUTARY_AMQP_ADDR")?)
            .or(file.amqp_addr)
            .unwrap_or(Listen::At(AMQP_ADDR_DEFAULT.parse().expect("valid")))
            .addr();
        let amqps_addr = match self
            .amqps_addr
            .or(env("TRIBUTARY_AMQPS_ADDR")?)
            .or(file.amqps_addr)
        {
            Some(Listen::At(addr)) if tls.client.is_none() => bail!(
                "--amqps-addr {addr} needs the client port's certificate: give --tls-cert \
                 and --tls-key, or turn AMQPS off with --amqps-addr none"
            ),
            Some(listen) => listen.addr(),
            None if tls.client.is_some() => Some(AMQPS_ADDR_DEFAULT.parse().expect("valid")),
            None => None,
        };
        let blob_addr = self
            .blob_addr
            .or(env("TRIBUTARY_BLOB_ADDR")?)
            .or(file.blob_addr)
            .unwrap_or(Listen::At(BLOB_ADDR_DEFAULT.parse().expect("valid")))
            .addr();
        let kafka_addr = self
            .kafka_addr
            .or(env("TRIBUTARY_KAFKA_ADDR")?)
            .or(file.kafka_addr)
            .unwrap_or(Listen::At(KAFKA_ADDR_DEFAULT.parse().expect("valid")))
            .addr();
        let kafka_tls_addr = match self
            .kafka_tls_addr
            .or(env("TRIBUTARY_KAFKA_TLS_ADDR")?)
            .or(file.kafka_tls_addr)
        {
            Some(Listen::At(addr)) if tls.client.is_none() => bail!(
                "--kafka-tls-addr {addr} needs the client port's certificate: give --tls-cert \
                 and --tls-key, or turn Kafka over TLS off with --kafka-tls-addr none"
            ),
            Some(listen) => listen.addr(),
            None if tls.client.is_some() => Some(KAFKA_TLS_ADDR_DEFAULT.parse().expect("valid")),
            None => None,
        };
        let advertise_kafka_addr = advertised(
            self.advertise_kafka_addr
                .or(env("TRIBUTARY_ADVERTISE_KAFKA_ADDR")?)
                .or(file.advertise_kafka_addr),
            "--advertise-kafka-addr",
        )?;
        let advertise_kafka_tls_addr = advertised(
            self.advertise_kafka_tls_addr
                .or(env("TRIBUTARY_ADVERTISE_KAFKA_TLS_ADDR")?)
                .or(file.advertise_kafka_tls_addr),
            "--advertise-kafka-tls-addr",
        )?;
        let config = NodeConfig {
            amqp_addr,
            amqps_addr,
            blob_addr,
            kafka_addr,
            kafka_tls_addr,
            advertise_kafka_addr,
            advertise_kafka_tls_addr,
            connections,
            placement,
            retention,
            tls,
            segment_bytes: self
                .segment_bytes
                .or(env("TRIBUTARY_SEGMENT_BYTES")?)
                .or(file.segment_bytes)
                .unwrap_or(SEGMENT_BYTES_DEFAULT),
            index_commit_linger: duration(
                self.index_commit_linger,
                "TRIBUTARY_INDEX_COMMIT_LINGER",
                file.index_commit_linger.as_ref(),
                "index_commit_linger",
            )?
            .unwrap_or(tributary_storage::INDEX_COMMIT_LINGER),
            peer_addr: self
                .peer_addr
                .or(env("TRIBUTARY_PEER_ADDR")?)
                .or(file.peer_addr)
                .unwrap_or_else(|| "127.0.0.1:7401".parse().expect("valid")),
            seeds,
            advertise_client_addr: advertised(
                self.advertise_client_addr
                    .or(env("TRIBUTARY_ADVERTISE_CLIENT_ADDR")?)
                    .or(file.advertise_client_addr),
                "--advertise-client-addr",
            )?,
            advertise_peer_addr: advertised(
                self.advertise_peer_addr
                    .or(env("TRIBUTARY_ADVERTISE_PEER_ADDR")?)
                    .or(file.advertise_peer_addr),
                "--advertise-peer-addr",
            )?,
            bootstrap_expect: self
                .bootstrap_expect
                .or(env("TRIBUTARY_BOOTSTRAP_EXPECT")?)
                .or(file.bootstrap_expect)
                .unwrap_or(1),
            controller_voters: self
                .controller_voters
                .or(env("TRIBUTARY_CONTROLLER_VOTERS")?)
                .or(file.controller_voters)
                .unwrap_or(3),
            data_dir: self
                .data_dir
                .or(env("TRIBUTARY_DATA_DIR")?)
                .or(file.data_dir)
                .unwrap_or_else(|| PathBuf::from("./data")),
            client_addr: self
                .client_addr
                .or(env("TRIBUTARY_CLIENT_ADDR")?)
                .or(file.client_addr)
                .unwrap_or_else(|| "127.0.0.1:7400".parse().expect("valid")),
            http_addr: self
                .http_addr
                .or(env("TRIBUTARY_HTTP_ADDR")?)
                .or(file.http_addr)
                .unwrap_or_else(|| "127.0.0.1:7402".parse().expect("valid")),
            node_id: self
                .node_id
                .or(env("TRIBUTARY_NODE_ID")?)
                .or(file.node_id)
                .unwrap_or(1),
            capacity_units: self
                .capacity_units
                .or(env("TRIBUTARY_CAPACITY_UNITS")?)
                .or(file.capacity_units)
                .unwrap_or(1),
            zone: self
                .zone
                .or(env("TRIBUTARY_ZONE")?)
                .or(file.zone)
                .filter(|z| !z.is_empty()),
            cluster_id: self
                .cluster_id
                .or(env("TRIBUTARY_CLUSTER_ID")?)
                .or(file.cluster_id),
            storage_shards: self
                .storage_shards
                .or(env("TRIBUTARY_STORAGE_SHARDS")?)
                .or(file.storage_shards)
                .unwrap_or(1),
            publish_bytes_max: self
                .publish_bytes_max
                .or(env("TRIBUTARY_PUBLISH_BYTES_MAX")?)
                .or(file.publish_bytes_max)
                .unwrap_or(PUBLISH_BYTES_MAX_DEFAULT),
            partitions_per_hub_max: self
                .partitions_per_hub_max
                .or(env("TRIBUTARY_PARTITIONS_PER_HUB_MAX")?)
                .or(file.partitions_per_hub_max)
                .unwrap_or(PARTITIONS_PER_HUB_MAX_DEFAULT),
            raft: tributary_raft::RaftSettings {
                snapshot_entries: self
                    .raft_snapshot_entries
                    .or(env("TRIBUTARY_RAFT_SNAPSHOT_ENTRIES")?)
                    .or(file.raft_snapshot_entries)
                    .unwrap_or(tributary_raft::RaftSettings::default().snapshot_entries),
                log_keep_entries: self
                    .raft_log_keep_entries
                    .or(env("TRIBUTARY_RAFT_LOG_KEEP_ENTRIES")?)
                    .or(file.raft_log_keep_entries)
                    .unwrap_or(tributary_raft::RaftSettings::default().log_keep_entries),
                rebuild_bytes_per_second: self
                    .rebuild_bytes_per_second
                    .or(env("TRIBUTARY_REBUILD_BYTES_PER_SECOND")?)
                    .or(file.rebuild_bytes_per_second)
                    .unwrap_or(tributary_raft::RaftSettings::default().rebuild_bytes_per_second),
            },
            cluster_key_file: self
                .cluster_key_file
                .or(env("TRIBUTARY_CLUSTER_KEY_FILE")?)
                .or(file.cluster_key_file),
            peer_insecure: self.peer_insecure
                || env::<bool>("TRIBUTARY_PEER_INSECURE")?.unwrap_or(false)
                || file.peer_insecure.unwrap_or(false),
            log_json: self.log_json
                || env::<bool>("TRIBUTARY_LOG_JSON")?.unwrap_or(false)
                || file.log_json.unwrap_or(false),
            auth: self
                .auth
                .or(env("TRIBUTARY_AUTH")?)
                .or(file.auth)
                .unwrap_or_default(),
            root_key: std::env::var(ROOT_KEY_ENV)
                .ok()
                .filter(|key| !key.is_empty())
                .map(tributary_broker::cluster::RootKey),
        };
        if config.storage_shards == 0 || config.storage_shards > 64 {
            bail!("--storage-shards must be between 1 and 64");
        }
        if config.bootstrap_expect == 0 {
            bail!("--bootstrap-expect must be at least 1");
        }
        if config.controller_voters != 3 && config.controller_voters != 5 {
            bail!("--controller-voters must be 3 or 5");
        }
        if config.node_id == 0 || config.node_id > tributary_raft::NODE_ID_MAX {
            bail!(
                "--node-id must be between 1 and {}",
                tributary_raft::NODE_ID_MAX
            );
        }
        if !(1..=CAPACITY_UNITS_MAX).contains(&config.capacity_units) {
            bail!("--capacity-units must be between 1 and {CAPACITY_UNITS_MAX}");
        }
        if let Some(zone) = &config.zone
            && (zone.len() > 64
                || !zone
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
        {
            bail!("--zone {zone:?} is invalid: use up to 64 letters, digits, '-', '_' or '.'");
        }
        if config.placement.node_dead_timeout < Duration::from_secs(1) {
            bail!("--node-dead-timeout must be at least 1s");
        }
        if config.placement.interval < Duration::from_millis(100)
            || config.placement.interval > Duration::from_secs(60)
        {
            bail!("--placement-interval must be between 100ms and 60s");
        }
        if config.placement.moves_per_node == 0 || config.placement.moves_max == 0 {
            bail!("--placement-moves-per-node and --placement-moves-max must be at least 1");
        }
        if config.raft.snapshot_entries == 0 {
            bail!("--raft-snapshot-entries must be at least 1");
        }
        if config.publish_bytes_max < 1024
            || config.publish_bytes_max > tributary_types::limits::PUBLISH_BYTES_MAX_LIMIT
        {
            bail!("--publish-bytes-max must be between 1024 and 67108864");
        }
        if config.partitions_per_hub_max == 0 {
            bail!("--partitions-per-hub-max must be at least 1");
        }
        if config.retention.min < Duration::from_secs(1)
            || config.retention.min > tributary_types::limits::RETENTION_MIN
        {
            bail!("--retention-min must be between 1s and 1h");
        }
        if config.retention.interval < Duration::from_millis(100)
            || config.retention.interval > Duration::from_secs(3600)
        {
            bail!("--retention-interval must be between 100ms and 1h");
        }
        if !(64 * 1024..=1024 * 1024 * 1024).contains(&config.segment_bytes) {
            bail!("--segment-bytes must be between 65536 and 1073741824");
        }
        if config.index_commit_linger > Duration::from_millis(100) {
            bail!(
                "--index-commit-linger must be at most 100ms (readers see events up to that \
                 much later); 0s commits each write at once"
            );
        }
        if !config.peer_addr.ip().is_loopback()
            && config.tls.peer.is_none()
            && config.cluster_key_file.is_none()
            && !config.peer_insecure
        {
            bail!(
                "--peer-addr {} is reachable from other machines, and nothing would \
                 authenticate the nodes that connect to it: anyone reaching it could run \
                 controller commands and read the cluster's keys. Protect the peer port with \
                 a cluster key (--cluster-key-file FILE, made by `tributary cert cluster-key \
                 --out FILE`, the same file on every node), or with mutual TLS (--peer-ca, \
                 --peer-cert, --peer-key), or accept the risk on an isolated network with \
                 --peer-insecure",
                config.peer_addr
            );
        }
        Ok(config)
    }
}

/// Where the plain-text AMQP listener is by default.
pub const AMQP_ADDR_DEFAULT: &str = "127.0.0.1:5672";
/// Where the AMQP-over-TLS listener is by default when the client port has a certificate.
pub const AMQPS_ADDR_DEFAULT: &str = "127.0.0.1:5671";
/// The Blob checkpoint endpoint's default address: port 10000, which the Azure Storage
/// clients take for path-style (emulator) addressing.
pub const BLOB_ADDR_DEFAULT: &str = "127.0.0.1:10000";
/// Where the Kafka protocol listens unless told otherwise: plain text, and TLS when the
/// client port has a certificate.
pub const KAFKA_ADDR_DEFAULT: &str = "127.0.0.1:9092";
pub const KAFKA_TLS_ADDR_DEFAULT: &str = "127.0.0.1:9093";

/// A listener's setting: an address, or `none` (off).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listen {
    Off,
    At(SocketAddr),
}

impl Listen {
    pub fn addr(self) -> Option<SocketAddr> {
        match self {
            Listen::Off => None,
            Listen::At(addr) => Some(addr),
        }
    }
}

impl std::str::FromStr for Listen {
    type Err = String;

    fn from_str(text: &str) -> Result<Listen, String> {
        if text.eq_ignore_ascii_case("none") {
            return Ok(Listen::Off);
        }
        text.parse().map(Listen::At).map_err(|_| {
            format!(
                "expected HOST:PORT with an IP address (e.g. 0.0.0.0:5672) or none, not {text:?}"
            )
        })
    }
}

impl<'de> Deserialize<'de> for Listen {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Listen, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// An advertised address: `host:port` with a host (DNS name or IP; an IPv6 address in
/// brackets) and a port from 1 to 65535.
fn advertised(text: Option<String>, flag: &str) -> anyhow::Result<Option<String>> {
    let Some(text) = text.filter(|t| !t.is_empty()) else {
        return Ok(None);
    };
    let valid = text.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty()
            && !host.contains('/')
            && !host.chars().any(char::is_whitespace)
            && port.parse::<u16>().is_ok_and(|p| p != 0)
    });
    if !valid {
        bail!("{flag} {text:?} is invalid: give host:port, e.g. node-1.example.internal:7401");
    }
    Ok(Some(text))
}

/// TLS settings from the five file settings: the client port's two come together, and so
/// do the peer port's three.
fn tls_settings(
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    peer_ca: Option<PathBuf>,
    peer_cert: Option<PathBuf>,
    peer_key: Option<PathBuf>,
) -> anyhow::Result<crate::tls::TlsSettings> {
    use crate::tls::{CertFiles, PeerTlsFiles};
    let client = match (tls_cert, tls_key) {
        (Some(cert), Some(key)) => Some(CertFiles { cert, key }),
        (None, None) => None,
        _ => bail!(
            "--tls-cert and --tls-key go together: give both for TLS on the client port, or \
             neither for plain text"
        ),
    };
    let peer = match (peer_ca, peer_cert, peer_key) {
        (Some(ca), Some(cert), Some(key)) => Some(PeerTlsFiles {
            ca,
            cert: CertFiles { cert, key },
        }),
        (None, None, None) => None,
        _ => bail!(
            "--peer-ca, --peer-cert and --peer-key go together: give all three for mutual TLS \
             on the peer port, or none for plain text"
        ),
    };
    Ok(crate::tls::TlsSettings { client, peer })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_files_come_in_complete_sets() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(
            &file,
            "tls_key = \"client.key\"\npeer_ca = \"ca.pem\"\npeer_cert = \"n.pem\"\npeer_key = \"n.key\"\n",
        )
        .unwrap();
        let config = ServeArgs {
            tls_cert: Some("client.pem".into()),
            config: Some(file),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        let client = config.tls.client.expect("client TLS");
        assert_eq!(client.cert, PathBuf::from("client.pem"));
        assert_eq!(client.key, PathBuf::from("client.key"));
        let peer = config.tls.peer.expect("peer TLS");
        assert_eq!(peer.ca, PathBuf::from("ca.pem"));
        assert_eq!(peer.cert.key, PathBuf::from("n.key"));

        assert_eq!(
            ServeArgs::default().resolve().unwrap().tls,
            crate::tls::TlsSettings::default()
        );
        let err = ServeArgs {
            tls_cert: Some("client.pem".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--tls-cert and --tls-key go together"),
            "{err}"
        );
        let err = ServeArgs {
            peer_ca: Some("ca.pem".into()),
            peer_key: Some("n.key".into()),
            ..Default::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--peer-ca, --peer-cert and --peer-key go together"),
            "{err}"
        );
    }

    #[test]
    fn flags_win_over_file_and_defaults_fill_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "node_id = 7\nstorage_shards = 3\n").unwrap();
        let args = ServeArgs {
            storage_shards: Some(2),
            config: Some(file),
            ..Default::default()
        };
        let config = args.resolve().unwrap();
        assert_eq!(config.storage_shards, 2);
        assert_eq!(config.node_id, 7);
        assert_eq!(config.client_addr.port(), 7400);
        assert_eq!(config.data_dir, PathBuf::from("./data"));
        assert_eq!(config.auth, AuthMode::Sas);
    }

    #[test]
    fn auth_comes_from_flag_or_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "auth = \"none\"\n").unwrap();
        let from_file = ServeArgs {
            config: Some(file.clone()),
            ..Default::default()
        };
        assert_eq!(from_file.resolve().unwrap().auth, AuthMode::None);
        let flag_wins = ServeArgs {
            auth: Some(AuthMode::Sas),
            config: Some(file.clone()),
            ..Default::default()
        };
        assert_eq!(flag_wins.resolve().unwrap().auth, AuthMode::Sas);
        std::fs::write(&file, "auth = \"off\"\n").unwrap();
        let bad = ServeArgs {
            config: Some(file),
            ..Default::default()
        };
        assert!(bad.resolve().is_err());
    }

    #[test]
    fn capacity_units_and_zone_are_checked() {
        let resolve = |capacity_units: Option<u32>, zone: Option<&str>| {
            ServeArgs {
                capacity_units,
                zone: zone.map(str::to_string),
                ..Default::default()
            }
            .resolve()
        };
        let config = resolve(Some(4), Some("eu-west-1a")).unwrap();
        assert_eq!(config.capacity_units, 4);
        assert_eq!(config.zone.as_deref(), Some("eu-west-1a"));
        assert_eq!(resolve(None, None).unwrap().capacity_units, 1);
        let err = resolve(Some(0), None).unwrap_err().to_string();
        assert!(
            err.contains("--capacity-units must be between 1 and"),
            "{err}"
        );
        let err = resolve(None, Some("rack 1")).unwrap_err().to_string();
        assert!(err.contains("--zone \"rack 1\" is invalid"), "{err}");
    }

    #[test]
    fn placement_settings_parse_durations_from_flags_and_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(
            &file,
            "node_dead_timeout = \"45s\"\nplacement_moves_max = 3\n",
        )
        .unwrap();
        let config = ServeArgs {
            placement_cooldown: Some("1m".parse().unwrap()),
            config: Some(file.clone()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(config.placement.node_dead_timeout, Duration::from_secs(45));
        assert_eq!(config.placement.moves_max, 3);
        assert_eq!(config.placement.cooldown, Duration::from_secs(60));
        assert_eq!(config.placement.interval, Duration::from_secs(2));
        std::fs::write(&file, "node_dead_timeout = \"soon\"\n").unwrap();
        let err = ServeArgs {
            config: Some(file),
            ..Default::default()
        }
        .resolve()
        .unwrap_err();
        assert!(
            format!("{err:#}").contains("node_dead_timeout = \"soon\""),
            "{err:#}"
        );
    }

    #[test]
    fn retention_and_segment_settings_parse_and_are_bounded() {
        let config = ServeArgs::default().resolve().unwrap();
        assert_eq!(config.retention, RetentionSettings::default());
        assert_eq!(config.retention.min, Duration::from_secs(3600));
        assert_eq!(config.segment_bytes, SEGMENT_BYTES_DEFAULT);
        assert_eq!(config.index_commit_linger, Duration::from_millis(2));
        let config = ServeArgs {
            retention_min: Some("1s".parse().unwrap()),
            retention_interval: Some("200ms".parse().unwrap()),
            segment_bytes: Some(1 << 20),
            index_commit_linger: Some("0s".parse().unwrap()),
            ..Default::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(config.retention.min, Duration::from_secs(1));
        assert_eq!(config.retention.interval, Duration::from_millis(200));
        assert_eq!(config.segment_bytes, 1 << 20);
        assert_eq!(config.index_commit_linger, Duration::ZERO);
        for (args, message) in [
            (
                ServeArgs {
                    retention_min: Some("2h".parse().unwrap()),
                    ..Default::default()
                },
                "--retention-min must be between 1s and 1h",
            ),
            (
                ServeArgs {
                    retention_interval: Some("10ms".parse().unwrap()),
                    ..Default::default()
                },
                "--retention-interval must be between 100ms and 1h",
            ),
            (
                ServeArgs {
                    segment_bytes: Some(100),
                    ..Default::default()
                },
                "--segment-bytes must be between",
            ),
            (
                ServeArgs {
                    index_commit_linger: Some("1s".parse().unwrap()),
                    ..Default::default()
                },
                "--index-commit-linger must be at most 100ms",
            ),
        ] {
            let err = args.resolve().unwrap_err().to_string();
            assert!(err.contains(message), "{err}");
        }
    }

    /// The example config for bare servers (`deploy/systemd/tributary.toml`) is accepted as
    /// it is, and so is every setting it shows commented out.
    #[test]
    fn example_config_for_bare_servers_is_valid() {
        const EXAMPLE: &str = include_str!("../../deploy/systemd/tributary.toml");
        let resolve = |text: &str| {
            let dir = tempfile::tempdir().unwrap();
            let file = dir.path().join("tributary.toml");
            std::fs::write(&file, text).unwrap();
            ServeArgs {
                config: Some(file),
                ..Default::default()
            }
            .resolve()
        };
        let config = resolve(EXAMPLE).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(config.node_id, 1);
        assert_eq!(config.auth, AuthMode::Sas);
        assert!(config.tls.client.is_some() && config.tls.peer.is_some());
        assert_eq!(config.seeds.len(), 3);
        assert_eq!(config.amqps_addr, Some("10.0.0.11:5671".parse().unwrap()));
        assert_eq!(config.amqp_addr, Some(AMQP_ADDR_DEFAULT.parse().unwrap()));
        assert_eq!(config.blob_addr, Some("10.0.0.11:10000".parse().unwrap()));
        assert_eq!(
            config.kafka_tls_addr,
            Some("10.0.0.11:9093".parse().unwrap())
        );
        assert_eq!(config.kafka_addr, Some(KAFKA_ADDR_DEFAULT.parse().unwrap()));

        let uncommented: String = EXAMPLE
            .lines()
            .map(|line| match line.strip_prefix("# ") {
                Some(setting)
                    if setting.split_once(" = ").is_some_and(|(key, _)| {
                        key.chars().all(|c| c.is_ascii_lowercase() || c == '_')
                    }) =>
                {
                    setting
                }
                _ => line,
            })
            .map(|line| format!("{line}\n"))
            .collect();
        assert!(
            uncommented.contains("\nretention_interval = "),
            "{uncommented}"
        );
        let config = resolve(&uncommented).unwrap_or_else(|e| panic!("{e:#}"));
        assert_eq!(config.controller_voters, 3);
        assert_eq!(config.cluster_id.as_deref(), Some("production"));
        assert_eq!(config.segment_bytes, SEGMENT_BYTES_DEFAULT);
        assert_eq!(config.placement, PlacementSettings::default());
        assert_eq!(config.retention, RetentionSettings::default());
        assert_eq!(config.connections, ConnectionSettings::default());
        assert_eq!(config.amqp_addr, Some(AMQP_ADDR_DEFAULT.parse().unwrap()));
        assert_eq!(config.kafka_addr, Some(KAFKA_ADDR_DEFAULT.parse().unwrap()));
        assert_eq!(
            config.advertise_kafka_addr.as_deref(),
            Some("node-1.example.internal:9092")
        );
        assert_eq!(
            config.advertise_kafka_tls_addr.as_deref(),
            Some("node-1.example.internal:9093")
        );
    }

    #[test]
    fn a_peer_port_facing_the_network_needs_protection_or_an_explicit_opt_out() {
        let resolve = |peer_addr: &str, key: bool, insecure: bool| {
            ServeArgs {
                peer_addr: Some(peer_addr.parse().unwrap()),
                cluster_key_file: key.then(|| "cluster.key".into()),
                peer_insecure: insecure,
                ..Default::default()
            }
            .resolve()
        };
        let error = resolve("0.0.0.0:7401", false, false)
            .unwrap_err()
            .to_string();
        for option in ["--cluster-key-file", "--peer-ca", "--peer-insecure"] {
            assert!(error.contains(option), "{error}");
        }
        assert!(resolve("10.1.2.3:7401", false, false).is_err());
        let keyed = resolve("0.0.0.0:7401", true, false).unwrap();
        assert_eq!(keyed.cluster_key_file, Some("cluster.key".into()));
        assert!(resolve("0.0.0.0:7401", false, true).unwrap().peer_insecure);
        // Loopback reaches no other machine.
        assert!(resolve("127.0.0.1:7401", false, false).is_ok());
        assert!(resolve("[::1]:7401", false, false).is_ok());
    }

    #[test]
    fn kafka_listeners_default_on_with_tls_when_there_is_a_certificate() {
        let config = ServeArgs::default().resolve().unwrap();
        assert_eq!(
            (config.kafka_addr, config.kafka_tls_addr),
            (Some(KAFKA_ADDR_DEFAULT.parse().unwrap()), None)
        );
        let with_tls = ServeArgs {
            tls_cert: Some("c.pem".into()),
            tls_key: Some("c.key".into()),
            kafka_addr: Some("none".parse().unwrap()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(
            (with_tls.kafka_addr, with_tls.kafka_tls_addr),
            (None, Some(KAFKA_TLS_ADDR_DEFAULT.parse().unwrap()))
        );
        let on = ServeArgs {
            kafka_addr: Some("127.0.0.1:9092".parse().unwrap()),
            advertise_kafka_addr: Some("kafka-1.example.internal:9092".into()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(on.kafka_addr, Some("127.0.0.1:9092".parse().unwrap()));
        assert_eq!(
            on.advertise_kafka_addr.as_deref(),
            Some("kafka-1.example.internal:9092")
        );
        let err = ServeArgs {
            kafka_tls_addr: Some("127.0.0.1:9093".parse().unwrap()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap_err();
        assert!(err.to_string().contains("--tls-cert"), "{err}");
    }

    #[test]
    fn amqp_listeners_default_on_in_plain_text_and_with_tls_when_there_is_a_certificate() {
        let config = ServeArgs::default().resolve().unwrap();
        assert_eq!(config.amqp_addr, Some(AMQP_ADDR_DEFAULT.parse().unwrap()));
        assert_eq!(config.amqps_addr, None);
        let with_tls = ServeArgs {
            tls_cert: Some("c.pem".into()),
            tls_key: Some("c.key".into()),
            amqp_addr: Some("none".parse().unwrap()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap();
        assert_eq!(with_tls.amqp_addr, None);
        assert_eq!(
            with_tls.amqps_addr,
            Some(AMQPS_ADDR_DEFAULT.parse().unwrap())
        );
        let err = ServeArgs {
            amqps_addr: Some("127.0.0.1:5671".parse().unwrap()),
            ..ServeArgs::default()
        }
        .resolve()
        .unwrap_err()
        .to_string();
        assert!(err.contains("--tls-cert"), "{err}");
        assert!("localhost:5672".parse::<Listen>().is_err());
        assert_eq!("NONE".parse::<Listen>(), Ok(Listen::Off));
    }

    #[test]
    fn advertised_addresses_are_host_and_port() {
        let resolve = |client: Option<&str>, peer: Option<&str>| {
            ServeArgs {
                advertise_client_addr: client.map(str::to_string),
                advertise_peer_addr: peer.map(str::to_string),
                ..Default::default()
            }
            .resolve()
        };
        let config = resolve(Some("tributary-0.peers.ns.svc:7400"), Some("10.0.0.1:7401")).unwrap();
        assert_eq!(
            config.advertise_client_addr.as_deref(),
            Some("tributary-0.peers.ns.svc:7400")
        );
        assert_eq!(config.advertise_peer_addr.as_deref(), Some("10.0.0.1:7401"));
        assert_eq!(resolve(None, None).unwrap().advertise_peer_addr, None);
        for bad in [
            "node-1",
            "node-1:0",
            ":7401",
            "http://node-1:7401",
            "node 1:7401",
        ] {
            let err = resolve(None, Some(bad)).unwrap_err().to_string();
            assert!(err.contains("--advertise-peer-addr"), "{bad}: {err}");
        }
    }

    #[test]
    fn unknown_file_keys_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("t.toml");
        std::fs::write(&file, "nodeid = 7\n").unwrap();
        let args = ServeArgs {
            config: Some(file),
            ..Default::default()
        };
        assert!(args.resolve().is_err());
    }
}
