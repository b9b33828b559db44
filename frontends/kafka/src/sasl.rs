//! SASL PLAIN as Event Hubs takes it: user `$ConnectionString` and a connection string as
//! the password, or a namespace rule's name and key. Either becomes a shared access
//! signature the broker checks on every request, as it checks gRPC's.

use tributary_broker::auth::Credential;
use tributary_types::ConnectionString;

/// How long a token made from a PLAIN login lasts (it is made again at each login; key
/// rotation is enforced by the check on every request).
const PLAIN_TOKEN_LIFETIME_S: u64 = 10 * 365 * 24 * 3600;
/// The resource a rule-name login's token names: the namespace, on any host.
const NAMESPACE_RESOURCE: &str = "sb://tributary/";
/// The user name that says the password is a connection string.
pub const CONNECTION_STRING_USER: &str = "$ConnectionString";

/// A PLAIN login: the credential, and the event hub it is limited to (a connection
/// string's `EntityPath`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Login {
    pub credential: Credential,
    pub entity: Option<String>,
}

/// Parses RFC 4616's `authzid NUL authcid NUL passwd` into a login.
pub fn plain_login(auth_bytes: &[u8], now_unix_s: u64) -> Result<Login, String> {
    let text = std::str::from_utf8(auth_bytes)
        .map_err(|_| "the SASL PLAIN message is not UTF-8".to_string())?;
    let mut parts = text.split('\0');
    let (Some(_authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err("the SASL PLAIN message is not 'authzid NUL user NUL password'".into());
    };
    let expiry = now_unix_s + PLAIN_TOKEN_LIFETIME_S;
    if user == CONNECTION_STRING_USER {
        let connection = ConnectionString::parse(password)
            .map_err(|err| format!("the password is not a connection string: {err}"))?;
        let entity = connection.entity_path().map(str::to_owned);
        let resource = match &entity {
            Some(hub) => format!("{NAMESPACE_RESOURCE}{hub}"),
            None => NAMESPACE_RESOURCE.to_owned(),
        };
        let token = connection.token_for(&resource, PLAIN_TOKEN_LIFETIME_S, now_unix_s);
        return Ok(Login {
            credential: Credential::SasToken(token),
            entity,
        });
    }
    if user.is_empty() || password.is_empty() {
        return Err(format!(
            "log in with user '{CONNECTION_STRING_USER}' and a connection string as the \
             password, or with an authorization rule's name and key"
        ));
    }
    Ok(Login {
        credential: Credential::SasToken(tributary_types::sign(
            NAMESPACE_RESOURCE,
            user,
            password,
            expiry,
        )),
        entity: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_types::parse_token;

    fn token(login: &Login) -> tributary_types::SasToken {
        let Credential::SasToken(text) = &login.credential else {
            panic!("a token")
        };
        parse_token(text).unwrap()
    }

    #[test]
    fn a_connection_string_password_signs_with_its_rule_and_hub() {
        let login = plain_login(
            b"\0$ConnectionString\0Endpoint=sb://ns.example.net/;SharedAccessKeyName=app;SharedAccessKey=a2V5;EntityPath=orders",
            1_000,
        )
        .unwrap();
        assert_eq!(login.entity.as_deref(), Some("orders"));
        let token = token(&login);
        assert_eq!(token.key_name(), "app");
        assert!(
            token.resource().ends_with("/orders"),
            "{}",
            token.resource()
        );
        let rule = plain_login(b"\0app\0a2V5", 1_000).unwrap();
        assert_eq!(token_of(&rule), "app");
        assert_eq!(rule.entity, None);
    }

    fn token_of(login: &Login) -> String {
        token(login).key_name().to_string()
    }

    #[test]
    fn malformed_logins_say_what_to_send() {
        for bad in [
            &b"only-one-part"[..],
            b"\0user",
            b"\0\0",
            b"\0$ConnectionString\0nonsense",
            b"\xff\0a\0b",
        ] {
            assert!(plain_login(bad, 0).is_err(), "{bad:?}");
        }
    }
}
