//! Tests that run the real `tributary` binary as separate processes on 127.0.0.1.
//! Build the binary first: `cargo build --bin tributary` (or set `TRIBUTARY_BIN`).

mod advertise;
mod auth;
mod bench;
mod bench_failover;
mod capture;
mod cert;
mod chart;
mod checkpoint_store;
mod cli;
mod compose;
mod controller_restart;
mod crash;
mod data_dir;
mod drain;
mod failover;
mod fuzz;
mod group_show;
mod help;
mod idempotent;
mod load;
mod placement;
mod processor;
mod prometheus;
mod receive_failover;
mod rejoin;
mod replication;
mod retention;
mod rolling_restart;
mod sas_interop;
mod script;
mod shutdown;
mod signals;
mod throughput;
mod tls;
mod watch;
