//! Writing [`Value`]s. Each value gets the smallest unambiguous encoding the spec allows, with
//! two exceptions made for the Azure SDKs' decoder (WIRE-PROTOCOLS A5):
//! - `list0` is never written: an empty list is `list8` with count 0, so code reading a fixed
//!   position of a list finds the list header it expects.
//! - an empty array is written as null, because pyamqp does not consume an empty array's
//!   element constructor and loses its place in the frame. (An empty array nested directly in
//!   an array of arrays has no null form and is written as it is.)

use bytes::Bytes;

use crate::constructor as c;
use crate::types::{Array, Value, ValueKind};

impl Value {
    /// Appends the encoding of this value to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        encode_value(self, out);
    }

    /// The encoding of this value.
    pub fn to_bytes(&self) -> Bytes {
        let mut out = Vec::new();
        encode_value(self, &mut out);
        Bytes::from(out)
    }
}

fn encode_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.push(c::NULL),
        Value::Boolean(true) => out.push(c::TRUE),
        Value::Boolean(false) => out.push(c::FALSE),
        Value::Uint(0) => out.push(c::UINT0),
        Value::Uint(v) if *v <= 0xff => out.extend_from_slice(&[c::SMALLUINT, *v as u8]),
        Value::Ulong(0) => out.push(c::ULONG0),
        Value::Ulong(v) if *v <= 0xff => out.extend_from_slice(&[c::SMALLULONG, *v as u8]),
        Value::Int(v) if i8::try_from(*v).is_ok() => {
            out.extend_from_slice(&[c::SMALLINT, *v as i8 as u8])
        }
        Value::Long(v) if i8::try_from(*v).is_ok() => {
            out.extend_from_slice(&[c::SMALLLONG, *v as i8 as u8])
        }
        Value::List(items) => {
            let mut body = Vec::new();
            for item in items {
                encode_value(item, &mut body);
            }
            write_compound(out, c::LIST8, c::LIST32, items.len(), &body);
        }
        Value::Map(pairs) => {
            let mut body = Vec::new();
            for (key, item) in pairs {
                encode_value(key, &mut body);
                encode_value(item, &mut body);
            }
            write_compound(out, c::MAP8, c::MAP32, pairs.len() * 2, &body);
        }
        Value::Array(array) if array.is_empty() => out.push(c::NULL),
        Value::Array(array) => {
            let body = array_body(array);
            write_compound(out, c::ARRAY8, c::ARRAY32, array.len(), &body);
        }
        Value::Described(described) => {
            out.push(c::DESCRIBED);
            encode_value(&described.descriptor, out);
            encode_value(&described.value, out);
        }
        Value::Binary(b) => write_variable(out, c::VBIN8, c::VBIN32, b),
        Value::String(s) => write_variable(out, c::STR8, c::STR32, s.as_bytes()),
        Value::Symbol(s) => write_variable(out, c::SYM8, c::SYM32, s.as_str().as_bytes()),
        fixed => {
            let code = element_code(fixed.kind(), false);
            out.push(code);
            write_fixed(fixed, out);
        }
    }
}

/// Writes the bytes that follow the constructor of a fixed-width value.
fn write_fixed(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => {}
        Value::Boolean(v) => out.push(u8::from(*v)),
        Value::Ubyte(v) => out.push(*v),
        Value::Ushort(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Uint(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Ulong(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Byte(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Short(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Int(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Long(v) | Value::Timestamp(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Float(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Double(v) => out.extend_from_slice(&v.to_be_bytes()),
        Value::Decimal32(v) => out.extend_from_slice(v),
        Value::Decimal64(v) => out.extend_from_slice(v),
        Value::Decimal128(v) | Value::Uuid(v) => out.extend_from_slice(v),
        Value::Char(v) => out.extend_from_slice(&u32::from(*v).to_be_bytes()),
        other => unreachable!("{} is not a fixed-width value", other.kind().name()),
    }
}

/// The constructor shared by all items of an array of `kind` (and the constructor of a lone
/// fixed-width value). Fixed-width kinds use their full-width code so that every item fits;
/// variable-width kinds use the 8-bit form when `wide` is false.
fn element_code(kind: ValueKind, wide: bool) -> u8 {
    match kind {
        ValueKind::Null => c::NULL,
        ValueKind::Boolean => c::BOOLEAN,
        ValueKind::Ubyte => c::UBYTE,
        ValueKind::Ushort => c::USHORT,
        ValueKind::Uint => c::UINT,
        ValueKind::Ulong => c::ULONG,
        ValueKind::Byte => c::BYTE,
        ValueKind::Short => c::SHORT,
        ValueKind::Int => c::INT,
        ValueKind::Long => c::LONG,
        ValueKind::Float => c::FLOAT,
        ValueKind::Double => c::DOUBLE,
        ValueKind::Decimal32 => c::DECIMAL32,
        ValueKind::Decimal64 => c::DECIMAL64,
        ValueKind::Decimal128 => c::DECIMAL128,
        ValueKind::Char => c::CHAR,
        ValueKind::Timestamp => c::TIMESTAMP,
        ValueKind::Uuid => c::UUID,
        ValueKind::Binary if wide => c::VBIN32,
        ValueKind::Binary => c::VBIN8,
        ValueKind::String if wide => c::STR32,
        ValueKind::String => c::STR8,
        ValueKind::Symbol if wide => c::SYM32,
        ValueKind::Symbol => c::SYM8,
        // Compound items of an array always take the 32-bit form: one constructor must fit
        // every item, and such arrays are too rare to be worth measuring first.
        ValueKind::List => c::LIST32,
        ValueKind::Map => c::MAP32,
        ValueKind::Array => c::ARRAY32,
        ValueKind::Described => unreachable!("Array::new refuses described items"),
    }
}

/// An array's element constructor followed by its items.
fn array_body(array: &Array) -> Vec<u8> {
    let wide = array.items().iter().any(|item| match item {
        Value::Binary(b) => b.len() > 0xff,
        Value::String(s) => s.len() > 0xff,
        Value::Symbol(s) => s.as_str().len() > 0xff,
        _ => false,
    });
    let code = element_code(array.kind(), wide);
    let mut body = Vec::new();
    if let Some(descriptor) = array.descriptor() {
        body.push(c::DESCRIBED);
        encode_value(descriptor, &mut body);
    }
    body.push(code);
    for item in array.items() {
        write_element(item, wide, &mut body);
    }
    body
}

/// Writes one array item without its constructor.
fn write_element(item: &Value, wide: bool, out: &mut Vec<u8>) {
    match item {
        Value::Binary(b) => write_length_prefixed(out, wide, b),
        Value::String(s) => write_length_prefixed(out, wide, s.as_bytes()),
        Value::Symbol(s) => write_length_prefixed(out, wide, s.as_str().as_bytes()),
        Value::List(items) => {
            let mut body = Vec::new();
            for nested in items {
                encode_value(nested, &mut body);
            }
            write_wide_compound_body(out, items.len(), &body);
        }
        Value::Map(pairs) => {
            let mut body = Vec::new();
            for (key, nested) in pairs {
                encode_value(key, &mut body);
                encode_value(nested, &mut body);
            }
            write_wide_compound_body(out, pairs.len() * 2, &body);
        }
        Value::Array(nested) => write_wide_compound_body(out, nested.len(), &array_body(nested)),
        fixed => write_fixed(fixed, out),
    }
}

/// A list, map or array: the 8-bit form when both its size and count fit in a byte.
fn write_compound(out: &mut Vec<u8>, short: u8, long: u8, count: usize, body: &[u8]) {
    // The size counts the count field as well as the items.
    if body.len() < 0xff && count <= 0xff {
        out.extend_from_slice(&[short, body.len() as u8 + 1, count as u8]);
        out.extend_from_slice(body);
    } else {
        out.push(long);
        write_wide_compound_body(out, count, body);
    }
}

fn write_wide_compound_body(out: &mut Vec<u8>, count: usize, body: &[u8]) {
    out.extend_from_slice(&wire_len(body.len() + 4).to_be_bytes());
    out.extend_from_slice(&wire_len(count).to_be_bytes());
    out.extend_from_slice(body);
}

fn write_variable(out: &mut Vec<u8>, short: u8, long: u8, bytes: &[u8]) {
    let wide = bytes.len() > 0xff;
    out.push(if wide { long } else { short });
    write_length_prefixed(out, wide, bytes);
}

fn write_length_prefixed(out: &mut Vec<u8>, wide: bool, bytes: &[u8]) {
    if wide {
        out.extend_from_slice(&wire_len(bytes.len()).to_be_bytes());
    } else {
        out.push(bytes.len() as u8);
    }
    out.extend_from_slice(bytes);
}

/// A length or count as the 32-bit field the wire has. A value of 4 GiB or more cannot be
/// sent in any frame; building one is a bug in the caller.
pub(crate) fn wire_len(len: usize) -> u32 {
    assert!(
        u32::try_from(len).is_ok(),
        "an AMQP value of {len} bytes or items does not fit a 32-bit length"
    );
    len as u32
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use crate::test_support::hex;
    use crate::{Array, Value, ValueKind};

    fn encoded(value: Value) -> Vec<u8> {
        value.to_bytes().to_vec()
    }

    #[test]
    fn primitives_take_their_smallest_form() {
        assert_eq!(encoded(Value::Uint(0)), hex("43"));
        assert_eq!(encoded(Value::Uint(255)), hex("52 ff"));
        assert_eq!(encoded(Value::Uint(256)), hex("70 00 00 01 00"));
        assert_eq!(encoded(Value::Ulong(0)), hex("44"));
        assert_eq!(encoded(Value::Ulong(0x18)), hex("53 18"));
        assert_eq!(
            encoded(Value::Ulong(0x1_0000)),
            hex("80 00 00 00 00 00 01 00 00")
        );
        assert_eq!(encoded(Value::Int(-128)), hex("54 80"));
        assert_eq!(encoded(Value::Int(128)), hex("71 00 00 00 80"));
        assert_eq!(encoded(Value::Long(127)), hex("55 7f"));
        assert_eq!(
            encoded(Value::Long(-129)),
            hex("81 ff ff ff ff ff ff ff 7f")
        );
        assert_eq!(encoded(Value::Boolean(true)), hex("41"));
        assert_eq!(encoded(Value::Boolean(false)), hex("42"));
        assert_eq!(encoded(Value::String("srv".into())), hex("a1 03 73 72 76"));
        assert_eq!(encoded(Value::symbol("x")), hex("a3 01 78"));
        assert_eq!(encoded(Value::Binary(Bytes::new())), hex("a0 00"));
        let long = "x".repeat(256);
        assert_eq!(
            encoded(Value::String(long.clone()))[..5],
            hex("b1 00 00 01 00")
        );
        assert_eq!(encoded(Value::symbol(long))[..5], hex("b3 00 00 01 00"));
    }

    #[test]
    fn empty_list_is_list8_never_list0() {
        assert_eq!(encoded(Value::List(Vec::new())), hex("c0 01 00"));
        assert_eq!(encoded(Value::Map(Vec::new())), hex("c1 01 00"));
    }

    #[test]
    fn empty_array_is_written_as_null() {
        let empty = Array::new(ValueKind::Symbol, Vec::new()).unwrap();
        assert_eq!(encoded(Value::Array(empty)), hex("40"));
        assert_eq!(
            encoded(Value::Array(Array::symbols(["ANONYMOUS".into()]))),
            hex("e0 0c 01 a3 09 41 4e 4f 4e 59 4d 4f 55 53")
        );
    }

    #[test]
    fn large_compounds_switch_to_32_bit_forms() {
        let list = Value::List(vec![Value::Null; 300]);
        assert_eq!(encoded(list)[..9], hex("d0 00 00 01 30 00 00 01 2c"));
        let exactly_255 = Value::List(vec![Value::Null; 254]);
        assert_eq!(encoded(exactly_255)[..3], hex("c0 ff fe"));
        let map = Value::Map(vec![(Value::Null, Value::Null); 128]);
        assert_eq!(encoded(map)[..9], hex("d1 00 00 01 04 00 00 01 00"));
        let wide = Array::new(
            ValueKind::Binary,
            vec![Value::Binary(Bytes::from(vec![0; 300]))],
        )
        .unwrap();
        assert_eq!(
            encoded(Value::Array(wide))[..10],
            hex("f0 00 00 01 35 00 00 00 01 b0")
        );
    }

    #[test]
    fn arrays_refuse_mixed_items() {
        assert!(Array::new(ValueKind::Uint, vec![Value::Uint(1), Value::Ulong(1)]).is_err());
        assert!(Array::new(ValueKind::Described, Vec::new()).is_err());
    }
}
