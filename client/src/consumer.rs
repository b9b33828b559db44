//! Reading a partition.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::Stream;
use tributary_proto::v1 as proto;
use tributary_proto::v1::consumer_client::ConsumerClient as ConsumerStub;

use crate::client::require_name;
use crate::routing::Routing;
use crate::{ClientError, EventPosition, ReceivedEvent};

/// Reads partitions of event hubs on behalf of a consumer group. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConsumerClient {
    routing: Routing,
}

impl ConsumerClient {
    pub(crate) fn new(routing: Routing) -> Self {
        ConsumerClient { routing }
    }

    /// Starts reading `partition_id` of `event_hub` from `position`. The stream yields batches
    /// of at most `max_batch` events (0: the service default, 300) in partition order; when the
    /// reader is caught up it waits for new events. It ends on error or when the service
    /// closes it (e.g. a reader with a higher owner level took over); dropping it stops the
    /// read. An empty `consumer_group` means `$Default`.
    pub async fn receive(
        &self,
        event_hub: &str,
        consumer_group: &str,
        partition_id: &str,
        position: EventPosition,
        max_batch: u32,
    ) -> Result<ReceiveStream, ClientError> {
        require_name("event hub name", event_hub)?;
        require_name("partition id", partition_id)?;
        let request = proto::ReceiveRequest {
            event_hub: event_hub.to_owned(),
            consumer_group: consumer_group.to_owned(),
            partition_id: partition_id.to_owned(),
            position: Some(position.into()),
            max_batch,
        };
        let key = (event_hub.to_owned(), partition_id.to_owned());
        self.routing
            .call(Some(key), |channel, endpoint| {
                let request = request.clone();
                async move {
                    let inner = ConsumerStub::new(channel)
                        .receive(request)
                        .await
                        .map_err(|status| ClientError::from_status(status, &endpoint))?
                        .into_inner();
                    Ok(ReceiveStream {
                        inner,
                        endpoint,
                        last_enqueued_sequence_number: None,
                    })
                }
            })
            .await
    }
}

/// The batches of one read, in partition order. See [`ConsumerClient::receive`].
pub struct ReceiveStream {
    inner: tonic::Streaming<proto::ReceiveResponse>,
    endpoint: Arc<str>,
    last_enqueued_sequence_number: Option<i64>,
}

impl ReceiveStream {
    /// The partition's last enqueued sequence number as of the latest batch (-1 when the
    /// partition has never held an event); `None` before the first batch. Tells how far the
    /// reader is behind.
    pub fn last_enqueued_sequence_number(&self) -> Option<i64> {
        self.last_enqueued_sequence_number
    }
}

impl std::fmt::Debug for ReceiveStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiveStream")
            .field("endpoint", &self.endpoint)
            .field(
                "last_enqueued_sequence_number",
                &self.last_enqueued_sequence_number,
            )
            .finish_non_exhaustive()
    }
}

impl Stream for ReceiveStream {
    type Item = Result<Vec<ReceivedEvent>, ClientError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Ready(Some(Err(status))) => {
                Poll::Ready(Some(Err(ClientError::from_status(status, &this.endpoint))))
            }
            Poll::Ready(Some(Ok(response))) => {
                this.last_enqueued_sequence_number = Some(response.last_enqueued_sequence_number);
                let events = response
                    .events
                    .into_iter()
                    .map(ReceivedEvent::from)
                    .collect();
                Poll::Ready(Some(Ok(events)))
            }
        }
    }
}
