//! The AMQP 1.0 type system (OASIS AMQP 1.0 part 1, §1.6): [`Value`] and its parts.
//! Encoding is in `encode.rs`, decoding in `decode.rs`.

use std::fmt;

use bytes::Bytes;

use crate::error::CodecError;

/// Any AMQP 1.0 value. A `Value` does not remember how it was encoded: `Uint(7)` decodes from
/// `uint0`, `smalluint` or `uint` alike and is always written in the smallest form.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Null,
    Boolean(bool),
    Ubyte(u8),
    Ushort(u16),
    Uint(u32),
    Ulong(u64),
    Byte(i8),
    Short(i16),
    Int(i32),
    Long(i64),
    Float(f32),
    Double(f64),
    /// IEEE 754 decimal32, kept as its four bytes (nothing in Event Hubs computes with it).
    Decimal32([u8; 4]),
    Decimal64([u8; 8]),
    Decimal128([u8; 16]),
    Char(char),
    /// Milliseconds since the Unix epoch.
    Timestamp(i64),
    Uuid([u8; 16]),
    Binary(Bytes),
    String(String),
    Symbol(Symbol),
    List(Vec<Value>),
    /// Pairs in wire order; keys are not deduplicated.
    Map(Vec<(Value, Value)>),
    Array(Array),
    Described(Box<Described>),
}

/// An AMQP map in wire order, as annotations and other maps with non-string keys use it.
pub type Map = Vec<(Value, Value)>;

/// A map with symbol keys (the spec's `fields` type: open, begin and attach properties,
/// error info, filter sets).
pub type Fields = Vec<(Symbol, Value)>;

/// A symbolic value. The spec limits symbols to ASCII; decoding accepts any UTF-8.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Symbol(String);

/// A described value: a descriptor (by convention a ulong code or a symbol name) and the value
/// it describes.
#[derive(Debug, Clone, PartialEq)]
pub struct Described {
    pub descriptor: Value,
    pub value: Value,
}

/// A homogeneous sequence: every item has the same [`ValueKind`] and, when `descriptor` is
/// set, is described by it. The items are stored undescribed.
#[derive(Debug, Clone, PartialEq)]
pub struct Array {
    descriptor: Option<Box<Value>>,
    kind: ValueKind,
    items: Vec<Value>,
}

/// The kind of a [`Value`] without its contents; names the item type of an [`Array`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueKind {
    Null,
    Boolean,
    Ubyte,
    Ushort,
    Uint,
    Ulong,
    Byte,
    Short,
    Int,
    Long,
    Float,
    Double,
    Decimal32,
    Decimal64,
    Decimal128,
    Char,
    Timestamp,
    Uuid,
    Binary,
    String,
    Symbol,
    List,
    Map,
    Array,
    Described,
}

impl Value {
    /// A symbol value.
    pub fn symbol(name: impl Into<String>) -> Value {
        Value::Symbol(Symbol::new(name))
    }

    /// A described value.
    pub fn described(descriptor: Value, value: Value) -> Value {
        Value::Described(Box::new(Described { descriptor, value }))
    }

    pub fn kind(&self) -> ValueKind {
        match self {
            Value::Null => ValueKind::Null,
            Value::Boolean(_) => ValueKind::Boolean,
            Value::Ubyte(_) => ValueKind::Ubyte,
            Value::Ushort(_) => ValueKind::Ushort,
            Value::Uint(_) => ValueKind::Uint,
            Value::Ulong(_) => ValueKind::Ulong,
            Value::Byte(_) => ValueKind::Byte,
            Value::Short(_) => ValueKind::Short,
            Value::Int(_) => ValueKind::Int,
            Value::Long(_) => ValueKind::Long,
            Value::Float(_) => ValueKind::Float,
            Value::Double(_) => ValueKind::Double,
            Value::Decimal32(_) => ValueKind::Decimal32,
            Value::Decimal64(_) => ValueKind::Decimal64,
            Value::Decimal128(_) => ValueKind::Decimal128,
            Value::Char(_) => ValueKind::Char,
            Value::Timestamp(_) => ValueKind::Timestamp,
            Value::Uuid(_) => ValueKind::Uuid,
            Value::Binary(_) => ValueKind::Binary,
            Value::String(_) => ValueKind::String,
            Value::Symbol(_) => ValueKind::Symbol,
            Value::List(_) => ValueKind::List,
            Value::Map(_) => ValueKind::Map,
            Value::Array(_) => ValueKind::Array,
            Value::Described(_) => ValueKind::Described,
        }
    }

    /// The text of a string or symbol value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            Value::Symbol(s) => Some(s.as_str()),
            _ => None,
        }
    }

    /// Any unsigned integer kind as a `u64`.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::Ubyte(v) => Some(v.into()),
            Value::Ushort(v) => Some(v.into()),
            Value::Uint(v) => Some(v.into()),
            Value::Ulong(v) => Some(v),
            _ => None,
        }
    }

    /// Any signed integer kind as an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Byte(v) => Some(v.into()),
            Value::Short(v) => Some(v.into()),
            Value::Int(v) => Some(v.into()),
            Value::Long(v) => Some(v),
            _ => None,
        }
    }

    /// True for a ulong equal to `code` or a symbol equal to `name`: the two ways a descriptor
    /// can name a type.
    pub fn is_descriptor(&self, code: u64, name: &str) -> bool {
        match self {
            Value::Ulong(c) => *c == code,
            Value::Symbol(s) => s.as_str() == name,
            _ => false,
        }
    }
}

/// The value under a symbol or string key `key` in an AMQP map (annotations are keyed by
/// symbols, application properties by strings).
pub fn map_get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

impl Symbol {
    pub fn new(name: impl Into<String>) -> Symbol {
        Symbol(name.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl fmt::Display for Symbol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Symbol {
    fn from(name: &str) -> Symbol {
        Symbol::new(name)
    }
}

impl From<String> for Symbol {
    fn from(name: String) -> Symbol {
        Symbol(name)
    }
}

impl PartialEq<str> for Symbol {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Symbol {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl Array {
    /// An array of `kind` items; fails when an item is of another kind.
    pub fn new(kind: ValueKind, items: Vec<Value>) -> Result<Array, CodecError> {
        if kind == ValueKind::Described {
            return Err(CodecError::ArrayOfDescribed);
        }
        if let Some((index, item)) = items.iter().enumerate().find(|(_, v)| v.kind() != kind) {
            return Err(CodecError::ArrayItemKind {
                index,
                expected: kind.name(),
                found: item.kind().name(),
            });
        }
        Ok(Array {
            descriptor: None,
            kind,
            items,
        })
    }

    /// An array of `kind` items, each described by `descriptor`.
    pub fn described(
        descriptor: Value,
        kind: ValueKind,
        items: Vec<Value>,
    ) -> Result<Array, CodecError> {
        let mut array = Array::new(kind, items)?;
        array.descriptor = Some(Box::new(descriptor));
        Ok(array)
    }

    /// An array of symbols (the spec's `multiple="true"` symbol fields).
    pub fn symbols(items: impl IntoIterator<Item = Symbol>) -> Array {
        Array {
            descriptor: None,
            kind: ValueKind::Symbol,
            items: items.into_iter().map(Value::Symbol).collect(),
        }
    }

    /// Decoded arrays are built item by item with the kind their constructor names.
    pub(crate) fn from_decoded(
        descriptor: Option<Value>,
        kind: ValueKind,
        items: Vec<Value>,
    ) -> Array {
        Array {
            descriptor: descriptor.map(Box::new),
            kind,
            items,
        }
    }

    pub fn kind(&self) -> ValueKind {
        self.kind
    }

    pub fn descriptor(&self) -> Option<&Value> {
        self.descriptor.as_deref()
    }

    pub fn items(&self) -> &[Value] {
        &self.items
    }

    pub fn into_items(self) -> Vec<Value> {
        self.items
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

impl ValueKind {
    /// The spec's name of the type, for error messages.
    pub fn name(self) -> &'static str {
        match self {
            ValueKind::Null => "null",
            ValueKind::Boolean => "boolean",
            ValueKind::Ubyte => "ubyte",
            ValueKind::Ushort => "ushort",
            ValueKind::Uint => "uint",
            ValueKind::Ulong => "ulong",
            ValueKind::Byte => "byte",
            ValueKind::Short => "short",
            ValueKind::Int => "int",
            ValueKind::Long => "long",
            ValueKind::Float => "float",
            ValueKind::Double => "double",
            ValueKind::Decimal32 => "decimal32",
            ValueKind::Decimal64 => "decimal64",
            ValueKind::Decimal128 => "decimal128",
            ValueKind::Char => "char",
            ValueKind::Timestamp => "timestamp",
            ValueKind::Uuid => "uuid",
            ValueKind::Binary => "binary",
            ValueKind::String => "string",
            ValueKind::Symbol => "symbol",
            ValueKind::List => "list",
            ValueKind::Map => "map",
            ValueKind::Array => "array",
            ValueKind::Described => "described value",
        }
    }
}

macro_rules! value_from {
    ($($t:ty => $variant:ident),* $(,)?) => {
        $(impl From<$t> for Value {
            fn from(v: $t) -> Value {
                Value::$variant(v.into())
            }
        })*
    };
}

value_from!(
    bool => Boolean,
    u8 => Ubyte,
    u16 => Ushort,
    u32 => Uint,
    u64 => Ulong,
    i8 => Byte,
    i16 => Short,
    i32 => Int,
    i64 => Long,
    f32 => Float,
    f64 => Double,
    char => Char,
    Bytes => Binary,
    String => String,
    &str => String,
    Symbol => Symbol,
    Array => Array,
);
