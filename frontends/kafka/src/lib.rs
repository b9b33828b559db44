//! The Kafka protocol front end: Kafka clients (librdkafka and kcat, kafka-python, aiokafka)
//! produce to event hubs unchanged. Topic = event hub, partition = partition, Kafka offset =
//! sequence number; a record's key is the event's partition key, its value the body, its
//! headers the properties.
//!
//! Served so far: ApiVersions, SASL PLAIN (`$ConnectionString` and a connection string, or
//! a rule's name and key), Metadata (this node as the one broker; sends and fetches are
//! forwarded to each partition's leader), Produce (acks 0, 1 and all, every codec), Fetch
//! (long polls, at least one event per partition) and ListOffsets (earliest and latest).
//! Consumer groups with the classic protocol (`groups.rs`): the node leading the controller
//! group coordinates every group, in memory (`coordinator.rs`); committed offsets are
//! replicated in the controller's consumer store. ListOffsets by time and the idempotent
//! producer are not served yet: a request for an API this server does not list in
//! ApiVersions closes the connection.
//!
//! Decoding untrusted bytes: kafka-protocol reserves an array's declared length before
//! reading it (`Vec::with_capacity(n)` with `n` from the request), so `guard.rs` walks every
//! request body first and refuses arrays longer than the request, and `records.rs` bounds
//! each batch's declared record count. Still open, and why the listeners are off unless
//! asked for (`--kafka-addr`): a record's declared header count is reserved the same way
//! inside the record decoder, and compressed batches are decompressed without a size cap.

pub mod apis;
pub mod connection;
pub mod coordinator;
mod fetch;
pub mod frame;
mod groups;
mod guard;
mod handlers;
pub mod listener;
pub use groups::Groups;
mod records;
pub mod sasl;

use std::sync::Arc;

use tributary_forward::AnyNode;
use tributary_types::Clock;

/// What every connection of a node's Kafka listeners shares.
pub struct KafkaContext {
    pub node: AnyNode,
    /// The node id clients see as the broker's.
    pub node_id: i32,
    /// The address clients are told to connect to (`--advertise-kafka-addr`, else the
    /// listener's): host and port.
    pub advertised: (String, u16),
    /// The largest request frame read.
    pub request_bytes_max: usize,
    pub clock: Arc<dyn Clock>,
    /// The Kafka consumer groups this node coordinates (while it leads the controller
    /// group).
    pub groups: groups::Groups,
}
