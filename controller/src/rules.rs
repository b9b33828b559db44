//! Shared access authorization rules in the controller state: the namespace's (the
//! cluster's) and each hub's. Pure, like the rest of the state: keys are made by the node
//! proposing a command and travel in it, so every voter applies the same rule.

use serde::{Deserialize, Serialize};
use tributary_types::{AuthorizationRule, Rights};

use super::state::{ClusterState, CommandError, ErrorKind, Reply, hub_not_found};

/// The rule every cluster starts with, as in Event Hubs.
pub const ROOT_RULE: &str = "RootManageSharedAccessKey";
/// Most rules one scope (the namespace, or one hub) may hold, as in Event Hubs.
pub const RULES_PER_SCOPE_MAX: usize = 12;
/// Longest rule name, as in Event Hubs.
pub const RULE_NAME_CHARS_MAX: usize = 256;
/// Longest key an operator may set explicitly.
pub const KEY_CHARS_MAX: usize = 256;
/// Random bytes in a generated key (base64: 44 characters, as Event Hubs makes them).
pub const KEY_RANDOM_BYTES: usize = 32;

/// Where a rule lives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuleScope {
    Namespace,
    Hub(String),
}

impl std::fmt::Display for RuleScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RuleScope::Namespace => f.write_str("the namespace"),
            RuleScope::Hub(hub) => write!(f, "event hub '{hub}'"),
        }
    }
}

/// Which of a rule's two keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeyKind {
    Primary,
    Secondary,
}

/// What a rule command asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum RuleCommand {
    /// Creates the namespace's root rule when the namespace has no rule at all (a new
    /// cluster, or one whose state predates rules); otherwise does nothing.
    EnsureRoot {
        primary_key: String,
        secondary_key: String,
    },
    Create {
        scope: RuleScope,
        rule: AuthorizationRule,
    },
    Delete {
        scope: RuleScope,
        name: String,
    },
    /// Replaces one key; tokens signed with the old one stop working at once.
    RegenerateKey {
        scope: RuleScope,
        name: String,
        key: KeyKind,
        new_key: String,
    },
}

/// A random key: 32 bytes, base64.
pub fn random_key() -> String {
    use base64::Engine;
    let bytes: [u8; KEY_RANDOM_BYTES] = rand::random();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn err(kind: ErrorKind, message: impl Into<String>) -> CommandError {
    CommandError {
        kind,
        message: message.into(),
    }
}

/// Event Hubs' rule names: 1 to 256 letters, digits, '.', '-' or '_'.
pub fn validate_rule_name(name: &str) -> Result<(), CommandError> {
    let valid = !name.is_empty()
        && name.chars().count() <= RULE_NAME_CHARS_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if valid {
        Ok(())
    } else {
        Err(err(
            ErrorKind::InvalidArgument,
            format!(
                "authorization rule name {name:?} is invalid: use 1 to {RULE_NAME_CHARS_MAX} \
                 letters, digits, '.', '-' or '_'"
            ),
        ))
    }
}

fn validate_key(key: &str) -> Result<(), CommandError> {
    if key.is_empty() || key.len() > KEY_CHARS_MAX || key.chars().any(char::is_control) {
        return Err(err(
            ErrorKind::InvalidArgument,
            format!(
                "a key must be 1 to {KEY_CHARS_MAX} bytes of printable text (leave it out to \
                 have a random one made)"
            ),
        ));
    }
    Ok(())
}

impl ClusterState {
    /// The rules of `scope`, or NOT_FOUND for a hub that does not exist.
    pub fn rules(&self, scope: &RuleScope) -> Result<&[AuthorizationRule], CommandError> {
        match scope {
            RuleScope::Namespace => Ok(&self.rules),
            RuleScope::Hub(hub) => self
                .hubs
                .get(hub)
                .map(|record| record.rules.as_slice())
                .ok_or_else(|| hub_not_found(hub)),
        }
    }

    fn rules_mut(
        &mut self,
        scope: &RuleScope,
    ) -> Result<&mut Vec<AuthorizationRule>, CommandError> {
        match scope {
            RuleScope::Namespace => Ok(&mut self.rules),
            RuleScope::Hub(hub) => self
                .hubs
                .get_mut(hub)
                .map(|record| &mut record.rules)
                .ok_or_else(|| hub_not_found(hub)),
        }
    }

    pub(super) fn apply_rule(&mut self, command: RuleCommand) -> Result<Reply, CommandError> {
        match command {
            RuleCommand::EnsureRoot {
                primary_key,
                secondary_key,
            } => {
                if self.rules.is_empty() {
                    self.rules.push(AuthorizationRule {
                        name: ROOT_RULE.to_owned(),
                        primary_key,
                        secondary_key,
                        rights: Rights::MANAGE,
                    });
                }
                Ok(Reply::Done)
            }
            RuleCommand::Create { scope, rule } => {
                validate_rule_name(&rule.name)?;
                validate_key(&rule.primary_key)?;
                validate_key(&rule.secondary_key)?;
                if rule.rights.is_empty() {
                    return Err(err(
                        ErrorKind::InvalidArgument,
                        "a rule needs at least one right: Send, Listen or Manage",
                    ));
                }
                let rules = self.rules_mut(&scope)?;
                if rules.iter().any(|r| r.name == rule.name) {
                    return Err(err(
                        ErrorKind::AlreadyExists,
                        format!("{scope} already has an authorization rule '{}'", rule.name),
                    ));
                }
                if rules.len() >= RULES_PER_SCOPE_MAX {
                    return Err(err(
                        ErrorKind::QuotaExceeded,
                        format!(
                            "{scope} already has the maximum of {RULES_PER_SCOPE_MAX} \
                             authorization rules; delete one first"
                        ),
                    ));
                }
                rules.push(rule.clone());
                Ok(Reply::Rule(rule))
            }
            RuleCommand::Delete { scope, name } => {
                let rules = self.rules_mut(&scope)?;
                let index = rule_index(rules, &scope, &name)?;
                let last_manage = scope == RuleScope::Namespace
                    && rules[index].rights.grants(Rights::MANAGE)
                    && rules
                        .iter()
                        .filter(|r| r.rights.grants(Rights::MANAGE))
                        .count()
                        == 1;
                if last_manage {
                    return Err(err(
                        ErrorKind::InvalidArgument,
                        format!(
                            "'{name}' is the namespace's last rule with Manage: deleting it \
                             would leave no way to manage the cluster; create another Manage \
                             rule first"
                        ),
                    ));
                }
                rules.remove(index);
                Ok(Reply::Done)
            }
            RuleCommand::RegenerateKey {
                scope,
                name,
                key,
                new_key,
            } => {
                validate_key(&new_key)?;
                let rules = self.rules_mut(&scope)?;
                let index = rule_index(rules, &scope, &name)?;
                let rule = &mut rules[index];
                match key {
                    KeyKind::Primary => rule.primary_key = new_key,
                    KeyKind::Secondary => rule.secondary_key = new_key,
                }
                Ok(Reply::Rule(rule.clone()))
            }
        }
    }
}

fn rule_index(
    rules: &[AuthorizationRule],
    scope: &RuleScope,
    name: &str,
) -> Result<usize, CommandError> {
    rules.iter().position(|r| r.name == name).ok_or_else(|| {
        err(
            ErrorKind::NotFound,
            format!(
                "{scope} has no authorization rule '{name}'; `tributary auth rule list` shows \
                 its rules"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::Command;

    fn rule(name: &str, rights: Rights) -> AuthorizationRule {
        AuthorizationRule {
            name: name.to_owned(),
            primary_key: format!("{name}-1"),
            secondary_key: format!("{name}-2"),
            rights,
        }
    }

    fn apply(state: &mut ClusterState, command: RuleCommand) -> Result<Reply, CommandError> {
        state.apply(Command::Rule(command))
    }

    fn ensure_root(key: &str) -> RuleCommand {
        RuleCommand::EnsureRoot {
            primary_key: key.to_owned(),
            secondary_key: format!("{key}-2"),
        }
    }

    #[test]
    fn ensure_root_applies_only_to_a_namespace_without_rules() {
        let mut state = ClusterState::default();
        apply(&mut state, ensure_root("first")).unwrap();
        apply(&mut state, ensure_root("second")).unwrap();
        assert_eq!(state.rules.len(), 1);
        assert_eq!(state.rules[0].name, ROOT_RULE);
        assert_eq!(state.rules[0].primary_key, "first");
        assert_eq!(state.rules[0].rights, Rights::MANAGE);
    }

    #[test]
    fn create_checks_name_rights_duplicates_and_the_limit() {
        let mut state = ClusterState::default();
        let create = |rule| RuleCommand::Create {
            scope: RuleScope::Namespace,
            rule,
        };
        let error = apply(&mut state, create(rule("a b", Rights::SEND))).unwrap_err();
        assert_eq!(error.kind, ErrorKind::InvalidArgument);
        assert!(error.message.contains("\"a b\""), "{error}");
        let error = apply(&mut state, create(rule("none", Rights::NONE))).unwrap_err();
        assert!(error.message.contains("at least one right"), "{error}");
        for i in 0..RULES_PER_SCOPE_MAX {
            apply(&mut state, create(rule(&format!("r{i}"), Rights::SEND))).unwrap();
        }
        let error = apply(&mut state, create(rule("r0", Rights::SEND))).unwrap_err();
        assert_eq!(error.kind, ErrorKind::AlreadyExists);
        let error = apply(&mut state, create(rule("one-more", Rights::SEND))).unwrap_err();
        assert_eq!(error.kind, ErrorKind::QuotaExceeded);
        let error = apply(
            &mut state,
            RuleCommand::Create {
                scope: RuleScope::Hub("missing".into()),
                rule: rule("x", Rights::SEND),
            },
        )
        .unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound);
    }

    #[test]
    fn the_last_namespace_manage_rule_cannot_be_deleted() {
        let mut state = ClusterState::default();
        apply(&mut state, ensure_root("k")).unwrap();
        let delete = |name: &str| RuleCommand::Delete {
            scope: RuleScope::Namespace,
            name: name.to_owned(),
        };
        let error = apply(&mut state, delete(ROOT_RULE)).unwrap_err();
        assert!(error.message.contains("last rule with Manage"), "{error}");
        apply(
            &mut state,
            RuleCommand::Create {
                scope: RuleScope::Namespace,
                rule: rule("admin", Rights::MANAGE),
            },
        )
        .unwrap();
        apply(&mut state, delete(ROOT_RULE)).unwrap();
        assert_eq!(state.rules.len(), 1);
        let error = apply(&mut state, delete(ROOT_RULE)).unwrap_err();
        assert_eq!(error.kind, ErrorKind::NotFound);
    }

    #[test]
    fn regenerate_replaces_one_key() {
        let mut state = ClusterState::default();
        apply(&mut state, ensure_root("old")).unwrap();
        let Reply::Rule(rule) = apply(
            &mut state,
            RuleCommand::RegenerateKey {
                scope: RuleScope::Namespace,
                name: ROOT_RULE.into(),
                key: KeyKind::Primary,
                new_key: "new".into(),
            },
        )
        .unwrap() else {
            panic!("a rule reply")
        };
        assert_eq!(rule.primary_key, "new");
        assert_eq!(rule.secondary_key, "old-2");
        assert_eq!(state.rules[0], rule);
    }

    #[test]
    fn random_keys_are_44_base64_characters_and_differ() {
        let (a, b) = (random_key(), random_key());
        assert_eq!(a.len(), 44);
        assert_ne!(a, b);
    }
}
