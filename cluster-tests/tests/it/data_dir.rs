//! `tributary serve` refuses data directories it cannot use, and bad flags, with a message
//! a person can act on and a non-zero exit.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use tributary_cluster_tests::{
    NodeProcess, PEER_ADDR_ENV, TestDir, describe_output, free_port, output_within,
    tributary_command,
};

/// How long a node that should refuse to start may take to exit.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(30);
/// The conventional `nobody` user and group: unprivileged, owns nothing.
const NOBODY_ID: u32 = 65534;

#[tokio::test]
async fn data_dir_errors() {
    let dir = TestDir::new("data_dir_errors");
    not_writable(dir.path()).await;
    under_a_file(dir.path()).await;
    another_clusters_directory(dir.path()).await;
    bad_flag_value(dir.path()).await;
}

/// (a) A directory without write permission.
async fn not_writable(root: &Path) {
    let data_dir = root.join("read-only");
    std::fs::create_dir(&data_dir).unwrap();
    std::fs::set_permissions(&data_dir, std::fs::Permissions::from_mode(0o555)).unwrap();
    let probe = data_dir.join("probe");
    let output = if std::fs::write(&probe, b"x").is_err() {
        serve(&data_dir, &[]).await
    } else {
        // Privileged (root ignores permissions): run the node as `nobody` instead.
        eprintln!("this process ignores permissions; running the node as uid {NOBODY_ID}");
        std::fs::remove_file(&probe).unwrap();
        std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o755)).unwrap();
        match serve_as_nobody(&data_dir).await {
            Some(output) => output,
            None => return,
        }
    };
    let shown = data_dir.display().to_string();
    assert!(!output.status.success(), "{}", describe_output(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&shown) && stderr.contains("not writable"),
        "the error names the directory and the problem: {}",
        describe_output(&output)
    );
}

/// (a') A data directory that cannot be created because its parent is a file: this one
/// fails for root too.
async fn under_a_file(root: &Path) {
    let file = root.join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let data_dir = file.join("data");
    let output = serve(&data_dir, &[]).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(&data_dir.display().to_string()),
        "the error names the directory: {}",
        describe_output(&output)
    );
}

/// (b) A directory claimed by cluster 'alpha' is refused to cluster 'beta', and stays usable
/// for 'alpha'.
async fn another_clusters_directory(root: &Path) {
    let data_dir = root.join("alpha-node");
    let mut node = NodeProcess::start_with_args(&data_dir, &["--cluster-id", "alpha"]).await;
    let status = node.terminate().await;
    assert_eq!(status.code(), Some(0), "{status}");

    let output = serve(&data_dir, &["--cluster-id", "beta"]).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("belongs to cluster 'alpha'"),
        "{}",
        describe_output(&output)
    );

    node.restart().await;
    let status = node.terminate().await;
    assert_eq!(status.code(), Some(0), "{status}");
}

/// (c) A flag value that does not parse.
async fn bad_flag_value(root: &Path) {
    let data_dir = root.join("never-created");
    let mut command = tributary_command();
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(&data_dir)
        .args(["--client-addr", "nonsense"]);
    let output = output_within(command, REFUSAL_TIMEOUT).await;
    assert!(!output.status.success(), "{}", describe_output(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("nonsense") && stderr.contains("--client-addr"),
        "the error names the flag and the value: {}",
        describe_output(&output)
    );
    assert!(
        !data_dir.exists(),
        "a refused start must not create the data directory"
    );
}

/// Runs `tributary serve` on `data_dir` with free ports and `args`; it is expected to exit.
async fn serve(data_dir: &Path, args: &[&str]) -> Output {
    output_within(serve_command(data_dir, args), REFUSAL_TIMEOUT).await
}

fn serve_command(data_dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tributary_command();
    command
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--client-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .arg("--http-addr")
        .arg(format!("127.0.0.1:{}", free_port()))
        .env(PEER_ADDR_ENV, format!("127.0.0.1:{}", free_port()))
        .args(args);
    command
}

/// `serve` as the `nobody` user, or `None` (with a printed note) if this process cannot
/// switch users.
async fn serve_as_nobody(data_dir: &Path) -> Option<Output> {
    let mut command = serve_command(data_dir, &[]);
    command.as_std_mut().uid(NOBODY_ID).gid(NOBODY_ID);
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            eprintln!(
                "SKIPPED the unwritable-directory check: permissions do not stop this process \
                 (running privileged) and it cannot run the node as uid {NOBODY_ID}: {e}"
            );
            return None;
        }
    };
    let output = tokio::time::timeout(REFUSAL_TIMEOUT, child.wait_with_output())
        .await
        .expect("serve as nobody exits")
        .expect("serve as nobody can be waited for");
    Some(output)
}
