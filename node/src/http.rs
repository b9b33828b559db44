//! The HTTP port: `/healthz` (process alive), `/readyz` (every local partition led),
//! `/metrics` (Prometheus text), `POST /drain?timeout=30s` (from this machine only: drain for
//! a restart, see `restart_drain.rs`), and for testing only, with `TRIBUTARY_FAULT_HOOKS=1`,
//! `POST /debug/faults/crash-after-commit` and `POST /debug/faults/refuse-producer-ids?count=N`
//! (see `fault.rs`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{ConnectInfo, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::restart_drain::RestartDrain;
use tributary_broker::Broker;
use tributary_broker::fault::FaultHooks;
use tributary_types::send_stage;

/// How long `POST /drain` waits for leaderships to move unless told.
const DRAIN_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);
/// The longest wait `POST /drain` accepts.
const DRAIN_TIMEOUT_MAX: Duration = Duration::from_secs(3600);

#[derive(Clone)]
struct HttpState {
    broker: Arc<Broker>,
    drain: Arc<RestartDrain>,
    /// Set once the node has joined its cluster and started serving clients.
    started: Arc<std::sync::atomic::AtomicBool>,
}

/// Both ends of an HTTP connection.
#[derive(Clone, Copy, Debug)]
struct Ends {
    peer: SocketAddr,
    local: Option<SocketAddr>,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TcpListener>> for Ends {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TcpListener>) -> Self {
        Ends {
            peer: *stream.remote_addr(),
            local: stream.io().local_addr().ok(),
        }
    }
}

impl Ends {
    /// Whether the connection comes from this machine: from loopback, or from the address it
    /// reached (the kernel picks the destination as the source of a connection to one of the
    /// machine's own addresses: a node bound to its LAN address is drained through it).
    fn is_local(&self) -> bool {
        let peer = self.peer.ip().to_canonical();
        peer.is_loopback() || self.local.is_some_and(|l| l.ip().to_canonical() == peer)
    }
}

#[derive(serde::Deserialize)]
struct DrainQuery {
    /// A duration as `30s` or `2m`.
    timeout: Option<String>,
}

/// Histogram buckets of every `*_seconds` histogram: 100 µs to 10 s.
const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Histogram buckets of `tributary_storage_commit_batch_writes`.
const BATCH_BUCKETS_WRITES: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// The process-wide metrics recorder, installed once.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS_SECONDS)
                .expect("the latency buckets are not empty")
                // Finer, for the stages of a send (a full name wins over a suffix).
                .set_buckets_for_metric(
                    Matcher::Full(send_stage::SEND_STAGE_METRIC.into()),
                    send_stage::SEND_STAGE_BUCKETS_SECONDS,
                )
                .expect("the stage buckets are not empty")
                .set_buckets_for_metric(
                    Matcher::Full("tributary_storage_commit_batch_writes".into()),
                    BATCH_BUCKETS_WRITES,
                )
                .expect("the batch buckets are not empty")
                .install_recorder()
                .expect("the metrics recorder is installed once");
            describe_added_metrics();
            metrics::describe_counter!(
                "tributary_storage_fsyncs_total",
                "Durable storage commits (each one fsync), across all shards"
            );
            metrics::describe_counter!(
                "tributary_storage_replayed_batches_total",
                "Write-ahead log batches replayed when the storage shards opened (0 after a clean stop)"
            );
            metrics::describe_histogram!(
                "tributary_storage_commit_batch_writes",
                "Writes merged into one batch of the storage log (group commit)"
            );
            metrics::describe_histogram!(
                "tributary_storage_commit_seconds",
                metrics::Unit::Seconds,
                "Time from a storage batch's start to its writes' completion: its log append (and \
                 fsync when durable) and the index commit that makes it readable, which may \
                 serve later batches too"
            );
            metrics::describe_counter!("tributary_events_in_total", "Events accepted by sends, by hub");
            metrics::describe_gauge!(
                "tributary_connections_open",
                "Connections open on a gRPC port (client, peer)"
            );
            metrics::describe_counter!(
                "tributary_connections_refused_total",
                "Connections refused over --max-connections (reason limit) or closed after \
                 --idle-timeout without traffic (reason idle)"
            );
            metrics::describe_gauge!(
                "tributary_sends_in_flight",
                "Sends this node has received and not yet answered"
            );
            metrics::describe_counter!(
                "tributary_bytes_in_total",
                metrics::Unit::Bytes,
                "Bytes accepted by sends, by hub"
            );
            metrics::describe_counter!(
                "tributary_events_out_total",
                "Events delivered to readers, by hub"
            );
            metrics::describe_counter!(
                "tributary_raft_commit_notices_deferred_total",
                "Requests carrying only a new commit index that a partition leader did not send \
                 to a follower: it learns the index from the next request or heartbeat"
            );
            metrics::describe_counter!(
                "tributary_raft_snapshots_installed_total",
                "Partition replicas rebuilt from a snapshot sent by their leader"
            );
            metrics::describe_counter!(
                "tributary_peer_snapshot_chunks_received_total",
                "Snapshot pieces received from leaders"
            );
            metrics::describe_counter!(
                "tributary_rebuild_bytes_sent_total",
                "Log bytes sent to rebuild replicas from snapshots"
            );
            metrics::describe_counter!(
                "tributary_rebuild_bytes_received_total",
                "Log bytes received while this node's replicas were rebuilt from snapshots"
            );
            metrics::describe_gauge!(
                "tributary_rebuilds_in_progress",
                "Replica rebuilds under way, by direction (send, receive)"
            );
            metrics::describe_gauge!(
                "tributary_rebuild_progress_bytes",
                "Log bytes sent or received so far by each rebuild (group, peer, direction)"
            );
            metrics::describe_gauge!(
                "tributary_rebuild_size_bytes",
                "Log bytes each rebuild carries in all (group, peer, direction)"
            );
            metrics::describe_counter!(
                "tributary_peer_sessions_opened_total",
                "Replication sessions (one long-lived stream to a peer node) opened, the \
                 first to each peer and every one after a failure"
            );
            metrics::describe_counter!(
                "tributary_send_streams_opened_total",
                "Send streams (Producer.SendStream: a client's sends to this node on one \
                 long-lived stream) opened by clients"
            );
            metrics::describe_counter!(
                "tributary_peer_batches_total",
                "Coalesced batches of Raft messages (heartbeats) sent to peers"
            );
            metrics::describe_counter!(
                "tributary_peer_batched_messages_total",
                "Raft messages sent in coalesced batches"
            );
            metrics::describe_histogram!(
                "tributary_send_duration_seconds",
                metrics::Unit::Seconds,
                "Time from a send's arrival to its commit, by hub"
            );
            metrics::describe_histogram!(
                send_stage::SEND_STAGE_METRIC,
                metrics::Unit::Seconds,
                "Time a send spends in each stage, by stage: on its leader front_end, \
                 appender_wait, commit, apply and reply, which add up to total; within commit \
                 leader_log_write and replication (leader), follower_handle and follower_write \
                 (follower); storage_queue, storage_log_write and storage_index_commit of every \
                 durable log write"
            );
            metrics::describe_gauge!(
                "tributary_storage_data_bytes",
                metrics::Unit::Bytes,
                "Bytes the node's data directory takes on disk"
            );
            metrics::describe_gauge!(
                "tributary_storage_disk_free_bytes",
                metrics::Unit::Bytes,
                "Bytes still available on the filesystem holding the data directory"
            );
            metrics::describe_gauge!(
                "tributary_storage_disk_total_bytes",
                metrics::Unit::Bytes,
                "Size of the filesystem holding the data directory"
            );
            metrics::describe_counter!(
                "tributary_retention_entries_removed_total",
                "Log entries removed because every event in them was past retention or over the size cap"
            );
            metrics::describe_counter!(
                "tributary_compaction_entries_rewritten_total",
                "Log entries rewritten by compaction without their superseded events"
            );
            process_collector().describe();
            handle
        })
        .clone()
}

/// The cluster feature level the build info series carries now.
static BUILD_INFO_LEVEL: std::sync::Mutex<Option<u32>> = std::sync::Mutex::new(None);

/// Sets the build info series for the cluster's feature level `cluster_level`; the series of
/// the level before drops to 0.
pub fn set_build_info(cluster_level: u32) {
    let series = |level: u32| {
        metrics::gauge!(
            "tributary_build_info",
            "version" => tributary_types::format::running_release(),
            "feature_level" => tributary_types::format::supported_level().to_string(),
            "cluster_feature_level" => level.to_string()
        )
    };
    let mut current = BUILD_INFO_LEVEL.lock().expect("build info lock");
    if let Some(before) = *current {
        if before == cluster_level {
            return;
        }
        series(before).set(0.0);
    }
    series(cluster_level).set(1.0);
    *current = Some(cluster_level);
}

/// Descriptions of the metrics of the issue "Operations" list not described above, and the
/// build info series.
fn describe_added_metrics() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "tributary_build_info",
        "1 for the node's current labels: version is its release, feature_level the highest cluster feature level it supports, cluster_feature_level the level its cluster runs (a series of an earlier cluster level stays at 0)"
    );
    set_build_info(1);
    describe_gauge!(
        "tributary_amqp_connections",
        "AMQP connections open on this node (both listeners)"
    );
    describe_gauge!(
        "tributary_amqp_links",
        "AMQP links open on this node, by kind (send, receive, cbs, management)"
    );
    describe_counter!(
        "tributary_amqp_transfers_total",
        "AMQP deliveries: published ones handed to the broker (direction in) and events queued for receivers (direction out)"
    );
    describe_counter!(
        "tributary_amqp_errors_total",
        "AMQP errors sent to clients (in a close, end, detach, SASL outcome, rejected delivery or status reply), by condition"
    );
    describe_gauge!(
        "tributary_kafka_connections",
        "Kafka connections open on this node (both listeners)"
    );
    describe_counter!(
        "tributary_kafka_requests_total",
        "Kafka requests answered or refused, by API"
    );
    describe_counter!(
        "tributary_kafka_connections_refused_total",
        "Kafka connections closed for a protocol error (a malformed request, an API or version not served, a refused login)"
    );
    describe_counter!(
        "tributary_blob_requests_total",
        "Blob checkpoint endpoint requests, by operation and outcome (code: ok, or the Azure error code answered)"
    );
    describe_counter!(
        "tributary_bytes_out_total",
        Unit::Bytes,
        "Event body bytes delivered to readers, by hub"
    );
    describe_histogram!(
        "tributary_receive_duration_seconds",
        Unit::Seconds,
        "Time to read one batch of events for a reader and queue it for the client, by hub"
    );
    describe_counter!(
        "tributary_sends_throttled_total",
        "Sends refused with ServerBusy because their hub was over its throughput units, by hub"
    );
    describe_gauge!(
        "tributary_raft_leader",
        "1 when this node leads the partition's Raft group, else 0 (replicas on this node)"
    );
    describe_gauge!(
        "tributary_raft_term",
        "The Raft term this node's replica of the partition is in"
    );
    describe_gauge!(
        "tributary_raft_follower_lag_max_entries",
        "On the partition's leader: log entries the furthest-behind follower lacks; 0 elsewhere"
    );
    describe_counter!(
        "tributary_raft_leadership_changes_total",
        "Times this node was seen to become the partition's leader (sampled every 2 s)"
    );
    describe_gauge!(
        "tributary_partition_last_sequence",
        "Sequence number of the last event this replica has applied (-1: empty)"
    );
    describe_gauge!(
        "tributary_partitions_under_replicated",
        "On the controller leader: partitions with fewer up, caught-up voters than their \
         replication factor; 0 on other nodes, so the sum over nodes is the cluster's count"
    );
    describe_gauge!(
        "tributary_partitions_unavailable",
        "On the controller leader: partitions without a leader that answers; 0 on other nodes"
    );
    describe_gauge!(
        "tributary_nodes_up",
        "On the controller leader: cluster nodes that answer status requests; 0 on other nodes"
    );
    describe_gauge!(
        "tributary_controller_leader",
        "1 when this node leads the controller group, else 0"
    );
    describe_gauge!(
        "tributary_consumer_group_checkpoint_sequence",
        "On controller voters: the sequence number checkpointed by the consumer group"
    );
    describe_gauge!(
        "tributary_replica_moves_in_flight",
        "On the controller leader: replica moves started and not yet finished"
    );
    describe_gauge!(
        "tributary_nodes_dead",
        "On the controller leader: nodes silent past the dead-node timeout"
    );
    describe_counter!(
        "tributary_replica_moves_started_total",
        "On the controller leader: replica moves placement started"
    );
    describe_counter!(
        "tributary_replica_moves_finished_total",
        "On the controller leader: replica moves that completed"
    );
    describe_counter!(
        "tributary_replica_moves_rolled_back_total",
        "On the controller leader: replica moves abandoned because their target went away"
    );
    describe_counter!(
        "tributary_stale_replicas_dropped_total",
        "Replicas deleted from this node because the cluster no longer assigns them here"
    );
    describe_gauge!(
        "tributary_auth_enabled",
        "1 when clients must present SAS tokens (--auth sas), 0 with --auth none"
    );
    describe_counter!(
        "tributary_auth_refused_total",
        "Client requests refused by authorization, by reason"
    );
    describe_gauge!(
        "tributary_peer_insecure",
        "1 when the peer port faces the network with nothing authenticating nodes \
         (--peer-insecure), else 0"
    );
    describe_counter!(
        "tributary_peer_refused_total",
        "Peer-port connections refused before any call was served, by reason (no_key, \
         wrong_key, tls, timeout, busy, handshake_failed)"
    );
    describe_counter!(
        "tributary_tls_connections_refused_total",
        "Connections refused during the TLS handshake, by port"
    );
    describe_counter!(
        "tributary_capture_files_total",
        "Capture files written to the hubs' capture destinations"
    );
    describe_counter!(
        "tributary_capture_events_total",
        "Events written into capture files"
    );
    describe_counter!(
        "tributary_capture_errors_total",
        "Capture attempts that failed (retried); see the node's log"
    );
    describe_gauge!(
        "tributary_raft_groups_asleep",
        "Raft groups led here whose heartbeats are paused while idle"
    );
    describe_gauge!(
        "tributary_storage_segments",
        "Write-ahead log segments kept by the storage shard that last checkpointed"
    );
    describe_histogram!(
        "tributary_storage_checkpoint_seconds",
        Unit::Seconds,
        "Time one storage checkpoint (WAL into the table store) takes"
    );
}

/// The exposition text. `process_cpu_seconds_total` is recorded as a gauge (the metrics
/// crate's counters are integers, which would count whole CPU seconds only) but only ever
/// grows, so it is typed as the counter its name says it is.
fn render(handle: &PrometheusHandle) -> String {
    handle.render().replacen(
        "# TYPE process_cpu_seconds_total gauge",
        "# TYPE process_cpu_seconds_total counter",
        1,
    )
}

fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

pub async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    drain: Arc<RestartDrain>,
    started: Arc<std::sync::atomic::AtomicBool>,
    mut shutdown: watch::Receiver<bool>,
) {
    let handle = metrics_handle();
    // Read the environment now, so an enabled node says so in its log at startup.
    FaultHooks::global();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/drain", post(drain_for_restart))
        .route(
            "/metrics",
            get(move || async move {
                // The standard process_* series (CPU seconds, resident memory, open files,
                // threads), read at each scrape.
                process_collector().collect();
                render(&handle)
            }),
        )
        .route(
            "/debug/faults/crash-after-commit",
            post(|| async { arm_crash_after_commit(FaultHooks::global()) }),
        )
        .route(
            "/debug/faults/refuse-producer-ids",
            post(|Query(query): Query<RefusalsQuery>| async move {
                arm_producer_id_refusals(FaultHooks::global(), &query.count)
            }),
        )
        .with_state(HttpState {
            broker,
            drain,
            started,
        });
    let result = axum::serve(listener, app.into_make_service_with_connect_info::<Ends>())
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(err) = result {
        tracing::error!(%err, "HTTP server failed");
    }
}

async fn readyz(
    State(HttpState {
        broker,
        drain,
        started,
    }): State<HttpState>,
) -> (StatusCode, String) {
    if !started.load(std::sync::atomic::Ordering::Acquire) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not joined to a cluster yet: starting\n".to_string(),
        );
    }
    if drain.is_active() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "draining for a restart: new clients go to other nodes\n".to_string(),
        );
    }
    if broker.runtime().state().cluster_id.is_empty() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not joined to a cluster yet\n".to_string(),
        );
    }
    for partition in broker.local_partitions() {
        // A leader must have re-applied its log before it serves; a follower needs a leader.
        let ready = if partition.is_leader() {
            partition.ensure_caught_up().await.is_ok()
        } else {
            partition.leader().is_some()
        };
        if !ready {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("partition {} has no leader yet\n", partition.group),
            );
        }
    }
    (StatusCode::OK, "ready\n".to_string())
}

/// `POST /drain`: drains the node for a restart (200 when drained, 503 when leaderships
/// were left at the timeout, both with a JSON report). Only from this machine: the port
/// carries no credentials, so a drain must come from someone who can run commands here
/// (in Kubernetes, the pod's own containers share its network namespace).
async fn drain_for_restart(
    State(HttpState { drain, .. }): State<HttpState>,
    ConnectInfo(ends): ConnectInfo<Ends>,
    Query(query): Query<DrainQuery>,
) -> (
    StatusCode,
    [(axum::http::HeaderName, &'static str); 1],
    String,
) {
    let text = [(
        axum::http::header::CONTENT_TYPE,
        "text/plain; charset=utf-8",
    )];
    let json = [(axum::http::header::CONTENT_TYPE, "application/json")];
    if !ends.is_local() {
        return (
            StatusCode::FORBIDDEN,
            text,
            format!(
                "a drain is accepted from this machine only, not from {}; run `tributary \
                 drain` on the node's machine, or `tributary node drain` from anywhere\n",
                ends.peer.ip()
            ),
        );
    }
    let timeout = match query.timeout.as_deref().map(humantime::parse_duration) {
        None => DRAIN_TIMEOUT_DEFAULT,
        Some(Ok(timeout)) if timeout <= DRAIN_TIMEOUT_MAX => timeout,
        Some(Ok(timeout)) => {
            return (
                StatusCode::BAD_REQUEST,
                text,
                format!("timeout {timeout:?} is longer than the most, {DRAIN_TIMEOUT_MAX:?}\n"),
            );
        }
        Some(Err(err)) => {
            return (
                StatusCode::BAD_REQUEST,
                text,
                format!("timeout must be a duration such as 30s or 2m: {err}\n"),
            );
        }
    };
    match drain.drain(timeout).await {
        Ok(report) => {
            let status = if report.drained {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let body = serde_json::to_string(&report).expect("a report serializes");
            (status, json, body + "\n")
        }
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, text, format!("{why}\n")),
    }
}

/// Arms the one-shot crash of the next send that commits here; 404 when hooks are off.
fn arm_crash_after_commit(hooks: &FaultHooks) -> (StatusCode, String) {
    match hooks.arm_crash_after_commit() {
        Ok(()) => (
            StatusCode::OK,
            "armed: the next send that commits on this node aborts the process before its reply\n"
                .to_string(),
        ),
        Err(disabled) => (StatusCode::NOT_FOUND, format!("{disabled}\n")),
    }
}

/// `?count=N` of `POST /debug/faults/refuse-producer-ids`.
#[derive(Debug, serde::Deserialize)]
struct RefusalsQuery {
    #[serde(default)]
    count: String,
}

/// Arms the refusal of the next `count` Kafka producer-id requests here, each a transient
/// failure; 404 when hooks are off.
fn arm_producer_id_refusals(hooks: &FaultHooks, count: &str) -> (StatusCode, String) {
    let Ok(count) = count.trim().parse::<u32>() else {
        return (
            StatusCode::BAD_REQUEST,
            format!(
                "?count= must be how many producer-id requests to refuse (a whole number), not '{}'\n",
                count.trim()
            ),
        );
    };
    match hooks.arm_producer_id_refusals(count) {
        Ok(()) => (
            StatusCode::OK,
            format!(
                "armed: the next {count} Kafka producer-id requests on this node fail transiently\n"
            ),
        ),
        Err(disabled) => (StatusCode::NOT_FOUND, format!("{disabled}\n")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drains_are_accepted_from_this_machine_only() {
        let ends = |peer: &str, local: &str| Ends {
            peer: peer.parse().unwrap(),
            local: Some(local.parse().unwrap()),
        };
        assert!(ends("127.0.0.1:5000", "127.0.0.1:7402").is_local());
        assert!(ends("[::1]:5000", "[::1]:7402").is_local());
        assert!(ends("[::ffff:127.0.0.1]:5000", "[::]:7402").is_local());
        // A node bound to its LAN address, drained from its own machine.
        assert!(ends("10.0.0.11:5000", "10.0.0.11:7402").is_local());
        assert!(ends("[::ffff:10.0.0.11]:5000", "[::ffff:10.0.0.11]:7402").is_local());
        // Another machine, or another pod through a Service.
        assert!(!ends("10.0.0.12:5000", "10.0.0.11:7402").is_local());
        assert!(!ends("172.17.0.1:5000", "0.0.0.0:7402").is_local());
        let unknown_local = Ends {
            peer: "10.0.0.11:5000".parse().unwrap(),
            local: None,
        };
        assert!(!unknown_local.is_local());
    }

    #[test]
    fn cpu_seconds_are_typed_as_a_counter_with_their_fraction() {
        let handle = metrics_handle();
        process_collector().collect();
        let text = render(&handle);
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(!text.contains("process_cpu_seconds_total gauge"), "{text}");
    }

    #[test]
    fn crash_hook_is_armed_only_when_enabled() {
        let (status, body) = arm_crash_after_commit(&FaultHooks::new(false));
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("TRIBUTARY_FAULT_HOOKS=1"), "{body}");
        let (status, _) = arm_crash_after_commit(&FaultHooks::new(true));
        assert_eq!(status, StatusCode::OK);
        let (status, _) = arm_producer_id_refusals(&FaultHooks::new(false), "3");
        assert_eq!(status, StatusCode::NOT_FOUND);
        let (status, body) = arm_producer_id_refusals(&FaultHooks::new(true), "three");
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(body.contains("'three'"), "{body}");
        let (status, _) = arm_producer_id_refusals(&FaultHooks::new(true), "3\n");
        assert_eq!(status, StatusCode::OK);
    }
}
