//! The AMQP connection strings `auth rule keys` prints for the Azure Event Hubs SDKs, made
//! from the host of the endpoint the CLI talks to.

/// The port of a node's plain-text AMQP listener unless it was given another
/// (`--amqp-addr`).
pub(crate) const AMQP_PORT_DEFAULT: u16 = 5672;

/// A rule key's connection strings for the Azure Event Hubs SDKs over AMQP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AmqpConnectionStrings {
    /// Plain text on `host:port`: `UseDevelopmentEmulator=true` makes the SDKs dial that
    /// port without TLS.
    pub(crate) plain_text: String,
    /// TLS: without `UseDevelopmentEmulator` the SDKs dial port 5671 of the host with TLS,
    /// whatever port the string names, so it names none.
    pub(crate) tls: String,
}

impl AmqpConnectionStrings {
    /// The strings for rule `rule` (of `hub`, or of the namespace when `hub` is empty) with
    /// `key`, naming the host of `endpoint` (`http://host:port`, `https://host:port` or
    /// `host:port`).
    pub(crate) fn new(
        endpoint: &str,
        amqp_port: u16,
        rule: &str,
        hub: &str,
        key: &str,
    ) -> AmqpConnectionStrings {
        let host = endpoint_host(endpoint);
        let mut credential = format!("SharedAccessKeyName={rule};SharedAccessKey={key}");
        if !hub.is_empty() {
            credential.push_str(&format!(";EntityPath={hub}"));
        }
        AmqpConnectionStrings {
            plain_text: format!(
                "Endpoint=sb://{host}:{amqp_port}/;{credential};UseDevelopmentEmulator=true"
            ),
            tls: format!("Endpoint=sb://{host}/;{credential}"),
        }
    }
}

/// The host of an endpoint: between the scheme and the port; an IPv6 address keeps its
/// brackets.
pub(crate) fn endpoint_host(endpoint: &str) -> &str {
    let rest = endpoint
        .split_once("://")
        .map_or(endpoint, |(_, rest)| rest);
    let authority = rest.split(['/', '?']).next().unwrap_or_default();
    if authority.starts_with('[') {
        return authority
            .find(']')
            .map_or(authority, |end| &authority[..=end]);
    }
    authority
        .rsplit_once(':')
        .map_or(authority, |(host, _)| host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_the_endpoints_without_scheme_port_or_path() {
        assert_eq!(endpoint_host("http://127.0.0.1:7400"), "127.0.0.1");
        assert_eq!(
            endpoint_host("https://node-1.example.internal:7400/"),
            "node-1.example.internal"
        );
        assert_eq!(endpoint_host("node-2:7410"), "node-2");
        assert_eq!(endpoint_host("http://[::1]:7400"), "[::1]");
        assert_eq!(endpoint_host("https://tributary"), "tributary");
    }

    #[test]
    fn hub_rules_name_their_hub_and_plain_text_asks_for_no_tls() {
        let strings = AmqpConnectionStrings::new(
            "http://127.0.0.1:7400",
            AMQP_PORT_DEFAULT,
            "sender",
            "orders",
            "k3y=",
        );
        assert_eq!(
            strings.plain_text,
            "Endpoint=sb://127.0.0.1:5672/;SharedAccessKeyName=sender;SharedAccessKey=k3y=;\
             EntityPath=orders;UseDevelopmentEmulator=true"
        );
        assert_eq!(
            strings.tls,
            "Endpoint=sb://127.0.0.1/;SharedAccessKeyName=sender;SharedAccessKey=k3y=;\
             EntityPath=orders"
        );
    }

    #[test]
    fn namespace_rules_name_no_hub() {
        let strings = AmqpConnectionStrings::new(
            "https://[::1]:7400",
            5680,
            "RootManageSharedAccessKey",
            "",
            "k",
        );
        assert_eq!(
            strings.plain_text,
            "Endpoint=sb://[::1]:5680/;SharedAccessKeyName=RootManageSharedAccessKey;\
             SharedAccessKey=k;UseDevelopmentEmulator=true"
        );
        assert_eq!(
            strings.tls,
            "Endpoint=sb://[::1]/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey=k"
        );
    }
}
