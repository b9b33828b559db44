//! A deliberately tiny HTTP/1.1 client for `/readyz` and `/metrics`: one GET with
//! `Connection: close`, read to the end.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// How long one request (connect, send, read everything) may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Larger responses are an error: nothing we read is this big.
const RESPONSE_BYTES_MAX: u64 = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub body: String,
}

/// `GET http://<addr><path>`.
pub async fn http_get(addr: SocketAddr, path: &str) -> io::Result<HttpResponse> {
    http_request(addr, "GET", path).await
}

/// `POST http://<addr><path>` with an empty body.
pub async fn http_post(addr: SocketAddr, path: &str) -> io::Result<HttpResponse> {
    http_request(addr, "POST", path).await
}

async fn http_request(addr: SocketAddr, method: &str, path: &str) -> io::Result<HttpResponse> {
    let request = async {
        let mut stream = TcpStream::connect(addr).await?;
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await?;
        let mut response = Vec::new();
        (&mut stream)
            .take(RESPONSE_BYTES_MAX)
            .read_to_end(&mut response)
            .await?;
        Ok::<_, io::Error>(response)
    };
    let response = tokio::time::timeout(REQUEST_TIMEOUT, request)
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "HTTP request timed out"))??;
    parse_response(&response)
}

fn parse_response(response: &[u8]) -> io::Result<HttpResponse> {
    let invalid = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_owned());
    let text = String::from_utf8_lossy(response);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| invalid("no end of headers"))?;
    let status_line = head.lines().next().unwrap_or_default();
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| invalid("bad status line"))?;
    let chunked = head.lines().any(|line| {
        let line = line.to_ascii_lowercase();
        line.starts_with("transfer-encoding:") && line.contains("chunked")
    });
    let body = if chunked {
        dechunk(body).ok_or_else(|| invalid("bad chunked body"))?
    } else {
        body.to_owned()
    };
    Ok(HttpResponse { status, body })
}

fn dechunk(mut body: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n")?;
        let size = usize::from_str_radix(size.split(';').next()?.trim(), 16).ok()?;
        if size == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..size)?);
        body = rest.get(size..)?.strip_prefix("\r\n")?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_chunked_responses() {
        let plain = parse_response(b"HTTP/1.1 200 OK\r\ncontent-length: 6\r\n\r\nready\n").unwrap();
        assert_eq!(
            plain,
            HttpResponse {
                status: 200,
                body: "ready\n".into()
            }
        );
        let chunked = parse_response(
            b"HTTP/1.1 503 Service Unavailable\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            chunked,
            HttpResponse {
                status: 503,
                body: "abcde".into()
            }
        );
        assert!(parse_response(b"garbage").is_err());
    }
}
