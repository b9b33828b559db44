//! The broker: the partitions on this node (each a Raft group: state machine, appender,
//! positions, retention, compaction, throttling, capture) and the node's view of them
//! (local replicas, leadership, routing), behind one protocol-neutral [`Service`] that every
//! front end (gRPC, AMQP, Kafka, Blob) calls: typed requests and replies, one [`Error`],
//! and the authorization check inside it.

pub mod auth;
pub mod broker;
pub mod capture;
pub mod checkpoints;
pub mod cluster;
pub mod disk;
pub mod error;
pub mod fault;
pub mod group;
pub mod partition;
pub mod placement;
pub mod readers;
pub mod retention;
pub mod service;
pub mod status;

pub use auth::{Auth, Credential, Scope};
pub use broker::{Broker, BrokerLimits, Target};
pub use error::{Error, ErrorKind};
pub use service::Service;
