//! Draining a node for a restart: `tributary drain`, run on the node's own machine (a
//! Kubernetes preStop hook, systemd's `ExecStop`), asks the node through `POST /drain` on its
//! HTTP port to hand every partition leadership it holds, and the controller's, to other
//! replicas, and to report itself not ready so load balancers send new clients elsewhere.
//! The command returns once the node leads nothing another replica could take (or its
//! timeout passed); the supervisor's SIGTERM then stops a node whose clients already moved.
//!
//! Unlike `tributary node drain N`, which an operator ends with `node undrain N`, this drain
//! ends by itself: the node writes [`MARKER`] into its data directory before draining, and at
//! its next start it undrains itself and removes the file. A node an operator had drained
//! before stays drained across the restart (no marker is written for it).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use tributary_broker::Broker;
use tributary_broker::partition::Partition;
use tributary_controller::state::ClusterState;

/// The file in the data directory that says the node drained itself for a restart.
pub const MARKER: &str = "drained-for-restart";

/// How often a drain looks at its leaderships while they move.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// How long a drain waits for the controller to record it, at most.
const PROPOSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause between attempts to end a drain after a restart (the controller may be electing).
const UNDRAIN_RETRY: Duration = Duration::from_secs(1);

/// What a drain achieved: the JSON body of `POST /drain`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainReport {
    pub node_id: u64,
    /// The node leads no partition that another replica could lead, nor the controller
    /// (unless no other controller voter could take it).
    pub drained: bool,
    /// Partitions this node still leads.
    pub leaders: usize,
    /// Partitions it still leads that another replica could lead (0 when drained).
    pub leaders_movable: usize,
    pub controller_leader: bool,
    /// The node undrains itself when it next starts; false when an operator drained it
    /// (`tributary node drain`): it then stays drained until `tributary node undrain`.
    pub ends_at_restart: bool,
    pub waited_ms: u64,
}

pub struct RestartDrain {
    broker: Arc<Broker>,
    marker: PathBuf,
    /// Set by the first drain: `/readyz` answers 503 from then on.
    active: AtomicBool,
    /// One drain at a time; a second request waits and then reports.
    running: tokio::sync::Mutex<()>,
}

impl RestartDrain {
    pub fn new(broker: Arc<Broker>, data_dir: &Path) -> Arc<Self> {
        Arc::new(Self {
            broker,
            marker: data_dir.join(MARKER),
            active: AtomicBool::new(false),
            running: tokio::sync::Mutex::new(()),
        })
    }

    /// Whether the node is draining for a restart (it is then not ready for new clients):
    /// a drain was asked for and `tributary node undrain` has not ended it since.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Relaxed)
            && self
                .broker
                .runtime()
                .my_record()
                .is_some_and(|n| n.draining)
    }

    /// Drains the node: records it as draining with the controller (and the marker that
    /// ends the drain at the next start), then waits up to `timeout` for its leaderships to
    /// move. Fails only when the drain could not be recorded.
    pub async fn drain(&self, timeout: Duration) -> Result<DrainReport, String> {
        let _one = self.running.lock().await;
        let started = Instant::now();
        self.active.store(true, Ordering::Relaxed);
        let me = self.broker.runtime().me.id;
        let record = self
            .broker
            .runtime()
            .my_record()
            .ok_or("this node has not joined the cluster yet: there is nothing to drain")?;
        if !record.draining {
            // The marker first: a crash between the two leaves a marker whose undrain is a
            // no-op, never a node drained for good by accident.
            write_marker(&self.marker).map_err(|e| {
                format!(
                    "cannot write {}: {e}; the node was not drained",
                    self.marker.display()
                )
            })?;
            tracing::info!("draining for a restart: handing leadership to other replicas");
            match tokio::time::timeout(PROPOSE_TIMEOUT, self.broker.set_draining(me, true)).await {
                Ok(Ok(())) => {}
                Ok(Err(err)) => {
                    return Err(format!(
                        "the controller did not record the drain: {err}; leaders stay here"
                    ));
                }
                Err(_) => {
                    return Err(format!(
                        "the controller did not record the drain within {PROPOSE_TIMEOUT:?} \
                         (has it lost its quorum?); leaders stay here"
                    ));
                }
            }
        }
        let ends_at_restart = self.marker.exists();
        let deadline = started + timeout;
        loop {
            let state = self.broker.runtime().state();
            let leading: Vec<Arc<Partition>> = self
                .broker
                .local_partitions()
                .into_iter()
                .filter(|p| p.is_leader())
                .collect();
            let movable = leading
                .iter()
                .filter(|p| has_successor(&state, p, me))
                .count();
            // The controller goes last: the partitions' moves went through it.
            let mut controller_leader = self.broker.runtime().is_controller_leader();
            if movable == 0 && controller_leader {
                match self.broker.runtime().hand_over_controller().await {
                    Ok(Some(to)) => tracing::info!(to, "handing controller leadership over"),
                    Ok(None) => {}
                    Err(err) => tracing::warn!(%err, "controller leadership transfer failed"),
                }
                controller_leader = self.broker.runtime().is_controller_leader();
            }
            let controller_stuck = controller_leader && !controller_successor(&state, me);
            let drained = movable == 0 && (!controller_leader || controller_stuck);
            if drained || Instant::now() >= deadline {
                let report = DrainReport {
                    node_id: me,
                    drained,
                    leaders: leading.len(),
                    leaders_movable: movable,
                    controller_leader,
                    ends_at_restart,
                    waited_ms: started.elapsed().as_millis() as u64,
                };
                tracing::info!(?report, "drain for a restart done");
                return Ok(report);
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
    }

    /// At start: ends a drain made for the restart that just happened (see [`MARKER`]).
    /// Retries until the controller records it; the marker goes only then.
    pub async fn end_after_restart(self: Arc<Self>) {
        if !self.marker.exists() {
            return;
        }
        let (me, data_id) = (
            self.broker.runtime().me.id,
            self.broker.runtime().me.data_id,
        );
        // Once the controller has registered this start of the node.
        let mut view = self.broker.runtime().view();
        let _ = view
            .wait_for(|s| s.nodes.get(&me).is_some_and(|n| n.data_id == data_id))
            .await;
        loop {
            let still_drained = self
                .broker
                .runtime()
                .my_record()
                .is_some_and(|n| n.draining);
            if !still_drained {
                break;
            }
            match self.broker.set_draining(me, false).await {
                Ok(()) => {
                    tracing::info!("the drain for the restart has ended: leaders may return");
                    break;
                }
                Err(err) => {
                    tracing::warn!(%err, "ending the drain for the restart failed; will retry");
                    tokio::time::sleep(UNDRAIN_RETRY).await;
                }
            }
        }
        if let Err(err) = std::fs::remove_file(&self.marker) {
            tracing::warn!(%err, path = %self.marker.display(), "cannot remove the drain marker");
        }
    }
}

/// Whether a partition this node leads has another replica that may lead it.
fn has_successor(state: &ClusterState, partition: &Partition, me: u64) -> bool {
    let Some(hub) = state.hubs.values().find(|h| h.id == partition.group.hub) else {
        return false;
    };
    hub.replicas
        .get(usize::from(partition.group.partition.0))
        .is_some_and(|replicas| {
            replicas
                .iter()
                .any(|r| *r != me && state.nodes.get(r).is_some_and(|n| !n.draining))
        })
}

/// Whether another controller voter may lead the controller.
fn controller_successor(state: &ClusterState, me: u64) -> bool {
    state
        .controller_voters
        .iter()
        .any(|v| *v != me && state.nodes.get(v).is_some_and(|n| !n.draining))
}

fn write_marker(path: &Path) -> std::io::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::File::create(path)?;
    file.write_all(
        b"This node drained itself for a restart (tributary drain); it undrains itself when it \
          starts and removes this file.\n",
    )?;
    file.sync_all()?;
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

/// `tributary drain`: drains the node on this machine for a restart.
#[derive(Debug, Clone, clap::Args)]
pub struct DrainArgs {
    /// The node's HTTP address. An unspecified IP (0.0.0.0, ::) means this machine's
    /// loopback, which is where the node accepts a drain from.
    #[arg(long, env = "TRIBUTARY_HTTP_ADDR", default_value = "127.0.0.1:7402")]
    pub http_addr: std::net::SocketAddr,
    /// How long to wait for the node's leaderships to move (e.g. 30s, 2m); keep it within
    /// the supervisor's grace period (Kubernetes' terminationGracePeriodSeconds).
    #[arg(long, default_value = "30s")]
    pub timeout: humantime::Duration,
}

/// How much longer than the drain's timeout the command waits for the node's answer.
const ANSWER_MARGIN: Duration = Duration::from_secs(15);

/// Runs `tributary drain`: fails (non-zero exit) when the node could not be drained fully.
pub async fn run_command(args: DrainArgs, json: bool) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use http_body_util::BodyExt as _;

    let mut addr = args.http_addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let timeout: Duration = args.timeout.into();
    let request = async {
        let stream = tokio::net::TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot reach the node's HTTP port at {addr}: is it running there (--http-addr)?"))?;
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
        tokio::spawn(connection);
        let request = hyper::Request::post(format!("/drain?timeout={}", args.timeout))
            .header(hyper::header::HOST, addr.to_string())
            .body(http_body_util::Empty::<bytes::Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status();
        let body = response.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    let (status, body) = tokio::time::timeout(timeout + ANSWER_MARGIN, request)
        .await
        .with_context(|| {
            format!(
                "the node at {addr} did not answer within {:?}",
                timeout + ANSWER_MARGIN
            )
        })??;
    let Ok(report) = serde_json::from_str::<DrainReport>(&body) else {
        anyhow::bail!("the node refused the drain ({status}): {}", body.trim_end());
    };
    if json {
        println!("{}", body.trim_end());
    } else if report.drained {
        println!(
            "node {} is drained: it leads no partition another replica could lead{} ({} ms){}",
            report.node_id,
            if report.controller_leader {
                " (it still leads the controller: no other voter could)"
            } else {
                ""
            },
            report.waited_ms,
            if report.ends_at_restart {
                "; it undrains itself when it next starts"
            } else {
                "; it was drained by an operator and stays drained until `tributary node undrain`"
            },
        );
    }
    if !report.drained {
        anyhow::bail!(
            "node {} still leads {} partitions that other replicas could lead{} after {}; \
             stopping it now makes them elect new leaders",
            report.node_id,
            report.leaders_movable,
            if report.controller_leader {
                ", and the controller"
            } else {
                ""
            },
            args.timeout
        );
    }
    Ok(())
}
