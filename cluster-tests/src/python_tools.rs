//! The Python tools some tests use, from `scripts/python-test-deps`: fastavro (an Avro
//! reader no one here wrote) and moto's S3-compatible server.

use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{poll_until, require_tool};

/// How long moto's server may take to listen.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes a missing Python environment fail a test instead of skipping it (CI sets it).
pub const REQUIRE_PYTHON_DEPS_ENV: &str = "TRIBUTARY_REQUIRE_PYTHON_DEPS";

/// The virtual environment of `scripts/python-test-deps`, or `None` (the caller skips,
/// saying so) when it is missing and `TRIBUTARY_REQUIRE_PYTHON_DEPS` is not `1`; with it set
/// (CI) a missing environment fails the test (see [`crate::require_tool`]).
#[track_caller]
pub fn python_deps() -> Option<PathBuf> {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let venv = workspace.join("target/python-test-deps");
    let ready = venv.join("bin/python").is_file() && venv.join("bin/moto_server").is_file();
    require_tool(
        "the Python test environment (fastavro and moto, in target/python-test-deps)",
        ready.then_some(venv),
        "run scripts/python-test-deps first",
        REQUIRE_PYTHON_DEPS_ENV,
    )
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
        let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
        let listening = poll_until(SERVER_START_TIMEOUT, async || {
            if tokio::net::TcpStream::connect(addr).await.is_ok() {
                return Ok(());
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!(
                    "moto_server exited with {status} before listening:\n{}",
                    log()
                );
            }
            Err(())
        })
        .await;
        if listening.is_err() {
            panic!(
                "moto_server did not listen on {addr} within {SERVER_START_TIMEOUT:?}:\n{}",
                log()
            );
        }
        server
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
