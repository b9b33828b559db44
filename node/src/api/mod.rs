//! gRPC handlers: decode, call the broker, map errors. Protobuf types stop here.

pub mod auth;
pub mod checkpoints;
pub mod consumer;
pub mod convert;
pub mod diagnostics;
pub mod error;
pub mod management;
pub mod producer;
