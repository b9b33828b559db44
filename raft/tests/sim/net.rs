//! The peer transport over turmoil's simulated TCP: the same tonic server and channels the
//! node uses, fed a turmoil listener and dialing through a turmoil connector, so the
//! nemesis's partitions cut real gRPC connections.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tonic::transport::server::{Connected, TcpConnectInfo};
use tonic::transport::{Channel, Endpoint, Uri};
use tributary_proto::peer::raft_peer_server::RaftPeerServer;
use tributary_raft::{Connector, GroupHost, PeerRouter, PeerService};
use tributary_types::NodeId;

use crate::state_machine::MemStateMachine;

/// Port of every host's peer server.
pub const PEER_PORT: u16 = 7401;

/// How long a dial may take before the channel reports the peer unreachable. A partition
/// drops the SYN, so without it a dial would wait forever.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// turmoil's TCP has no retransmission: a segment dropped by a partition leaves a gap the
/// receiver waits on forever, so a connection that lived through a partition is dead. HTTP/2
/// pings find such connections; the channel then dials again.
const KEEP_ALIVE_INTERVAL: Duration = Duration::from_millis(500);
const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_millis(500);

/// The peer address of a simulated host, e.g. `n1:7401`.
pub fn peer_addr(host: &str) -> String {
    format!("{host}:{PEER_PORT}")
}

/// Dials peers over turmoil TCP.
#[derive(Debug, Default)]
pub struct SimConnector;

impl Connector for SimConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| format!("bad peer address {addr:?}: {e}"))?
            .connect_timeout(CONNECT_TIMEOUT)
            .http2_keep_alive_interval(KEEP_ALIVE_INTERVAL)
            .keep_alive_timeout(KEEP_ALIVE_TIMEOUT)
            .keep_alive_while_idle(true);
        let addr = addr.to_string();
        Ok(
            endpoint.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
                let addr = addr.clone();
                async move {
                    turmoil::net::TcpStream::connect(addr)
                        .await
                        .map(TokioIo::new)
                }
            })),
        )
    }
}

/// The server task of [`start_host`].
pub type Server = tokio::task::JoinHandle<Result<(), Box<dyn std::error::Error>>>;

/// This host's groups and their peer server: a router that knows every member's peer
/// address, the host over it, and the server of its groups, started on this host.
pub fn start_host(
    node: u64,
    members: &BTreeMap<u64, String>,
) -> (Arc<GroupHost<MemStateMachine>>, Server) {
    let router = PeerRouter::new(node, SimConnector);
    for (id, addr) in members {
        router.set_address(*id, addr);
    }
    let host = GroupHost::new(NodeId(node), router);
    let server = tokio::task::spawn_local(serve(PeerService::new(host.clone()).into_server()));
    (host, server)
}

/// Serves the peer service on this host's peer port until the host stops.
pub async fn serve(
    service: RaftPeerServer<PeerService<MemStateMachine>>,
) -> Result<(), Box<dyn std::error::Error>> {
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PEER_PORT)).await?;
    let incoming = futures::stream::unfold(listener, |listener| async move {
        let accepted = listener.accept().await.map(|(stream, _)| Accepted(stream));
        Some((accepted, listener))
    });
    tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(KEEP_ALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEP_ALIVE_TIMEOUT))
        .add_service(service)
        .serve_with_incoming(incoming)
        .await?;
    Ok(())
}

/// An accepted turmoil connection, in the shape tonic's server takes.
struct Accepted(turmoil::net::TcpStream);

impl Connected for Accepted {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        TcpConnectInfo {
            local_addr: self.0.local_addr().ok(),
            remote_addr: self.0.peer_addr().ok(),
        }
    }
}

impl AsyncRead for Accepted {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Accepted {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
