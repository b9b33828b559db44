//! A request as the Blob API addresses it: path-style `/{account}/{container}[/{blob}]`,
//! query parameters, and the conditions and metadata of its headers.

use std::collections::BTreeMap;

use hyper::HeaderMap;
use percent_encoding::percent_decode_str;

use crate::error::BlobError;

/// The most metadata headers a request may carry (Azure's limit is by size; this bounds
/// parsing).
const METADATA_HEADERS_MAX: usize = 64;

/// The parts of a request target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The path exactly as sent, still percent-encoded (Shared Key signs it so).
    pub raw_path: String,
    pub account: String,
    pub container: String,
    /// The blob name, percent-decoded; empty for container calls.
    pub blob: String,
    /// Query parameters, names and values percent-decoded, in the order sent.
    pub query: Vec<(String, String)>,
}

impl Target {
    pub fn parse(path: &str, query: Option<&str>) -> Result<Target, BlobError> {
        let rest = path.strip_prefix('/').unwrap_or(path);
        let mut parts = rest.splitn(3, '/');
        let account = decode(parts.next().unwrap_or_default())?;
        let container = decode(parts.next().unwrap_or_default())?;
        let blob = decode(parts.next().unwrap_or_default())?;
        if account.is_empty() || container.is_empty() {
            return Err(BlobError::invalid_uri(format!(
                "'{path}' names no container: this endpoint takes path-style URLs, \
                 /{{account}}/{{container}}/{{blob}} (BlobEndpoint=http://host:10000/{{account}})"
            )));
        }
        let query = match query {
            None | Some("") => Vec::new(),
            Some(query) => query
                .split('&')
                .filter(|pair| !pair.is_empty())
                .map(|pair| {
                    let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
                    Ok((decode(name)?, decode(value)?))
                })
                .collect::<Result<_, BlobError>>()?,
        };
        Ok(Target {
            raw_path: path.to_string(),
            account,
            container,
            blob,
            query,
        })
    }

    /// A query parameter's value (the first, when repeated).
    pub fn param(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn decode(text: &str) -> Result<String, BlobError> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| BlobError::invalid_uri(format!("'{text}' is not UTF-8 once decoded")))
}

/// A header's value as text (empty when absent or not text).
pub fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// The `x-ms-meta-*` headers: names without the prefix, as sent (lower-case on HTTP/1.1
/// through this server), values as sent, empty ones kept.
pub fn metadata(headers: &HeaderMap) -> Result<BTreeMap<String, String>, BlobError> {
    let mut metadata = BTreeMap::new();
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix("x-ms-meta-") else {
            continue;
        };
        let identifier = key.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !identifier {
            return Err(BlobError::new(
                hyper::StatusCode::BAD_REQUEST,
                "InvalidMetadata",
                format!("metadata name '{key}' is not a C# identifier, as Azure requires"),
            ));
        }
        let value = value
            .to_str()
            .map_err(|_| BlobError::invalid_header(format!("x-ms-meta-{key} is not text")))?;
        metadata.insert(key.to_string(), value.to_string());
        if metadata.len() > METADATA_HEADERS_MAX {
            return Err(BlobError::invalid_header(format!(
                "more than {METADATA_HEADERS_MAX} metadata headers"
            )));
        }
    }
    Ok(metadata)
}

/// An ETag as compared: without `W/` and quotes.
pub fn bare_etag(text: &str) -> &str {
    let text = text.trim();
    let text = text.strip_prefix("W/").unwrap_or(text);
    text.trim_matches('"')
}

/// What a blob name means here: a consumer group's ownership record or checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobName<'a> {
    pub namespace: &'a str,
    pub hub: &'a str,
    pub group: &'a str,
    pub kind: tributary_broker::service::BlobKind,
    pub partition: u16,
}

/// The blob names this endpoint serves, for messages.
pub const NAME_LAYOUT: &str = "{namespace}/{eventhub}/{consumergroup}/ownership/{partition} or \
     {namespace}/{eventhub}/{consumergroup}/checkpoint/{partition}";

impl<'a> BlobName<'a> {
    pub fn parse(name: &'a str) -> Result<BlobName<'a>, BlobError> {
        let refuse = || {
            BlobError::invalid_name(format!(
                "blob '{name}' is not a checkpoint store record: this endpoint keeps only Event \
                 Hubs consumer groups' ownership and checkpoints, named {NAME_LAYOUT}"
            ))
        };
        let segments: Vec<&str> = name.split('/').collect();
        let [namespace, hub, group, kind, partition] = segments[..] else {
            return Err(refuse());
        };
        let kind = kind_of(kind).ok_or_else(refuse)?;
        let partition = partition
            .parse::<u16>()
            .ok()
            .filter(|p| p.to_string() == partition)
            .ok_or_else(refuse)?;
        if namespace.is_empty() || hub.is_empty() || group.is_empty() {
            return Err(refuse());
        }
        Ok(BlobName {
            namespace,
            hub,
            group,
            kind,
            partition,
        })
    }
}

/// The record kind a name segment names.
pub fn kind_of(segment: &str) -> Option<tributary_broker::service::BlobKind> {
    use tributary_broker::service::BlobKind;
    if segment.eq_ignore_ascii_case("ownership") {
        Some(BlobKind::Ownership)
    } else if segment.eq_ignore_ascii_case("checkpoint") {
        Some(BlobKind::Checkpoint)
    } else {
        None
    }
}

/// The name segment of a record kind.
pub fn kind_segment(kind: tributary_broker::service::BlobKind) -> &'static str {
    match kind {
        tributary_broker::service::BlobKind::Ownership => "ownership",
        tributary_broker::service::BlobKind::Checkpoint => "checkpoint",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tributary_broker::service::BlobKind;

    #[test]
    fn path_style_targets_keep_the_raw_path_and_decode_the_rest() {
        let target = Target::parse(
            "/devstoreaccount1/checkpoints/myns.servicebus.windows.net/myhub/%24default/ownership/0",
            Some("comp=metadata&prefix=a%2Fb%24c&empty"),
        )
        .unwrap();
        assert_eq!(target.account, "devstoreaccount1");
        assert_eq!(target.container, "checkpoints");
        assert_eq!(
            target.blob,
            "myns.servicebus.windows.net/myhub/$default/ownership/0"
        );
        assert!(target.raw_path.contains("%24default"));
        assert_eq!(target.param("COMP"), Some("metadata"));
        assert_eq!(target.param("prefix"), Some("a/b$c"));
        assert_eq!(target.param("empty"), Some(""));
        assert!(Target::parse("/onlyaccount", None).is_err());
        let container = Target::parse("/a/c", Some("restype=container")).unwrap();
        assert_eq!(container.blob, "");
    }

    #[test]
    fn only_checkpoint_store_names_are_records() {
        let name = BlobName::parse("ns.example.net/orders/$default/checkpoint/12").unwrap();
        assert_eq!(
            (
                name.namespace,
                name.hub,
                name.group,
                name.kind,
                name.partition
            ),
            (
                "ns.example.net",
                "orders",
                "$default",
                BlobKind::Checkpoint,
                12
            )
        );
        for bad in [
            "ns/orders/$default/ownership",
            "ns/orders/$default/0",
            "ns/orders/$default/lease/0",
            "ns/orders/$default/ownership/01",
            "ns/orders/$default/ownership/x",
            "ns/orders/$default/ownership/0/extra",
            "pictures/cat.jpg",
            "ns//$default/ownership/0",
        ] {
            let err = BlobName::parse(bad).unwrap_err();
            assert_eq!(err.code, "InvalidResourceName", "{bad}");
            assert!(
                err.message.contains("ownership/{partition}"),
                "{}",
                err.message
            );
        }
    }

    #[test]
    fn etags_compare_without_quotes() {
        assert_eq!(bare_etag("\"0x8DC1\""), "0x8DC1");
        assert_eq!(bare_etag("W/\"abc\""), "abc");
        assert_eq!(bare_etag("0x8DC1"), "0x8DC1");
    }
}
