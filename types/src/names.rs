//! Event Hubs naming rules for hubs and consumer groups.
//!
//! Names end up in AMQP addresses (`<hub>/ConsumerGroups/<cg>/Partitions/<id>`), URLs and
//! storage keys, so only characters that are safe in all of them are allowed. Errors quote
//! the name and state the broken rule, so the person who typed it can fix it.

use crate::limits::{CONSUMER_GROUP_NAME_CHARS_MAX, HUB_NAME_CHARS_MAX};
use std::fmt;

/// The consumer group every hub has from its creation and that cannot be deleted.
pub const DEFAULT_CONSUMER_GROUP: &str = "$Default";

/// What kind of name was being checked; shown in error messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    Hub,
    ConsumerGroup,
}

impl fmt::Display for NameKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NameKind::Hub => "event hub",
            NameKind::ConsumerGroup => "consumer group",
        })
    }
}

/// A name that breaks a naming rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("{kind} name must not be empty")]
    Empty { kind: NameKind },
    #[error("{kind} name {name:?} is {len_chars} characters long; at most {max_chars} are allowed")]
    TooLong {
        kind: NameKind,
        name: String,
        len_chars: usize,
        max_chars: usize,
    },
    #[error(
        "{kind} name {name:?} contains {found:?} at position {position}; only ASCII letters, \
         digits, '.', '-' and '_' are allowed"
    )]
    InvalidChar {
        kind: NameKind,
        name: String,
        found: char,
        /// 0-based, counted in characters.
        position: usize,
    },
    #[error("{kind} name {name:?} must start and end with a letter or digit")]
    BadEdge { kind: NameKind, name: String },
    #[error(
        "consumer group name {name:?} starts with '$', which is reserved; the only such name \
         is \"$Default\" (mind the case)"
    )]
    Reserved { name: String },
}

/// Checks an event hub name: 1 to 256 ASCII letters, digits, '.', '-' or '_', starting and
/// ending with a letter or digit.
pub fn validate_hub_name(name: &str) -> Result<(), NameError> {
    validate(NameKind::Hub, name, HUB_NAME_CHARS_MAX)
}

/// Checks a consumer group name: [`DEFAULT_CONSUMER_GROUP`], or 1 to 50 ASCII letters,
/// digits, '.', '-' or '_', starting and ending with a letter or digit.
pub fn validate_consumer_group_name(name: &str) -> Result<(), NameError> {
    if name == DEFAULT_CONSUMER_GROUP {
        return Ok(());
    }
    if name.starts_with('$') {
        return Err(NameError::Reserved {
            name: name.to_owned(),
        });
    }
    validate(NameKind::ConsumerGroup, name, CONSUMER_GROUP_NAME_CHARS_MAX)
}

fn validate(kind: NameKind, name: &str, max_chars: usize) -> Result<(), NameError> {
    let len_chars = name.chars().count();
    if len_chars == 0 {
        return Err(NameError::Empty { kind });
    }
    if len_chars > max_chars {
        return Err(NameError::TooLong {
            kind,
            name: name.to_owned(),
            len_chars,
            max_chars,
        });
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    if let Some((position, found)) = name.chars().enumerate().find(|&(_, c)| !allowed(c)) {
        return Err(NameError::InvalidChar {
            kind,
            name: name.to_owned(),
            found,
            position,
        });
    }
    // Only ASCII is left, so the first and last bytes are the first and last characters.
    let bytes = name.as_bytes();
    if !bytes[0].is_ascii_alphanumeric() || !bytes[bytes.len() - 1].is_ascii_alphanumeric() {
        return Err(NameError::BadEdge {
            kind,
            name: name.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_names_that_pass() {
        for name in [
            "a",
            "7",
            "orders",
            "Orders.v2-eu_west",
            "a-b",
            &"x".repeat(256),
        ] {
            assert_eq!(validate_hub_name(name), Ok(()), "{name}");
        }
    }

    #[test]
    fn hub_name_must_not_be_empty() {
        let err = validate_hub_name("").unwrap_err();
        assert_eq!(
            err,
            NameError::Empty {
                kind: NameKind::Hub
            }
        );
        assert_eq!(err.to_string(), "event hub name must not be empty");
    }

    #[test]
    fn hub_name_length_is_capped() {
        let name = "x".repeat(257);
        let err = validate_hub_name(&name).unwrap_err();
        assert!(matches!(
            err,
            NameError::TooLong {
                len_chars: 257,
                max_chars: 256,
                ..
            }
        ));
        assert!(err.to_string().contains("257 characters long; at most 256"));
    }

    #[test]
    fn hub_name_characters_are_restricted() {
        let err = validate_hub_name("orders/eu").unwrap_err();
        assert_eq!(
            err.to_string(),
            "event hub name \"orders/eu\" contains '/' at position 6; only ASCII letters, \
             digits, '.', '-' and '_' are allowed"
        );
        for name in ["a b", "café", "a$b", "a:b"] {
            assert!(
                matches!(validate_hub_name(name), Err(NameError::InvalidChar { .. })),
                "{name}"
            );
        }
        // The position counts characters, not bytes.
        assert!(matches!(
            validate_hub_name("éa"),
            Err(NameError::InvalidChar { position: 0, .. })
        ));
        assert!(matches!(
            validate_hub_name("aé!"),
            Err(NameError::InvalidChar { position: 1, .. })
        ));
    }

    #[test]
    fn hub_name_starts_and_ends_with_letter_or_digit() {
        for name in ["-orders", "orders_", ".x", "x.", "_", "-"] {
            let err = validate_hub_name(name).unwrap_err();
            assert!(matches!(err, NameError::BadEdge { .. }), "{name}");
            assert!(
                err.to_string()
                    .contains("must start and end with a letter or digit")
            );
        }
    }

    #[test]
    fn consumer_group_default_is_allowed() {
        assert_eq!(validate_consumer_group_name(DEFAULT_CONSUMER_GROUP), Ok(()));
    }

    #[test]
    fn consumer_group_dollar_prefix_is_reserved() {
        for name in ["$default", "$Other", "$"] {
            let err = validate_consumer_group_name(name).unwrap_err();
            assert!(matches!(err, NameError::Reserved { .. }), "{name}");
            assert!(err.to_string().contains("\"$Default\""));
        }
    }

    #[test]
    fn consumer_group_rules() {
        assert_eq!(validate_consumer_group_name("billing-v2"), Ok(()));
        assert_eq!(validate_consumer_group_name(&"g".repeat(50)), Ok(()));
        assert_eq!(
            validate_consumer_group_name(""),
            Err(NameError::Empty {
                kind: NameKind::ConsumerGroup
            })
        );
        let err = validate_consumer_group_name(&"g".repeat(51)).unwrap_err();
        assert!(err.to_string().starts_with("consumer group name \"ggg"));
        assert!(err.to_string().contains("51 characters long; at most 50"));
        assert!(matches!(
            validate_consumer_group_name("a b"),
            Err(NameError::InvalidChar { found: ' ', .. })
        ));
        assert!(matches!(
            validate_consumer_group_name("group-"),
            Err(NameError::BadEdge { .. })
        ));
    }
}
