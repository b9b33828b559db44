//! Support for tests that run the real `tributary` binary as separate processes on
//! 127.0.0.1: find the binary, start and stop nodes, run CLI commands, seed randomness.
//!
//! The tests themselves live in `tests/it/` (one integration-test binary). Build the
//! binary first with `cargo build --bin tributary` (`scripts/test` does).

mod binary;
mod cluster;
pub mod containers;
mod http;
pub mod nemesis;
mod node_process;
pub mod prometheus_tools;
pub mod python_tools;
mod raw;
mod seed;
mod test_dir;
mod tls;

pub use binary::{
    CLI_TIMEOUT, binary_path, cli, cli_ok, describe_output, output_within, tributary_command,
    workspace_dir,
};
pub use cluster::LocalCluster;
pub use http::{HttpResponse, http_get, http_post};
pub use node_process::{AUTH_ENV, NodePorts, NodeProcess, PEER_ADDR_ENV, READY_TIMEOUT, free_port};
pub use raw::{RawCodec, root_connection_string};
pub use seed::test_seed;
pub use test_dir::TestDir;
pub use tls::{NodeCert, TestCa};
