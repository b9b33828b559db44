//! Link performatives: attach (0x12), flow (0x13), transfer (0x14), disposition (0x15),
//! detach (0x16). Field counts when written: attach 14, flow 11, transfer exactly 11,
//! disposition 6, detach 3 (WIRE-PROTOCOLS A5).

use bytes::Bytes;

use crate::delivery_state::{AmqpError, DeliveryState, error_value, read_error};
use crate::error::CodecError;
use crate::fields::{
    Descriptor, FieldReader, FromValue, fields_value, map_value, opt, optional_fields,
    symbols_value, wire_enum,
};
use crate::ids::{DeliveryNumber, Handle, TransferNumber};
use crate::terminus::{Source, Target};
use crate::types::{Fields, Map, Symbol, Value};

/// Attaches a link. A server's reply needs non-null source and target, an explicit
/// max-message-size, initial-delivery-count when it sends, and properties (even empty) for
/// the full 14 fields (WIRE-PROTOCOLS A8, A9).
#[derive(Debug, Clone, PartialEq)]
pub struct Attach {
    pub name: String,
    pub handle: Handle,
    pub role: Role,
    /// Default `mixed`.
    pub snd_settle_mode: SenderSettleMode,
    /// Default `first`.
    pub rcv_settle_mode: ReceiverSettleMode,
    pub source: Option<Source>,
    pub target: Option<Target>,
    /// Delivery tag to delivery state, kept as the raw map.
    pub unsettled: Option<Map>,
    pub incomplete_unsettled: bool,
    pub initial_delivery_count: Option<u32>,
    /// The spec's `max-message-size`; `None` or 0: no limit.
    pub max_message_size_bytes: Option<u64>,
    pub offered_capabilities: Vec<Symbol>,
    pub desired_capabilities: Vec<Symbol>,
    pub properties: Option<Fields>,
}

/// Updates flow state: session windows, and link credit when `handle` is set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Flow {
    pub next_incoming_id: Option<TransferNumber>,
    pub incoming_window: u32,
    pub next_outgoing_id: TransferNumber,
    pub outgoing_window: u32,
    pub handle: Option<Handle>,
    pub delivery_count: Option<u32>,
    pub link_credit: Option<u32>,
    pub available: Option<u32>,
    pub drain: bool,
    pub echo: bool,
    pub properties: Option<Fields>,
}

/// One frame of a delivery; the message bytes travel beside it as the frame's payload.
#[derive(Debug, Clone, PartialEq)]
pub struct Transfer {
    pub handle: Handle,
    /// Set on the first frame of a delivery.
    pub delivery_id: Option<DeliveryNumber>,
    pub delivery_tag: Option<Bytes>,
    /// 0 for a plain message, [`crate::BATCH_MESSAGE_FORMAT`] for an Event Hubs batch.
    pub message_format: Option<u32>,
    pub settled: Option<bool>,
    /// More frames of this delivery follow.
    pub more: bool,
    pub rcv_settle_mode: Option<ReceiverSettleMode>,
    pub state: Option<DeliveryState>,
    pub resume: bool,
    pub aborted: bool,
    pub batchable: bool,
}

/// Settles or updates the state of deliveries `first..=last`. pyamqp ignores unsettled
/// dispositions, so a server sends `settled: true`.
#[derive(Debug, Clone, PartialEq)]
pub struct Disposition {
    pub role: Role,
    pub first: DeliveryNumber,
    /// `None`: only `first`.
    pub last: Option<DeliveryNumber>,
    pub settled: bool,
    pub state: Option<DeliveryState>,
    pub batchable: bool,
}

/// Detaches a link; `closed` also destroys it.
#[derive(Debug, Clone, PartialEq)]
pub struct Detach {
    pub handle: Handle,
    pub closed: bool,
    pub error: Option<AmqpError>,
}

/// Which end of a link a peer is (a boolean on the wire: false is sender).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Sender,
    Receiver,
}

/// How the sender settles deliveries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SenderSettleMode {
    Unsettled,
    Settled,
    #[default]
    Mixed,
}

/// When the receiver settles deliveries.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ReceiverSettleMode {
    #[default]
    First,
    Second,
}

wire_enum!(SenderSettleMode as u8, "ubyte", "0 (unsettled), 1 (settled) or 2 (mixed)" {
    Unsettled = 0,
    Settled = 1,
    Mixed = 2,
});

wire_enum!(ReceiverSettleMode as u8, "ubyte", "0 (first) or 1 (second)" {
    First = 0,
    Second = 1,
});

impl FromValue for Role {
    fn from_value(value: Value, field: &'static str) -> Result<Role, CodecError> {
        Ok(if bool::from_value(value, field)? {
            Role::Receiver
        } else {
            Role::Sender
        })
    }
}

impl From<Role> for Value {
    fn from(role: Role) -> Value {
        Value::Boolean(role == Role::Receiver)
    }
}

pub(crate) const ATTACH: Descriptor = Descriptor::new(0x12, "amqp:attach:list");
pub(crate) const FLOW: Descriptor = Descriptor::new(0x13, "amqp:flow:list");
pub(crate) const TRANSFER: Descriptor = Descriptor::new(0x14, "amqp:transfer:list");
pub(crate) const DISPOSITION: Descriptor = Descriptor::new(0x15, "amqp:disposition:list");
pub(crate) const DETACH: Descriptor = Descriptor::new(0x16, "amqp:detach:list");

impl Attach {
    pub(crate) fn to_value(&self) -> Value {
        ATTACH.composite(vec![
            Value::String(self.name.clone()),
            self.handle.into(),
            self.role.into(),
            self.snd_settle_mode.into(),
            self.rcv_settle_mode.into(),
            self.source.as_ref().map_or(Value::Null, Source::to_value),
            self.target.as_ref().map_or(Value::Null, Target::to_value),
            map_value(&self.unsettled),
            self.incomplete_unsettled.into(),
            opt(self.initial_delivery_count),
            opt(self.max_message_size_bytes),
            symbols_value(&self.offered_capabilities),
            symbols_value(&self.desired_capabilities),
            fields_value(&self.properties),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Attach, CodecError> {
        Ok(Attach {
            name: r.required("attach.name")?,
            handle: r.required("attach.handle")?,
            role: r.required("attach.role")?,
            snd_settle_mode: r.or("attach.snd-settle-mode", SenderSettleMode::Mixed)?,
            rcv_settle_mode: r.or("attach.rcv-settle-mode", ReceiverSettleMode::First)?,
            source: r.optional("attach.source")?,
            target: r.optional("attach.target")?,
            unsettled: r.optional("attach.unsettled")?,
            incomplete_unsettled: r.or("attach.incomplete-unsettled", false)?,
            initial_delivery_count: r.optional("attach.initial-delivery-count")?,
            max_message_size_bytes: r.optional("attach.max-message-size")?,
            offered_capabilities: r.symbols("attach.offered-capabilities")?,
            desired_capabilities: r.symbols("attach.desired-capabilities")?,
            properties: optional_fields(&mut r, "attach.properties")?,
        })
    }
}

impl Flow {
    pub(crate) fn to_value(&self) -> Value {
        FLOW.composite(vec![
            opt(self.next_incoming_id),
            self.incoming_window.into(),
            self.next_outgoing_id.into(),
            self.outgoing_window.into(),
            opt(self.handle),
            opt(self.delivery_count),
            opt(self.link_credit),
            opt(self.available),
            self.drain.into(),
            self.echo.into(),
            fields_value(&self.properties),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Flow, CodecError> {
        Ok(Flow {
            next_incoming_id: r.optional("flow.next-incoming-id")?,
            incoming_window: r.required("flow.incoming-window")?,
            next_outgoing_id: r.required("flow.next-outgoing-id")?,
            outgoing_window: r.required("flow.outgoing-window")?,
            handle: r.optional("flow.handle")?,
            delivery_count: r.optional("flow.delivery-count")?,
            link_credit: r.optional("flow.link-credit")?,
            available: r.optional("flow.available")?,
            drain: r.or("flow.drain", false)?,
            echo: r.or("flow.echo", false)?,
            properties: optional_fields(&mut r, "flow.properties")?,
        })
    }
}

impl Transfer {
    pub(crate) fn to_value(&self) -> Value {
        TRANSFER.composite(vec![
            self.handle.into(),
            opt(self.delivery_id),
            opt(self.delivery_tag.clone()),
            opt(self.message_format),
            opt(self.settled),
            self.more.into(),
            opt(self.rcv_settle_mode),
            self.state
                .as_ref()
                .map_or(Value::Null, DeliveryState::to_value),
            self.resume.into(),
            self.aborted.into(),
            self.batchable.into(),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Transfer, CodecError> {
        Ok(Transfer {
            handle: r.required("transfer.handle")?,
            delivery_id: r.optional("transfer.delivery-id")?,
            delivery_tag: r.optional("transfer.delivery-tag")?,
            message_format: r.optional("transfer.message-format")?,
            settled: r.optional("transfer.settled")?,
            more: r.or("transfer.more", false)?,
            rcv_settle_mode: r.optional("transfer.rcv-settle-mode")?,
            state: r.optional("transfer.state")?,
            resume: r.or("transfer.resume", false)?,
            aborted: r.or("transfer.aborted", false)?,
            batchable: r.or("transfer.batchable", false)?,
        })
    }
}

impl Disposition {
    pub(crate) fn to_value(&self) -> Value {
        DISPOSITION.composite(vec![
            self.role.into(),
            self.first.into(),
            opt(self.last),
            self.settled.into(),
            self.state
                .as_ref()
                .map_or(Value::Null, DeliveryState::to_value),
            self.batchable.into(),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Disposition, CodecError> {
        Ok(Disposition {
            role: r.required("disposition.role")?,
            first: r.required("disposition.first")?,
            last: r.optional("disposition.last")?,
            settled: r.or("disposition.settled", false)?,
            state: r.optional("disposition.state")?,
            batchable: r.or("disposition.batchable", false)?,
        })
    }
}

impl Detach {
    pub(crate) fn to_value(&self) -> Value {
        DETACH.composite(vec![
            self.handle.into(),
            self.closed.into(),
            error_value(&self.error),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Detach, CodecError> {
        Ok(Detach {
            handle: r.required("detach.handle")?,
            closed: r.or("detach.closed", false)?,
            error: read_error(&mut r, "detach.error")?,
        })
    }
}
