//! Nodes as containers on a private Docker network, for the faults only separately
//! addressed hosts show: network partitions (packet filters in each container's network
//! namespace), slow links, frozen and killed processes, full disks and wiped disks.
//!
//! The image is built by `scripts/docker-image` (`FROM scratch` around a statically linked
//! binary). Each node's data directory is a host directory bind-mounted at `/data`, so it
//! survives the container being killed and started again; with a data size limit it is a
//! size-limited tmpfs mounted on the host, which the disk nemesis fills up. Packet filters
//! and traffic shaping are set from the host with `nsenter` into the container's network
//! namespace (`iptables`, `tc`), so the image needs no tools of its own.
//!
//! The nodes bind their peer ports on the network, so they share a cluster key, as a real
//! deployment's would: one per run, made by the image's own `tributary cert cluster-key`
//! into the run directory and mounted read-only into every node (`--cluster-key-file`).

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::process::Command;

use crate::eventually::poll_until;
use crate::http::http_get;
use crate::require::{Verdict, verdict};

/// The image the nemesis suite runs, unless told otherwise.
pub const IMAGE_DEFAULT: &str = "tributary:test";
/// The deliberately broken image (`scripts/docker-image --broken`).
pub const BROKEN_IMAGE_DEFAULT: &str = "tributary:broken";
/// The numeric user the image runs as; data directories are handed to it.
const NODE_UID: u32 = 65532;
pub const CLIENT_PORT: u16 = 7400;
pub const PEER_PORT: u16 = 7401;
pub const HTTP_PORT: u16 = 7402;
/// How long `docker stop` waits after SIGTERM before it kills.
const STOP_TIMEOUT_S: u32 = 30;
/// Subnets tried before giving up (another run or network may hold one).
const SUBNET_ATTEMPTS_MAX: u32 = 32;
/// How long one `docker` or `nsenter` command may take.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(120);
/// The exit code of a node that stopped because its storage failed (the node's
/// `StorageFailed::EXIT_CODE`, EX_IOERR).
pub const STORAGE_FAILED_EXIT_CODE: i64 = 74;
/// The file the disk nemesis writes to fill a node's disk.
const BALLAST_FILE: &str = "nemesis-ballast";
/// The run directory's folder holding the cluster key, and where nodes see it.
const CLUSTER_KEY_DIR: &str = "cluster-key";
const CLUSTER_KEY_MOUNT: &str = "/etc/tributary/cluster-key";
const CLUSTER_KEY_FILE: &str = "cluster.key";

/// Whether containers can be used here, as a [`Verdict`] (see [`crate::require_tool`]): the
/// engine answers and the host tools for faults (`nsenter`, `iptables`, `tc`) are installed.
/// Whatever is missing skips, unless `require_env` (e.g. `"CI=true"`) says it is required.
pub async fn can_run(require_env: &str) -> Verdict {
    let missing = match run("docker", &["info", "--format", "{{.ServerVersion}}"]).await {
        Err(err) => Some((
            format!("a Docker engine that answers (`docker info`: {err:#})"),
            "install and start Docker",
        )),
        Ok(_) => {
            let mut missing = None;
            for tool in ["nsenter", "iptables", "tc"] {
                if run("sh", &["-c", &format!("command -v {tool}")])
                    .await
                    .is_err()
                {
                    missing = Some((format!("`{tool}`"), "scripts/nemesis installs it"));
                    break;
                }
            }
            missing
        }
    };
    match missing {
        Some((what, how_to_get)) => verdict(&what, false, how_to_get, require_env),
        None => Verdict::Run,
    }
}

/// Whether `image` exists in the local engine.
pub async fn image_exists(image: &str) -> bool {
    run(
        "docker",
        &["image", "inspect", "--format", "{{.Id}}", image],
    )
    .await
    .is_ok()
}

/// Runs a command, returning its trimmed stdout; an error carries its stderr.
pub async fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = tokio::time::timeout(
        COMMAND_TIMEOUT,
        Command::new(program).args(args).kill_on_drop(true).output(),
    )
    .await
    .with_context(|| format!("`{program} {}` timed out", args.join(" ")))?
    .with_context(|| format!("cannot run `{program}`"))?;
    if !output.status.success() {
        bail!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// Runs `docker` with `args`, returning its trimmed stdout; an error carries its stderr.
pub async fn docker(args: &[&str]) -> anyhow::Result<String> {
    run("docker", args).await
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ContainerClusterSpec {
    pub image: String,
    pub nodes: usize,
    /// Where data directories and logs go.
    pub run_dir: PathBuf,
    /// Each node's data directory is a tmpfs of this size (for the disk nemesis); `None`: a
    /// plain directory.
    pub data_limit_bytes: Option<u64>,
    /// More `serve` flags for every node.
    pub extra_args: Vec<String>,
}

/// What the harness has done to a node's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    Running,
    Paused,
    Stopped,
}

struct ContainerNode {
    id: u64,
    container: String,
    ip: Ipv4Addr,
    data_dir: PathBuf,
    state: NodeState,
    /// Traffic shaping (a `tc` qdisc with its arguments) set on the node, re-applied after a
    /// restart.
    netem: Option<String>,
}

/// Nodes `1..=n` in containers on a network of their own. Dropping it removes the
/// containers and the network (the run directory stays).
pub struct ContainerCluster {
    name: String,
    network: String,
    spec: ContainerClusterSpec,
    nodes: Vec<ContainerNode>,
    /// Dropped traffic: (from node index, to node index).
    cuts: BTreeSet<(usize, usize)>,
    tmpfs_mounted: bool,
    /// The host directory holding the cluster key, mounted read-only into every node.
    key_dir: PathBuf,
}

impl ContainerCluster {
    /// Creates the network, starts every node and waits until each answers `/readyz`.
    pub async fn start(spec: ContainerClusterSpec) -> anyhow::Result<ContainerCluster> {
        anyhow::ensure!(
            image_exists(&spec.image).await,
            "image {} not found: build it with scripts/docker-image",
            spec.image
        );
        let name = format!("trib-{:08x}", rand::random::<u32>());
        let network = format!("{name}-net");
        let key_dir = spec.run_dir.join(CLUSTER_KEY_DIR);
        make_cluster_key(&spec.image, &key_dir).await?;
        let subnet = create_network(&network).await?;
        let mut cluster = ContainerCluster {
            name: name.clone(),
            network,
            nodes: Vec::new(),
            spec,
            cuts: BTreeSet::new(),
            tmpfs_mounted: false,
            key_dir,
        };
        for i in 0..cluster.spec.nodes {
            let data_dir = cluster.spec.run_dir.join(format!("node-{}", i + 1));
            std::fs::create_dir_all(&data_dir)
                .with_context(|| format!("cannot create {}", data_dir.display()))?;
            cluster.nodes.push(ContainerNode {
                id: i as u64 + 1,
                container: format!("{name}-n{}", i + 1),
                ip: Ipv4Addr::new(subnet[0], subnet[1], subnet[2], 10 + i as u8),
                data_dir,
                state: NodeState::Stopped,
                netem: None,
            });
        }
        if let Some(limit) = cluster.spec.data_limit_bytes {
            for node in &cluster.nodes {
                let size = format!("size={limit}");
                let target = node.data_dir.to_string_lossy().into_owned();
                run("mount", &["-t", "tmpfs", "-o", &size, "tmpfs", &target]).await?;
            }
            cluster.tmpfs_mounted = true;
        }
        for node in &cluster.nodes {
            give_to_node_user(&node.data_dir)?;
        }
        for i in 0..cluster.nodes.len() {
            cluster.create_container(i).await?;
        }
        for i in 0..cluster.nodes.len() {
            cluster.wait_ready(i, Duration::from_secs(120)).await?;
        }
        Ok(cluster)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The node id of node index `i`.
    pub fn node_id(&self, i: usize) -> u64 {
        self.nodes[i].id
    }

    /// The index of node `id`.
    pub fn index_of(&self, id: u64) -> Option<usize> {
        self.nodes.iter().position(|n| n.id == id)
    }

    pub fn state(&self, i: usize) -> NodeState {
        self.nodes[i].state
    }

    /// `http://<ip>:7400`.
    pub fn endpoint(&self, i: usize) -> String {
        format!("http://{}:{CLIENT_PORT}", self.nodes[i].ip)
    }

    pub fn endpoints(&self) -> Vec<String> {
        (0..self.nodes.len()).map(|i| self.endpoint(i)).collect()
    }

    pub fn http_addr(&self, i: usize) -> SocketAddr {
        SocketAddr::from((self.nodes[i].ip, HTTP_PORT))
    }

    fn seeds(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("{}:{PEER_PORT}", n.ip))
            .collect::<Vec<_>>()
            .join(",")
    }

    async fn create_container(&mut self, i: usize) -> anyhow::Result<()> {
        let node = &self.nodes[i];
        let volume = format!("{}:/data", node.data_dir.display());
        let key_volume = format!("{}:{CLUSTER_KEY_MOUNT}:ro", self.key_dir.display());
        let key_file = format!("{CLUSTER_KEY_MOUNT}/{CLUSTER_KEY_FILE}");
        let ip = node.ip.to_string();
        let mut args: Vec<String> = [
            "run",
            "--detach",
            "--name",
            &node.container,
            "--hostname",
            &format!("node-{}", node.id),
            "--network",
            &self.network,
            "--ip",
            &ip,
            "--volume",
            &volume,
            "--volume",
            &key_volume,
            "--stop-timeout",
            &STOP_TIMEOUT_S.to_string(),
            &self.spec.image,
            "serve",
            "--auth",
            "none",
            "--node-id",
            &node.id.to_string(),
            "--data-dir",
            "/data",
            "--client-addr",
            &format!("{ip}:{CLIENT_PORT}"),
            "--peer-addr",
            &format!("{ip}:{PEER_PORT}"),
            "--http-addr",
            &format!("{ip}:{HTTP_PORT}"),
            "--seeds",
            &self.seeds(),
            "--bootstrap-expect",
            &self.nodes.len().to_string(),
            "--cluster-key-file",
            &key_file,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect();
        args.extend(self.spec.extra_args.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        docker(&args).await?;
        self.nodes[i].state = NodeState::Running;
        Ok(())
    }

    /// Waits until node `i` answers `/readyz` with 200, or fails (showing its log) when its
    /// container exits or `timeout` passes.
    pub async fn wait_ready(&self, i: usize, timeout: Duration) -> anyhow::Result<()> {
        let running = poll_until(timeout, async || {
            if matches!(http_get(self.http_addr(i), "/readyz").await, Ok(r) if r.status == 200) {
                return Ok(true);
            }
            if !self.is_running(i).await {
                return Ok(false);
            }
            Err(())
        })
        .await;
        match running {
            Ok(true) => Ok(()),
            Ok(false) => bail!(
                "node {} exited before it was ready; its log ends with:\n{}",
                self.nodes[i].id,
                self.log_tail(i, 30).await
            ),
            Err(_) => bail!(
                "node {} not ready after {timeout:?}; its log ends with:\n{}",
                self.nodes[i].id,
                self.log_tail(i, 30).await
            ),
        }
    }

    /// Whether node `i`'s container runs (a paused one runs).
    pub async fn is_running(&self, i: usize) -> bool {
        docker(&[
            "inspect",
            "--format",
            "{{.State.Running}}",
            &self.nodes[i].container,
        ])
        .await
        .is_ok_and(|s| s == "true")
    }

    /// Nodes whose container exited although the harness did not stop it, with how.
    pub async fn crashed(&self) -> Vec<(u64, String)> {
        let mut crashed = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            if node.state != NodeState::Stopped && !self.is_running(i).await {
                let status = docker(&[
                    "inspect",
                    "--format",
                    "exit code {{.State.ExitCode}}, OOM killed {{.State.OOMKilled}}",
                    &node.container,
                ])
                .await
                .unwrap_or_else(|e| e.to_string());
                crashed.push((node.id, status));
            }
        }
        crashed
    }

    /// The exit code of node `i`'s container, once it has exited.
    pub async fn exit_code(&self, i: usize) -> Option<i64> {
        if self.is_running(i).await {
            return None;
        }
        docker(&[
            "inspect",
            "--format",
            "{{.State.ExitCode}}",
            &self.nodes[i].container,
        ])
        .await
        .ok()?
        .parse()
        .ok()
    }

    /// SIGKILL: the node dies at once.
    pub async fn kill(&mut self, i: usize) -> anyhow::Result<()> {
        self.note(i, "SIGKILL");
        if self.nodes[i].state == NodeState::Paused {
            // A frozen process dies of SIGKILL too; continuing it first keeps Docker's view
            // of the container simple.
            let _ = docker(&["kill", "--signal", "SIGCONT", &self.nodes[i].container]).await;
        }
        let result = docker(&["kill", "--signal", "SIGKILL", &self.nodes[i].container]).await;
        self.nodes[i].state = NodeState::Stopped;
        match result {
            Ok(_) => Ok(()),
            // Already exited by itself.
            Err(_) if !self.is_running(i).await => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// SIGTERM, then waits for the node to shut down (SIGKILL after 30 s).
    pub async fn stop(&mut self, i: usize) -> anyhow::Result<()> {
        self.note(i, "SIGTERM (docker stop)");
        docker(&[
            "stop",
            "--time",
            &STOP_TIMEOUT_S.to_string(),
            &self.nodes[i].container,
        ])
        .await?;
        self.nodes[i].state = NodeState::Stopped;
        Ok(())
    }

    /// Starts a stopped node's container again (same address, same data directory) and
    /// re-applies its packet filters and traffic shaping; does not wait for readiness.
    pub async fn start_node(&mut self, i: usize) -> anyhow::Result<()> {
        self.note(i, "start");
        docker(&["start", &self.nodes[i].container]).await?;
        self.nodes[i].state = NodeState::Running;
        self.apply_filters(i).await?;
        if let Some(netem) = self.nodes[i].netem.clone() {
            self.apply_netem(i, &netem).await?;
        }
        Ok(())
    }

    /// SIGSTOP: the process freezes (sockets stay open, nothing answers).
    pub async fn pause(&mut self, i: usize) -> anyhow::Result<()> {
        self.note(i, "SIGSTOP");
        docker(&["kill", "--signal", "SIGSTOP", &self.nodes[i].container]).await?;
        self.nodes[i].state = NodeState::Paused;
        Ok(())
    }

    /// SIGCONT: a paused node runs again.
    pub async fn resume(&mut self, i: usize) -> anyhow::Result<()> {
        self.note(i, "SIGCONT");
        docker(&["kill", "--signal", "SIGCONT", &self.nodes[i].container]).await?;
        self.nodes[i].state = NodeState::Running;
        Ok(())
    }

    /// Kills node `i` and empties its data directory, as a replacement disk would be; the
    /// next [`ContainerCluster::start_node`] starts it empty.
    pub async fn wipe(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].state != NodeState::Stopped {
            self.kill(i).await?;
        }
        self.note(i, "wipe the data directory");
        let dir = &self.nodes[i].data_dir;
        for entry in std::fs::read_dir(dir).with_context(|| format!("list {}", dir.display()))? {
            let path = entry?.path();
            if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            }
            .with_context(|| format!("delete {}", path.display()))?;
        }
        Ok(())
    }

    /// Drops every packet from node `from` to node `to` (a one-way cut; cut both ways for
    /// a full one). Traffic between the nodes and the test's clients is untouched.
    pub async fn cut(&mut self, from: usize, to: usize) -> anyhow::Result<()> {
        if self.cuts.insert((from, to)) && self.nodes[to].state != NodeState::Stopped {
            self.apply_filters(to).await?;
        }
        Ok(())
    }

    /// Cuts every link between the two groups of nodes, both ways.
    pub async fn partition(&mut self, side_a: &[usize], side_b: &[usize]) -> anyhow::Result<()> {
        for &a in side_a {
            for &b in side_b {
                self.cuts.insert((a, b));
                self.cuts.insert((b, a));
            }
        }
        for i in 0..self.nodes.len() {
            if self.nodes[i].state != NodeState::Stopped {
                self.apply_filters(i).await?;
            }
        }
        Ok(())
    }

    /// The links currently cut: (from, to) node indexes.
    pub fn cuts(&self) -> &BTreeSet<(usize, usize)> {
        &self.cuts
    }

    /// Removes every cut.
    pub async fn heal_network(&mut self) -> anyhow::Result<()> {
        self.cuts.clear();
        for i in 0..self.nodes.len() {
            if self.nodes[i].state != NodeState::Stopped {
                self.apply_filters(i).await?;
            }
        }
        Ok(())
    }

    /// Slows every packet node `i` sends, clients' included: delayed by `delay` ± `jitter`
    /// (netem) where the kernel has netem, else queued behind a 1 Mbit/s token bucket for up
    /// to `delay` (tbf; what does not fit is dropped). Returns what was set.
    pub async fn slow(
        &mut self,
        i: usize,
        delay: Duration,
        jitter: Duration,
    ) -> anyhow::Result<String> {
        let netem = format!(
            "netem delay {}ms {}ms distribution normal",
            delay.as_millis(),
            jitter.as_millis()
        );
        let tbf = format!(
            "tbf rate 1mbit burst 32kbit latency {}ms",
            delay.as_millis()
        );
        let mut chosen = netem;
        if self.nodes[i].state != NodeState::Stopped
            && let Err(err) = self.apply_netem(i, &chosen).await
        {
            if !format!("{err:#}").contains("qdisc kind is unknown") {
                return Err(err);
            }
            chosen = tbf;
            self.apply_netem(i, &chosen).await?;
        }
        self.note(i, &format!("tc qdisc {chosen}"));
        self.nodes[i].netem = Some(chosen.clone());
        Ok(chosen)
    }

    /// Removes node `i`'s traffic shaping.
    pub async fn unslow(&mut self, i: usize) -> anyhow::Result<()> {
        if self.nodes[i].netem.take().is_some() && self.nodes[i].state != NodeState::Stopped {
            self.note(i, "traffic shaping off");
            let pid = self.pid(i).await?;
            nsenter(pid, "tc", &["qdisc", "del", "dev", "eth0", "root"]).await?;
        }
        Ok(())
    }

    /// Fills node `i`'s data volume (a size-limited tmpfs) until no byte is left; returns
    /// the bytes written.
    pub fn fill_disk(&mut self, i: usize) -> anyhow::Result<u64> {
        anyhow::ensure!(
            self.tmpfs_mounted,
            "the disk nemesis needs size-limited data volumes (data_limit_bytes)"
        );
        self.note(i, "fill the data volume");
        let path = self.nodes[i].data_dir.join(BALLAST_FILE);
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("create {}", path.display()))?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(28) => break, // ENOSPC
                Err(e) => return Err(e).context("fill the data volume"),
            }
        }
        // The last pages: smaller writes until nothing fits.
        let small = [0u8; 4096];
        while let Ok(n) = file.write(&small) {
            if n == 0 {
                break;
            }
            written += n as u64;
        }
        Ok(written)
    }

    /// Frees what [`ContainerCluster::fill_disk`] took.
    pub fn free_disk(&mut self, i: usize) -> anyhow::Result<()> {
        let path = self.nodes[i].data_dir.join(BALLAST_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => {
                self.note(i, "free the data volume");
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("delete {}", path.display())),
        }
    }

    /// Node `i`'s output so far.
    pub async fn logs(&self, i: usize) -> String {
        let output = Command::new("docker")
            .args(["logs", "--timestamps", &self.nodes[i].container])
            .output()
            .await;
        match output {
            Ok(o) => {
                let mut text = String::from_utf8_lossy(&o.stdout).into_owned();
                text.push_str(&String::from_utf8_lossy(&o.stderr));
                text
            }
            Err(e) => format!("(cannot read the log: {e})"),
        }
    }

    async fn log_tail(&self, i: usize, lines: usize) -> String {
        let log = self.logs(i).await;
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Writes every node's log to `node-N.log` in the run directory; returns the paths.
    pub async fn save_logs(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for i in 0..self.nodes.len() {
            let path = self
                .spec
                .run_dir
                .join(format!("node-{}.log", self.nodes[i].id));
            if std::fs::write(&path, self.logs(i).await).is_ok() {
                paths.push(path);
            }
        }
        paths
    }

    fn note(&self, i: usize, what: &str) {
        let path = self.spec.run_dir.join("nemesis.log");
        if let Ok(mut log) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(
                log,
                "{} node {}: {what}",
                humantime::format_rfc3339_millis(std::time::SystemTime::now()),
                self.nodes[i].id
            );
        }
    }

    async fn pid(&self, i: usize) -> anyhow::Result<u32> {
        let pid = docker(&[
            "inspect",
            "--format",
            "{{.State.Pid}}",
            &self.nodes[i].container,
        ])
        .await?;
        let pid: u32 = pid.parse().with_context(|| format!("pid '{pid}'"))?;
        anyhow::ensure!(pid != 0, "node {} is not running", self.nodes[i].id);
        Ok(pid)
    }

    /// Sets node `i`'s INPUT filter to drop what the cuts say must not reach it.
    async fn apply_filters(&self, i: usize) -> anyhow::Result<()> {
        let pid = self.pid(i).await?;
        nsenter(pid, "iptables", &["-w", "-F", "INPUT"]).await?;
        let mut dropped = Vec::new();
        for &(from, to) in &self.cuts {
            if to == i {
                let source = self.nodes[from].ip.to_string();
                nsenter(
                    pid,
                    "iptables",
                    &["-w", "-A", "INPUT", "-s", &source, "-j", "DROP"],
                )
                .await?;
                dropped.push(self.nodes[from].id.to_string());
            }
        }
        self.note(
            i,
            &if dropped.is_empty() {
                "packet filter: accept all".to_owned()
            } else {
                format!("packet filter: drop from nodes {}", dropped.join(","))
            },
        );
        Ok(())
    }

    async fn apply_netem(&self, i: usize, netem: &str) -> anyhow::Result<()> {
        let pid = self.pid(i).await?;
        let mut args = vec!["qdisc", "replace", "dev", "eth0", "root"];
        args.extend(netem.split_whitespace());
        nsenter(pid, "tc", &args).await.map(drop)
    }
}

impl Drop for ContainerCluster {
    fn drop(&mut self) {
        let containers: Vec<&str> = self.nodes.iter().map(|n| n.container.as_str()).collect();
        if !containers.is_empty() {
            let _ = std::process::Command::new("docker")
                .args(["rm", "--force", "--volumes"])
                .args(&containers)
                .output();
        }
        let _ = std::process::Command::new("docker")
            .args(["network", "rm", &self.network])
            .output();
        if self.tmpfs_mounted {
            for node in &self.nodes {
                let _ = std::process::Command::new("umount")
                    .arg(&node.data_dir)
                    .output();
            }
        }
        let _ = &self.name;
    }
}

/// Creates a bridge network with a /24 subnet of its own; returns the subnet's first three
/// octets.
pub async fn create_network(name: &str) -> anyhow::Result<[u8; 3]> {
    let mut last_error = None;
    for _ in 0..SUBNET_ATTEMPTS_MAX {
        let subnet = [10, 213, rand::random::<u8>()];
        let cidr = format!("{}.{}.{}.0/24", subnet[0], subnet[1], subnet[2]);
        match docker(&[
            "network", "create", "--driver", "bridge", "--subnet", &cidr, name,
        ])
        .await
        {
            Ok(_) => return Ok(subnet),
            Err(err) => last_error = Some(err),
        }
    }
    Err(last_error.expect("at least one attempt")).context("cannot create a Docker network")
}

/// Makes a cluster key in `dir` with the image's own `tributary cert cluster-key` (run as
/// the image's user, without a network), unless `dir` holds one already: the run's nodes
/// share it.
async fn make_cluster_key(image: &str, dir: &Path) -> anyhow::Result<()> {
    if dir.join(CLUSTER_KEY_FILE).exists() {
        return Ok(());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    give_to_node_user(dir)?;
    let volume = format!("{}:{CLUSTER_KEY_MOUNT}", dir.display());
    let out = format!("{CLUSTER_KEY_MOUNT}/{CLUSTER_KEY_FILE}");
    docker(&[
        "run",
        "--rm",
        "--network",
        "none",
        "--volume",
        &volume,
        image,
        "cert",
        "cluster-key",
        "--out",
        &out,
    ])
    .await
    .context("cannot make the cluster key with the image's `tributary cert cluster-key`")
    .map(drop)
}

/// Runs a host tool inside the network namespace of process `pid`.
async fn nsenter(pid: u32, program: &str, args: &[&str]) -> anyhow::Result<String> {
    let target = pid.to_string();
    let mut all = vec!["--target", &target, "--net", "--", program];
    all.extend_from_slice(args);
    run("nsenter", &all).await
}

/// Hands a data directory to the image's user, so the node can write it.
fn give_to_node_user(dir: &Path) -> anyhow::Result<()> {
    std::os::unix::fs::chown(dir, Some(NODE_UID), Some(NODE_UID))
        .with_context(|| format!("cannot hand {} to uid {NODE_UID}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("chmod {}", dir.display()))
}
