//! AMQP 1.0 for the Event Hubs front end: a pure codec and the server side of a connection
//! (the client side is `tributary-amqp-client`).
//!
//! - [`Value`]: the AMQP type system, with an encoder that always writes a valid compact
//!   form and a lenient decoder that never panics and bounds depth, counts and allocation.
//! - [`read_frame`], [`write_frame`], [`write_performative`], [`ProtocolHeader`]: frames and
//!   protocol headers.
//! - [`Performative`] and [`decode_frame_body`]: the performatives as typed structs.
//! - [`Message`], [`split_batch`], [`build_batch`]: message sections and Event Hubs batches.
//! - [`server`]: the server side of a connection over any async stream ([`serve_connection`]),
//!   with `$cbs`, `$management`, and sender and receiver links to hubs; the one part with
//!   I/O.
//! - [`broker_backend`]: the node's [`server::Backend`], on the broker's `Service`;
//!   [`listener`]: a task per accepted connection.
//!
//! # Invariant: what we write, pyamqp can read
//! azure-eventhub ≤ 5.15.1 indexes performative fields by position and mishandles some legal
//! encodings (WIRE-PROTOCOLS A5). So every composite is written with all its fields, with a
//! smallulong descriptor, never as `list0`, and an empty array is written as null. Decoding
//! stays lenient, as the spec allows others (.NET, Java) to omit trailing fields.

pub mod broker_backend;
mod connection;
mod constructor;
mod decode;
mod delivery_state;
mod encode;
mod error;
mod fields;
mod frame;
mod ids;
mod link;
pub mod listener;
mod message;
mod performative;
mod sasl;
pub mod server;
mod terminus;
mod types;

/// Generators and helpers of the crate's tests (and tributary-amqp-client's).
#[cfg(any(test, feature = "test-support"))]
pub mod test_support;

pub use connection::{Begin, Close, End, Open};
pub use decode::MAX_DEPTH;
pub use delivery_state::{AmqpError, DeliveryState, condition};
pub use error::CodecError;
pub use frame::{
    FRAME_HEADER_BYTES, Frame, FrameType, HEARTBEAT, MIN_MAX_FRAME_SIZE_BYTES, ProtocolHeader,
    ProtocolId, read_frame, write_frame, write_performative,
};
pub use ids::{Channel, DeliveryNumber, Handle, TransferNumber};
pub use link::{
    Attach, Detach, Disposition, Flow, ReceiverSettleMode, Role, SenderSettleMode, Transfer,
};
pub use message::{
    ApplicationProperties, BATCH_MESSAGE_FORMAT, Body, Header, Message, MessageId, Properties,
    build_batch, split_batch,
};
pub use performative::{Performative, decode_frame_body};
pub use sasl::{SaslChallenge, SaslCode, SaslInit, SaslMechanisms, SaslOutcome, SaslResponse};
pub use server::{
    Backend, BackendError, BackendErrorKind, ConnectionError, ConnectionLimits, HubProperties,
    PartitionProperties, Rights, TokenGrant, serve_connection,
};
pub use terminus::{
    EXPIRY_POLICY_SESSION_END, SELECTOR_FILTER_CODE_APACHE, SELECTOR_FILTER_CODE_MICROSOFT,
    SELECTOR_FILTER_NAME, Source, Target, TerminusDurability,
};
pub use types::{Array, Described, Fields, Map, Symbol, Value, ValueKind, map_get};
