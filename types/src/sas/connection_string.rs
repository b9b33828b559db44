//! Event Hubs connection strings:
//! `Endpoint=sb://<host>/;SharedAccessKeyName=<rule>;SharedAccessKey=<key>[;EntityPath=<hub>]`,
//! or `SharedAccessSignature=<token>` in place of the key, and optionally
//! `UseDevelopmentEmulator=true`.

use std::fmt;

use super::token::sign;
use crate::limits::CONNECTION_STRING_BYTES_MAX;

/// How a client proves who it is.
#[derive(Clone, PartialEq, Eq)]
pub enum Credential {
    /// A rule's name and key: the client signs its own tokens, and renews them.
    SharedAccessKey { key_name: String, key: String },
    /// A token signed elsewhere, used as is until it expires.
    SharedAccessSignature(String),
}

/// Never shows the key or the token.
impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credential::SharedAccessKey { key_name, .. } => f
                .debug_struct("SharedAccessKey")
                .field("key_name", key_name)
                .field("key", &"<redacted>")
                .finish(),
            Credential::SharedAccessSignature(_) => f
                .debug_tuple("SharedAccessSignature")
                .field(&"<redacted>")
                .finish(),
        }
    }
}

/// A parsed connection string.
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionString {
    endpoint: String,
    host: String,
    credential: Credential,
    entity_path: Option<String>,
    use_development_emulator: bool,
}

/// Why a connection string was refused. Messages never quote a key or token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionStringError {
    #[error("the connection string is {bytes} bytes long, over the limit of {max} bytes")]
    TooLong { bytes: usize, max: usize },
    #[error(
        "the connection string is empty: expected \
         Endpoint=sb://<host>/;SharedAccessKeyName=<rule>;SharedAccessKey=<key>"
    )]
    Empty,
    #[error("part {position} of the connection string is not Key=Value with both present")]
    NotKeyValue { position: usize },
    #[error("the connection string has {0} more than once")]
    DuplicateKey(String),
    #[error("the connection string has no Endpoint=sb://<host>/")]
    MissingEndpoint,
    #[error("the connection string's Endpoint {0:?} has no host: expected sb://<host>/")]
    BadEndpoint(String),
    #[error(
        "the connection string has {present} without {missing}: give both, or \
         SharedAccessSignature instead"
    )]
    IncompleteKey {
        present: &'static str,
        missing: &'static str,
    },
    #[error(
        "the connection string has neither SharedAccessKeyName and SharedAccessKey nor \
         SharedAccessSignature"
    )]
    NoCredential,
    #[error(
        "the connection string has both SharedAccessKey and SharedAccessSignature: give only one"
    )]
    BothCredentials,
    #[error("UseDevelopmentEmulator must be true or false, not {0:?}")]
    BadEmulatorFlag(String),
}

impl ConnectionString {
    /// Parses `Key=Value` pairs separated by `;` (a trailing `;` allowed). Keys are matched
    /// case-insensitively, unknown keys ignored, as the SDKs do; a key given twice is an
    /// error.
    pub fn parse(text: &str) -> Result<ConnectionString, ConnectionStringError> {
        if text.len() > CONNECTION_STRING_BYTES_MAX {
            return Err(ConnectionStringError::TooLong {
                bytes: text.len(),
                max: CONNECTION_STRING_BYTES_MAX,
            });
        }
        let body = text.trim().trim_end_matches(';');
        if body.is_empty() {
            return Err(ConnectionStringError::Empty);
        }
        let mut fields = Fields::default();
        for (index, part) in body.split(';').enumerate() {
            let not_key_value = ConnectionStringError::NotKeyValue {
                position: index + 1,
            };
            let (key, value) = part.split_once('=').ok_or(not_key_value.clone())?;
            let (key, value) = (key.trim(), value.trim());
            if key.is_empty() || value.is_empty() {
                return Err(not_key_value);
            }
            fields.set(key, value)?;
        }
        fields.into_connection_string()
    }

    /// The endpoint as written (`sb://<host>/`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The endpoint's host, with its port if it has one.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The host without a port: what token resources name.
    pub fn host_name(&self) -> &str {
        match self.host.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|byte| byte.is_ascii_digit()) => name,
            _ => &self.host,
        }
    }

    /// The hub (`EntityPath`), when the string names one.
    pub fn entity_path(&self) -> Option<&str> {
        self.entity_path.as_deref()
    }

    /// The key or token.
    pub fn credential(&self) -> &Credential {
        &self.credential
    }

    /// Whether `UseDevelopmentEmulator=true`: plain AMQP, no TLS.
    pub fn use_development_emulator(&self) -> bool {
        self.use_development_emulator
    }

    /// The resource URI a token for `hub` names, as the SDKs write it: `sb://<host>/<hub>`
    /// (host without port); the namespace `sb://<host>/` when `hub` is `None`.
    pub fn resource_uri(&self, hub: Option<&str>) -> String {
        format!("sb://{}/{}", self.host_name(), hub.unwrap_or(""))
    }

    /// A token for `resource_uri` valid for `lifetime_s` seconds from `now_unix_s`, signed
    /// with the key; a connection string with a `SharedAccessSignature` gives that token as
    /// it is, whatever resource and lifetime are asked.
    pub fn token_for(&self, resource_uri: &str, lifetime_s: u64, now_unix_s: u64) -> String {
        match &self.credential {
            Credential::SharedAccessKey { key_name, key } => sign(
                resource_uri,
                key_name,
                key,
                now_unix_s.saturating_add(lifetime_s),
            ),
            Credential::SharedAccessSignature(token) => token.clone(),
        }
    }
}

/// The connection string with the key or token shown as `<redacted>`.
impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Endpoint={}", self.endpoint)?;
        match &self.credential {
            Credential::SharedAccessKey { key_name, .. } => write!(
                f,
                ";SharedAccessKeyName={key_name};SharedAccessKey=<redacted>"
            )?,
            Credential::SharedAccessSignature(_) => {
                f.write_str(";SharedAccessSignature=<redacted>")?
            }
        }
        if let Some(hub) = &self.entity_path {
            write!(f, ";EntityPath={hub}")?;
        }
        if self.use_development_emulator {
            f.write_str(";UseDevelopmentEmulator=true")?;
        }
        Ok(())
    }
}

/// Same as `Display`: never shows the key.
impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConnectionString({self})")
    }
}

#[derive(Default)]
struct Fields<'a> {
    endpoint: Option<&'a str>,
    key_name: Option<&'a str>,
    key: Option<&'a str>,
    signature: Option<&'a str>,
    entity_path: Option<&'a str>,
    emulator: Option<&'a str>,
}

impl<'a> Fields<'a> {
    fn set(&mut self, key: &str, value: &'a str) -> Result<(), ConnectionStringError> {
        let (slot, name) = match key.to_ascii_lowercase().as_str() {
            "endpoint" => (&mut self.endpoint, "Endpoint"),
            "sharedaccesskeyname" => (&mut self.key_name, "SharedAccessKeyName"),
            "sharedaccesskey" => (&mut self.key, "SharedAccessKey"),
            "sharedaccesssignature" => (&mut self.signature, "SharedAccessSignature"),
            "entitypath" => (&mut self.entity_path, "EntityPath"),
            "usedevelopmentemulator" => (&mut self.emulator, "UseDevelopmentEmulator"),
            _ => return Ok(()),
        };
        match slot.replace(value) {
            Some(_) => Err(ConnectionStringError::DuplicateKey(name.to_owned())),
            None => Ok(()),
        }
    }

    fn into_connection_string(self) -> Result<ConnectionString, ConnectionStringError> {
        let endpoint = self
            .endpoint
            .ok_or(ConnectionStringError::MissingEndpoint)?;
        let host = endpoint
            .split_once("://")
            .map(|(_, rest)| rest.split('/').next().unwrap_or("").trim())
            .filter(|host| !host.is_empty())
            .ok_or_else(|| ConnectionStringError::BadEndpoint(endpoint.to_owned()))?;
        let credential = match (self.key_name, self.key, self.signature) {
            (Some(_), Some(_), Some(_)) => return Err(ConnectionStringError::BothCredentials),
            (Some(key_name), Some(key), None) => Credential::SharedAccessKey {
                key_name: key_name.to_owned(),
                key: key.to_owned(),
            },
            (Some(_), None, _) => {
                return Err(ConnectionStringError::IncompleteKey {
                    present: "SharedAccessKeyName",
                    missing: "SharedAccessKey",
                });
            }
            (None, Some(_), _) => {
                return Err(ConnectionStringError::IncompleteKey {
                    present: "SharedAccessKey",
                    missing: "SharedAccessKeyName",
                });
            }
            (None, None, Some(token)) => Credential::SharedAccessSignature(token.to_owned()),
            (None, None, None) => return Err(ConnectionStringError::NoCredential),
        };
        let use_development_emulator = match self.emulator {
            None => false,
            Some(flag) if flag.eq_ignore_ascii_case("true") => true,
            Some(flag) if flag.eq_ignore_ascii_case("false") => false,
            Some(flag) => return Err(ConnectionStringError::BadEmulatorFlag(flag.to_owned())),
        };
        Ok(ConnectionString {
            endpoint: endpoint.to_owned(),
            host: host.to_owned(),
            credential,
            entity_path: self.entity_path.map(str::to_owned),
            use_development_emulator,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{AuthorizationRule, Rights, authorize};
    use super::*;

    const KEYED: &str = "Endpoint=sb://ns.example.net/;SharedAccessKeyName=RootManageSharedAccessKey;\
                         SharedAccessKey=c2VjcmV0LWtleQ==;EntityPath=orders";

    #[test]
    fn parses_a_keyed_string() {
        let parsed = ConnectionString::parse(KEYED).unwrap();
        assert_eq!(parsed.endpoint(), "sb://ns.example.net/");
        assert_eq!(parsed.host(), "ns.example.net");
        assert_eq!(parsed.entity_path(), Some("orders"));
        assert!(!parsed.use_development_emulator());
        assert_eq!(
            parsed.credential(),
            &Credential::SharedAccessKey {
                key_name: "RootManageSharedAccessKey".into(),
                key: "c2VjcmV0LWtleQ==".into(),
            }
        );
        assert_eq!(
            parsed.resource_uri(Some("orders")),
            "sb://ns.example.net/orders"
        );
        assert_eq!(parsed.resource_uri(None), "sb://ns.example.net/");
    }

    #[test]
    fn keys_are_case_insensitive_and_unknown_keys_ignored() {
        let parsed = ConnectionString::parse(
            " endpoint=sb://localhost:5672;sharedaccesskeyname=r;SHAREDACCESSKEY=k;\
             usedevelopmentemulator=TRUE;TransportType=Amqp; ",
        )
        .unwrap();
        assert!(parsed.use_development_emulator());
        assert_eq!(parsed.host(), "localhost:5672");
        assert_eq!(parsed.host_name(), "localhost");
        assert_eq!(parsed.resource_uri(Some("hub")), "sb://localhost/hub");
        assert_eq!(parsed.entity_path(), None);
    }

    #[test]
    fn parses_a_signature_string() {
        let token = super::super::sign("sb://ns.example.net/orders", "r", "k", 99);
        let parsed = ConnectionString::parse(&format!(
            "Endpoint=sb://ns.example.net/;SharedAccessSignature={token}"
        ))
        .unwrap();
        assert_eq!(
            parsed.credential(),
            &Credential::SharedAccessSignature(token.clone())
        );
        assert_eq!(parsed.token_for("sb://anything/", 60, 0), token);
        assert_eq!(
            parsed.to_string(),
            "Endpoint=sb://ns.example.net/;SharedAccessSignature=<redacted>"
        );
    }

    #[test]
    fn display_and_debug_never_show_the_key() {
        let parsed = ConnectionString::parse(KEYED).unwrap();
        let shown = parsed.to_string();
        assert_eq!(
            shown,
            "Endpoint=sb://ns.example.net/;SharedAccessKeyName=RootManageSharedAccessKey;\
             SharedAccessKey=<redacted>;EntityPath=orders"
        );
        let debug = format!("{parsed:?} {:?}", parsed.credential());
        assert!(!debug.contains("c2VjcmV0"), "{debug}");
    }

    #[test]
    fn builds_tokens_the_rule_accepts() {
        let parsed = ConnectionString::parse(KEYED).unwrap();
        let resource = parsed.resource_uri(parsed.entity_path());
        let token = parsed.token_for(&resource, 3600, 1_000);
        let rules = [AuthorizationRule {
            name: "RootManageSharedAccessKey".into(),
            primary_key: "c2VjcmV0LWtleQ==".into(),
            secondary_key: "other".into(),
            rights: Rights::MANAGE,
        }];
        let grant = authorize(&token, &rules, &resource, Rights::SEND, 1_000).unwrap();
        assert_eq!(grant.expiry_unix_s, 4_600);
    }

    #[test]
    fn refuses_each_malformation_clearly() {
        use ConnectionStringError as E;
        let cases: &[(&str, E)] = &[
            ("", E::Empty),
            (" ; ", E::Empty),
            (
                "Endpoint=sb://h/;;SharedAccessKeyName=r",
                E::NotKeyValue { position: 2 },
            ),
            ("Endpoint", E::NotKeyValue { position: 1 }),
            ("Endpoint=", E::NotKeyValue { position: 1 }),
            (
                "SharedAccessKeyName=r;SharedAccessKey=k",
                E::MissingEndpoint,
            ),
            (
                "Endpoint=ns.example.net;SharedAccessKeyName=r;SharedAccessKey=k",
                E::BadEndpoint("ns.example.net".into()),
            ),
            (
                "Endpoint=sb:///;SharedAccessKeyName=r;SharedAccessKey=k",
                E::BadEndpoint("sb:///".into()),
            ),
            (
                "Endpoint=sb://h/;endpoint=sb://g/",
                E::DuplicateKey("Endpoint".into()),
            ),
            (
                "Endpoint=sb://h/;SharedAccessKeyName=r",
                E::IncompleteKey {
                    present: "SharedAccessKeyName",
                    missing: "SharedAccessKey",
                },
            ),
            (
                "Endpoint=sb://h/;SharedAccessKey=k",
                E::IncompleteKey {
                    present: "SharedAccessKey",
                    missing: "SharedAccessKeyName",
                },
            ),
            ("Endpoint=sb://h/", E::NoCredential),
            (
                "Endpoint=sb://h/;SharedAccessKeyName=r;SharedAccessKey=k;SharedAccessSignature=t",
                E::BothCredentials,
            ),
            (
                "Endpoint=sb://h/;SharedAccessKeyName=r;SharedAccessKey=k;UseDevelopmentEmulator=yes",
                E::BadEmulatorFlag("yes".into()),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(
                ConnectionString::parse(text).unwrap_err(),
                *expected,
                "{text}"
            );
        }
        let long = format!("Endpoint=sb://{}/", "h".repeat(CONNECTION_STRING_BYTES_MAX));
        assert!(matches!(
            ConnectionString::parse(&long),
            Err(E::TooLong { .. })
        ));
        // Errors name keys, never values that may be secrets.
        let error =
            ConnectionString::parse("Endpoint=sb://h/;SharedAccessKey=hunter2").unwrap_err();
        assert!(!error.to_string().contains("hunter2"), "{error}");
    }
}
