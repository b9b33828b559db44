//! Reading [`Value`]s. Every constructor of the spec is accepted. The decoder never panics and
//! bounds what a hostile peer can make it do:
//! - nesting (lists, maps, arrays, described values) is limited to [`MAX_DEPTH`] levels;
//! - an element count is checked against the bytes left before anything is allocated;
//! - at most one `Value` is created per input byte (arrays of zero-width items such as
//!   `true` or `null` included), so memory stays proportional to the input.

use std::ops::Range;

use bytes::Bytes;

use crate::constructor as c;
use crate::error::CodecError;
use crate::types::{Array, Symbol, Value};

/// How deeply lists, maps, arrays and described values may nest. A performative with a
/// source, its filter set and a described filter needs 7.
pub const MAX_DEPTH: usize = 32;

impl Value {
    /// Decodes the value at the start of `input`; returns it with the bytes that follow it.
    pub fn decode(input: Bytes) -> Result<(Value, Bytes), CodecError> {
        let mut decoder = Decoder::new(input);
        let value = decoder.value()?;
        Ok((value, decoder.rest()))
    }
}

/// A cursor over one input buffer.
pub(crate) struct Decoder {
    input: Bytes,
    position: usize,
    /// The end of the innermost compound being read; reads never cross it.
    limit: usize,
    depth: usize,
    /// Values that may still be created: starts at the input's length.
    values_left: usize,
}

impl Decoder {
    pub(crate) fn new(input: Bytes) -> Decoder {
        let len = input.len();
        Decoder {
            input,
            position: 0,
            limit: len,
            depth: 0,
            values_left: len,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.position >= self.limit
    }

    /// The bytes not yet read.
    pub(crate) fn rest(&self) -> Bytes {
        self.input.slice(self.position..self.limit)
    }

    pub(crate) fn value(&mut self) -> Result<Value, CodecError> {
        let offset = self.position;
        let code = self.byte()?;
        if code == c::DESCRIBED {
            self.enter(offset)?;
            let descriptor = self.value()?;
            let value = self.value()?;
            self.depth -= 1;
            self.count_values(1)?;
            return Ok(Value::described(descriptor, value));
        }
        self.body(code, offset)
    }

    /// Reads what follows constructor `code` (read at `offset`).
    fn body(&mut self, code: u8, offset: usize) -> Result<Value, CodecError> {
        self.count_values(1)?;
        Ok(match code {
            c::NULL => Value::Null,
            c::TRUE => Value::Boolean(true),
            c::FALSE => Value::Boolean(false),
            c::BOOLEAN => Value::Boolean(self.byte()? != 0),
            c::UINT0 => Value::Uint(0),
            c::ULONG0 => Value::Ulong(0),
            c::LIST0 => Value::List(Vec::new()),
            c::UBYTE => Value::Ubyte(self.byte()?),
            c::BYTE => Value::Byte(i8::from_be_bytes(self.fixed()?)),
            c::SMALLUINT => Value::Uint(self.byte()?.into()),
            c::SMALLULONG => Value::Ulong(self.byte()?.into()),
            c::SMALLINT => Value::Int(i8::from_be_bytes(self.fixed()?).into()),
            c::SMALLLONG => Value::Long(i8::from_be_bytes(self.fixed()?).into()),
            c::USHORT => Value::Ushort(u16::from_be_bytes(self.fixed()?)),
            c::SHORT => Value::Short(i16::from_be_bytes(self.fixed()?)),
            c::UINT => Value::Uint(u32::from_be_bytes(self.fixed()?)),
            c::INT => Value::Int(i32::from_be_bytes(self.fixed()?)),
            c::FLOAT => Value::Float(f32::from_be_bytes(self.fixed()?)),
            c::CHAR => {
                let at = self.position;
                let scalar = u32::from_be_bytes(self.fixed()?);
                let ch = char::from_u32(scalar).ok_or(CodecError::InvalidChar {
                    offset: at,
                    value: scalar,
                })?;
                Value::Char(ch)
            }
            c::DECIMAL32 => Value::Decimal32(self.fixed()?),
            c::ULONG => Value::Ulong(u64::from_be_bytes(self.fixed()?)),
            c::LONG => Value::Long(i64::from_be_bytes(self.fixed()?)),
            c::DOUBLE => Value::Double(f64::from_be_bytes(self.fixed()?)),
            c::TIMESTAMP => Value::Timestamp(i64::from_be_bytes(self.fixed()?)),
            c::DECIMAL64 => Value::Decimal64(self.fixed()?),
            c::DECIMAL128 => Value::Decimal128(self.fixed()?),
            c::UUID => Value::Uuid(self.fixed()?),
            c::VBIN8 | c::VBIN32 => {
                let range = self.length_prefixed(code == c::VBIN32)?;
                Value::Binary(self.input.slice(range))
            }
            c::STR8 | c::STR32 => Value::String(self.text(code == c::STR32, "string")?),
            c::SYM8 | c::SYM32 => {
                Value::Symbol(Symbol::new(self.text(code == c::SYM32, "symbol")?))
            }
            c::LIST8 | c::LIST32 => Value::List(self.list(code == c::LIST32, offset)?),
            c::MAP8 | c::MAP32 => Value::Map(self.map(code == c::MAP32, offset)?),
            c::ARRAY8 | c::ARRAY32 => Value::Array(self.array_value(code == c::ARRAY32, offset)?),
            code => return Err(CodecError::UnknownConstructor { offset, code }),
        })
    }

    fn list(&mut self, wide: bool, offset: usize) -> Result<Vec<Value>, CodecError> {
        let (count, end) = self.compound_header(wide, offset, "list")?;
        let outer = self.begin_compound(end, offset)?;
        self.check_count("list", offset, count, 1)?;
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(self.value()?);
        }
        self.end_compound(end, outer);
        Ok(items)
    }

    fn map(&mut self, wide: bool, offset: usize) -> Result<Vec<(Value, Value)>, CodecError> {
        let (count, end) = self.compound_header(wide, offset, "map")?;
        if count % 2 != 0 {
            return Err(CodecError::OddMapCount {
                offset,
                count: count as u64,
            });
        }
        let outer = self.begin_compound(end, offset)?;
        self.check_count("map", offset, count, 1)?;
        let mut pairs = Vec::with_capacity(count / 2);
        for _ in 0..count / 2 {
            let key = self.value()?;
            let value = self.value()?;
            pairs.push((key, value));
        }
        self.end_compound(end, outer);
        Ok(pairs)
    }

    fn array_value(&mut self, wide: bool, offset: usize) -> Result<Array, CodecError> {
        let (count, end) = self.compound_header(wide, offset, "array")?;
        let outer = self.begin_compound(end, offset)?;
        let mut code = self.byte()?;
        let mut descriptor = None;
        if code == c::DESCRIBED {
            descriptor = Some(self.value()?);
            code = self.byte()?;
            if code == c::DESCRIBED {
                return Err(CodecError::NestedArrayDescriptor { offset });
            }
        }
        let code_offset = self.position - 1;
        let Some((kind, min_len)) = c::primitive(code) else {
            return Err(CodecError::UnknownConstructor {
                offset: code_offset,
                code,
            });
        };
        self.check_count("array", offset, count, min_len)?;
        let mut items = Vec::with_capacity(count);
        for _ in 0..count {
            items.push(self.body(code, code_offset)?);
        }
        self.end_compound(end, outer);
        Ok(Array::from_decoded(descriptor, kind, items))
    }

    /// Reads a compound's size and count; returns the count and where the compound ends.
    fn compound_header(
        &mut self,
        wide: bool,
        offset: usize,
        what: &'static str,
    ) -> Result<(usize, usize), CodecError> {
        let (size, count_len) = if wide {
            (u32::from_be_bytes(self.fixed()?) as usize, 4)
        } else {
            (usize::from(self.byte()?), 1)
        };
        if size < count_len {
            return Err(CodecError::SizeTooSmall {
                what,
                offset,
                size_bytes: size as u64,
            });
        }
        let end = self.position.saturating_add(size);
        if end > self.limit {
            return Err(self.truncated(size));
        }
        let count = if wide {
            u32::from_be_bytes(self.fixed()?) as usize
        } else {
            usize::from(self.byte()?)
        };
        Ok((count, end))
    }

    /// Refuses a count that the bytes left in the compound (at `min_len` bytes an item) or
    /// the values left cannot hold.
    fn check_count(
        &self,
        what: &'static str,
        offset: usize,
        count: usize,
        min_len: usize,
    ) -> Result<(), CodecError> {
        let available = self.limit - self.position;
        let fits_bytes = count.saturating_mul(min_len) <= available;
        if !fits_bytes || count > self.values_left {
            return Err(CodecError::CountTooLarge {
                what,
                offset,
                count: count as u64,
                available: available.min(self.values_left),
            });
        }
        Ok(())
    }

    /// Narrows reads to a compound ending at `end`; returns the outer limit to restore.
    fn begin_compound(&mut self, end: usize, offset: usize) -> Result<usize, CodecError> {
        self.enter(offset)?;
        Ok(std::mem::replace(&mut self.limit, end))
    }

    /// Leaves a compound. Bytes its items did not use are skipped: lenient, as the size
    /// field is authoritative.
    fn end_compound(&mut self, end: usize, outer_limit: usize) {
        self.position = end;
        self.limit = outer_limit;
        self.depth -= 1;
    }

    fn enter(&mut self, offset: usize) -> Result<(), CodecError> {
        if self.depth >= MAX_DEPTH {
            return Err(CodecError::TooDeep {
                offset,
                limit: MAX_DEPTH,
            });
        }
        self.depth += 1;
        Ok(())
    }

    fn count_values(&mut self, n: usize) -> Result<(), CodecError> {
        self.values_left = self
            .values_left
            .checked_sub(n)
            .ok_or(CodecError::CountTooLarge {
                what: "input",
                offset: self.position,
                count: n as u64,
                available: 0,
            })?;
        Ok(())
    }

    fn text(&mut self, wide: bool, what: &'static str) -> Result<String, CodecError> {
        let offset = self.position;
        let range = self.length_prefixed(wide)?;
        String::from_utf8(self.input[range].to_vec())
            .map_err(|_| CodecError::InvalidUtf8 { what, offset })
    }

    fn length_prefixed(&mut self, wide: bool) -> Result<Range<usize>, CodecError> {
        let len = if wide {
            u32::from_be_bytes(self.fixed()?) as usize
        } else {
            usize::from(self.byte()?)
        };
        self.take(len)
    }

    fn take(&mut self, len: usize) -> Result<Range<usize>, CodecError> {
        let available = self.limit.saturating_sub(self.position);
        if len > available {
            return Err(self.truncated(len));
        }
        let start = self.position;
        self.position += len;
        Ok(start..self.position)
    }

    fn truncated(&self, len: usize) -> CodecError {
        CodecError::Truncated {
            offset: self.limit,
            needed: len - self.limit.saturating_sub(self.position).min(len),
        }
    }

    fn byte(&mut self) -> Result<u8, CodecError> {
        let range = self.take(1)?;
        Ok(self.input[range.start])
    }

    fn fixed<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let range = self.take(N)?;
        let mut bytes = [0; N];
        bytes.copy_from_slice(&self.input[range]);
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use crate::test_support::{arb_value, config, hex, node_count};
    use crate::{Array, CodecError, MAX_DEPTH, Value, ValueKind};

    fn decode(bytes: &[u8]) -> Result<Value, CodecError> {
        let (value, rest) = Value::decode(Bytes::copy_from_slice(bytes))?;
        assert!(rest.is_empty(), "{} bytes left over", rest.len());
        Ok(value)
    }

    #[test]
    fn every_fixed_width_constructor_decodes() {
        let cases: Vec<(&str, Value)> = vec![
            ("40", Value::Null),
            ("41", Value::Boolean(true)),
            ("42", Value::Boolean(false)),
            ("56 01", Value::Boolean(true)),
            ("56 00", Value::Boolean(false)),
            ("43", Value::Uint(0)),
            ("52 07", Value::Uint(7)),
            ("70 00 01 00 00", Value::Uint(65536)),
            ("44", Value::Ulong(0)),
            ("53 10", Value::Ulong(16)),
            ("80 00 00 00 13 70 00 00 0a", Value::Ulong(0x0013_7000_000a)),
            ("50 ff", Value::Ubyte(255)),
            ("51 ff", Value::Byte(-1)),
            ("60 13 87", Value::Ushort(4999)),
            ("61 ff fe", Value::Short(-2)),
            ("54 fe", Value::Int(-2)),
            ("71 00 01 00 00", Value::Int(65536)),
            ("55 fe", Value::Long(-2)),
            ("81 ff ff ff ff ff ff ff ff", Value::Long(-1)),
            ("72 3f 80 00 00", Value::Float(1.0)),
            ("82 3f f0 00 00 00 00 00 00", Value::Double(1.0)),
            ("73 00 01 f6 00", Value::Char('\u{1f600}')),
            ("83 00 00 01 00 00 00 00 00", Value::Timestamp(1 << 40)),
            ("74 01 02 03 04", Value::Decimal32([1, 2, 3, 4])),
            (
                "84 01 02 03 04 05 06 07 08",
                Value::Decimal64([1, 2, 3, 4, 5, 6, 7, 8]),
            ),
            (
                "94 000102030405060708090a0b0c0d0e0f",
                Value::Decimal128(core::array::from_fn(|i| i as u8)),
            ),
            (
                "98 000102030405060708090a0b0c0d0e0f",
                Value::Uuid(core::array::from_fn(|i| i as u8)),
            ),
            ("a0 02 01 02", Value::Binary(Bytes::from_static(&[1, 2]))),
            (
                "b0 00 00 00 02 01 02",
                Value::Binary(Bytes::from_static(&[1, 2])),
            ),
            ("a1 03 73 72 76", Value::String("srv".into())),
            ("b1 00 00 00 03 73 72 76", Value::String("srv".into())),
            ("a3 03 73 72 76", Value::symbol("srv")),
            ("b3 00 00 00 03 73 72 76", Value::symbol("srv")),
            ("45", Value::List(Vec::new())),
            ("c0 01 00", Value::List(Vec::new())),
            (
                "d0 00 00 00 06 00 00 00 02 41 40",
                Value::List(vec![Value::Boolean(true), Value::Null]),
            ),
            (
                "c1 05 02 a3 01 6b 41",
                Value::Map(vec![(Value::symbol("k"), Value::Boolean(true))]),
            ),
            ("d1 00 00 00 04 00 00 00 00", Value::Map(Vec::new())),
            (
                "00 a3 01 64 40",
                Value::described(Value::symbol("d"), Value::Null),
            ),
        ];
        for (bytes, expected) in cases {
            assert_eq!(decode(&hex(bytes)), Ok(expected), "{bytes}");
        }
    }

    #[test]
    fn arrays_decode_in_both_widths_with_described_and_zero_width_items() {
        let uints = Array::new(ValueKind::Uint, vec![Value::Uint(1), Value::Uint(2)]).unwrap();
        assert_eq!(
            decode(&hex("e0 04 02 52 01 02")),
            Ok(Value::Array(uints.clone()))
        );
        assert_eq!(
            decode(&hex(
                "f0 00 00 00 0d 00 00 00 02 70 00 00 00 01 00 00 00 02"
            )),
            Ok(Value::Array(uints))
        );
        let trues = Array::new(ValueKind::Boolean, vec![Value::Boolean(true); 3]).unwrap();
        assert_eq!(decode(&hex("e0 02 03 41")), Ok(Value::Array(trues)));
        let described = Array::described(
            Value::Ulong(0x75),
            ValueKind::Binary,
            vec![Value::Binary(Bytes::new())],
        )
        .unwrap();
        assert_eq!(
            decode(&hex("e0 06 01 00 53 75 a0 00")),
            Ok(Value::Array(described))
        );
        let empty = Array::new(ValueKind::Symbol, Vec::new()).unwrap();
        assert_eq!(decode(&hex("e0 02 00 a3")), Ok(Value::Array(empty)));
    }

    #[test]
    fn hostile_counts_are_refused_before_allocating() {
        for bytes in [
            "d0 00 00 00 04 ff ff ff ff",
            "d1 00 00 00 04 ff ff ff fe",
            "f0 00 00 00 05 ff ff ff ff 40",
            "f0 00 00 00 05 ff ff ff ff 41",
            "e0 02 ff 40",
            "e0 03 02 70 00",
            "c0 02 05 40",
        ] {
            assert!(
                matches!(decode(&hex(bytes)), Err(CodecError::CountTooLarge { .. })),
                "{bytes}: {:?}",
                decode(&hex(bytes))
            );
        }
    }

    #[test]
    fn malformed_values_are_errors_that_say_why() {
        let cases = [
            ("", "Truncated"),
            ("70 00 01", "Truncated"),
            ("a1 05 61", "Truncated"),
            ("c0 05 01", "Truncated"),
            ("c0 00", "SizeTooSmall"),
            ("d0 00 00 00 02 00 00", "SizeTooSmall"),
            ("c1 03 01 40 40", "OddMapCount"),
            ("a1 01 ff", "InvalidUtf8"),
            ("73 00 11 00 00", "InvalidChar"),
            ("ff", "UnknownConstructor"),
            ("e0 03 01 ff 00", "UnknownConstructor"),
            ("e0 08 01 00 53 01 00 53 02 40", "NestedArrayDescriptor"),
            ("c0 03 01 70 00", "Truncated"),
        ];
        for (bytes, kind) in cases {
            let error = decode(&hex(bytes)).unwrap_err();
            assert!(format!("{error:?}").starts_with(kind), "{bytes}: {error:?}");
            assert!(!error.to_string().is_empty());
        }
    }

    #[test]
    fn nesting_deeper_than_the_limit_is_refused() {
        let mut value = Value::Null;
        for _ in 0..MAX_DEPTH {
            value = Value::List(vec![value]);
        }
        assert_eq!(decode(&value.to_bytes()), Ok(value.clone()));
        let too_deep = Value::List(vec![value]);
        assert!(matches!(
            decode(&too_deep.to_bytes()),
            Err(CodecError::TooDeep {
                limit: MAX_DEPTH,
                ..
            })
        ));
        let described_chain = [0u8; 4096];
        assert!(matches!(
            decode(&described_chain),
            Err(CodecError::TooDeep { .. })
        ));
    }

    #[test]
    fn unused_bytes_inside_a_list_are_skipped() {
        assert_eq!(
            decode(&hex("c0 04 01 41 ff ff")),
            Ok(Value::List(vec![Value::Boolean(true)]))
        );
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn values_round_trip(value in arb_value()) {
            let bytes = value.to_bytes();
            prop_assert_eq!(decode(&bytes), Ok(value));
        }

        #[test]
        fn arbitrary_bytes_never_panic_and_stay_proportional(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096)
        ) {
            if let Ok((value, _)) = Value::decode(Bytes::from(bytes.clone())) {
                prop_assert!(node_count(&value) <= bytes.len());
            }
        }

        #[test]
        fn mutated_values_never_panic(
            value in arb_value(),
            edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0..3u8), 1..8),
        ) {
            let mut bytes = value.to_bytes().to_vec();
            crate::test_support::mutate(&mut bytes, &edits);
            if let Ok((value, _)) = Value::decode(Bytes::from(bytes.clone())) {
                prop_assert!(node_count(&value) <= bytes.len());
            }
        }
    }
}
