//! Authorization rules (shared access policies) of the namespace and of each hub. Every call
//! needs Manage on the rule's scope; keys leave the node only through [`Service::rule_keys`]
//! and the calls that make new ones.

use tributary_controller::rules::{RuleCommand, RuleScope, random_key};
use tributary_controller::state::{Command, Reply};
use tributary_types::sas::RightsParseError;
use tributary_types::{AuthorizationRule, Rights};

use super::Service;
use crate::auth::{Credential, Scope};
use crate::error::Error;

pub use tributary_controller::rules::KeyKind as RuleKeyKind;

/// A rule with its keys and the connection strings that use them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleKeys {
    pub rule: AuthorizationRule,
    pub primary_connection_string: String,
    pub secondary_connection_string: String,
}

impl Service {
    /// Creates a rule with new random keys. `hub` empty: a namespace rule.
    pub async fn create_rule(
        &self,
        credential: &Credential,
        hub: &str,
        name: &str,
        rights: &[String],
    ) -> Result<AuthorizationRule, Error> {
        let scope = rule_scope(hub);
        self.check(credential, auth_scope(&scope), Rights::MANAGE)?;
        let rule = AuthorizationRule {
            name: name.to_owned(),
            primary_key: random_key(),
            secondary_key: random_key(),
            rights: parse_rights(rights)?,
        };
        let rule = self
            .run_rule(RuleCommand::Create {
                scope: scope.clone(),
                rule,
            })
            .await?;
        self.await_rule(&scope, &rule.name, |r| r.is_some()).await;
        Ok(rule)
    }

    /// The rules of a scope (their keys too: callers show only what they must).
    pub fn list_rules(
        &self,
        credential: &Credential,
        hub: &str,
    ) -> Result<Vec<AuthorizationRule>, Error> {
        let scope = rule_scope(hub);
        self.check(credential, auth_scope(&scope), Rights::MANAGE)?;
        let state = self.broker.runtime().state();
        Ok(state.rules(&scope)?.to_vec())
    }

    /// A rule's keys and connection strings.
    pub fn rule_keys(
        &self,
        credential: &Credential,
        hub: &str,
        name: &str,
    ) -> Result<RuleKeys, Error> {
        let scope = rule_scope(hub);
        self.check(credential, auth_scope(&scope), Rights::MANAGE)?;
        let state = self.broker.runtime().state();
        let rule = state
            .rules(&scope)?
            .iter()
            .find(|r| r.name == name)
            .ok_or_else(|| {
                Error::not_found(format!(
                    "{scope} has no authorization rule '{name}'; `tributary auth rule list` shows its rules"
                ))
            })?;
        Ok(self.keys(&scope, rule))
    }

    /// Replaces one of a rule's keys (`None`: the request named neither), with `new_key` or
    /// (empty) a random one.
    pub async fn regenerate_rule_key(
        &self,
        credential: &Credential,
        hub: &str,
        name: &str,
        key: Option<RuleKeyKind>,
        new_key: String,
    ) -> Result<RuleKeys, Error> {
        let scope = rule_scope(hub);
        self.check(credential, auth_scope(&scope), Rights::MANAGE)?;
        let key = key.ok_or_else(|| {
            Error::invalid("say which key to regenerate: the primary or the secondary")
        })?;
        let new_key = if new_key.is_empty() {
            random_key()
        } else {
            new_key
        };
        let rule = self
            .run_rule(RuleCommand::RegenerateKey {
                scope: scope.clone(),
                name: name.to_owned(),
                key,
                new_key,
            })
            .await?;
        self.await_rule(&scope, &rule.name, |r| r == Some(&rule))
            .await;
        Ok(self.keys(&scope, &rule))
    }

    pub async fn delete_rule(
        &self,
        credential: &Credential,
        hub: &str,
        name: &str,
    ) -> Result<(), Error> {
        let scope = rule_scope(hub);
        self.check(credential, auth_scope(&scope), Rights::MANAGE)?;
        self.broker
            .runtime()
            .propose(Command::Rule(RuleCommand::Delete {
                scope: scope.clone(),
                name: name.to_owned(),
            }))
            .await?;
        self.await_rule(&scope, name, |r| r.is_none()).await;
        Ok(())
    }

    /// Runs a rule command that answers with the rule.
    async fn run_rule(&self, command: RuleCommand) -> Result<AuthorizationRule, Error> {
        match self
            .broker
            .runtime()
            .propose(Command::Rule(command))
            .await?
        {
            Reply::Rule(rule) => Ok(rule),
            other => Err(Error::internal(format!(
                "a rule command replied without the rule: {other:?}"
            ))),
        }
    }

    /// Waits (bounded) until this node's view shows the rule as `done` says, so a token
    /// made with a key just created or rotated works here at once.
    async fn await_rule(
        &self,
        scope: &RuleScope,
        name: &str,
        done: impl Fn(Option<&AuthorizationRule>) -> bool,
    ) {
        self.broker
            .await_view(|state| {
                state
                    .rules(scope)
                    .is_ok_and(|rules| done(rules.iter().find(|r| r.name == name)))
            })
            .await;
    }

    fn keys(&self, scope: &RuleScope, rule: &AuthorizationRule) -> RuleKeys {
        let client_addr = &self.broker.runtime().me.client_addr;
        let connection_string = |key: &str| {
            let mut text = format!(
                "Endpoint=sb://{client_addr}/;SharedAccessKeyName={};SharedAccessKey={key}",
                rule.name
            );
            if let RuleScope::Hub(hub) = scope {
                text.push_str(&format!(";EntityPath={hub}"));
            }
            text
        };
        RuleKeys {
            primary_connection_string: connection_string(&rule.primary_key),
            secondary_connection_string: connection_string(&rule.secondary_key),
            rule: rule.clone(),
        }
    }
}

/// An empty hub name means the namespace.
fn rule_scope(hub: &str) -> RuleScope {
    if hub.is_empty() {
        RuleScope::Namespace
    } else {
        RuleScope::Hub(hub.to_owned())
    }
}

fn auth_scope(scope: &RuleScope) -> Scope<'_> {
    match scope {
        RuleScope::Namespace => Scope::Namespace,
        RuleScope::Hub(hub) => Scope::Hub(hub),
    }
}

fn parse_rights(names: &[String]) -> Result<Rights, Error> {
    let mut rights = Rights::NONE;
    for name in names {
        let parsed: Rights = name
            .parse()
            .map_err(|e: RightsParseError| Error::invalid(e.to_string()))?;
        rights = rights.union(parsed);
    }
    Ok(rights)
}
