//! One `tributary serve` process on 127.0.0.1, started, stopped and restarted by a test.

use std::collections::HashSet;
use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::sync::Mutex;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Child;

use crate::binary::{tributary_command, tributary_command_at};
use crate::eventually::poll_until;
use crate::http::http_get;

/// How long a node may take from spawn to answering `/readyz` with 200.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a signalled node may take to exit.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Starts on fresh ports after the previous ports turned out to be taken.
const START_ATTEMPTS_MAX: u32 = 5;
/// Sets the node-to-node port (`--peer-addr`).
pub const PEER_ADDR_ENV: &str = "TRIBUTARY_PEER_ADDR";
/// Log lines shown when a node fails or a test panics.
const LOG_TAIL_LINES: usize = 40;

/// The ports of a node: client, HTTP and peer, and AMQP in plain text and over TLS (the
/// latter used only when the node has a client certificate).
#[derive(Debug, Clone, Copy)]
pub struct NodePorts {
    pub client: u16,
    pub http: u16,
    pub peer: u16,
    pub amqp: u16,
    pub amqps: u16,
    pub blob: u16,
    pub kafka: u16,
    pub kafka_tls: u16,
}

impl NodePorts {
    pub fn free() -> NodePorts {
        NodePorts {
            client: free_port(),
            http: free_port(),
            peer: free_port(),
            amqp: free_port(),
            amqps: free_port(),
            blob: free_port(),
            kafka: free_port(),
            kafka_tls: free_port(),
        }
    }
}

/// A running (or stopped) `tributary serve` on a data directory, with authorization off
/// unless its flags or environment turn it on. Its stdout and stderr go to
/// `<data dir>.log` beside the data directory; every start appends to it. Dropping it kills
/// the process, and when the test is failing prints the log's path and tail.
/// The environment variable setting `serve --auth`; the harness sets it to `none`.
pub const AUTH_ENV: &str = "TRIBUTARY_AUTH";
/// The environment variables setting `serve --amqp-addr` and `--amqps-addr`.
pub const AMQP_ADDR_ENV: &str = "TRIBUTARY_AMQP_ADDR";
pub const AMQPS_ADDR_ENV: &str = "TRIBUTARY_AMQPS_ADDR";
/// The environment variable setting `serve --blob-addr`.
pub const BLOB_ADDR_ENV: &str = "TRIBUTARY_BLOB_ADDR";
/// The environment variables setting `serve --kafka-addr` and `--kafka-tls-addr`.
pub const KAFKA_ADDR_ENV: &str = "TRIBUTARY_KAFKA_ADDR";
pub const KAFKA_TLS_ADDR_ENV: &str = "TRIBUTARY_KAFKA_TLS_ADDR";

pub struct NodeProcess {
    data_dir: PathBuf,
    extra_args: Vec<String>,
    /// Environment variables set for the process, besides the inherited ones.
    env: Vec<(String, String)>,
    client_port: u16,
    http_port: u16,
    peer_port: u16,
    amqp_port: u16,
    amqps_port: u16,
    blob_port: u16,
    kafka_port: u16,
    kafka_tls_port: u16,
    log_path: PathBuf,
    /// Where the current run's output starts in the log.
    run_log_start: u64,
    child: Option<Child>,
    /// Stopped with SIGSTOP and not yet continued.
    paused: bool,
    /// The binary this node runs when not the build under test (an earlier release's).
    binary: Option<PathBuf>,
}

enum Readiness {
    Ready,
    Exited(ExitStatus),
}

impl NodeProcess {
    /// Starts a node on `data_dir` on free ports and waits until it is ready.
    pub async fn start(data_dir: &Path) -> NodeProcess {
        NodeProcess::start_with_args(data_dir, &[]).await
    }

    /// Like [`NodeProcess::start`], with more `serve` flags (e.g. `--cluster-id alpha`).
    pub async fn start_with_args(data_dir: &Path, extra_args: &[&str]) -> NodeProcess {
        let args: Vec<String> = extra_args.iter().map(|a| (*a).to_owned()).collect();
        let mut node = NodeProcess::new(data_dir, NodePorts::free(), &args);
        for attempt in 1..=START_ATTEMPTS_MAX {
            if attempt > 1 {
                let ports = NodePorts::free();
                (node.client_port, node.http_port, node.peer_port) =
                    (ports.client, ports.http, ports.peer);
                (node.amqp_port, node.amqps_port) = (ports.amqp, ports.amqps);
                node.blob_port = ports.blob;
                (node.kafka_port, node.kafka_tls_port) = (ports.kafka, ports.kafka_tls);
            }
            node.spawn();
            match node.ready_or_exit().await {
                Readiness::Ready => return node,
                Readiness::Exited(_) if attempt < START_ATTEMPTS_MAX && node.port_was_taken() => {
                    eprintln!("a port was taken meanwhile; starting again on other ports");
                }
                Readiness::Exited(status) => {
                    panic!(
                        "{}",
                        node.failure(&format!("node exited during start: {status}"))
                    )
                }
            }
        }
        unreachable!("the last attempt either returns or panics")
    }

    /// Spawns a node on the given ports without waiting for it (a cluster's nodes must all
    /// run before any is ready); call [`NodeProcess::wait_ready`] next.
    pub fn launch(data_dir: &Path, ports: NodePorts, extra_args: &[String]) -> NodeProcess {
        let mut node = NodeProcess::new(data_dir, ports, extra_args);
        node.spawn();
        node
    }

    /// Like [`NodeProcess::launch`], with environment variables set for the process (e.g.
    /// `TRIBUTARY_FAULT_HOOKS=1`); restarts keep them.
    pub fn launch_with_env(
        data_dir: &Path,
        ports: NodePorts,
        extra_args: &[String],
        env: &[(&str, &str)],
    ) -> NodeProcess {
        NodeProcess::launch_run(None, data_dir, ports, extra_args, env)
    }

    /// A node on these ports, not started yet.
    fn new(data_dir: &Path, ports: NodePorts, extra_args: &[String]) -> NodeProcess {
        let name = data_dir
            .file_name()
            .expect("the data directory has a name")
            .to_string_lossy();
        let log_path = data_dir.with_file_name(format!("{name}.log"));
        NodeProcess {
            data_dir: data_dir.to_path_buf(),
            extra_args: extra_args.to_vec(),
            env: Vec::new(),
            client_port: ports.client,
            http_port: ports.http,
            peer_port: ports.peer,
            amqp_port: ports.amqp,
            amqps_port: ports.amqps,
            blob_port: ports.blob,
            kafka_port: ports.kafka,
            kafka_tls_port: ports.kafka_tls,
            log_path,
            run_log_start: 0,
            child: None,
            paused: false,
            binary: None,
        }
    }

    /// Like [`NodeProcess::launch_with_env`], running the binary at `binary` (e.g. an
    /// earlier release's) instead of the build under test.
    pub fn launch_binary(
        binary: &Path,
        data_dir: &Path,
        ports: NodePorts,
        extra_args: &[String],
        env: &[(&str, &str)],
    ) -> NodeProcess {
        NodeProcess::launch_run(Some(binary), data_dir, ports, extra_args, env)
    }

    fn launch_run(
        binary: Option<&Path>,
        data_dir: &Path,
        ports: NodePorts,
        extra_args: &[String],
        env: &[(&str, &str)],
    ) -> NodeProcess {
        let mut node = NodeProcess::new(data_dir, ports, extra_args);
        node.binary = binary.map(Path::to_path_buf);
        node.env = env
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        node.spawn();
        node
    }

    /// Makes the next start run the binary at `binary` (`None`: the build under test): an
    /// upgrade, once the node is stopped.
    pub fn set_binary(&mut self, binary: Option<&Path>) {
        self.binary = binary.map(Path::to_path_buf);
    }

    /// Starts the stopped node again without waiting for it to be ready (it may be meant
    /// to refuse to start: see [`NodeProcess::wait_for_exit`]).
    pub fn start_again(&mut self) {
        assert!(self.child.is_none(), "start_again() needs a stopped node");
        self.spawn();
    }

    /// `http://127.0.0.1:<client port>`, for the SDK and `--endpoint`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The node's client, HTTP and peer ports.
    pub fn ports(&self) -> NodePorts {
        NodePorts {
            client: self.client_port,
            http: self.http_port,
            peer: self.peer_port,
            amqp: self.amqp_port,
            amqps: self.amqps_port,
            blob: self.blob_port,
            kafka: self.kafka_port,
            kafka_tls: self.kafka_tls_port,
        }
    }

    /// `https://127.0.0.1:<client port>`, for a node started with TLS on its client port.
    pub fn tls_endpoint(&self) -> String {
        format!("https://127.0.0.1:{}", self.client_port)
    }

    pub fn client_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.client_port))
    }

    /// The plain-text AMQP listener's address (`--amqp-addr`).
    pub fn amqp_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.amqp_port))
    }

    /// The AMQP-over-TLS listener's address (`--amqps-addr`), served when the node has a
    /// client certificate.
    pub fn amqps_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.amqps_port))
    }

    /// The Blob checkpoint endpoint's address (`--blob-addr`): HTTPS when the node has a
    /// client certificate.
    pub fn blob_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.blob_port))
    }

    /// The plain-text Kafka listener's address (`--kafka-addr`).
    pub fn kafka_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.kafka_port))
    }

    /// The Kafka-over-TLS listener's address (`--kafka-tls-addr`), served when the node has
    /// a client certificate.
    pub fn kafka_tls_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.kafka_tls_port))
    }

    /// The node-to-node port's address (`--peer-addr`).
    pub fn peer_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.peer_port))
    }

    pub fn http_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.http_port))
    }

    /// `http://127.0.0.1:<http port>/metrics`.
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.http_addr())
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The process id while running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(Child::id)
    }

    /// Waits until `/readyz` answers 200 (the node says it is ready). Panics, showing the
    /// log, if the process exits first or [`READY_TIMEOUT`] passes.
    pub async fn wait_ready(&mut self) {
        if let Readiness::Exited(status) = self.ready_or_exit().await {
            panic!(
                "{}",
                self.failure(&format!("node exited before it was ready: {status}"))
            );
        }
    }

    /// Panics, showing the log, if the process is no longer running: call before blaming
    /// the node for a failed request (something outside the test may have stopped it).
    pub fn assert_running(&mut self) {
        if self.child.is_none() {
            panic!("{}", self.failure("the node is not running"));
        }
        if let Some(status) = self.try_wait() {
            panic!(
                "{}",
                self.failure(&format!("the node exited unexpectedly: {status}"))
            );
        }
    }

    /// SIGKILL: the process dies at once, as in a crash or power loss of the process.
    pub async fn kill9(&mut self) {
        let status = self.signal_and_wait(Signal::SIGKILL).await;
        assert_eq!(
            status.signal(),
            Some(Signal::SIGKILL as i32),
            "{}",
            self.failure(&format!("node had exited before SIGKILL: {status}"))
        );
    }

    /// SIGTERM, then waits for the node to shut down; returns its exit status.
    pub async fn terminate(&mut self) -> ExitStatus {
        self.signal_and_wait(Signal::SIGTERM).await
    }

    /// SIGSTOP: the process freezes (no timers, no replies, sockets stay open), as in a
    /// long garbage-collection pause or a stalled VM. [`NodeProcess::resume`] continues it;
    /// dropping a paused node kills it.
    pub fn pause(&mut self) {
        assert!(!self.paused, "pause() on a node that is already paused");
        self.signal_running(Signal::SIGSTOP);
        self.paused = true;
    }

    /// SIGCONT: a node stopped by [`NodeProcess::pause`] runs again.
    pub fn resume(&mut self) {
        assert!(self.paused, "resume() needs a node paused by pause()");
        self.signal_running(Signal::SIGCONT);
        self.paused = false;
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Stops the process if it runs (SIGKILL) and deletes everything in its data directory,
    /// so the next [`NodeProcess::restart`] starts on an empty directory, as a replacement
    /// machine with a new disk would.
    pub async fn wipe(&mut self) {
        if self.child.is_some() {
            self.signal_and_wait(Signal::SIGKILL).await;
        }
        let entries = match std::fs::read_dir(&self.data_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(e) => panic!("cannot list {}: {e}", self.data_dir.display()),
        };
        for entry in entries {
            let path = entry
                .unwrap_or_else(|e| panic!("cannot list {}: {e}", self.data_dir.display()))
                .path();
            let removed = if path.is_dir() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
            removed.unwrap_or_else(|e| panic!("cannot delete {}: {e}", path.display()));
        }
        self.note("data directory wiped");
    }

    /// Waits for the process to exit by itself (e.g. a fault hook aborted it) and returns
    /// its exit status; panics, showing the log, if it still runs after a while.
    pub async fn wait_for_exit(&mut self) -> ExitStatus {
        let Some(mut child) = self.child.take() else {
            panic!("wait_for_exit() needs a running node");
        };
        match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
            Ok(status) => status.expect("the child can be waited for"),
            Err(_elapsed) => {
                self.child = Some(child);
                panic!(
                    "{}",
                    self.failure(&format!("node still ran after {EXIT_TIMEOUT:?}"))
                )
            }
        }
    }

    /// Starts the stopped node again on the same data directory and ports, and waits until
    /// it is ready.
    pub async fn restart(&mut self) {
        assert!(
            self.child.is_none(),
            "restart() needs a stopped node: call kill9() or terminate() first"
        );
        self.spawn();
        self.wait_ready().await;
    }

    fn spawn(&mut self) {
        let mut log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)
            .unwrap_or_else(|e| panic!("cannot open {}: {e}", self.log_path.display()));
        let mut command = match &self.binary {
            Some(binary) => tributary_command_at(binary),
            None => tributary_command(),
        };
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(&self.data_dir)
            .arg("--client-addr")
            .arg(format!("127.0.0.1:{}", self.client_port))
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", self.http_port))
            // Through the environment, so binaries from before the peer port still start.
            .env(PEER_ADDR_ENV, format!("127.0.0.1:{}", self.peer_port))
            // Authorization is off unless the test asks for it (`--auth sas` among the
            // flags, or `TRIBUTARY_AUTH=sas` in its environment, both win over this).
            .env(AUTH_ENV, "none")
            // Each node its own AMQP ports (through the environment: earlier releases
            // have no AMQP and ignore it); AMQPS only beside a client certificate.
            .env(AMQP_ADDR_ENV, format!("127.0.0.1:{}", self.amqp_port))
            .env(BLOB_ADDR_ENV, format!("127.0.0.1:{}", self.blob_port))
            .env(KAFKA_ADDR_ENV, format!("127.0.0.1:{}", self.kafka_port));
        if self.extra_args.iter().any(|arg| arg == "--tls-cert") {
            command.env(AMQPS_ADDR_ENV, format!("127.0.0.1:{}", self.amqps_port));
            command.env(
                KAFKA_TLS_ADDR_ENV,
                format!("127.0.0.1:{}", self.kafka_tls_port),
            );
        }
        command
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(name, value)| (name, value)));
        let described = format!("{:?}", command.as_std());
        writeln!(log, "=== cluster-tests: starting {described}").expect("log is writable");
        self.run_log_start = log.metadata().map(|m| m.len()).unwrap_or(0);
        let stdout = log.try_clone().expect("log handle can be cloned");
        command.stdout(stdout).stderr(log);
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {described}: {e}"));
        eprintln!(
            "node pid {} serving {} (http {}), data {}, log {}",
            child.id().unwrap_or(0),
            self.endpoint(),
            self.http_addr(),
            self.data_dir.display(),
            self.log_path.display()
        );
        self.child = Some(child);
    }

    async fn ready_or_exit(&mut self) -> Readiness {
        let waited = poll_until(READY_TIMEOUT, async || {
            if let Some(status) = self.try_wait() {
                return Ok(Readiness::Exited(status));
            }
            let ready =
                matches!(http_get(self.http_addr(), "/readyz").await, Ok(r) if r.status == 200);
            // The probe may have reached another process that holds our port; the node is
            // only ready if it is still alive after answering.
            if ready {
                if let Some(status) = self.try_wait() {
                    return Ok(Readiness::Exited(status));
                }
                return Ok(Readiness::Ready);
            }
            Err(())
        })
        .await;
        waited.unwrap_or_else(|_| {
            panic!(
                "{}",
                self.failure(&format!("node not ready after {READY_TIMEOUT:?}"))
            )
        })
    }

    /// The exit status if the process has exited (and then forgets the child).
    fn try_wait(&mut self) -> Option<ExitStatus> {
        let child = self.child.as_mut().expect("the node was started");
        let status = child.try_wait().expect("the child can be polled")?;
        self.child = None;
        Some(status)
    }

    /// Sends `signal` to the running process without waiting for anything.
    fn signal_running(&mut self, signal: Signal) {
        self.assert_running();
        let pid = self.pid().expect("a running child has a pid");
        self.note(&format!("sending {signal}"));
        let pid = Pid::from_raw(i32::try_from(pid).expect("pids fit in i32"));
        kill(pid, signal).unwrap_or_else(|e| panic!("cannot send {signal} to pid {pid}: {e}"));
    }

    async fn signal_and_wait(&mut self, signal: Signal) -> ExitStatus {
        let Some(mut child) = self.child.take() else {
            panic!("cannot send {signal} to a node that is not running");
        };
        if let Some(pid) = child.id() {
            self.note(&format!("sending {signal}"));
            let pid = Pid::from_raw(i32::try_from(pid).expect("pids fit in i32"));
            // The process may have just exited by itself (ESRCH): waiting tells.
            let _ = kill(pid, signal);
            // A stopped process only acts on SIGTERM once continued (SIGKILL needs no help).
            if std::mem::take(&mut self.paused) {
                let _ = kill(pid, Signal::SIGCONT);
            }
        }
        match tokio::time::timeout(EXIT_TIMEOUT, child.wait()).await {
            Ok(status) => status.expect("the child can be waited for"),
            Err(_elapsed) => {
                let _ = child.start_kill();
                panic!(
                    "{}",
                    self.failure(&format!("node still ran {EXIT_TIMEOUT:?} after {signal}"))
                )
            }
        }
    }

    fn note(&self, text: &str) {
        if let Ok(mut log) = OpenOptions::new().append(true).open(&self.log_path) {
            let _ = writeln!(log, "=== cluster-tests: {text}");
        }
    }

    /// The output of the node's current run so far (its log from the last start on).
    pub fn run_log(&self) -> String {
        let text = std::fs::read(&self.log_path).unwrap_or_default();
        let start = usize::try_from(self.run_log_start)
            .unwrap_or(0)
            .min(text.len());
        String::from_utf8_lossy(&text[start..]).into_owned()
    }

    fn port_was_taken(&self) -> bool {
        self.run_log().contains("cannot listen on")
    }

    /// `what`, the log's path and the tail of the current run's output.
    fn failure(&self, what: &str) -> String {
        let log = self.run_log();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n");
        format!(
            "{what}\nnode log {} ends with:\n{tail}",
            self.log_path.display()
        )
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            // SIGKILL ends a stopped process too; continuing it first is only belt and braces.
            let _ = child.start_kill();
            if self.paused
                && let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok())
            {
                let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            }
        }
        if std::thread::panicking() {
            eprintln!("{}", self.failure("test failed"));
        }
    }
}

/// A port on 127.0.0.1 that was free a moment ago, and not handed out before by this
/// process (so concurrent tests never pick the same one). Another process may still take
/// it before the node binds it; [`NodeProcess::start`] then starts again on other ports.
pub fn free_port() -> u16 {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("can bind a port on 127.0.0.1");
        let port = listener.local_addr().expect("bound").port();
        let mut handed_out = HANDED_OUT.lock().expect("not poisoned");
        if handed_out.get_or_insert_with(HashSet::new).insert(port) {
            return port;
        }
    }
}
