//! Requests signed with a rule's key as Azure Storage signs them: Shared Key
//! (`Authorization: SharedKey account:signature`) and account shared access signatures
//! (`sig=` in the query). The front end builds the string to sign from the request; this
//! checks the signature against the rule the request names. The key is used as Azure uses
//! an account key: base64-decoded, as HMAC-SHA256's key.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::rights::{AuthorizationRule, Rights};
use super::verify::{AuthError, Grant};

/// A request signed with a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedRequest {
    /// The rule (the storage account name of the connection string).
    pub rule: String,
    /// What the client signed, rebuilt from the request.
    pub string_to_sign: String,
    /// The signature as sent, base64.
    pub signature: String,
}

/// The base64 HMAC-SHA256 of `string_to_sign` under `key` (itself base64), as Azure
/// Storage signs; `None` when the key is not base64.
pub fn storage_signature(key: &str, string_to_sign: &str) -> Option<String> {
    let mac = storage_mac(key, string_to_sign)?;
    Some(BASE64.encode(mac.finalize().into_bytes()))
}

fn storage_mac(key: &str, string_to_sign: &str) -> Option<Hmac<Sha256>> {
    let key = BASE64.decode(key).ok()?;
    let mut mac = Hmac::<Sha256>::new_from_slice(&key).expect("HMAC takes any key");
    mac.update(string_to_sign.as_bytes());
    Some(mac)
}

/// Checks a signed request needing `needed`, given the rules that apply where it acts (the
/// namespace's, and the hub's for a hub). Both keys are always checked, in constant time.
pub fn verify_signed(
    request: &SignedRequest,
    rules: &[AuthorizationRule],
    needed: Rights,
) -> Result<Grant, AuthError> {
    let rule = rules
        .iter()
        .find(|rule| rule.name == request.rule)
        .ok_or_else(|| AuthError::UnknownRule {
            rule: request.rule.clone(),
        })?;
    let signature = BASE64.decode(&request.signature).unwrap_or_default();
    let matches = |key: &str| {
        storage_mac(key, &request.string_to_sign)
            .is_some_and(|mac| mac.verify_slice(&signature).is_ok())
    };
    let (primary, secondary) = (matches(&rule.primary_key), matches(&rule.secondary_key));
    if !(primary | secondary) {
        return Err(AuthError::BadSignature {
            rule: rule.name.clone(),
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
        resource: String::new(),
        expiry_unix_s: u64::MAX,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Azurite's well-known development key, which the recorded request below was signed with.
    const EMULATOR_KEY: &str =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

    fn rule(rights: Rights) -> AuthorizationRule {
        AuthorizationRule {
            name: "devstoreaccount1".into(),
            primary_key: "AAAA".into(),
            secondary_key: EMULATOR_KEY.into(),
            rights,
        }
    }

    #[test]
    fn either_key_verifies_and_rights_are_checked() {
        let string_to_sign = "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:Fri, 27 Nov 2026 01:45:18 GMT\n/devstoreaccount1/devstoreaccount1/checkpoints\nrestype:container";
        let signature = storage_signature(EMULATOR_KEY, string_to_sign).unwrap();
        let request = SignedRequest {
            rule: "devstoreaccount1".into(),
            string_to_sign: string_to_sign.into(),
            signature,
        };
        let grant = verify_signed(&request, &[rule(Rights::LISTEN)], Rights::LISTEN).unwrap();
        assert_eq!(grant.rule, "devstoreaccount1");
        let err = verify_signed(&request, &[rule(Rights::SEND)], Rights::LISTEN).unwrap_err();
        assert!(matches!(err, AuthError::MissingRight { .. }), "{err}");
        let tampered = SignedRequest {
            string_to_sign: format!("{string_to_sign}x"),
            ..request.clone()
        };
        let err = verify_signed(&tampered, &[rule(Rights::LISTEN)], Rights::LISTEN).unwrap_err();
        assert!(matches!(err, AuthError::BadSignature { .. }), "{err}");
        let other = SignedRequest {
            rule: "someone".into(),
            ..request
        };
        let err = verify_signed(&other, &[rule(Rights::LISTEN)], Rights::LISTEN).unwrap_err();
        assert!(matches!(err, AuthError::UnknownRule { .. }), "{err}");
        assert_eq!(storage_signature("not base64!", "x"), None);
    }
}
