//! The token text: signing and parsing
//! `SharedAccessSignature sr=<resource>&sig=<signature>&se=<expiry>&skn=<rule>`.

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use sha2::Sha256;

use crate::limits::SAS_TOKEN_BYTES_MAX;

/// What every token starts with.
pub const TOKEN_PREFIX: &str = "SharedAccessSignature ";

/// Bytes the URL encoding leaves as they are: letters, digits and `_.-~`, as Python's
/// `quote_plus` (which the Event Hubs Python SDK uses); space becomes `+`, every other byte
/// of the UTF-8 text `%XX` with upper-case hex.
const URL_ENCODE_SET: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~');

/// A signed token for `resource_uri`, exactly as the Event Hubs SDKs make it: the string to
/// sign is the URL-encoded resource, a newline and the expiry in decimal seconds; the HMAC
/// key is the UTF-8 text of `key` (not base64-decoded); fields in the order `sr`, `sig`,
/// `se`, `skn`, the resource and signature URL-encoded.
pub fn sign(resource_uri: &str, key_name: &str, key: &str, expiry_unix_s: u64) -> String {
    let resource = url_encode(resource_uri);
    let expiry = expiry_unix_s.to_string();
    let signature = BASE64.encode(signature_bytes(key, &resource, &expiry));
    format!(
        "{TOKEN_PREFIX}sr={resource}&sig={}&se={expiry}&skn={}",
        url_encode(&signature),
        url_encode(key_name)
    )
}

/// URL-encodes `text` as the SDKs do for the signed resource (see [`URL_ENCODE_SET`]).
pub fn url_encode(text: &str) -> String {
    // A literal "%20" in `text` is encoded as "%2520", so every "%20" here was a space.
    utf8_percent_encode(text, URL_ENCODE_SET)
        .to_string()
        .replace("%20", "+")
}

/// HMAC-SHA256 of `resource_as_sent + "\n" + expiry_as_sent` under the UTF-8 bytes of `key`.
pub(super) fn signature_mac(
    key: &str,
    resource_as_sent: &str,
    expiry_as_sent: &str,
) -> Hmac<Sha256> {
    let mut mac =
        Hmac::<Sha256>::new_from_slice(key.as_bytes()).expect("HMAC accepts keys of any length");
    mac.update(resource_as_sent.as_bytes());
    mac.update(b"\n");
    mac.update(expiry_as_sent.as_bytes());
    mac
}

fn signature_bytes(key: &str, resource_as_sent: &str, expiry_as_sent: &str) -> Vec<u8> {
    signature_mac(key, resource_as_sent, expiry_as_sent)
        .finalize()
        .into_bytes()
        .to_vec()
}

/// A parsed token. The resource and expiry are kept as sent as well as decoded, because
/// the signature is over the sent text and encoders differ (hex case, `+` or `%20`).
#[derive(Clone, PartialEq, Eq)]
pub struct SasToken {
    resource: String,
    resource_as_sent: String,
    signature: Vec<u8>,
    expiry_unix_s: u64,
    expiry_as_sent: String,
    key_name: String,
}

impl SasToken {
    /// The resource URI the token is for (`sr`, URL-decoded).
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The name of the rule whose key signed it (`skn`, URL-decoded).
    pub fn key_name(&self) -> &str {
        &self.key_name
    }

    /// When it expires (`se`), in seconds since the Unix epoch.
    pub fn expiry_unix_s(&self) -> u64 {
        self.expiry_unix_s
    }

    pub(super) fn signed_parts(&self) -> (&str, &str) {
        (&self.resource_as_sent, &self.expiry_as_sent)
    }

    pub(super) fn signature(&self) -> &[u8] {
        &self.signature
    }
}

/// Shows the resource, rule and expiry, never the signature (a bearer credential).
impl std::fmt::Debug for SasToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SasToken")
            .field("resource", &self.resource)
            .field("key_name", &self.key_name)
            .field("expiry_unix_s", &self.expiry_unix_s)
            .finish_non_exhaustive()
    }
}

/// Why a token's text is not a well-formed shared access signature.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenError {
    #[error("the token is {bytes} bytes long, over the limit of {max} bytes")]
    TooLong { bytes: usize, max: usize },
    #[error(
        "the token does not start with \"SharedAccessSignature \": expected \
         SharedAccessSignature sr=<resource>&sig=<signature>&se=<expiry>&skn=<rule>"
    )]
    MissingPrefix,
    #[error("the token part {0:?} is not field=value")]
    NotFieldValue(String),
    #[error("the token has an unknown field {0:?}: expected sr, sig, se and skn")]
    UnknownField(String),
    #[error("the token has the field {0} more than once")]
    DuplicateField(&'static str),
    #[error("the token has no {0} field ({1})")]
    MissingField(&'static str, &'static str),
    #[error("the token's {0} field is empty")]
    EmptyField(&'static str),
    #[error("the token's {0} field is not UTF-8 text once URL-decoded")]
    NotUtf8(&'static str),
    #[error("the token's expiry se={0:?} is not a whole number of seconds since 1970")]
    BadExpiry(String),
    #[error("the token's signature sig is not base64")]
    SignatureNotBase64,
}

/// Parses a token: the `SharedAccessSignature ` prefix, then `sr`, `sig`, `se` and `skn`
/// once each, in any order (field names case-insensitive), `&`-separated.
pub fn parse_token(text: &str) -> Result<SasToken, TokenError> {
    if text.len() > SAS_TOKEN_BYTES_MAX {
        return Err(TokenError::TooLong {
            bytes: text.len(),
            max: SAS_TOKEN_BYTES_MAX,
        });
    }
    let fields = text
        .strip_prefix(TOKEN_PREFIX)
        .ok_or(TokenError::MissingPrefix)?
        .trim();
    let (mut resource, mut signature, mut expiry, mut key_name) = (None, None, None, None);
    for part in fields.split('&').filter(|part| !part.is_empty()) {
        let (name, value) = part
            .split_once('=')
            .ok_or_else(|| TokenError::NotFieldValue(shorten(part)))?;
        let (slot, field) = match name.to_ascii_lowercase().as_str() {
            "sr" => (&mut resource, "sr"),
            "sig" => (&mut signature, "sig"),
            "se" => (&mut expiry, "se"),
            "skn" => (&mut key_name, "skn"),
            _ => return Err(TokenError::UnknownField(shorten(name))),
        };
        if slot.replace(value).is_some() {
            return Err(TokenError::DuplicateField(field));
        }
        if value.is_empty() {
            return Err(TokenError::EmptyField(field));
        }
    }
    let resource_as_sent =
        resource.ok_or(TokenError::MissingField("sr", "the resource URI it grants"))?;
    let signature = signature.ok_or(TokenError::MissingField("sig", "the signature"))?;
    let expiry_as_sent = expiry.ok_or(TokenError::MissingField("se", "the expiry"))?;
    let key_name = key_name.ok_or(TokenError::MissingField("skn", "the rule's name"))?;

    let expiry_unix_s = parse_expiry(expiry_as_sent)?;
    // Base64 has `+` but no space, so in `sig` a `+` is itself (some encoders leave it).
    let signature = percent_decode_str(signature).collect::<Vec<u8>>();
    let signature = BASE64
        .decode(&signature)
        .map_err(|_| TokenError::SignatureNotBase64)?;
    Ok(SasToken {
        resource: form_decode(resource_as_sent, "sr")?,
        resource_as_sent: resource_as_sent.to_owned(),
        signature,
        expiry_unix_s,
        expiry_as_sent: expiry_as_sent.to_owned(),
        key_name: form_decode(key_name, "skn")?,
    })
}

fn parse_expiry(text: &str) -> Result<u64, TokenError> {
    let bad = || TokenError::BadExpiry(shorten(text));
    if !text.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(bad());
    }
    text.parse().map_err(|_| bad())
}

/// Decodes `quote_plus`-style text: `+` is a space, `%XX` a byte.
fn form_decode(text: &str, field: &'static str) -> Result<String, TokenError> {
    let spaced = text.replace('+', " ");
    percent_decode_str(&spaced)
        .decode_utf8()
        .map(|decoded| decoded.into_owned())
        .map_err(|_| TokenError::NotUtf8(field))
}

/// Quotes at most a few dozen characters of untrusted text in an error.
fn shorten(text: &str) -> String {
    const SHOWN_CHARS_MAX: usize = 40;
    match text.char_indices().nth(SHOWN_CHARS_MAX) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_matches_quote_plus() {
        assert_eq!(
            url_encode("sb://ns.example.net/hub-1_a.b~c"),
            "sb%3A%2F%2Fns.example.net%2Fhub-1_a.b~c"
        );
        assert_eq!(url_encode("a b+c%20/é"), "a+b%2Bc%2520%2F%C3%A9");
    }

    #[test]
    fn signs_a_known_token() {
        // The string to sign is "sb%3A%2F%2Fns.example.net%2Fhub\n1700000000", keyed by the
        // key's UTF-8 text.
        let token = sign(
            "sb://ns.example.net/hub",
            "send-rule",
            "a2V5",
            1_700_000_000,
        );
        let expected_sig = BASE64.encode(signature_bytes(
            "a2V5",
            "sb%3A%2F%2Fns.example.net%2Fhub",
            "1700000000",
        ));
        assert_eq!(
            token,
            format!(
                "SharedAccessSignature sr=sb%3A%2F%2Fns.example.net%2Fhub&sig={}\
                 &se=1700000000&skn=send-rule",
                url_encode(&expected_sig)
            )
        );
        // Not base64-decoded: keys "a2V5" and "key" (its base64 decoding) sign differently.
        assert_ne!(
            token,
            sign("sb://ns.example.net/hub", "send-rule", "key", 1_700_000_000)
        );
    }

    #[test]
    fn parses_fields_in_any_order() {
        let token =
            parse_token("SharedAccessSignature skn=rule&se=42&SIG=AAAA&sr=sb%3a%2F%2Fns%2Fhub+x")
                .unwrap();
        assert_eq!(token.resource(), "sb://ns/hub x");
        assert_eq!(token.key_name(), "rule");
        assert_eq!(token.expiry_unix_s(), 42);
        assert_eq!(token.signed_parts(), ("sb%3a%2F%2Fns%2Fhub+x", "42"));
        assert_eq!(token.signature(), [0, 0, 0]);
    }

    #[test]
    fn a_plus_in_the_signature_is_kept() {
        let token = parse_token("SharedAccessSignature sr=a&sig=+/+/&se=1&skn=r").unwrap();
        assert_eq!(token.signature(), BASE64.decode("+/+/").unwrap());
    }

    #[test]
    fn refuses_each_malformation_clearly() {
        let cases: &[(&str, TokenError)] = &[
            ("sr=a&sig=AAAA&se=1&skn=r", TokenError::MissingPrefix),
            (
                "SharedAccessSignature sr=a&sig=AAAA&se=1&skn=r&x=1",
                TokenError::UnknownField("x".into()),
            ),
            (
                "SharedAccessSignature sr=a&sig=AAAA&se=1&skn=r&sr=b",
                TokenError::DuplicateField("sr"),
            ),
            (
                "SharedAccessSignature sr=a&sig=AAAA&se=1",
                TokenError::MissingField("skn", "the rule's name"),
            ),
            (
                "SharedAccessSignature sr=a&sig=AAAA&se&skn=r",
                TokenError::NotFieldValue("se".into()),
            ),
            (
                "SharedAccessSignature sr=&sig=AAAA&se=1&skn=r",
                TokenError::EmptyField("sr"),
            ),
            (
                "SharedAccessSignature sr=a&sig=AAAA&se=-1&skn=r",
                TokenError::BadExpiry("-1".into()),
            ),
            (
                "SharedAccessSignature sr=a&sig=AAAA&se=99999999999999999999&skn=r",
                TokenError::BadExpiry("99999999999999999999".into()),
            ),
            (
                "SharedAccessSignature sr=a&sig=!!&se=1&skn=r",
                TokenError::SignatureNotBase64,
            ),
            (
                "SharedAccessSignature sr=%FF&sig=AAAA&se=1&skn=r",
                TokenError::NotUtf8("sr"),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_token(text).unwrap_err(), *expected, "{text}");
        }
        let long = format!(
            "SharedAccessSignature sr={}",
            "a".repeat(SAS_TOKEN_BYTES_MAX)
        );
        assert!(matches!(
            parse_token(&long),
            Err(TokenError::TooLong {
                max: SAS_TOKEN_BYTES_MAX,
                ..
            })
        ));
        let message = TokenError::MissingPrefix.to_string();
        assert!(message.contains("SharedAccessSignature sr="), "{message}");
    }

    #[test]
    fn debug_hides_the_signature() {
        let token = parse_token(&sign("sb://ns/hub", "rule", "key", 5)).unwrap();
        let shown = format!("{token:?}");
        assert!(!shown.contains("sig"), "{shown}");
        assert!(shown.contains("sb://ns/hub"), "{shown}");
    }
}
