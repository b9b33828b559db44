//! The Python tools some tests use, from `scripts/python-test-deps`: fastavro (an Avro
//! reader no one here wrote) and moto's S3-compatible server.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// How long moto's server may take to listen.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);
const SERVER_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// The virtual environment of `scripts/python-test-deps`, or `None` (the caller skips,
/// saying so) when it is missing and `TRIBUTARY_REQUIRE_PYTHON_DEPS` is not `1`; with it set
/// (CI) a missing environment fails the test.
pub fn python_deps() -> Option<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let venv = workspace.join("target/python-test-deps");
    let ready = venv.join("bin/python").is_file() && venv.join("bin/moto_server").is_file();
    if ready {
        return Some(venv);
    }
    if std::env::var("TRIBUTARY_REQUIRE_PYTHON_DEPS").as_deref() == Ok("1") {
        panic!(
            "the Python test tools are missing and TRIBUTARY_REQUIRE_PYTHON_DEPS=1: run \
             scripts/python-test-deps first"
        );
    }
    println!("skipped: run scripts/python-test-deps first");
    None
}

/// A moto S3 server on a free local port, killed when dropped.
pub struct MotoServer {
    child: Child,
    addr: SocketAddr,
    /// Holds the server's log, shown if it fails to start.
    _log_dir: tempfile::TempDir,
}

impl MotoServer {
    /// Starts `moto_server` from the environment `venv` and waits until it listens.
    pub async fn start(venv: &Path) -> MotoServer {
        // A port the system just handed out and released: free unless taken in between.
        let addr = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap()
            .local_addr()
            .unwrap();
        let log_dir = tempfile::tempdir().unwrap();
        let log_path = log_dir.path().join("moto.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(venv.join("bin/moto_server"))
            .args(["-H", "127.0.0.1", "-p", &addr.port().to_string()])
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = MotoServer {
            child,
            addr,
            _log_dir: log_dir,
        };
        let deadline = tokio::time::Instant::now() + SERVER_START_TIMEOUT;
        let mut poll = tokio::time::interval(SERVER_POLL_INTERVAL);
        loop {
            poll.tick().await;
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return server;
            }
            let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!(
                    "moto_server exited with {status} before listening:\n{}",
                    log()
                );
            }
            if tokio::time::Instant::now() > deadline {
                panic!(
                    "moto_server did not listen on {addr} within {SERVER_START_TIMEOUT:?}:\n{}",
                    log()
                );
            }
        }
    }

    /// `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops the server (as dropping it does).
    pub fn stop(self) {}
}

impl Drop for MotoServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
