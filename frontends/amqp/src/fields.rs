//! Composite types (described lists) field by field, shared by performatives, terminus,
//! delivery states and message sections.
//!
//! Reading is lenient (WIRE-PROTOCOLS A5 rule 6): absent trailing fields read as null, null
//! takes the field's default, unsigned integers of any width are accepted where they fit,
//! strings and symbols stand in for each other, and extra trailing fields are ignored.
//! Writing is strict: every field is written, so the list always has the full count.

use bytes::Bytes;

use crate::error::CodecError;
use crate::types::{Array, Fields, Map, Symbol, Value};

/// A composite type's descriptor: its ulong code and its symbolic name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Descriptor {
    pub(crate) code: u64,
    pub(crate) name: &'static str,
}

impl Descriptor {
    pub(crate) const fn new(code: u64, name: &'static str) -> Descriptor {
        Descriptor { code, name }
    }

    /// `described(code, list(fields))`; the code is written as smallulong `00 53 <code>`.
    pub(crate) fn composite(self, fields: Vec<Value>) -> Value {
        Value::described(Value::Ulong(self.code), Value::List(fields))
    }

    /// Opens `value` as this composite type.
    pub(crate) fn fields(
        self,
        value: Value,
        field: &'static str,
    ) -> Result<FieldReader, CodecError> {
        let Value::Described(described) = value else {
            return Err(unexpected(field, self.name, &value));
        };
        if !described.descriptor.is_descriptor(self.code, self.name) {
            return Err(unknown_descriptor(field, &described.descriptor));
        }
        FieldReader::from_body(described.value, field)
    }
}

pub(crate) fn unknown_descriptor(context: &'static str, descriptor: &Value) -> CodecError {
    CodecError::UnknownDescriptor {
        context,
        descriptor: match descriptor {
            Value::Ulong(code) => format!("0x{code:016x}"),
            Value::Symbol(name) => format!("{:?}", name.as_str()),
            other => format!("of type {}", other.kind().name()),
        },
    }
}

/// The fields of one composite value, read in order.
pub(crate) struct FieldReader {
    fields: std::vec::IntoIter<Value>,
}

impl FieldReader {
    /// A composite's list; null reads as a list with no fields.
    pub(crate) fn from_body(body: Value, field: &'static str) -> Result<FieldReader, CodecError> {
        match body {
            Value::List(fields) => Ok(FieldReader {
                fields: fields.into_iter(),
            }),
            Value::Null => Ok(FieldReader {
                fields: Vec::new().into_iter(),
            }),
            other => Err(unexpected(field, "list", &other)),
        }
    }

    /// The next field; null when the list has ended.
    pub(crate) fn next_value(&mut self) -> Value {
        self.fields.next().unwrap_or(Value::Null)
    }

    pub(crate) fn optional<T: FromValue>(
        &mut self,
        field: &'static str,
    ) -> Result<Option<T>, CodecError> {
        match self.next_value() {
            Value::Null => Ok(None),
            value => T::from_value(value, field).map(Some),
        }
    }

    pub(crate) fn required<T: FromValue>(&mut self, field: &'static str) -> Result<T, CodecError> {
        self.optional(field)?
            .ok_or(CodecError::MissingField { field })
    }

    pub(crate) fn or<T: FromValue>(
        &mut self,
        field: &'static str,
        default: T,
    ) -> Result<T, CodecError> {
        Ok(self.optional(field)?.unwrap_or(default))
    }

    /// A `multiple="true"` symbol field: null, one symbol or an array of them.
    pub(crate) fn symbols(&mut self, field: &'static str) -> Result<Vec<Symbol>, CodecError> {
        match self.next_value() {
            Value::Null => Ok(Vec::new()),
            Value::Symbol(symbol) => Ok(vec![symbol]),
            Value::Array(array) => array
                .into_items()
                .into_iter()
                .map(|item| Symbol::from_value(item, field))
                .collect(),
            other => Err(unexpected(field, "symbol or array of symbols", &other)),
        }
    }

    pub(crate) fn timestamp(&mut self, field: &'static str) -> Result<Option<i64>, CodecError> {
        match self.next_value() {
            Value::Null => Ok(None),
            Value::Timestamp(ms) => Ok(Some(ms)),
            other => Err(unexpected(field, "timestamp", &other)),
        }
    }
}

pub(crate) fn unexpected(field: &'static str, expected: &'static str, found: &Value) -> CodecError {
    CodecError::UnexpectedType {
        field,
        expected,
        found: found.kind().name(),
    }
}

/// A field type read from a non-null value.
pub(crate) trait FromValue: Sized {
    fn from_value(value: Value, field: &'static str) -> Result<Self, CodecError>;
}

impl FromValue for Value {
    fn from_value(value: Value, _field: &'static str) -> Result<Value, CodecError> {
        Ok(value)
    }
}

impl FromValue for bool {
    fn from_value(value: Value, field: &'static str) -> Result<bool, CodecError> {
        match value {
            Value::Boolean(v) => Ok(v),
            other => Err(unexpected(field, "boolean", &other)),
        }
    }
}

macro_rules! unsigned_from_value {
    ($($t:ty => $name:literal),*) => {
        $(impl FromValue for $t {
            fn from_value(value: Value, field: &'static str) -> Result<$t, CodecError> {
                let wide = value.as_u64().ok_or_else(|| unexpected(field, $name, &value))?;
                <$t>::try_from(wide).map_err(|_| CodecError::OutOfRange {
                    field,
                    value: wide,
                    allowed: concat!("a ", $name),
                })
            }
        })*
    };
}

unsigned_from_value!(u8 => "ubyte", u16 => "ushort", u32 => "uint", u64 => "ulong");

impl FromValue for String {
    fn from_value(value: Value, field: &'static str) -> Result<String, CodecError> {
        match value {
            Value::String(s) => Ok(s),
            Value::Symbol(s) => Ok(s.into_string()),
            other => Err(unexpected(field, "string", &other)),
        }
    }
}

impl FromValue for Symbol {
    fn from_value(value: Value, field: &'static str) -> Result<Symbol, CodecError> {
        match value {
            Value::Symbol(s) => Ok(s),
            Value::String(s) => Ok(Symbol::from(s)),
            other => Err(unexpected(field, "symbol", &other)),
        }
    }
}

impl FromValue for Bytes {
    fn from_value(value: Value, field: &'static str) -> Result<Bytes, CodecError> {
        match value {
            Value::Binary(b) => Ok(b),
            other => Err(unexpected(field, "binary", &other)),
        }
    }
}

impl FromValue for Map {
    fn from_value(value: Value, field: &'static str) -> Result<Map, CodecError> {
        match value {
            Value::Map(pairs) => Ok(pairs),
            other => Err(unexpected(field, "map", &other)),
        }
    }
}

/// `fields`: a map whose keys are symbols (strings accepted).
pub(crate) fn fields_from_value(value: Value, field: &'static str) -> Result<Fields, CodecError> {
    Map::from_value(value, field)?
        .into_iter()
        .map(|(key, item)| Ok((Symbol::from_value(key, field)?, item)))
        .collect()
}

/// Reads an optional `fields` map.
pub(crate) fn optional_fields(
    reader: &mut FieldReader,
    field: &'static str,
) -> Result<Option<Fields>, CodecError> {
    match reader.next_value() {
        Value::Null => Ok(None),
        value => fields_from_value(value, field).map(Some),
    }
}

/// Null for `None`, else the value.
pub(crate) fn opt<T: Into<Value>>(value: Option<T>) -> Value {
    value.map_or(Value::Null, Into::into)
}

/// A `multiple="true"` symbol field: null when empty (never an empty array), else an array.
pub(crate) fn symbols_value(symbols: &[Symbol]) -> Value {
    if symbols.is_empty() {
        Value::Null
    } else {
        Value::Array(Array::symbols(symbols.iter().cloned()))
    }
}

pub(crate) fn fields_value(fields: &Option<Fields>) -> Value {
    fields.as_ref().map_or(Value::Null, |fields| {
        Value::Map(
            fields
                .iter()
                .map(|(key, value)| (Value::Symbol(key.clone()), value.clone()))
                .collect(),
        )
    })
}

pub(crate) fn map_value(map: &Option<Map>) -> Value {
    map.as_ref()
        .map_or(Value::Null, |map| Value::Map(map.clone()))
}

pub(crate) fn timestamp_value(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, Value::Timestamp)
}

/// Implements [`FromValue`] and `From<T> for Value` for a wire enum stored as an unsigned
/// integer (settle modes, terminus durability, SASL codes).
macro_rules! wire_enum {
    (
        $t:ident as $repr:ty, $name:literal, $allowed:literal
        { $($variant:ident = $n:literal),* $(,)? }
    ) => {
        impl crate::fields::FromValue for $t {
            fn from_value(
                value: crate::types::Value,
                field: &'static str,
            ) -> Result<$t, crate::error::CodecError> {
                let n = value
                    .as_u64()
                    .ok_or_else(|| crate::fields::unexpected(field, $name, &value))?;
                match n {
                    $($n => Ok($t::$variant),)*
                    _ => Err(crate::error::CodecError::OutOfRange {
                        field,
                        value: n,
                        allowed: $allowed,
                    }),
                }
            }
        }

        impl From<$t> for crate::types::Value {
            fn from(v: $t) -> crate::types::Value {
                let n: $repr = match v { $($t::$variant => $n,)* };
                n.into()
            }
        }
    };
}

pub(crate) use wire_enum;

/// Implements [`FromValue`] and `From<T> for Value` for a newtype over an unsigned integer.
macro_rules! wire_newtype {
    ($($t:ident($repr:ty)),* $(,)?) => {
        $(impl crate::fields::FromValue for $t {
            fn from_value(
                value: crate::types::Value,
                field: &'static str,
            ) -> Result<$t, crate::error::CodecError> {
                <$repr as crate::fields::FromValue>::from_value(value, field).map($t)
            }
        }

        impl From<$t> for crate::types::Value {
            fn from(v: $t) -> crate::types::Value {
                v.0.into()
            }
        })*
    };
}

pub(crate) use wire_newtype;
