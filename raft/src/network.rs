//! The peer transport: every group's Raft messages to a node share one HTTP/2 connection
//! (a tonic channel) to that node's peer port, tagged with the group id. The router takes a
//! [`Connector`] instead of dialing sockets itself, so tests can run it over a simulated
//! network.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::{Stream, StreamExt};
use openraft::OptionalSend;
use openraft::alias::{SnapshotOf, VoteOf};
use openraft::base::{BoxFuture, BoxStream};
use openraft::error::{RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RaftNetworkV2;
use openraft::network::{Backoff, NetAppend, RPCOption, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendResult,
    TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use openraft_multi::{GroupNetworkAdapter, GroupNetworkFactory, GroupRouter};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::transport::{Channel, Endpoint};
use tributary_proto::peer::raft_peer_client::RaftPeerClient;
use tributary_proto::peer::{GroupBatch, GroupMessage, GroupReply, MessageKind, group_reply};
use tributary_types::{GroupId, SendStage};

use crate::coalesce::{COALESCE_WINDOW, Coalescer};
use crate::log_store::{decode, encode};
use crate::peer_failures::PeerFailures;
use crate::rebuild::{Direction, Rebuilds};
use crate::session::{Session, SessionError};
use crate::snapshot_stream::{PieceReader, SNAPSHOT_PIECE_BYTES};
use crate::types::{LogId, SnapshotData, SnapshotMeta, StoredSnapshot, TypeConfig};
use tributary_storage::LogPiece;

/// One piece of a snapshot on the wire.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct SnapshotChunk {
    /// Random per transfer: pieces of different transfers are never mixed.
    pub(crate) transfer: u64,
    pub(crate) offset: u64,
    pub(crate) data: Bytes,
    /// On the last piece: the leader's vote and the snapshot's metadata.
    pub(crate) done: Option<(VoteOf<TypeConfig>, SnapshotMeta)>,
}

/// How long one piece may take to be stored by its receiver at least: openraft's snapshot
/// timeout (200 ms) is meant for small messages, and a receiver waits for its share of
/// its node's rebuild budget before it stores a piece.
const SNAPSHOT_PIECE_TIMEOUT_MIN: Duration = Duration::from_secs(10);

/// One piece of a snapshot streamed from storage ([`SnapshotData::Stored`]).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) struct SnapshotPiece {
    /// Random per transfer: pieces of different transfers are never mixed.
    pub(crate) transfer: u64,
    /// The piece's place in the transfer, from 0.
    pub(crate) seq: u64,
    pub(crate) body: PieceBody,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub(crate) enum PieceBody {
    /// The first piece: the state at the snapshot's point, and what the log pieces carry.
    /// The receiver answers with the entry to go on from: the first, or, when it holds the
    /// start of this same snapshot from an interrupted transfer, the entry after it.
    Begin {
        point: Option<LogId>,
        state: Bytes,
        first_log: u64,
        last_log: u64,
        bytes: u64,
    },
    /// Consecutive log entries (stored bytes) and the index rows of those holding events.
    Log(LogPiece),
    /// The last piece: the leader's vote and the snapshot's metadata; installs it.
    End {
        vote: VoteOf<TypeConfig>,
        meta: SnapshotMeta,
    },
}

/// How long a batch of coalesced messages may take to be answered.
const BATCH_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest peer message: an AppendEntries of many large entries (snapshots travel in
/// pieces of [`SNAPSHOT_PIECE_BYTES`]).
pub const PEER_MESSAGE_BYTES_MAX: usize = 512 * 1024 * 1024;

/// HTTP/2 flow-control windows of peer connections, both ways. Every group's replication
/// to a node shares one connection and entries run up to 1 MiB each, so the defaults
/// (64 KiB to 1 MiB) would make large entries wait on window updates.
pub const PEER_STREAM_WINDOW_BYTES: u32 = 8 * 1024 * 1024;
pub const PEER_CONNECTION_WINDOW_BYTES: u32 = 64 * 1024 * 1024;

/// Makes the channel to a peer's address. The default dials TCP; simulations supply their
/// own.
pub trait Connector: Send + Sync + 'static {
    /// A channel to the peer port at `addr`, whichever node answers there.
    fn channel(&self, addr: &str) -> Result<Channel, String>;

    /// A channel to node `node`'s peer port at `addr`: a connector that can tell which node
    /// answers (mutual TLS with node certificates) refuses any other.
    fn channel_to(&self, addr: &str, node: u64) -> Result<Channel, String> {
        let _ = node;
        self.channel(addr)
    }
}

/// Dials peers over TCP, lazily, reconnecting as needed.
#[derive(Debug, Default)]
pub struct TcpConnector;

impl Connector for TcpConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        Ok(peer_endpoint("http", addr)?.connect_lazy())
    }
}

/// The settings of every channel to a peer port, at `scheme://addr`: a connector that dials
/// differently (TLS) makes its channel from these with
/// [`Endpoint::connect_with_connector_lazy`].
pub fn peer_endpoint(scheme: &str, addr: &str) -> Result<Endpoint, String> {
    Ok(Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .initial_stream_window_size(PEER_STREAM_WINDOW_BYTES)
        .initial_connection_window_size(PEER_CONNECTION_WINDOW_BYTES)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5)))
}

struct RouterInner {
    node_id: u64,
    connector: Box<dyn Connector>,
    /// Peer address of every node this node has been told about.
    addresses: RwLock<HashMap<u64, String>>,
    /// One channel (one HTTP/2 connection) per peer node, shared by all groups, and the
    /// coalescers batching heartbeats and election messages to it.
    channels: RwLock<HashMap<u64, (String, Channel, Coalescers)>>,
    /// Replica rebuilds this node sends and receives, and their shared budget.
    rebuilds: Rebuilds,
    /// Failed calls, summed up in the log.
    failures: PeerFailures,
}

/// Which batches a message may wait to share ([`COALESCE_WINDOW`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Batching {
    /// Sent at once, in a call of its own.
    Alone,
    /// Heartbeats: their replies must come back within openraft's heartbeat interval, or
    /// an idle leader's lease lapses and it turns writes away.
    Heartbeats,
    /// Votes and pre-votes, in batches of their own: a vote is answered once the voter's
    /// vote is on its disk, and a heartbeat must not wait for that.
    Elections,
}

/// The coalescers and the session of one peer connection.
#[derive(Clone, Debug)]
struct Coalescers {
    heartbeats: Coalescer,
    elections: Coalescer,
    session: Session,
}

/// Largest message sent on a peer's session ([`Session`]); larger ones (replication of many
/// large entries) go as calls of their own, so that no group's replication waits behind
/// them on the session's one stream (HTTP/2 interleaves streams, not one stream's
/// messages). Snapshot pieces always go alone.
const SESSION_MESSAGE_BYTES_MAX: usize = 1024 * 1024;

/// Routes the Raft messages of every group on this node to peer nodes. Cheap to clone.
#[derive(Clone)]
pub struct PeerRouter {
    inner: Arc<RouterInner>,
    /// Whether this handle carries openraft's heartbeats (its heartbeat worker's client):
    /// only those wait to share a batch. Replication's own empty AppendEntries (they carry
    /// the commit index) hold up the next entries of their stream, so they go at once.
    heartbeats: bool,
}

impl std::fmt::Debug for PeerRouter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerRouter")
            .field("node_id", &self.inner.node_id)
            .finish()
    }
}

impl PeerRouter {
    pub fn new(node_id: u64, connector: impl Connector) -> Self {
        Self {
            inner: Arc::new(RouterInner {
                node_id,
                connector: Box::new(connector),
                addresses: RwLock::new(HashMap::new()),
                channels: RwLock::new(HashMap::new()),
                rebuilds: Rebuilds::default(),
                failures: PeerFailures::default(),
            }),
            heartbeats: false,
        }
    }

    /// The replica rebuilds this node sends and receives.
    pub fn rebuilds(&self) -> &Rebuilds {
        &self.inner.rebuilds
    }

    /// Streams a snapshot whose log is in storage: its state, then its entries in pieces
    /// of about [`SNAPSHOT_PIECE_BYTES`] read one at a time, within the node's rebuild
    /// budget, then its metadata, which makes the receiver install it.
    async fn send_stored(
        &self,
        target: u64,
        group: GroupId,
        vote: VoteOf<TypeConfig>,
        meta: SnapshotMeta,
        stored: StoredSnapshot,
        timeout: Duration,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let transfer = rand::random::<u64>();
        let last_log = meta.last_log_id.map_or(0, |id| id.index);
        let progress = self
            .rebuilds()
            .start(group, Direction::Send, target, stored.bytes);
        let piece = |seq, body| SnapshotPiece {
            transfer,
            seq,
            body,
        };
        let kind = MessageKind::SnapshotPiece;
        let begin = PieceBody::Begin {
            point: meta.last_log_id,
            state: stored.state.clone(),
            first_log: stored.first_log,
            last_log,
            bytes: stored.bytes,
        };
        let resume_from: u64 = self
            .call(
                target,
                group,
                kind,
                &piece(0, begin),
                timeout,
                Batching::Alone,
            )
            .await?;
        if !(stored.first_log..=last_log + 1).contains(&resume_from) {
            return Err(unreachable(format!(
                "{} would go on with the snapshot of {group} from entry {resume_from}, outside \
                 {}..={last_log}",
                crate::describe_member(target),
                stored.first_log
            ))
            .into());
        }
        tracing::info!(%group, target = %crate::describe_member(target), transfer,
            point = ?meta.last_log_id, bytes = stored.bytes, first_log = stored.first_log,
            resume_from, "sending a snapshot");
        let mut seq = 1;
        let mut reader = PieceReader::new(stored, last_log).starting_at(resume_from);
        while let Some(log) = reader
            .next_piece()
            .map_err(|e| unreachable(format!("reading the snapshot of {group}: {e}")))?
        {
            let bytes = log.entry_bytes() as u64;
            self.rebuilds().take(bytes).await;
            let log = piece(seq, PieceBody::Log(log));
            self.call::<_, ()>(target, group, kind, &log, timeout, Batching::Alone)
                .await?;
            seq += 1;
            progress.add(bytes);
        }
        let end = piece(seq, PieceBody::End { vote, meta });
        Ok(self
            .call(target, group, kind, &end, timeout, Batching::Alone)
            .await?)
    }

    /// The same router, for openraft's heartbeat worker: its messages share batches.
    fn for_heartbeats(&self) -> PeerRouter {
        PeerRouter {
            inner: self.inner.clone(),
            heartbeats: true,
        }
    }

    /// Records (or updates) a node's peer address. `node` may be a member id: addresses
    /// belong to the node it lives on.
    pub fn set_address(&self, node: u64, addr: &str) {
        let node = crate::member_node(node).0;
        let mut addresses = self.inner.addresses.write().expect("addresses lock");
        if addresses.get(&node).map(String::as_str) != Some(addr) {
            addresses.insert(node, addr.to_string());
        }
    }

    fn channel(&self, target: u64) -> Result<(Channel, Coalescers), Unreachable<TypeConfig>> {
        let target = crate::member_node(target).0;
        let addr = self
            .inner
            .addresses
            .read()
            .expect("addresses lock")
            .get(&target)
            .cloned()
            .ok_or_else(|| unreachable(format!("no peer address known for node {target}")))?;
        if let Some((known, channel, coalescers)) = self
            .inner
            .channels
            .read()
            .expect("channels lock")
            .get(&target)
            && *known == addr
        {
            return Ok((channel.clone(), coalescers.clone()));
        }
        let channel = self
            .inner
            .connector
            .channel_to(&addr, target)
            .map_err(unreachable)?;
        let coalescers = Coalescers {
            heartbeats: batch_sender(&channel, target),
            elections: batch_sender(&channel, target),
            session: Session::new(channel.clone(), target),
        };
        self.inner
            .channels
            .write()
            .expect("channels lock")
            .insert(target, (addr, channel.clone(), coalescers.clone()));
        Ok((channel, coalescers))
    }

    /// Sends a node beat (see [`crate::quiet`]) to `node`.
    pub(crate) async fn quiet_beat(
        &self,
        node: u64,
        beat: &crate::quiet::QuietBeat,
        timeout: Duration,
    ) -> Result<(), Unreachable<TypeConfig>> {
        self.call(
            node,
            GroupId::from_u64(0),
            MessageKind::QuietBeat,
            beat,
            timeout,
            Batching::Alone,
        )
        .await
    }

    /// Sends one message; `batching` says whether it waits briefly to share a batch with
    /// other groups' messages to the same node (heartbeats, election messages). A failure
    /// is counted and summed up in the log ([`PeerFailures`]).
    async fn call<Req: Serialize, Resp: DeserializeOwned>(
        &self,
        target: u64,
        group: GroupId,
        kind: MessageKind,
        request: &Req,
        timeout: Duration,
        batching: Batching,
    ) -> Result<Resp, Unreachable<TypeConfig>> {
        let result = async {
            let payload = encode(request).map_err(unreachable)?;
            // A large message gets time for its size on top: replication of large entries (up
            // to 16 MiB a message) to a follower far behind must not time out for good on a
            // busy node, where openraft's timeouts (about 110 ms) assume small messages.
            let timeout = timeout + transfer_time(payload.len());
            let message = GroupMessage {
                group: group.to_u64(),
                kind: kind as i32,
                payload,
                from_node: self.inner.node_id,
                to_member: target,
            };
            let (channel, coalescers) = self.channel(target)?;
            let coalescer = match batching {
                Batching::Alone => None,
                Batching::Heartbeats => Some(coalescers.heartbeats),
                Batching::Elections => Some(coalescers.elections),
            };
            let reply = match coalescer {
                Some(coalescer) => tokio::time::timeout(timeout, coalescer.call(message))
                    .await
                    .map_err(|_| {
                        unreachable(format!(
                            "{}: no reply within {timeout:?}",
                            crate::describe_member(target)
                        ))
                    })?
                    .map_err(unreachable)?,
                None if goes_on_session(kind, &message) => {
                    match coalescers.session.call(message.clone(), timeout).await {
                        Ok(reply) => reply,
                        // A peer of an earlier release: the message goes as a call of its own.
                        Err(SessionError::Unsupported) => {
                            call_alone(channel, message, timeout, target).await?
                        }
                        Err(SessionError::Failed(error)) => return Err(unreachable(error)),
                    }
                }
                None => call_alone(channel, message, timeout, target).await?,
            };
            match reply.result {
                Some(group_reply::Result::Payload(bytes)) => decode(&bytes).map_err(unreachable),
                Some(group_reply::Result::Error(message)) => Err(unreachable(format!(
                    "{}: {message}",
                    crate::describe_member(target)
                ))),
                None => Err(unreachable(format!(
                    "{} sent an empty reply",
                    crate::describe_member(target)
                ))),
            }
        }
        .await;
        if let Err(error) = &result {
            self.inner.failures.record(
                crate::member_node(target).0,
                failure_kind(kind, batching),
                &error.to_string(),
            );
        }
        result
    }
}

/// Whether a message sent alone travels on the peer's session: all but snapshot pieces
/// and messages over [`SESSION_MESSAGE_BYTES_MAX`].
fn goes_on_session(kind: MessageKind, message: &GroupMessage) -> bool {
    !matches!(
        kind,
        MessageKind::SnapshotChunk | MessageKind::SnapshotPiece
    ) && message.payload.len() <= SESSION_MESSAGE_BYTES_MAX
}

/// Sends `message` to `target` as a unary call of its own (`RaftPeer.Call`).
async fn call_alone(
    channel: Channel,
    message: GroupMessage,
    timeout: Duration,
    target: u64,
) -> Result<GroupReply, Unreachable<TypeConfig>> {
    let mut client = RaftPeerClient::new(channel)
        .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
        .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    Ok(client
        .call(request)
        .await
        .map_err(|status| {
            unreachable(format!(
                "{}: {}",
                crate::describe_member(target),
                status.message()
            ))
        })?
        .into_inner())
}

/// The `kind` label of a failed call of `kind`.
fn failure_kind(kind: MessageKind, batching: Batching) -> &'static str {
    match (kind, batching) {
        (MessageKind::AppendEntries, Batching::Heartbeats) => "heartbeat",
        (MessageKind::AppendEntries, _) => "append",
        (MessageKind::Vote, _) => "vote",
        (MessageKind::PreVote, _) => "pre_vote",
        (MessageKind::SnapshotChunk | MessageKind::SnapshotPiece, _) => "snapshot",
        (MessageKind::TransferLeader, _) => "transfer_leader",
        (MessageKind::QuietBeat, _) => "node_beat",
        (MessageKind::Unspecified, _) => "unspecified",
    }
}

/// How long a peer that answered BatchStream with UNIMPLEMENTED (a node of an earlier
/// release, during a rolling upgrade) is sent Batch instead before it is asked again.
const BATCH_STREAM_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A coalescer sending its batches to `target` over `channel`: as a BatchStream, whose
/// replies come back one by one as the peer has them, or as a Batch (all replies at once)
/// to a peer that does not know BatchStream. The batch that finds out fails (once a
/// minute per peer of an earlier release).
fn batch_sender(channel: &Channel, target: u64) -> Coalescer {
    let channel = channel.clone();
    // Since when the peer has been sent Batch instead.
    let unstreamed: Arc<std::sync::Mutex<Option<Instant>>> = Arc::default();
    Coalescer::spawn(COALESCE_WINDOW, move |messages| {
        let mut client = RaftPeerClient::new(channel.clone())
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX);
        let unstreamed = unstreamed.clone();
        async move {
            let streams = unstreamed
                .lock()
                .expect("unstreamed lock")
                .is_none_or(|since| since.elapsed() >= BATCH_STREAM_RETRY_AFTER);
            if streams {
                let mut request = tonic::Request::new(GroupBatch { messages });
                request.set_timeout(BATCH_TIMEOUT);
                match client.batch_stream(request).await {
                    Ok(replies) => {
                        *unstreamed.lock().expect("unstreamed lock") = None;
                        let replies = replies.into_inner().map(move |reply| match reply {
                            Ok(reply) => {
                                Ok((reply.index as usize, reply.reply.unwrap_or_default()))
                            }
                            Err(status) => Err(format!("node {target}: {}", status.message())),
                        });
                        return Ok(replies.boxed());
                    }
                    Err(status) if status.code() == tonic::Code::Unimplemented => {
                        // This batch is lost (its messages are not kept for a second try:
                        // that would copy every batch for the minutes of an upgrade); Raft
                        // sends heartbeats and votes again anyway.
                        *unstreamed.lock().expect("unstreamed lock") = Some(Instant::now());
                        return Err(format!(
                            "node {target} does not know BatchStream (an earlier release): \
                             its batches go as Batch from now"
                        ));
                    }
                    Err(status) => return Err(format!("node {target}: {}", status.message())),
                }
            }
            let mut request = tonic::Request::new(GroupBatch { messages });
            request.set_timeout(BATCH_TIMEOUT);
            let replies = client
                .batch(request)
                .await
                .map_err(|status| format!("node {target}: {}", status.message()))?
                .into_inner()
                .replies;
            Ok(futures::stream::iter(replies.into_iter().enumerate().map(Ok)).boxed())
        }
    })
}

/// The slowest rate a peer connection is expected to carry a message at.
const MESSAGE_BYTES_PER_SECOND_FLOOR: f64 = 8.0 * 1024.0 * 1024.0;

/// How long a message of `bytes` may take to travel, at the slowest expected rate.
fn transfer_time(bytes: usize) -> Duration {
    Duration::from_secs_f64(bytes as f64 / MESSAGE_BYTES_PER_SECOND_FLOOR)
}

/// Whether an AppendEntries waits to share a batch: only heartbeats (no entries, sent by
/// openraft's heartbeat worker) do. Votes and pre-votes always do, in batches of their own
/// (see [`GroupRouter::vote`]).
fn append_batching(heartbeat_client: bool, entries: usize) -> Batching {
    if heartbeat_client && entries == 0 {
        Batching::Heartbeats
    } else {
        Batching::Alone
    }
}

/// How long replication's AppendEntries waits for its reply at least, whatever openraft
/// asks (112 ms, three quarters of the heartbeat interval). A follower answers once the
/// entries (and those before them) are on its disk; on a loaded node (hundreds of groups
/// electing or writing at once) that can take longer than openraft's timeout, and a
/// timed-out request is sent again: the follower stores the same entries twice, its load
/// grows, and the next try times out as well (a probe with no entries, the first request
/// of every new stream, waits for the follower's pending writes just the same). Replication
/// sends one request at a time to each follower, so nothing queues behind a slow reply; a
/// follower that is gone is given up on after this long, while writes commit on the other
/// replicas.
pub const APPEND_REPLY_TIMEOUT_MIN: Duration = Duration::from_secs(1);

/// The timeout of an AppendEntries. A heartbeat gets openraft's whole `hard_ttl` (the
/// heartbeat interval, which openraft enforces itself): a leader whose heartbeats no
/// majority answers within it loses its lease and turns writes away, so every millisecond
/// of a slow follower's answer counts. Replication's requests get at least
/// [`APPEND_REPLY_TIMEOUT_MIN`].
fn append_timeout(option: &RPCOption, batching: Batching) -> Duration {
    if batching == Batching::Heartbeats {
        option.hard_ttl()
    } else {
        option.soft_ttl().max(APPEND_REPLY_TIMEOUT_MIN)
    }
}

fn unreachable(err: impl std::fmt::Display) -> Unreachable<TypeConfig> {
    Unreachable::new(&std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        err.to_string(),
    ))
}

impl GroupRouter<TypeConfig, GroupId> for PeerRouter {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &self,
        target: u64,
        group: GroupId,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let batching = append_batching(self.heartbeats, rpc.entries.len());
        // A partition's entries make a round trip of the `replication` stage.
        let timed = (!rpc.entries.is_empty() && group != GroupId::CONTROLLER).then(Instant::now);
        let timeout = append_timeout(&option, batching);
        let reply = self
            .call(
                target,
                group,
                MessageKind::AppendEntries,
                &rpc,
                timeout,
                batching,
            )
            .await?;
        if let Some(since) = timed {
            SendStage::Replication.record_since(since);
        }
        Ok(reply)
    }

    /// Votes and pre-votes share batches with heartbeats. A hub's groups are created at
    /// once and all elect at once (hundreds per node, a pre-vote and a vote to each peer);
    /// one call each opened that many HTTP/2 streams, and each that timed out was reset.
    /// Past a few dozen resets a peer's server closes the whole connection (hyper's guard
    /// against reset floods), failing every group's heartbeats and replication on it, and
    /// the elections that follow timed out in turn. A 20 ms window is small against the
    /// election timeout (400 ms and more). A vote is waited for as long as openraft waits
    /// (its `hard_ttl`, which it enforces itself): a busy voter's late answer still elects.
    async fn vote(
        &self,
        target: u64,
        group: GroupId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Ok(self
            .call(
                target,
                group,
                MessageKind::Vote,
                &rpc,
                option.hard_ttl(),
                Batching::Elections,
            )
            .await?)
    }

    async fn pre_vote(
        &self,
        target: u64,
        group: GroupId,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        Ok(self
            .call(
                target,
                group,
                MessageKind::PreVote,
                &rpc,
                option.hard_ttl(),
                Batching::Elections,
            )
            .await?)
    }

    async fn full_snapshot(
        &self,
        target: u64,
        group: GroupId,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let data = match snapshot.snapshot {
            SnapshotData::Stored(stored) => {
                let timeout = option.hard_ttl().max(SNAPSHOT_PIECE_TIMEOUT_MIN);
                let send = self.send_stored(target, group, vote, snapshot.meta, stored, timeout);
                // A leader that steps down stops sending at once.
                let sent = tokio::select! {
                    sent = send => sent,
                    closed = cancel => Err(closed.into()),
                };
                if let Err(err) = &sent {
                    tracing::warn!(%group, target = %crate::describe_member(target), %err,
                        "a snapshot transfer stopped; openraft sends one again (the same snapshot goes on \
                         where it stopped)");
                }
                return sent;
            }
            SnapshotData::Whole(data) => Bytes::from(data.into_inner()),
        };
        // Sent in chunks, one at a time: no message nears the transport's size limit, and
        // a receiver that restarts mid-way makes the leader start over (offset 0).
        let transfer = rand::random::<u64>();
        let mut offset = 0usize;
        loop {
            let end = (offset + SNAPSHOT_PIECE_BYTES).min(data.len());
            let last = end == data.len();
            let chunk = SnapshotChunk {
                transfer,
                offset: offset as u64,
                data: data.slice(offset..end),
                done: last.then(|| (vote, snapshot.meta.clone())),
            };
            if last {
                return Ok(self
                    .call(
                        target,
                        group,
                        MessageKind::SnapshotChunk,
                        &chunk,
                        option.hard_ttl(),
                        Batching::Alone,
                    )
                    .await?);
            }
            self.call::<_, ()>(
                target,
                group,
                MessageKind::SnapshotChunk,
                &chunk,
                option.hard_ttl(),
                Batching::Alone,
            )
            .await?;
            offset = end;
        }
    }

    async fn transfer_leader(
        &self,
        target: u64,
        group: GroupId,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        Ok(self
            .call(
                target,
                group,
                MessageKind::TransferLeader,
                &req,
                option.soft_ttl(),
                Batching::Alone,
            )
            .await?)
    }

    fn backoff(&self) -> Option<Backoff> {
        Some(Backoff::new(std::iter::repeat(Duration::from_millis(200))))
    }
}

/// The per-group network factory openraft asks for: the shared router bound to a group.
pub type NetworkFactory = GroupNetworkFactory<PeerRouter, GroupId>;

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &openraft::BasicNode) -> Self::Network {
        self.factory.set_address(target, &node.addr);
        PeerClient(GroupNetworkAdapter::new(
            self.factory.clone(),
            target,
            self.group_id,
        ))
    }

    async fn new_heartbeat_client(
        &mut self,
        target: u64,
        node: &openraft::BasicNode,
    ) -> Self::Network {
        self.factory.set_address(target, &node.addr);
        PeerClient(GroupNetworkAdapter::new(
            self.factory.for_heartbeats(),
            target,
            self.group_id,
        ))
    }
}

/// One group's client of one peer: the router's calls, and replication's stream of
/// AppendEntries, which for a partition sends no request that only tells the follower of a
/// new commit.
pub struct PeerClient(GroupNetworkAdapter<TypeConfig, GroupId, PeerRouter>);

/// Whether an AppendEntries of a replication stream need not be sent: it carries no entries
/// and the follower already acknowledged its `prev_log_id` in this stream, so all it could
/// tell is the leader's new commit index. Openraft sends one after every commit, a second
/// round trip per write to each follower; the follower learns the commit from the next
/// AppendEntries instead, with entries or a heartbeat (every heartbeat interval while the
/// group is awake, and a group sleeps only after its followers heard for a while). Nothing
/// waits on a partition follower's commit index: reads are served by leaders, and a new
/// leader commits its own entry before it serves. The controller's followers are different:
/// every node routes by the cluster state its replica of the controller applied (a hub
/// created through one node must be known to the next at once), so the controller's notices
/// are sent. A probe (the first request of a stream, or any whose `prev_log_id` the
/// follower has not acknowledged) is always sent.
fn commit_notice_only(
    request: &AppendEntriesRequest<TypeConfig>,
    acknowledged: Option<&Option<LogId>>,
) -> bool {
    request.entries.is_empty() && acknowledged == Some(&request.prev_log_id)
}

/// Replication's stream of AppendEntries to one follower over `network`: openraft's
/// sequential stream (one request in flight, a reply for each), except that, with
/// `defer_commit_notices`, requests that only carry a commit index are not sent
/// ([`commit_notice_only`]) and get no reply: openraft takes replies as cumulative
/// acknowledgements, so the next one covers them.
fn replication_stream<'s, N, S>(
    network: &'s mut N,
    input: S,
    option: RPCOption,
    defer_commit_notices: bool,
) -> BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>
where
    N: NetAppend<TypeConfig> + ?Sized,
    S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
{
    // The state: the client, the requests, and the last entry the follower acknowledged
    // in this stream (`None` before its first reply).
    let start: Option<(&'s mut N, S, Option<Option<LogId>>)> = Some((network, input, None));
    let replies = futures::stream::unfold(start, move |state| {
        let option = option.clone();
        async move {
            let (client, mut input, acknowledged) = state?;
            let request = loop {
                let request = input.next().await?;
                if defer_commit_notices && commit_notice_only(&request, acknowledged.as_ref()) {
                    metrics::counter!("tributary_raft_commit_notices_deferred_total").increment(1);
                    continue;
                }
                break request;
            };
            let prev = request.prev_log_id;
            let last = request.entries.last().map(|e| e.log_id).or(prev);
            match client.append_entries(request, option).await {
                Ok(reply) => {
                    let partial = match &reply {
                        AppendEntriesResponse::PartialSuccess(upto) => Some(*upto),
                        _ => None,
                    };
                    let result = reply.into_stream_result(prev, last);
                    // A failure ends the stream, and so does a partial success that
                    // stopped short of the request's last entry (openraft starts a new
                    // stream from what was acknowledged).
                    let next = match (&result, partial) {
                        (Err(_), _) => None,
                        (Ok(_), Some(upto)) if upto != last => None,
                        (Ok(matched), _) => Some((client, input, Some(*matched))),
                    };
                    Some((Ok(result), next))
                }
                Err(err) => Some((Err(err), None)),
            }
        }
    });
    Box::pin(replies)
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        RaftNetworkV2::append_entries(&mut self.0, rpc, option).await
    }

    /// See [`replication_stream`].
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<
        's,
        Result<
            BoxStream<'s, Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>>,
            RPCError<TypeConfig>,
        >,
    >
    where
        S: Stream<Item = AppendEntriesRequest<TypeConfig>> + OptionalSend + Unpin + 'static,
    {
        let defer_commit_notices = *self.0.group_id() != GroupId::CONTROLLER;
        let replies = replication_stream(&mut self.0, input, option, defer_commit_notices);
        Box::pin(async move { Ok(replies) })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.vote(rpc, option).await
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.pre_vote(rpc, option).await
    }

    async fn full_snapshot(
        &mut self,
        vote: VoteOf<TypeConfig>,
        snapshot: SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        self.0.full_snapshot(vote, snapshot, cancel, option).await
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        self.0.transfer_leader(req, option).await
    }

    fn backoff(&self) -> Option<Backoff> {
        self.0.backoff()
    }
}

#[cfg(test)]
mod tests {
    use super::{
        APPEND_REPLY_TIMEOUT_MIN, Batching, append_batching, append_timeout, replication_stream,
        transfer_time,
    };
    use crate::types::{Entry, LogId, TypeConfig};
    use futures::StreamExt;
    use openraft::EntryPayload;
    use openraft::alias::VoteOf;
    use openraft::error::RPCError;
    use openraft::network::{NetAppend, RPCOption};
    use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, StreamAppendError};
    use std::collections::VecDeque;
    use std::sync::atomic::Ordering;
    use std::time::Duration;

    fn log_id(index: u64) -> LogId {
        openraft::testing::log_id::<TypeConfig>(3, 1, index)
    }

    /// An AppendEntries after `prev` with entries `indexes`, carrying commit `commit`.
    fn request(prev: u64, indexes: &[u64], commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: VoteOf::<TypeConfig>::new_committed(3, 1),
            prev_log_id: Some(log_id(prev)),
            leader_commit: Some(log_id(commit)),
            entries: indexes
                .iter()
                .map(|i| Entry {
                    log_id: log_id(*i),
                    payload: EntryPayload::Blank,
                })
                .collect(),
        }
    }

    /// A follower that records what reaches it and answers from a script.
    #[derive(Default)]
    struct Follower {
        received: Vec<(Option<LogId>, usize)>,
        answers: VecDeque<AppendEntriesResponse<TypeConfig>>,
    }

    impl NetAppend<TypeConfig> for Follower {
        async fn append_entries(
            &mut self,
            rpc: AppendEntriesRequest<TypeConfig>,
            _option: RPCOption,
        ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
            self.received.push((rpc.prev_log_id, rpc.entries.len()));
            Ok(self
                .answers
                .pop_front()
                .unwrap_or(AppendEntriesResponse::Success))
        }
    }

    fn run(
        follower: &mut Follower,
        requests: Vec<AppendEntriesRequest<TypeConfig>>,
    ) -> Vec<Result<Option<LogId>, StreamAppendError<TypeConfig>>> {
        run_deferring(follower, requests, true)
    }

    fn run_deferring(
        follower: &mut Follower,
        requests: Vec<AppendEntriesRequest<TypeConfig>>,
        defer_commit_notices: bool,
    ) -> Vec<Result<Option<LogId>, StreamAppendError<TypeConfig>>> {
        let option = RPCOption::new(Duration::from_millis(100));
        futures::executor::block_on(
            replication_stream(
                follower,
                futures::stream::iter(requests),
                option,
                defer_commit_notices,
            )
            .map(|reply| reply.expect("the fake follower always answers"))
            .collect(),
        )
    }

    /// A request that only carries a new commit index, after the follower acknowledged its
    /// `prev_log_id`, is not sent and gets no reply; the next request with entries is.
    #[test]
    fn commit_notices_after_an_acknowledgement_are_not_sent() {
        let mut follower = Follower::default();
        let replies = run(
            &mut follower,
            vec![
                request(4, &[5, 6], 4),
                request(6, &[], 6),
                request(6, &[7], 6),
                request(7, &[], 7),
            ],
        );
        assert_eq!(
            follower.received,
            vec![(Some(log_id(4)), 2), (Some(log_id(6)), 1)]
        );
        assert_eq!(replies, vec![Ok(Some(log_id(6))), Ok(Some(log_id(7)))]);
    }

    /// The controller's followers hear of every commit at once: its notices are sent.
    #[test]
    fn commit_notices_are_sent_when_not_deferred() {
        let mut follower = Follower::default();
        let replies = run_deferring(
            &mut follower,
            vec![request(4, &[5, 6], 4), request(6, &[], 6)],
            false,
        );
        assert_eq!(
            follower.received,
            vec![(Some(log_id(4)), 2), (Some(log_id(6)), 0)]
        );
        assert_eq!(replies, vec![Ok(Some(log_id(6))), Ok(Some(log_id(6)))]);
    }

    /// An entry-less request is sent when the follower has not acknowledged its
    /// `prev_log_id` in this stream: the stream's first request (a probe), or one after a
    /// reply that acknowledged less.
    #[test]
    fn probes_are_always_sent() {
        let mut follower = Follower::default();
        let replies = run(&mut follower, vec![request(4, &[], 4), request(4, &[], 5)]);
        // The second repeats an acknowledged point: a commit notice.
        assert_eq!(follower.received, vec![(Some(log_id(4)), 0)]);
        assert_eq!(replies, vec![Ok(Some(log_id(4)))]);

        let mut follower = Follower {
            answers: [AppendEntriesResponse::PartialSuccess(Some(log_id(5)))].into(),
            ..Follower::default()
        };
        let replies = run(
            &mut follower,
            vec![request(4, &[5, 6], 4), request(6, &[], 6)],
        );
        // A partial success ends the stream: openraft starts the next from entry 5.
        assert_eq!(follower.received, vec![(Some(log_id(4)), 2)]);
        assert_eq!(replies, vec![Ok(Some(log_id(5)))]);
    }

    /// A conflict is passed on and ends the stream.
    #[test]
    fn a_conflict_ends_the_stream() {
        let mut follower = Follower {
            answers: [AppendEntriesResponse::Conflict].into(),
            ..Follower::default()
        };
        let replies = run(
            &mut follower,
            vec![request(4, &[5], 4), request(5, &[6], 4)],
        );
        assert_eq!(follower.received, vec![(Some(log_id(4)), 1)]);
        assert_eq!(replies, vec![Err(StreamAppendError::Conflict(log_id(4)))]);
    }

    /// A message gets time for its size: 16 MiB of entries two seconds more than an empty
    /// heartbeat, which gets (practically) none.
    #[test]
    fn large_messages_get_time_for_their_size() {
        assert_eq!(transfer_time(16 * 1024 * 1024), Duration::from_secs(2));
        assert!(transfer_time(200) < Duration::from_micros(50));
    }

    #[test]
    fn only_the_heartbeat_clients_empty_appends_wait_for_a_batch() {
        assert_eq!(append_batching(true, 0), Batching::Heartbeats);
        // Replication's empty AppendEntries carries the commit index; the stream's next
        // entries wait for its reply, so it must not wait out a batching window.
        assert_eq!(append_batching(false, 0), Batching::Alone);
        assert_eq!(append_batching(false, 3), Batching::Alone);
        assert_eq!(append_batching(true, 3), Batching::Alone);
    }

    /// Openraft asks 112 ms of both (three quarters of the 150 ms heartbeat interval): a
    /// heartbeat gets the whole interval, replication a second.
    #[test]
    fn heartbeats_get_the_whole_interval_and_replication_a_second() {
        let option = RPCOption::new(Duration::from_millis(150));
        assert_eq!(
            append_timeout(&option, Batching::Heartbeats),
            Duration::from_millis(150)
        );
        assert_eq!(
            append_timeout(&option, Batching::Alone),
            APPEND_REPLY_TIMEOUT_MIN
        );
        let long = RPCOption::new(Duration::from_secs(4));
        assert_eq!(append_timeout(&long, Batching::Alone), long.soft_ttl());
    }

    /// A router to node 2, a stand-in peer serving there as `peer` says.
    async fn router_to(peer: &crate::session::stub::Peer) -> super::PeerRouter {
        // Dropping the cutter leaves the proxy's connections up.
        let (addr, _) = crate::session::stub::serve(peer.clone()).await;
        let router = super::PeerRouter::new(1, super::TcpConnector);
        router.set_address(2, &addr);
        router
    }

    /// Sends `value` to node 2 alone (not batched) as a message of `kind`; its reply.
    async fn send<T>(router: &super::PeerRouter, kind: super::MessageKind, value: &T) -> T
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        router
            .call(
                2,
                tributary_types::GroupId::from_u64(9),
                kind,
                value,
                Duration::from_secs(30),
                Batching::Alone,
            )
            .await
            .unwrap()
    }

    /// Replication goes on the peer's session, but a snapshot piece or a message larger
    /// than [`super::SESSION_MESSAGE_BYTES_MAX`] goes as a call of its own.
    #[tokio::test]
    async fn replication_goes_on_the_session_and_large_messages_alone() {
        use super::{MessageKind, SESSION_MESSAGE_BYTES_MAX};
        let peer = crate::session::stub::Peer::default();
        let router = router_to(&peer).await;
        for (kind, value) in [
            (MessageKind::AppendEntries, vec![1, 2, 3]),
            (MessageKind::TransferLeader, vec![4]),
        ] {
            assert_eq!(send(&router, kind, &value).await, value);
        }
        assert_eq!(peer.session_messages.load(Ordering::SeqCst), 2);
        assert_eq!(peer.calls.load(Ordering::SeqCst), 0);
        for (kind, value) in [
            (MessageKind::SnapshotPiece, vec![5]),
            (
                MessageKind::AppendEntries,
                vec![6; SESSION_MESSAGE_BYTES_MAX + 1],
            ),
        ] {
            assert_eq!(send(&router, kind, &value).await, value);
        }
        assert_eq!(peer.session_messages.load(Ordering::SeqCst), 2);
        assert_eq!(peer.calls.load(Ordering::SeqCst), 2);
        assert_eq!(peer.sessions.load(Ordering::SeqCst), 1);
    }

    /// A peer of an earlier release (one without sessions) gets replication as calls of
    /// their own, the message that found out included, and is not asked again at once.
    #[tokio::test]
    async fn replication_to_a_peer_without_sessions_goes_as_calls() {
        let peer = crate::session::stub::Peer::default();
        peer.mode
            .store(crate::session::stub::UNIMPLEMENTED, Ordering::SeqCst);
        let router = router_to(&peer).await;
        for value in [5u64, 6, 7] {
            assert_eq!(
                send(&router, super::MessageKind::AppendEntries, &value).await,
                value
            );
        }
        assert_eq!(peer.sessions.load(Ordering::SeqCst), 1);
        assert_eq!(peer.calls.load(Ordering::SeqCst), 3);
    }
}
