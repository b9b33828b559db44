//! Whether a Blob checkpoint endpoint answers where a deployment says it does: a Get
//! Container Properties call (`GET /probe/checkpoints?restype=container`, HTTP/1.1, in plain
//! text or inside TLS offering `http/1.1` as HTTP clients do) must be answered as the Blob
//! API answers it. For tests of deployment files, which have no SDK at hand.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::probe_tls::{TlsTrust, tls_connect};

/// The container call the probe makes, as account `probe`.
pub const BLOB_PROBE_PATH: &str = "/probe/checkpoints?restype=container";
/// How long a connection, handshake and answer may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Larger answers are an error: the probe's are a few hundred bytes.
const RESPONSE_BYTES_MAX: u64 = 1024 * 1024;

/// An HTTP answer: status and headers (names in lower case), the body left out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobResponse {
    pub status: u16,
    pub headers: Vec<(String, String)>,
}

impl BlobResponse {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.as_str())
    }
}

/// `GET path` on `addr` with `headers` besides `Host` and `Connection: close`, over TLS
/// when `tls` is given.
pub async fn blob_get(
    addr: SocketAddr,
    tls: Option<TlsTrust<'_>>,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<BlobResponse, String> {
    let mut request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    let exchange = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        match tls {
            None => request_response(tcp, &request).await,
            Some(trust) => {
                let stream = tls_connect(tcp, trust, &[b"http/1.1"]).await?;
                request_response(stream, &request).await
            }
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no HTTP answer from {addr} within {PROBE_TIMEOUT:?}"))?
}

/// The probe's call to the Blob endpoint on `addr` (over TLS when `tls` is given), without
/// a credential: with `authorization` on it must be refused as Azure refuses it (403,
/// `x-ms-error-code: AuthenticationFailed`), without it answered 200 with the container's
/// ETag. An error says what happened instead.
pub async fn blob_answers(
    addr: SocketAddr,
    tls: Option<TlsTrust<'_>>,
    authorization: bool,
) -> Result<(), String> {
    let response = blob_get(addr, tls, BLOB_PROBE_PATH, &[]).await?;
    let error_code = response.header("x-ms-error-code");
    let answered = if authorization {
        response.status == 403 && error_code == Some("AuthenticationFailed")
    } else {
        response.status == 200 && error_code.is_none() && response.header("etag").is_some()
    };
    if answered {
        Ok(())
    } else {
        let expected = if authorization {
            "403 with x-ms-error-code AuthenticationFailed"
        } else {
            "200 with an ETag"
        };
        Err(format!(
            "GET {BLOB_PROBE_PATH} on {addr} answered {} (x-ms-error-code {error_code:?}), \
             not {expected}",
            response.status
        ))
    }
}

async fn request_response<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &str,
) -> Result<BlobResponse, String> {
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send the request: {e}"))?;
    let mut response = Vec::new();
    (&mut stream)
        .take(RESPONSE_BYTES_MAX)
        .read_to_end(&mut response)
        .await
        .map_err(|e| format!("read the answer: {e}"))?;
    parse_head(&response)
}

fn parse_head(response: &[u8]) -> Result<BlobResponse, String> {
    let text = String::from_utf8_lossy(response);
    let head = text
        .split_once("\r\n\r\n")
        .map(|(head, _)| head)
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let mut lines = head.lines();
    let status_line = lines.next().unwrap_or_default();
    let status = status_line
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("not an HTTP/1.1 status line: {status_line:?}"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Ok(BlobResponse { status, headers })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_status_and_headers_of_an_answer() {
        let response = parse_head(
            b"HTTP/1.1 403 Server failed to authenticate the request.\r\n\
              X-Ms-Error-Code: AuthenticationFailed\r\ncontent-length: 3\r\n\r\nabc",
        )
        .unwrap();
        assert_eq!(response.status, 403);
        assert_eq!(
            response.header("x-ms-error-code"),
            Some("AuthenticationFailed")
        );
        assert_eq!(response.header("etag"), None);
        assert!(parse_head(b"AMQP\x00\x01\x00\x00").is_err());
        assert!(parse_head(b"HTTP/2 200\r\n\r\n").is_err());
    }
}
