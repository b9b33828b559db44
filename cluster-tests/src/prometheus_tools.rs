//! Prometheus's own tools, from Debian's `prometheus` package (`scripts/prometheus-tools`
//! installs it): `promtool` checks our exposition format and alert rules, and a real
//! `prometheus` server scrapes a local cluster.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{free_port, http_get, poll_until, require_tool};

/// How long the server may take to answer `/-/ready`.
const SERVER_START_TIMEOUT: Duration = Duration::from_secs(60);

/// Makes missing Prometheus tools fail a test instead of skipping it (CI sets it).
pub const REQUIRE_PROMETHEUS_ENV: &str = "TRIBUTARY_REQUIRE_PROMETHEUS";

/// The paths of `promtool` and `prometheus`, or `None` (the caller skips, saying so) when
/// either is missing and `TRIBUTARY_REQUIRE_PROMETHEUS` is not `1`; with it set (CI) a
/// missing tool fails the test (see [`crate::require_tool`]).
#[track_caller]
pub fn prometheus_tools() -> Option<(PathBuf, PathBuf)> {
    require_tool(
        "promtool or prometheus (on PATH or in /usr/bin)",
        find("promtool").zip(find("prometheus")),
        "run scripts/prometheus-tools first (it installs Debian's prometheus package)",
        REQUIRE_PROMETHEUS_ENV,
    )
}

/// `name` on PATH, or in `/usr/bin` (where Debian puts it) when PATH lacks it.
fn find(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// A `prometheus` server on a free local port scraping `targets` (host:port of `/metrics`)
/// every second and evaluating `rule_files` every second, with its data in `dir`; killed
/// when dropped.
pub struct PrometheusServer {
    child: Child,
    port: u16,
    log_path: PathBuf,
}

impl PrometheusServer {
    pub async fn start(
        binary: &Path,
        dir: &Path,
        targets: &[String],
        rule_files: &[PathBuf],
    ) -> PrometheusServer {
        std::fs::create_dir_all(dir).unwrap();
        let config = dir.join("prometheus.yml");
        let quoted = |items: Vec<String>| {
            items
                .iter()
                .map(|t| format!("'{t}'"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let rule_files = rule_files.iter().map(|f| f.display().to_string()).collect();
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
                 rule_files: [{}]\n\
                 scrape_configs:\n  - job_name: tributary\n    static_configs:\n      \
                 - targets: [{}]\n",
                quoted(rule_files),
                quoted(targets.to_vec())
            ),
        )
        .unwrap();
        let port = free_port();
        let log_path = dir.join("prometheus.log");
        let log = std::fs::File::create(&log_path).unwrap();
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut server = PrometheusServer {
            child,
            port,
            log_path,
        };
        let ready = poll_until(SERVER_START_TIMEOUT, async || {
            if http_get(server.addr(), "/-/ready")
                .await
                .is_ok_and(|r| r.status == 200)
            {
                return Ok(());
            }
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!(
                    "prometheus exited with {status} before it was ready:\n{}",
                    server.log()
                );
            }
            Err(())
        })
        .await;
        if ready.is_err() {
            panic!(
                "prometheus was not ready on port {port} within {SERVER_START_TIMEOUT:?}:\n{}",
                server.log()
            );
        }
        server
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The server's log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The values of an instant PromQL query's result vector (empty when nothing matches).
    pub async fn query(&self, promql: &str) -> Result<Vec<f64>, String> {
        let path = format!("/api/v1/query?query={}", percent_encode(promql));
        let response = http_get(self.addr(), &path)
            .await
            .map_err(|e| format!("query {promql}: {e}"))?;
        let body: serde_json::Value = serde_json::from_str(&response.body)
            .map_err(|e| format!("query {promql}: {e}: {}", response.body))?;
        if body["status"] != "success" {
            return Err(format!("query {promql}: {}", response.body));
        }
        let values = body["data"]["result"]
            .as_array()
            .ok_or_else(|| format!("query {promql}: no result vector: {}", response.body))?
            .iter()
            .filter_map(|sample| sample["value"][1].as_str()?.parse().ok())
            .collect();
        Ok(values)
    }
}

impl Drop for PrometheusServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn percent_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
