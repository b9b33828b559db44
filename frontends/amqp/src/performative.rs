//! The performatives as one enum, and the decoding of a frame body into a performative and
//! the payload after it.
//!
//! Encoding follows WIRE-PROTOCOLS A5: a described list with a smallulong descriptor
//! `00 53 <code>`, every field written (null for unset), never `list0`, never an empty array.
//! Decoding is lenient: smallulong, ulong or symbolic descriptors; missing trailing fields
//! take their defaults; extra trailing fields are ignored.

use bytes::Bytes;

use crate::connection::{BEGIN, Begin, CLOSE, Close, END, End, OPEN, Open};
use crate::error::CodecError;
use crate::fields::{Descriptor, FieldReader, unexpected, unknown_descriptor};
use crate::frame::FrameType;
use crate::link::{
    ATTACH, Attach, DETACH, DISPOSITION, Detach, Disposition, FLOW, Flow, TRANSFER, Transfer,
};
use crate::sasl::{
    SASL_CHALLENGE, SASL_INIT, SASL_MECHANISMS, SASL_OUTCOME, SASL_RESPONSE, SaslChallenge,
    SaslInit, SaslMechanisms, SaslOutcome, SaslResponse,
};
use crate::types::{Described, Value};

/// A frame body's performative.
#[derive(Debug, Clone, PartialEq)]
pub enum Performative {
    Open(Open),
    Begin(Begin),
    /// Boxed: with its source and target an attach is several times larger than the rest.
    Attach(Box<Attach>),
    Flow(Flow),
    Transfer(Transfer),
    Disposition(Disposition),
    Detach(Detach),
    End(End),
    Close(Close),
    SaslMechanisms(SaslMechanisms),
    SaslInit(SaslInit),
    SaslChallenge(SaslChallenge),
    SaslResponse(SaslResponse),
    SaslOutcome(SaslOutcome),
}

/// Decodes a frame body (the bytes after the frame header): the performative, and the bytes
/// after it, which are a transfer's payload (a message or a part of one) and empty for other
/// performatives.
pub fn decode_frame_body(body: Bytes) -> Result<(Performative, Bytes), CodecError> {
    if body.is_empty() {
        return Err(CodecError::EmptyBody);
    }
    let (value, payload) = Value::decode(body)?;
    Ok((Performative::from_value(value)?, payload))
}

type Reader = fn(FieldReader) -> Result<Performative, CodecError>;

const READERS: [(Descriptor, Reader); 14] = [
    (OPEN, |r| Open::read(r).map(Performative::Open)),
    (BEGIN, |r| Begin::read(r).map(Performative::Begin)),
    (ATTACH, |r| {
        Attach::read(r).map(|a| Performative::Attach(Box::new(a)))
    }),
    (FLOW, |r| Flow::read(r).map(Performative::Flow)),
    (TRANSFER, |r| Transfer::read(r).map(Performative::Transfer)),
    (DISPOSITION, |r| {
        Disposition::read(r).map(Performative::Disposition)
    }),
    (DETACH, |r| Detach::read(r).map(Performative::Detach)),
    (END, |r| End::read(r).map(Performative::End)),
    (CLOSE, |r| Close::read(r).map(Performative::Close)),
    (SASL_MECHANISMS, |r| {
        SaslMechanisms::read(r).map(Performative::SaslMechanisms)
    }),
    (SASL_INIT, |r| SaslInit::read(r).map(Performative::SaslInit)),
    (SASL_CHALLENGE, |r| {
        SaslChallenge::read(r).map(Performative::SaslChallenge)
    }),
    (SASL_RESPONSE, |r| {
        SaslResponse::read(r).map(Performative::SaslResponse)
    }),
    (SASL_OUTCOME, |r| {
        SaslOutcome::read(r).map(Performative::SaslOutcome)
    }),
];

impl Performative {
    /// Reads a performative from its described-list value.
    pub fn from_value(value: Value) -> Result<Performative, CodecError> {
        let Value::Described(described) = value else {
            return Err(unexpected("frame body", "performative", &value));
        };
        let Described { descriptor, value } = *described;
        let Some((d, read)) = READERS
            .iter()
            .find(|(d, _)| descriptor.is_descriptor(d.code, d.name))
        else {
            return Err(unknown_descriptor("frame body", &descriptor));
        };
        read(FieldReader::from_body(value, d.name)?)
    }

    /// The described list, with every field.
    pub fn to_value(&self) -> Value {
        match self {
            Performative::Open(p) => p.to_value(),
            Performative::Begin(p) => p.to_value(),
            Performative::Attach(p) => p.to_value(),
            Performative::Flow(p) => p.to_value(),
            Performative::Transfer(p) => p.to_value(),
            Performative::Disposition(p) => p.to_value(),
            Performative::Detach(p) => p.to_value(),
            Performative::End(p) => p.to_value(),
            Performative::Close(p) => p.to_value(),
            Performative::SaslMechanisms(p) => p.to_value(),
            Performative::SaslInit(p) => p.to_value(),
            Performative::SaslChallenge(p) => p.to_value(),
            Performative::SaslResponse(p) => p.to_value(),
            Performative::SaslOutcome(p) => p.to_value(),
        }
    }

    /// Appends the encoding of the performative (not a frame; see [`crate::write_frame`]).
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.to_value().encode(out);
    }

    /// The spec's name, for logs.
    pub fn name(&self) -> &'static str {
        match self {
            Performative::Open(_) => "open",
            Performative::Begin(_) => "begin",
            Performative::Attach(_) => "attach",
            Performative::Flow(_) => "flow",
            Performative::Transfer(_) => "transfer",
            Performative::Disposition(_) => "disposition",
            Performative::Detach(_) => "detach",
            Performative::End(_) => "end",
            Performative::Close(_) => "close",
            Performative::SaslMechanisms(_) => "sasl-mechanisms",
            Performative::SaslInit(_) => "sasl-init",
            Performative::SaslChallenge(_) => "sasl-challenge",
            Performative::SaslResponse(_) => "sasl-response",
            Performative::SaslOutcome(_) => "sasl-outcome",
        }
    }

    /// The frame type the performative travels in.
    pub fn frame_type(&self) -> FrameType {
        match self {
            Performative::SaslMechanisms(_)
            | Performative::SaslInit(_)
            | Performative::SaslChallenge(_)
            | Performative::SaslResponse(_)
            | Performative::SaslOutcome(_) => FrameType::Sasl,
            _ => FrameType::Amqp,
        }
    }
}

macro_rules! performative_from {
    ($($t:ident),*) => {
        $(impl From<$t> for Performative {
            fn from(p: $t) -> Performative {
                Performative::$t(p)
            }
        })*
    };
}

impl From<Attach> for Performative {
    fn from(p: Attach) -> Performative {
        Performative::Attach(Box::new(p))
    }
}

performative_from!(
    Open,
    Begin,
    Flow,
    Transfer,
    Disposition,
    Detach,
    End,
    Close,
    SaslMechanisms,
    SaslInit,
    SaslChallenge,
    SaslResponse,
    SaslOutcome
);

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::*;
    use crate::test_support::{arb_performative, config, hex, mutate, sample_performatives};
    use crate::{AmqpError, Channel, DeliveryState, Handle, Role, write_performative};

    fn encoded(performative: &Performative) -> Vec<u8> {
        let mut out = Vec::new();
        performative.encode(&mut out);
        out
    }

    fn decoded(bytes: &[u8]) -> Result<Performative, CodecError> {
        decode_frame_body(Bytes::copy_from_slice(bytes)).map(|(p, _)| p)
    }

    /// The field count on the wire, read from the list header after `00 53 <code>`.
    fn field_count(bytes: &[u8]) -> (u8, usize) {
        assert_eq!(bytes[..2], [0x00, 0x53], "descriptor must be smallulong");
        let count = match bytes[3] {
            0xc0 => usize::from(bytes[5]),
            0xd0 => u32::from_be_bytes(bytes[8..12].try_into().unwrap()) as usize,
            other => panic!("list constructor 0x{other:02x}: only list8 and list32 are allowed"),
        };
        (bytes[2], count)
    }

    #[test]
    fn open_matches_the_wire_protocols_test_vector() {
        let open = Performative::Open(Open {
            container_id: "srv".into(),
            max_frame_size_bytes: 1 << 20,
            channel_max: 4999,
            idle_timeout_ms: Some(120_000),
            properties: Some(Vec::new()),
            ..Open::default()
        });
        let expected = hex(
            "00 53 10 c0 1b 0a a1 03 73 72 76 40 70 00 10 00 00 60 13 87 70 00 01 d4 c0 \
             40 40 40 40 c1 01 00",
        );
        assert_eq!(encoded(&open), expected);
        assert_eq!(decoded(&expected), Ok(open));
    }

    #[test]
    fn empty_close_is_a_one_field_list() {
        let close = Performative::Close(Close::default());
        assert_eq!(encoded(&close), hex("00 53 18 c0 02 01 40"));
    }

    #[test]
    fn every_performative_has_the_full_field_count() {
        let expected = [
            (0x10, 10),
            (0x11, 8),
            (0x12, 14),
            (0x13, 11),
            (0x14, 11),
            (0x15, 6),
            (0x16, 3),
            (0x17, 1),
            (0x18, 1),
            (0x40, 1),
            (0x41, 3),
            (0x42, 1),
            (0x43, 1),
            (0x44, 2),
        ];
        let samples = sample_performatives();
        assert_eq!(samples.len(), expected.len());
        for (performative, (code, count)) in samples.iter().zip(expected) {
            let bytes = encoded(performative);
            assert_eq!(
                field_count(&bytes),
                (code, count),
                "{}",
                performative.name()
            );
            // The defaults too: a performative with nothing set keeps every field.
            assert_eq!(decoded(&bytes).as_ref(), Ok(performative));
        }
        let flow = encoded(&Performative::Flow(Flow::default()));
        assert_eq!(field_count(&flow), (0x13, 11));
        let transfer = Transfer {
            handle: Handle(0),
            delivery_id: None,
            delivery_tag: None,
            message_format: None,
            settled: None,
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        };
        assert_eq!(field_count(&encoded(&transfer.into())), (0x14, 11));
    }

    #[test]
    fn composites_have_their_full_field_counts() {
        let error = AmqpError {
            condition: "amqp:internal-error".into(),
            description: None,
            info: None,
        };
        assert_eq!(
            error.to_value().to_bytes(),
            hex(
                "00 53 1d c0 18 03 a3 13 61 6d 71 70 3a 69 6e 74 65 72 6e 61 6c 2d 65 72 72 6f 72 \
                 40 40"
            )[..]
        );
        assert_eq!(
            field_count(&crate::Source::default().to_value().to_bytes()),
            (0x28, 11)
        );
        assert_eq!(
            field_count(&crate::Target::default().to_value().to_bytes()),
            (0x29, 7)
        );
        let rejected = DeliveryState::Rejected { error: Some(error) }
            .to_value()
            .to_bytes();
        assert_eq!(field_count(&rejected), (0x25, 1));
        assert_eq!(
            DeliveryState::Accepted.to_value().to_bytes(),
            hex("00 53 24 c0 01 00")[..]
        );
        assert_eq!(
            DeliveryState::Released.to_value().to_bytes(),
            hex("00 53 26 c0 01 00")[..]
        );
    }

    #[test]
    fn short_lists_decode_with_defaults() {
        assert_eq!(
            decoded(&hex("00 53 18 45")),
            Ok(Performative::Close(Close::default()))
        );
        assert_eq!(
            decoded(&hex("00 53 17 45")),
            Ok(Performative::End(End::default()))
        );
        // An open with 3 fields: container id, hostname, max-frame-size.
        let open = decoded(&hex("00 53 10 c0 0c 03 a1 01 63 a1 01 68 70 00 01 00 00"));
        assert_eq!(
            open,
            Ok(Performative::Open(Open {
                container_id: "c".into(),
                hostname: Some("h".into()),
                max_frame_size_bytes: 65536,
                ..Open::default()
            }))
        );
        // A session-level flow with 4 fields, as .NET may send it.
        let flow = decoded(&hex("00 53 13 c0 07 04 43 52 10 43 52 10"));
        assert_eq!(
            flow,
            Ok(Performative::Flow(Flow {
                next_incoming_id: Some(crate::TransferNumber(0)),
                incoming_window: 16,
                outgoing_window: 16,
                ..Flow::default()
            }))
        );
    }

    #[test]
    fn every_descriptor_form_is_accepted_and_extra_fields_ignored() {
        let close = Ok(Performative::Close(Close::default()));
        assert_eq!(decoded(&hex("00 80 00 00 00 00 00 00 00 18 45")), close);
        let symbol = b"amqp:close:list";
        let mut bytes = vec![0x00, 0xa3, symbol.len() as u8];
        bytes.extend_from_slice(symbol);
        bytes.extend_from_slice(&hex("c0 04 03 40 41 42"));
        assert_eq!(decoded(&bytes), close);
        assert!(matches!(
            decoded(&hex("00 53 99 45")),
            Err(CodecError::UnknownDescriptor { .. })
        ));
        assert!(matches!(
            decoded(&hex("40")),
            Err(CodecError::UnexpectedType { .. })
        ));
        assert_eq!(decoded(&[]), Err(CodecError::EmptyBody));
    }

    #[test]
    fn missing_mandatory_and_mistyped_fields_name_the_field() {
        let error = decoded(&hex("00 53 10 45")).unwrap_err();
        assert_eq!(
            error,
            CodecError::MissingField {
                field: "open.container-id"
            }
        );
        let error = decoded(&hex("00 53 10 c0 04 02 a1 00 41")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "open.hostname: expected string, found boolean"
        );
        let error = decoded(&hex("00 53 10 c0 0a 04 a1 00 40 40 70 00 01 00 00")).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("open.channel-max: value 65536 is out of range")
        );
    }

    #[test]
    fn transfer_payload_is_returned_beside_it() {
        let transfer = sample_performatives()
            .into_iter()
            .find(|p| matches!(p, Performative::Transfer(_)))
            .unwrap();
        let mut frame = Vec::new();
        write_performative(&mut frame, Channel(1), &transfer, b"message bytes");
        let (performative, payload) = decode_frame_body(Bytes::from(frame).slice(8..)).unwrap();
        assert_eq!(performative, transfer);
        assert_eq!(payload, Bytes::from_static(b"message bytes"));
    }

    #[test]
    fn a_rejected_disposition_carries_a_three_field_error() {
        let disposition = Performative::Disposition(Disposition {
            role: Role::Receiver,
            first: crate::DeliveryNumber(3),
            last: None,
            settled: true,
            state: Some(DeliveryState::Rejected {
                error: Some(AmqpError::new("amqp:link:message-size-exceeded", "too big")),
            }),
            batchable: false,
        });
        let bytes = encoded(&disposition);
        let rejected = hex("00 53 25 c0");
        let at = bytes.windows(4).position(|w| w == rejected).unwrap();
        assert_eq!(bytes[at + 4 + 2..at + 4 + 5], hex("00 53 1d"));
        let error_list = at + 4 + 5;
        assert_eq!(bytes[error_list], 0xc0);
        assert_eq!(bytes[error_list + 2], 3);
    }

    proptest! {
        #![proptest_config(config(1024))]

        #[test]
        fn performatives_round_trip(performative in arb_performative()) {
            let bytes = encoded(&performative);
            prop_assert_ne!(bytes[3], 0x45);
            prop_assert_eq!(decoded(&bytes), Ok(performative));
        }

        #[test]
        fn arbitrary_bodies_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
            let _ = decode_frame_body(Bytes::from(bytes));
        }

        #[test]
        fn mutated_performatives_never_panic(
            performative in arb_performative(),
            edits in proptest::collection::vec((any::<u16>(), any::<u8>(), 0..3u8), 1..8),
        ) {
            let mut bytes = encoded(&performative);
            mutate(&mut bytes, &edits);
            let _ = decode_frame_body(Bytes::from(bytes));
        }
    }
}
