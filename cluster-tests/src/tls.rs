//! Certificates for nodes started with TLS, made by the binary's `tributary cert`.

use std::path::{Path, PathBuf};

use crate::binary::{CLI_TIMEOUT, describe_output, output_within, tributary_command};

/// A CA (`tributary cert ca`) in its own directory, and the node certificates it signs.
pub struct TestCa {
    dir: PathBuf,
}

/// A node certificate and its key.
#[derive(Debug, Clone)]
pub struct NodeCert {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TestCa {
    /// Makes CA `name` in `<dir>/<name>`.
    pub async fn new(dir: &Path, name: &str) -> TestCa {
        let dir = dir.join(name);
        run_cert(&[
            "ca",
            "--out",
            dir.to_str().expect("UTF-8 path"),
            "--name",
            name,
        ])
        .await;
        TestCa { dir }
    }

    /// The CA's certificate: `--peer-ca`, `--ca-cert`.
    pub fn ca_pem(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Makes (or with a new key and serial, remakes) node certificate `name`, valid for
    /// 127.0.0.1 and localhost, naming node `node_id` (needed on the peer port).
    pub async fn node_cert(&self, name: &str, node_id: Option<u64>) -> NodeCert {
        let out = self.dir.join("nodes");
        let node_id = node_id.map(|id| id.to_string());
        let node_id_args = match &node_id {
            Some(id) => vec!["--node-id", id.as_str()],
            None => Vec::new(),
        };
        run_cert(
            &[
                &["node"][..],
                &node_id_args,
                &[
                    "--ca",
                    self.dir.to_str().expect("UTF-8 path"),
                    "--out",
                    out.to_str().expect("UTF-8 path"),
                    "--name",
                    name,
                    "--ip",
                    "127.0.0.1",
                    "--dns",
                    "localhost",
                    "--force",
                ][..],
            ]
            .concat(),
        )
        .await;
        NodeCert {
            cert: out.join(format!("{name}.pem")),
            key: out.join(format!("{name}.key")),
        }
    }
}

impl NodeCert {
    /// `serve` flags for TLS on the client port with this certificate.
    pub fn client_port_args(&self) -> Vec<String> {
        vec![
            "--tls-cert".into(),
            path_text(&self.cert),
            "--tls-key".into(),
            path_text(&self.key),
        ]
    }

    /// `serve` flags for mutual TLS on the peer port with this certificate, from `ca`.
    pub fn peer_port_args(&self, ca: &TestCa) -> Vec<String> {
        vec![
            "--peer-ca".into(),
            path_text(&ca.ca_pem()),
            "--peer-cert".into(),
            path_text(&self.cert),
            "--peer-key".into(),
            path_text(&self.key),
        ]
    }
}

fn path_text(path: &Path) -> String {
    path.to_str().expect("UTF-8 path").to_owned()
}

async fn run_cert(args: &[&str]) {
    let mut command = tributary_command();
    command.arg("cert").args(args);
    let output = output_within(command, CLI_TIMEOUT).await;
    assert!(
        output.status.success(),
        "`tributary cert {}` failed: {}",
        args.join(" "),
        describe_output(&output)
    );
}
