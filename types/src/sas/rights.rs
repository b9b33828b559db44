//! The rights an authorization rule grants, and the rule itself.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A set of the rights Event Hubs knows: Send, Listen and Manage. Manage implies Send and
/// Listen, as in Event Hubs (a rule with Manage must also have both; here a set holding
/// Manage simply grants them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Rights {
    send: bool,
    listen: bool,
    manage: bool,
}

impl Rights {
    /// No right at all.
    pub const NONE: Rights = Rights {
        send: false,
        listen: false,
        manage: false,
    };
    /// Publishing events.
    pub const SEND: Rights = Rights {
        send: true,
        ..Rights::NONE
    };
    /// Receiving events (and the consumer-group and checkpoint reads that go with it).
    pub const LISTEN: Rights = Rights {
        listen: true,
        ..Rights::NONE
    };
    /// Managing hubs, consumer groups and rules; implies Send and Listen.
    pub const MANAGE: Rights = Rights {
        manage: true,
        ..Rights::NONE
    };

    /// The rights in `self` or in `other`.
    pub const fn union(self, other: Rights) -> Rights {
        Rights {
            send: self.send || other.send,
            listen: self.listen || other.listen,
            manage: self.manage || other.manage,
        }
    }

    /// The set with Manage expanded: what a holder of `self` may actually do.
    pub const fn effective(self) -> Rights {
        Rights {
            send: self.send || self.manage,
            listen: self.listen || self.manage,
            manage: self.manage,
        }
    }

    /// Whether a holder of `self` may do everything `needed` asks for.
    pub const fn grants(self, needed: Rights) -> bool {
        let have = self.effective();
        let needed = needed.effective();
        (have.send || !needed.send)
            && (have.listen || !needed.listen)
            && (have.manage || !needed.manage)
    }

    /// The rights of `needed` that `self` does not grant.
    pub const fn missing(self, needed: Rights) -> Rights {
        let have = self.effective();
        let needed = needed.effective();
        Rights {
            send: needed.send && !have.send,
            listen: needed.listen && !have.listen,
            manage: needed.manage && !have.manage,
        }
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        !self.send && !self.listen && !self.manage
    }

    fn names(self) -> impl Iterator<Item = &'static str> {
        [
            (self.manage, "Manage"),
            (self.send, "Send"),
            (self.listen, "Listen"),
        ]
        .into_iter()
        .filter_map(|(held, name)| held.then_some(name))
    }
}

/// Comma-separated names as Event Hubs writes them (`Manage, Send, Listen`), or `none`.
impl fmt::Display for Rights {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("none");
        }
        for (i, name) in self.names().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            f.write_str(name)?;
        }
        Ok(())
    }
}

/// A right name that is not Send, Listen or Manage.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown right {0:?}: expected Send, Listen or Manage (comma-separated)")]
pub struct RightsParseError(pub String);

/// Parses comma-separated right names, case-insensitively (`send,listen`, `Manage`).
impl FromStr for Rights {
    type Err = RightsParseError;

    fn from_str(text: &str) -> Result<Rights, RightsParseError> {
        let mut rights = Rights::NONE;
        for name in text.split(',').map(str::trim) {
            rights = rights.union(match name.to_ascii_lowercase().as_str() {
                "send" => Rights::SEND,
                "listen" => Rights::LISTEN,
                "manage" => Rights::MANAGE,
                _ => return Err(RightsParseError(name.to_owned())),
            });
        }
        Ok(rights)
    }
}

/// A shared access authorization rule: a name, two keys and the rights tokens signed with
/// either key carry. Two keys so that one can be rotated while clients move to the other.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthorizationRule {
    /// The key name, `skn` in tokens (e.g. `RootManageSharedAccessKey`).
    pub name: String,
    /// The primary key, used as its UTF-8 text (not base64-decoded) to sign.
    pub primary_key: String,
    /// The secondary key, likewise.
    pub secondary_key: String,
    /// What tokens signed with this rule's keys may do.
    pub rights: Rights,
}

/// Never shows the keys.
impl fmt::Debug for AuthorizationRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthorizationRule")
            .field("name", &self.name)
            .field("primary_key", &"<redacted>")
            .field("secondary_key", &"<redacted>")
            .field("rights", &self.rights)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manage_implies_send_and_listen() {
        assert!(Rights::MANAGE.grants(Rights::SEND));
        assert!(Rights::MANAGE.grants(Rights::LISTEN));
        assert!(Rights::MANAGE.grants(Rights::SEND.union(Rights::LISTEN)));
        assert!(!Rights::SEND.union(Rights::LISTEN).grants(Rights::MANAGE));
        assert!(!Rights::SEND.grants(Rights::LISTEN));
        assert!(!Rights::LISTEN.grants(Rights::SEND));
        assert!(Rights::SEND.grants(Rights::NONE));
        assert_eq!(
            Rights::LISTEN.missing(Rights::MANAGE),
            Rights::SEND.union(Rights::MANAGE)
        );
    }

    #[test]
    fn parses_and_displays_names() {
        let rights: Rights = "send, Listen".parse().unwrap();
        assert_eq!(rights, Rights::SEND.union(Rights::LISTEN));
        assert_eq!(rights.to_string(), "Send, Listen");
        assert_eq!("MANAGE".parse::<Rights>().unwrap(), Rights::MANAGE);
        assert_eq!(Rights::NONE.to_string(), "none");
        let error = "send,write".parse::<Rights>().unwrap_err();
        assert!(error.to_string().contains("\"write\""), "{error}");
    }

    #[test]
    fn rule_debug_hides_the_keys() {
        let rule = AuthorizationRule {
            name: "app".into(),
            primary_key: "secret-one".into(),
            secondary_key: "secret-two".into(),
            rights: Rights::SEND,
        };
        let shown = format!("{rule:?}");
        assert!(!shown.contains("secret"), "{shown}");
        assert!(shown.contains("app"), "{shown}");
    }

    #[test]
    fn rule_round_trips_through_postcard() {
        let rule = AuthorizationRule {
            name: "app".into(),
            primary_key: "k1".into(),
            secondary_key: "k2".into(),
            rights: Rights::SEND.union(Rights::MANAGE),
        };
        let bytes = postcard::to_stdvec(&rule).unwrap();
        assert_eq!(
            postcard::from_bytes::<AuthorizationRule>(&bytes).unwrap(),
            rule
        );
    }
}
