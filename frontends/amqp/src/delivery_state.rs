//! The `error` composite and delivery states (AMQP 1.0 part 2 §2.8.14, part 3 §3.4). Outcomes
//! are always written with their numeric descriptors: pyamqp maps only 0x23..0x27
//! (WIRE-PROTOCOLS A5 rule 4).

use crate::error::CodecError;
use crate::fields::{
    Descriptor, FieldReader, fields_value, map_value, optional_fields, unexpected,
    unknown_descriptor,
};
use crate::types::{Described, Fields, Map, Symbol, Value};

/// Error conditions the Azure SDKs interpret (WIRE-PROTOCOLS A10).
pub mod condition {
    pub const UNAUTHORIZED_ACCESS: &str = "amqp:unauthorized-access";
    pub const NOT_FOUND: &str = "amqp:not-found";
    pub const NOT_IMPLEMENTED: &str = "amqp:not-implemented";
    pub const INTERNAL_ERROR: &str = "amqp:internal-error";
    pub const DECODE_ERROR: &str = "amqp:decode-error";
    pub const RESOURCE_LIMIT_EXCEEDED: &str = "amqp:resource-limit-exceeded";
    pub const CONNECTION_FORCED: &str = "amqp:connection:forced";
    pub const FRAMING_ERROR: &str = "amqp:connection:framing-error";
    pub const LINK_STOLEN: &str = "amqp:link:stolen";
    pub const LINK_DETACH_FORCED: &str = "amqp:link:detach-forced";
    pub const MESSAGE_SIZE_EXCEEDED: &str = "amqp:link:message-size-exceeded";
    pub const SERVER_BUSY: &str = "com.microsoft:server-busy";
    pub const TIMEOUT: &str = "com.microsoft:timeout";
    pub const ARGUMENT_ERROR: &str = "com.microsoft:argument-error";
    pub const ARGUMENT_OUT_OF_RANGE: &str = "com.microsoft:argument-out-of-range";
    pub const ENTITY_DISABLED: &str = "com.microsoft:entity-disabled";
}

/// The `error` composite (0x1d). Always written with all 3 fields: pyamqp reads `info` by
/// position in close, rejected and detach.
#[derive(Debug, Clone, PartialEq)]
pub struct AmqpError {
    pub condition: Symbol,
    pub description: Option<String>,
    pub info: Option<Fields>,
}

/// The state of a delivery, carried by transfer and disposition.
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryState {
    /// 0x23: how much of the message the receiver has (used when resuming links).
    Received {
        section_number: u32,
        section_offset: u64,
    },
    /// 0x24.
    Accepted,
    /// 0x25: the SDKs read `error` by position, so send one.
    Rejected { error: Option<AmqpError> },
    /// 0x26.
    Released,
    /// 0x27.
    Modified {
        delivery_failed: bool,
        undeliverable_here: bool,
        message_annotations: Option<Map>,
    },
}

pub(crate) const ERROR: Descriptor = Descriptor::new(0x1d, "amqp:error:list");
const RECEIVED: Descriptor = Descriptor::new(0x23, "amqp:received:list");
const ACCEPTED: Descriptor = Descriptor::new(0x24, "amqp:accepted:list");
const REJECTED: Descriptor = Descriptor::new(0x25, "amqp:rejected:list");
const RELEASED: Descriptor = Descriptor::new(0x26, "amqp:released:list");
const MODIFIED: Descriptor = Descriptor::new(0x27, "amqp:modified:list");

impl AmqpError {
    pub fn new(condition: impl Into<Symbol>, description: impl Into<String>) -> AmqpError {
        AmqpError {
            condition: condition.into(),
            description: Some(description.into()),
            info: None,
        }
    }

    pub fn to_value(&self) -> Value {
        ERROR.composite(vec![
            Value::Symbol(self.condition.clone()),
            self.description.clone().map_or(Value::Null, Value::String),
            fields_value(&self.info),
        ])
    }

    pub fn from_value(value: Value) -> Result<AmqpError, CodecError> {
        AmqpError::from_field(value, "error")
    }

    fn from_field(value: Value, field: &'static str) -> Result<AmqpError, CodecError> {
        let mut r = ERROR.fields(value, field)?;
        Ok(AmqpError {
            condition: r.required("error.condition")?,
            description: r.optional("error.description")?,
            info: optional_fields(&mut r, "error.info")?,
        })
    }
}

pub(crate) fn error_value(error: &Option<AmqpError>) -> Value {
    error.as_ref().map_or(Value::Null, AmqpError::to_value)
}

pub(crate) fn read_error(
    reader: &mut FieldReader,
    field: &'static str,
) -> Result<Option<AmqpError>, CodecError> {
    match reader.next_value() {
        Value::Null => Ok(None),
        value => AmqpError::from_field(value, field).map(Some),
    }
}

impl DeliveryState {
    pub fn to_value(&self) -> Value {
        match self {
            DeliveryState::Received {
                section_number,
                section_offset,
            } => RECEIVED.composite(vec![(*section_number).into(), (*section_offset).into()]),
            DeliveryState::Accepted => ACCEPTED.composite(Vec::new()),
            DeliveryState::Rejected { error } => REJECTED.composite(vec![error_value(error)]),
            DeliveryState::Released => RELEASED.composite(Vec::new()),
            DeliveryState::Modified {
                delivery_failed,
                undeliverable_here,
                message_annotations,
            } => MODIFIED.composite(vec![
                (*delivery_failed).into(),
                (*undeliverable_here).into(),
                map_value(message_annotations),
            ]),
        }
    }

    pub fn from_value(value: Value, field: &'static str) -> Result<DeliveryState, CodecError> {
        let Value::Described(described) = value else {
            return Err(unexpected(field, "delivery state", &value));
        };
        let Described {
            descriptor,
            value: body,
        } = *described;
        let is = |d: Descriptor| descriptor.is_descriptor(d.code, d.name);
        let state = if is(ACCEPTED) {
            DeliveryState::Accepted
        } else if is(RELEASED) {
            DeliveryState::Released
        } else if is(RECEIVED) {
            let mut r = FieldReader::from_body(body, field)?;
            DeliveryState::Received {
                section_number: r.required("received.section-number")?,
                section_offset: r.required("received.section-offset")?,
            }
        } else if is(REJECTED) {
            let mut r = FieldReader::from_body(body, field)?;
            DeliveryState::Rejected {
                error: read_error(&mut r, "rejected.error")?,
            }
        } else if is(MODIFIED) {
            let mut r = FieldReader::from_body(body, field)?;
            DeliveryState::Modified {
                delivery_failed: r.or("modified.delivery-failed", false)?,
                undeliverable_here: r.or("modified.undeliverable-here", false)?,
                message_annotations: r.optional("modified.message-annotations")?,
            }
        } else {
            return Err(unknown_descriptor(field, &descriptor));
        };
        Ok(state)
    }
}

impl crate::fields::FromValue for DeliveryState {
    fn from_value(value: Value, field: &'static str) -> Result<DeliveryState, CodecError> {
        DeliveryState::from_value(value, field)
    }
}
