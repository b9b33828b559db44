//! In-process tests of a node through its gRPC API: one integration binary for the crate.

mod support;

mod bad_input;
mod buffered;
mod idempotent;
mod keys;
mod positions;
mod readers;
mod receive;
mod reconcile;
mod replication;
mod restart;
