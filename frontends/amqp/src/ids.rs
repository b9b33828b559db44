//! Numbers the AMQP spec names (part 2 §2.8), as newtypes so a handle is never passed where a
//! delivery id is meant.

use crate::fields::wire_newtype;

/// A session's channel number on its connection.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Channel(pub u16);

/// A link's handle within its session.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Handle(pub u32);

/// A delivery's id within its session (the spec's `delivery-number`; serial arithmetic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeliveryNumber(pub u32);

/// A transfer frame's id within its session (the spec's `transfer-number`; serial arithmetic).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TransferNumber(pub u32);

wire_newtype!(
    Channel(u16),
    Handle(u32),
    DeliveryNumber(u32),
    TransferNumber(u32)
);
