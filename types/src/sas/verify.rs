//! Deciding whether a token grants an operation on a resource.

use hmac::Mac;

use super::rights::{AuthorizationRule, Rights};
use super::token::{SasToken, TokenError, parse_token, signature_mac};
use crate::time_format::format_rfc3339_ms;

/// What a valid token grants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// The rule whose key signed the token.
    pub rule: String,
    /// The rule's rights, Manage expanded to Send and Listen.
    pub rights: Rights,
    /// The resource the token is for (a prefix of the one asked for).
    pub resource: String,
    /// When the token expires, in seconds since the Unix epoch.
    pub expiry_unix_s: u64,
}

/// Why a token does not grant an operation. Each case says what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AuthError {
    #[error("malformed shared access signature: {0}")]
    Malformed(#[from] TokenError),
    #[error(
        "the token is signed with rule {rule:?}, which is not an authorization rule of this \
         namespace or hub"
    )]
    UnknownRule { rule: String },
    #[error(
        "the token's signature does not match rule {rule:?}'s current keys; the key may have \
         been rotated, or the token was not signed with this rule's key"
    )]
    BadSignature { rule: String },
    #[error(
        "the token expired at {} ({} s ago); sign a new one",
        expiry_text(*expiry_unix_s),
        now_unix_s - expiry_unix_s
    )]
    Expired { expiry_unix_s: u64, now_unix_s: u64 },
    #[error("the token is for {token_resource}, which does not cover {target_resource}")]
    WrongResource {
        token_resource: String,
        target_resource: String,
    },
    #[error("rule {rule:?} grants {granted} but not {missing}, which this operation needs")]
    MissingRight {
        rule: String,
        granted: Rights,
        missing: Rights,
    },
}

fn expiry_text(expiry_unix_s: u64) -> String {
    match i64::try_from(expiry_unix_s) {
        Ok(seconds) if seconds <= i64::MAX / 1000 => format_rfc3339_ms(seconds * 1000),
        _ => format!("{expiry_unix_s} s after 1970"),
    }
}

/// Checks `token` for an operation needing `needed` on `target_resource` at `now_unix_s`,
/// given the rules that apply there (the namespace's and the hub's). In order: the rule
/// exists; the signature, recomputed over the resource and expiry exactly as sent, matches
/// its primary or secondary key (compared in constant time); the token has not expired;
/// its resource, without scheme and case-insensitively, is the target or a path-segment
/// prefix of it (`sb://ns/hub` covers `sb://ns/hub/partitions/0`, not `sb://ns/hub2`); the
/// rule grants `needed`.
pub fn verify(
    token: &SasToken,
    rules: &[AuthorizationRule],
    target_resource: &str,
    needed: Rights,
    now_unix_s: u64,
) -> Result<Grant, AuthError> {
    let rule = rules
        .iter()
        .find(|rule| rule.name == token.key_name())
        .ok_or_else(|| AuthError::UnknownRule {
            rule: token.key_name().to_owned(),
        })?;
    if !signed_by(token, rule) {
        return Err(AuthError::BadSignature {
            rule: rule.name.clone(),
        });
    }
    if token.expiry_unix_s() <= now_unix_s {
        return Err(AuthError::Expired {
            expiry_unix_s: token.expiry_unix_s(),
            now_unix_s,
        });
    }
    if !covers(token.resource(), target_resource) {
        return Err(AuthError::WrongResource {
            token_resource: token.resource().to_owned(),
            target_resource: target_resource.to_owned(),
        });
    }
    if !rule.rights.grants(needed) {
        return Err(AuthError::MissingRight {
            rule: rule.name.clone(),
            granted: rule.rights,
            missing: rule.rights.missing(needed),
        });
    }
    Ok(Grant {
        rule: rule.name.clone(),
        rights: rule.rights.effective(),
        resource: token.resource().to_owned(),
        expiry_unix_s: token.expiry_unix_s(),
    })
}

/// [`parse_token`] then [`verify`].
pub fn authorize(
    token_text: &str,
    rules: &[AuthorizationRule],
    target_resource: &str,
    needed: Rights,
    now_unix_s: u64,
) -> Result<Grant, AuthError> {
    verify(
        &parse_token(token_text)?,
        rules,
        target_resource,
        needed,
        now_unix_s,
    )
}

/// Whether either key of `rule` made the token's signature. Both keys are always checked,
/// so the time taken does not tell which matched.
fn signed_by(token: &SasToken, rule: &AuthorizationRule) -> bool {
    let (resource, expiry) = token.signed_parts();
    let matches = |key: &str| {
        signature_mac(key, resource, expiry)
            .verify_slice(token.signature())
            .is_ok()
    };
    let primary = matches(&rule.primary_key);
    let secondary = matches(&rule.secondary_key);
    primary | secondary
}

/// Whether a token for `granted` covers `target`: scheme dropped, case ignored, trailing
/// `/` ignored, and a match only at a path-segment boundary. A resource with no host covers
/// nothing.
fn covers(granted: &str, target: &str) -> bool {
    let granted = normalize(granted);
    let target = normalize(target);
    !granted.is_empty()
        && target
            .strip_prefix(granted.as_str())
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

fn normalize(uri: &str) -> String {
    let without_scheme = uri.split_once("://").map_or(uri, |(_, rest)| rest);
    without_scheme.trim_end_matches('/').to_lowercase()
}

#[cfg(test)]
mod tests {
    use super::super::sign;
    use super::*;

    const NOW: u64 = 1_700_000_000;
    const HUB: &str = "sb://ns.example.net/orders";

    fn rules() -> Vec<AuthorizationRule> {
        vec![
            AuthorizationRule {
                name: "RootManageSharedAccessKey".into(),
                primary_key: "root-primary".into(),
                secondary_key: "root-secondary".into(),
                rights: Rights::MANAGE,
            },
            AuthorizationRule {
                name: "sender".into(),
                primary_key: "send-primary".into(),
                secondary_key: "send-secondary".into(),
                rights: Rights::SEND,
            },
        ]
    }

    fn check(token: &str, target: &str, needed: Rights) -> Result<Grant, AuthError> {
        authorize(token, &rules(), target, needed, NOW)
    }

    #[test]
    fn accepts_a_valid_token_with_either_key() {
        for key in ["send-primary", "send-secondary"] {
            let token = sign(HUB, "sender", key, NOW + 60);
            let grant = check(&token, HUB, Rights::SEND).unwrap();
            assert_eq!(
                grant,
                Grant {
                    rule: "sender".into(),
                    rights: Rights::SEND,
                    resource: HUB.into(),
                    expiry_unix_s: NOW + 60,
                }
            );
        }
    }

    #[test]
    fn manage_rule_grants_send_and_listen() {
        let token = sign(HUB, "RootManageSharedAccessKey", "root-primary", NOW + 60);
        let grant = check(&token, HUB, Rights::SEND.union(Rights::LISTEN)).unwrap();
        assert_eq!(grant.rights, Rights::MANAGE.effective());
    }

    #[test]
    fn refuses_an_expired_token_saying_when() {
        let token = sign(HUB, "sender", "send-primary", NOW - 90);
        let error = check(&token, HUB, Rights::SEND).unwrap_err();
        assert_eq!(
            error,
            AuthError::Expired {
                expiry_unix_s: NOW - 90,
                now_unix_s: NOW
            }
        );
        assert_eq!(
            error.to_string(),
            "the token expired at 2023-11-14T22:11:50.000Z (90 s ago); sign a new one"
        );
        // Expiring exactly now is expired.
        let token = sign(HUB, "sender", "send-primary", NOW);
        assert!(matches!(
            check(&token, HUB, Rights::SEND),
            Err(AuthError::Expired { .. })
        ));
    }

    #[test]
    fn refuses_a_forged_token() {
        let token = sign(HUB, "sender", "guessed-key", NOW + 60);
        let error = check(&token, HUB, Rights::SEND).unwrap_err();
        assert_eq!(
            error,
            AuthError::BadSignature {
                rule: "sender".into()
            }
        );
        assert!(error.to_string().contains("rotated"), "{error}");
        // Changing any signed part of a real token breaks it: here the expiry.
        let token = sign(HUB, "sender", "send-primary", NOW + 60)
            .replace(&format!("se={}", NOW + 60), &format!("se={}", NOW + 6000));
        assert!(matches!(
            check(&token, HUB, Rights::SEND),
            Err(AuthError::BadSignature { .. })
        ));
    }

    #[test]
    fn refuses_a_token_signed_with_a_rotated_key() {
        let token = sign(HUB, "sender", "send-primary", NOW + 60);
        let mut rotated = rules();
        rotated[1].primary_key = "send-primary-2".into();
        let error = authorize(&token, &rotated, HUB, Rights::SEND, NOW).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the token's signature does not match rule \"sender\"'s current keys; the key \
             may have been rotated, or the token was not signed with this rule's key"
        );
        // The secondary key, not rotated, still works; so does the new primary.
        let token = sign(HUB, "sender", "send-secondary", NOW + 60);
        authorize(&token, &rotated, HUB, Rights::SEND, NOW).unwrap();
        let token = sign(HUB, "sender", "send-primary-2", NOW + 60);
        authorize(&token, &rotated, HUB, Rights::SEND, NOW).unwrap();
    }

    #[test]
    fn refuses_an_unknown_rule() {
        let token = sign(HUB, "listener", "send-primary", NOW + 60);
        let error = check(&token, HUB, Rights::SEND).unwrap_err();
        assert_eq!(
            error,
            AuthError::UnknownRule {
                rule: "listener".into()
            }
        );
        assert!(error.to_string().contains("\"listener\""), "{error}");
    }

    #[test]
    fn refuses_a_token_for_another_resource() {
        let token = sign(HUB, "sender", "send-primary", NOW + 60);
        let error = check(&token, "sb://ns.example.net/orders2", Rights::SEND).unwrap_err();
        assert_eq!(
            error.to_string(),
            "the token is for sb://ns.example.net/orders, which does not cover \
             sb://ns.example.net/orders2"
        );
        for target in ["sb://ns.example.net/", "sb://other.example.net/orders"] {
            assert!(matches!(
                check(&token, target, Rights::SEND),
                Err(AuthError::WrongResource { .. })
            ));
        }
    }

    #[test]
    fn resource_matches_by_prefix_ignoring_scheme_and_case() {
        let namespace = sign("sb://NS.example.net/", "sender", "send-primary", NOW + 60);
        for target in [
            "sb://ns.example.net/orders",
            "amqps://ns.example.net/orders/partitions/0",
            "https://ns.example.net",
        ] {
            check(&namespace, target, Rights::SEND).unwrap();
        }
        let hub = sign(
            "https://ns.example.net/Orders/",
            "sender",
            "send-primary",
            NOW + 60,
        );
        check(
            &hub,
            "sb://ns.example.net/orders/publishers/p1",
            Rights::SEND,
        )
        .unwrap();
        let no_host = sign("sb://", "sender", "send-primary", NOW + 60);
        assert!(matches!(
            check(&no_host, HUB, Rights::SEND),
            Err(AuthError::WrongResource { .. })
        ));
    }

    #[test]
    fn refuses_a_rule_without_the_right() {
        let token = sign(HUB, "sender", "send-primary", NOW + 60);
        let error = check(&token, HUB, Rights::LISTEN).unwrap_err();
        assert_eq!(
            error,
            AuthError::MissingRight {
                rule: "sender".into(),
                granted: Rights::SEND,
                missing: Rights::LISTEN,
            }
        );
        assert_eq!(
            error.to_string(),
            "rule \"sender\" grants Send but not Listen, which this operation needs"
        );
    }

    #[test]
    fn verifies_over_the_resource_as_sent() {
        // An encoder writing lower-case hex signs different text; the signature is checked
        // over that text, and the decoded resource is the same.
        let sent = "sb%3a%2f%2fns.example.net%2forders";
        let mac = signature_mac("send-primary", sent, "1700000060").finalize();
        use base64::Engine;
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.into_bytes());
        let token = format!(
            "SharedAccessSignature sr={sent}&sig={}&se=1700000060&skn=sender",
            super::super::url_encode(&sig)
        );
        check(&token, HUB, Rights::SEND).unwrap();
    }

    #[test]
    fn malformed_text_is_its_own_error() {
        let error = check("Bearer abc", HUB, Rights::SEND).unwrap_err();
        assert_eq!(error, AuthError::Malformed(TokenError::MissingPrefix));
        assert!(
            error
                .to_string()
                .starts_with("malformed shared access signature: ")
        );
    }
}
