//! The HTTP port: `/healthz` (process alive), `/readyz` (every local partition led),
//! `/metrics` (Prometheus text), and for testing only, with `TRIBUTARY_FAULT_HOOKS=1`,
//! `POST /debug/faults/crash-after-commit` (see `fault.rs`).

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::{get, post};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::broker::Broker;
use crate::fault::FaultHooks;

/// The process-wide metrics recorder, installed once.
pub fn metrics_handle() -> PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .install_recorder()
                .expect("the metrics recorder is installed once");
            metrics::describe_counter!(
                "tributary_storage_fsyncs_total",
                "Durable storage commits (each one fsync), across all shards"
            );
            metrics::describe_histogram!(
                "tributary_storage_commit_batch_writes",
                "Writes merged into one storage transaction (group commit)"
            );
            metrics::describe_histogram!(
                "tributary_storage_commit_seconds",
                metrics::Unit::Seconds,
                "Time one storage transaction takes to commit (with its fsync when durable)"
            );
            metrics::describe_counter!("tributary_events_in_total", "Events accepted by sends");
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
            metrics::describe_counter!("tributary_bytes_in_total", "Bytes accepted by sends");
            metrics::describe_counter!("tributary_events_out_total", "Events delivered to readers");
            metrics::describe_counter!(
                "tributary_raft_snapshots_installed_total",
                "Partition replicas rebuilt from a snapshot sent by their leader"
            );
            metrics::describe_counter!(
                "tributary_peer_snapshot_chunks_received_total",
                "Snapshot pieces received from leaders"
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
                "Time from a send's arrival to its commit"
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

fn process_collector() -> &'static metrics_process::Collector {
    static COLLECTOR: OnceLock<metrics_process::Collector> = OnceLock::new();
    COLLECTOR.get_or_init(metrics_process::Collector::default)
}

pub async fn serve(
    listener: TcpListener,
    broker: Arc<Broker>,
    mut shutdown: watch::Receiver<bool>,
) {
    let handle = metrics_handle();
    // Read the environment now, so an enabled node says so in its log at startup.
    FaultHooks::global();
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route(
            "/metrics",
            get(move || async move {
                // The standard process_* series (CPU seconds, resident memory, open files,
                // threads), read at each scrape.
                process_collector().collect();
                handle.render()
            }),
        )
        .route(
            "/debug/faults/crash-after-commit",
            post(|| async { arm_crash_after_commit(FaultHooks::global()) }),
        )
        .with_state(broker);
    let result = axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = shutdown.wait_for(|stop| *stop).await;
        })
        .await;
    if let Err(err) = result {
        tracing::error!(%err, "HTTP server failed");
    }
}

async fn readyz(State(broker): State<Arc<Broker>>) -> (StatusCode, String) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_hook_is_armed_only_when_enabled() {
        let (status, body) = arm_crash_after_commit(&FaultHooks::new(false));
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert!(body.contains("TRIBUTARY_FAULT_HOOKS=1"), "{body}");
        let (status, _) = arm_crash_after_commit(&FaultHooks::new(true));
        assert_eq!(status, StatusCode::OK);
    }
}
