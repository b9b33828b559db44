//! TLS on the client port and mutual TLS on the peer port.
//!
//! Certificates, keys and the cluster CA are read from files and re-read when the files
//! change (checked at each handshake: a `stat` per file), so a renewed certificate is used by the next
//! connection without a restart; a new file that cannot be used is logged and the previous
//! certificate kept. Handshakes run in a task per connection with a time limit, so a slow
//! or garbage client never holds up accepting others; the finished TLS streams feed tonic.
//! A plain-text HTTP/2 client is answered with a gRPC error that says the port speaks TLS.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tonic::transport::Channel;
use tonic::transport::server::{Connected, TcpConnectInfo};
use tributary_client::tls::{
    ALPN_H2, TlsConfigError, TlsConnector, crypto_provider, read_certificates,
};
use tributary_raft::Connector;

use crate::limits::{ConnectionGate, Guarded};

/// How long a client has to finish its TLS handshake (or to read the plain-text answer).
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes under way on one port at most; connections beyond are closed at once.
pub const HANDSHAKES_MAX: usize = 256;
/// Finished handshakes waiting for the gRPC server to take them.
const ACCEPTED_QUEUE_MAX: usize = 64;
/// Pause after the listener fails to accept (e.g. out of file descriptors), so the loop
/// does not spin.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(100);
/// The first byte of a TLS connection: a handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;
/// A port served over TLS: names it in logs and metrics, and says what a plain-text gRPC
/// client hears from it (gRPC status INVALID_ARGUMENT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsPort {
    Client,
    Peer,
}

impl TlsPort {
    pub fn name(self) -> &'static str {
        match self {
            TlsPort::Client => "client",
            TlsPort::Peer => "peer",
        }
    }

    /// ASCII without '%': a valid `grpc-message` as it is.
    pub fn plain_text_answer(self) -> &'static str {
        match self {
            TlsPort::Client => {
                "this port of the Tributary node speaks TLS only: use an https:// endpoint, \
                 and --ca-cert FILE with the CA that signed the node's certificate"
            }
            TlsPort::Peer => {
                "this peer port speaks mutual TLS only: start the node with --peer-ca, \
                 --peer-cert and --peer-key (a certificate from the cluster's CA)"
            }
        }
    }
}

/// A certificate and its private key, PEM files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Mutual TLS on the peer port: the cluster CA, and this node's certificate from it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTlsFiles {
    pub ca: PathBuf,
    pub cert: CertFiles,
}

/// TLS settings of a node (`--tls-*`, `--peer-*`); the default is plain text everywhere.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// TLS on the client port.
    pub client: Option<CertFiles>,
    /// Mutual TLS on the peer port and on this node's connections to other nodes.
    pub peer: Option<PeerTlsFiles>,
}

/// The TLS configurations a node serves and dials with, loaded from [`TlsSettings`].
pub struct NodeTls {
    pub client_port: Option<Arc<rustls::ServerConfig>>,
    pub peer_port: Option<Arc<rustls::ServerConfig>>,
    pub peer_connector: PeerConnector,
}

impl NodeTls {
    /// Reads every file; an unusable one is an error naming it. The peer certificate must
    /// name `node_id` (see [`crate::cert::certificate_node_id`]).
    pub fn load(settings: &TlsSettings, node_id: u64) -> Result<NodeTls, TlsConfigError> {
        let client_port = match &settings.client {
            Some(files) => Some(Arc::new(server_config(ReloadingCert::load(files)?, None)?)),
            None => None,
        };
        let (peer_port, peer_connector) = match &settings.peer {
            Some(peer) => {
                let cert = ReloadingCert::load(&peer.cert)?;
                let named = cert
                    .current()
                    .end_entity_cert()
                    .ok()
                    .and_then(|der| crate::cert::certificate_node_id(der));
                if named != Some(node_id) {
                    let names = match named {
                        Some(other) => format!("names node {other}"),
                        None => "names no node".to_owned(),
                    };
                    return Err(TlsConfigError {
                        file: peer.cert.cert.display().to_string(),
                        reason: format!(
                            "the peer certificate {names}, but this is node {node_id}: peers \
                             admit only a certificate naming the node that presents it; make \
                             one with `tributary cert node --node-id {node_id} ...`"
                        ),
                    });
                }
                let ca = ReloadingCa::load(&peer.ca)?;
                let server = server_config(cert.clone(), Some(Arc::new(PeerClients(ca.clone()))))?;
                (
                    Some(Arc::new(server)),
                    PeerConnector {
                        tls: Some(PeerTlsClient { ca, cert }),
                        key: None,
                    },
                )
            }
            None => (None, PeerConnector::default()),
        };
        Ok(NodeTls {
            client_port,
            peer_port,
            peer_connector,
        })
    }
}

/// TLS server settings presenting `cert`; with `clients`, clients must present a certificate
/// it accepts (mutual TLS).
fn server_config(
    cert: Arc<ReloadingCert>,
    clients: Option<Arc<dyn ClientCertVerifier>>,
) -> Result<rustls::ServerConfig, TlsConfigError> {
    let builder = rustls::ServerConfig::builder_with_provider(crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsConfigError {
            file: cert.files.cert.display().to_string(),
            reason: e.to_string(),
        })?;
    let builder = match clients {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(cert);
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(config)
}

/// The cluster CA (`--peer-ca`), read from a file and re-read when it changes, as
/// [`ReloadingCert`] does: a bundle holding the old and the new CA lets a cluster move to a
/// new CA without a restart.
pub struct ReloadingCa {
    path: PathBuf,
    loaded: Mutex<LoadedCa>,
}

#[derive(Clone)]
struct CaVerifiers {
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<dyn ServerCertVerifier>,
}

struct LoadedCa {
    verifiers: CaVerifiers,
    stamp: Option<FileStamp>,
}

impl std::fmt::Debug for ReloadingCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCa")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl ReloadingCa {
    /// Reads the file: it must hold at least one usable CA certificate.
    pub fn load(path: &Path) -> Result<Arc<ReloadingCa>, TlsConfigError> {
        let stamp = stamp(path);
        let verifiers = read_ca(path)?;
        Ok(Arc::new(ReloadingCa {
            path: path.to_owned(),
            loaded: Mutex::new(LoadedCa { verifiers, stamp }),
        }))
    }

    /// The verifiers of the CA now: re-read first when the file changed since last read.
    fn current(&self) -> CaVerifiers {
        let stamp = stamp(&self.path);
        let mut loaded = self.loaded.lock().expect("CA lock");
        if loaded.stamp != stamp {
            loaded.stamp = stamp;
            match read_ca(&self.path) {
                Ok(verifiers) => {
                    tracing::info!(
                        ca = %self.path.display(),
                        "CA file changed: new connections are verified against it"
                    );
                    loaded.verifiers = verifiers;
                }
                Err(error) => tracing::warn!(
                    %error,
                    "the CA file changed but cannot be used; still verifying against the \
                     previous CA"
                ),
            }
        }
        loaded.verifiers.clone()
    }

    /// The verifiers of the CA as last read, without looking at the file.
    fn latest(&self) -> CaVerifiers {
        self.loaded.lock().expect("CA lock").verifiers.clone()
    }
}

fn read_ca(path: &Path) -> Result<CaVerifiers, TlsConfigError> {
    let unusable = |reason: String| TlsConfigError {
        file: path.display().to_string(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for certificate in read_certificates(path)? {
        roots
            .add(certificate)
            .map_err(|e| unusable(format!("not a usable CA certificate: {e}")))?;
    }
    let roots = Arc::new(roots);
    let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), crypto_provider())
        .build()
        .map_err(|e| unusable(format!("not a usable CA: {e}")))?;
    let servers = WebPkiServerVerifier::builder_with_provider(roots, crypto_provider())
        .build()
        .map_err(|e| unusable(format!("not a usable CA: {e}")))?;
    Ok(CaVerifiers { clients, servers })
}

/// Accepts peer-port clients with a certificate from the cluster CA as it is now.
#[derive(Debug)]
struct PeerClients(Arc<ReloadingCa>);

impl ClientCertVerifier for PeerClients {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: they would borrow from a CA that may be replaced, and are optional.
    fn root_hint_subjects(&self) -> &[rustls::DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified =
            self.0
                .current()
                .clients
                .verify_client_cert(end_entity, intermediates, now)?;
        if crate::cert::certificate_node_id(end_entity).is_none() {
            return Err(rustls::Error::General(NAMES_NO_NODE.into()));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .latest()
            .clients
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0
            .latest()
            .clients
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.latest().clients.supported_verify_schemes()
    }
}

/// Why a peer's certificate from the cluster CA is refused when it names no node.
pub(crate) const NAMES_NO_NODE: &str = "the certificate names no node: peers present only node \
    certificates (`tributary cert node --node-id N`)";

/// Accepts peer ports presenting a certificate from the cluster CA as it is now, valid for
/// the address dialed, naming a node: the node dialed when it is known.
#[derive(Debug)]
struct PeerServers {
    ca: Arc<ReloadingCa>,
    node: Option<u64>,
}

impl ServerCertVerifier for PeerServers {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &rustls::pki_types::ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verified = self.ca.current().servers.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        match (crate::cert::certificate_node_id(end_entity), self.node) {
            (None, _) => Err(rustls::Error::General(NAMES_NO_NODE.into())),
            (Some(named), Some(dialed)) if named != dialed => Err(rustls::Error::General(format!(
                "the peer presents node {named}'s certificate, but node {dialed} was dialed"
            ))),
            _ => Ok(verified),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca
            .latest()
            .servers
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca
            .latest()
            .servers
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.ca.latest().servers.supported_verify_schemes()
    }
}

/// How a file looked when last read: a change in any part means it was rewritten.
#[derive(Debug, Clone, PartialEq, Eq)]
struct FileStamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    inode: u64,
}

fn stamp(path: &Path) -> Option<FileStamp> {
    use std::os::unix::fs::MetadataExt as _;
    let metadata = std::fs::metadata(path).ok()?;
    Some(FileStamp {
        modified: metadata.modified().ok(),
        len: metadata.len(),
        inode: metadata.ino(),
    })
}

struct Loaded {
    key: Arc<CertifiedKey>,
    /// The files' stamps when last read (successfully or not): a file is read again only
    /// after it changes, so a bad file is reported once, not at every handshake.
    stamps: (Option<FileStamp>, Option<FileStamp>),
}

/// A certificate and key read from files, re-read when the files change; serves as the
/// certificate of a TLS server and of a TLS client (peer connections).
pub struct ReloadingCert {
    files: CertFiles,
    loaded: Mutex<Loaded>,
}

impl std::fmt::Debug for ReloadingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReloadingCert")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl ReloadingCert {
    /// Reads the files; they must hold a certificate chain and its key.
    pub fn load(files: &CertFiles) -> Result<Arc<ReloadingCert>, TlsConfigError> {
        let stamps = (stamp(&files.cert), stamp(&files.key));
        let key = read_certified_key(files)?;
        Ok(Arc::new(ReloadingCert {
            files: files.clone(),
            loaded: Mutex::new(Loaded {
                key: Arc::new(key),
                stamps,
            }),
        }))
    }

    /// The certificate to present now: re-read first when a file changed since last read.
    pub fn current(&self) -> Arc<CertifiedKey> {
        let stamps = (stamp(&self.files.cert), stamp(&self.files.key));
        let mut loaded = self.loaded.lock().expect("certificate lock");
        if loaded.stamps != stamps {
            loaded.stamps = stamps;
            match read_certified_key(&self.files) {
                Ok(key) => {
                    tracing::info!(
                        certificate = %self.files.cert.display(),
                        "certificate file changed: new connections use the new certificate"
                    );
                    loaded.key = Arc::new(key);
                }
                // Often the certificate was written and its key not yet: the key's change
                // brings the next try.
                Err(error) => tracing::warn!(
                    %error,
                    "a certificate or key file changed but cannot be used; still presenting \
                     the previous certificate"
                ),
            }
        }
        loaded.key.clone()
    }
}

fn read_certified_key(files: &CertFiles) -> Result<CertifiedKey, TlsConfigError> {
    let chain = read_certificates(&files.cert)?;
    let unusable_key = |reason: String| TlsConfigError {
        file: files.key.display().to_string(),
        reason,
    };
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| unusable_key(format!("not a PEM private key: {e}")))?;
    let key = crypto_provider()
        .key_provider
        .load_private_key(key)
        .map_err(|e| unusable_key(format!("not a usable private key: {e}")))?;
    let certified = CertifiedKey::new(chain, key);
    certified.keys_match().map_err(|e| {
        unusable_key(format!(
            "does not belong to the certificate in {} ({e})",
            files.cert.display()
        ))
    })?;
    Ok(certified)
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

impl rustls::client::ResolvesClientCert for ReloadingCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// How this node dials other nodes' peer ports: plain TCP or mutual TLS, then the
/// cluster-key handshake when the node has a key (see [`crate::peer_port`]).
#[derive(Clone, Default)]
pub struct PeerConnector {
    tls: Option<PeerTlsClient>,
    key: Option<tributary_raft::peer_key::ClusterKey>,
}

/// The client side of mutual TLS on peer connections: the cluster CA and this node's
/// certificate.
#[derive(Clone)]
struct PeerTlsClient {
    ca: Arc<ReloadingCa>,
    cert: Arc<ReloadingCert>,
}

impl PeerTlsClient {
    /// Client settings that accept only a peer naming `node` (any node when `None`).
    fn config(&self, node: Option<u64>) -> Result<Arc<rustls::ClientConfig>, String> {
        let mut config = rustls::ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PeerServers {
                ca: self.ca.clone(),
                node,
            }))
            .with_client_cert_resolver(self.cert.clone());
        config.alpn_protocols = vec![ALPN_H2.to_vec()];
        Ok(Arc::new(config))
    }
}

impl PeerConnector {
    /// This connector, proving `key` on every connection.
    pub fn with_key(mut self, key: Option<tributary_raft::peer_key::ClusterKey>) -> Self {
        self.key = key;
        self
    }

    fn dial(&self, addr: &str, node: Option<u64>) -> Result<Channel, String> {
        if self.tls.is_none() && self.key.is_none() {
            return tributary_raft::TcpConnector.channel(addr);
        }
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let tls = match &self.tls {
            Some(tls) => {
                Some(TlsConnector::new(tls.config(node)?).naming_ca_setting("--peer-ca FILE"))
            }
            None => None,
        };
        let dialer = crate::peer_port::PeerDialer {
            tls,
            key: self.key.clone(),
        };
        Ok(tributary_raft::peer_endpoint(scheme, addr)?.connect_with_connector_lazy(dialer))
    }
}

impl Connector for PeerConnector {
    fn channel(&self, addr: &str) -> Result<Channel, String> {
        self.dial(addr, None)
    }

    fn channel_to(&self, addr: &str, node: u64) -> Result<Channel, String> {
        self.dial(addr, Some(node))
    }
}

/// A server-side TLS connection, for tonic (its connect info is the TCP one, so handlers
/// see the remote address as over plain text).
pub struct TlsConnection {
    stream: tokio_rustls::server::TlsStream<TcpStream>,
    info: TcpConnectInfo,
}

impl TlsConnection {
    /// The certificates the client presented (mutual TLS), end entity first.
    pub fn peer_certificates(&self) -> Option<&[CertificateDer<'static>]> {
        self.stream.get_ref().1.peer_certificates()
    }
}

impl Connected for TlsConnection {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.info.clone()
    }
}

impl AsyncRead for TlsConnection {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for TlsConnection {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// The TLS connections `listener` accepts, for `serve_with_incoming_shutdown`, each
/// holding a place at `gate` and closed when idle for `idle_timeout` (see
/// [`crate::limits`]); a connection over the limit is told so over TLS, then closed.
/// Refusals are logged and counted in `tributary_tls_connections_refused_total{port}`.
/// Accepting stops when the stream is dropped (the server stopped).
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    port: TlsPort,
    gate: ConnectionGate,
    idle_timeout: Duration,
) -> tokio_stream::wrappers::ReceiverStream<io::Result<Guarded<TlsConnection>>> {
    let (accepted, stream) = mpsc::channel(ACCEPTED_QUEUE_MAX);
    tokio::spawn(accept_loop(
        listener,
        config,
        port,
        (gate, idle_timeout),
        accepted,
    ));
    tokio_stream::wrappers::ReceiverStream::new(stream)
}

async fn accept_loop(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    port: TlsPort,
    (gate, idle_timeout): (ConnectionGate, Duration),
    accepted: mpsc::Sender<io::Result<Guarded<TlsConnection>>>,
) {
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    let handshakes = Arc::new(Semaphore::new(HANDSHAKES_MAX));
    loop {
        let (tcp, remote) = tokio::select! {
            () = accepted.closed() => return,
            result = listener.accept() => match result {
                Ok(connection) => connection,
                Err(error) => {
                    tracing::warn!(port = port.name(), %error, "cannot accept a connection");
                    tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                    continue;
                }
            },
        };
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            refused(port, remote, "too many TLS handshakes under way");
            continue;
        };
        // Its place is taken before the handshake: handshakes count as connections.
        let place = gate.admit();
        let _ = tcp.set_nodelay(true);
        let info = TcpConnectInfo {
            local_addr: tcp.local_addr().ok(),
            remote_addr: Some(remote),
        };
        let acceptor = acceptor.clone();
        let accepted = accepted.clone();
        let gate = gate.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake(tcp, acceptor, port)).await {
                Ok(Ok(stream)) => match place {
                    Some(place) => {
                        let connection = TlsConnection { stream, info };
                        let guarded = Guarded::new(connection, place, idle_timeout);
                        let _ = accepted.send(Ok(guarded)).await;
                    }
                    None => crate::limits::refuse(stream, gate.refusal()).await,
                },
                Ok(Err(reason)) => refused(port, remote, &reason),
                Err(_elapsed) => refused(
                    port,
                    remote,
                    &format!("no TLS handshake within {HANDSHAKE_TIMEOUT:?}"),
                ),
            }
        });
    }
}

fn refused(port: TlsPort, remote: std::net::SocketAddr, reason: &str) {
    count_refusal(port);
    tracing::warn!(port = port.name(), %remote, reason, "refused a connection");
}

/// Counts a connection refused during its TLS handshake.
pub(crate) fn count_refusal(port: TlsPort) {
    metrics::counter!("tributary_tls_connections_refused_total", "port" => port.name())
        .increment(1);
}

/// The TLS handshake of one connection, or why there is none.
pub(crate) async fn handshake(
    tcp: TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    port: TlsPort,
) -> Result<tokio_rustls::server::TlsStream<TcpStream>, String> {
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await {
        Ok(0) => return Err("closed before a TLS handshake".into()),
        Ok(_) => {}
        Err(error) => return Err(format!("cannot read: {error}")),
    }
    if first[0] == TLS_HANDSHAKE_RECORD {
        return acceptor
            .accept(tcp)
            .await
            .map_err(|error| format!("TLS handshake failed: {error}"));
    }
    // The HTTP/2 connection preface starts "PRI * HTTP/2.0": a plain-text gRPC client.
    if first[0] == b'P' {
        let _ = answer_plain_text(tcp, port.plain_text_answer()).await;
        return Err("a plain-text HTTP/2 client; answered that this port speaks TLS".into());
    }
    Err(format!(
        "not TLS (first byte {:#04x}); closed the connection",
        first[0]
    ))
}

/// Answers every call of a plain-text HTTP/2 connection with `answer`, until the client
/// closes it (the caller's time limit ends it otherwise).
async fn answer_plain_text(tcp: TcpStream, answer: &'static str) -> Result<(), hyper::Error> {
    let service = hyper::service::service_fn(move |_request| async move {
        let response = http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", "3")
            .header("grpc-message", answer)
            .body(String::new())
            .expect("a static response is valid");
        Ok::<_, std::convert::Infallible>(response)
    });
    hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(tcp), service)
        .await
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use rustls::pki_types::ServerName;
    use tokio::io::AsyncWriteExt as _;

    use tributary_client::tls::client_config;

    use super::*;
    use crate::cert::{CaArgs, NodeArgs, make_ca, make_node};

    #[test]
    fn the_plain_text_answers_are_valid_grpc_messages() {
        for port in [TlsPort::Client, TlsPort::Peer] {
            let answer = port.plain_text_answer();
            assert!(
                answer
                    .bytes()
                    .all(|b| (b' '..=b'~').contains(&b) && b != b'%'),
                "{answer}"
            );
            http::HeaderValue::from_static(answer);
        }
    }

    /// A CA in `dir/ca` (named after `dir`) and node certificate `name` from it in `dir`.
    fn certificates(dir: &Path, name: &str) -> (PathBuf, CertFiles) {
        let ca = dir.join("ca");
        if !ca.join("ca.pem").exists() {
            make_ca(
                &CaArgs {
                    out: ca.clone(),
                    name: format!("Test CA {}", dir.display()),
                    days: 30,
                    force: false,
                },
                std::time::SystemTime::now(),
            )
            .unwrap();
        }
        let written = renew(dir, name);
        (ca.join("ca.pem"), written)
    }

    /// Writes (again) node certificate `name`: a new key and serial.
    fn renew(dir: &Path, name: &str) -> CertFiles {
        renew_for(dir, name, Vec::new())
    }

    /// Like [`renew`], valid for `dns_names` (and `name`) only. `node-N` names node N; other
    /// names no node.
    fn renew_for(dir: &Path, name: &str, dns_names: Vec<String>) -> CertFiles {
        let written = make_node(
            &NodeArgs {
                ca: dir.join("ca"),
                out: dir.to_owned(),
                name: name.into(),
                dns_names,
                ip_addrs: Vec::new(),
                node_id: name.strip_prefix("node-").and_then(|n| n.parse().ok()),
                days: 30,
                force: true,
            },
            std::time::SystemTime::now(),
        )
        .unwrap();
        CertFiles {
            cert: written.certificate,
            key: written.key,
        }
    }

    fn end_entity(files: &CertFiles) -> CertificateDer<'static> {
        read_certificates(&files.cert).unwrap().remove(0)
    }

    #[test]
    fn a_renewed_certificate_is_presented_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (_, files) = certificates(dir.path(), "node-1");
        let first = end_entity(&files);
        let cert = ReloadingCert::load(&files).unwrap();
        assert_eq!(cert.current().end_entity_cert().unwrap(), &first);
        renew(dir.path(), "node-1");
        let second = end_entity(&files);
        assert_ne!(first, second);
        assert_eq!(cert.current().end_entity_cert().unwrap(), &second);
    }

    #[test]
    fn an_unusable_new_file_keeps_the_previous_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (_, files) = certificates(dir.path(), "node-1");
        let (_, other) = certificates(dir.path(), "node-2");
        let first = end_entity(&files);
        let cert = ReloadingCert::load(&files).unwrap();
        // Another certificate's key: does not belong.
        std::fs::copy(&other.key, &files.key).unwrap();
        assert_eq!(cert.current().end_entity_cert().unwrap(), &first);
        std::fs::write(&files.key, "garbage").unwrap();
        assert_eq!(cert.current().end_entity_cert().unwrap(), &first);
        // Fixed: the pair is used.
        let renewed = renew(dir.path(), "node-1");
        assert_eq!(
            cert.current().end_entity_cert().unwrap(),
            &end_entity(&renewed)
        );
    }

    #[test]
    fn an_unusable_file_at_start_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_, files) = certificates(dir.path(), "node-1");
        std::fs::write(&files.key, "garbage").unwrap();
        let error = ReloadingCert::load(&files).unwrap_err().to_string();
        assert!(error.contains("node-1.key"), "{error}");
        assert!(error.contains("not a PEM private key"), "{error}");
    }

    /// Serves `config` on a loopback port: says "ok" on every connection it hands out
    /// and holds it.
    async fn serve(config: rustls::ServerConfig) -> std::net::SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut connections = incoming(
            listener,
            Arc::new(config),
            TlsPort::Client,
            ConnectionGate::new("client", 100),
            Duration::from_secs(60),
        );
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Some(connection) = connections.next().await {
                let mut connection = connection.unwrap();
                let _ = connection.write_all(b"ok").await;
                let _ = connection.flush().await;
                held.push(connection);
            }
        });
        addr
    }

    /// The end-entity certificate a fresh TLS handshake with `addr` sees.
    async fn presented(
        addr: std::net::SocketAddr,
        client: rustls::ClientConfig,
    ) -> io::Result<CertificateDer<'static>> {
        let tcp = TcpStream::connect(addr).await?;
        let stream = tokio_rustls::TlsConnector::from(Arc::new(client))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        Ok(stream.get_ref().1.peer_certificates().unwrap()[0].clone())
    }

    #[tokio::test]
    async fn a_new_connection_sees_a_renewed_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, files) = certificates(dir.path(), "node-1");
        let ca = read_certificates(&ca).unwrap();
        let addr = serve(server_config(ReloadingCert::load(&files).unwrap(), None).unwrap()).await;
        let client = client_config(&ca, None).unwrap();
        assert_eq!(
            presented(addr, client.clone()).await.unwrap(),
            end_entity(&files)
        );
        renew(dir.path(), "node-1");
        assert_eq!(presented(addr, client).await.unwrap(), end_entity(&files));
    }

    #[tokio::test]
    async fn garbage_and_silent_clients_do_not_stop_handshakes() {
        let dir = tempfile::tempdir().unwrap();
        let (ca, files) = certificates(dir.path(), "node-1");
        let ca = read_certificates(&ca).unwrap();
        let addr = serve(server_config(ReloadingCert::load(&files).unwrap(), None).unwrap()).await;
        // One client never says anything; another sends garbage, another a TLS record
        // header followed by garbage.
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut garbage = TcpStream::connect(addr).await.unwrap();
        garbage.write_all(&[0xde, 0xad, 0xbe, 0xef]).await.unwrap();
        let mut bad_tls = TcpStream::connect(addr).await.unwrap();
        bad_tls
            .write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5])
            .await
            .unwrap();
        assert_eq!(
            presented(addr, client_config(&ca, None).unwrap())
                .await
                .unwrap(),
            end_entity(&files)
        );
    }

    #[tokio::test]
    async fn mutual_tls_admits_only_clients_with_a_certificate_from_the_ca_as_it_is_now() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_path, files) = certificates(dir.path(), "node-1");
        let other_dir = tempfile::tempdir().unwrap();
        let (other_ca_path, other_files) = certificates(other_dir.path(), "node-9");
        let ca = read_certificates(&ca_path).unwrap();
        // The server's CA file, to be replaced by a bundle of both CAs.
        let cluster_ca = dir.path().join("cluster-ca.pem");
        std::fs::copy(&ca_path, &cluster_ca).unwrap();
        let clients = Arc::new(PeerClients(ReloadingCa::load(&cluster_ca).unwrap()));
        let addr =
            serve(server_config(ReloadingCert::load(&files).unwrap(), Some(clients)).unwrap())
                .await;
        // The server's verdict on the client's certificate arrives after the client's
        // handshake is done (TLS 1.3): a read shows it.
        let talk = |client: rustls::ClientConfig| async move {
            use tokio::io::AsyncReadExt as _;
            let tcp = TcpStream::connect(addr).await?;
            let mut stream = tokio_rustls::TlsConnector::from(Arc::new(client))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await?;
            stream
                .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                .await?;
            let mut byte = [0u8; 1];
            stream.read(&mut byte).await
        };
        let member = ReloadingCert::load(&files).unwrap();
        let answered = talk(client_config(&ca, Some(member)).unwrap()).await;
        assert!(answered.is_ok_and(|n| n > 0), "a member is served");
        let error = talk(client_config(&ca, None).unwrap()).await.unwrap_err();
        assert!(error.to_string().contains("CertificateRequired"), "{error}");
        let stranger = ReloadingCert::load(&other_files).unwrap();
        let error = talk(client_config(&ca, Some(stranger.clone())).unwrap())
            .await
            .unwrap_err();
        assert!(error.to_string().contains("UnknownCA"), "{error}");

        // The other CA joins the server's CA file: its nodes are admitted, without a
        // restart.
        let mut bundle = std::fs::read(&ca_path).unwrap();
        bundle.extend(std::fs::read(&other_ca_path).unwrap());
        std::fs::write(&cluster_ca, bundle).unwrap();
        let answered = talk(client_config(&ca, Some(stranger)).unwrap()).await;
        assert!(
            answered.is_ok_and(|n| n > 0),
            "admitted once its CA is in the file"
        );
    }

    /// Whether a TLS client with `config` is served by `addr` (mutual TLS: the server's
    /// verdict on the client arrives after the client's handshake, so a read shows it).
    async fn served(
        addr: std::net::SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> io::Result<usize> {
        use tokio::io::AsyncReadExt as _;
        let tcp = TcpStream::connect(addr).await?;
        let mut stream = tokio_rustls::TlsConnector::from(config)
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await?;
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await?;
        let mut byte = [0u8; 1];
        stream.read(&mut byte).await
    }

    #[tokio::test]
    async fn peers_present_certificates_naming_their_node_and_only_that_node() {
        let dir = tempfile::tempdir().unwrap();
        let (ca_path, node_1) = certificates(dir.path(), "node-1");
        let node_2 = renew(dir.path(), "node-2");
        let unnamed = renew(dir.path(), "client-only");
        let ca = ReloadingCa::load(&ca_path).unwrap();
        let clients = Arc::new(PeerClients(ca.clone()));
        let addr =
            serve(server_config(ReloadingCert::load(&node_1).unwrap(), Some(clients)).unwrap())
                .await;
        let dialer = |cert: &CertFiles| PeerTlsClient {
            ca: ca.clone(),
            cert: ReloadingCert::load(cert).unwrap(),
        };

        // Node 2 dialing node 1 (or a seed, node unknown) is served.
        let answered = served(addr, dialer(&node_2).config(Some(1)).unwrap()).await;
        assert!(answered.is_ok_and(|n| n > 0), "node 2 dialing node 1");
        let answered = served(addr, dialer(&node_2).config(None).unwrap()).await;
        assert!(answered.is_ok_and(|n| n > 0), "node 2 dialing a seed");
        // Node 1's certificate answers where node 3 was dialed: the dialer hangs up.
        let error = served(addr, dialer(&node_2).config(Some(3)).unwrap())
            .await
            .unwrap_err();
        assert!(
            error.to_string().contains("node 1's certificate"),
            "{error}"
        );
        // A certificate from the cluster CA that names no node is refused by the server.
        let error = served(addr, dialer(&unnamed).config(Some(1)).unwrap()).await;
        assert!(error.is_err(), "a certificate naming no node was served");

        // A node refuses to start with a peer certificate that does not name it.
        let settings = |cert: &CertFiles| TlsSettings {
            client: None,
            peer: Some(PeerTlsFiles {
                ca: ca_path.clone(),
                cert: cert.clone(),
            }),
        };
        assert!(NodeTls::load(&settings(&node_2), 2).is_ok());
        let error = NodeTls::load(&settings(&node_2), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("names node 2"), "{error}");
        assert!(error.contains("--node-id 1"), "{error}");
        let error = NodeTls::load(&settings(&unnamed), 1)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("names no node"), "{error}");
    }

    #[tokio::test]
    async fn the_connector_says_why_a_server_is_not_trusted() {
        use tonic::codegen::Service as _;
        use tributary_client::tls::TlsConnectError;

        let dir = tempfile::tempdir().unwrap();
        let (ca, _) = certificates(dir.path(), "node-1");
        let ca = read_certificates(&ca).unwrap();
        let elsewhere = renew_for(dir.path(), "node-2", vec!["node-2.example".into()]);
        let addr =
            serve(server_config(ReloadingCert::load(&elsewhere).unwrap(), None).unwrap()).await;
        let uri: tonic::transport::Uri = format!("https://{addr}").parse().unwrap();
        let mut connector = TlsConnector::new(Arc::new(client_config(&ca, None).unwrap()));
        let error = connector.call(uri.clone()).await.unwrap_err();
        assert!(
            matches!(error, TlsConnectError::WrongName { .. }),
            "{error:?}"
        );

        let other_dir = tempfile::tempdir().unwrap();
        let (other_ca, _) = certificates(other_dir.path(), "node-9");
        let other_ca = read_certificates(&other_ca).unwrap();
        let mut connector = TlsConnector::new(Arc::new(client_config(&other_ca, None).unwrap()))
            .naming_ca_setting("--peer-ca FILE");
        let error = connector.call(uri).await.unwrap_err();
        assert!(
            matches!(error, TlsConnectError::Untrusted { .. }),
            "{error:?}"
        );
        assert!(error.to_string().contains("--peer-ca FILE"), "{error}");
    }
}
