//! The Rust SDK for Tributary, and the commands of the `tributary` CLI.
//!
//! ```no_run
//! # async fn example() -> Result<(), tributary_client::ClientError> {
//! use tributary_client::{Client, EventData, EventPosition, SendTarget};
//! use futures::StreamExt;
//!
//! let client = Client::connect("http://127.0.0.1:7400").await?;
//! client.create_event_hub("orders", 4, None).await?;
//! let sent = client
//!     .producer()
//!     .send("orders", SendTarget::PartitionKey("customer-7".into()), [EventData::from_body("hi")])
//!     .await?;
//! let mut batches = client
//!     .consumer()
//!     .receive("orders", "$Default", &sent.partition_id, EventPosition::Earliest, 100)
//!     .await?;
//! while let Some(batch) = batches.next().await {
//!     for event in batch? {
//!         println!("{} {:?}", event.sequence_number, event.body);
//!     }
//! }
//! # Ok(())
//! # }
//! ```
//!
//! The client never depends on the server crates; it speaks only the `tributary.v1` gRPC API.

mod buffered;
pub mod checkpoints;
pub mod cli;
mod client;
mod consumer;
pub mod credential;
mod diagnostics;
mod error;
mod event;
pub mod group;
mod position;
pub mod processor;
mod producer;
mod routing;
mod send_session;
mod time;
pub mod tls;

pub use buffered::{
    BATCH_BYTES_MAX_DEFAULT, BufferedOptions, BufferedProducer, Delivery, DeliveryFuture,
};
pub use checkpoints::{CheckpointStore, ClusterCheckpointStore, InMemoryCheckpointStore};
pub use client::{
    CaptureOptions, Client, ClientOptions, ConnectOptions, HubChanges, HubOptions, RuleKey,
    RuleKeys,
};
pub use consumer::{ConsumerClient, ReceiveOptions, ReceiveStream};
pub use credential::Transport;
pub use diagnostics::{ReplicaListing, ReplicaSummary, body_checksum, replica_digest};
pub use error::ClientError;
pub use event::{EventData, PropertyValue, ReceivedEvent};
pub use position::{EventPosition, ParsePositionError};
pub use processor::{
    CloseReason, EventHandler, EventProcessor, EventProcessorOptions, LoadBalancingStrategy,
    PartitionContext, RunningProcessor,
};
pub use producer::{IdempotentProducer, ProducerClient, SendTarget};
pub use time::rfc3339_millis;
/// Implement [`EventHandler`] and [`CheckpointStore`] with `#[tributary_client::async_trait]`.
pub use tonic::async_trait;
pub use tributary_proto::v1::{
    AuthorizationRule, CaptureSettings, CleanupPolicy, ConsumerGroupProperties, ErrorReason,
    EventHubProperties, PartitionProperties, ReplicaEvent, ReplicaEventsResponse, SendResponse,
};
pub use tributary_types::{ConnectionString, Rights};
