//! `tributary serve` stops cleanly on SIGTERM at any point of its life, including while it
//! is still starting (waiting for the rest of its cluster), when a supervisor stops it.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt as _, BufReader};

use tributary_cluster_tests::{PEER_ADDR_ENV, TestDir, free_port, tributary_command};

/// How long the node may take to exit after the signal.
const EXIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the node may take to reach the point where it waits for its cluster.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A node told to expect three founding members waits for the other two for ever; SIGTERM
/// (and SIGINT) then stop it with exit code 0 instead of killing it or going unheard.
#[tokio::test]
async fn a_signal_while_waiting_for_the_cluster_stops_the_node_cleanly() {
    let dir = TestDir::new("signal_while_starting");
    for signal in [Signal::SIGTERM, Signal::SIGINT] {
        let mut command = tributary_command();
        command
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join(signal.as_str()))
            .arg("--client-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .arg("--http-addr")
            .arg(format!("127.0.0.1:{}", free_port()))
            .args(["--bootstrap-expect", "3"])
            .env(PEER_ADDR_ENV, format!("127.0.0.1:{}", free_port()))
            .stderr(Stdio::piped());
        let mut child = command.spawn().expect("the node starts");
        let mut lines = BufReader::new(child.stderr.take().expect("piped")).lines();
        let waiting = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = lines.next_line().await.expect("stderr is readable") {
                if line.contains("joining the cluster") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(
            waiting,
            Ok(true),
            "the node never logged that it is joining its cluster"
        );
        let pid = Pid::from_raw(child.id().expect("running") as i32);
        kill(pid, signal).expect("the node can be signalled");
        // Keep draining stderr so the node never blocks on a full pipe.
        let drain = tokio::spawn(async move {
            let mut rest = Vec::new();
            while let Ok(Some(line)) = lines.next_line().await {
                rest.push(line);
            }
            rest
        });
        let status = tokio::time::timeout(EXIT_TIMEOUT, child.wait())
            .await
            .unwrap_or_else(|_| panic!("the node still ran {EXIT_TIMEOUT:?} after {signal}"))
            .expect("the node can be waited for");
        let rest = drain.await.expect("the drain task ends");
        assert_eq!(
            status.code(),
            Some(0),
            "{signal} while starting: {status}; its last lines: {rest:#?}"
        );
        assert!(
            rest.iter()
                .any(|line| line.contains("received while starting")),
            "the node says why it stopped: {rest:#?}"
        );
    }
}
