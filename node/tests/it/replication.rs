//! The raft layer across nodes: three hosts in one process, each with its own storage and a
//! peer server on loopback, replicate one partition group.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tempfile::TempDir;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tributary_broker::partition::codec::{EventRecord, encode_batch};
use tributary_broker::partition::state_machine::{PartitionStateMachine, Progress};
use tributary_raft::{
    AppendBatch, GroupHost, PeerRouter, PeerService, Proposal, ProposalResult, Raft, TcpConnector,
};
use tributary_storage::{Shard, ShardConfig};
use tributary_types::{GroupId, HubId, NodeId, PartitionId};

const GROUP: GroupId = GroupId {
    hub: HubId(1),
    partition: PartitionId(0),
    incarnation: 0,
};

struct Peer {
    id: NodeId,
    host: Arc<GroupHost<PartitionStateMachine>>,
    shard: Shard,
    server: tokio::task::JoinHandle<()>,
    progress: tokio::sync::watch::Receiver<Progress>,
    /// Stops the peer server gracefully, as a stopping node does.
    stop: tokio::sync::watch::Sender<bool>,
}

async fn start_peer(
    id: NodeId,
    dir: &TempDir,
    listener: TcpListener,
    members: &BTreeMap<NodeId, String>,
) -> Peer {
    let shard = Shard::open(
        &dir.path().join(format!("node-{}.redb", id.0)),
        ShardConfig::default(),
    )
    .unwrap();
    let router = PeerRouter::new(id.0, TcpConnector);
    for (node, addr) in members {
        router.set_address(node.0, addr);
    }
    let host = GroupHost::new(id, router);
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let server = tokio::spawn({
        let service = PeerService::new(host.clone())
            .ending_sessions_on(stopping.clone())
            .into_server();
        let mut stopping = stopping;
        async move {
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async move {
                    let _ = stopping.wait_for(|stop| *stop).await;
                })
                .await
                .unwrap();
        }
    });
    let (sm, progress) = PartitionStateMachine::open(GROUP, shard.clone()).unwrap();
    let members = members.iter().map(|(n, a)| (n.0, a.clone())).collect();
    host.start(GROUP, id.0, shard.clone(), sm, members)
        .await
        .unwrap();
    Peer {
        id,
        host,
        shard,
        server,
        progress,
        stop,
    }
}

fn batch(text: &str, n: usize) -> Proposal {
    let records: Vec<_> = (0..n)
        .map(|i| EventRecord {
            partition_key: None,
            properties: vec![],
            body: format!("{text}-{i}").into(),
        })
        .collect();
    Proposal::Append(AppendBatch {
        enqueued_time_ms: 1,
        event_count: n as u32,
        events: encode_batch(&records),
        producer: None,
    })
}

async fn leader_of(peers: &[&Peer]) -> Raft<PartitionStateMachine> {
    let raft = peers[0].host.get(GROUP).unwrap();
    let live: Vec<u64> = peers.iter().map(|p| p.id.0).collect();
    let leader = raft
        .wait(Some(Duration::from_secs(20)))
        .metrics(
            |m| m.current_leader.is_some_and(|l| live.contains(&l)),
            "a live peer is elected leader",
        )
        .await
        .unwrap()
        .current_leader
        .unwrap();
    peers
        .iter()
        .find(|p| p.id.0 == leader)
        .and_then(|p| p.host.get(GROUP))
        .expect("the leader is one of the live peers")
}

/// Proposes through whichever live peer leads, retrying while leadership settles.
async fn write(peers: &[&Peer], proposal: Proposal) -> tributary_raft::AppendOutcome {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let leader = leader_of(peers).await;
            match leader.client_write(proposal.clone()).await {
                Ok(response) => match response.data {
                    ProposalResult::Appended(outcome) => return outcome,
                    other => panic!("append without outcome: {other:?}"),
                },
                Err(err) => {
                    eprintln!("write not accepted yet: {err}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    })
    .await
    .expect("a live replica leads and accepts writes")
}

async fn wait_applied(peer: &Peer, next_sequence: i64) {
    let mut progress = peer.progress.clone();
    tokio::time::timeout(
        Duration::from_secs(20),
        progress.wait_for(|p| p.next_sequence >= next_sequence),
    )
    .await
    .expect("replica catches up")
    .unwrap();
}

/// Three peers on loopback ports, nodes 1 to 3, each serving its peer port.
async fn start_three(dir: &TempDir) -> Vec<Peer> {
    let mut listeners = Vec::new();
    let mut members = BTreeMap::new();
    for id in 1..=3u64 {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        members.insert(NodeId(id), listener.local_addr().unwrap().to_string());
        listeners.push(listener);
    }
    let mut peers = Vec::new();
    for (i, listener) in listeners.into_iter().enumerate() {
        peers.push(start_peer(NodeId(i as u64 + 1), dir, listener, &members).await);
    }
    peers
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_agree_and_survive_losing_the_leader() {
    let dir = tempfile::tempdir().unwrap();
    let mut peers = start_three(&dir).await;

    let live: Vec<&Peer> = peers.iter().collect();
    let mut next = 0;
    for round in 0..20 {
        let outcome = write(&live, batch(&format!("r{round}"), 3)).await;
        assert_eq!(outcome.first_sequence, next);
        next += 3;
    }
    for peer in &peers {
        wait_applied(peer, next).await;
    }
    let reference = peers[0].shard.log_entries(GROUP, 0, 1000).unwrap();
    for peer in &peers[1..] {
        assert_eq!(peer.shard.log_entries(GROUP, 0, 1000).unwrap(), reference);
        assert_eq!(*peer.progress.borrow(), *peers[0].progress.borrow());
    }

    // Lose the leader: the other two elect a new one and keep numbering without a gap.
    let old_leader = *leader_of(&live).await.node_id();
    let index = peers.iter().position(|p| p.id.0 == old_leader).unwrap();
    let gone = peers.remove(index);
    gone.host.stop_all().await;
    gone.server.abort();
    let survivors: Vec<&Peer> = peers.iter().collect();
    let outcome = write(&survivors, batch("after", 2)).await;
    assert_eq!(
        outcome.first_sequence, next,
        "numbering continues after failover"
    );
    for peer in &peers {
        wait_applied(peer, next + 2).await;
    }
    assert_eq!(
        peers[0].shard.log_entries(GROUP, 0, 1000).unwrap(),
        peers[1].shard.log_entries(GROUP, 0, 1000).unwrap()
    );
}

/// A peer server stopping gracefully (a node shutting down) ends the sessions its peers'
/// replication holds open to it: a graceful shutdown waits for every open stream, and a
/// session never ends by itself. The others go on committing without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_peer_server_ends_the_sessions_held_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let mut peers = start_three(&dir).await;
    let live: Vec<&Peer> = peers.iter().collect();
    let mut next = 0;
    for round in 0..5 {
        write(&live, batch(&format!("r{round}"), 2)).await;
        next += 2;
    }
    for peer in &peers {
        wait_applied(peer, next).await;
    }
    // The followers hold the leader's sessions (its replication reached both).
    let leader = *leader_of(&live).await.node_id();
    let index = peers.iter().position(|p| p.id.0 != leader).unwrap();
    let follower = peers.remove(index);
    follower.stop.send_replace(true);
    tokio::time::timeout(Duration::from_secs(10), follower.server)
        .await
        .expect("the peer server's graceful shutdown waited for sessions held to it")
        .unwrap();
    follower.host.stop_all().await;
    let survivors: Vec<&Peer> = peers.iter().collect();
    let outcome = write(&survivors, batch("after", 2)).await;
    assert_eq!(outcome.first_sequence, next);
}
