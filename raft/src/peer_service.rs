//! The receiving end of the peer transport: decodes each group-tagged message and hands it
//! to the group, if this node hosts it. Unknown groups (or stale incarnations) are an error
//! reply, never an auto-created group.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use openraft::raft::{AppendEntriesRequest, TransferLeaderRequest, VoteRequest};
use openraft::storage::RaftStateMachine;
use tonic::{Request, Response, Status, Streaming};
use tributary_proto::peer::raft_peer_server::{RaftPeer, RaftPeerServer};
use tributary_proto::peer::{
    GroupBatch, GroupBatchReply, GroupMessage, GroupReply, IndexedReply, MessageKind,
    SessionMessage, SessionReply, group_reply,
};
use tributary_types::{GroupId, SendStage};

use crate::host::GroupHost;
use crate::log_store::{decode, encode};
use crate::network::{PEER_MESSAGE_BYTES_MAX, PieceBody, SnapshotChunk, SnapshotPiece};
use crate::quiet::QuietBeat;
use crate::rebuild::{Direction, RebuildHandle};
use crate::snapshot_stream::{Stager, discard};
use crate::types::{Raft, SnapshotData, TypeConfig};

/// Who is calling over a peer connection, as the node's peer port admitted it: the connect
/// info of every peer-port request (found in its extensions).
#[derive(Debug, Clone, Default)]
pub struct PeerCaller {
    pub remote_addr: Option<std::net::SocketAddr>,
    /// The node id the caller's certificate names (mutual TLS); `None` without
    /// certificates.
    pub node: Option<u64>,
}

impl PeerCaller {
    /// Refuses a request that claims to come from node `claimed` over a connection whose
    /// certificate names another node: a node's certificate speaks for that node only.
    pub fn check_sender<T>(request: &Request<T>, claimed: u64) -> Result<(), Status> {
        Self::check_node(Self::node_of(request), claimed)
    }

    /// The node the certificate of `request`'s connection names, if it has one.
    fn node_of<T>(request: &Request<T>) -> Option<u64> {
        request
            .extensions()
            .get::<PeerCaller>()
            .and_then(|caller| caller.node)
    }

    /// Refuses a message that claims to come from node `claimed` over a connection whose
    /// certificate names `node`, another node.
    fn check_node(node: Option<u64>, claimed: u64) -> Result<(), Status> {
        let Some(node) = node else {
            return Ok(());
        };
        if node == claimed {
            return Ok(());
        }
        metrics::counter!("tributary_peer_refused_total", "reason" => "wrong_node").increment(1);
        Err(Status::permission_denied(format!(
            "this connection's certificate names node {node}, but the message claims to come \
             from node {claimed}"
        )))
    }
}

/// Snapshots being received whole, by group: the transfer id and the bytes so far.
type WholeSnapshots = HashMap<GroupId, (u64, Vec<u8>)>;

/// Serves the peer port for the groups of one host.
pub struct PeerService<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    host: Arc<GroupHost<SM>>,
    /// Snapshots being received whole, one per group: the transfer id and the bytes so far.
    snapshots: Arc<Mutex<WholeSnapshots>>,
    /// Snapshots being received piece by piece, one per group; the lock is held while a
    /// piece is stored or the snapshot installed, so those never overlap.
    streamed: Arc<Mutex<HashMap<GroupId, Slot>>>,
    /// Turns true when the node stops: every session peers hold to this port ends then
    /// (see [`PeerService::ending_sessions_on`]).
    stop: Option<tokio::sync::watch::Receiver<bool>>,
}

/// Another handle on the same service (a BatchStream's replies outlive the call that
/// started them).
impl<SM> Clone for PeerService<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    fn clone(&self) -> Self {
        Self {
            host: self.host.clone(),
            snapshots: self.snapshots.clone(),
            streamed: self.streamed.clone(),
            stop: self.stop.clone(),
        }
    }
}

/// Where one group's streamed snapshot is received.
type Slot = Arc<tokio::sync::Mutex<Option<Receiving>>>;

/// A transfer that has sent no piece for this long is abandoned (its sender died or
/// stepped down): what it staged is discarded and it no longer shows as a rebuild.
const TRANSFER_IDLE_MAX: Duration = Duration::from_secs(60);

/// A snapshot being received piece by piece, staged in storage until its last piece
/// installs it.
struct Receiving {
    transfer: u64,
    /// The snapshot's point.
    point: Option<crate::LogId>,
    /// The piece expected next.
    next_seq: u64,
    stager: Stager,
    progress: RebuildHandle,
    last_piece: tokio::time::Instant,
}

impl<SM> PeerService<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    /// The service for `host`'s groups; call within a Tokio runtime (it starts the task that
    /// abandons idle transfers).
    pub fn new(host: Arc<GroupHost<SM>>) -> Self {
        let service = Self {
            host,
            snapshots: Arc::new(Mutex::new(HashMap::new())),
            streamed: Arc::new(Mutex::new(HashMap::new())),
            stop: None,
        };
        service.reap_idle_transfers();
        service
    }

    /// Ends every session peers hold to this port once `stop` turns true (the node is
    /// stopping), and refuses new ones from then on. A session never ends by itself (its
    /// peer keeps it for the life of the connection), and a server's graceful shutdown
    /// waits for every open stream: without this, a stopping node would wait for its
    /// drain timeout and cut them off.
    pub fn ending_sessions_on(mut self, stop: tokio::sync::watch::Receiver<bool>) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Abandons the transfers idle for longer than [`TRANSFER_IDLE_MAX`], every few
    /// seconds, until the service is dropped.
    fn reap_idle_transfers(&self) {
        let streamed = Arc::downgrade(&self.streamed);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(TRANSFER_IDLE_MAX / 6);
            loop {
                tick.tick().await;
                let Some(streamed) = streamed.upgrade() else {
                    return;
                };
                abandon_idle(&streamed).await;
            }
        });
    }

    /// Stores one piece of a streamed snapshot; the last one installs it.
    async fn snapshot_piece(
        &self,
        raft: &Raft<SM>,
        group: GroupId,
        from_node: u64,
        bytes: &[u8],
    ) -> Result<Bytes, String> {
        let piece: SnapshotPiece = decode(bytes).map_err(|e| e.to_string())?;
        metrics::counter!("tributary_peer_snapshot_chunks_received_total").increment(1);
        let slot = self
            .streamed
            .lock()
            .expect("streamed lock")
            .entry(group)
            .or_default()
            .clone();
        let mut slot = slot.lock().await;
        let receiving = match piece.body {
            PieceBody::Begin {
                point,
                state,
                first_log,
                last_log,
                bytes,
            } => {
                // The same snapshot as the transfer under way (which its sender gave up,
                // say after a timeout): go on where it stopped.
                if let Some(r) = slot.as_mut()
                    && r.point == point
                    && r.stager.continues(first_log, last_log, &state)
                {
                    r.transfer = piece.transfer;
                    r.next_seq = 1;
                    r.last_piece = tokio::time::Instant::now();
                    return encode(&r.stager.next_log()).map_err(|e| e.to_string());
                }
                if piece.seq != 0 {
                    return Err(format!(
                        "a snapshot of {group} cannot begin with piece {}",
                        piece.seq
                    ));
                }
                if let Some(r) = slot.as_ref() {
                    tracing::info!(%group, from_node, point = ?point, replaced = ?r.point,
                        received_through = r.stager.next_log().saturating_sub(1),
                        "a snapshot transfer of another point replaces the one under way");
                }
                let shard = self
                    .host
                    .shard_of(group)
                    .ok_or_else(|| format!("group {group} is not running on this node"))?;
                *slot = None;
                let stager = Stager::begin(shard, group, state, first_log, last_log, bytes)
                    .await
                    .map_err(|e| e.to_string())?;
                *slot = Some(Receiving {
                    transfer: piece.transfer,
                    point,
                    next_seq: 1,
                    last_piece: tokio::time::Instant::now(),
                    stager,
                    progress: self.host.rebuilds().start(
                        group,
                        Direction::Receive,
                        from_node,
                        bytes,
                    ),
                });
                return encode(&first_log).map_err(|e| e.to_string());
            }
            _ => match slot.as_mut() {
                Some(r) if r.transfer == piece.transfer && r.next_seq == piece.seq => r,
                Some(r) if r.transfer == piece.transfer => {
                    let expected = r.next_seq;
                    *slot = None;
                    return Err(format!(
                        "piece {} of the snapshot of {group} came when piece {expected} was \
                         expected; start again",
                        piece.seq
                    ));
                }
                _ => {
                    return Err(format!(
                        "piece {} of a snapshot of {group} this node is not receiving; start \
                         again",
                        piece.seq
                    ));
                }
            },
        };
        match piece.body {
            PieceBody::Begin { .. } => unreachable!("handled above"),
            PieceBody::Log(piece) => {
                let bytes = piece.entry_bytes() as u64;
                self.host.rebuilds().take(bytes).await;
                if let Err(err) = receiving.stager.piece(piece).await {
                    *slot = None;
                    return Err(format!("{err}; start again"));
                }
                receiving.next_seq += 1;
                receiving.last_piece = tokio::time::Instant::now();
                receiving.progress.add(bytes);
                encode(&()).map_err(|e| e.to_string())
            }
            PieceBody::End { vote, meta } => {
                let receiving = slot.take().expect("matched above");
                let last_log = meta.last_log_id.map_or(0, |id| id.index);
                let stored = receiving
                    .stager
                    .finish(last_log)
                    .map_err(|e| format!("{e}; start again"))?;
                let shard = stored.shard.clone();
                let snapshot = openraft::alias::SnapshotOf::<TypeConfig, SnapshotData> {
                    meta,
                    snapshot: SnapshotData::Stored(stored),
                };
                let installed = raft.install_full_snapshot(vote, snapshot).await;
                // Installed, the staged rows have moved; refused (a stale leader's, or one
                // the replica does not need), they go.
                if let Err(err) = discard(&shard, group).await {
                    tracing::warn!(%group, %err, "could not discard a staged snapshot");
                }
                drop(receiving.progress);
                encode(&installed.map_err(|e| e.to_string())?).map_err(|e| e.to_string())
            }
        }
    }

    /// Collects a snapshot's pieces; installs it when the last one arrives.
    async fn snapshot_chunk(
        &self,
        raft: &Raft<SM>,
        group: GroupId,
        bytes: &[u8],
    ) -> Result<Bytes, String> {
        let chunk: SnapshotChunk = decode(bytes).map_err(|e| e.to_string())?;
        metrics::counter!("tributary_peer_snapshot_chunks_received_total").increment(1);
        let complete = {
            let mut snapshots = self.snapshots.lock().expect("snapshots lock");
            if chunk.offset == 0 {
                snapshots.insert(group, (chunk.transfer, Vec::new()));
            }
            let Some((transfer, data)) = snapshots.get_mut(&group) else {
                return Err(format!(
                    "snapshot piece at offset {} of a transfer this node never saw start; start again",
                    chunk.offset
                ));
            };
            if *transfer != chunk.transfer || data.len() as u64 != chunk.offset {
                snapshots.remove(&group);
                return Err(format!(
                    "snapshot piece at offset {} does not follow the pieces received; start again",
                    chunk.offset
                ));
            }
            data.extend_from_slice(&chunk.data);
            match chunk.done {
                Some(done) => snapshots.remove(&group).map(|(_, data)| (done, data)),
                None => None,
            }
        };
        let Some(((vote, meta), data)) = complete else {
            return encode(&()).map_err(|e| e.to_string());
        };
        let snapshot = openraft::alias::SnapshotOf::<TypeConfig, SnapshotData> {
            meta,
            snapshot: SnapshotData::new(data),
        };
        let resp = raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(|e| e.to_string())?;
        encode(&resp).map_err(|e| e.to_string())
    }

    /// The tonic service to add to a server on the peer port.
    pub fn into_server(self) -> RaftPeerServer<Self> {
        RaftPeerServer::new(self)
            .max_decoding_message_size(PEER_MESSAGE_BYTES_MAX)
            .max_encoding_message_size(PEER_MESSAGE_BYTES_MAX)
    }

    async fn handle(&self, message: GroupMessage) -> GroupReply {
        let result = if message.kind == MessageKind::QuietBeat as i32 {
            self.quiet_beat(&message)
        } else {
            self.group_message(message).await
        };
        GroupReply {
            result: Some(match result {
                Ok(payload) => group_reply::Result::Payload(payload),
                Err(error) => group_reply::Result::Error(error),
            }),
        }
    }

    fn quiet_beat(&self, message: &GroupMessage) -> Result<Bytes, String> {
        let beat: QuietBeat = decode(&message.payload).map_err(|e| e.to_string())?;
        self.host.beats().record(message.from_node, beat);
        encode(&()).map_err(|e| e.to_string())
    }

    async fn group_message(&self, message: GroupMessage) -> Result<Bytes, String> {
        match self.host.get_member(GroupId::from_u64(message.group)) {
            Some((member, _)) if message.to_member != 0 && message.to_member != member => {
                Err(format!(
                    "group {} on this node is {}, not {}: the data of that member is gone",
                    GroupId::from_u64(message.group),
                    crate::describe_member(member),
                    crate::describe_member(message.to_member)
                ))
            }
            Some((_, raft)) if message.kind == MessageKind::SnapshotChunk as i32 => {
                self.snapshot_chunk(&raft, GroupId::from_u64(message.group), &message.payload)
                    .await
            }
            Some((_, raft)) if message.kind == MessageKind::SnapshotPiece as i32 => {
                self.snapshot_piece(
                    &raft,
                    GroupId::from_u64(message.group),
                    message.from_node,
                    &message.payload,
                )
                .await
            }
            Some((_, raft)) => dispatch(&raft, message).await,
            None => Err(format!(
                "group {} is not hosted on node {}",
                GroupId::from_u64(message.group),
                self.host.node_id()
            )),
        }
    }
}

/// Abandons every transfer that has sent no piece for longer than [`TRANSFER_IDLE_MAX`]:
/// what it staged is discarded. One storing a piece now (its slot locked) is not idle.
async fn abandon_idle(streamed: &Mutex<HashMap<GroupId, Slot>>) {
    let slots: Vec<(GroupId, Slot)> = streamed
        .lock()
        .expect("streamed lock")
        .iter()
        .map(|(group, slot)| (*group, slot.clone()))
        .collect();
    for (group, slot) in slots {
        let Ok(mut slot) = slot.try_lock() else {
            continue;
        };
        let idle = slot
            .as_ref()
            .is_some_and(|r| r.last_piece.elapsed() > TRANSFER_IDLE_MAX);
        if !idle {
            continue;
        }
        if let Some(receiving) = slot.take() {
            tracing::info!(%group, "abandoning a snapshot no longer being sent");
            let shard = receiving.stager.shard().clone();
            drop(receiving);
            if let Err(err) = discard(&shard, group).await {
                tracing::warn!(%group, %err, "could not discard a staged snapshot");
            }
        }
    }
}

async fn dispatch<SM>(raft: &Raft<SM>, message: GroupMessage) -> Result<Bytes, String>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    let bytes = &message.payload;
    let kind = MessageKind::try_from(message.kind).unwrap_or(MessageKind::Unspecified);
    let text = |e: &dyn std::fmt::Display| e.to_string();
    match kind {
        MessageKind::AppendEntries => {
            // The entries' events stay in the message's buffer (no copy).
            let req: AppendEntriesRequest<TypeConfig> =
                tributary_types::format::decode_shared(bytes).map_err(|e| text(&e))?;
            // A partition's entries: the follower's part of their replication is timed.
            let timed = (!req.entries.is_empty() && message.group != GroupId::CONTROLLER.to_u64())
                .then(Instant::now);
            let resp = raft.append_entries(req).await.map_err(|e| text(&e))?;
            let reply = encode(&resp).map_err(|e| text(&e));
            if let Some(since) = timed {
                SendStage::FollowerHandle.record_since(since);
            }
            reply
        }
        MessageKind::Vote => {
            let req: VoteRequest<TypeConfig> = decode(bytes).map_err(|e| text(&e))?;
            let resp = raft.vote(req).await.map_err(|e| text(&e))?;
            encode(&resp).map_err(|e| text(&e))
        }
        MessageKind::PreVote => {
            let req: VoteRequest<TypeConfig> = decode(bytes).map_err(|e| text(&e))?;
            let resp = raft.pre_vote(req).await.map_err(|e| text(&e))?;
            encode(&resp).map_err(|e| text(&e))
        }
        MessageKind::SnapshotChunk | MessageKind::SnapshotPiece => {
            Err("snapshot pieces are collected before dispatch".into())
        }
        MessageKind::QuietBeat => Err("node beats are handled before dispatch".into()),
        MessageKind::TransferLeader => {
            let req: TransferLeaderRequest<TypeConfig> = decode(bytes).map_err(|e| text(&e))?;
            let resp = raft
                .handle_transfer_leader(req)
                .await
                .map_err(|e| text(&e))?;
            encode(&resp).map_err(|e| text(&e))
        }
        MessageKind::Unspecified => Err(format!("unknown peer message kind {}", message.kind)),
    }
}

#[tonic::async_trait]
impl<SM> RaftPeer for PeerService<SM>
where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    async fn call(&self, request: Request<GroupMessage>) -> Result<Response<GroupReply>, Status> {
        PeerCaller::check_sender(&request, request.get_ref().from_node)?;
        Ok(Response::new(self.handle(request.into_inner()).await))
    }

    async fn batch(
        &self,
        request: Request<GroupBatch>,
    ) -> Result<Response<GroupBatchReply>, Status> {
        for message in &request.get_ref().messages {
            PeerCaller::check_sender(&request, message.from_node)?;
        }
        let messages = request.into_inner().messages;
        let replies = futures::future::join_all(messages.into_iter().map(|m| self.handle(m))).await;
        Ok(Response::new(GroupBatchReply { replies }))
    }

    type BatchStreamStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<IndexedReply, Status>> + Send>>;

    async fn batch_stream(
        &self,
        request: Request<GroupBatch>,
    ) -> Result<Response<Self::BatchStreamStream>, Status> {
        for message in &request.get_ref().messages {
            PeerCaller::check_sender(&request, message.from_node)?;
        }
        let replies: futures::stream::FuturesUnordered<_> = request
            .into_inner()
            .messages
            .into_iter()
            .enumerate()
            .map(|(index, message)| {
                let service = self.clone();
                async move {
                    Ok(IndexedReply {
                        index: index as u32,
                        reply: Some(service.handle(message).await),
                    })
                }
            })
            .collect();
        Ok(Response::new(Box::pin(replies)))
    }

    type SessionStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<SessionReply, Status>> + Send>>;

    async fn session(
        &self,
        request: Request<Streaming<SessionMessage>>,
    ) -> Result<Response<Self::SessionStream>, Status> {
        if self.stop.as_ref().is_some_and(|stop| *stop.borrow()) {
            return Err(Status::unavailable("this node is stopping"));
        }
        let node = PeerCaller::node_of(&request);
        let (tx, mut rx) = tokio::sync::mpsc::channel(SESSION_REPLIES_QUEUED);
        tokio::spawn(serve_session(self.clone(), node, request.into_inner(), tx));
        Ok(Response::new(Box::pin(futures::stream::poll_fn(
            move |cx| rx.poll_recv(cx),
        ))))
    }
}

/// Replies of a session queued for its stream at most; beyond, its messages wait to be
/// handled (and then to be read: HTTP/2 flow control holds the sender back).
const SESSION_REPLIES_QUEUED: usize = 1024;
/// Messages of one session handled at once at most.
const SESSION_HANDLING_MAX: usize = 4096;

/// Handles a session's messages as they come, each concurrently with the others, and
/// queues each reply, tagged with its message's id, as soon as it is ready. Ends when the
/// sender has ended its stream and every message is answered, or when the connection is
/// gone.
async fn serve_session<SM>(
    service: PeerService<SM>,
    node: Option<u64>,
    mut incoming: Streaming<SessionMessage>,
    replies: tokio::sync::mpsc::Sender<Result<SessionReply, Status>>,
) where
    SM: RaftStateMachine<TypeConfig, SnapshotData = SnapshotData>,
{
    use futures::StreamExt;
    let mut handling = futures::stream::FuturesUnordered::new();
    let mut reading = true;
    let mut stop = service.stop.clone();
    let stopping = async {
        match stop.as_mut() {
            Some(stop) => {
                let _ = stop.wait_for(|stop| *stop).await;
            }
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stopping);
    // Until the sender has ended its stream and every message is answered.
    while reading || !handling.is_empty() {
        tokio::select! {
            // The node is stopping: the stream ends (its peer's calls on it fail, and its
            // next opens a session elsewhere or finds this node gone).
            () = &mut stopping => return,
            next = incoming.next(), if reading && handling.len() < SESSION_HANDLING_MAX => {
                match next {
                    Some(Ok(SessionMessage { id, message })) => {
                        let service = service.clone();
                        handling.push(async move {
                            let reply = match message {
                                Some(message) => {
                                    match PeerCaller::check_node(node, message.from_node) {
                                        Ok(()) => service.handle(message).await,
                                        Err(status) => GroupReply {
                                            result: Some(group_reply::Result::Error(
                                                status.message().to_string(),
                                            )),
                                        },
                                    }
                                }
                                None => GroupReply {
                                    result: Some(group_reply::Result::Error(
                                        "a session message without a message".into(),
                                    )),
                                },
                            };
                            SessionReply { id, reply: Some(reply) }
                        });
                    }
                    Some(Err(_)) => return,
                    None => reading = false,
                }
            }
            Some(reply) = handling.next(), if !handling.is_empty() => {
                if replies.send(Ok(reply)).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tributary_storage::{Durability, Mutation, ShardConfig, staging_group};
    use tributary_types::{HubId, PartitionId};

    use super::*;
    use crate::rebuild::Rebuilds;

    fn group(p: u16) -> GroupId {
        GroupId::new(HubId(4), PartitionId(p), 0)
    }

    /// A transfer that keeps sending pieces is never abandoned, however long it takes; one
    /// whose sender went silent is, after [`TRANSFER_IDLE_MAX`], with what it staged.
    #[tokio::test(start_paused = true)]
    async fn only_transfers_gone_silent_are_abandoned() {
        let dir = tempfile::tempdir().unwrap();
        let shard =
            tributary_storage::Shard::open(&dir.path().join("s.redb"), ShardConfig::default())
                .unwrap();
        let rebuilds = Rebuilds::new(0);
        let streamed: Mutex<HashMap<GroupId, Slot>> = Mutex::new(HashMap::new());
        for p in [0, 1] {
            let stager = Stager::begin(shard.clone(), group(p), Bytes::new(), 1, 10, 100)
                .await
                .unwrap();
            let receiving = Receiving {
                transfer: u64::from(p),
                point: None,
                next_seq: 1,
                stager,
                progress: rebuilds.start(group(p), Direction::Receive, 2, 100),
                last_piece: tokio::time::Instant::now(),
            };
            streamed
                .lock()
                .unwrap()
                .insert(group(p), Arc::new(tokio::sync::Mutex::new(Some(receiving))));
        }
        shard
            .write(
                vec![Mutation::PutLog {
                    group: staging_group(group(1)),
                    index: 1,
                    entry: Bytes::from_static(b"staged"),
                }],
                Durability::Immediate,
            )
            .await
            .unwrap();
        assert_eq!(
            shard.staged_groups().unwrap(),
            vec![staging_group(group(1))]
        );
        let slot = |p| streamed.lock().unwrap()[&group(p)].clone();
        // Group 0's sender sends a piece every 10 s; group 1's has gone silent.
        for _ in 0..6 {
            tokio::time::advance(Duration::from_secs(10)).await;
            slot(0).lock().await.as_mut().unwrap().last_piece = tokio::time::Instant::now();
            abandon_idle(&streamed).await;
            assert!(
                slot(0).lock().await.is_some(),
                "a transfer under way was abandoned"
            );
        }
        tokio::time::advance(Duration::from_secs(1)).await;
        abandon_idle(&streamed).await;
        assert!(slot(1).lock().await.is_none());
        assert!(slot(0).lock().await.is_some());
        assert!(shard.staged_groups().unwrap().is_empty());
        assert_eq!(rebuilds.running().len(), 1);
    }
}
