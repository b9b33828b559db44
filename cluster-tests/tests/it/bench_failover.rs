//! `tributary bench failover`: the bench starts its own cluster, kills partition leaders
//! under load, reports how long each partition took to accept writes again, and leaves no
//! node running behind it. Timing targets are the benchmark's business, not the test's.

use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tributary_cluster_tests::{TestDir, describe_output, output_within, tributary_command};

/// Small enough for a debug build on a busy machine.
const KILLS: usize = 2;
const PARTITIONS_PER_NODE: &str = "6";
const BENCH_TIMEOUT: Duration = Duration::from_secs(300);

#[tokio::test]
async fn bench_failover_measures_every_kill_and_stops_its_nodes() {
    let dir = TestDir::new("bench_failover");
    let mut command = tributary_command();
    command
        .args(["bench", "failover", "--kills"])
        .arg(KILLS.to_string())
        .args(["--partitions-per-node", PARTITIONS_PER_NODE, "--keep-data"])
        .arg("--data-dir")
        .arg(dir.path());
    let output = output_within(command, BENCH_TIMEOUT).await;
    let described = describe_output(&output);
    assert!(
        output.status.success(),
        "bench failover failed: {described}"
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);

    // The table: every kill measured and recovered, with the statistics and targets.
    let row = |key: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(key).map(str::trim))
            .unwrap_or_else(|| panic!("the table has a '{key}' row: {described}"))
            .to_owned()
    };
    assert_eq!(row("kills"), KILLS.to_string(), "{described}");
    assert_eq!(row("recovered"), KILLS.to_string(), "{described}");
    assert!(
        row("cluster").starts_with("3 nodes, 6 partitions"),
        "{described}"
    );
    for (key, target) in [("recovery median", "1.5s"), ("recovery max", "3.0s")] {
        let value = row(key);
        let seconds: f64 = value
            .split('s')
            .next()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("'{key}' starts with seconds: {described}"));
        assert!(seconds > 0.0, "{described}");
        assert!(value.contains(&format!("target ≤ {target}")), "{described}");
    }
    assert!(row("recovery p90").ends_with('s'), "{described}");
    assert!(!row("result").contains("did not recover"), "{described}");

    // One progress line per kill, each with its recovery.
    for number in 1..=KILLS {
        let prefix = format!("kill {number}/{KILLS}: node ");
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&prefix))
            .unwrap_or_else(|| panic!("a progress line for kill {number}: {described}"));
        assert!(
            line.contains("writes accepted again after"),
            "kill {number} recovered: {described}"
        );
    }

    // Every node process the bench started (each start is noted in its log) has exited.
    let run_dir = kept_run_dir(dir.path());
    let mut pids = Vec::new();
    for node in 1..=3 {
        let log = std::fs::read_to_string(run_dir.join(format!("node-{node}.log")))
            .unwrap_or_else(|e| panic!("node {node}'s log is kept in {run_dir:?}: {e}"));
        pids.extend(log.lines().filter_map(|line| {
            line.strip_prefix("=== bench failover: started pid ")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|pid| pid.parse::<i32>().ok())
        }));
    }
    assert_eq!(
        pids.len(),
        3 + KILLS,
        "three starts and one restart per kill: {pids:?}"
    );
    for pid in pids {
        assert_eq!(
            kill(Pid::from_raw(pid), None),
            Err(Errno::ESRCH),
            "node pid {pid} no longer runs after the bench exited"
        );
    }
}

/// The one `tributary-bench-failover-*` directory the bench kept under `dir`.
fn kept_run_dir(dir: &Path) -> std::path::PathBuf {
    let runs: Vec<_> = std::fs::read_dir(dir)
        .expect("the data directory exists")
        .map(|entry| entry.expect("readable directory").path())
        .filter(|path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tributary-bench-failover-"))
        })
        .collect();
    assert_eq!(runs.len(), 1, "one run directory under {dir:?}: {runs:?}");
    runs.into_iter().next().expect("checked")
}
