//! Sending events.

use std::collections::HashMap;
use std::sync::Arc;

use tributary_proto::v1 as proto;
use tributary_proto::v1::send_request::Target;

use crate::ClientError;
use crate::client::require_name;
use crate::routing::{PartitionKey, Routing};

/// Where a batch goes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum SendTarget {
    /// The service picks a partition, round robin.
    #[default]
    Any,
    /// This partition, e.g. `"0"`.
    PartitionId(String),
    /// The partition this key hashes to; events with the same key stay in order.
    PartitionKey(String),
}

/// Sends batches of events to event hubs. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ProducerClient {
    routing: Routing,
}

impl ProducerClient {
    pub(crate) fn new(routing: Routing) -> Self {
        ProducerClient { routing }
    }

    /// Appends `events` to one partition of `event_hub`, atomically: all of them land
    /// contiguously, in order, or none do. Returns the partition and the numbers assigned.
    ///
    /// Accepts the SDK's [`crate::EventData`] as well as the generated protobuf `EventData`.
    pub async fn send<E>(
        &self,
        event_hub: &str,
        target: SendTarget,
        events: impl IntoIterator<Item = E>,
    ) -> Result<proto::SendResponse, ClientError>
    where
        E: Into<proto::EventData>,
    {
        require_name("event hub name", event_hub)?;
        let target = match target {
            SendTarget::Any => None,
            SendTarget::PartitionId(id) => {
                require_name("partition id", &id)?;
                Some(Target::PartitionId(id))
            }
            SendTarget::PartitionKey(key) => Some(Target::PartitionKey(key)),
        };
        let events: Vec<proto::EventData> = events.into_iter().map(Into::into).collect();
        if events.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a send needs at least one event".into(),
            ));
        }
        let request = proto::SendRequest {
            event_hub: event_hub.to_owned(),
            target,
            events,
            producer_id: 0,
            producer_sequence: 0,
        };
        self.send_request(request).await
    }

    /// Sends one request, retrying transient failures. Without a producer id, a retry after
    /// a failover may store a batch twice (at-least-once); see [`IdempotentProducer`].
    async fn send_request(
        &self,
        request: proto::SendRequest,
    ) -> Result<proto::SendResponse, ClientError> {
        let event_hub = request.event_hub.clone();
        // Sends to an explicit partition go straight to its cached leader.
        let key = match &request.target {
            Some(Target::PartitionId(id)) => Some((event_hub.to_owned(), id.clone())),
            _ => None,
        };
        self.routing
            .call(key, |_, endpoint| {
                let request = request.clone();
                let session = self.routing.send_session(&endpoint);
                async move { session?.send(request).await }
            })
            .await
    }
}

/// An idempotent producer's next sequence in one partition; the lock serializes that
/// partition's sends.
type Sequence = Arc<tokio::sync::Mutex<i64>>;

/// A producer whose retries are safe: it numbers its batches per partition, and a partition
/// stores a retried batch once and answers it with the original reply (SPEC.md section 2,
/// idempotent publishing). Only partition-targeted sends; one batch per partition at a time.
#[derive(Debug, Clone)]
pub struct IdempotentProducer {
    producer: ProducerClient,
    producer_id: u64,
    /// Next sequence per (event hub, partition); the lock serializes a partition's sends.
    next: Arc<std::sync::Mutex<HashMap<PartitionKey, Sequence>>>,
}

impl IdempotentProducer {
    pub(crate) fn new(producer: ProducerClient) -> Self {
        IdempotentProducer {
            producer,
            // Non-zero: 0 means "not idempotent" on the wire.
            producer_id: rand::random::<u64>() | 1,
            next: Arc::default(),
        }
    }

    pub fn producer_id(&self) -> u64 {
        self.producer_id
    }

    /// Appends `events` to `partition_id` atomically, exactly once even when the call is
    /// retried across a failover.
    pub async fn send<E>(
        &self,
        event_hub: &str,
        partition_id: &str,
        events: impl IntoIterator<Item = E>,
    ) -> Result<proto::SendResponse, ClientError>
    where
        E: Into<proto::EventData>,
    {
        require_name("event hub name", event_hub)?;
        require_name("partition id", partition_id)?;
        let events: Vec<proto::EventData> = events.into_iter().map(Into::into).collect();
        if events.is_empty() {
            return Err(ClientError::InvalidArgument(
                "a send needs at least one event".into(),
            ));
        }
        let slot = self
            .next
            .lock()
            .expect("sequence lock")
            .entry((event_hub.to_owned(), partition_id.to_owned()))
            .or_default()
            .clone();
        let mut next = slot.lock().await;
        let count = events.len() as i64;
        let request = proto::SendRequest {
            event_hub: event_hub.to_owned(),
            target: Some(Target::PartitionId(partition_id.to_owned())),
            events,
            producer_id: self.producer_id,
            producer_sequence: *next,
        };
        let response = self.producer.send_request(request).await?;
        *next += count;
        Ok(response)
    }
}
