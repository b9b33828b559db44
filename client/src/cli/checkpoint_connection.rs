//! The checkpoint-store connection string `auth rule keys` prints for the Azure Event Hubs
//! SDKs' `BlobCheckpointStore`, pointing at the nodes' Blob checkpoint endpoint on the host
//! of the endpoint the CLI talks to.

use super::amqp_connection::endpoint_host;

/// The port of a node's Blob checkpoint endpoint unless it was given another
/// (`--blob-addr`).
pub(crate) const BLOB_PORT_DEFAULT: u16 = 10000;

/// The Azure Storage connection string for rule `rule` with `key`: the rule's name is the
/// storage account, and the endpoint is path-style, `http(s)://host:port/{rule}`, HTTPS when
/// `endpoint` (`http://host:port`, `https://host:port` or `host:port`) is, as the Blob
/// endpoint speaks TLS exactly when the client port does. A hub rule's string has the same
/// form (Blob connection strings name no hub): its key signs the records of its hub only.
pub(crate) fn checkpoint_connection_string(
    endpoint: &str,
    blob_port: u16,
    rule: &str,
    key: &str,
) -> String {
    let scheme = if endpoint.starts_with("https://") {
        "https"
    } else {
        "http"
    };
    let host = endpoint_host(endpoint);
    format!(
        "DefaultEndpointsProtocol={scheme};AccountName={rule};AccountKey={key};\
         BlobEndpoint={scheme}://{host}:{blob_port}/{rule};"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_text_endpoint_gives_an_http_blob_endpoint_named_after_the_rule() {
        assert_eq!(
            checkpoint_connection_string(
                "http://127.0.0.1:7400",
                BLOB_PORT_DEFAULT,
                "RootManageSharedAccessKey",
                "k3y+/=",
            ),
            "DefaultEndpointsProtocol=http;AccountName=RootManageSharedAccessKey;\
             AccountKey=k3y+/=;BlobEndpoint=http://127.0.0.1:10000/RootManageSharedAccessKey;"
        );
    }

    #[test]
    fn a_tls_endpoint_gives_https_in_both_places_on_the_given_port() {
        assert_eq!(
            checkpoint_connection_string(
                "https://node-1.example.internal:7400/",
                10443,
                "readers",
                "k"
            ),
            "DefaultEndpointsProtocol=https;AccountName=readers;AccountKey=k;\
             BlobEndpoint=https://node-1.example.internal:10443/readers;"
        );
        assert_eq!(
            checkpoint_connection_string("https://[::1]:7400", BLOB_PORT_DEFAULT, "r", "k"),
            "DefaultEndpointsProtocol=https;AccountName=r;AccountKey=k;\
             BlobEndpoint=https://[::1]:10000/r;"
        );
    }

    #[test]
    fn an_endpoint_without_a_scheme_is_plain_text() {
        assert_eq!(
            checkpoint_connection_string("node-2:7410", 10001, "sender", "k"),
            "DefaultEndpointsProtocol=http;AccountName=sender;AccountKey=k;\
             BlobEndpoint=http://node-2:10001/sender;"
        );
    }
}
