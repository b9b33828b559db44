//! Whether an AMQP 1.0 listener answers where a deployment says it does: the SASL protocol
//! header (what every AMQP client sends first) must come back, in plain text or inside TLS.
//! For tests of deployment files, which have no SDK at hand.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::probe_tls::{TlsTrust, tls_connect};

/// AMQP 1.0's protocol header for the SASL layer.
const SASL_HEADER: [u8; 8] = *b"AMQP\x03\x01\x00\x00";
/// How long a connection, handshake and answer may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// Sends the SASL protocol header to `addr` (over TLS when `tls` is given) and checks that
/// the listener answers with it; an error says what happened instead.
pub async fn amqp_answers(addr: SocketAddr, tls: Option<TlsTrust<'_>>) -> Result<(), String> {
    let exchange = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect to {addr}: {e}"))?;
        match tls {
            None => header_exchange(tcp).await,
            Some(trust) => {
                // AMQP, not HTTP/2: no application protocol is negotiated.
                let stream = tls_connect(tcp, trust, &[]).await?;
                header_exchange(stream).await
            }
        }
    };
    tokio::time::timeout(PROBE_TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no AMQP answer from {addr} within {PROBE_TIMEOUT:?}"))?
}

async fn header_exchange<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) -> Result<(), String> {
    stream
        .write_all(&SASL_HEADER)
        .await
        .map_err(|e| format!("send the protocol header: {e}"))?;
    let mut answer = [0u8; SASL_HEADER.len()];
    stream
        .read_exact(&mut answer)
        .await
        .map_err(|e| format!("read the protocol header: {e}"))?;
    if answer == SASL_HEADER {
        Ok(())
    } else {
        Err(format!(
            "answered {answer:?}, not the SASL header {SASL_HEADER:?}"
        ))
    }
}
