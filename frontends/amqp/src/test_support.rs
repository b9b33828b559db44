//! Test helpers shared by the modules' tests: proptest strategies for values, performatives
//! and messages, and sample frames. One place to change when an API changes.

use bytes::Bytes;
use proptest::collection::vec;
use proptest::prelude::*;

use crate::*;

/// Cases per property; each failure prints proptest's seed and is kept in
/// `proptest-regressions/` for replay.
pub fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        ..ProptestConfig::default()
    }
}

/// Every `Value` in a tree: the decoder creates at most one per input byte.
pub fn node_count(value: &Value) -> usize {
    1 + match value {
        Value::List(items) => items.iter().map(node_count).sum(),
        Value::Map(pairs) => pairs
            .iter()
            .map(|(k, v)| node_count(k) + node_count(v))
            .sum(),
        Value::Array(array) => {
            array.descriptor().map_or(0, node_count)
                + array.items().iter().map(node_count).sum::<usize>()
        }
        Value::Described(d) => node_count(&d.descriptor) + node_count(&d.value),
        _ => 0,
    }
}

pub fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

pub fn arb_bytes(max_len: usize) -> impl Strategy<Value = Bytes> {
    vec(any::<u8>(), 0..max_len).prop_map(Bytes::from)
}

pub fn arb_symbol() -> impl Strategy<Value = Symbol> {
    "[a-z:.-]{0,12}".prop_map(Symbol::from)
}

fn arb_symbols() -> impl Strategy<Value = Vec<Symbol>> {
    vec(arb_symbol(), 0..3)
}

fn array_of(kind: ValueKind, items: Vec<Value>) -> Value {
    Value::Array(Array::new(kind, items).unwrap())
}

pub fn arb_leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Boolean),
        any::<u8>().prop_map(Value::Ubyte),
        any::<u16>().prop_map(Value::Ushort),
        prop_oneof![Just(0), 0..300u32, any::<u32>()].prop_map(Value::Uint),
        prop_oneof![Just(0), 0..300u64, any::<u64>()].prop_map(Value::Ulong),
        any::<i8>().prop_map(Value::Byte),
        any::<i16>().prop_map(Value::Short),
        prop_oneof![-200..200i32, any::<i32>()].prop_map(Value::Int),
        prop_oneof![-200..200i64, any::<i64>()].prop_map(Value::Long),
        any::<f32>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(Value::Float),
        any::<f64>()
            .prop_filter("NaN", |f| !f.is_nan())
            .prop_map(Value::Double),
        any::<[u8; 4]>().prop_map(Value::Decimal32),
        any::<[u8; 8]>().prop_map(Value::Decimal64),
        any::<[u8; 16]>().prop_map(Value::Decimal128),
        any::<char>().prop_map(Value::Char),
        any::<i64>().prop_map(Value::Timestamp),
        any::<[u8; 16]>().prop_map(Value::Uuid),
        arb_bytes(300).prop_map(Value::Binary),
        prop_oneof![".{0,12}", "[a-z]{250,300}"].prop_map(Value::String),
        arb_symbol().prop_map(Value::Symbol),
    ]
}

/// Non-empty arrays (an empty array is written as null, so it does not round-trip).
fn arb_array(
    inner: impl Strategy<Value = Value> + Clone + 'static,
) -> impl Strategy<Value = Value> {
    prop_oneof![
        (1..4usize).prop_map(|n| array_of(ValueKind::Null, vec![Value::Null; n])),
        vec(any::<bool>(), 1..4).prop_map(|v| array_of(
            ValueKind::Boolean,
            v.into_iter().map(Value::Boolean).collect()
        )),
        vec(any::<u32>(), 1..6)
            .prop_map(|v| array_of(ValueKind::Uint, v.into_iter().map(Value::Uint).collect())),
        vec(any::<i64>(), 1..4)
            .prop_map(|v| array_of(ValueKind::Long, v.into_iter().map(Value::Long).collect())),
        vec(arb_symbol(), 1..6).prop_map(|v| Value::Array(Array::symbols(v))),
        vec(".{0,8}", 1..4).prop_map(|v| array_of(
            ValueKind::String,
            v.into_iter().map(Value::String).collect()
        )),
        vec(arb_bytes(300), 1..3).prop_map(|v| array_of(
            ValueKind::Binary,
            v.into_iter().map(Value::Binary).collect()
        )),
        vec(vec(inner.clone(), 0..3), 1..3)
            .prop_map(|v| array_of(ValueKind::List, v.into_iter().map(Value::List).collect())),
        vec(vec((inner.clone(), inner), 0..2), 1..3)
            .prop_map(|v| array_of(ValueKind::Map, v.into_iter().map(Value::Map).collect())),
        vec(vec(any::<u16>(), 1..3), 1..3).prop_map(|v| {
            let inner = v.into_iter().map(|items| {
                array_of(
                    ValueKind::Ushort,
                    items.into_iter().map(Value::Ushort).collect(),
                )
            });
            array_of(ValueKind::Array, inner.collect())
        }),
        (arb_symbol(), vec(any::<u64>(), 1..4)).prop_map(|(d, v)| {
            let items = v.into_iter().map(Value::Ulong).collect();
            Value::Array(Array::described(Value::Symbol(d), ValueKind::Ulong, items).unwrap())
        }),
    ]
}

pub fn arb_value() -> impl Strategy<Value = Value> {
    arb_leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..6).prop_map(Value::List),
            vec((inner.clone(), inner.clone()), 0..4).prop_map(Value::Map),
            (inner.clone(), inner.clone()).prop_map(|(d, v)| Value::described(d, v)),
            arb_array(inner),
        ]
    })
}

fn arb_fields() -> impl Strategy<Value = Option<Fields>> {
    proptest::option::of(vec((arb_symbol(), arb_leaf()), 0..3))
}

fn arb_map() -> impl Strategy<Value = Option<Map>> {
    proptest::option::of(vec((arb_leaf(), arb_leaf()), 0..3))
}

fn arb_string() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(".{0,10}")
}

fn arb_error() -> BoxedStrategy<Option<AmqpError>> {
    proptest::option::of((arb_symbol(), arb_string(), arb_fields()).prop_map(
        |(condition, description, info)| AmqpError {
            condition,
            description,
            info,
        },
    ))
    .boxed()
}

fn arb_state() -> BoxedStrategy<Option<DeliveryState>> {
    proptest::option::of(prop_oneof![
        (any::<u32>(), any::<u64>()).prop_map(|(section_number, section_offset)| {
            DeliveryState::Received {
                section_number,
                section_offset,
            }
        }),
        Just(DeliveryState::Accepted),
        arb_error().prop_map(|error| DeliveryState::Rejected { error }),
        Just(DeliveryState::Released),
        (any::<bool>(), any::<bool>(), arb_map()).prop_map(|(f, u, a)| DeliveryState::Modified {
            delivery_failed: f,
            undeliverable_here: u,
            message_annotations: a,
        }),
    ])
    .boxed()
}

fn arb_durability() -> impl Strategy<Value = TerminusDurability> {
    prop_oneof![
        Just(TerminusDurability::None),
        Just(TerminusDurability::Configuration),
        Just(TerminusDurability::UnsettledState),
    ]
}

fn arb_source() -> BoxedStrategy<Option<Source>> {
    let filter = proptest::option::of(vec(
        (
            arb_symbol(),
            (arb_leaf(), arb_leaf()).prop_map(|(d, v)| Value::described(d, v)),
        ),
        0..2,
    ));
    let head = (
        arb_string(),
        arb_durability(),
        arb_symbol(),
        any::<u32>(),
        any::<bool>(),
    );
    let tail = (
        arb_fields(),
        proptest::option::of(arb_symbol()),
        filter,
        arb_state(),
    );
    proptest::option::of((head, tail, arb_symbols(), arb_symbols()).prop_map(
        |(
            (address, durable, expiry_policy, timeout_seconds, dynamic),
            tail,
            outcomes,
            capabilities,
        )| {
            let (dynamic_node_properties, distribution_mode, filter, default_outcome) = tail;
            Source {
                address,
                durable,
                expiry_policy,
                timeout_seconds,
                dynamic,
                dynamic_node_properties,
                distribution_mode,
                filter,
                default_outcome,
                outcomes,
                capabilities,
            }
        },
    ))
    .boxed()
}

fn arb_target() -> BoxedStrategy<Option<Target>> {
    let fields = (
        arb_string(),
        arb_durability(),
        arb_symbol(),
        any::<u32>(),
        any::<bool>(),
        arb_fields(),
        arb_symbols(),
    );
    proptest::option::of(fields.prop_map(
        |(address, durable, expiry_policy, timeout_seconds, dynamic, props, capabilities)| Target {
            address,
            durable,
            expiry_policy,
            timeout_seconds,
            dynamic,
            dynamic_node_properties: props,
            capabilities,
        },
    ))
    .boxed()
}

fn arb_role() -> impl Strategy<Value = Role> {
    prop_oneof![Just(Role::Sender), Just(Role::Receiver)]
}

fn arb_rcv_settle_mode() -> impl Strategy<Value = ReceiverSettleMode> {
    prop_oneof![
        Just(ReceiverSettleMode::First),
        Just(ReceiverSettleMode::Second)
    ]
}

fn arb_open() -> BoxedStrategy<Performative> {
    let head = (
        ".{0,10}",
        arb_string(),
        any::<u32>(),
        any::<u16>(),
        proptest::option::of(any::<u32>()),
    );
    let tail = (
        arb_symbols(),
        arb_symbols(),
        arb_symbols(),
        arb_symbols(),
        arb_fields(),
    );
    (head, tail)
        .prop_map(|((container_id, hostname, mfs, channel_max, idle), tail)| {
            Performative::Open(Open {
                container_id,
                hostname,
                max_frame_size_bytes: mfs,
                channel_max,
                idle_timeout_ms: idle,
                outgoing_locales: tail.0,
                incoming_locales: tail.1,
                offered_capabilities: tail.2,
                desired_capabilities: tail.3,
                properties: tail.4,
            })
        })
        .boxed()
}

fn arb_begin() -> BoxedStrategy<Performative> {
    let fields = (
        proptest::option::of(any::<u16>().prop_map(Channel)),
        any::<u32>().prop_map(TransferNumber),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        arb_symbols(),
        arb_symbols(),
        arb_fields(),
    );
    fields
        .prop_map(
            |(remote, next, inc, out, handle_max, offered, desired, properties)| {
                Performative::Begin(Begin {
                    remote_channel: remote,
                    next_outgoing_id: next,
                    incoming_window: inc,
                    outgoing_window: out,
                    handle_max,
                    offered_capabilities: offered,
                    desired_capabilities: desired,
                    properties,
                })
            },
        )
        .boxed()
}

fn arb_attach() -> BoxedStrategy<Performative> {
    let settle = prop_oneof![
        Just(SenderSettleMode::Unsettled),
        Just(SenderSettleMode::Settled),
        Just(SenderSettleMode::Mixed),
    ];
    let head = (
        ".{0,10}",
        any::<u32>(),
        arb_role(),
        settle,
        arb_rcv_settle_mode(),
    );
    let middle = (arb_source(), arb_target(), arb_map(), any::<bool>());
    let tail = (
        proptest::option::of(any::<u32>()),
        proptest::option::of(any::<u64>()),
        arb_symbols(),
        arb_symbols(),
        arb_fields(),
    );
    (head, middle, tail)
        .prop_map(|(head, middle, tail)| {
            Performative::from(Attach {
                name: head.0,
                handle: Handle(head.1),
                role: head.2,
                snd_settle_mode: head.3,
                rcv_settle_mode: head.4,
                source: middle.0,
                target: middle.1,
                unsettled: middle.2,
                incomplete_unsettled: middle.3,
                initial_delivery_count: tail.0,
                max_message_size_bytes: tail.1,
                offered_capabilities: tail.2,
                desired_capabilities: tail.3,
                properties: tail.4,
            })
        })
        .boxed()
}

fn arb_flow() -> BoxedStrategy<Performative> {
    let option_u32 = || proptest::option::of(any::<u32>());
    let fields = (
        option_u32(),
        any::<u32>(),
        any::<u32>(),
        any::<u32>(),
        option_u32(),
        option_u32(),
        option_u32(),
        option_u32(),
        any::<bool>(),
        any::<bool>(),
        arb_fields(),
    );
    fields
        .prop_map(|f| {
            Performative::Flow(Flow {
                next_incoming_id: f.0.map(TransferNumber),
                incoming_window: f.1,
                next_outgoing_id: TransferNumber(f.2),
                outgoing_window: f.3,
                handle: f.4.map(Handle),
                delivery_count: f.5,
                link_credit: f.6,
                available: f.7,
                drain: f.8,
                echo: f.9,
                properties: f.10,
            })
        })
        .boxed()
}

fn arb_transfer() -> BoxedStrategy<Performative> {
    let fields = (
        any::<u32>(),
        proptest::option::of(any::<u32>()),
        proptest::option::of(arb_bytes(8)),
        proptest::option::of(prop_oneof![
            Just(0),
            Just(BATCH_MESSAGE_FORMAT),
            any::<u32>()
        ]),
        proptest::option::of(any::<bool>()),
        any::<bool>(),
        proptest::option::of(arb_rcv_settle_mode()),
        arb_state(),
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    );
    fields
        .prop_map(|f| {
            Performative::Transfer(Transfer {
                handle: Handle(f.0),
                delivery_id: f.1.map(DeliveryNumber),
                delivery_tag: f.2,
                message_format: f.3,
                settled: f.4,
                more: f.5,
                rcv_settle_mode: f.6,
                state: f.7,
                resume: f.8,
                aborted: f.9,
                batchable: f.10,
            })
        })
        .boxed()
}

fn arb_disposition() -> BoxedStrategy<Performative> {
    let fields = (
        arb_role(),
        any::<u32>(),
        proptest::option::of(any::<u32>()),
        any::<bool>(),
        arb_state(),
        any::<bool>(),
    );
    fields
        .prop_map(|(role, first, last, settled, state, batchable)| {
            Performative::Disposition(Disposition {
                role,
                first: DeliveryNumber(first),
                last: last.map(DeliveryNumber),
                settled,
                state,
                batchable,
            })
        })
        .boxed()
}

fn arb_sasl() -> BoxedStrategy<Performative> {
    let code = prop_oneof![
        Just(SaslCode::Ok),
        Just(SaslCode::Auth),
        Just(SaslCode::Sys),
        Just(SaslCode::SysPerm),
        Just(SaslCode::SysTemp),
    ];
    prop_oneof![
        vec(arb_symbol(), 0..4).prop_map(|m| Performative::SaslMechanisms(SaslMechanisms {
            sasl_server_mechanisms: m
        })),
        (
            arb_symbol(),
            proptest::option::of(arb_bytes(8)),
            arb_string()
        )
            .prop_map(
                |(mechanism, initial_response, hostname)| Performative::SaslInit(SaslInit {
                    mechanism,
                    initial_response,
                    hostname
                })
            ),
        arb_bytes(8).prop_map(|challenge| Performative::SaslChallenge(SaslChallenge { challenge })),
        arb_bytes(8).prop_map(|response| Performative::SaslResponse(SaslResponse { response })),
        (code, proptest::option::of(arb_bytes(8))).prop_map(|(code, additional_data)| {
            Performative::SaslOutcome(SaslOutcome {
                code,
                additional_data,
            })
        }),
    ]
    .boxed()
}

pub fn arb_performative() -> BoxedStrategy<Performative> {
    prop_oneof![
        arb_open(),
        arb_begin(),
        arb_attach(),
        arb_flow(),
        arb_transfer(),
        arb_disposition(),
        (any::<u32>(), any::<bool>(), arb_error()).prop_map(|(handle, closed, error)| {
            Performative::Detach(Detach {
                handle: Handle(handle),
                closed,
                error,
            })
        }),
        arb_error().prop_map(|error| Performative::End(End { error })),
        arb_error().prop_map(|error| Performative::Close(Close { error })),
        arb_sasl(),
    ]
    .boxed()
}

fn arb_message_id() -> impl Strategy<Value = Option<MessageId>> {
    proptest::option::of(prop_oneof![
        any::<u64>().prop_map(MessageId::Ulong),
        any::<[u8; 16]>().prop_map(MessageId::Uuid),
        arb_bytes(8).prop_map(MessageId::Binary),
        ".{0,8}".prop_map(MessageId::String),
    ])
}

fn arb_properties() -> BoxedStrategy<Option<Properties>> {
    let head = (
        arb_message_id(),
        proptest::option::of(arb_bytes(8)),
        arb_string(),
        arb_string(),
        arb_string(),
        arb_message_id(),
        proptest::option::of(arb_symbol()),
    );
    let tail = (
        proptest::option::of(arb_symbol()),
        proptest::option::of(any::<i64>()),
        proptest::option::of(any::<i64>()),
        arb_string(),
        proptest::option::of(any::<u32>()),
        arb_string(),
    );
    proptest::option::of((head, tail).prop_map(|(h, t)| Properties {
        message_id: h.0,
        user_id: h.1,
        to: h.2,
        subject: h.3,
        reply_to: h.4,
        correlation_id: h.5,
        content_type: h.6,
        content_encoding: t.0,
        absolute_expiry_time_ms: t.1,
        creation_time_ms: t.2,
        group_id: t.3,
        group_sequence: t.4,
        reply_to_group_id: t.5,
    }))
    .boxed()
}

pub fn arb_message() -> BoxedStrategy<Message> {
    let header = proptest::option::of(
        (
            any::<bool>(),
            any::<u8>(),
            proptest::option::of(any::<u32>()),
            any::<bool>(),
            any::<u32>(),
        )
            .prop_map(
                |(durable, priority, ttl_ms, first_acquirer, delivery_count)| Header {
                    durable,
                    priority,
                    ttl_ms,
                    first_acquirer,
                    delivery_count,
                },
            ),
    );
    let body = prop_oneof![
        Just(Body::Empty),
        vec(arb_bytes(64), 1..4).prop_map(Body::Data),
        vec(vec(arb_leaf(), 0..3), 1..3).prop_map(Body::Sequence),
        arb_value().prop_map(Body::Value),
    ];
    let app = proptest::option::of(vec((".{0,8}", arb_leaf()), 0..3));
    (
        header,
        arb_map(),
        arb_map(),
        arb_properties(),
        app,
        body,
        arb_map(),
    )
        .prop_map(
            |(header, delivery_annotations, message_annotations, properties, app, body, footer)| {
                Message {
                    header,
                    delivery_annotations,
                    message_annotations,
                    properties,
                    application_properties: app,
                    body,
                    footer,
                }
            },
        )
        .boxed()
}

/// One of each performative with every optional field set where the SDKs need it.
pub fn sample_performatives() -> Vec<Performative> {
    let error = Some(AmqpError::new(
        condition::LINK_STOLEN,
        "taken over by epoch 2",
    ));
    vec![
        Open {
            container_id: "srv".into(),
            max_frame_size_bytes: 65536,
            properties: Some(Vec::new()),
            ..Open::default()
        }
        .into(),
        Begin {
            remote_channel: Some(Channel(1)),
            incoming_window: 65536,
            outgoing_window: 65536,
            handle_max: 255,
            ..Begin::default()
        }
        .into(),
        Attach {
            name: "receiver-link-1".into(),
            handle: Handle(0),
            role: Role::Sender,
            snd_settle_mode: SenderSettleMode::Settled,
            rcv_settle_mode: ReceiverSettleMode::First,
            source: Some(Source {
                address: Some("hub/ConsumerGroups/$Default/Partitions/0".into()),
                ..Source::default()
            }),
            target: Some(Target::default()),
            unsettled: None,
            incomplete_unsettled: false,
            initial_delivery_count: Some(0),
            max_message_size_bytes: Some(1 << 20),
            offered_capabilities: Vec::new(),
            desired_capabilities: Vec::new(),
            properties: Some(Vec::new()),
        }
        .into(),
        Flow {
            handle: Some(Handle(0)),
            link_credit: Some(300),
            ..Flow::default()
        }
        .into(),
        Transfer {
            handle: Handle(0),
            delivery_id: Some(DeliveryNumber(7)),
            delivery_tag: Some(Bytes::from_static(b"\0\0\0\x07")),
            message_format: Some(0),
            settled: Some(true),
            more: false,
            rcv_settle_mode: None,
            state: None,
            resume: false,
            aborted: false,
            batchable: false,
        }
        .into(),
        Disposition {
            role: Role::Receiver,
            first: DeliveryNumber(7),
            last: None,
            settled: true,
            state: Some(DeliveryState::Rejected {
                error: error.clone(),
            }),
            batchable: false,
        }
        .into(),
        Detach {
            handle: Handle(0),
            closed: true,
            error: error.clone(),
        }
        .into(),
        End { error: None }.into(),
        Close { error }.into(),
        SaslMechanisms {
            sasl_server_mechanisms: vec!["MSSBCBS".into(), "ANONYMOUS".into()],
        }
        .into(),
        SaslInit {
            mechanism: "ANONYMOUS".into(),
            initial_response: Some(Bytes::new()),
            hostname: Some("localhost".into()),
        }
        .into(),
        SaslChallenge::default().into(),
        SaslResponse::default().into(),
        SaslOutcome::default().into(),
    ]
}

/// Applies `(position, byte, operation)` edits: 0 flips bits, 1 inserts, 2 deletes.
pub fn mutate(bytes: &mut Vec<u8>, edits: &[(u16, u8, u8)]) {
    for &(position, byte, operation) in edits {
        let at = usize::from(position) % (bytes.len() + 1);
        match operation {
            0 if at < bytes.len() => bytes[at] ^= byte | 1,
            1 => bytes.insert(at, byte),
            _ if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.push(byte),
        }
    }
}
