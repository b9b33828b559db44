//! Where the `tributary` binary is, and running it as a CLI.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// How long one CLI command may run before the test gives up on it.
pub const CLI_TIMEOUT: Duration = Duration::from_secs(60);

/// The workspace root: the parent of this crate's folder.
pub fn workspace_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cluster-tests/ sits inside the workspace")
        .to_path_buf()
}

/// `$TRIBUTARY_BIN` if set, else `<target dir>/debug/tributary`, where the target dir is
/// `$CARGO_TARGET_DIR` (relative to the workspace when relative) or `<workspace>/target`.
///
/// Panics with instructions when the binary is missing: these tests run the real binary and
/// do not build it themselves.
pub fn binary_path() -> PathBuf {
    let path = match std::env::var_os("TRIBUTARY_BIN") {
        Some(path) => PathBuf::from(path),
        None => {
            let target_dir = match std::env::var_os("CARGO_TARGET_DIR") {
                Some(dir) => workspace_dir().join(dir),
                None => workspace_dir().join("target"),
            };
            target_dir.join("debug").join("tributary")
        }
    };
    assert!(
        path.is_file(),
        "the tributary binary is missing at {}; build it with `cargo build --bin tributary` \
         (or point TRIBUTARY_BIN at a built binary)",
        path.display()
    );
    path
}

/// A command running the binary with a clean environment: no inherited `TRIBUTARY_*`
/// settings (they would override nothing we pass but could add settings we do not expect),
/// except `TRIBUTARY_LOG` for debugging; no colours in logs. Killed if dropped.
///
/// `serve` listens for AMQP on 127.0.0.1:5672, for Blob on 127.0.0.1:10000 and for Kafka on
/// 127.0.0.1:9092 by default, ports concurrent tests would share: the command turns them
/// off (`TRIBUTARY_AMQP_ADDR=none`, `TRIBUTARY_BLOB_ADDR=none`, `TRIBUTARY_KAFKA_ADDR=none`)
/// unless the caller sets its own
/// ([`crate::NodeProcess`] gives each node free ports).
pub fn tributary_command() -> tokio::process::Command {
    tributary_command_at(&binary_path())
}

/// [`tributary_command`] for the binary at `binary` (e.g. an earlier release's).
pub fn tributary_command_at(binary: &Path) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(binary);
    for (name, _) in std::env::vars_os() {
        let name_text = name.to_string_lossy();
        if name_text.starts_with("TRIBUTARY_") && name_text != "TRIBUTARY_LOG" {
            command.env_remove(&name);
        }
    }
    command
        .env("NO_COLOR", "1")
        .env("TRIBUTARY_AMQP_ADDR", "none")
        .env("TRIBUTARY_BLOB_ADDR", "none")
        .env("TRIBUTARY_KAFKA_ADDR", "none")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

/// Runs `tributary --endpoint <endpoint> <args...>` and returns its output. Panics if it
/// does not finish within [`CLI_TIMEOUT`].
pub async fn cli(endpoint: &str, args: &[&str]) -> Output {
    let mut command = tributary_command();
    command.arg("--endpoint").arg(endpoint).args(args);
    output_within(command, CLI_TIMEOUT).await
}

/// Like [`cli`], for a command that must succeed: panics with its output otherwise, and
/// returns its stdout.
pub async fn cli_ok(endpoint: &str, args: &[&str]) -> String {
    let output = cli(endpoint, args).await;
    assert!(
        output.status.success(),
        "`tributary {}` failed: {}",
        args.join(" "),
        describe_output(&output)
    );
    String::from_utf8(output.stdout).expect("the CLI prints UTF-8")
}

/// Exit status, stdout and stderr, for assertion messages.
pub fn describe_output(output: &Output) -> String {
    format!(
        "{}
--- stdout:\n{}--- stderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Runs `command` to completion, capturing stdout and stderr. Panics if it cannot be started
/// or is still running after `timeout`. The command runs in a process group of its own, which
/// is killed whole on the timeout: what it started (a bench's nodes) goes with it rather than
/// running on and slowing the tests after it.
pub async fn output_within(mut command: tokio::process::Command, timeout: Duration) -> Output {
    let described = format!("{:?}", command.as_std());
    command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let child = command
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {described}: {e}"));
    let group = child.id().map(|id| Pid::from_raw(id as i32));
    match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(output) => output.unwrap_or_else(|e| panic!("cannot wait for {described}: {e}")),
        Err(_elapsed) => {
            if let Some(group) = group {
                let _ = killpg(group, Signal::SIGKILL);
            }
            panic!("{described} still ran after {timeout:?}; killed it and its process group")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{TestDir, eventually};

    /// Whether `pid` is gone (or only a zombie waiting to be reaped).
    fn gone(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| rest.trim_start().starts_with('Z'))
        })
    }

    #[tokio::test]
    async fn a_command_past_its_timeout_is_killed_with_what_it_started() {
        let dir = TestDir::new("output-within");
        let pid_file = dir.path().join("grandchild.pid");
        let mut command = tokio::process::Command::new("sh");
        command.arg("-c").arg(format!(
            "sleep 600 & echo $! > {}; wait",
            pid_file.display()
        ));
        let outcome = tokio::spawn(output_within(command, Duration::from_millis(500))).await;
        assert!(
            outcome.is_err_and(|e| e.is_panic()),
            "the timeout is reported"
        );
        let pid: i32 = std::fs::read_to_string(&pid_file)
            .expect("the command wrote its child's pid")
            .trim()
            .parse()
            .expect("a pid");
        eventually(
            Duration::from_secs(10),
            "the command's own child is killed too",
            async || {
                if gone(pid) {
                    Ok(())
                } else {
                    Err(format!("pid {pid} runs"))
                }
            },
        )
        .await;
    }
}
