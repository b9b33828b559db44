//! The Kafka protocol front end: Kafka clients (librdkafka and kcat, kafka-python, aiokafka)
//! produce to event hubs unchanged. Topic = event hub, partition = partition, Kafka offset =
//! sequence number; a record's key is the event's partition key, its value the body, its
//! headers the properties.
//!
//! Served so far: ApiVersions, SASL PLAIN (`$ConnectionString` and a connection string, or
//! a rule's name and key), Metadata (every node a broker at its advertised address, each
//! partition's leader as its replicas report: `directory.rs`), Produce (acks 0, 1 and all,
//! every codec; a send reaching a node that does not lead the partition gets
//! NOT_LEADER_OR_FOLLOWER, or is passed on when clients cannot reach the leader), Fetch
//! (long polls, at least one event per partition), ListOffsets (earliest, latest, by
//! time), DescribeConfigs, CreateTopics, the idempotent producer (InitProducerId; each
//! partition's state machine checks every producer's sequence numbers, see
//! `tributary_partition::kafka_producers`) and consumer groups with the classic protocol
//! (`groups.rs`: the node leading the controller group coordinates every group, in memory
//! (`coordinator.rs`); committed offsets are replicated in the controller's consumer
//! store). A request for an API this server does not list in ApiVersions closes the
//! connection.
//!
//! Decoding untrusted bytes: kafka-protocol reserves an array's declared length before
//! reading it (`Vec::with_capacity(n)` with `n` from the request), so `guard.rs` walks every
//! request body first and refuses arrays longer than the request. Record batches are read
//! by `records.rs`, which checks every declared count against the bytes left and
//! decompresses within the request's budget.

mod admin;
pub mod apis;
pub mod connection;
pub mod coordinator;
pub mod directory;
mod fetch;
pub mod frame;
mod groups;
mod guard;
mod handlers;
pub mod listener;
mod producers;
pub use groups::Groups;
mod records;
pub mod sasl;

use std::sync::Arc;

use tributary_broker::service::Service;
use tributary_forward::AnyNode;
use tributary_types::Clock;

use crate::directory::Directory;

/// What every connection of one of a node's Kafka listeners shares.
pub struct KafkaContext {
    /// The broker's service from any node. A call reaching a node that does not lead its
    /// partition fails with NOT_LEADER_OR_FOLLOWER when the client can reach the leader over
    /// this listener (it refreshes Metadata and goes there), and is passed on to the leader
    /// otherwise (no leader elected yet, or one without such a listener).
    pub node: AnyNode,
    /// Whether this is the TLS listener: Metadata then lists the nodes' TLS addresses.
    pub tls: bool,
    /// The address clients are told to connect to for this listener
    /// (`--advertise-kafka-addr` or `--advertise-kafka-tls-addr`, else the bound one).
    pub advertised: (String, u16),
    /// The other nodes' addresses and the partitions' leaders (shared by both listeners).
    pub directory: Arc<Directory>,
    /// The largest request frame read.
    pub request_bytes_max: usize,
    pub clock: Arc<dyn Clock>,
    /// The Kafka consumer groups this node coordinates while it leads the controller group
    /// (shared by both listeners).
    pub groups: Arc<groups::Groups>,
}

/// What a node's Kafka listeners are built from.
pub struct KafkaSettings {
    pub service: Service,
    pub directory: Arc<Directory>,
    pub groups: Arc<groups::Groups>,
    pub request_bytes_max: usize,
    pub clock: Arc<dyn Clock>,
}

impl KafkaContext {
    /// The context of one listener: `tls` says which, `advertised` is its address for
    /// clients.
    pub fn new(settings: &KafkaSettings, tls: bool, advertised: (String, u16)) -> KafkaContext {
        let me = settings.service.broker().runtime().me.id;
        let directory = settings.directory.clone();
        let node = AnyNode::new(settings.service.clone()).redirecting(move |err| {
            directory::names_reachable_leader(err, me, directory.last().as_deref(), tls)
        });
        KafkaContext {
            node,
            tls,
            advertised,
            directory: settings.directory.clone(),
            request_bytes_max: settings.request_bytes_max,
            clock: settings.clock.clone(),
            groups: settings.groups.clone(),
        }
    }

    /// This node's id, the broker id clients see.
    pub fn me(&self) -> u64 {
        self.node.service().broker().runtime().me.id
    }
}
