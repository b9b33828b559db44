//! The one `tributary` binary: `serve` runs a node, `cert` makes TLS certificates; the other
//! subcommands are the CLI.

use clap::{Parser, Subcommand};
use tributary_client::cli::{CliCommand, CliGlobals};
use tributary_node::config::ServeArgs;

/// mimalloc rather than the system allocator: a send allocates and frees many small buffers
/// across threads (decoding, Raft entries, HTTP/2 frames), where glibc's malloc and free
/// took about 7% of a three-node cluster's CPU under waiting producers (`tributary bench
/// --in-flight 1`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Tributary: a self-hosted event streaming cluster with Event Hubs semantics.
#[derive(Parser)]
#[command(name = "tributary", version, about)]
struct Args {
    #[command(flatten)]
    globals: CliGlobals,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run a node (the default when no subcommand is given).
    Serve(Box<ServeArgs>),
    /// Measure send throughput and latency against a running node, or (`bench failover`)
    /// how fast partitions accept writes again after their leader is killed.
    Bench(tributary_bench::BenchArgs),
    /// Make a development certificate authority and node certificates signed by it (TLS
    /// on the client port, mutual TLS on the peer port).
    #[command(subcommand)]
    Cert(tributary_node::cert::CertCommand),
    /// Drain the node on this machine for a restart (from a Kubernetes preStop hook or
    /// systemd's ExecStop): its partition leaderships, and the controller's, move to other
    /// replicas and it reports itself not ready. It undrains itself when it next starts.
    /// Returns when drained; fails if leaderships remain at the timeout.
    Drain(tributary_node::restart_drain::DrainArgs),
    #[command(flatten)]
    Cli(CliCommand),
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime starts");
    let result = runtime.block_on(async move {
        match args
            .command
            .unwrap_or_else(|| Command::Serve(Box::default()))
        {
            Command::Serve(serve) => tributary_node::serve_until_signal(*serve).await,
            Command::Bench(bench) => {
                let json = args.globals.output == tributary_client::cli::OutputFormat::Json;
                tributary_bench::main(args.globals.endpoint_or_default(), bench, json).await
            }
            Command::Cert(cert) => {
                let json = args.globals.output == tributary_client::cli::OutputFormat::Json;
                tributary_node::cert::run(cert, std::time::SystemTime::now(), json)
            }
            Command::Drain(drain) => {
                let json = args.globals.output == tributary_client::cli::OutputFormat::Json;
                tributary_node::restart_drain::run_command(drain, json).await
            }
            Command::Cli(cmd) => tributary_client::cli::run(args.globals, cmd).await,
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err:#}");
            if err
                .downcast_ref::<tributary_node::StorageFailed>()
                .is_some()
            {
                // Exit at once: the runtime's tasks may wait on storage that never answers.
                std::process::exit(i32::from(tributary_node::StorageFailed::EXIT_CODE));
            }
            std::process::ExitCode::FAILURE
        }
    }
}
