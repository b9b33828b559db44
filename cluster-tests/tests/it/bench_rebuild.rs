//! `tributary bench rebuild`: a partition holding more than 1 GB past a retention cut, a
//! snapshot point every 100 entries; a follower wiped and rebuilt, then wiped again and
//! SIGKILLed part-way through the install. The bench measures both rebuilds; the test holds
//! them to the bounds: the leader and the rebuilt node stay under 300 MiB resident,
//! every replica ends identical, and paced sends keep being acknowledged meanwhile.

use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use tributary_cluster_tests::{TestDir, describe_output, output_within, tributary_command};

/// The partition's retained size: above 1 GB, with room for the retention cut.
const GIGABYTES: &str = "1.05";
/// 50 MiB/s: the install lasts long enough (about 20 s) to be killed in the middle.
const REBUILD_BYTES_PER_SECOND: &str = "52428800";
/// Paced sends and memory measured before each wipe.
const BASELINE: &str = "5s";
/// The bound on the leader's and the rebuilt node's resident memory.
const RSS_MIB_MAX: f64 = 300.0;
/// Filling 1 GB and two rebuilds with a debug build on a busy two-core machine.
const BENCH_TIMEOUT: Duration = Duration::from_secs(15 * 60);

#[tokio::test]
async fn a_wiped_replica_of_a_gigabyte_is_rebuilt_in_bounded_memory_also_through_a_kill() {
    let dir = TestDir::new("bench_rebuild");
    let mut command = tributary_command();
    command
        .args(["bench", "rebuild", "--gigabytes", GIGABYTES])
        .args(["--kill-mid-install", "--rebuild-bytes-per-second"])
        .arg(REBUILD_BYTES_PER_SECOND)
        .args(["--baseline", BASELINE, "--keep-data", "--data-dir"])
        .arg(dir.path());
    let output = output_within(command, BENCH_TIMEOUT).await;
    let described = describe_output(&output);
    assert!(output.status.success(), "bench rebuild failed: {described}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    println!("{stdout}");

    let row = |key: &str| {
        stdout
            .lines()
            .find_map(|line| line.strip_prefix(key).filter(|rest| rest.starts_with("  ")))
            .map(str::trim)
            .unwrap_or_else(|| panic!("the table has a '{key}' row: {described}"))
            .to_owned()
    };
    // One cell per rebuild: the undisturbed one, then the one killed mid-install.
    let cells = |key: &str| -> Vec<String> {
        let cells: Vec<String> = row(key)
            .split("  ")
            .map(str::trim)
            .filter(|cell| !cell.is_empty())
            .map(str::to_owned)
            .collect();
        assert_eq!(
            cells.len(),
            2,
            "two rebuilds in the '{key}' row: {described}"
        );
        cells
    };
    let leading_number = |text: &str| -> f64 {
        text.split([' ', ',', '%'])
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("'{text}' starts with a number: {described}"))
    };

    // More than 1 GB retained, with the earliest events removed by retention.
    assert!(
        leading_number(&row("partition bytes")) >= 1e9,
        "{described}"
    );
    assert!(
        leading_number(&row("beginning sequence number")) > 0.0,
        "{described}"
    );

    assert_eq!(cells("killed mid-install")[0], "no", "{described}");
    let killed = &cells("killed mid-install")[1];
    let share = killed
        .strip_prefix("yes, at ")
        .map(leading_number)
        .unwrap_or_else(|| panic!("the second rebuild was killed: {described}"));
    assert!(
        (30.0..100.0).contains(&share),
        "killed after 30% and before the end: {described}"
    );
    for installed in cells("snapshots installed") {
        assert!(
            leading_number(&installed) >= 1.0,
            "rebuilt from a snapshot: {described}"
        );
    }
    for seconds in cells("rebuild seconds") {
        assert!(leading_number(&seconds) > 0.0, "{described}");
    }
    for throughput in cells("rebuild throughput") {
        assert!(throughput.ends_with(" MB/s"), "{described}");
    }
    // The undisturbed rebuild sends the partition once, not transfer after transfer (a
    // few entries more may arrive meanwhile); the killed one at most once more.
    let partition_mb = leading_number(&row("partition bytes")) / 1e6;
    let sent = cells("rebuild bytes sent");
    for (cell, most) in sent.iter().zip([1.1, 2.1]) {
        let mb = leading_number(cell);
        assert!(
            mb >= partition_mb * 0.99 && mb <= partition_mb * most,
            "{mb} MB sent to rebuild a partition of {partition_mb} MB: {described}"
        );
    }

    // Sends kept being acknowledged during each rebuild, with their latency reported.
    for key in ["sends before", "sends during"] {
        for window in cells(key) {
            assert!(leading_number(&window) > 0.0, "{key}: {described}");
            let p99 = window
                .split("p99 ")
                .nth(1)
                .unwrap_or_else(|| panic!("{key} reports p99: {described}"));
            assert!(p99.ends_with(" ms"), "{key}: {described}");
        }
    }

    assert_eq!(cells("replicas identical"), ["yes", "yes"], "{described}");
    assert!(
        row("result").starts_with("replicas identical"),
        "{described}"
    );

    // The memory bound, sampled every 100 ms throughout each rebuild.
    for key in [
        "max RSS leader before",
        "max RSS leader during",
        "max RSS rebuilt node during",
    ] {
        for mib in cells(key) {
            assert!(
                leading_number(&mib) < RSS_MIB_MAX,
                "{key} under {RSS_MIB_MAX} MiB: {described}"
            );
        }
    }

    // Every node process the bench started (each start is noted in its log) has exited.
    let run_dir = kept_run_dir(dir.path());
    let mut pids = Vec::new();
    for node in 1..=3 {
        let log = std::fs::read_to_string(run_dir.join(format!("node-{node}.log")))
            .unwrap_or_else(|e| panic!("node {node}'s log is kept in {run_dir:?}: {e}"));
        pids.extend(log.lines().filter_map(|line| {
            line.strip_prefix("=== bench rebuild: started pid ")
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|pid| pid.parse::<i32>().ok())
        }));
    }
    assert_eq!(
        pids.len(),
        3 + 3,
        "three starts, a restart per wipe and one after the kill: {pids:?}"
    );
    for pid in pids {
        assert_eq!(
            kill(Pid::from_raw(pid), None),
            Err(Errno::ESRCH),
            "node pid {pid} no longer runs after the bench exited"
        );
    }
}

/// The one `tributary-bench-rebuild-*` directory the bench kept under `dir`.
fn kept_run_dir(dir: &Path) -> std::path::PathBuf {
    let runs: Vec<_> = std::fs::read_dir(dir)
        .expect("the data directory exists")
        .map(|entry| entry.expect("readable directory").path())
        .filter(|path| {
            path.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tributary-bench-rebuild-"))
        })
        .collect();
    assert_eq!(runs.len(), 1, "one run directory under {dir:?}: {runs:?}");
    runs.into_iter().next().expect("checked")
}
