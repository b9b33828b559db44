//! TLS for the listener probes: the client side of a handshake with a listener whose
//! certificate the cluster CA signed.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::ServerName;
use tokio::net::TcpStream;

/// How to reach a listener over TLS: the CA that signed its certificate, and the name (DNS
/// name or IP) the certificate must be valid for.
#[derive(Debug, Clone, Copy)]
pub struct TlsTrust<'a> {
    pub ca_pem: &'a Path,
    pub server_name: &'a str,
}

/// A TLS handshake over `tcp` as `trust` says, offering the application protocols `alpn`
/// (none: no ALPN extension).
pub(crate) async fn tls_connect(
    tcp: TcpStream,
    trust: TlsTrust<'_>,
    alpn: &[&[u8]],
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    let roots =
        tributary_client::tls::read_certificates(trust.ca_pem).map_err(|e| e.to_string())?;
    let mut config = tributary_client::tls::client_config(&roots, None)?;
    config.alpn_protocols = alpn.iter().map(|protocol| protocol.to_vec()).collect();
    let name = ServerName::try_from(trust.server_name.to_owned())
        .map_err(|e| format!("server name {}: {e}", trust.server_name))?;
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| format!("TLS handshake as {}: {e}", trust.server_name))
}
