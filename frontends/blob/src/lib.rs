//! The Blob checkpoint endpoint: the small part of the Azure Blob Storage REST API that the
//! Event Hubs SDKs' `BlobCheckpointStore` (Python, .NET, Java, JavaScript) calls, served
//! from the cluster's own replicated checkpoint store, so the official load-balancing
//! processors run unchanged against Tributary with no Blob Storage beside it.
//!
//! - Path-style addressing, `http(s)://host:10000/{account}/{container}/{blob}`: the
//!   account is an authorization rule's name, any container is the cluster's namespace.
//! - Blobs are records: `{namespace}/{eventhub}/{consumergroup}/ownership/{partition}` and
//!   `.../checkpoint/{partition}` (any namespace, hub and group names matched ignoring
//!   case, as the SDKs lower-case them). Their metadata (`ownerid`; `offset`,
//!   `sequencenumber`) is the record; ETags are the records' versions, so `If-Match` claims
//!   race on the store's own compare-and-set. Other names are refused.
//! - Operations: Create Container, Get Container Properties, List Blobs (`prefix`,
//!   `include=metadata`, `marker`, `maxresults`), Put Blob, Set Blob Metadata, Get Blob
//!   Properties, with Azure's status codes and `x-ms-error-code`s (`request.rs`,
//!   `handler.rs`, `xml.rs`).
//! - Authorization: Shared Key and account SAS signed with a rule's key (`auth.rs`); every
//!   record call needs Listen on the hub, checked by the broker.

mod auth;
mod error;
mod handler;
pub mod listener;
mod names;
mod request;
mod xml;

pub use handler::BlobEndpoint;
