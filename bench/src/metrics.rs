//! Reading one counter from a node's Prometheus endpoint, with a deliberately tiny HTTP/1.1
//! client: one GET, `Connection: close`, read to the end.

use std::time::Duration;

use anyhow::{Context as _, bail};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// The counter the bench divides sends by.
pub(crate) const FSYNCS_METRIC: &str = "tributary_storage_fsyncs_total";
/// The standard process series every node exports.
pub(crate) const CPU_METRIC: &str = "process_cpu_seconds_total";
pub(crate) const RSS_METRIC: &str = "process_resident_memory_bytes";
/// The bytes a node's storage holds, summed over its series (read where a node exports it).
pub(crate) const DATA_BYTES_METRIC: &str = "tributary_storage_data_bytes";

/// What one read of a node's metrics page showed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct NodeSample {
    pub(crate) fsyncs: Option<f64>,
    pub(crate) cpu_seconds: Option<f64>,
    pub(crate) resident_bytes: Option<f64>,
}

/// Reads the bench's figures from the node's metrics page at `url`.
pub(crate) async fn sample(url: &str) -> anyhow::Result<NodeSample> {
    let body = http_get(url).await?;
    Ok(NodeSample::parse(&body))
}

impl NodeSample {
    pub(crate) fn parse(text: &str) -> NodeSample {
        NodeSample {
            fsyncs: counter_sum(text, FSYNCS_METRIC),
            cpu_seconds: counter_sum(text, CPU_METRIC),
            resident_bytes: counter_sum(text, RSS_METRIC),
        }
    }
}

/// How long connecting, and then reading the whole response, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
/// A metrics page larger than this is not one we want to parse.
const RESPONSE_BYTES_MAX: u64 = 64 * 1024 * 1024;

pub(crate) async fn http_get(url: &str) -> anyhow::Result<String> {
    let (authority, path) = split_http_url(url)?;
    let address = if authority.contains(':') {
        authority.to_owned()
    } else {
        format!("{authority}:80")
    };
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address))
        .await
        .with_context(|| format!("connecting to {address} timed out"))?
        .with_context(|| format!("cannot connect to {address}"))?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nAccept: text/plain\r\nConnection: close\r\n\r\n"
    );
    let mut response = Vec::new();
    tokio::time::timeout(RESPONSE_TIMEOUT, async {
        stream.write_all(request.as_bytes()).await?;
        (&mut stream)
            .take(RESPONSE_BYTES_MAX)
            .read_to_end(&mut response)
            .await
    })
    .await
    .with_context(|| format!("{url} did not answer within {RESPONSE_TIMEOUT:?}"))?
    .with_context(|| format!("cannot read {url}"))?;
    parse_response(&response).with_context(|| format!("bad response from {url}"))
}

/// `http://host:port/path` → (`host:port`, `/path`).
fn split_http_url(url: &str) -> anyhow::Result<(&str, &str)> {
    let Some(rest) = url.strip_prefix("http://") else {
        bail!("metrics URL '{url}' must start with http://");
    };
    let (authority, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, "/"),
    };
    if authority.is_empty() {
        bail!("metrics URL '{url}' has no host");
    }
    Ok((authority, path))
}

/// The body of a `200 OK` response, de-chunked if needed.
fn parse_response(response: &[u8]) -> anyhow::Result<String> {
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the response has no end of headers")?;
    let head = String::from_utf8_lossy(&response[..split]);
    let body = &response[split + 4..];
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        bail!("HTTP status '{status_line}'");
    }
    let chunked = lines.any(|line| {
        let (name, value) = line.split_once(':').unwrap_or((line, ""));
        name.trim().eq_ignore_ascii_case("transfer-encoding")
            && value.to_ascii_lowercase().contains("chunked")
    });
    let body = if chunked {
        dechunk(body)?
    } else {
        body.to_vec()
    };
    Ok(String::from_utf8_lossy(&body).into_owned())
}

fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("truncated chunk header")?;
        let size_text = String::from_utf8_lossy(&body[..line_end]);
        let size_text = size_text.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .with_context(|| format!("bad chunk size '{size_text}'"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size {
            bail!("truncated chunk");
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

/// Sums the samples of every series named exactly `name` in Prometheus text format;
/// `None` if there is none.
pub(crate) fn counter_sum(text: &str, name: &str) -> Option<f64> {
    let mut sum = None;
    for line in text.lines() {
        let line = line.trim_start();
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        let after_labels = if let Some(labels) = rest.strip_prefix('{') {
            match skip_labels(labels) {
                Some(after) => after,
                None => continue,
            }
        } else if rest.starts_with([' ', '\t']) {
            rest
        } else {
            // A longer name that starts with ours.
            continue;
        };
        let value = after_labels
            .split_whitespace()
            .next()
            .and_then(parse_sample);
        if let Some(value) = value {
            *sum.get_or_insert(0.0) += value;
        }
    }
    sum
}

/// The text after the closing `}` of a label set (given the text after `{`), honouring quoted
/// label values, which may contain `}` and escaped quotes.
fn skip_labels(labels: &str) -> Option<&str> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, c) in labels.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if in_quotes => escaped = true,
            '"' => in_quotes = !in_quotes,
            '}' if !in_quotes => return Some(&labels[i + 1..]),
            _ => {}
        }
    }
    None
}

pub(crate) fn parse_sample(text: &str) -> Option<f64> {
    match text {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        _ => text.parse().ok(),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_sample_reads_fsyncs_cpu_and_memory_from_one_page() {
        let page = "# HELP process_cpu_seconds_total Total user and system CPU time\n\
                    process_cpu_seconds_total 12.5\n\
                    process_resident_memory_bytes 104857600\n\
                    tributary_storage_fsyncs_total{shard=\"0\"} 7\n\
                    tributary_storage_fsyncs_total{shard=\"1\"} 3\n";
        assert_eq!(
            NodeSample::parse(page),
            NodeSample {
                fsyncs: Some(10.0),
                cpu_seconds: Some(12.5),
                resident_bytes: Some(104_857_600.0),
            }
        );
        assert_eq!(NodeSample::parse(""), NodeSample::default());
    }

    use super::*;

    const PAGE: &str = "\
# HELP tributary_storage_fsyncs_total Fsyncs of storage shards.
# TYPE tributary_storage_fsyncs_total counter
tributary_storage_fsyncs_total{shard=\"0\"} 120
tributary_storage_fsyncs_total{shard=\"1\",note=\"a } and \\\" inside\"} 30.5 1714564800000
tributary_storage_fsyncs_total_seconds 999
tributary_storage_fsyncs 7
other_metric{shard=\"0\"} 5
";

    #[test]
    fn sums_every_series_of_the_counter() {
        assert_eq!(counter_sum(PAGE, FSYNCS_METRIC), Some(150.5));
    }

    #[test]
    fn unlabelled_series_and_missing_counters() {
        assert_eq!(
            counter_sum("tributary_storage_fsyncs_total 3\n", FSYNCS_METRIC),
            Some(3.0)
        );
        assert_eq!(counter_sum("# TYPE x counter\nx 1\n", FSYNCS_METRIC), None);
        assert_eq!(counter_sum("", FSYNCS_METRIC), None);
    }

    #[test]
    fn parses_plain_and_chunked_responses() {
        let plain =
            b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: 4\r\n\r\nx 1\n";
        assert_eq!(parse_response(plain).unwrap(), "x 1\n");
        let chunked =
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nx 1\n\r\n3;ext=1\r\ny 2\r\n0\r\n\r\n";
        assert_eq!(parse_response(chunked).unwrap(), "x 1\ny 2");
        let not_found = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n";
        assert!(
            parse_response(not_found)
                .unwrap_err()
                .to_string()
                .contains("404")
        );
    }

    #[test]
    fn splits_urls() {
        assert_eq!(
            split_http_url("http://127.0.0.1:7402/metrics").unwrap(),
            ("127.0.0.1:7402", "/metrics")
        );
        assert_eq!(split_http_url("http://node").unwrap(), ("node", "/"));
        assert!(split_http_url("https://node/metrics").is_err());
        assert!(split_http_url("http:///metrics").is_err());
    }
}
