//! Shared access signatures on every call: the client signs a token with its connection
//! string's key (or sends the token the string gives), caches it, and signs a new one
//! before it expires. [`Authorizer`] is the tonic interceptor over every channel.

use std::sync::{Arc, Mutex};

use tonic::metadata::MetadataValue;
use tributary_types::{ConnectionString, Credential};

use crate::ClientError;

/// How long a token the client signs is valid.
pub const TOKEN_LIFETIME_S: u64 = 3600;
/// A cached token with less than this left is replaced by a new one.
pub const TOKEN_RENEW_BEFORE_S: u64 = 300;
/// The gRPC metadata key carrying the token.
const AUTHORIZATION_METADATA: &str = "authorization";

/// Seconds since the Unix epoch; injected so tests can step time.
pub type UnixClock = Arc<dyn Fn() -> u64 + Send + Sync>;

/// The machine's clock.
pub fn system_clock() -> UnixClock {
    Arc::new(|| u64::try_from(crate::time::now_ms() / 1000).unwrap_or(0))
}

/// Makes the token each call carries: for the connection string's resource
/// (`sb://<host>/<EntityPath>`, or the namespace `sb://<host>/` without one).
pub struct TokenSource {
    connection_string: ConnectionString,
    resource_uri: String,
    clock: UnixClock,
    /// The token last made and when it expires.
    cached: Mutex<Option<(String, u64)>>,
}

impl TokenSource {
    pub fn new(connection_string: ConnectionString, clock: UnixClock) -> TokenSource {
        let resource_uri = connection_string.resource_uri(connection_string.entity_path());
        TokenSource {
            connection_string,
            resource_uri,
            clock,
            cached: Mutex::new(None),
        }
    }

    /// The token to send now: the cached one while more than [`TOKEN_RENEW_BEFORE_S`] of
    /// it is left, else a new one valid for [`TOKEN_LIFETIME_S`]. A connection string's own
    /// `SharedAccessSignature` is sent as it is.
    pub fn token(&self) -> String {
        let now = (self.clock)();
        let mut cached = self.cached.lock().expect("token cache lock");
        if let Some((token, expiry)) = cached.as_ref()
            && expiry.saturating_sub(now) > TOKEN_RENEW_BEFORE_S
        {
            return token.clone();
        }
        let token = self
            .connection_string
            .token_for(&self.resource_uri, TOKEN_LIFETIME_S, now);
        match self.connection_string.credential() {
            Credential::SharedAccessKey { .. } => {
                *cached = Some((token.clone(), now + TOKEN_LIFETIME_S));
            }
            // Never renewed: nothing to cache.
            Credential::SharedAccessSignature(_) => {}
        }
        token
    }
}

/// Adds the `authorization` metadata to every call when the client has a credential.
#[derive(Clone, Default)]
pub struct Authorizer {
    source: Option<Arc<TokenSource>>,
}

impl Authorizer {
    /// Sends no token (nodes running with `--auth none`).
    pub fn none() -> Authorizer {
        Authorizer { source: None }
    }

    pub fn new(source: TokenSource) -> Authorizer {
        Authorizer {
            source: Some(Arc::new(source)),
        }
    }

    /// The token calls carry now (`None` without a credential).
    pub(crate) fn token(&self) -> Option<String> {
        self.source.as_ref().map(|source| source.token())
    }
}

/// Never shows the credential.
impl std::fmt::Debug for Authorizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            None => f.write_str("Authorizer(none)"),
            Some(source) => write!(f, "Authorizer({})", source.resource_uri),
        }
    }
}

impl tonic::service::Interceptor for Authorizer {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = self.token() {
            let value = MetadataValue::try_from(token).map_err(|_| {
                tonic::Status::invalid_argument(
                    "the shared access signature has characters that cannot go in a header",
                )
            })?;
            request.metadata_mut().insert(AUTHORIZATION_METADATA, value);
        }
        Ok(request)
    }
}

/// Whether an `sb://` endpoint is reached without TLS.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Transport {
    /// TLS (`https://`) unless the connection string says `UseDevelopmentEmulator=true`.
    #[default]
    Tls,
    /// Plain HTTP/2 (`http://`), for nodes that serve no TLS.
    Plaintext,
}

/// The URL a connection string's endpoint is reached at: `sb://host[:port]/` becomes
/// `https://host:port` (`http://` with `UseDevelopmentEmulator=true` or
/// [`Transport::Plaintext`]), port 7400 when none is given; `http://` and `https://`
/// endpoints are taken as written. The one place that decides the scheme.
pub fn endpoint_url(
    connection_string: &ConnectionString,
    transport: Transport,
) -> Result<String, ClientError> {
    let endpoint = connection_string.endpoint().trim_end_matches('/');
    let (scheme, _) = endpoint.split_once("://").unwrap_or(("sb", endpoint));
    match scheme.to_ascii_lowercase().as_str() {
        "http" | "https" => Ok(endpoint.to_owned()),
        "sb" | "amqps" => {
            let plaintext =
                transport == Transport::Plaintext || connection_string.use_development_emulator();
            let scheme = if plaintext { "http" } else { "https" };
            let host = connection_string.host();
            if host.contains(':') && !host.ends_with(']') {
                Ok(format!("{scheme}://{host}"))
            } else {
                Ok(format!("{scheme}://{host}:{DEFAULT_PORT}"))
            }
        }
        other => Err(ClientError::InvalidArgument(format!(
            "the connection string's endpoint has scheme '{other}': expected sb://, http:// or \
             https://"
        ))),
    }
}

/// The client port when an `sb://` endpoint names none.
pub const DEFAULT_PORT: u16 = 7400;

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use tributary_types::{Rights, authorize, sas::AuthorizationRule};

    use super::*;

    fn parse(text: &str) -> ConnectionString {
        ConnectionString::parse(text).unwrap()
    }

    #[test]
    fn endpoint_scheme_follows_the_transport_and_the_emulator_flag() {
        let key = ";SharedAccessKeyName=a;SharedAccessKey=k";
        let url = |endpoint: &str, transport| {
            endpoint_url(&parse(&format!("Endpoint={endpoint}{key}")), transport).unwrap()
        };
        assert_eq!(
            url("sb://ns.example.net/", Transport::Tls),
            "https://ns.example.net:7400"
        );
        assert_eq!(
            url("sb://10.0.0.1:7410/", Transport::Plaintext),
            "http://10.0.0.1:7410"
        );
        assert_eq!(
            endpoint_url(
                &parse(&format!(
                    "Endpoint=sb://h/{key};UseDevelopmentEmulator=true"
                )),
                Transport::Tls
            )
            .unwrap(),
            "http://h:7400"
        );
        assert_eq!(url("http://h:1234/", Transport::Tls), "http://h:1234");
        assert_eq!(
            url("https://h:1234", Transport::Plaintext),
            "https://h:1234"
        );
    }

    #[test]
    fn tokens_are_cached_and_renewed_before_they_expire() {
        let now = Arc::new(AtomicU64::new(1_700_000_000));
        let clock: UnixClock = {
            let now = now.clone();
            Arc::new(move || now.load(Ordering::SeqCst))
        };
        let source = TokenSource::new(
            parse(
                "Endpoint=sb://ns.example.net/;SharedAccessKeyName=app;SharedAccessKey=k;EntityPath=orders",
            ),
            clock,
        );
        let first = source.token();
        let rule = AuthorizationRule {
            name: "app".into(),
            primary_key: "k".into(),
            secondary_key: "other".into(),
            rights: Rights::SEND,
        };
        let grant = authorize(
            &first,
            std::slice::from_ref(&rule),
            "sb://ns.example.net/orders",
            Rights::SEND,
            1_700_000_000,
        )
        .unwrap();
        assert_eq!(grant.expiry_unix_s, 1_700_000_000 + TOKEN_LIFETIME_S);
        // Still more than five minutes left: the same token.
        now.fetch_add(
            TOKEN_LIFETIME_S - TOKEN_RENEW_BEFORE_S - 1,
            Ordering::SeqCst,
        );
        assert_eq!(source.token(), first);
        // Five minutes or less left: a new one, valid for an hour from now.
        now.fetch_add(1, Ordering::SeqCst);
        let renewed = source.token();
        assert_ne!(renewed, first);
        let at = now.load(Ordering::SeqCst);
        let grant = authorize(
            &renewed,
            &[rule],
            "sb://ns.example.net/orders",
            Rights::SEND,
            at,
        )
        .unwrap();
        assert_eq!(grant.expiry_unix_s, at + TOKEN_LIFETIME_S);
    }

    #[test]
    fn a_given_signature_is_sent_as_it_is() {
        let source = TokenSource::new(
            parse(
                "Endpoint=sb://h/;SharedAccessSignature=SharedAccessSignature sr=x&sig=y&se=1&skn=z",
            ),
            Arc::new(|| 5),
        );
        assert_eq!(
            source.token(),
            "SharedAccessSignature sr=x&sig=y&se=1&skn=z"
        );
    }

    #[test]
    fn debug_never_shows_the_key() {
        let authorizer = Authorizer::new(TokenSource::new(
            parse("Endpoint=sb://h/;SharedAccessKeyName=a;SharedAccessKey=secret-key"),
            system_clock(),
        ));
        let shown = format!("{authorizer:?}");
        assert!(!shown.contains("secret"), "{shown}");
    }
}
