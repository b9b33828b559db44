//! How a node's ports admit connections, for the node and every front end: TLS with
//! certificates re-read when they change (`tls.rs`), the peer port's door — mutual TLS with
//! node certificates and the cluster key — and how a node dials its peers (`peer_port.rs`),
//! limits on open and idle connections (`limits.rs`), and `tributary cert`, which makes the
//! certificates and cluster keys (`cert.rs`).

pub mod cert;
pub mod limits;
pub mod peer_port;
pub mod tls;
