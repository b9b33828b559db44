//! The one error type of the codec. Every decoding error is an operating condition (a peer
//! sent bytes we cannot use): the connection layer answers it with `amqp:decode-error` or
//! `amqp:connection:framing-error` and closes, so the messages name the offset and the rule.

/// Why bytes could not be decoded (or, for [`CodecError::ArrayItemKind`], why an array could
/// not be built).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error(
        "input ends inside a value at byte {offset}: {needed} more bytes are needed \
         (the frame is truncated or a length field is corrupt)"
    )]
    Truncated { offset: usize, needed: usize },
    #[error("byte 0x{code:02x} at offset {offset} is not an AMQP 1.0 type constructor")]
    UnknownConstructor { offset: usize, code: u8 },
    #[error(
        "values nest deeper than {limit} levels at offset {offset}; no AMQP client needs that, \
         so the frame is refused"
    )]
    TooDeep { offset: usize, limit: usize },
    #[error(
        "the {what} at offset {offset} claims {count} elements, more than the \
         {available} bytes (or values) left can hold"
    )]
    CountTooLarge {
        what: &'static str,
        offset: usize,
        count: u64,
        available: usize,
    },
    #[error(
        "the {what} at offset {offset} declares {size_bytes} bytes, too few for its own header"
    )]
    SizeTooSmall {
        what: &'static str,
        offset: usize,
        size_bytes: u64,
    },
    #[error(
        "the map at offset {offset} has an odd element count {count}; maps hold key/value pairs"
    )]
    OddMapCount { offset: usize, count: u64 },
    #[error("the {what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 { what: &'static str, offset: usize },
    #[error("the char at offset {offset} holds 0x{value:08x}, which is not a Unicode scalar value")]
    InvalidChar { offset: usize, value: u32 },
    #[error(
        "the array at offset {offset} has an element constructor with two descriptors; \
         only one is supported"
    )]
    NestedArrayDescriptor { offset: usize },
    #[error("{count} unexpected bytes follow the {what}")]
    TrailingBytes { what: &'static str, count: usize },
    #[error("array item {index} is a {found}, but the array holds {expected} items")]
    ArrayItemKind {
        index: usize,
        expected: &'static str,
        found: &'static str,
    },
    #[error("an array cannot hold described values directly; use `Array::described`")]
    ArrayOfDescribed,
    #[error("{field}: expected {expected}, found {found}")]
    UnexpectedType {
        field: &'static str,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{field} is mandatory but was absent or null")]
    MissingField { field: &'static str },
    #[error("{field}: value {value} is out of range ({allowed})")]
    OutOfRange {
        field: &'static str,
        value: u64,
        allowed: &'static str,
    },
    #[error("{context}: unknown descriptor {descriptor}")]
    UnknownDescriptor {
        context: &'static str,
        descriptor: String,
    },
    #[error("invalid message: {problem}")]
    InvalidMessage { problem: &'static str },
    #[error("a frame declares {size_bytes} bytes, fewer than its own 8-byte header")]
    FrameTooSmall { size_bytes: u32 },
    #[error(
        "a frame of {size_bytes} bytes exceeds the max-frame-size of {max_bytes} bytes \
         (the peer ignored the negotiated limit, or the stream is out of sync)"
    )]
    FrameTooLarge { size_bytes: u32, max_bytes: u32 },
    #[error(
        "frame data offset {doff} is invalid: it counts 4-byte words, must be at least 2 and \
         must stay within the frame's {size_bytes} bytes"
    )]
    BadDataOffset { doff: u8, size_bytes: u32 },
    #[error("frame type 0x{0:02x} is neither AMQP (0x00) nor SASL (0x01)")]
    UnknownFrameType(u8),
    #[error(
        "the peer did not send an AMQP protocol header: its first bytes are {0:02x?} \
         (16 03 is a TLS ClientHello on a plain-text port; 'GET ' or 'PRI ' is HTTP)"
    )]
    NotAmqp(Vec<u8>),
    #[error("protocol id {0} in the protocol header is none of 0 (AMQP), 2 (TLS) or 3 (SASL)")]
    UnknownProtocolId(u8),
    #[error("the frame body is empty where a performative was expected")]
    EmptyBody,
}
