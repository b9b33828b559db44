//! Any node serves any partition: sends, reads and partition properties for a partition
//! another node leads are passed on to that leader over the peer port (the `Forward`
//! service), for front ends whose clients know one endpoint (AMQP). The caller's credential
//! travels with the call and the leader checks it again.
//!
//! A call follows NOT_LEADER to the node it names, and waits (up to [`FORWARD_PATIENCE`])
//! while a partition has no leader. A send is retried only when it surely did not run
//! (NOT_LEADER, or the leader could not be reached at all). A read survives leader changes:
//! when its source ends for a reason another node may not have (the replica moved, the node
//! stopped or became unreachable), it is opened again on the new leader from the event
//! after the last one delivered, so nothing is skipped or repeated.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};
use tributary_proto::peer::forward_client::ForwardClient;
use tributary_proto::peer::forward_server::{Forward, ForwardServer};
use tributary_proto::peer::{
    ForwardFetchReply, ForwardFetchRequest, ForwardKafkaProducer, ForwardPosition,
    ForwardPropertiesReply, ForwardPropertiesRequest, ForwardReadBatch, ForwardReadRequest,
    ForwardSendReply, ForwardSendRequest, forward_position,
};

use tributary_types::limits::{PUBLISH_BYTES_MAX_LIMIT, RECEIVE_BATCH_BYTES_MAX};
use tributary_types::{NodeId, Offset, PartitionId, Rights, SequenceNumber};

use tributary_broker::partition::codec;
use tributary_broker::service::{
    FetchBatch, FetchRequest, KafkaProducerStamp, PartitionProperties, Position, Producer,
    ProducerStamp, ReadBatch, ReadEvent, ReadRequest, ReadStream, SendReply, SendRequest, Service,
    Target,
};
use tributary_broker::{Credential, Error, ErrorKind, Scope};

/// How long a call waits for a partition's leader (an election, a node restarting) before
/// it gives up with the last error.
pub const FORWARD_PATIENCE: Duration = Duration::from_secs(20);
/// Pause before asking again while no leader is known.
const LEADER_WAIT: Duration = Duration::from_millis(100);
/// A forwarded unary call that takes longer has lost its leader (a paused or cut-off node).
const FORWARD_CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest forwarded message: a send of the largest publication a node may be
/// configured to accept (64 MiB), or a read batch (reads end a batch once 1 MiB of bodies
/// is reached, so one large event may bring it near 65 MiB), with room for framing. Only
/// the cluster's nodes reach the peer port.
pub const FORWARD_MESSAGE_BYTES_MAX: usize = PUBLISH_BYTES_MAX_LIMIT + 2 * RECEIVE_BATCH_BYTES_MAX;
/// Batches buffered per forwarded reader.
const READ_BUFFER_BATCHES: usize = 2;
/// The longest a fetch waits for an event (well within a forwarded call's timeout).
const FETCH_WAIT_MAX: Duration = Duration::from_secs(10);

/// Where a call runs next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hop {
    Here,
    Node(NodeId),
}

/// Whether an error met on the way is answered to the caller as it is instead of being
/// followed (see [`AnyNode::redirecting`]).
pub type Redirect = Arc<dyn Fn(&Error) -> bool + Send + Sync>;

/// The broker's [`Service`] from any node: each call runs on the partition's leader. Cheap
/// to clone.
#[derive(Clone)]
pub struct AnyNode {
    service: Service,
    redirect: Option<Redirect>,
}

impl AnyNode {
    pub fn new(service: Service) -> AnyNode {
        AnyNode {
            service,
            redirect: None,
        }
    }

    /// Calls that fail with an error `redirect` picks (a NOT_LEADER naming a leader the
    /// caller's clients can reach themselves, as Kafka clients do) return that error at
    /// once, without being passed on; every other error is followed as before.
    pub fn redirecting(self, redirect: impl Fn(&Error) -> bool + Send + Sync + 'static) -> AnyNode {
        AnyNode {
            redirect: Some(Arc::new(redirect)),
            ..self
        }
    }

    /// The service the calls run on when this node leads.
    pub fn service(&self) -> &Service {
        &self.service
    }

    /// [`Service::send`] from any node: run here when this node leads the partition, else on
    /// its leader. A round-robin or keyed send is routed here first, so the leader stores it
    /// in the partition chosen now.
    pub async fn send(
        &self,
        credential: &Credential,
        request: SendRequest,
    ) -> Result<SendReply, Error> {
        self.service
            .check(credential, Scope::Hub(&request.hub), Rights::SEND)?;
        let hub = self.service.broker().hub(&request.hub)?;
        let index = self.service.broker().route(&hub, &request.target)?;
        let mut events = request.events;
        if let Target::PartitionKey(key) = &request.target {
            for event in &mut events {
                event.partition_key = Some(key.clone());
            }
        }
        let request = SendRequest {
            hub: request.hub,
            target: Target::PartitionId(index.to_string()),
            events,
            producer: request.producer,
        };
        let deadline = Instant::now() + FORWARD_PATIENCE;
        let mut hop = Hop::Here;
        loop {
            let result = match hop {
                Hop::Here => self.service.send(credential, request.clone()).await,
                Hop::Node(node) => self.forward_send(node, credential, &request, index).await,
            };
            match result {
                Err(err) => hop = self.next_hop(err, hop, deadline).await?,
                Ok(reply) => return Ok(reply),
            }
        }
    }

    /// [`Service::partition_properties`] from any node.
    pub async fn partition_properties(
        &self,
        credential: &Credential,
        hub: &str,
        partition_id: &str,
    ) -> Result<PartitionProperties, Error> {
        self.service
            .check(credential, Scope::Hub(hub), Rights::NONE)?;
        let record = self.service.broker().hub(hub)?;
        let index = self
            .service
            .broker()
            .partition_index(&record, partition_id)?;
        let deadline = Instant::now() + FORWARD_PATIENCE;
        let mut hop = Hop::Here;
        loop {
            let result = match hop {
                Hop::Here => {
                    self.service
                        .partition_properties(credential, hub, partition_id)
                        .await
                }
                Hop::Node(node) => self.forward_properties(node, credential, hub, index).await,
            };
            match result {
                Err(err) => hop = self.next_hop(err, hop, deadline).await?,
                Ok(properties) => return Ok(properties),
            }
        }
    }

    /// [`Service::read`] from any node, surviving leader changes: the stream goes on from
    /// the next event on whichever node leads the partition, and ends only when the reader
    /// is displaced, the hub or partition goes, the caller drops it, or no leader is found
    /// within [`FORWARD_PATIENCE`].
    pub async fn read(
        &self,
        credential: &Credential,
        request: ReadRequest,
    ) -> Result<ReadStream, Error> {
        let path = request.entity_path();
        self.service.check(
            credential,
            Scope::HubPath(&request.hub, &path),
            Rights::LISTEN,
        )?;
        let hub = self.service.broker().hub(&request.hub)?;
        let index = self
            .service
            .broker()
            .partition_index(&hub, &request.partition_id)?;
        let source = self.open_source(credential, &request, index).await?;
        let (tx, rx) = mpsc::channel(READ_BUFFER_BATCHES);
        tokio::spawn(follow_reader(
            self.clone(),
            credential.clone(),
            request,
            index,
            source,
            tx,
        ));
        Ok(rx)
    }

    /// A reader on the partition's leader, wherever it is.
    async fn open_source(
        &self,
        credential: &Credential,
        request: &ReadRequest,
        index: u16,
    ) -> Result<Source, Error> {
        let deadline = Instant::now() + FORWARD_PATIENCE;
        let mut hop = Hop::Here;
        loop {
            let result =
                match hop {
                    Hop::Here => self.service.read(credential, request.clone()).await.map(
                        |stream| -> Source {
                            Box::pin(tokio_stream::wrappers::ReceiverStream::new(stream))
                        },
                    ),
                    Hop::Node(node) => self.forward_read(node, credential, request, index).await,
                };
            match result {
                Err(err) => hop = self.next_hop(err, hop, deadline).await?,
                Ok(source) => return Ok(source),
            }
        }
    }

    /// Where to try after `err`, or `err` itself when trying again cannot help (or the
    /// deadline has passed).
    async fn next_hop(&self, err: Error, hop: Hop, deadline: Instant) -> Result<Hop, Error> {
        if self
            .redirect
            .as_ref()
            .is_some_and(|redirect| redirect(&err))
        {
            return Err(err);
        }
        let me = self.service.broker().runtime().me.id;
        let next = match (&err.kind, hop) {
            (
                ErrorKind::NotLeader {
                    node: Some(node), ..
                },
                _,
            ) if node.0 != me => Hop::Node(*node),
            // No leader known, or a node naming this one while this one does not lead
            // (leadership is moving): wait for the election.
            (ErrorKind::NotLeader { .. }, _) => Hop::Here,
            // The leader could not be reached (stopped, cut off): ask again here, which
            // names the next leader once one is elected.
            (ErrorKind::Unavailable, Hop::Node(_)) => Hop::Here,
            _ => return Err(err),
        };
        if Instant::now() >= deadline {
            return Err(err);
        }
        if next == Hop::Here || next == hop {
            tokio::time::sleep(LEADER_WAIT).await;
        }
        Ok(next)
    }

    fn forward_client(
        &self,
        node: NodeId,
    ) -> Result<ForwardClient<tonic::transport::Channel>, Error> {
        let runtime = self.service.broker().runtime();
        let addr = runtime
            .state()
            .nodes
            .get(&node.0)
            .map(|n| n.peer_addr.clone())
            .ok_or_else(|| {
                Error::unavailable(format!(
                    "node {node} leads the partition but is not known here yet"
                ))
            })?;
        Ok(ForwardClient::new(runtime.peer_channel(&addr)?)
            .max_decoding_message_size(FORWARD_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(FORWARD_MESSAGE_BYTES_MAX))
    }

    async fn forward_send(
        &self,
        node: NodeId,
        credential: &Credential,
        request: &SendRequest,
        index: u16,
    ) -> Result<SendReply, Error> {
        let mut client = self.forward_client(node)?;
        let (producer_id, producer_sequence, kafka_producer) = match request.producer {
            None => (0, 0, None),
            Some(Producer::EventHubs(stamp)) => (stamp.producer_id, stamp.sequence, None),
            Some(Producer::Kafka(stamp)) => (
                0,
                0,
                Some(ForwardKafkaProducer {
                    producer_id: stamp.producer_id,
                    epoch: i32::from(stamp.epoch),
                    base_sequence: stamp.base_sequence,
                }),
            ),
        };
        let call = client.send(ForwardSendRequest {
            credential: credential_text(credential),
            hub: request.hub.clone(),
            partition: u32::from(index),
            events: codec::encode_batch(&request.events),
            producer_id,
            producer_sequence,
            kafka_producer,
        });
        let reply = timed(node, call).await?;
        Ok(SendReply {
            partition: PartitionId(index),
            first_sequence: SequenceNumber(reply.first_sequence),
            offsets: reply.offsets.into_iter().map(Offset).collect(),
            enqueued_time_ms: reply.enqueued_time_ms,
        })
    }

    async fn forward_properties(
        &self,
        node: NodeId,
        credential: &Credential,
        hub: &str,
        index: u16,
    ) -> Result<PartitionProperties, Error> {
        let mut client = self.forward_client(node)?;
        let call = client.partition_properties(ForwardPropertiesRequest {
            credential: credential_text(credential),
            hub: hub.to_string(),
            partition: u32::from(index),
        });
        let reply = timed(node, call).await?;
        Ok(PartitionProperties {
            hub: hub.to_string(),
            partition: PartitionId(index),
            begin_sequence: SequenceNumber(reply.begin_sequence),
            last_enqueued_sequence: SequenceNumber(reply.last_enqueued_sequence),
            last_enqueued_offset: Offset(reply.last_enqueued_offset),
            last_enqueued_time_ms: reply.last_enqueued_time_ms,
            is_empty: reply.is_empty,
            capture_next_sequence: SequenceNumber(reply.capture_next_sequence),
        })
    }

    /// [`Service::fetch`] from any node: here when this node leads the partition, else on
    /// its leader.
    pub async fn fetch(
        &self,
        credential: &Credential,
        mut request: FetchRequest,
    ) -> Result<FetchBatch, Error> {
        self.service
            .check(credential, Scope::Hub(&request.hub), Rights::LISTEN)?;
        let record = self.service.broker().hub(&request.hub)?;
        let index = self
            .service
            .broker()
            .partition_index(&record, &request.partition_id)?;
        request.wait = request.wait.min(FETCH_WAIT_MAX);
        let deadline = Instant::now() + FORWARD_PATIENCE;
        let mut hop = Hop::Here;
        loop {
            let result = match hop {
                Hop::Here => self.service.fetch(credential, request.clone()).await,
                Hop::Node(node) => self.forward_fetch(node, credential, &request, index).await,
            };
            match result {
                Err(err) => hop = self.next_hop(err, hop, deadline).await?,
                Ok(batch) => return Ok(batch),
            }
        }
    }

    async fn forward_fetch(
        &self,
        node: NodeId,
        credential: &Credential,
        request: &FetchRequest,
        index: u16,
    ) -> Result<FetchBatch, Error> {
        let mut client = self.forward_client(node)?;
        let call = client.fetch(ForwardFetchRequest {
            credential: credential_text(credential),
            hub: request.hub.clone(),
            partition: u32::from(index),
            from_sequence: request.from_sequence,
            max_events: u32::try_from(request.max_events).unwrap_or(u32::MAX),
            max_bytes: request.max_bytes as u64,
            wait_ms: u32::try_from(request.wait.as_millis()).unwrap_or(u32::MAX),
            from_time_ms: request.from_time_ms,
        });
        let reply = timed(node, call).await?;
        let events = match reply.batch {
            Some(batch) => batch_from_wire(batch)?.events,
            None => Vec::new(),
        };
        Ok(FetchBatch {
            events,
            begin_sequence: reply.begin_sequence,
            next_sequence: reply.next_sequence,
        })
    }

    async fn forward_read(
        &self,
        node: NodeId,
        credential: &Credential,
        request: &ReadRequest,
        index: u16,
    ) -> Result<Source, Error> {
        let mut client = self.forward_client(node)?;
        let call = client.read(ForwardReadRequest {
            credential: credential_text(credential),
            hub: request.hub.clone(),
            consumer_group: request.consumer_group.clone(),
            partition: u32::from(index),
            position: Some(position_to_wire(request.position)),
            max_batch: request.max_batch,
            reader_name: request.reader_name.clone(),
            owner_level: request.owner_level,
        });
        let stream = timed(node, call).await?;
        Ok(Box::pin(stream.map(|item| match item {
            Ok(batch) => batch_from_wire(batch),
            Err(status) => Err(Error::from_status(&status)),
        })))
    }
}

type Source = Pin<Box<dyn Stream<Item = Result<ReadBatch, Error>> + Send>>;

/// Passes a reader's batches on, opening it again on the partition's next leader when its
/// source ends for a reason another node may not have.
async fn follow_reader(
    service: AnyNode,
    credential: Credential,
    mut request: ReadRequest,
    index: u16,
    mut source: Source,
    tx: mpsc::Sender<Result<ReadBatch, Error>>,
) {
    loop {
        let item = tokio::select! {
            item = source.next() => item,
            () = tx.closed() => return,
        };
        let err = match item {
            Some(Ok(batch)) => {
                if let Some(last) = batch.events.last() {
                    request.position = Position::Sequence {
                        sequence: last.sequence,
                        inclusive: false,
                    };
                }
                if tx.send(Ok(batch)).await.is_err() {
                    return;
                }
                continue;
            }
            Some(Err(err)) => err,
            None => Error::unavailable("the partition's leader ended the reader"),
        };
        if !matches!(
            err.kind,
            ErrorKind::NotLeader { .. } | ErrorKind::Unavailable
        ) {
            let _ = tx.send(Err(err)).await;
            return;
        }
        tracing::debug!(hub = %request.hub, partition = index, %err, "reader moves to the partition's new leader");
        drop(source);
        let reopened = tokio::select! {
            reopened = service.open_source(&credential, &request, index) => reopened,
            () = tx.closed() => return,
        };
        match reopened {
            Ok(next) => source = next,
            Err(err) => {
                let _ = tx.send(Err(err)).await;
                return;
            }
        }
    }
}

async fn timed<T>(
    node: NodeId,
    call: impl std::future::Future<Output = Result<Response<T>, Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(FORWARD_CALL_TIMEOUT, call).await {
        Ok(Ok(reply)) => Ok(reply.into_inner()),
        Ok(Err(status)) => Err(Error::from_status(&status)),
        Err(_elapsed) => Err(Error::unavailable(format!(
            "node {node}, the partition's leader, did not answer within {FORWARD_CALL_TIMEOUT:?}"
        ))),
    }
}

fn credential_text(credential: &Credential) -> String {
    match credential {
        Credential::None => String::new(),
        Credential::SasToken(token) => token.clone(),
        // Signed requests (the Blob endpoint's) never reach a partition: nothing to carry.
        Credential::Signed(_) => String::new(),
    }
}

fn credential_from_text(text: String) -> Credential {
    if text.is_empty() {
        Credential::None
    } else {
        Credential::SasToken(text)
    }
}

fn position_to_wire(position: Position) -> ForwardPosition {
    use forward_position::Kind;
    let (kind, inclusive) = match position {
        Position::Earliest => (Kind::Earliest(true), false),
        Position::Latest => (Kind::Latest(true), false),
        Position::Offset { offset, inclusive } => (Kind::Offset(offset), inclusive),
        Position::Sequence {
            sequence,
            inclusive,
        } => (Kind::Sequence(sequence), inclusive),
        Position::EnqueuedTime { time_ms, inclusive } => (Kind::EnqueuedTimeMs(time_ms), inclusive),
    };
    ForwardPosition {
        kind: Some(kind),
        inclusive,
    }
}

fn position_from_wire(position: Option<ForwardPosition>) -> Result<Position, Error> {
    use forward_position::Kind;
    let position = position.ok_or_else(|| Error::invalid("a forwarded read without a position"))?;
    let inclusive = position.inclusive;
    Ok(match position.kind {
        Some(Kind::Earliest(_)) => Position::Earliest,
        Some(Kind::Latest(_)) => Position::Latest,
        Some(Kind::Offset(offset)) => Position::Offset { offset, inclusive },
        Some(Kind::Sequence(sequence)) => Position::Sequence {
            sequence,
            inclusive,
        },
        Some(Kind::EnqueuedTimeMs(time_ms)) => Position::EnqueuedTime { time_ms, inclusive },
        None => return Err(Error::invalid("a forwarded read without a position")),
    })
}

fn batch_to_wire(batch: ReadBatch) -> ForwardReadBatch {
    let count = batch.events.len();
    let (mut sequences, mut offsets, mut times) = (
        Vec::with_capacity(count),
        Vec::with_capacity(count),
        Vec::with_capacity(count),
    );
    let mut records = Vec::with_capacity(count);
    for event in batch.events {
        sequences.push(event.sequence);
        offsets.push(event.offset);
        times.push(event.enqueued_time_ms);
        records.push(event.record);
    }
    ForwardReadBatch {
        records: codec::encode_batch(&records),
        sequences,
        offsets,
        enqueued_times_ms: times,
        last_enqueued_sequence: batch.last_enqueued_sequence.0,
        last_enqueued_offset: batch.last_enqueued_offset.0,
        last_enqueued_time_ms: batch.last_enqueued_time_ms,
    }
}

fn batch_from_wire(batch: ForwardReadBatch) -> Result<ReadBatch, Error> {
    let records = codec::decode_batch(&batch.records)
        .map_err(|e| Error::internal(format!("a forwarded read batch does not decode: {e}")))?;
    let count = records.len();
    if batch.sequences.len() != count
        || batch.offsets.len() != count
        || batch.enqueued_times_ms.len() != count
    {
        return Err(Error::internal(
            "a forwarded read batch's events and system fields do not match",
        ));
    }
    let events = records
        .into_iter()
        .zip(batch.sequences)
        .zip(batch.offsets)
        .zip(batch.enqueued_times_ms)
        .map(
            |(((decoded, sequence), offset), enqueued_time_ms)| ReadEvent {
                sequence,
                offset,
                enqueued_time_ms,
                record: decoded.record,
            },
        )
        .collect();
    Ok(ReadBatch {
        events,
        last_enqueued_sequence: SequenceNumber(batch.last_enqueued_sequence),
        last_enqueued_offset: Offset(batch.last_enqueued_offset),
        last_enqueued_time_ms: batch.last_enqueued_time_ms,
    })
}

/// The peer port's `Forward` service: runs forwarded calls here. Until the node has joined
/// and its service exists, calls are answered UNAVAILABLE (the caller tries again).
#[derive(Clone, Default)]
pub struct ForwardService {
    service: Arc<OnceLock<Service>>,
}

impl ForwardService {
    /// Serves calls once [`ForwardService::set`] is called.
    pub fn new() -> ForwardService {
        ForwardService::default()
    }

    pub fn set(&self, service: Service) {
        let _ = self.service.set(service);
    }

    pub fn into_server(self) -> ForwardServer<ForwardService> {
        ForwardServer::new(self)
            .max_decoding_message_size(FORWARD_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(FORWARD_MESSAGE_BYTES_MAX)
    }

    fn service(&self) -> Result<&Service, Status> {
        self.service
            .get()
            .ok_or_else(|| Error::unavailable("the node is starting").into())
    }
}

fn partition_text(partition: u32) -> String {
    partition.to_string()
}

#[tonic::async_trait]
impl Forward for ForwardService {
    async fn send(
        &self,
        request: Request<ForwardSendRequest>,
    ) -> Result<Response<ForwardSendReply>, Status> {
        let service = self.service()?;
        let request = request.into_inner();
        let events = codec::decode_batch(&request.events)
            .map_err(|e| Error::invalid(format!("a forwarded send does not decode: {e}")))?
            .into_iter()
            .map(|decoded| decoded.record)
            .collect();
        let producer = match request.kafka_producer {
            Some(kafka) => Some(Producer::Kafka(KafkaProducerStamp {
                producer_id: kafka.producer_id,
                epoch: i16::try_from(kafka.epoch).map_err(|_| {
                    Error::invalid(format!("a Kafka producer epoch of {}", kafka.epoch))
                })?,
                base_sequence: kafka.base_sequence,
            })),
            None => (request.producer_id != 0).then_some(Producer::EventHubs(ProducerStamp {
                producer_id: request.producer_id,
                sequence: request.producer_sequence,
            })),
        };
        let reply = service
            .send(
                &credential_from_text(request.credential),
                SendRequest {
                    hub: request.hub,
                    target: Target::PartitionId(partition_text(request.partition)),
                    events,
                    producer,
                },
            )
            .await?;
        Ok(Response::new(ForwardSendReply {
            first_sequence: reply.first_sequence.0,
            offsets: reply.offsets.into_iter().map(|o| o.0).collect(),
            enqueued_time_ms: reply.enqueued_time_ms,
        }))
    }

    type ReadStream = Pin<Box<dyn Stream<Item = Result<ForwardReadBatch, Status>> + Send>>;

    async fn read(
        &self,
        request: Request<ForwardReadRequest>,
    ) -> Result<Response<Self::ReadStream>, Status> {
        let service = self.service()?;
        let request = request.into_inner();
        let stream = service
            .read(
                &credential_from_text(request.credential),
                ReadRequest {
                    hub: request.hub,
                    consumer_group: request.consumer_group,
                    partition_id: partition_text(request.partition),
                    position: position_from_wire(request.position)?,
                    max_batch: request.max_batch,
                    reader_name: request.reader_name,
                    owner_level: request.owner_level,
                },
            )
            .await?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(stream)
            .map(|item| item.map(batch_to_wire).map_err(Status::from));
        Ok(Response::new(Box::pin(stream)))
    }

    async fn partition_properties(
        &self,
        request: Request<ForwardPropertiesRequest>,
    ) -> Result<Response<ForwardPropertiesReply>, Status> {
        let service = self.service()?;
        let request = request.into_inner();
        let properties = service
            .partition_properties(
                &credential_from_text(request.credential),
                &request.hub,
                &partition_text(request.partition),
            )
            .await?;
        Ok(Response::new(ForwardPropertiesReply {
            begin_sequence: properties.begin_sequence.0,
            last_enqueued_sequence: properties.last_enqueued_sequence.0,
            last_enqueued_offset: properties.last_enqueued_offset.0,
            last_enqueued_time_ms: properties.last_enqueued_time_ms,
            is_empty: properties.is_empty,
            capture_next_sequence: properties.capture_next_sequence.0,
        }))
    }

    async fn fetch(
        &self,
        request: Request<ForwardFetchRequest>,
    ) -> Result<Response<ForwardFetchReply>, Status> {
        let service = self.service()?;
        let request = request.into_inner();
        let batch = service
            .fetch(
                &credential_from_text(request.credential),
                FetchRequest {
                    hub: request.hub,
                    partition_id: partition_text(request.partition),
                    from_sequence: request.from_sequence,
                    from_time_ms: request.from_time_ms,
                    max_events: request.max_events as usize,
                    max_bytes: usize::try_from(request.max_bytes).unwrap_or(usize::MAX),
                    wait: Duration::from_millis(u64::from(request.wait_ms)).min(FETCH_WAIT_MAX),
                },
            )
            .await?;
        Ok(Response::new(ForwardFetchReply {
            batch: Some(batch_to_wire(ReadBatch {
                events: batch.events,
                last_enqueued_sequence: SequenceNumber(-1),
                last_enqueued_offset: Offset(-1),
                last_enqueued_time_ms: 0,
            })),
            begin_sequence: batch.begin_sequence,
            next_sequence: batch.next_sequence,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_broker::service::{EventRecord, Property};

    #[test]
    fn positions_cross_the_wire_unchanged() {
        for position in [
            Position::Earliest,
            Position::Latest,
            Position::Offset {
                offset: 42,
                inclusive: true,
            },
            Position::Sequence {
                sequence: 7,
                inclusive: false,
            },
            Position::EnqueuedTime {
                time_ms: 1_700_000_000_000,
                inclusive: true,
            },
        ] {
            assert_eq!(
                position_from_wire(Some(position_to_wire(position))).unwrap(),
                position
            );
        }
        assert!(position_from_wire(None).is_err());
    }

    #[test]
    fn read_batches_cross_the_wire_unchanged() {
        let events: Vec<ReadEvent> = (0..3)
            .map(|i| ReadEvent {
                sequence: 10 + i,
                offset: 1000 + i * 64,
                enqueued_time_ms: 1_700_000_000_000 + i,
                record: EventRecord {
                    partition_key: (i == 1).then(|| "key".to_string()),
                    properties: vec![
                        ("b".to_string(), Property::Int64(i)),
                        ("a".to_string(), Property::String("x".into())),
                    ],
                    body: bytes::Bytes::from(vec![i as u8; 5]),
                },
            })
            .collect();
        let batch = ReadBatch {
            events: events.clone(),
            last_enqueued_sequence: SequenceNumber(99),
            last_enqueued_offset: Offset(4096),
            last_enqueued_time_ms: 1_700_000_000_009,
        };
        let back = batch_from_wire(batch_to_wire(batch)).unwrap();
        assert_eq!(back.events, events);
        assert_eq!(back.last_enqueued_sequence, SequenceNumber(99));
        assert_eq!(back.last_enqueued_offset, Offset(4096));
        assert_eq!(back.last_enqueued_time_ms, 1_700_000_000_009);
    }

    #[test]
    fn a_batch_whose_fields_do_not_match_its_events_is_refused() {
        let mut wire = batch_to_wire(ReadBatch {
            events: vec![ReadEvent {
                sequence: 0,
                offset: 0,
                enqueued_time_ms: 0,
                record: EventRecord {
                    partition_key: None,
                    properties: vec![],
                    body: bytes::Bytes::from_static(b"x"),
                },
            }],
            last_enqueued_sequence: SequenceNumber(0),
            last_enqueued_offset: Offset(0),
            last_enqueued_time_ms: 0,
        });
        wire.offsets.clear();
        assert_eq!(batch_from_wire(wire).unwrap_err().kind, ErrorKind::Internal);
    }
}
