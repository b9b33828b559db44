//! In-process tests of the node crate: a node through its gRPC API, and capture files as
//! outside tools read them. One integration binary for the crate.

mod support;

mod auth;
mod bad_input;
mod buffered;
mod capture;
mod cleanup;
mod controller_log;
mod idempotent;
mod keys;
mod layout;
mod limits;
mod positions;
mod readers;
mod receive;
mod reconcile;
mod replication;
mod restart;
