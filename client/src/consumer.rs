//! Reading a partition, resuming the read when the partition's leader moves.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use crate::routing::Channel;
use futures::Stream;
use tributary_proto::v1 as proto;
use tributary_proto::v1::ErrorReason;
use tributary_proto::v1::consumer_client::ConsumerClient as ConsumerStub;
use tributary_proto::v1::management_client::ManagementClient as ManagementStub;

use crate::client::require_name;

/// Largest receive reply accepted: one event of the largest publication a node may be
/// configured to accept (64 MiB), with room for its properties and framing. Nodes end a
/// reply at 1 MiB of bodies, so only a single large event comes near it.
const RECEIVE_REPLY_BYTES_MAX: usize = 65 * 1024 * 1024;
use crate::routing::{PartitionKey, Routing, backoff};
use crate::{ClientError, EventPosition, ReceivedEvent};

/// Reads partitions of event hubs on behalf of a consumer group. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ConsumerClient {
    routing: Routing,
}

/// How a reader connects.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReceiveOptions {
    /// Events per batch at most; 0: the service default (300).
    pub max_batch: u32,
    /// Owner level (Event Hubs' epoch): the reader displaces connected readers of the consumer
    /// group's partition with an equal or lower level and readers without one, whose streams
    /// end with [`tributary_proto::ErrorReason::ReaderDisconnected`]; it is refused while a
    /// reader with a higher level is connected. Without one, at most 5 readers per consumer
    /// group and partition.
    pub owner_level: Option<i64>,
    /// Shown to other readers in quota and displacement errors.
    pub reader_name: String,
}

impl ConsumerClient {
    pub(crate) fn new(routing: Routing) -> Self {
        ConsumerClient { routing }
    }

    /// Starts reading `partition_id` of `event_hub` from `position`. The stream yields batches
    /// of at most `max_batch` events (0: the service default, 300) in partition order; when the
    /// reader is caught up it waits for new events. An empty `consumer_group` means
    /// `$Default`.
    ///
    /// When the read breaks for a transient reason (the partition's leader moved or its node
    /// went away), the stream reconnects to the new leader by itself and continues after the
    /// last event it yielded: no event is skipped or repeated. Each reconnection retries
    /// for as long as any other call (see [`crate::Client::with_retry_deadline`]; with
    /// retries off the stream does not resume). The stream ends with an error it cannot
    /// recover from, or when the service closes it (e.g. a reader with a higher owner level
    /// took over); dropping it stops the read.
    pub async fn receive(
        &self,
        event_hub: &str,
        consumer_group: &str,
        partition_id: &str,
        position: EventPosition,
        max_batch: u32,
    ) -> Result<ReceiveStream, ClientError> {
        let options = ReceiveOptions {
            max_batch,
            ..ReceiveOptions::default()
        };
        self.receive_with(event_hub, consumer_group, partition_id, position, options)
            .await
    }

    /// [`ConsumerClient::receive`] with an owner level and a reader name (see
    /// [`ReceiveOptions`]).
    pub async fn receive_with(
        &self,
        event_hub: &str,
        consumer_group: &str,
        partition_id: &str,
        position: EventPosition,
        options: ReceiveOptions,
    ) -> Result<ReceiveStream, ClientError> {
        let ReceiveOptions {
            max_batch,
            owner_level,
            reader_name,
        } = options;
        require_name("event hub name", event_hub)?;
        require_name("partition id", partition_id)?;
        let reader = Arc::new(Reader {
            routing: self.routing.clone(),
            request: proto::ReceiveRequest {
                event_hub: event_hub.to_owned(),
                consumer_group: consumer_group.to_owned(),
                partition_id: partition_id.to_owned(),
                position: None,
                max_batch,
                owner_level,
                reader_name,
            },
        });
        let resumable = !self.routing.retry_deadline().is_zero();
        // "Latest" names a different place each time it is asked: pin it to the current
        // end first, so a resumed read cannot skip what arrived in between.
        let start = match position {
            EventPosition::Latest if resumable => reader.current_end().await?,
            position => position,
        };
        let (inner, endpoint) = reader.open(start).await?;
        Ok(ReceiveStream {
            reader,
            start,
            resumable,
            state: State::Open(Box::new(inner)),
            endpoint,
            last_delivered: None,
            reconnects: 0,
            last_enqueued_sequence_number: None,
        })
    }
}

/// What a reader asks for; [`Reader::open`] sends it with a position.
#[derive(Debug)]
struct Reader {
    routing: Routing,
    request: proto::ReceiveRequest,
}

type Opened = (tonic::Streaming<proto::ReceiveResponse>, Arc<str>);

impl Reader {
    fn partition(&self) -> PartitionKey {
        (
            self.request.event_hub.clone(),
            self.request.partition_id.clone(),
        )
    }

    /// Opens a read at `position` on the partition's leader.
    async fn open(&self, position: EventPosition) -> Result<Opened, ClientError> {
        let request = proto::ReceiveRequest {
            position: Some(position.into()),
            ..self.request.clone()
        };
        self.routing
            .call(Some(self.partition()), |channel: Channel, endpoint| {
                let request = request.clone();
                async move {
                    let inner = ConsumerStub::new(channel)
                        .max_decoding_message_size(RECEIVE_REPLY_BYTES_MAX)
                        .receive(request)
                        .await
                        .map_err(|status| ClientError::from_status(status, &endpoint))?
                        .into_inner();
                    Ok((inner, endpoint))
                }
            })
            .await
    }

    /// Opens the read again after `failure`, attempt `attempt` (1-based) since the stream
    /// last yielded events: the first at once, later ones after a growing, jittered pause.
    async fn reopen(
        self: Arc<Self>,
        failure: ClientError,
        position: EventPosition,
        attempt: u32,
    ) -> Result<Opened, ClientError> {
        match &failure {
            ClientError::Service {
                reason: ErrorReason::NotLeader,
                leader_hint: Some(hint),
                ..
            } => self.routing.remember_leader(self.partition(), hint),
            _ => self.routing.forget_leader(&self.partition()),
        }
        let pause = match failure.retry_after() {
            Some(retry_after) => Some(retry_after),
            None => (attempt > 1).then(|| backoff(attempt - 1)),
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        self.open(position).await
    }

    /// Just after the partition's last event now (the position "latest" stands for).
    async fn current_end(&self) -> Result<EventPosition, ClientError> {
        let request = proto::GetPartitionPropertiesRequest {
            event_hub: self.request.event_hub.clone(),
            partition_id: self.request.partition_id.clone(),
        };
        let properties = self
            .routing
            .call(Some(self.partition()), |channel, endpoint| {
                let request = request.clone();
                async move {
                    ManagementStub::new(channel)
                        .get_partition_properties(request)
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err(|status| ClientError::from_status(status, &endpoint))
                }
            })
            .await?;
        Ok(EventPosition::SequenceNumber {
            sequence_number: properties.last_enqueued_sequence_number,
            inclusive: false,
        })
    }
}

enum State {
    Open(Box<tonic::Streaming<proto::ReceiveResponse>>),
    Reopening(Pin<Box<dyn Future<Output = Result<Opened, ClientError>> + Send>>),
    Ended,
}

/// The batches of one read, in partition order. See [`ConsumerClient::receive`].
pub struct ReceiveStream {
    reader: Arc<Reader>,
    /// Where the read started: where it resumes when nothing was yielded yet.
    start: EventPosition,
    resumable: bool,
    state: State,
    endpoint: Arc<str>,
    /// Sequence number of the last event yielded.
    last_delivered: Option<i64>,
    /// Reconnections since events were last yielded.
    reconnects: u32,
    last_enqueued_sequence_number: Option<i64>,
}

impl ReceiveStream {
    /// The partition's last enqueued sequence number as of the latest batch (-1 when the
    /// partition has never held an event); `None` before the first batch. Tells how far the
    /// reader is behind.
    pub fn last_enqueued_sequence_number(&self) -> Option<i64> {
        self.last_enqueued_sequence_number
    }

    /// The node currently serving the read (it changes when the read resumes elsewhere).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Starts reconnecting after `failure`, or says why not.
    fn resume_after(&mut self, failure: ClientError) -> Result<(), ClientError> {
        if !self.resumable || !failure.is_transient() {
            return Err(failure);
        }
        self.reconnects += 1;
        let position = resume_position(self.start, self.last_delivered);
        let reopen = self
            .reader
            .clone()
            .reopen(failure, position, self.reconnects);
        self.state = State::Reopening(Box::pin(reopen));
        Ok(())
    }
}

/// Where a broken read continues: just after the last event yielded, or where it started.
fn resume_position(start: EventPosition, last_delivered: Option<i64>) -> EventPosition {
    match last_delivered {
        Some(sequence_number) => EventPosition::SequenceNumber {
            sequence_number,
            inclusive: false,
        },
        None => start,
    }
}

/// The events of a batch not yielded before (a resumed read never repeats one).
fn fresh_events(
    events: Vec<proto::ReceivedEvent>,
    last_delivered: Option<i64>,
) -> Vec<ReceivedEvent> {
    events
        .into_iter()
        .filter(|e| last_delivered.is_none_or(|last| e.sequence_number > last))
        .map(ReceivedEvent::from)
        .collect()
}

impl std::fmt::Debug for ReceiveStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReceiveStream")
            .field("endpoint", &self.endpoint)
            .field("last_delivered", &self.last_delivered)
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
        loop {
            match &mut this.state {
                State::Ended => return Poll::Ready(None),
                State::Reopening(reopen) => match ready!(reopen.as_mut().poll(cx)) {
                    Ok((inner, endpoint)) => {
                        this.endpoint = endpoint;
                        this.state = State::Open(Box::new(inner));
                    }
                    Err(err) => {
                        this.state = State::Ended;
                        return Poll::Ready(Some(Err(err)));
                    }
                },
                State::Open(inner) => match ready!(Pin::new(&mut **inner).poll_next(cx)) {
                    None => {
                        this.state = State::Ended;
                        return Poll::Ready(None);
                    }
                    Some(Err(status)) => {
                        let failure = ClientError::from_status(status, &this.endpoint);
                        if let Err(err) = this.resume_after(failure) {
                            this.state = State::Ended;
                            return Poll::Ready(Some(Err(err)));
                        }
                    }
                    Some(Ok(response)) => {
                        this.last_enqueued_sequence_number =
                            Some(response.last_enqueued_sequence_number);
                        let events = fresh_events(response.events, this.last_delivered);
                        let Some(last) = events.last() else { continue };
                        this.last_delivered = Some(last.sequence_number);
                        this.reconnects = 0;
                        return Poll::Ready(Some(Ok(events)));
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Mutex;
    use std::time::Duration;

    use futures::StreamExt;
    use prost::Message as _;
    use tributary_proto::v1::ErrorDetail;
    use tributary_proto::v1::consumer_server::{Consumer, ConsumerServer};
    use tributary_proto::v1::event_position::Kind;

    use super::*;
    use crate::Client;

    /// A partition of `total` events served by a scripted fake: each read sends the events
    /// from the requested position in batches of two, and while the script has entries,
    /// fails after that many events with that status; without one it stays open.
    #[derive(Clone)]
    struct FakeConsumer {
        total: i64,
        requests: Arc<Mutex<Vec<proto::EventPosition>>>,
        script: Arc<Mutex<VecDeque<(i64, tonic::Status)>>>,
    }

    impl FakeConsumer {
        fn new(total: i64, script: Vec<(i64, tonic::Status)>) -> Self {
            FakeConsumer {
                total,
                requests: Arc::default(),
                script: Arc::new(Mutex::new(script.into())),
            }
        }

        fn positions(&self) -> Vec<proto::EventPosition> {
            self.requests.lock().unwrap().clone()
        }
    }

    type ResponseStream =
        Pin<Box<dyn Stream<Item = Result<proto::ReceiveResponse, tonic::Status>> + Send>>;

    #[tonic::async_trait]
    impl Consumer for FakeConsumer {
        type ReceiveStream = ResponseStream;

        async fn get_partition_readers(
            &self,
            _request: tonic::Request<proto::GetPartitionReadersRequest>,
        ) -> Result<tonic::Response<proto::PartitionReaders>, tonic::Status> {
            Err(tonic::Status::unimplemented("the fake only streams"))
        }

        async fn receive(
            &self,
            request: tonic::Request<proto::ReceiveRequest>,
        ) -> Result<tonic::Response<ResponseStream>, tonic::Status> {
            let position = request.into_inner().position.unwrap();
            self.requests.lock().unwrap().push(position);
            let start = match position.kind {
                Some(Kind::Earliest(_)) => 0,
                Some(Kind::SequenceNumber(s)) if position.inclusive => s,
                Some(Kind::SequenceNumber(s)) => s + 1,
                other => panic!("the fake serves no {other:?}"),
            };
            let step = self.script.lock().unwrap().pop_front();
            let end = match &step {
                Some((count, _)) => (start + count).min(self.total),
                None => self.total,
            };
            let total = self.total;
            let batches: Vec<_> = (start..end)
                .collect::<Vec<_>>()
                .chunks(2)
                .map(|chunk| {
                    Ok(proto::ReceiveResponse {
                        events: chunk.iter().map(|s| event(*s)).collect(),
                        last_enqueued_sequence_number: total - 1,
                    })
                })
                .collect();
            let batches = futures::stream::iter(batches);
            let stream: ResponseStream = match step {
                Some((_, status)) => Box::pin(batches.chain(futures::stream::iter([Err(status)]))),
                None => Box::pin(batches.chain(futures::stream::pending())),
            };
            Ok(tonic::Response::new(stream))
        }
    }

    fn event(sequence_number: i64) -> proto::ReceivedEvent {
        proto::ReceivedEvent {
            body: format!("e{sequence_number}").into(),
            properties: Default::default(),
            sequence_number,
            offset: (sequence_number * 10).to_string(),
            enqueued_time_ms: 1,
            partition_key: String::new(),
        }
    }

    fn failure(reason: ErrorReason, code: tonic::Code, leader_hint: &str) -> tonic::Status {
        let detail = ErrorDetail {
            reason: reason as i32,
            message: "scripted failure".into(),
            retry_after_ms: 0,
            leader_hint: leader_hint.into(),
            leader_node: 0,
        };
        tonic::Status::with_details(code, "scripted failure", detail.encode_to_vec().into())
    }

    async fn serve(fake: FakeConsumer) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = futures::stream::unfold(listener, |listener| async move {
            let accepted = listener.accept().await.map(|(stream, _)| stream);
            Some((accepted, listener))
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ConsumerServer::new(fake))
                .serve_with_incoming(incoming),
        );
        format!("http://{addr}")
    }

    /// Reads until `count` events arrived or the stream ends; then the end or error seen.
    async fn read(
        stream: &mut ReceiveStream,
        count: usize,
    ) -> (Vec<i64>, Option<Result<(), ClientError>>) {
        let mut sequences = Vec::new();
        while sequences.len() < count {
            let next = tokio::time::timeout(Duration::from_secs(10), stream.next())
                .await
                .expect("the stream makes progress");
            match next {
                None => return (sequences, None),
                Some(Err(err)) => return (sequences, Some(Err(err))),
                Some(Ok(batch)) => sequences.extend(batch.iter().map(|e| e.sequence_number)),
            }
        }
        (sequences, Some(Ok(())))
    }

    fn after(sequence_number: i64) -> proto::EventPosition {
        EventPosition::SequenceNumber {
            sequence_number,
            inclusive: false,
        }
        .into()
    }

    #[tokio::test]
    async fn a_broken_read_resumes_after_the_last_event_on_the_new_leader() {
        let total = 12;
        let new_leader = FakeConsumer::new(total, vec![]);
        let new_leader_endpoint = serve(new_leader.clone()).await;
        let old_leader = FakeConsumer::new(
            total,
            vec![
                (
                    5,
                    failure(ErrorReason::Unavailable, tonic::Code::Unavailable, ""),
                ),
                (
                    3,
                    failure(
                        ErrorReason::NotLeader,
                        tonic::Code::FailedPrecondition,
                        &new_leader_endpoint,
                    ),
                ),
            ],
        );
        let client = Client::connect(&serve(old_leader.clone()).await)
            .await
            .unwrap();
        let mut stream = client
            .consumer()
            .receive("hub", "", "0", EventPosition::Earliest, 0)
            .await
            .unwrap();
        let (sequences, end) = read(&mut stream, total as usize).await;
        assert!(matches!(end, Some(Ok(()))), "{end:?}");
        assert_eq!(sequences, (0..total).collect::<Vec<_>>());
        let earliest = EventPosition::Earliest.into();
        assert_eq!(old_leader.positions(), [earliest, after(4)]);
        assert_eq!(new_leader.positions(), [after(7)]);
        assert_eq!(stream.endpoint(), new_leader_endpoint);
    }

    #[tokio::test]
    async fn a_read_that_breaks_before_any_event_resumes_where_it_started() {
        let start = EventPosition::SequenceNumber {
            sequence_number: 3,
            inclusive: true,
        };
        let fake = FakeConsumer::new(
            6,
            vec![(
                0,
                failure(ErrorReason::Unavailable, tonic::Code::Unavailable, ""),
            )],
        );
        let client = Client::connect(&serve(fake.clone()).await).await.unwrap();
        let mut stream = client
            .consumer()
            .receive("hub", "", "0", start, 0)
            .await
            .unwrap();
        let (sequences, _) = read(&mut stream, 3).await;
        assert_eq!(sequences, [3, 4, 5]);
        assert_eq!(fake.positions(), [start.into(), start.into()]);
    }

    #[tokio::test]
    async fn a_permanent_error_ends_the_read() {
        let fake = FakeConsumer::new(
            10,
            vec![(3, failure(ErrorReason::NotFound, tonic::Code::NotFound, ""))],
        );
        let client = Client::connect(&serve(fake.clone()).await).await.unwrap();
        let mut stream = client
            .consumer()
            .receive("hub", "", "0", EventPosition::Earliest, 0)
            .await
            .unwrap();
        let (sequences, end) = read(&mut stream, 10).await;
        assert_eq!(sequences, [0, 1, 2]);
        let Some(Err(err)) = end else {
            panic!("expected the error, got {end:?}")
        };
        assert_eq!(err.reason(), Some(ErrorReason::NotFound));
        assert!(
            stream.next().await.is_none(),
            "the stream ends after its error"
        );
        assert_eq!(fake.positions().len(), 1, "no reconnection");
    }

    #[tokio::test]
    async fn with_retries_off_a_broken_read_ends_with_its_error() {
        let fake = FakeConsumer::new(
            10,
            vec![(
                2,
                failure(ErrorReason::Unavailable, tonic::Code::Unavailable, ""),
            )],
        );
        let client = Client::connect(&serve(fake.clone()).await)
            .await
            .unwrap()
            .with_retry_deadline(Duration::ZERO);
        let mut stream = client
            .consumer()
            .receive("hub", "", "0", EventPosition::Earliest, 0)
            .await
            .unwrap();
        let (sequences, end) = read(&mut stream, 10).await;
        assert_eq!(sequences, [0, 1]);
        let Some(Err(err)) = end else {
            panic!("expected the error, got {end:?}")
        };
        assert_eq!(err.reason(), Some(ErrorReason::Unavailable));
        assert_eq!(fake.positions().len(), 1, "no reconnection");
    }

    #[test]
    fn resumes_after_the_last_event_or_at_the_start() {
        let start = EventPosition::Offset {
            offset: 40,
            inclusive: true,
        };
        assert_eq!(resume_position(start, None), start);
        assert_eq!(
            resume_position(start, Some(9)),
            EventPosition::SequenceNumber {
                sequence_number: 9,
                inclusive: false
            }
        );
    }

    #[test]
    fn events_already_yielded_are_dropped() {
        let batch = || (3..7).map(event).collect::<Vec<_>>();
        let sequences = |events: Vec<ReceivedEvent>| {
            events.iter().map(|e| e.sequence_number).collect::<Vec<_>>()
        };
        assert_eq!(sequences(fresh_events(batch(), None)), [3, 4, 5, 6]);
        assert_eq!(sequences(fresh_events(batch(), Some(4))), [5, 6]);
        assert!(fresh_events(batch(), Some(6)).is_empty());
    }
}
