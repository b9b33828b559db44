//! Link terminus: `source` (0x28) and `target` (0x29), AMQP 1.0 part 3 §3.5, and the selector
//! filter Event Hubs consumers put in a source's filter set (WIRE-PROTOCOLS A9).

use crate::delivery_state::DeliveryState;
use crate::error::CodecError;
use crate::fields::{
    Descriptor, FieldReader, fields_value, opt, optional_fields, symbols_value, wire_enum,
};
use crate::types::{Fields, Symbol, Value};

/// The filter-set key and symbolic descriptor of the selector filter (pyamqp's form).
pub const SELECTOR_FILTER_NAME: &str = "apache.org:selector-filter:string";
/// The selector filter's ulong descriptor in Microsoft's domain (.NET, old ServiceBus).
pub const SELECTOR_FILTER_CODE_MICROSOFT: u64 = 0x0000_0013_7000_000A;
/// The selector filter's ulong descriptor registered with Apache (generic AMQP libraries).
pub const SELECTOR_FILTER_CODE_APACHE: u64 = 0x0000_468C_0000_0004;

/// The default expiry policy of a terminus.
pub const EXPIRY_POLICY_SESSION_END: &str = "session-end";

/// Where a link's messages come from (11 fields).
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    pub address: Option<String>,
    pub durable: TerminusDurability,
    /// Default `session-end`.
    pub expiry_policy: Symbol,
    pub timeout_seconds: u32,
    pub dynamic: bool,
    pub dynamic_node_properties: Option<Fields>,
    pub distribution_mode: Option<Symbol>,
    /// The filter set: filter name to a described filter (or null). Kept as values; see
    /// [`Source::selector_filter`].
    pub filter: Option<Fields>,
    pub default_outcome: Option<DeliveryState>,
    pub outcomes: Vec<Symbol>,
    pub capabilities: Vec<Symbol>,
}

/// Where a link's messages go (7 fields).
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub address: Option<String>,
    pub durable: TerminusDurability,
    /// Default `session-end`.
    pub expiry_policy: Symbol,
    pub timeout_seconds: u32,
    pub dynamic: bool,
    pub dynamic_node_properties: Option<Fields>,
    pub capabilities: Vec<Symbol>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum TerminusDurability {
    #[default]
    None,
    Configuration,
    UnsettledState,
}

wire_enum!(TerminusDurability as u32, "uint", "0 (none), 1 (configuration) or 2 (unsettled-state)" {
    None = 0,
    Configuration = 1,
    UnsettledState = 2,
});

const SOURCE: Descriptor = Descriptor::new(0x28, "amqp:source:list");
const TARGET: Descriptor = Descriptor::new(0x29, "amqp:target:list");

impl Default for Source {
    fn default() -> Source {
        Source {
            address: None,
            durable: TerminusDurability::None,
            expiry_policy: Symbol::from(EXPIRY_POLICY_SESSION_END),
            timeout_seconds: 0,
            dynamic: false,
            dynamic_node_properties: None,
            distribution_mode: None,
            filter: None,
            default_outcome: None,
            outcomes: Vec::new(),
            capabilities: Vec::new(),
        }
    }
}

impl Default for Target {
    fn default() -> Target {
        Target {
            address: None,
            durable: TerminusDurability::None,
            expiry_policy: Symbol::from(EXPIRY_POLICY_SESSION_END),
            timeout_seconds: 0,
            dynamic: false,
            dynamic_node_properties: None,
            capabilities: Vec::new(),
        }
    }
}

impl Source {
    /// The expression of the selector filter, under any of its three descriptors
    /// (symbol, Microsoft ulong, Apache ulong), whatever its key in the filter set.
    pub fn selector_filter(&self) -> Option<&str> {
        self.filter.iter().flatten().find_map(|(_, filter)| {
            let Value::Described(described) = filter else {
                return None;
            };
            let is_selector = match &described.descriptor {
                Value::Symbol(name) => name.as_str() == SELECTOR_FILTER_NAME,
                Value::Ulong(code) => {
                    *code == SELECTOR_FILTER_CODE_MICROSOFT || *code == SELECTOR_FILTER_CODE_APACHE
                }
                _ => false,
            };
            if is_selector {
                described.value.as_str()
            } else {
                None
            }
        })
    }

    pub fn to_value(&self) -> Value {
        SOURCE.composite(vec![
            opt(self.address.clone()),
            self.durable.into(),
            Value::Symbol(self.expiry_policy.clone()),
            self.timeout_seconds.into(),
            self.dynamic.into(),
            fields_value(&self.dynamic_node_properties),
            opt(self.distribution_mode.clone()),
            fields_value(&self.filter),
            self.default_outcome
                .as_ref()
                .map_or(Value::Null, DeliveryState::to_value),
            symbols_value(&self.outcomes),
            symbols_value(&self.capabilities),
        ])
    }

    pub(crate) fn from_value(value: Value, field: &'static str) -> Result<Source, CodecError> {
        let mut r = SOURCE.fields(value, field)?;
        Ok(Source {
            address: r.optional("source.address")?,
            durable: r.or("source.durable", TerminusDurability::None)?,
            expiry_policy: expiry_policy(&mut r, "source.expiry-policy")?,
            timeout_seconds: r.or("source.timeout", 0)?,
            dynamic: r.or("source.dynamic", false)?,
            dynamic_node_properties: optional_fields(&mut r, "source.dynamic-node-properties")?,
            distribution_mode: r.optional("source.distribution-mode")?,
            filter: optional_fields(&mut r, "source.filter")?,
            default_outcome: r.optional("source.default-outcome")?,
            outcomes: r.symbols("source.outcomes")?,
            capabilities: r.symbols("source.capabilities")?,
        })
    }
}

impl Target {
    pub fn to_value(&self) -> Value {
        TARGET.composite(vec![
            opt(self.address.clone()),
            self.durable.into(),
            Value::Symbol(self.expiry_policy.clone()),
            self.timeout_seconds.into(),
            self.dynamic.into(),
            fields_value(&self.dynamic_node_properties),
            symbols_value(&self.capabilities),
        ])
    }

    pub(crate) fn from_value(value: Value, field: &'static str) -> Result<Target, CodecError> {
        let mut r = TARGET.fields(value, field)?;
        Ok(Target {
            address: r.optional("target.address")?,
            durable: r.or("target.durable", TerminusDurability::None)?,
            expiry_policy: expiry_policy(&mut r, "target.expiry-policy")?,
            timeout_seconds: r.or("target.timeout", 0)?,
            dynamic: r.or("target.dynamic", false)?,
            dynamic_node_properties: optional_fields(&mut r, "target.dynamic-node-properties")?,
            capabilities: r.symbols("target.capabilities")?,
        })
    }
}

fn expiry_policy(r: &mut FieldReader, field: &'static str) -> Result<Symbol, CodecError> {
    r.or(field, Symbol::from(EXPIRY_POLICY_SESSION_END))
}

impl crate::fields::FromValue for Source {
    fn from_value(value: Value, field: &'static str) -> Result<Source, CodecError> {
        Source::from_value(value, field)
    }
}

impl crate::fields::FromValue for Target {
    fn from_value(value: Value, field: &'static str) -> Result<Target, CodecError> {
        Target::from_value(value, field)
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::test_support::hex;
    use crate::{Attach, Handle, Performative, Role, decode_frame_body};

    fn source_with_filter(descriptor: Value) -> Source {
        Source {
            address: Some("amqps://host/hub/ConsumerGroups/$Default/Partitions/0".into()),
            filter: Some(vec![(
                Symbol::from(SELECTOR_FILTER_NAME),
                Value::described(
                    descriptor,
                    Value::String("amqp.annotation.x-opt-offset > '-1'".into()),
                ),
            )]),
            ..Source::default()
        }
    }

    #[test]
    fn the_three_selector_filter_descriptors_decode() {
        for descriptor in [
            Value::symbol(SELECTOR_FILTER_NAME),
            Value::Ulong(SELECTOR_FILTER_CODE_MICROSOFT),
            Value::Ulong(SELECTOR_FILTER_CODE_APACHE),
        ] {
            let attach = Performative::from(Attach {
                name: "receiver-link-1".into(),
                handle: Handle(1),
                role: Role::Receiver,
                snd_settle_mode: Default::default(),
                rcv_settle_mode: Default::default(),
                source: Some(source_with_filter(descriptor.clone())),
                target: Some(Target::default()),
                unsettled: None,
                incomplete_unsettled: false,
                initial_delivery_count: None,
                max_message_size_bytes: Some(1 << 20),
                offered_capabilities: Vec::new(),
                desired_capabilities: vec!["com.microsoft:georeplication".into()],
                properties: Some(vec![("com.microsoft:epoch".into(), Value::Long(0))]),
            });
            let mut bytes = Vec::new();
            attach.encode(&mut bytes);
            let (decoded, _) = decode_frame_body(Bytes::from(bytes)).unwrap();
            assert_eq!(decoded, attach);
            let Performative::Attach(attach) = decoded else {
                unreachable!()
            };
            let source = attach.source.unwrap();
            assert_eq!(
                source.selector_filter(),
                Some("amqp.annotation.x-opt-offset > '-1'")
            );
            let filter = &source.filter.as_ref().unwrap()[0].1;
            let Value::Described(described) = filter else {
                unreachable!()
            };
            assert_eq!(described.descriptor, descriptor);
        }
    }

    #[test]
    fn microsoft_descriptor_is_written_as_a_full_ulong() {
        let value = source_with_filter(Value::Ulong(SELECTOR_FILTER_CODE_MICROSOFT)).to_value();
        let bytes = value.to_bytes();
        let needle = hex("00 80 00 00 00 13 70 00 00 0a");
        assert!(bytes.windows(needle.len()).any(|w| w == needle));
    }

    #[test]
    fn other_filters_are_not_selectors() {
        let mut source = source_with_filter(Value::Ulong(0x0000_0013_7000_0009));
        assert_eq!(source.selector_filter(), None);
        source.filter = None;
        assert_eq!(source.selector_filter(), None);
    }
}
