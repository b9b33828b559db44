//! TLS for `https://` channels: a connector that dials TCP and does a rustls handshake, so a
//! tonic channel speaks TLS without tonic's own TLS features. The node's peer connections
//! use it too, with a client certificate (mutual TLS).

use std::future::Future;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tonic::transport::Uri;

/// The ALPN protocol every Tributary TLS port speaks: HTTP/2 (gRPC).
pub const ALPN_H2: &[u8] = b"h2";

/// The crypto every Tributary TLS connection uses: rustls on ring.
pub fn crypto_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The certificates of a PEM file (e.g. a CA's `ca.pem`), at least one.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsConfigError> {
    let bytes = std::fs::read(path).map_err(|e| TlsConfigError {
        file: path.display().to_string(),
        reason: e.to_string(),
    })?;
    parse_certificates(&bytes).map_err(|reason| TlsConfigError {
        file: path.display().to_string(),
        reason,
    })
}

/// The certificates of PEM text, at least one.
pub fn parse_certificates(pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("not PEM certificates: {e}"))?;
    if certificates.is_empty() {
        return Err("holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into());
    }
    Ok(certificates)
}

/// A certificate or key file that cannot be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cannot use {file}: {reason}")]
pub struct TlsConfigError {
    pub file: String,
    pub reason: String,
}

/// Client settings trusting the CA certificates in `ca_pem` (and only those), presenting
/// the certificate `client_cert` resolves when the server asks for one.
pub fn client_config(
    ca_certificates: &[CertificateDer<'static>],
    client_cert: Option<Arc<dyn ResolvesClientCert>>,
) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in ca_certificates {
        roots
            .add(certificate.clone())
            .map_err(|e| format!("not a usable CA certificate: {e}"))?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots);
    let mut config = match client_cert {
        Some(resolver) => builder.with_client_cert_resolver(resolver),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// Dials `host:port` of the URI it is called with and does a TLS handshake; for
/// [`tonic::transport::Endpoint::connect_with_connector_lazy`]. Nagle's algorithm is off,
/// as on every Tributary connection.
#[derive(Clone)]
pub struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
    /// Where the trusted CA is set, for errors: `--ca-cert FILE` for the CLI.
    ca_setting: &'static str,
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector").finish_non_exhaustive()
    }
}

impl TlsConnector {
    pub fn new(config: Arc<rustls::ClientConfig>) -> Self {
        Self {
            config,
            ca_setting: "--ca-cert FILE, or ClientOptions::ca_cert",
        }
    }

    /// The same, naming `setting` as where the trusted CA is given when a certificate is
    /// not trusted (e.g. `--peer-ca` for a node's connections to other nodes).
    pub fn naming_ca_setting(self, setting: &'static str) -> Self {
        Self {
            ca_setting: setting,
            ..self
        }
    }
}

/// Why a TLS connection could not be made, worded for the person running the client.
#[derive(Debug, thiserror::Error)]
pub enum TlsConnectError {
    #[error("cannot connect to {address}: {source}")]
    Connect {
        address: String,
        source: std::io::Error,
    },
    /// The server answered, but not with TLS: most likely a plain-text port.
    #[error(
        "{address} does not speak TLS ({detail}): if its port is plain text, connect with \
         http:// instead of https://"
    )]
    NotTls { address: String, detail: String },
    /// The server's certificate does not chain to a trusted CA, or is not for this name.
    #[error(
        "the certificate of {address} is not trusted ({detail}); give the CA that signed it \
         ({ca_setting})"
    )]
    Untrusted {
        address: String,
        detail: String,
        ca_setting: &'static str,
    },
    /// The certificate is from a trusted CA but names other hosts.
    #[error(
        "the certificate of {address} is not for that name ({detail}); connect with a name or \
         address it is valid for, or give the node a certificate valid for this one"
    )]
    WrongName { address: String, detail: String },
    #[error("TLS handshake with {address} failed: {detail}")]
    Handshake { address: String, detail: String },
    #[error("bad address {0:?}: it needs a host and a port")]
    BadAddress(String),
}

impl tonic::codegen::Service<Uri> for TlsConnector {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = TlsConnectError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connector = tokio_rustls::TlsConnector::from(self.config.clone());
        let ca_setting = self.ca_setting;
        Box::pin(async move {
            let (host, port) = match (uri.host(), uri.port_u16()) {
                (Some(host), Some(port)) => (host.to_owned(), port),
                _ => return Err(TlsConnectError::BadAddress(uri.to_string())),
            };
            let address = format!("{host}:{port}");
            // An IPv6 literal comes bracketed in a URI.
            let bare_host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let name = ServerName::try_from(bare_host.clone())
                .map_err(|_| TlsConnectError::BadAddress(address.clone()))?;
            let tcp = TcpStream::connect((bare_host.as_str(), port))
                .await
                .map_err(|source| TlsConnectError::Connect {
                    address: address.clone(),
                    source,
                })?;
            tcp.set_nodelay(true)
                .map_err(|source| TlsConnectError::Connect {
                    address: address.clone(),
                    source,
                })?;
            let stream = connector
                .connect(name, tcp)
                .await
                .map_err(|e| classify_handshake_error(address, ca_setting, e))?;
            Ok(TokioIo::new(stream))
        })
    }
}

fn classify_handshake_error(
    address: String,
    ca_setting: &'static str,
    error: std::io::Error,
) -> TlsConnectError {
    let detail = error.to_string();
    match error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(
            rustls::CertificateError::NotValidForName
            | rustls::CertificateError::NotValidForNameContext { .. },
        )) => TlsConnectError::WrongName { address, detail },
        Some(rustls::Error::InvalidCertificate(_)) => TlsConnectError::Untrusted {
            address,
            detail,
            ca_setting,
        },
        Some(rustls::Error::InvalidMessage(_)) => TlsConnectError::NotTls { address, detail },
        Some(_) => TlsConnectError::Handshake { address, detail },
        // The server closed the connection in the middle of the handshake: a plain-text
        // HTTP/2 server does that after reading a ClientHello it cannot parse.
        None if error.kind() == std::io::ErrorKind::UnexpectedEof => {
            TlsConnectError::NotTls { address, detail }
        }
        None => TlsConnectError::Handshake { address, detail },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_certificates_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("tributary-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.pem");
        std::fs::write(&path, "not a certificate\n").unwrap();
        let error = read_certificates(&path).unwrap_err();
        assert!(error.to_string().contains("empty.pem"), "{error}");
        assert!(error.to_string().contains("no PEM certificate"), "{error}");
        let missing = read_certificates(&dir.join("missing.pem")).unwrap_err();
        assert!(missing.to_string().contains("missing.pem"), "{missing}");
    }
}
