//! `tributary cert`: the binary makes a CA and a node certificate, prints where, and refuses
//! what a person should fix.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Output;

use serde_json::Value;
use tributary_cluster_tests::{
    CLI_TIMEOUT, TestDir, describe_output, output_within, tributary_command,
};

async fn cert(args: &[&str]) -> Output {
    let mut command = tributary_command();
    command.arg("cert").args(args);
    output_within(command, CLI_TIMEOUT).await
}

async fn cert_ok(args: &[&str]) -> String {
    let output = cert(args).await;
    assert!(
        output.status.success(),
        "`tributary cert {}` failed: {}",
        args.join(" "),
        describe_output(&output)
    );
    String::from_utf8(output.stdout).expect("the CLI prints UTF-8")
}

async fn cert_fails(args: &[&str]) -> String {
    let output = cert(args).await;
    assert!(
        !output.status.success(),
        "`tributary cert {}` succeeded: {}",
        args.join(" "),
        describe_output(&output)
    );
    String::from_utf8(output.stderr).expect("the CLI prints UTF-8")
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .expect("file exists")
        .permissions()
        .mode()
        & 0o777
}

#[tokio::test]
async fn cert_makes_a_ca_and_a_node_certificate() {
    let dir = TestDir::new("cert_makes_a_ca_and_a_node_certificate");
    let ca_dir = dir.path().join("ca");
    let out_dir = dir.path().join("certs");
    let ca_text = ca_dir.to_str().unwrap();
    let out_text = out_dir.to_str().unwrap();

    let printed = cert_ok(&[
        "ca", "--out", ca_text, "--name", "Test CA", "--output", "json",
    ])
    .await;
    let ca: Value = serde_json::from_str(printed.trim()).expect("one JSON object");
    assert_eq!(
        ca["certificate"],
        ca_dir.join("ca.pem").to_str().unwrap(),
        "{ca}"
    );
    assert_eq!(ca["key"], ca_dir.join("ca.key").to_str().unwrap(), "{ca}");
    assert_eq!(mode(&ca_dir.join("ca.key")), 0o600);

    let printed = cert_ok(&[
        "node",
        "--ca",
        ca_text,
        "--out",
        out_text,
        "--name",
        "node-1",
        "--dns",
        "node-1.local",
        "--ip",
        "127.0.0.1",
        "--ip",
        "::1",
        "--days",
        "7",
    ])
    .await;
    let pem = out_dir.join("node-1.pem");
    let key = out_dir.join("node-1.key");
    assert_eq!(
        printed,
        format!("wrote {}\nwrote {}\n", pem.display(), key.display())
    );
    let chain = std::fs::read_to_string(&pem).unwrap();
    assert_eq!(
        chain.matches("-----BEGIN CERTIFICATE-----").count(),
        2,
        "{chain}"
    );
    assert!(chain.ends_with(&std::fs::read_to_string(ca_dir.join("ca.pem")).unwrap()));
    assert!(
        std::fs::read_to_string(&key)
            .unwrap()
            .starts_with("-----BEGIN PRIVATE KEY-----")
    );
    assert_eq!(mode(&key), 0o600);

    // Existing files stay unless --force.
    let refused = cert_fails(&["ca", "--out", ca_text]).await;
    assert!(refused.contains("ca.pem exists; pass --force"), "{refused}");
    cert_ok(&["ca", "--out", ca_text, "--force"]).await;

    let bad_ip = cert_fails(&[
        "node",
        "--ca",
        ca_text,
        "--out",
        out_text,
        "--name",
        "n2",
        "--ip",
        "localhost",
    ])
    .await;
    assert!(bad_ip.contains("--ip"), "{bad_ip}");
    let no_ca = cert_fails(&["node", "--ca", out_text, "--out", out_text, "--name", "n2"]).await;
    assert!(no_ca.contains("cannot read the CA certificate"), "{no_ca}");
    assert!(!out_dir.join("n2.key").exists());
}
