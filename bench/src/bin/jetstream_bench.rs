//! `jetstream-bench`: `tributary bench`'s load against a NATS JetStream cluster, for the
//! side-by-side figures of `bench/compare`. `--help` lists the flags.

use std::process::ExitCode;

use clap::Parser as _;
use tributary_bench::jetstream::{JetStreamArgs, run};

#[tokio::main]
async fn main() -> ExitCode {
    let args = JetStreamArgs::parse();
    match run(args).await {
        Ok(_) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("jetstream-bench: {error:#}");
            ExitCode::FAILURE
        }
    }
}
