//! SASL performatives (AMQP 1.0 part 5 §5.3): mechanisms (0x40), init (0x41), challenge
//! (0x42), response (0x43), outcome (0x44). They travel in frames of type 1.

use bytes::Bytes;

use crate::error::CodecError;
use crate::fields::{Descriptor, FieldReader, opt, symbols_value, wire_enum};
use crate::types::{Symbol, Value};

/// The mechanisms the server offers. pyamqp tests `mechanism in fields[0]`, so they are
/// always written as an array (WIRE-PROTOCOLS A3).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaslMechanisms {
    pub sasl_server_mechanisms: Vec<Symbol>,
}

/// The client's choice of mechanism.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaslInit {
    pub mechanism: Symbol,
    pub initial_response: Option<Bytes>,
    pub hostname: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaslChallenge {
    pub challenge: Bytes,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaslResponse {
    pub response: Bytes,
}

/// The end of the SASL exchange.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SaslOutcome {
    pub code: SaslCode,
    pub additional_data: Option<Bytes>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum SaslCode {
    #[default]
    Ok,
    /// Authentication failed: bad credentials.
    Auth,
    /// A system error; the client should not retry.
    Sys,
    SysPerm,
    SysTemp,
}

wire_enum!(SaslCode as u8, "ubyte", "0 (ok), 1 (auth), 2 (sys), 3 (sys-perm) or 4 (sys-temp)" {
    Ok = 0,
    Auth = 1,
    Sys = 2,
    SysPerm = 3,
    SysTemp = 4,
});

pub(crate) const SASL_MECHANISMS: Descriptor = Descriptor::new(0x40, "amqp:sasl-mechanisms:list");
pub(crate) const SASL_INIT: Descriptor = Descriptor::new(0x41, "amqp:sasl-init:list");
pub(crate) const SASL_CHALLENGE: Descriptor = Descriptor::new(0x42, "amqp:sasl-challenge:list");
pub(crate) const SASL_RESPONSE: Descriptor = Descriptor::new(0x43, "amqp:sasl-response:list");
pub(crate) const SASL_OUTCOME: Descriptor = Descriptor::new(0x44, "amqp:sasl-outcome:list");

impl SaslMechanisms {
    pub(crate) fn to_value(&self) -> Value {
        SASL_MECHANISMS.composite(vec![symbols_value(&self.sasl_server_mechanisms)])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<SaslMechanisms, CodecError> {
        Ok(SaslMechanisms {
            sasl_server_mechanisms: r.symbols("sasl-mechanisms.sasl-server-mechanisms")?,
        })
    }
}

impl SaslInit {
    pub(crate) fn to_value(&self) -> Value {
        SASL_INIT.composite(vec![
            Value::Symbol(self.mechanism.clone()),
            opt(self.initial_response.clone()),
            opt(self.hostname.clone()),
        ])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<SaslInit, CodecError> {
        Ok(SaslInit {
            mechanism: r.required("sasl-init.mechanism")?,
            initial_response: r.optional("sasl-init.initial-response")?,
            hostname: r.optional("sasl-init.hostname")?,
        })
    }
}

impl SaslChallenge {
    pub(crate) fn to_value(&self) -> Value {
        SASL_CHALLENGE.composite(vec![Value::Binary(self.challenge.clone())])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<SaslChallenge, CodecError> {
        Ok(SaslChallenge {
            challenge: r.required("sasl-challenge.challenge")?,
        })
    }
}

impl SaslResponse {
    pub(crate) fn to_value(&self) -> Value {
        SASL_RESPONSE.composite(vec![Value::Binary(self.response.clone())])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<SaslResponse, CodecError> {
        Ok(SaslResponse {
            response: r.required("sasl-response.response")?,
        })
    }
}

impl SaslOutcome {
    pub(crate) fn to_value(&self) -> Value {
        SASL_OUTCOME.composite(vec![self.code.into(), opt(self.additional_data.clone())])
    }

    pub(crate) fn read(mut r: FieldReader) -> Result<SaslOutcome, CodecError> {
        Ok(SaslOutcome {
            code: r.required("sasl-outcome.code")?,
            additional_data: r.optional("sasl-outcome.additional-data")?,
        })
    }
}
