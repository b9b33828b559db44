//! Frames (AMQP 1.0 part 2 §2.3) and protocol headers (§2.2).
//!
//! A frame is `size: u32, doff: u8, type: u8, channel: u16`, then `doff * 4 - 8` bytes of
//! extended header (ignored), then the body. Frames are always written with doff 2: pyamqp
//! skips `doff - 2` bytes where it should skip words (WIRE-PROTOCOLS A5 rule 5).

use bytes::{Buf, Bytes, BytesMut};

use crate::encode::wire_len;
use crate::error::CodecError;
use crate::ids::Channel;
use crate::performative::Performative;

/// The bytes of a frame header.
pub const FRAME_HEADER_BYTES: usize = 8;

/// The smallest max-frame-size a peer may announce, and the limit before open is exchanged.
pub const MIN_MAX_FRAME_SIZE_BYTES: u32 = 512;

/// An empty AMQP frame: the keep-alive sent at under half the peer's idle-time-out.
pub const HEARTBEAT: [u8; FRAME_HEADER_BYTES] = [0x00, 0x00, 0x00, 0x08, 0x02, 0x00, 0x00, 0x00];

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// 0: connection, session and link performatives.
    Amqp,
    /// 1: the SASL exchange.
    Sasl,
}

/// One frame read from the wire. An AMQP frame with an empty body is a heartbeat.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub frame_type: FrameType,
    pub channel: Channel,
    /// The performative and, for a transfer, the payload; see
    /// [`crate::decode_frame_body`].
    pub body: Bytes,
}

impl Frame {
    pub fn is_heartbeat(&self) -> bool {
        self.body.is_empty()
    }
}

/// Takes one frame off the front of `buffer`. `Ok(None)`: the frame is not complete yet
/// (nothing is consumed). A malformed header or a frame above `max_frame_size_bytes` is an
/// error as soon as its 8 header bytes are in, so a peer cannot make us buffer it.
pub fn read_frame(
    buffer: &mut BytesMut,
    max_frame_size_bytes: u32,
) -> Result<Option<Frame>, CodecError> {
    let Some(header) = buffer.first_chunk::<FRAME_HEADER_BYTES>() else {
        return Ok(None);
    };
    let size_bytes = u32::from_be_bytes([header[0], header[1], header[2], header[3]]);
    let doff = header[4];
    let frame_type = match header[5] {
        0 => FrameType::Amqp,
        1 => FrameType::Sasl,
        other => return Err(CodecError::UnknownFrameType(other)),
    };
    let channel = Channel(u16::from_be_bytes([header[6], header[7]]));
    if size_bytes < FRAME_HEADER_BYTES as u32 {
        return Err(CodecError::FrameTooSmall { size_bytes });
    }
    if size_bytes > max_frame_size_bytes {
        return Err(CodecError::FrameTooLarge {
            size_bytes,
            max_bytes: max_frame_size_bytes,
        });
    }
    let body_offset = usize::from(doff) * 4;
    if doff < 2 || body_offset > size_bytes as usize {
        return Err(CodecError::BadDataOffset { doff, size_bytes });
    }
    if buffer.len() < size_bytes as usize {
        return Ok(None);
    }
    let mut frame = buffer.split_to(size_bytes as usize).freeze();
    frame.advance(body_offset);
    Ok(Some(Frame {
        frame_type,
        channel,
        body: frame,
    }))
}

/// Appends a frame with doff 2 holding `body`.
pub fn write_frame(out: &mut Vec<u8>, frame_type: FrameType, channel: Channel, body: &[u8]) {
    let start = begin_frame(out, frame_type, channel);
    out.extend_from_slice(body);
    finish_frame(out, start);
}

/// Appends a frame holding `performative` followed by `payload` (a transfer's message bytes;
/// empty otherwise). The frame type follows the performative.
pub fn write_performative(
    out: &mut Vec<u8>,
    channel: Channel,
    performative: &Performative,
    payload: &[u8],
) {
    let start = begin_frame(out, performative.frame_type(), channel);
    performative.encode(out);
    out.extend_from_slice(payload);
    finish_frame(out, start);
}

fn begin_frame(out: &mut Vec<u8>, frame_type: FrameType, channel: Channel) -> usize {
    let start = out.len();
    let type_code = match frame_type {
        FrameType::Amqp => 0,
        FrameType::Sasl => 1,
    };
    out.extend_from_slice(&[0, 0, 0, 0, 2, type_code]);
    out.extend_from_slice(&channel.0.to_be_bytes());
    start
}

fn finish_frame(out: &mut [u8], start: usize) {
    let size = wire_len(out.len() - start).to_be_bytes();
    out[start..start + 4].copy_from_slice(&size);
}

/// The protocol a header asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProtocolId {
    /// 0: AMQP frames follow.
    Amqp,
    /// 2: a TLS handshake follows (the Azure SDKs use implicit TLS on 5671 instead).
    Tls,
    /// 3: SASL frames follow.
    Sasl,
}

/// `AMQP` followed by the protocol id and the version: the first 8 bytes each way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolHeader {
    pub protocol: ProtocolId,
    pub major: u8,
    pub minor: u8,
    pub revision: u8,
}

impl ProtocolHeader {
    /// The bytes of a protocol header.
    pub const LEN: usize = 8;

    /// `AMQP 0 1 0 0`.
    pub const AMQP: ProtocolHeader = ProtocolHeader::version_1_0(ProtocolId::Amqp);
    /// `AMQP 3 1 0 0`.
    pub const SASL: ProtocolHeader = ProtocolHeader::version_1_0(ProtocolId::Sasl);
    /// `AMQP 2 1 0 0`.
    pub const TLS: ProtocolHeader = ProtocolHeader::version_1_0(ProtocolId::Tls);

    const fn version_1_0(protocol: ProtocolId) -> ProtocolHeader {
        ProtocolHeader {
            protocol,
            major: 1,
            minor: 0,
            revision: 0,
        }
    }

    /// True for version 1.0.0, the only one there is. A server answers another version with
    /// its own header for the same protocol and closes the socket.
    pub fn is_version_1_0(&self) -> bool {
        (self.major, self.minor, self.revision) == (1, 0, 0)
    }

    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let id = match self.protocol {
            ProtocolId::Amqp => 0,
            ProtocolId::Tls => 2,
            ProtocolId::Sasl => 3,
        };
        [
            b'A',
            b'M',
            b'Q',
            b'P',
            id,
            self.major,
            self.minor,
            self.revision,
        ]
    }

    /// Reads a header from the first bytes a peer sent. `Ok(None)`: fewer than 8 bytes, all
    /// consistent with a header so far. Bytes that cannot start a header are an error at
    /// once, so a TLS or HTTP client on the port gets a clear diagnosis.
    pub fn parse(bytes: &[u8]) -> Result<Option<ProtocolHeader>, CodecError> {
        let prefix_len = bytes.len().min(4);
        if bytes[..prefix_len] != b"AMQP"[..prefix_len] {
            return Err(CodecError::NotAmqp(bytes[..bytes.len().min(8)].to_vec()));
        }
        let Some(header) = bytes.first_chunk::<{ Self::LEN }>() else {
            return Ok(None);
        };
        let protocol = match header[4] {
            0 => ProtocolId::Amqp,
            2 => ProtocolId::Tls,
            3 => ProtocolId::Sasl,
            other => return Err(CodecError::UnknownProtocolId(other)),
        };
        Ok(Some(ProtocolHeader {
            protocol,
            major: header[5],
            minor: header[6],
            revision: header[7],
        }))
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use proptest::prelude::*;

    use super::*;
    use crate::test_support::{config, hex, mutate, sample_performatives};
    use crate::{Close, decode_frame_body};

    fn buffer(bytes: &[u8]) -> BytesMut {
        BytesMut::from(bytes)
    }

    #[test]
    fn an_empty_frame_is_the_heartbeat() {
        let mut out = Vec::new();
        write_frame(&mut out, FrameType::Amqp, Channel(0), &[]);
        assert_eq!(out, HEARTBEAT);
        let frame = read_frame(&mut buffer(&HEARTBEAT), 512).unwrap().unwrap();
        assert!(frame.is_heartbeat());
        assert_eq!(frame.frame_type, FrameType::Amqp);
    }

    #[test]
    fn frames_are_written_with_doff_2_and_read_back() {
        let close = Performative::Close(Close::default());
        let mut out = Vec::new();
        write_performative(&mut out, Channel(3), &close, &[]);
        assert_eq!(out, hex("00 00 00 0f 02 00 00 03 00 53 18 c0 02 01 40"));
        let sasl = crate::SaslOutcome::default().into();
        write_performative(&mut out, Channel(0), &sasl, &[]);
        let mut input = buffer(&out);
        let first = read_frame(&mut input, 512).unwrap().unwrap();
        assert_eq!(
            (first.frame_type, first.channel),
            (FrameType::Amqp, Channel(3))
        );
        assert_eq!(decode_frame_body(first.body).unwrap().0, close);
        let second = read_frame(&mut input, 512).unwrap().unwrap();
        assert_eq!(second.frame_type, FrameType::Sasl);
        assert_eq!(decode_frame_body(second.body).unwrap().0, sasl);
        assert!(input.is_empty());
        assert_eq!(read_frame(&mut input, 512), Ok(None));
    }

    #[test]
    fn an_incomplete_frame_waits_and_consumes_nothing() {
        let mut out = Vec::new();
        write_performative(&mut out, Channel(0), &Close::default().into(), &[]);
        for len in 0..out.len() {
            let mut input = buffer(&out[..len]);
            assert_eq!(read_frame(&mut input, 512), Ok(None), "{len} bytes");
            assert_eq!(input.len(), len);
        }
    }

    #[test]
    fn the_extended_header_is_skipped() {
        let bytes = hex("00 00 00 0f 03 00 00 00 ff ff ff ff 00 53 18 45");
        let frame = read_frame(&mut buffer(&bytes[..0x0f]), 512);
        assert!(frame.is_ok());
        let bytes = hex("00 00 00 10 03 00 00 00 ff ff ff ff 00 53 18 45");
        let frame = read_frame(&mut buffer(&bytes), 512).unwrap().unwrap();
        assert_eq!(frame.body, hex("00 53 18 45"));
    }

    #[test]
    fn malformed_headers_are_refused_before_the_body_arrives() {
        let cases = [
            (
                "00 00 10 00 02 00 00 00",
                CodecError::FrameTooLarge {
                    size_bytes: 4096,
                    max_bytes: 512,
                },
            ),
            (
                "00 00 00 07 02 00 00 00",
                CodecError::FrameTooSmall { size_bytes: 7 },
            ),
            (
                "00 00 00 08 01 00 00 00",
                CodecError::BadDataOffset {
                    doff: 1,
                    size_bytes: 8,
                },
            ),
            (
                "00 00 00 0c 04 00 00 00",
                CodecError::BadDataOffset {
                    doff: 4,
                    size_bytes: 12,
                },
            ),
            ("00 00 00 08 02 05 00 00", CodecError::UnknownFrameType(5)),
        ];
        for (bytes, expected) in cases {
            assert_eq!(
                read_frame(&mut buffer(&hex(bytes)), 512),
                Err(expected),
                "{bytes}"
            );
        }
    }

    #[test]
    fn protocol_headers() {
        assert_eq!(ProtocolHeader::AMQP.to_bytes(), *b"AMQP\x00\x01\x00\x00");
        assert_eq!(ProtocolHeader::SASL.to_bytes(), *b"AMQP\x03\x01\x00\x00");
        assert_eq!(ProtocolHeader::TLS.to_bytes(), *b"AMQP\x02\x01\x00\x00");
        for header in [
            ProtocolHeader::AMQP,
            ProtocolHeader::SASL,
            ProtocolHeader::TLS,
        ] {
            let bytes = header.to_bytes();
            assert_eq!(ProtocolHeader::parse(&bytes), Ok(Some(header)));
            for len in 0..bytes.len() {
                assert_eq!(ProtocolHeader::parse(&bytes[..len]), Ok(None));
            }
        }
        let old = ProtocolHeader::parse(b"AMQP\x00\x00\x09\x01")
            .unwrap()
            .unwrap();
        assert!(!old.is_version_1_0());
        assert_eq!(
            ProtocolHeader::parse(b"AMQP\x01\x01\x00\x00"),
            Err(CodecError::UnknownProtocolId(1))
        );
        let tls = ProtocolHeader::parse(&hex("16 03 01 02 00 01 00 01 fc")).unwrap_err();
        assert_eq!(tls, CodecError::NotAmqp(hex("16 03 01 02 00 01 00 01")));
        assert!(tls.to_string().contains("TLS ClientHello"));
        assert!(ProtocolHeader::parse(b"GET / HTTP/1.1").is_err());
        assert!(ProtocolHeader::parse(b"AM").unwrap().is_none());
    }

    fn read_all(bytes: Vec<u8>, max_frame_size_bytes: u32) {
        let len = bytes.len();
        let mut input = BytesMut::from(&bytes[..]);
        while let Ok(Some(frame)) = read_frame(&mut input, max_frame_size_bytes) {
            assert!(frame.body.len() <= len);
            let _ = decode_frame_body(frame.body);
        }
    }

    proptest! {
        #![proptest_config(config(512))]

        #[test]
        fn arbitrary_bytes_never_panic(
            bytes in proptest::collection::vec(any::<u8>(), 0..4096),
            max in prop_oneof![Just(512u32), Just(u32::MAX)],
        ) {
            read_all(bytes, max);
        }

        #[test]
        fn mutated_frame_streams_never_panic(
            edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0..3u8), 1..16),
        ) {
            let mut stream = Vec::new();
            for (i, performative) in sample_performatives().iter().enumerate() {
                write_performative(&mut stream, Channel(i as u16), performative, b"payload");
            }
            stream.extend_from_slice(&HEARTBEAT);
            mutate(&mut stream, &edits);
            read_all(stream, u32::MAX);
        }
    }
}
