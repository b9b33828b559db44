//! The `tributary` node, the composition root: its configuration, the data directory's
//! identity, the listeners (TLS, connection limits), the broker and every front end over
//! its `Service`, the HTTP port (health, metrics, drain), and every background task in one
//! `JoinSet` that one stop signal ends.

pub mod config;
pub mod http;
pub mod identity;
pub mod restart_drain;
pub mod root_connection_string;
pub mod telemetry;

pub use tributary_net::{cert, limits, peer_port, tls};

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tributary_broker::cluster::{ClusterRuntime, ClusterService, MembershipConfig};
use tributary_broker::{Auth, Broker, BrokerLimits, Service, capture, checkpoints, placement};
use tributary_broker::{retention, status};
use tributary_controller::state::NodeRecord;
use tributary_grpc::GrpcApi;
use tributary_proto::peer::cluster_server::ClusterServer;
use tributary_proto::peer::node_status_server::NodeStatusServer;
use tributary_proto::v1::checkpoint_store_server::CheckpointStoreServer;
use tributary_proto::v1::consumer_server::ConsumerServer;
use tributary_proto::v1::diagnostics_server::DiagnosticsServer;
use tributary_proto::v1::management_server::ManagementServer;
use tributary_proto::v1::producer_server::ProducerServer;
use tributary_raft::peer_key::ClusterKey;
use tributary_raft::{GroupHost, PeerRouter, PeerService};
use tributary_storage::{Shard, ShardConfig};
use tributary_types::{NodeId, SystemClock};

use crate::config::NodeConfig;

/// Room for protobuf framing around the largest publication.
const REQUEST_OVERHEAD_BYTES: usize = 64 * 1024;
/// A checkpoint store request at most: a claim of every partition of the largest hub.
const STORE_REQUEST_BYTES_MAX: usize = 1024 * 1024;

/// How long shutdown lets in-flight calls of each server finish before cutting them off.
const DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Waits for a server task to end by itself within `timeout`, else aborts it (`None`).
async fn finish_within<T>(
    mut task: JoinHandle<T>,
    timeout: std::time::Duration,
    what: &str,
) -> anyhow::Result<Option<T>> {
    match tokio::time::timeout(timeout, &mut task).await {
        Ok(joined) => Ok(Some(joined?)),
        Err(_elapsed) => {
            tracing::warn!(
                server = what,
                ?timeout,
                "calls still in flight at shutdown were cut off"
            );
            task.abort();
            Ok(None)
        }
    }
}

/// Keeps the data directory's record of the cluster's feature level (which refuses older
/// releases a start on it) and the build info metric in step with the cluster.
async fn follow_feature_level(
    mut view: watch::Receiver<Arc<tributary_controller::state::ClusterState>>,
    data_dir: std::path::PathBuf,
    mut identity: identity::Identity,
) {
    loop {
        let feature = view.borrow_and_update().feature.clone();
        http::set_build_info(feature.level);
        if feature.level > identity.feature_level {
            tracing::info!(
                level = feature.level,
                release = %feature.release,
                "the cluster runs a new feature level: nodes of earlier releases can no longer join it"
            );
            if let Err(err) = identity::record_feature_level(
                &data_dir,
                &mut identity,
                feature.level,
                &feature.release,
            ) {
                tracing::warn!(%err, "cannot record the cluster's feature level in the data directory");
            }
        }
        if view.changed().await.is_err() {
            return;
        }
    }
}

/// Binds a listener that may be turned off.
async fn bind_optional(
    addr: Option<SocketAddr>,
    what: &str,
) -> anyhow::Result<Option<TcpListener>> {
    match addr {
        None => Ok(None),
        Some(addr) => {
            Ok(Some(TcpListener::bind(addr).await.with_context(|| {
                format!("cannot listen on {what} {addr}")
            })?))
        }
    }
}

fn display_listener(addr: Option<SocketAddr>) -> String {
    addr.map_or_else(|| "off".to_string(), |addr| addr.to_string())
}

fn identity_node_name(node_id: NodeId) -> String {
    format!("node-{}", node_id.0)
}

/// The Blob endpoint's TLS settings: the client port's certificate, negotiating HTTP/1.1.
/// The client port's own settings offer only `h2` (gRPC), and a server with ALPN refuses
/// the handshake of a client offering none of its protocols, as HTTP clients offering
/// `http/1.1` (the Azure Storage SDKs' among them) do.
fn blob_tls_config(client_port: &rustls::ServerConfig) -> rustls::ServerConfig {
    let mut config = client_port.clone();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    config
}

/// A host and port clients are told to connect to.
type HostPort = (String, u16);

/// The Kafka addresses clients are told, plain text and TLS: `--advertise-kafka-addr` and
/// `--advertise-kafka-tls-addr`, else the bound listener's port with the advertised host
/// (for a listener bound to 0.0.0.0, the host of `--advertise-client-addr`).
fn kafka_advertised(
    config: &NodeConfig,
    plain: Option<SocketAddr>,
    tls: Option<SocketAddr>,
) -> (Option<HostPort>, Option<HostPort>) {
    let given = |addr: &Option<String>| addr.as_deref().and_then(tributary_kafka::directory::split);
    let host = |bound: SocketAddr| match (
        given(&config.advertise_kafka_addr),
        bound.ip().is_unspecified(),
        &config.advertise_client_addr,
    ) {
        (Some((host, _)), _, _) => host,
        (None, true, Some(client)) => client
            .rsplit_once(':')
            .map_or(client.as_str(), |(host, _)| host)
            .to_string(),
        (None, _, _) => bound.ip().to_string(),
    };
    let plain = plain.map(|bound| {
        given(&config.advertise_kafka_addr).unwrap_or_else(|| (host(bound), bound.port()))
    });
    let tls = tls.map(|bound| {
        given(&config.advertise_kafka_tls_addr).unwrap_or_else(|| (host(bound), bound.port()))
    });
    (plain, tls)
}

/// The AMQP connection limits from the node's settings.
fn amqp_limits(config: &NodeConfig, node_name: String) -> tributary_amqp::server::ConnectionLimits {
    let defaults = tributary_amqp::server::ConnectionLimits::default();
    tributary_amqp::server::ConnectionLimits {
        node_name,
        max_message_size_bytes: config.publish_bytes_max as u64,
        // Room for a largest publication in and a largest event out at once.
        buffered_bytes_max: defaults
            .buffered_bytes_max
            .max(2 * config.publish_bytes_max + 1024 * 1024),
        ..defaults
    }
}

/// The AMQP listeners, bound at start and served once the node has joined.
struct AmqpListeners {
    plain: Option<TcpListener>,
    tls: Option<(TcpListener, Arc<rustls::ServerConfig>)>,
}

impl AmqpListeners {
    fn spawn(
        self,
        tasks: &mut JoinSet<()>,
        backend: Arc<dyn tributary_amqp::server::Backend>,
        limits: tributary_amqp::server::ConnectionLimits,
        connections: config::ConnectionSettings,
        stop: watch::Receiver<bool>,
    ) {
        let gate = limits::ConnectionGate::new("amqp", connections.max_connections);
        if let Some(listener) = self.plain {
            tasks.spawn(tributary_amqp::listener::serve_listener(
                limits::incoming(listener, gate.clone(), connections.idle_timeout),
                backend.clone(),
                limits.clone(),
                stop.clone(),
            ));
        }
        if let Some((listener, config)) = self.tls {
            tasks.spawn(tributary_amqp::listener::serve_listener(
                tls::incoming(
                    listener,
                    config,
                    tls::TlsPort::Client,
                    gate,
                    connections.idle_timeout,
                ),
                backend,
                limits,
                stop,
            ));
        }
    }
}

/// How long shutdown waits for the last users of a storage shard.
const SHARD_CLOSE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// A running node. Dropping it does not stop it: call [`Node::shutdown`].
pub struct Node {
    pub client_addr: SocketAddr,
    pub http_addr: SocketAddr,
    pub peer_addr: SocketAddr,
    /// The AMQP listeners' bound addresses (plain text and TLS), when on.
    pub amqp_addr: Option<SocketAddr>,
    pub amqps_addr: Option<SocketAddr>,
    /// The Blob checkpoint endpoint's bound address, when on.
    pub blob_addr: Option<SocketAddr>,
    /// The Kafka listeners' bound addresses (plain text and TLS), when on.
    pub kafka_addr: Option<SocketAddr>,
    pub kafka_tls_addr: Option<SocketAddr>,
    pub broker: Arc<Broker>,
    /// The broker's API, as every front end calls it.
    pub service: Service,
    shards: Vec<Shard>,
    shutdown: watch::Sender<bool>,
    /// Every background task (reconcilers, placement, retention, capture, telemetry, ...):
    /// they run until the node stops, and shutdown ends them all.
    tasks: JoinSet<()>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    peer_server: JoinHandle<Result<(), tonic::transport::Error>>,
    http: JoinHandle<()>,
}

impl Node {
    /// Opens the data directory, starts every partition and binds the listeners.
    pub async fn start(config: NodeConfig) -> anyhow::Result<Node> {
        Self::start_with_clock(config, Arc::new(SystemClock)).await
    }

    /// As [`Node::start`], with the clock injected (tests step it).
    pub async fn start_with_clock(
        config: NodeConfig,
        clock: Arc<dyn tributary_types::Clock>,
    ) -> anyhow::Result<Node> {
        // The recorder first: storage and Raft record from their first write on, and the
        // auth gauge set below is kept.
        http::metrics_handle();
        let mut identity = identity::load_or_create(
            &config.data_dir,
            config.node_id,
            config.cluster_id.as_deref(),
        )?;
        // A restart writes what its cluster reads from the first write on.
        tributary_types::format::follow_cluster_level(identity.feature_level);
        let mut shards = Vec::new();
        for i in 0..config.storage_shards {
            let path = config.data_dir.join(format!("shard-{i}.redb"));
            shards.push(
                Shard::open(
                    &path,
                    ShardConfig {
                        segment_bytes_max: config.segment_bytes,
                        index_commit_linger: config.index_commit_linger,
                        ..ShardConfig::default()
                    },
                )
                .with_context(|| format!("cannot open storage shard {}", path.display()))?,
            );
        }
        let client_listener = TcpListener::bind(config.client_addr)
            .await
            .with_context(|| format!("cannot listen on client address {}", config.client_addr))?;
        let http_listener = TcpListener::bind(config.http_addr)
            .await
            .with_context(|| format!("cannot listen on HTTP address {}", config.http_addr))?;
        let peer_listener = TcpListener::bind(config.peer_addr)
            .await
            .with_context(|| format!("cannot listen on peer address {}", config.peer_addr))?;
        let amqp_listener = bind_optional(config.amqp_addr, "AMQP address (--amqp-addr)").await?;
        let amqps_listener =
            bind_optional(config.amqps_addr, "AMQPS address (--amqps-addr)").await?;
        let blob_listener = bind_optional(config.blob_addr, "Blob address (--blob-addr)").await?;
        let kafka_listener =
            bind_optional(config.kafka_addr, "Kafka address (--kafka-addr)").await?;
        let kafka_tls_listener = bind_optional(
            config.kafka_tls_addr,
            "Kafka TLS address (--kafka-tls-addr)",
        )
        .await?;
        let kafka_addr = kafka_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let kafka_tls_addr = kafka_tls_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let blob_addr = blob_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let amqp_addr = amqp_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let amqps_addr = amqps_listener
            .as_ref()
            .map(TcpListener::local_addr)
            .transpose()?;
        let client_addr = client_listener.local_addr()?;
        let http_addr = http_listener.local_addr()?;
        let peer_addr = peer_listener.local_addr()?;

        let node_tls = tls::NodeTls::load(&config.tls, identity.node_id)?;
        let cluster_key = config
            .cluster_key_file
            .as_deref()
            .map(ClusterKey::read)
            .transpose()?;
        let peer_connector = node_tls
            .peer_connector
            .clone()
            .with_key(cluster_key.clone());
        let peer_door = peer_port::PeerDoor {
            tls: node_tls.peer_port.clone(),
            key: cluster_key,
        };
        let peer_protected = peer_door.is_protected();
        let node_id = NodeId(identity.node_id);
        let connector: Arc<dyn tributary_raft::Connector> = Arc::new(peer_connector.clone());
        let host = GroupHost::with_settings(
            node_id,
            PeerRouter::new(node_id.0, peer_connector),
            config.raft,
        );
        host.hibernate_idle();
        let runtime = ClusterRuntime::new(
            NodeRecord {
                capacity_units: config.capacity_units,
                zone: config.zone.clone(),
                // Others reach this node at the advertised addresses, else at the bound ones.
                ..NodeRecord::new(
                    node_id.0,
                    config
                        .advertise_client_addr
                        .clone()
                        .unwrap_or_else(|| client_addr.to_string()),
                    config
                        .advertise_peer_addr
                        .clone()
                        .unwrap_or_else(|| peer_addr.to_string()),
                    identity.data_id,
                )
            },
            MembershipConfig {
                seeds: config.seeds.clone(),
                bootstrap_expect: config.bootstrap_expect,
                controller_voters: config.controller_voters,
                cluster_id: identity.cluster_id.clone().or(config.cluster_id.clone()),
                root_key: config.root_key.clone(),
            },
            host.clone(),
            shards[0].clone(),
            connector,
        );
        let broker = Broker::new(
            runtime.clone(),
            shards.clone(),
            clock.clone(),
            BrokerLimits {
                partitions_per_hub_max: config.partitions_per_hub_max,
                publish_bytes_max: config.publish_bytes_max,
                retention_min: config.retention.min,
            },
        );
        let store: Arc<dyn checkpoints::CheckpointStore> = Arc::new(
            checkpoints::ControllerStore::new(runtime.clone(), clock.clone()),
        );
        let placement = placement::Placement::new(broker.clone(), config.placement, clock.clone());
        let (shutdown, shutdown_rx) = watch::channel(false);

        let connections = config.connections;
        let keepalive = keepalive_interval(connections.idle_timeout);
        // Answers UNAVAILABLE until the service exists, once the node has joined.
        let forward = tributary_forward::ForwardService::new();
        let peer_router = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive))
            .max_concurrent_streams(Some(connections.max_streams_per_connection))
            // A peer whose calls time out resets their streams, often before this server
            // has taken them up when it is busy; past hyper's default (20) such resets
            // close the connection, and every group's heartbeats and replication on it
            // with it. (With --cluster-key-file or --peer-ca, only nodes that proved them
            // reach this server.)
            .http2_max_pending_accept_reset_streams(Some(
                connections.max_streams_per_connection as usize,
            ))
            .initial_stream_window_size(tributary_raft::PEER_STREAM_WINDOW_BYTES)
            .initial_connection_window_size(tributary_raft::PEER_CONNECTION_WINDOW_BYTES)
            .add_service(
                PeerService::new(host.clone())
                    .ending_sessions_on(shutdown_rx.clone())
                    .into_server(),
            )
            .add_service(ClusterServer::new(ClusterService {
                runtime: runtime.clone(),
            }))
            .add_service(NodeStatusServer::new(status::NodeStatusService {
                broker: broker.clone(),
            }))
            .add_service(forward.clone().into_server());
        let peer_gate = limits::ConnectionGate::new("peer", connections.max_connections);
        let peer_server = tokio::spawn(peer_router.serve_with_incoming_shutdown(
            peer_port::incoming(
                peer_listener,
                peer_door,
                peer_gate,
                connections.idle_timeout,
            ),
            stopped(shutdown_rx.clone()),
        ));
        // HTTP first: /healthz answers while the node waits for its peers (a liveness probe
        // must not kill a node that is only waiting), /readyz says it has not joined yet.
        let drain = restart_drain::RestartDrain::new(broker.clone(), &config.data_dir);
        let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let http = tokio::spawn(http::serve(
            http_listener,
            broker.clone(),
            drain.clone(),
            started.clone(),
            shutdown_rx.clone(),
        ));
        tracing::info!(%peer_addr, %http_addr, node_id = node_id.0, "joining the cluster");
        let joined = async {
            runtime.run().await?;
            let mut view = runtime.view();
            let cluster_id = view
                .wait_for(|s| !s.cluster_id.is_empty())
                .await?
                .cluster_id
                .clone();
            identity::record_cluster(&config.data_dir, &mut identity, &cluster_id)?;
            anyhow::Ok(cluster_id)
        };
        let data_dir = config.data_dir.clone();
        let cluster_id = match joined.await {
            Ok(cluster_id) => cluster_id,
            Err(err) => {
                // Nothing of a node that failed to start keeps serving.
                let _ = shutdown.send(true);
                runtime.stop();
                http.abort();
                peer_server.abort();
                return Err(err);
            }
        };
        let mut tasks = JoinSet::new();
        tasks.spawn(drain.end_after_restart());
        tasks.spawn(broker.clone().run_reconciler());
        tasks.spawn(broker.clone().run_membership_reconciler());
        tasks.spawn(placement.clone().run());
        tasks.spawn(retention::run(
            broker.clone(),
            config.retention.interval,
            config.data_dir.clone(),
        ));
        tasks.spawn(capture::capturer::run(broker.clone()));
        tasks.spawn(telemetry::run(broker.clone()));
        tasks.spawn(follow_feature_level(runtime.view(), data_dir, identity));

        report_peer_protection(&config, peer_protected, peer_addr);
        let auth = Auth::new(
            config.auth == config::AuthMode::Sas,
            runtime.clone(),
            clock.clone(),
        );
        match config.auth {
            config::AuthMode::Sas => {
                tasks.spawn(root_connection_string::keep_written(
                    broker.clone(),
                    config.data_dir.clone(),
                ));
            }
            config::AuthMode::None => tracing::warn!(
                "AUTHORIZATION IS OFF (--auth none): anyone who reaches the client port \
                 {client_addr} may send, read, and create or delete event hubs. Use it only \
                 for development; leave --auth at its default (sas) otherwise"
            ),
        }
        let service = Service::new(broker.clone(), auth, store, placement);
        forward.set(service.clone());
        let (kafka_plain, kafka_tls) = kafka_advertised(&config, kafka_addr, kafka_tls_addr);
        let joined = |addr: &Option<HostPort>| {
            addr.as_ref().map(|(host, port)| match host.contains(':') {
                true => format!("[{host}]:{port}"),
                false => format!("{host}:{port}"),
            })
        };
        broker.set_kafka_addrs(tributary_broker::service::KafkaAddrs {
            plain: joined(&kafka_plain),
            tls: joined(&kafka_tls),
        });
        let kafka_settings = tributary_kafka::KafkaSettings {
            service: service.clone(),
            directory: Arc::new(tributary_kafka::directory::Directory::default()),
            groups: Arc::new(tributary_kafka::Groups::default()),
            request_bytes_max: config.publish_bytes_max * 2 + REQUEST_OVERHEAD_BYTES,
            clock: clock.clone(),
        };
        let kafka_context = |tls: bool, advertised: (String, u16)| {
            Arc::new(tributary_kafka::KafkaContext::new(
                &kafka_settings,
                tls,
                advertised,
            ))
        };
        let kafka_gate = limits::ConnectionGate::new("kafka", connections.max_connections);
        if let (Some(listener), Some(advertised)) = (kafka_listener, kafka_plain) {
            tasks.spawn(tributary_kafka::listener::serve_listener(
                limits::incoming(listener, kafka_gate.clone(), connections.idle_timeout),
                kafka_context(false, advertised),
                shutdown_rx.clone(),
            ));
        }
        if let (Some(listener), Some(advertised)) = (kafka_tls_listener, kafka_tls) {
            let mut tls_config = node_tls
                .client_port
                .as_deref()
                .expect("--kafka-tls-addr is refused without --tls-cert")
                .clone();
            // Kafka clients offer no application protocol.
            tls_config.alpn_protocols.clear();
            tasks.spawn(tributary_kafka::listener::serve_listener(
                tls::incoming(
                    listener,
                    Arc::new(tls_config),
                    tls::TlsPort::Client,
                    kafka_gate,
                    connections.idle_timeout,
                ),
                kafka_context(true, advertised),
                shutdown_rx.clone(),
            ));
        }
        let amqp = AmqpListeners {
            plain: amqp_listener,
            tls: amqps_listener.map(|listener| {
                let config = node_tls
                    .client_port
                    .clone()
                    .expect("--amqps-addr is refused without --tls-cert");
                (listener, config)
            }),
        };
        amqp.spawn(
            &mut tasks,
            Arc::new(tributary_amqp::broker_backend::BrokerBackend::new(
                service.clone(),
                clock,
            )),
            amqp_limits(&config, identity_node_name(node_id)),
            connections,
            shutdown_rx.clone(),
        );
        if let Some(listener) = blob_listener {
            let endpoint = tributary_blob::BlobEndpoint::new(service.clone());
            let gate = limits::ConnectionGate::new("blob", connections.max_connections);
            let stop = shutdown_rx.clone();
            let idle = connections.idle_timeout;
            tasks.spawn(match node_tls.client_port.as_deref() {
                None => futures::future::Either::Left(tributary_blob::listener::serve_listener(
                    limits::incoming(listener, gate, idle),
                    endpoint,
                    stop,
                )),
                Some(config) => {
                    let config = Arc::new(blob_tls_config(config));
                    futures::future::Either::Right(tributary_blob::listener::serve_listener(
                        tls::incoming(listener, config, tls::TlsPort::Client, gate, idle),
                        endpoint,
                        stop,
                    ))
                }
            });
        }
        let api = GrpcApi::new(service.clone())
            .stopping_on(shutdown_rx.clone())
            .with_stream_sends_max(connections.max_streams_per_connection as usize);
        let request_bytes_max = config.publish_bytes_max * 2 + REQUEST_OVERHEAD_BYTES;
        let server = tonic::transport::Server::builder()
            .http2_keepalive_interval(Some(keepalive))
            .http2_keepalive_timeout(Some(keepalive))
            .max_concurrent_streams(Some(connections.max_streams_per_connection))
            .add_service(
                ManagementServer::new(api.clone())
                    .max_decoding_message_size(REQUEST_OVERHEAD_BYTES),
            )
            .add_service(
                ProducerServer::new(api.clone()).max_decoding_message_size(request_bytes_max),
            )
            .add_service(
                ConsumerServer::new(api.clone()).max_decoding_message_size(REQUEST_OVERHEAD_BYTES),
            )
            .add_service(
                CheckpointStoreServer::new(api.clone())
                    .max_decoding_message_size(STORE_REQUEST_BYTES_MAX),
            )
            .add_service(DiagnosticsServer::new(api));
        let client_gate = limits::ConnectionGate::new("client", connections.max_connections);
        let server = tokio::spawn(match node_tls.client_port {
            None => futures::future::Either::Left(server.serve_with_incoming_shutdown(
                limits::incoming(client_listener, client_gate, connections.idle_timeout),
                stopped(shutdown_rx.clone()),
            )),
            Some(config) => futures::future::Either::Right(server.serve_with_incoming_shutdown(
                tls::incoming(
                    client_listener,
                    config,
                    tls::TlsPort::Client,
                    client_gate,
                    connections.idle_timeout,
                ),
                stopped(shutdown_rx.clone()),
            )),
        });
        tracing::info!(
            %client_addr,
            %http_addr,
            %peer_addr,
            amqp_addr = %display_listener(amqp_addr),
            amqps_addr = %display_listener(amqps_addr),
            blob_addr = %display_listener(blob_addr),
            kafka_addr = %display_listener(kafka_addr),
            kafka_tls_addr = %display_listener(kafka_tls_addr),
            node_id = node_id.0,
            %cluster_id,
            data_dir = %config.data_dir.display(),
            "tributary node started"
        );
        started.store(true, std::sync::atomic::Ordering::Release);
        Ok(Node {
            client_addr,
            http_addr,
            peer_addr,
            amqp_addr,
            amqps_addr,
            blob_addr,
            kafka_addr,
            kafka_tls_addr,
            broker,
            service,
            shards,
            shutdown,
            tasks,
            server,
            peer_server,
            http,
        })
    }

    /// Resolves when a storage shard has failed (a full disk, an I/O error): the node can no
    /// longer store anything and must stop; a restart recovers from what is durable.
    pub async fn storage_failed(&self) -> StorageFailed {
        let failures = self.shards.iter().map(|shard| Box::pin(shard.failed()));
        let (err, _, _) = futures::future::select_all(failures).await;
        StorageFailed(err.to_string())
    }

    /// Stops accepting, lets in-flight requests finish, stops every group and flushes.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        // Stop accepting, end reader streams (they never end by themselves), let in-flight
        // sends finish, then stop the groups and close storage.
        let _ = self.shutdown.send(true);
        self.broker.close_readers();
        // A call that cannot finish (a send whose partition has lost its quorum waits for
        // a commit that may never come) is cut off after the drain time, so a stopping node
        // never outlasts its supervisor's patience. Its caller sees the call fail: a send
        // cut off is indeterminate, as after a crash.
        finish_within(self.server, DRAIN_TIMEOUT, "client API")
            .await?
            .transpose()?;
        finish_within(self.http, DRAIN_TIMEOUT, "HTTP").await?;
        // Background tasks hold the broker (and through it the storage shards): end them
        // all before the groups stop, so every shard is closed with a final checkpoint.
        let mut tasks = self.tasks;
        tasks.abort_all();
        while tasks.join_next().await.is_some() {}
        drop(self.service);
        self.broker.runtime().stop();
        self.broker.shutdown().await;
        finish_within(self.peer_server, DRAIN_TIMEOUT, "peer API")
            .await?
            .transpose()?;
        drop(self.broker);
        // Calls cut off above may still hold a shard for a while (their connections live
        // on); past the timeout the node stops without closing it, as a crash would: every
        // acknowledged write is already durable, and the next start recovers the rest.
        let closes = self
            .shards
            .into_iter()
            .map(|shard| shard.close(SHARD_CLOSE_TIMEOUT));
        for closed in futures::future::join_all(closes).await {
            match closed {
                Ok(()) => {}
                Err(tributary_storage::StorageError::StillInUse(why)) => {
                    tracing::warn!("{why}; stopping without closing it")
                }
                Err(err) => return Err(err.into()),
            }
        }
        tracing::info!("tributary node stopped");
        Ok(())
    }
}

/// The node stopped because its storage failed; the process exits with
/// [`StorageFailed::EXIT_CODE`] so a supervisor (Kubernetes, systemd) restarts it.
#[derive(Debug, thiserror::Error)]
#[error(
    "storage failed: {0}. The node stopped without acknowledging anything it had not stored; \
     free space or fix the disk, then start it again: it recovers from what is on disk"
)]
pub struct StorageFailed(pub String);

impl StorageFailed {
    /// EX_IOERR of sysexits.h.
    pub const EXIT_CODE: u8 = 74;
}

/// `tributary serve`: runs a node until SIGTERM or SIGINT, then shuts down cleanly. When its
/// storage fails it stops at once with [`StorageFailed`] (fail-stop, as a Kafka broker whose
/// log directory failed): its replicas' peers carry on, and a restart replays the durable log.
/// The test build's stand-in for a node of a later release:
/// `TRIBUTARY_TEST_FEATURE_LEVEL=LEVEL@RELEASE` (e.g. `3@0.3.0`) makes the node report that
/// release and support feature levels up to LEVEL. Debug builds only: a release build
/// ignores the variable.
fn simulate_later_release() -> anyhow::Result<()> {
    const VARIABLE: &str = "TRIBUTARY_TEST_FEATURE_LEVEL";
    if !cfg!(debug_assertions) {
        return Ok(());
    }
    let Ok(value) = std::env::var(VARIABLE) else {
        return Ok(());
    };
    let parsed = value
        .split_once('@')
        .and_then(|(level, release)| Some((level.parse::<u32>().ok()?, release)));
    let Some((level, release)) = parsed else {
        anyhow::bail!("{VARIABLE} must be LEVEL@RELEASE (e.g. 3@0.3.0), not '{value}'");
    };
    tracing::warn!(
        level,
        release,
        "posing as a later release ({VARIABLE}): for tests only"
    );
    tributary_types::format::simulate_release(level, release.to_string());
    Ok(())
}

pub async fn serve_until_signal(args: config::ServeArgs) -> anyhow::Result<()> {
    let config = args.resolve()?;
    init_logging(config.log_json);
    simulate_later_release()?;
    http::metrics_handle();
    // The handlers are installed before the node starts: a node answers health checks while
    // `Node::start` is still finishing, and a SIGTERM sent then must shut it down cleanly
    // instead of killing it.
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let node = tokio::select! {
        node = Node::start(config) => node?,
        // Start can wait for a long time (for the cluster's other members, for a controller
        // to admit it): a signal then stops it at once. It has acknowledged nothing yet.
        _ = interrupt.recv() => {
            tracing::info!("SIGINT received while starting, stopping");
            return Ok(());
        }
        _ = term.recv() => {
            tracing::info!("SIGTERM received while starting, stopping");
            return Ok(());
        }
    };
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT received, shutting down"),
        _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
        failed = node.storage_failed() => {
            tracing::error!("{failed}");
            return Err(failed.into());
        }
    }
    node.shutdown().await
}

/// The log filter unless TRIBUTARY_LOG says otherwise. openraft warns of every failed
/// heartbeat, vote and append on its own (hundreds a second per node when a peer falls
/// behind); the peer transport sums those up instead (`tributary_raft`'s peer failures: the
/// first at once, then one line per peer every 10 s), so those openraft modules log errors
/// only.
const LOG_FILTER_DEFAULT: &str = "info,openraft=warn,openraft::core::heartbeat=error,\
     openraft::core::raft_core=error,openraft::replication=error,\
     openraft::engine::handler::replication_handler=error";

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TRIBUTARY_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(LOG_FILTER_DEFAULT));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// How often the gRPC servers ping a connection with no traffic (and how long they wait
/// for the answer before closing it): often enough that a healthy connection is never idle
/// for `idle_timeout` (the answers are traffic), at most every 30 s.
/// Says at startup how the peer port authenticates nodes: `tributary_peer_insecure` is 1
/// when it faces the network with nothing doing so (`--peer-insecure`), with a warning.
fn report_peer_protection(config: &NodeConfig, protected: bool, peer_addr: SocketAddr) {
    let open = !protected && !peer_addr.ip().is_loopback();
    metrics::gauge!("tributary_peer_insecure").set(if open { 1.0 } else { 0.0 });
    if open {
        tracing::warn!(
            "THE PEER PORT IS OPEN (--peer-insecure): anyone who reaches {peer_addr} can run \
             controller commands, inject Raft messages and read the cluster's keys. Use it \
             only on an isolated network; protect it with --cluster-key-file or mutual TLS \
             otherwise"
        );
    } else if config.peer_insecure {
        tracing::info!(
            "--peer-insecure has no effect: the peer port is protected or bound to loopback"
        );
    }
}

fn keepalive_interval(idle_timeout: std::time::Duration) -> std::time::Duration {
    (idle_timeout / 3).min(std::time::Duration::from_secs(30))
}

/// Resolves when the node starts shutting down.
async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    use super::LOG_FILTER_DEFAULT;

    /// Every directive of the default filter parses (`EnvFilter::new` would drop a bad one
    /// silently, and with it the quieting of openraft's per-call warnings).
    #[test]
    fn the_default_log_filter_parses() {
        let filter = tracing_subscriber::EnvFilter::try_new(LOG_FILTER_DEFAULT)
            .expect("the default log filter parses");
        let text = filter.to_string();
        for module in [
            "openraft::core::heartbeat=error",
            "openraft::core::raft_core=error",
            "openraft::replication=error",
            "openraft::engine::handler::replication_handler=error",
        ] {
            assert!(text.contains(module), "{module} missing from {text}");
        }
    }
}
