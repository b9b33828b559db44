//! The broker: the partitions on this node (each a Raft group, `tributary-partition`: state
//! machine, appender, positions, retention, compaction; throttling, capture) and the node's view of them
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
/// The partitions' Raft groups, in a crate of their own (`broker/partition/`).
pub use tributary_partition as partition;
pub use tributary_partition::group;
pub mod placement;
pub mod readers;
pub mod retention;
pub mod service;
pub mod status;

pub use auth::{Auth, Credential, Scope};
pub use broker::{Broker, BrokerLimits, Target};
pub use error::{Error, ErrorKind};
pub use service::Service;
