//! The broker's one protocol-neutral API. Every front end (gRPC today; AMQP, Kafka and the
//! Blob checkpoint endpoint next) decodes its protocol into these typed requests, makes one
//! call, and maps the one [`Error`] type back: routing, NOT_LEADER, throttling, limits and
//! the authorization check (keyed by the [`Credential`] the front end presents) happen here
//! and nowhere else.
//!
//! - [`send`](Service::send): publish events to a hub (round robin, partition key or id).
//! - [`read`](Service::read): a stream of committed events from a position, under Event Hubs'
//!   reader rules; partition properties and readers. [`fetch`](Service::fetch): one read
//!   from a sequence number, for clients that poll (Kafka).
//! - management: hubs, consumer groups, nodes, authorization rules, cluster status
//!   (`manage.rs`, `rules.rs`).
//! - the checkpoint store: ownership and checkpoints (`store.rs`), and as blobs for the Blob
//!   checkpoint endpoint (`blob.rs`); Kafka groups' coordinator and offsets (`kafka.rs`).
//! - diagnostics: what this node's own replica holds (`diagnostics.rs`).
//!
//! Calls run on this node; `tributary-forward` runs them on a partition's leader from any
//! node, for clients that know one endpoint.

mod blob;
mod diagnostics;
mod endpoints;
mod fetch;
mod kafka;
mod manage;
mod producer_ids;
mod read;
mod rules;
mod send;
mod store;

use std::sync::Arc;

use crate::auth::{Auth, Credential, Scope};
use crate::broker::Broker;
use crate::checkpoints::CheckpointStore;
use crate::error::Error;
use crate::placement::Placement;
use crate::readers::Readers;

pub use blob::{BLOB_METADATA_BYTES_MAX, BlobCondition, BlobKind, BlobPut, BlobView, BlobWrite};
pub use diagnostics::{REPLICA_EVENTS_PAGE_DEFAULT, REPLICA_EVENTS_PAGE_MAX, ReplicaEvents};
pub use endpoints::Endpoints;
pub use fetch::{FetchBatch, FetchRequest};
pub use kafka::{
    KAFKA_GROUP_ID_LEN_MAX, KAFKA_OFFSET_METADATA_BYTES_MAX, KafkaOffset, KafkaOffsetCommit,
    KafkaOffsetRecord,
};
pub use manage::{
    CaptureRequest, HubSettingsRequest, HubUpdateRequest, NewHubRequest, PlannedMove, RebalancePlan,
};
pub use read::{PartitionProperties, PartitionReaders, ReadBatch, ReadRequest, ReadStream};
pub use rules::{RuleKeyKind, RuleKeys};
pub use send::{SendReply, SendRequest};
pub use store::{Checkpoint, CheckpointUpdate, Claim, ClaimRequest, Ownership};

// The domain types the calls take and return.
pub use crate::broker::{KafkaAddrs, Target};
pub use crate::partition::ReadEvent;
pub use crate::partition::codec::{AMQP_EXTRAS_PROPERTY, EventRecord, Property};
pub use crate::partition::position::Position;
pub use crate::readers::ConnectedReader;
pub use crate::status::{
    ClusterStatus, NodeStatus, PartitionStatus, ReplicaMoveStatus, ReplicaStatus,
};
pub use producer_ids::{KafkaProducer, ProducerIds};
pub use tributary_controller::state::{CaptureSettings, CleanupPolicy, HubRecord};
pub use tributary_raft::{KafkaProducerStamp, Producer, ProducerStamp};
pub use tributary_types::{AuthorizationRule, Rights};

/// The broker's API; cheap to clone.
#[derive(Clone)]
pub struct Service {
    broker: Arc<Broker>,
    auth: Auth,
    store: Arc<dyn CheckpointStore>,
    placement: Arc<Placement>,
    readers: Arc<Readers>,
    /// Kafka producer ids this node hands out.
    producer_ids: Arc<ProducerIds>,
}

impl Service {
    pub fn new(
        broker: Arc<Broker>,
        auth: Auth,
        store: Arc<dyn CheckpointStore>,
        placement: Arc<Placement>,
    ) -> Service {
        Service {
            broker,
            auth,
            store,
            placement,
            readers: Readers::new(),
            producer_ids: Arc::default(),
        }
    }

    /// The authorization check every call makes first: passes when the credential grants
    /// `needed` on `scope` (or authorization is off).
    pub fn check(
        &self,
        credential: &Credential,
        scope: Scope<'_>,
        needed: Rights,
    ) -> Result<(), Error> {
        self.auth.check(credential, scope, needed)
    }

    /// The broker the calls run on.
    pub fn broker(&self) -> &Arc<Broker> {
        &self.broker
    }
}

impl Service {
    /// Whether calls are checked at all (`--auth sas`).
    pub fn auth_enabled(&self) -> bool {
        self.auth.enabled()
    }

    /// What a credential grants on a hub (or the namespace) now, once it is known to be
    /// valid for it: the rights among Send, Listen and Manage it passes the check for. A
    /// front end that authorizes once and acts later (an AMQP `$cbs` token) asks this;
    /// every later call is still checked. Refused as the check refuses a bad token.
    ///
    /// `entity` is the path the credential is presented for: nothing (the namespace), a
    /// hub, or a path within a hub such as `orders/consumergroups/$default`.
    pub fn granted_rights(&self, credential: &Credential, entity: &str) -> Result<Rights, Error> {
        let entity = entity.trim_matches('/');
        let scope = match entity.split_once('/') {
            _ if entity.is_empty() => Scope::Namespace,
            None => Scope::Hub(entity),
            Some((hub, path)) => Scope::HubPath(hub, path),
        };
        self.auth.granted(credential, scope)
    }
}

/// A request's consumer group: empty means `$Default`.
pub fn consumer_group(name: &str) -> &str {
    if name.is_empty() {
        tributary_types::DEFAULT_CONSUMER_GROUP
    } else {
        name
    }
}
