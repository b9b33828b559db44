//! A bench's own cluster (`bench failover`, `bench retention`): `tributary serve` child
//! processes of this executable on free loopback ports, one data directory and one log file
//! per node. Dropping the cluster kills every node still running.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::metrics;

/// Pause between two readiness probes of a starting node.
const READY_POLL_INTERVAL: Duration = Duration::from_millis(25);
/// How long a killed node may take to be reaped.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Log lines shown when a node fails to start.
const LOG_TAIL_LINES: usize = 20;

/// One node: its id, ports, data directory and, while it runs, its process.
pub(crate) struct Node {
    pub(crate) id: u64,
    client_port: u16,
    http_port: u16,
    peer_port: u16,
    /// The AMQP listener's port: nodes on one machine cannot share the default 5672.
    amqp_port: u16,
    data_dir: PathBuf,
    log_path: PathBuf,
    child: Option<Child>,
}

impl Node {
    /// `http://127.0.0.1:<client port>`, for the SDK.
    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.client_addr())
    }

    /// `127.0.0.1:<client port>`, as the cluster status shows it.
    pub(crate) fn client_addr(&self) -> String {
        format!("127.0.0.1:{}", self.client_port)
    }

    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// `127.0.0.1:<AMQP port>`, the node's AMQP 1.0 listener.
    pub(crate) fn amqp_addr(&self) -> String {
        format!("127.0.0.1:{}", self.amqp_port)
    }

    /// The node's Prometheus page.
    pub(crate) fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}/metrics", self.http_port)
    }

    pub(crate) fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn readyz_url(&self) -> String {
        format!("http://127.0.0.1:{}/readyz", self.http_port)
    }
}

/// The nodes of the bench's cluster, ids 1..=n.
pub(crate) struct LocalCluster {
    /// Which bench runs the cluster, e.g. `bench failover`: the notes it adds to the node
    /// logs start with it.
    label: &'static str,
    executable: PathBuf,
    seeds: String,
    node_args: Vec<String>,
    pub(crate) nodes: Vec<Node>,
}

impl LocalCluster {
    /// Starts `count` nodes of `executable` under `dir` (`node-N/` and `node-N.log`), with
    /// `node_args` added to every `serve`, and waits until each is ready. `label` names the
    /// bench in the notes added to the node logs.
    pub(crate) async fn start(
        label: &'static str,
        executable: &Path,
        dir: &Path,
        count: u32,
        node_args: &[String],
        ready_timeout: Duration,
    ) -> anyhow::Result<LocalCluster> {
        let ports = free_ports(4 * count as usize)?;
        let mut nodes = Vec::with_capacity(count as usize);
        for (id, ports) in (1..=u64::from(count)).zip(ports.chunks_exact(4)) {
            nodes.push(Node {
                id,
                client_port: ports[0],
                http_port: ports[1],
                peer_port: ports[2],
                amqp_port: ports[3],
                data_dir: dir.join(format!("node-{id}")),
                log_path: dir.join(format!("node-{id}.log")),
                child: None,
            });
        }
        let seeds = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut cluster = LocalCluster {
            label,
            executable: executable.to_path_buf(),
            seeds,
            node_args: node_args.to_vec(),
            nodes,
        };
        // Every node must run before any is ready: the cluster forms once all have met.
        for index in 0..cluster.nodes.len() {
            cluster.spawn(index)?;
        }
        for index in 0..cluster.nodes.len() {
            cluster.wait_ready(index, ready_timeout).await?;
        }
        Ok(cluster)
    }

    /// SIGKILL: the node dies at once, as in a crash. Returns when the signal was sent.
    pub(crate) fn kill(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &mut self.nodes[index];
        let Some(child) = node.child.as_mut() else {
            bail!("node {} is not running", node.id);
        };
        note(&node.log_path, &format!("{}: sending SIGKILL", self.label));
        child
            .start_kill()
            .with_context(|| format!("cannot kill node {}", node.id))
    }

    /// Waits until a killed node's process is gone, so its ports and files are free.
    pub(crate) async fn reap(&mut self, index: usize) -> anyhow::Result<ExitStatus> {
        let node = &mut self.nodes[index];
        let Some(mut child) = node.child.take() else {
            bail!("node {} is not running", node.id);
        };
        match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
            Ok(status) => status.with_context(|| format!("cannot wait for node {}", node.id)),
            Err(_elapsed) => bail!(
                "node {} still ran {EXIT_TIMEOUT:?} after SIGKILL (pid {:?})",
                node.id,
                child.id()
            ),
        }
    }

    /// Starts a stopped node again on its data directory and ports, and waits until it is
    /// ready.
    pub(crate) async fn restart(
        &mut self,
        index: usize,
        ready_timeout: Duration,
    ) -> anyhow::Result<()> {
        self.spawn(index)?;
        self.wait_ready(index, ready_timeout).await
    }

    /// Fails, with the end of its log, if a node the cluster started has exited.
    pub(crate) fn check_running(&mut self) -> anyhow::Result<()> {
        for node in &mut self.nodes {
            let Some(child) = node.child.as_mut() else {
                continue;
            };
            if let Some(status) = child.try_wait().context("cannot poll a node process")? {
                node.child = None;
                bail!(
                    "node {} exited ({status}); its log {} ends with:\n{}",
                    node.id,
                    node.log_path.display(),
                    log_tail(&node.log_path)
                );
            }
        }
        Ok(())
    }

    /// Kills every node still running and waits for them to exit.
    pub(crate) async fn stop(&mut self) {
        for index in 0..self.nodes.len() {
            if self.nodes[index].child.is_some() {
                let _ = self.kill(index);
                if let Err(error) = self.reap(index).await {
                    eprintln!("warning: {error:#}");
                }
            }
        }
    }

    fn spawn(&mut self, index: usize) -> anyhow::Result<()> {
        let node = &self.nodes[index];
        assert!(node.child.is_none(), "node {} already runs", node.id);
        std::fs::create_dir_all(&node.data_dir)
            .with_context(|| format!("cannot create {}", node.data_dir.display()))?;
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log_path)
            .with_context(|| format!("cannot open the node log {}", node.log_path.display()))?;
        let mut command = Command::new(&self.executable);
        command
            .arg("serve")
            .arg("--node-id")
            .arg(node.id.to_string())
            .arg("--data-dir")
            .arg(&node.data_dir)
            .arg("--client-addr")
            .arg(node.client_addr())
            .arg("--peer-addr")
            .arg(format!("127.0.0.1:{}", node.peer_port))
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", node.http_port))
            .arg("--seeds")
            .arg(&self.seeds)
            .arg("--bootstrap-expect")
            .arg(self.nodes.len().to_string())
            .args(&self.node_args);
        // Nodes run with the settings given here, not with the bench's environment.
        for (name, _) in std::env::vars_os() {
            let text = name.to_string_lossy();
            if text.starts_with("TRIBUTARY_") && text != "TRIBUTARY_LOG" {
                command.env_remove(&name);
            }
        }
        // The bench's clients carry no credentials: authorization is off unless its node
        // flags say `--auth sas`.
        command.env("TRIBUTARY_AUTH", "none");
        // Each node its own AMQP port (node flags may still set `--amqp-addr`). Given
        // through the environment, which a node without an AMQP listener ignores.
        command.env("TRIBUTARY_AMQP_ADDR", node.amqp_addr());
        // No Blob checkpoint endpoint or Kafka listener: the bench does not use them, and
        // nodes on one machine cannot share their default ports.
        command.env("TRIBUTARY_BLOB_ADDR", "none");
        command.env("TRIBUTARY_KAFKA_ADDR", "none");
        let described = format!("{:?}", command.as_std());
        writeln!(log, "=== {}: starting {described}", self.label)
            .with_context(|| format!("cannot write {}", node.log_path.display()))?;
        let stdout = log.try_clone().context("cannot share the node log")?;
        command
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(log)
            .kill_on_drop(true);
        let child = command
            .spawn()
            .with_context(|| format!("cannot start {described}"))?;
        note(
            &node.log_path,
            &format!("{}: started pid {}", self.label, child.id().unwrap_or(0)),
        );
        self.nodes[index].child = Some(child);
        Ok(())
    }

    async fn wait_ready(&mut self, index: usize, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let url = self.nodes[index].readyz_url();
        loop {
            let node = &mut self.nodes[index];
            let child = node.child.as_mut().expect("a started node");
            if let Some(status) = child.try_wait().context("cannot poll a node process")? {
                node.child = None;
                bail!(
                    "node {} exited before it was ready ({status}); its log {} ends with:\n{}",
                    node.id,
                    node.log_path.display(),
                    log_tail(&node.log_path)
                );
            }
            if metrics::http_get(&url).await.is_ok() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "node {} was not ready ({url}) within {}; see its log {}",
                    node.id,
                    humantime::format_duration(timeout),
                    node.log_path.display()
                );
            }
            tokio::time::sleep(READY_POLL_INTERVAL).await;
        }
    }
}

/// Creates a run's directory under `base` (the system's temporary directory without one),
/// named `tributary-bench-<name>-…`, and says where it is.
pub(crate) fn new_run_dir(base: Option<&Path>, name: &str) -> anyhow::Result<tempfile::TempDir> {
    let base = base.map_or_else(std::env::temp_dir, Path::to_path_buf);
    std::fs::create_dir_all(&base)
        .with_context(|| format!("cannot create the data directory {}", base.display()))?;
    let run_dir = tempfile::Builder::new()
        .prefix(&format!("tributary-bench-{name}-"))
        .tempdir_in(&base)
        .with_context(|| format!("cannot create a directory in {}", base.display()))?;
    eprintln!(
        "nodes' data directories and logs: {}",
        run_dir.path().display()
    );
    Ok(run_dir)
}

/// Ends a run: keeps its directory (if `keep`) or removes it, and prints its report on
/// stdout (`render(report, json)`); a failed run's error says where the node logs are.
pub(crate) fn finish_run<R>(
    outcome: anyhow::Result<R>,
    run_dir: tempfile::TempDir,
    keep: bool,
    name: &str,
    json: bool,
    render: impl Fn(&R, bool) -> String,
) -> anyhow::Result<R> {
    let run_dir = keep_or_remove(run_dir, keep);
    let report = outcome.with_context(|| match &run_dir {
        Some(dir) => format!(
            "the {name} bench failed; node logs are in {}",
            dir.display()
        ),
        None => format!("the {name} bench failed"),
    })?;
    let text = render(&report, json);
    if json {
        println!("{text}");
    } else {
        print!("{text}");
    }
    if let Some(dir) = run_dir {
        eprintln!(
            "kept the nodes' data directories and logs in {}",
            dir.display()
        );
    }
    Ok(report)
}

/// Keeps the run's directory (returning its path) or removes it.
pub(crate) fn keep_or_remove(dir: tempfile::TempDir, keep: bool) -> Option<PathBuf> {
    if keep {
        return Some(dir.keep());
    }
    let path = dir.path().to_path_buf();
    if let Err(error) = dir.close() {
        eprintln!(
            "warning: cannot remove {}: {error}; remove it by hand",
            path.display()
        );
    }
    None
}

/// Resolves on SIGINT, SIGTERM or SIGHUP with the signal's name.
pub(crate) async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = int.recv() => "SIGINT",
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    }
}

/// `count` distinct ports on 127.0.0.1 that were free a moment ago (all are held until all
/// are found, so none is handed out twice).
fn free_ports(count: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..count)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("cannot find free ports on 127.0.0.1")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// Appends `=== <text> at <UTC time>` to a node's log, so the bench's actions line up with
/// the node's own timestamped lines.
fn note(log_path: &Path, text: &str) {
    if let Ok(mut log) = OpenOptions::new().append(true).open(log_path) {
        let now = humantime::format_rfc3339_micros(std::time::SystemTime::now());
        let _ = writeln!(log, "=== {text} at {now}");
    }
}

fn log_tail(log_path: &Path) -> String {
    let text = std::fs::read(log_path).unwrap_or_default();
    let text = String::from_utf8_lossy(&text);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}
