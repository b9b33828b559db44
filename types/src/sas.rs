//! Shared access signatures (SPEC.md section 6): authorization rules and their rights,
//! signing and parsing tokens, deciding what a token grants, and connection strings.
//!
//! Pure functions: the caller passes the rules that apply and the current time.

mod connection_string;
mod rights;
mod signed;
mod token;
mod verify;

pub use connection_string::{ConnectionString, ConnectionStringError, Credential};
pub use rights::{AuthorizationRule, Rights, RightsParseError};
pub use signed::{SignedRequest, storage_signature, verify_signed};
pub use token::{SasToken, TOKEN_PREFIX, TokenError, parse_token, sign, url_encode};
pub use verify::{AuthError, Grant, authorize, verify};

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    fn rule(name: &str, key: &str) -> AuthorizationRule {
        AuthorizationRule {
            name: name.to_owned(),
            primary_key: key.to_owned(),
            secondary_key: format!("{key}-secondary"),
            rights: Rights::SEND,
        }
    }

    proptest! {
        #[test]
        fn parse_token_never_panics_on_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_token(&text);
            let _ = parse_token(&format!("{TOKEN_PREFIX}{text}"));
        }

        #[test]
        fn parse_token_never_panics_on_token_like_text(
            text in "SharedAccessSignature ((sr|sig|se|skn|SR|x)(=[a-zA-Z0-9%+/&=~.é-]{0,12})?&?){0,6}"
        ) {
            let _ = parse_token(&text);
        }

        #[test]
        fn connection_string_parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let text = String::from_utf8_lossy(&bytes);
            let _ = ConnectionString::parse(&text);
        }

        #[test]
        fn connection_string_parse_never_panics_on_likely_text(
            text in "((Endpoint|SharedAccessKeyName|SharedAccessKey|SharedAccessSignature|EntityPath|UseDevelopmentEmulator|x)(=[a-z:/.;=0-9]{0,10})?;?){0,6}"
        ) {
            if let Ok(parsed) = ConnectionString::parse(&text) {
                let shown = parsed.to_string();
                prop_assert!(ConnectionString::parse(&shown).is_ok(), "{}", shown);
                let _ = parsed.token_for(&parsed.resource_uri(parsed.entity_path()), 60, 0);
            }
        }

        #[test]
        fn sign_parse_verify_round_trips(
            uri in "\\PC{1,60}",
            name in "\\PC{1,20}",
            key in "\\PC{0,40}",
            lifetime_s in 1u64..1_000_000,
            now_unix_s in 0u64..4_000_000_000,
        ) {
            let expiry = now_unix_s + lifetime_s;
            let text = sign(&uri, &name, &key, expiry);
            let token = parse_token(&text).unwrap();
            prop_assert_eq!(token.resource(), uri.as_str());
            prop_assert_eq!(token.key_name(), name.as_str());
            prop_assert_eq!(token.expiry_unix_s(), expiry);
            let rules = [rule("other", "x"), rule(&name, &key)];
            // A URI with no host after its scheme covers nothing; every other is covered.
            match verify(&token, &rules, &uri, Rights::SEND, now_unix_s) {
                Ok(grant) => prop_assert_eq!(grant.rule, name.clone()),
                Err(AuthError::WrongResource { .. }) => {
                    let rest = uri.split_once("://").map_or(uri.as_str(), |(_, rest)| rest);
                    prop_assert!(rest.trim_end_matches('/').is_empty(), "{}", uri);
                }
                Err(other) => prop_assert!(false, "{}", other),
            }
            let rotated = [rule(&name, &format!("{key}-rotated"))];
            prop_assert!(
                matches!(
                    verify(&token, &rotated, &uri, Rights::SEND, now_unix_s),
                    Err(AuthError::BadSignature { .. })
                ),
                "rotated key accepted"
            );
            prop_assert!(
                matches!(verify(&token, &rules, &uri, Rights::SEND, expiry), Err(AuthError::Expired { .. })),
                "expired token accepted"
            );
        }
    }
}
