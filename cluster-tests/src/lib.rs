//! Support for tests that run the real `tributary` binary as separate processes on
//! 127.0.0.1: find the binary, start and stop nodes, run CLI commands, seed randomness.
//!
//! The tests themselves live in `tests/it/` (one integration-test binary). Build the
//! binary first with `cargo build --bin tributary` (`scripts/test` does).
//!
//! Tests wait for a condition with [`eventually`] (or [`poll_until`]), and need a tool from
//! outside the workspace through [`require_tool`].

mod amqp_probe;
mod binary;
mod blob_probe;
mod cluster;
pub mod containers;
mod eventually;
mod http;
mod kafka_probe;
pub mod kafka_tools;
pub mod nemesis;
mod node_process;
mod probe_tls;
pub mod prometheus_tools;
pub mod python_tools;
mod raw;
mod require;
mod seed;
mod test_dir;
mod tls;

pub use amqp_probe::amqp_answers;
pub use binary::{
    CLI_TIMEOUT, binary_path, cli, cli_ok, describe_output, output_within, tributary_command,
    workspace_dir,
};
pub use blob_probe::{BLOB_PROBE_PATH, BlobResponse, blob_answers, blob_get};
pub use cluster::LocalCluster;
pub use eventually::{Deadline, POLL_INTERVAL, TimedOut, eventually, poll_until};
pub use http::{HttpResponse, http_get, http_post};
pub use kafka_probe::{KafkaBroker, kafka_answers, kafka_brokers};
pub use node_process::{AUTH_ENV, NodePorts, NodeProcess, PEER_ADDR_ENV, READY_TIMEOUT, free_port};
pub use probe_tls::TlsTrust;
pub use raw::{RawCodec, put_varint, root_connection_string};
pub use require::{REQUIRED_VALUE, Verdict, is_required, require_tool, verdict};
pub use seed::test_seed;
pub use test_dir::TestDir;
pub use tls::{NodeCert, TestCa};
