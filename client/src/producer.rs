//! Sending events.

use tributary_proto::v1 as proto;
use tributary_proto::v1::producer_client::ProducerClient as ProducerStub;
use tributary_proto::v1::send_request::Target;

use crate::ClientError;
use crate::client::require_name;
use crate::routing::Routing;

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
        };
        // Sends to an explicit partition go straight to its cached leader. Retrying after a
        // failover may store a batch twice (at-least-once) until producers are idempotent.
        let key = match &request.target {
            Some(Target::PartitionId(id)) => Some((event_hub.to_owned(), id.clone())),
            _ => None,
        };
        self.routing
            .call(key, |channel, endpoint| {
                let request = request.clone();
                async move {
                    ProducerStub::new(channel)
                        .send(request)
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|status| ClientError::from_status(status, &endpoint))
                }
            })
            .await
    }
}
