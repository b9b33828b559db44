//! Format codes (AMQP 1.0 part 1, §1.6), shared by the encoder and the decoder.

use crate::types::ValueKind;

pub(crate) const DESCRIBED: u8 = 0x00;
pub(crate) const NULL: u8 = 0x40;
pub(crate) const TRUE: u8 = 0x41;
pub(crate) const FALSE: u8 = 0x42;
pub(crate) const UINT0: u8 = 0x43;
pub(crate) const ULONG0: u8 = 0x44;
pub(crate) const LIST0: u8 = 0x45;
pub(crate) const UBYTE: u8 = 0x50;
pub(crate) const BYTE: u8 = 0x51;
pub(crate) const SMALLUINT: u8 = 0x52;
pub(crate) const SMALLULONG: u8 = 0x53;
pub(crate) const SMALLINT: u8 = 0x54;
pub(crate) const SMALLLONG: u8 = 0x55;
pub(crate) const BOOLEAN: u8 = 0x56;
pub(crate) const USHORT: u8 = 0x60;
pub(crate) const SHORT: u8 = 0x61;
pub(crate) const UINT: u8 = 0x70;
pub(crate) const INT: u8 = 0x71;
pub(crate) const FLOAT: u8 = 0x72;
pub(crate) const CHAR: u8 = 0x73;
pub(crate) const DECIMAL32: u8 = 0x74;
pub(crate) const ULONG: u8 = 0x80;
pub(crate) const LONG: u8 = 0x81;
pub(crate) const DOUBLE: u8 = 0x82;
pub(crate) const TIMESTAMP: u8 = 0x83;
pub(crate) const DECIMAL64: u8 = 0x84;
pub(crate) const DECIMAL128: u8 = 0x94;
pub(crate) const UUID: u8 = 0x98;
pub(crate) const VBIN8: u8 = 0xa0;
pub(crate) const STR8: u8 = 0xa1;
pub(crate) const SYM8: u8 = 0xa3;
pub(crate) const VBIN32: u8 = 0xb0;
pub(crate) const STR32: u8 = 0xb1;
pub(crate) const SYM32: u8 = 0xb3;
pub(crate) const LIST8: u8 = 0xc0;
pub(crate) const MAP8: u8 = 0xc1;
pub(crate) const LIST32: u8 = 0xd0;
pub(crate) const MAP32: u8 = 0xd1;
pub(crate) const ARRAY8: u8 = 0xe0;
pub(crate) const ARRAY32: u8 = 0xf0;

/// The kind of value primitive constructor `code` makes, and the fewest bytes one such value
/// occupies after the constructor (its length or size prefix included); `None` for a code
/// that is not a primitive constructor. Arrays use both: the kind names an empty array's item
/// type, and the length refuses counts the remaining bytes cannot hold before anything is
/// allocated.
pub(crate) fn primitive(code: u8) -> Option<(ValueKind, usize)> {
    use ValueKind as K;
    Some(match code {
        NULL => (K::Null, 0),
        TRUE | FALSE => (K::Boolean, 0),
        BOOLEAN => (K::Boolean, 1),
        UINT0 => (K::Uint, 0),
        SMALLUINT => (K::Uint, 1),
        UINT => (K::Uint, 4),
        ULONG0 => (K::Ulong, 0),
        SMALLULONG => (K::Ulong, 1),
        ULONG => (K::Ulong, 8),
        UBYTE => (K::Ubyte, 1),
        BYTE => (K::Byte, 1),
        SMALLINT => (K::Int, 1),
        INT => (K::Int, 4),
        SMALLLONG => (K::Long, 1),
        LONG => (K::Long, 8),
        USHORT => (K::Ushort, 2),
        SHORT => (K::Short, 2),
        FLOAT => (K::Float, 4),
        DOUBLE => (K::Double, 8),
        CHAR => (K::Char, 4),
        DECIMAL32 => (K::Decimal32, 4),
        DECIMAL64 => (K::Decimal64, 8),
        DECIMAL128 => (K::Decimal128, 16),
        TIMESTAMP => (K::Timestamp, 8),
        UUID => (K::Uuid, 16),
        VBIN8 => (K::Binary, 1),
        VBIN32 => (K::Binary, 4),
        STR8 => (K::String, 1),
        STR32 => (K::String, 4),
        SYM8 => (K::Symbol, 1),
        SYM32 => (K::Symbol, 4),
        LIST0 => (K::List, 0),
        LIST8 => (K::List, 2),
        LIST32 => (K::List, 8),
        MAP8 => (K::Map, 2),
        MAP32 => (K::Map, 8),
        ARRAY8 => (K::Array, 3),
        ARRAY32 => (K::Array, 9),
        _ => return None,
    })
}
