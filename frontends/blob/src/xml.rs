//! The XML bodies: List Blobs' `EnumerationResults` and the `Error` document.

use std::fmt::Write;

use tributary_broker::service::BlobView;

/// Escapes text for an element's content or an attribute.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c => out.push(c),
        }
    }
    out
}

/// An error body: both `Code` and `Message` (.NET reads the code only when both are there).
pub fn error(code: &str, message: &str, request_id: &str, time: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{}</Code><Message>{}\nRequestId:{}\nTime:{}</Message></Error>",
        escape(code),
        escape(message),
        escape(request_id),
        escape(time)
    )
}

/// A List Blobs page: each blob's name, properties (with `BlobType`, which Python needs)
/// and, when asked, metadata (empty values kept as empty elements).
#[allow(clippy::too_many_arguments)]
pub fn list_blobs(
    service_endpoint: &str,
    container: &str,
    prefix: &str,
    marker: Option<&str>,
    max_results: Option<&str>,
    blobs: &[(String, BlobView)],
    include_metadata: bool,
    next_marker: Option<&str>,
) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?>");
    let _ = write!(
        out,
        "<EnumerationResults ServiceEndpoint=\"{}\" ContainerName=\"{}\"><Prefix>{}</Prefix>",
        escape(service_endpoint),
        escape(container),
        escape(prefix)
    );
    if let Some(marker) = marker {
        let _ = write!(out, "<Marker>{}</Marker>", escape(marker));
    }
    if let Some(max) = max_results {
        let _ = write!(out, "<MaxResults>{}</MaxResults>", escape(max));
    }
    out.push_str("<Blobs>");
    for (name, blob) in blobs {
        let modified = crate::handler::http_date(blob.last_modified_ms);
        let _ = write!(
            out,
            "<Blob><Name>{}</Name><Properties><Creation-Time>{modified}</Creation-Time>\
             <Last-Modified>{modified}</Last-Modified><Etag>\"{}\"</Etag>\
             <Content-Length>0</Content-Length><Content-Type>application/octet-stream</Content-Type>\
             <BlobType>BlockBlob</BlobType><LeaseStatus>unlocked</LeaseStatus>\
             <LeaseState>available</LeaseState><ServerEncrypted>false</ServerEncrypted></Properties>",
            escape(name),
            escape(&blob.etag)
        );
        if include_metadata {
            out.push_str("<Metadata>");
            for (key, value) in &blob.metadata {
                let key = escape(key);
                let _ = write!(out, "<{key}>{}</{key}>", escape(value));
            }
            out.push_str("</Metadata>");
        }
        out.push_str("</Blob>");
    }
    out.push_str("</Blobs>");
    match next_marker {
        Some(next) => {
            let _ = write!(out, "<NextMarker>{}</NextMarker>", escape(next));
        }
        None => out.push_str("<NextMarker />"),
    }
    out.push_str("</EnumerationResults>");
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use tributary_broker::service::BlobKind;

    #[test]
    fn a_page_lists_names_properties_and_metadata() {
        let blob = BlobView {
            partition: 0,
            kind: BlobKind::Ownership,
            etag: "0000000000000003".into(),
            last_modified_ms: 1_795_743_918_000,
            metadata: BTreeMap::from([("ownerid".to_string(), String::new())]),
        };
        let name = "ns/h/$default/ownership/0".to_string();
        let body = list_blobs(
            "/acct/",
            "checkpoints",
            "ns/h/$default/ownership/",
            None,
            Some("1"),
            &[(name, blob)],
            true,
            Some("ns/h/$default/ownership/1"),
        );
        assert!(
            body.contains("<Name>ns/h/$default/ownership/0</Name>"),
            "{body}"
        );
        assert!(body.contains("<Etag>\"0000000000000003\"</Etag>"), "{body}");
        assert!(body.contains("<BlobType>BlockBlob</BlobType>"), "{body}");
        assert!(
            body.contains("<Metadata><ownerid></ownerid></Metadata>"),
            "{body}"
        );
        assert!(
            body.contains("<Last-Modified>Fri, 27 Nov 2026 01:45:18 GMT</Last-Modified>"),
            "{body}"
        );
        assert!(
            body.contains("<NextMarker>ns/h/$default/ownership/1</NextMarker>"),
            "{body}"
        );
        assert!(body.contains("<MaxResults>1</MaxResults>"), "{body}");
    }

    #[test]
    fn text_is_escaped() {
        assert_eq!(escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&apos;");
        let body = error("ConditionNotMet", "x < y", "id", "now");
        assert!(body.contains(
            "<Code>ConditionNotMet</Code><Message>x &lt; y\nRequestId:id\nTime:now</Message>"
        ));
    }
}
