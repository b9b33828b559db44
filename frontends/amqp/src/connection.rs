//! Connection and session performatives: open (0x10), begin (0x11), end (0x17), close (0x18).
//! Field counts when written: open 10, begin 8, end 1, close 1 (WIRE-PROTOCOLS A5).

use crate::delivery_state::{AmqpError, error_value, read_error};
use crate::error::CodecError;
use crate::fields::{Descriptor, FieldReader, fields_value, opt, optional_fields, symbols_value};
use crate::ids::{Channel, TransferNumber};
use crate::types::{Fields, Symbol, Value};

/// Opens a connection. pyamqp needs an explicit max-frame-size of at least 512 and a
/// properties map (even empty) so the list has all 10 fields (WIRE-PROTOCOLS A4).
#[derive(Debug, Clone, PartialEq)]
pub struct Open {
    pub container_id: String,
    pub hostname: Option<String>,
    /// The spec's `max-frame-size`; default 4294967295.
    pub max_frame_size_bytes: u32,
    /// The highest channel number; default 65535.
    pub channel_max: u16,
    /// The spec's `idle-time-out`: the peer closes the connection after this long without a
    /// frame from us. `None`: no timeout.
    pub idle_timeout_ms: Option<u32>,
    pub outgoing_locales: Vec<Symbol>,
    pub incoming_locales: Vec<Symbol>,
    pub offered_capabilities: Vec<Symbol>,
    pub desired_capabilities: Vec<Symbol>,
    pub properties: Option<Fields>,
}

/// Begins a session. pyamqp looks the session up by `remote_channel` and computes with
/// `handle_max`, so a server writes both.
#[derive(Debug, Clone, PartialEq)]
pub struct Begin {
    /// Set when answering the peer's begin: the channel it began on.
    pub remote_channel: Option<Channel>,
    pub next_outgoing_id: TransferNumber,
    pub incoming_window: u32,
    pub outgoing_window: u32,
    /// The highest link handle; default 4294967295.
    pub handle_max: u32,
    pub offered_capabilities: Vec<Symbol>,
    pub desired_capabilities: Vec<Symbol>,
    pub properties: Option<Fields>,
}

/// Ends a session.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct End {
    pub error: Option<AmqpError>,
}

/// Closes a connection.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Close {
    pub error: Option<AmqpError>,
}

pub(crate) const OPEN: Descriptor = Descriptor::new(0x10, "amqp:open:list");
pub(crate) const BEGIN: Descriptor = Descriptor::new(0x11, "amqp:begin:list");
pub(crate) const END: Descriptor = Descriptor::new(0x17, "amqp:end:list");
pub(crate) const CLOSE: Descriptor = Descriptor::new(0x18, "amqp:close:list");

impl Default for Open {
    fn default() -> Open {
        Open {
            container_id: String::new(),
            hostname: None,
            max_frame_size_bytes: u32::MAX,
            channel_max: u16::MAX,
            idle_timeout_ms: None,
            outgoing_locales: Vec::new(),
            incoming_locales: Vec::new(),
            offered_capabilities: Vec::new(),
            desired_capabilities: Vec::new(),
            properties: None,
        }
    }
}

impl Default for Begin {
    fn default() -> Begin {
        Begin {
            remote_channel: None,
            next_outgoing_id: TransferNumber(0),
            incoming_window: 0,
            outgoing_window: 0,
            handle_max: u32::MAX,
            offered_capabilities: Vec::new(),
            desired_capabilities: Vec::new(),
            properties: None,
        }
    }
}

impl Open {
    pub(crate) fn to_value(&self) -> Value {
        OPEN.composite(vec![
            Value::String(self.container_id.clone()),
            opt(self.hostname.clone()),
            self.max_frame_size_bytes.into(),
            self.channel_max.into(),
            opt(self.idle_timeout_ms),
            symbols_value(&self.outgoing_locales),
            symbols_value(&self.incoming_locales),
            symbols_value(&self.offered_capabilities),
            symbols_value(&self.desired_capabilities),
            fields_value(&self.properties),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Open, CodecError> {
        Ok(Open {
            container_id: r.required("open.container-id")?,
            hostname: r.optional("open.hostname")?,
            max_frame_size_bytes: r.or("open.max-frame-size", u32::MAX)?,
            channel_max: r.or("open.channel-max", u16::MAX)?,
            idle_timeout_ms: r.optional("open.idle-time-out")?,
            outgoing_locales: r.symbols("open.outgoing-locales")?,
            incoming_locales: r.symbols("open.incoming-locales")?,
            offered_capabilities: r.symbols("open.offered-capabilities")?,
            desired_capabilities: r.symbols("open.desired-capabilities")?,
            properties: optional_fields(&mut r, "open.properties")?,
        })
    }
}

impl Begin {
    pub(crate) fn to_value(&self) -> Value {
        BEGIN.composite(vec![
            opt(self.remote_channel),
            self.next_outgoing_id.into(),
            self.incoming_window.into(),
            self.outgoing_window.into(),
            self.handle_max.into(),
            symbols_value(&self.offered_capabilities),
            symbols_value(&self.desired_capabilities),
            fields_value(&self.properties),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Begin, CodecError> {
        Ok(Begin {
            remote_channel: r.optional("begin.remote-channel")?,
            next_outgoing_id: r.required("begin.next-outgoing-id")?,
            incoming_window: r.required("begin.incoming-window")?,
            outgoing_window: r.required("begin.outgoing-window")?,
            handle_max: r.or("begin.handle-max", u32::MAX)?,
            offered_capabilities: r.symbols("begin.offered-capabilities")?,
            desired_capabilities: r.symbols("begin.desired-capabilities")?,
            properties: optional_fields(&mut r, "begin.properties")?,
        })
    }
}

impl End {
    pub(crate) fn to_value(&self) -> Value {
        END.composite(vec![error_value(&self.error)])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<End, CodecError> {
        Ok(End {
            error: read_error(&mut r, "end.error")?,
        })
    }
}

impl Close {
    pub(crate) fn to_value(&self) -> Value {
        CLOSE.composite(vec![error_value(&self.error)])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<Close, CodecError> {
        Ok(Close {
            error: read_error(&mut r, "close.error")?,
        })
    }
}
