//! Whether a Kafka listener answers where a deployment says it does: an ApiVersions v0
//! request (what every Kafka client sends first, and answered before any SASL login) must
//! come back with its correlation id and error code 0, in plain text or inside TLS (Kafka
//! clients offer no application protocol). With authorization off, a Metadata v0 request
//! tells which brokers (node id, host and port) a client is sent to. Written by hand, for
//! tests of deployment files, which have no Kafka client at hand.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::probe_tls::{TlsTrust, tls_connect};

/// ApiVersions' API key.
const API_VERSIONS: i16 = 18;
/// Metadata's API key.
const METADATA: i16 = 3;
/// The correlation id of the probe's requests.
const CORRELATION_ID: i32 = 0x7072_6f62;
/// The client id the probe gives.
const CLIENT_ID: &str = "tributary-probe";
/// How long a connection, handshake and answer may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Larger answers are an error: the probe's are a few hundred bytes.
const RESPONSE_BYTES_MAX: usize = 1024 * 1024;

/// A broker as a Metadata answer lists it: where clients are sent for its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaBroker {
    pub node_id: i32,
    pub host: String,
    pub port: i32,
}

impl KafkaBroker {
    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Sends ApiVersions v0 to `addr` (over TLS when `tls` is given) and checks the answer
/// carries the request's correlation id and error code 0; an error says what happened
/// instead.
pub async fn kafka_answers(addr: SocketAddr, tls: Option<TlsTrust<'_>>) -> Result<(), String> {
    let body = exchange(addr, tls, API_VERSIONS, &[]).await?;
    let error_code = Reader::new(&body).i16("error_code")?;
    if error_code == 0 {
        Ok(())
    } else {
        Err(format!(
            "ApiVersions v0 on {addr} answered error code {error_code}, not 0"
        ))
    }
}

/// The brokers the Metadata v0 answer of `addr` lists (over TLS when `tls` is given), in
/// its order. Needs a listener without authorization: Metadata comes after a SASL login.
pub async fn kafka_brokers(
    addr: SocketAddr,
    tls: Option<TlsTrust<'_>>,
) -> Result<Vec<KafkaBroker>, String> {
    // No topics named: in version 0, every topic.
    let body = exchange(addr, tls, METADATA, &0i32.to_be_bytes()).await?;
    parse_brokers(&body)
}

/// One request of `api_key`, version 0, with `body`; the answer's body once its
/// correlation id is checked.
async fn exchange(
    addr: SocketAddr,
    tls: Option<TlsTrust<'_>>,
    api_key: i16,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let request = request_frame(api_key, body);
    let exchange = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        match tls {
            None => request_response(tcp, &request).await,
            Some(trust) => {
                let stream = tls_connect(tcp, trust, &[]).await?;
                request_response(stream, &request).await
            }
        }
    };
    let response = tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no Kafka answer from {addr} within {PROBE_TIMEOUT:?}"))??;
    let mut reader = Reader::new(&response);
    let correlation_id = reader.i32("correlation id")?;
    if correlation_id != CORRELATION_ID {
        return Err(format!(
            "{addr} answered correlation id {correlation_id}, not the request's {CORRELATION_ID}"
        ));
    }
    Ok(reader.rest().to_vec())
}

/// A request frame: its length, then the header (API key, version 0, correlation id,
/// client id) and `body`.
fn request_frame(api_key: i16, body: &[u8]) -> Vec<u8> {
    let mut message = Vec::new();
    message.extend_from_slice(&api_key.to_be_bytes());
    message.extend_from_slice(&0i16.to_be_bytes());
    message.extend_from_slice(&CORRELATION_ID.to_be_bytes());
    let client_id_len = i16::try_from(CLIENT_ID.len()).expect("a short client id");
    message.extend_from_slice(&client_id_len.to_be_bytes());
    message.extend_from_slice(CLIENT_ID.as_bytes());
    message.extend_from_slice(body);
    let len = i32::try_from(message.len()).expect("a small request");
    let mut frame = len.to_be_bytes().to_vec();
    frame.extend_from_slice(&message);
    frame
}

/// Sends `request` and reads one answer frame, returning what follows its length.
async fn request_response<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    request: &[u8],
) -> Result<Vec<u8>, String> {
    stream
        .write_all(request)
        .await
        .map_err(|e| format!("send the request: {e}"))?;
    let mut len = [0u8; 4];
    stream
        .read_exact(&mut len)
        .await
        .map_err(|e| format!("read the answer's length: {e}"))?;
    let len = i32::from_be_bytes(len);
    let len = usize::try_from(len)
        .ok()
        .filter(|len| (4..=RESPONSE_BYTES_MAX).contains(len))
        .ok_or_else(|| format!("an answer of {len} bytes: not a Kafka answer to the probe"))?;
    let mut response = vec![0u8; len];
    stream
        .read_exact(&mut response)
        .await
        .map_err(|e| format!("read the answer: {e}"))?;
    Ok(response)
}

/// The brokers of a Metadata v0 answer's body: an array of (node id, host, port), then the
/// topics, which the probe leaves unread.
fn parse_brokers(body: &[u8]) -> Result<Vec<KafkaBroker>, String> {
    let mut reader = Reader::new(body);
    let count = reader.i32("the broker count")?;
    let count = usize::try_from(count).map_err(|_| format!("{count} brokers"))?;
    (0..count)
        .map(|_| {
            Ok(KafkaBroker {
                node_id: reader.i32("a broker's node id")?,
                host: reader.string("a broker's host")?,
                port: reader.i32("a broker's port")?,
            })
        })
        .collect()
}

/// Big-endian fields from the front of a buffer.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Reader { rest: bytes }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.rest.len() < n {
            return Err(format!("the answer ends before {what}"));
        }
        let (taken, rest) = self.rest.split_at(n);
        self.rest = rest;
        Ok(taken)
    }

    fn i16(&mut self, what: &str) -> Result<i16, String> {
        let bytes = self.take(2, what)?;
        Ok(i16::from_be_bytes([bytes[0], bytes[1]]))
    }

    fn i32(&mut self, what: &str) -> Result<i32, String> {
        let bytes = self.take(4, what)?;
        Ok(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn string(&mut self, what: &str) -> Result<String, String> {
        let len = self.i16(what)?;
        let len = usize::try_from(len).map_err(|_| format!("{what} of length {len}"))?;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("{what} is not UTF-8"))
    }

    fn rest(&self) -> &'a [u8] {
        self.rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_api_versions_request_is_a_length_prefixed_v0_header() {
        let frame = request_frame(API_VERSIONS, &[]);
        let mut reader = Reader::new(&frame);
        assert_eq!(
            usize::try_from(reader.i32("length").unwrap()).unwrap(),
            frame.len() - 4
        );
        assert_eq!(reader.i16("api key").unwrap(), 18);
        assert_eq!(reader.i16("version").unwrap(), 0);
        assert_eq!(reader.i32("correlation id").unwrap(), CORRELATION_ID);
        assert_eq!(reader.string("client id").unwrap(), CLIENT_ID);
        assert!(reader.rest().is_empty());
    }

    #[test]
    fn reads_the_brokers_of_a_metadata_answer() {
        let mut body = 2i32.to_be_bytes().to_vec();
        for (node_id, host, port) in [(11, "127.0.0.1", 9092), (12, "node-2.example", 9093)] {
            body.extend_from_slice(&i32::to_be_bytes(node_id));
            body.extend_from_slice(&i16::try_from(host.len()).unwrap().to_be_bytes());
            body.extend_from_slice(host.as_bytes());
            body.extend_from_slice(&i32::to_be_bytes(port));
        }
        // The topics, unread.
        body.extend_from_slice(&0i32.to_be_bytes());
        let brokers = parse_brokers(&body).unwrap();
        assert_eq!(
            brokers.iter().map(KafkaBroker::addr).collect::<Vec<_>>(),
            ["127.0.0.1:9092", "node-2.example:9093"]
        );
        assert_eq!(brokers[1].node_id, 12);
        assert!(parse_brokers(&body[..10]).is_err());
        assert!(parse_brokers(&(-1i32).to_be_bytes()).is_err());
    }
}
