//! Checking a call's shared access signature (`--auth sas`): every [`Service`](crate::Service) call checks
//! the [`Credential`] its front end presents first, naming the scope it acts on and the
//! rights it needs.
//!
//! The resource a token must cover is `sb://<host>/<hub>` (hub operations) or
//! `sb://<host>/` (namespace operations), where the host is the one the token's own `sr`
//! names: any node's address, or a load balancer's, serves the same namespace, so the host
//! is not checked. The rules consulted are the namespace's and those of the hub the token's
//! resource names (if it names one): so a hub rule's token used on another hub, or on the
//! namespace, is refused as being for another resource (UNAUTHORIZED), and only the
//! namespace's rules and the target hub's own can ever grant an operation on it.
//!

use std::sync::Arc;

use tributary_types::sas::{SignedRequest, verify_signed};
use tributary_types::{AuthError, Rights, parse_token, verify};

use crate::cluster::ClusterRuntime;
use crate::error::{Error, ErrorKind};

/// What a front end presents for a call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Credential {
    /// Nothing: refused unless authorization is off.
    #[default]
    None,
    /// A shared access signature token, `SharedAccessSignature sr=...&sig=...&se=...&skn=...`.
    SasToken(String),
    /// A request signed with a rule's key as Azure Storage signs (Shared Key, account SAS):
    /// the Blob checkpoint endpoint's. It grants the rule's rights wherever the rule applies
    /// (a namespace rule everywhere, a hub rule on its hub).
    Signed(SignedRequest),
}

/// What an operation acts on.
#[derive(Debug, Clone, Copy)]
pub enum Scope<'a> {
    /// The whole namespace (cluster): creating and listing hubs, cluster operations,
    /// namespace rules, diagnostics.
    Namespace,
    /// One event hub.
    Hub(&'a str),
    /// An entity within a hub, such as `consumergroups/$Default/partitions/0`: a token for
    /// the hub or for any path above the entity (a consumer group, as the Azure SDKs'
    /// consumers present) covers it.
    HubPath(&'a str, &'a str),
}

/// The check every call makes. Cheap to clone.
#[derive(Clone)]
pub struct Auth {
    enabled: bool,
    runtime: Arc<ClusterRuntime>,
    clock: Arc<dyn tributary_types::Clock>,
}

impl Auth {
    /// `enabled: false` is `--auth none`: every call passes.
    pub fn new(
        enabled: bool,
        runtime: Arc<ClusterRuntime>,
        clock: Arc<dyn tributary_types::Clock>,
    ) -> Auth {
        metrics::gauge!("tributary_auth_enabled").set(if enabled { 1.0 } else { 0.0 });
        Auth {
            enabled,
            runtime,
            clock,
        }
    }

    /// Whether calls are checked at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Passes when authorization is off, or when the credential grants `needed` on `scope`
    /// now (the node's clock). A missing or invalid token is UNAUTHENTICATED, a valid one
    /// for another resource or without the right UNAUTHORIZED; both with a message saying
    /// what to fix (never the key or signature).
    pub fn check(
        &self,
        credential: &Credential,
        scope: Scope<'_>,
        needed: Rights,
    ) -> Result<(), Error> {
        if !self.enabled {
            return Ok(());
        }
        self.verify(credential, scope, needed).map_err(|refusal| {
            metrics::counter!("tributary_auth_refused_total", "reason" => refusal.label())
                .increment(1);
            refusal.into_error()
        })
    }

    /// What `credential` grants on `scope` now: refused as [`Auth::check`] refuses a token
    /// that is not valid there; otherwise the rights among Send, Listen and Manage it would
    /// pass the check for (every right when authorization is off).
    pub fn granted(&self, credential: &Credential, scope: Scope<'_>) -> Result<Rights, Error> {
        if !self.enabled {
            return Ok(Rights::MANAGE.effective());
        }
        self.check(credential, scope, Rights::NONE)?;
        Ok([Rights::SEND, Rights::LISTEN, Rights::MANAGE]
            .into_iter()
            .filter(|right| self.verify(credential, scope, *right).is_ok())
            .fold(Rights::NONE, Rights::union))
    }

    fn verify(
        &self,
        credential: &Credential,
        scope: Scope<'_>,
        needed: Rights,
    ) -> Result<(), Refusal> {
        let text = match credential {
            Credential::None => return Err(Refusal::Missing),
            Credential::SasToken(text) => text,
            Credential::Signed(request) => return self.verify_signed(request, scope, needed),
        };
        let token = parse_token(text).map_err(|e| Refusal::Auth(e.into()))?;
        let (host, token_hub) = host_and_hub(token.resource());
        let state = self.runtime.state();
        let target = match scope {
            Scope::Namespace => format!("sb://{host}/"),
            Scope::Hub(hub) => format!("sb://{host}/{hub}"),
            Scope::HubPath(hub, path) => format!("sb://{host}/{hub}/{path}"),
        };
        let hub_rules = token_hub
            .and_then(|name| {
                state.hubs.get(name).or_else(|| {
                    state
                        .hubs
                        .values()
                        .find(|hub| hub.name.eq_ignore_ascii_case(name))
                })
            })
            .map_or(&[][..], |hub| hub.rules.as_slice());
        let rules: Vec<_> = state.rules.iter().chain(hub_rules).cloned().collect();
        let now_unix_s = u64::try_from(self.clock.now_ms() / 1000).unwrap_or(0);
        verify(&token, &rules, &target, needed, now_unix_s).map_err(Refusal::Auth)?;
        Ok(())
    }
}

impl Auth {
    /// Whether `credential` is valid for some rule (any hub's or the namespace's), whatever
    /// it grants: for operations that touch no hub (the Blob endpoint's container calls).
    pub fn authenticated(&self, credential: &Credential) -> Result<(), Error> {
        if !self.enabled {
            return Ok(());
        }
        let Credential::Signed(request) = credential else {
            return self.check(credential, Scope::Namespace, Rights::NONE);
        };
        let state = self.runtime.state();
        let rules: Vec<_> = state
            .rules
            .iter()
            .chain(state.hubs.values().flat_map(|hub| hub.rules.iter()))
            .cloned()
            .collect();
        verify_signed(request, &rules, Rights::NONE)
            .map(drop)
            .map_err(|error| {
                let refusal = Refusal::Auth(error);
                metrics::counter!("tributary_auth_refused_total", "reason" => refusal.label())
                    .increment(1);
                refusal.into_error()
            })
    }

    fn verify_signed(
        &self,
        request: &SignedRequest,
        scope: Scope<'_>,
        needed: Rights,
    ) -> Result<(), Refusal> {
        let state = self.runtime.state();
        let hub_rules = match scope {
            Scope::Namespace => &[][..],
            Scope::Hub(hub) | Scope::HubPath(hub, _) => state
                .hubs
                .get(hub)
                .map_or(&[][..], |hub| hub.rules.as_slice()),
        };
        let rules: Vec<_> = state.rules.iter().chain(hub_rules).cloned().collect();
        verify_signed(request, &rules, needed).map_err(Refusal::Auth)?;
        Ok(())
    }
}

/// The host a resource URI names (between the scheme and the first '/') and its first path
/// segment, the hub, when there is one.
fn host_and_hub(resource: &str) -> (&str, Option<&str>) {
    let rest = resource
        .split_once("://")
        .map_or(resource, |(_, rest)| rest);
    let mut parts = rest.split('/');
    let host = parts.next().unwrap_or_default();
    (host, parts.next().filter(|hub| !hub.is_empty()))
}

enum Refusal {
    Missing,
    Auth(AuthError),
}

impl Refusal {
    /// The `reason` label of `tributary_auth_refused_total`.
    fn label(&self) -> &'static str {
        match self {
            Refusal::Missing => "missing",
            Refusal::Auth(AuthError::Malformed(_)) => "malformed",
            Refusal::Auth(AuthError::UnknownRule { .. }) => "unknown_rule",
            Refusal::Auth(AuthError::BadSignature { .. }) => "bad_signature",
            Refusal::Auth(AuthError::Expired { .. }) => "expired",
            Refusal::Auth(AuthError::WrongResource { .. }) => "wrong_resource",
            Refusal::Auth(AuthError::MissingRight { .. }) => "missing_right",
            Refusal::Auth(_) => "other",
        }
    }

    fn into_error(self) -> Error {
        match self {
            Refusal::Missing => Error::new(
                ErrorKind::Unauthenticated,
                "the call carries no shared access signature: connect with a connection \
                 string (--connection-string or TRIBUTARY_CONNECTION_STRING), or send a \
                 token in the `authorization` metadata",
            ),
            Refusal::Auth(
                error @ (AuthError::WrongResource { .. } | AuthError::MissingRight { .. }),
            ) => Error::new(ErrorKind::Unauthorized, error.to_string()),
            Refusal::Auth(error) => Error::new(ErrorKind::Unauthenticated, error.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_hub_come_from_the_resource() {
        assert_eq!(
            host_and_hub("sb://ns.example.net/orders/partitions/0"),
            ("ns.example.net", Some("orders"))
        );
        assert_eq!(host_and_hub("sb://10.0.0.1:7400/"), ("10.0.0.1:7400", None));
        assert_eq!(
            host_and_hub("ns.example.net/orders"),
            ("ns.example.net", Some("orders"))
        );
        assert_eq!(host_and_hub("sb://"), ("", None));
    }
}
