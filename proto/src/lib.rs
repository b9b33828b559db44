//! The `tributary.v1` protobuf messages and gRPC services, generated at build time.
//! Only this crate, the node's gRPC handlers and the client see these types.

#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod v1 {
    tonic::include_proto!("tributary.v1");
}

/// Node-to-node Raft traffic (the peer port).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod peer {
    tonic::include_proto!("tributary.peer.v1");
}

pub use v1::ErrorDetail;
pub use v1::ErrorReason;
