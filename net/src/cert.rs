//! `tributary cert`: a development certificate authority and node certificates signed by
//! it, for TLS on the client port and mutual TLS on the peer port. A node certificate
//! serves both sides of a connection (server and client authentication), so one file pair
//! per node covers the peer port, where every node is both.
//!
//! Keys are ECDSA P-256, written as PKCS#8 PEM with mode 0600. Existing files are never
//! replaced without `--force`.

use std::fs::OpenOptions;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, PublicKeyData as _, SanType,
};

/// The CA's files in its directory.
pub const CA_CERT_FILE: &str = "ca.pem";
pub const CA_KEY_FILE: &str = "ca.key";

/// A node certificate names its node id as a URI subject alternative name: this, then the
/// id in decimal.
pub const NODE_ID_URI_PREFIX: &str = "urn:tributary:node:";

/// The node id a certificate (DER) names, if it names exactly one.
pub fn certificate_node_id(der: &[u8]) -> Option<u64> {
    use x509_parser::prelude::{FromDer as _, GeneralName, X509Certificate};
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let names = cert.subject_alternative_name().ok()??;
    let mut ids = names
        .value
        .general_names
        .iter()
        .filter_map(|name| match name {
            GeneralName::URI(uri) => uri.strip_prefix(NODE_ID_URI_PREFIX),
            _ => None,
        });
    let id = ids.next()?.parse().ok()?;
    ids.next().is_none().then_some(id)
}

const KEY_FILE_MODE: u32 = 0o600;
const CERT_FILE_MODE: u32 = 0o644;
/// Certificates start this long before they are made, so a node whose clock is a little
/// behind the one that made them accepts them.
const NOT_BEFORE_SLACK: Duration = Duration::from_secs(60 * 60);
const DAY: Duration = Duration::from_secs(24 * 60 * 60);
/// The longest validity `--days` accepts (about 100 years).
const DAYS_MAX: u32 = 36_500;
const NODE_NAME_BYTES_MAX: usize = 63;
const DNS_NAME_BYTES_MAX: usize = 253;
const DNS_LABEL_BYTES_MAX: usize = 63;

#[derive(Debug, clap::Subcommand)]
pub enum CertCommand {
    /// Make a development certificate authority: `ca.pem` (certificate) and `ca.key`
    /// (private key, mode 0600) in --out.
    Ca(CaArgs),
    /// Make a node's certificate, signed by the CA in --ca, for TLS servers and clients
    /// (mutual TLS on the peer port): `<name>.pem` (the node's certificate, then the CA's)
    /// and `<name>.key` (private key, mode 0600) in --out.
    Node(NodeArgs),
    /// Make a cluster key: a random secret every node of a cluster is given with
    /// --cluster-key-file, so that only they can use each other's peer ports. Written as
    /// 64 hexadecimal digits, mode 0600; copy the file to every node.
    ClusterKey(ClusterKeyArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct ClusterKeyArgs {
    /// The file to write; its directory is created if missing.
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    /// Replace the file if it exists (nodes still holding the old key can no longer reach
    /// those given the new one).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct CaArgs {
    /// Directory to write `ca.pem` and `ca.key` to; created if missing.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Common name of the CA's certificate.
    #[arg(long, default_value = "Tributary development CA")]
    pub name: String,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=i64::from(DAYS_MAX)))]
    pub days: u32,
    /// Replace `ca.pem` and `ca.key` if they exist (certificates signed by the old CA stop
    /// being trusted by nodes given the new one).
    #[arg(long)]
    pub force: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct NodeArgs {
    /// Directory holding the CA's `ca.pem` and `ca.key` (made by `tributary cert ca`).
    #[arg(long, value_name = "DIR")]
    pub ca: PathBuf,
    /// Directory to write `<name>.pem` and `<name>.key` to; created if missing.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// The node's name: the certificate's common name, a DNS name it is valid for, and the
    /// files' base name. Letters, digits, '-' and '.'.
    #[arg(long)]
    pub name: String,
    /// A DNS name the certificate is valid for, besides --name (repeatable). Without --dns
    /// and --ip: localhost.
    #[arg(long = "dns", value_name = "NAME")]
    pub dns_names: Vec<String>,
    /// An IP address the certificate is valid for (repeatable). Without --dns and --ip:
    /// 127.0.0.1.
    #[arg(long = "ip", value_name = "ADDR")]
    pub ip_addrs: Vec<IpAddr>,
    /// The node id the certificate names (a URI `urn:tributary:node:<ID>` among its
    /// subject alternative names): with mutual TLS on the peer port, a node's certificate
    /// must name its --node-id, and peers present only such certificates. Without it the
    /// certificate serves the client port only.
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u64).range(1..=tributary_raft::NODE_ID_MAX))]
    pub node_id: Option<u64>,
    /// Days the certificate is valid.
    #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..=i64::from(DAYS_MAX)))]
    pub days: u32,
    /// Replace `<name>.pem` and `<name>.key` if they exist.
    #[arg(long)]
    pub force: bool,
}

/// The files one command wrote.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct WrittenFiles {
    pub certificate: PathBuf,
    pub key: PathBuf,
}

/// Runs one `tributary cert` command at time `now` and prints the paths it wrote: plain
/// lines, or one JSON object with `json`.
pub fn run(command: CertCommand, now: SystemTime, json: bool) -> anyhow::Result<()> {
    let written = match command {
        CertCommand::Ca(args) => make_ca(&args, now)?,
        CertCommand::Node(args) => make_node(&args, now)?,
        CertCommand::ClusterKey(args) => {
            make_cluster_key(&args)?;
            if json {
                println!("{}", serde_json::json!({ "cluster_key": args.out }));
            } else {
                println!("wrote {}", args.out.display());
            }
            return Ok(());
        }
    };
    if json {
        println!("{}", serde_json::to_string(&written)?);
    } else {
        println!("wrote {}", written.certificate.display());
        println!("wrote {}", written.key.display());
    }
    Ok(())
}

/// Writes a new random cluster key to `args.out`, mode 0600.
pub fn make_cluster_key(args: &ClusterKeyArgs) -> anyhow::Result<()> {
    if !args.force && args.out.exists() {
        bail!(
            "{} exists; pass --force to replace it (every node must then be given the new \
             key), or choose another --out",
            args.out.display()
        );
    }
    if let Some(dir) = args.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create directory {}", dir.display()))?;
    }
    write_new(
        &args.out,
        &tributary_raft::peer_key::ClusterKey::generate(),
        KEY_FILE_MODE,
        args.force,
    )
}

/// Makes a self-signed CA certificate and its key in `args.out`.
pub fn make_ca(args: &CaArgs, now: SystemTime) -> anyhow::Result<WrittenFiles> {
    if args.name.trim().is_empty() {
        bail!("--name must not be empty");
    }
    let files = WrittenFiles {
        certificate: args.out.join(CA_CERT_FILE),
        key: args.out.join(CA_KEY_FILE),
    };
    refuse_existing(&files, args.force)?;

    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(&args.name);
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, now, args.days);
    let key = KeyPair::generate().context("cannot generate the CA's key")?;
    let cert = params
        .self_signed(&key)
        .context("cannot sign the CA's certificate")?;

    write_files(&files, &cert.pem(), &key.serialize_pem(), args.force)?;
    Ok(files)
}

/// Makes a node certificate signed by the CA in `args.ca`, and its key, in `args.out`.
pub fn make_node(args: &NodeArgs, now: SystemTime) -> anyhow::Result<WrittenFiles> {
    check_node_name(&args.name)?;
    let files = WrittenFiles {
        certificate: args.out.join(format!("{}.pem", args.name)),
        key: args.out.join(format!("{}.key", args.name)),
    };
    refuse_existing(&files, args.force)?;
    let ca = LoadedCa::read(&args.ca)?;

    let mut params = CertificateParams::default();
    params.distinguished_name = distinguished_name(&args.name);
    params.subject_alt_names = subject_alt_names(&args.name, &args.dns_names, &args.ip_addrs)?;
    if let Some(node) = args.node_id {
        let uri = format!("{NODE_ID_URI_PREFIX}{node}");
        params
            .subject_alt_names
            .push(SanType::URI(uri.try_into().expect("the URI is ASCII")));
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, now, args.days);
    let key = KeyPair::generate().context("cannot generate the node's key")?;
    let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, &ca.key).with_context(|| {
        format!(
            "cannot use {} as an issuer",
            args.ca.join(CA_CERT_FILE).display()
        )
    })?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("cannot sign the node's certificate")?;

    // The chain a TLS peer needs: the node's certificate, then the CA's.
    let chain = format!("{}{}", cert.pem(), ca.cert_pem);
    write_files(&files, &chain, &key.serialize_pem(), args.force)?;
    Ok(files)
}

/// A CA read back from the files `make_ca` wrote, checked to belong together.
struct LoadedCa {
    cert_pem: String,
    key: KeyPair,
}

impl LoadedCa {
    fn read(dir: &Path) -> anyhow::Result<LoadedCa> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let cert_pem = std::fs::read_to_string(&cert_path).with_context(|| {
            format!(
                "cannot read the CA certificate {}; make a CA with `tributary cert ca --out {}`",
                cert_path.display(),
                dir.display()
            )
        })?;
        let key_pem = std::fs::read_to_string(&key_path).with_context(|| {
            format!(
                "cannot read the CA key {} (it is readable only by the user who made it)",
                key_path.display()
            )
        })?;
        let key = KeyPair::from_pem(&key_pem).map_err(|err| {
            anyhow::anyhow!(
                "{} is not a PEM private key this tool can use: {err}",
                key_path.display()
            )
        })?;
        let (_, pem) = x509_parser::pem::parse_x509_pem(cert_pem.as_bytes()).map_err(|err| {
            anyhow::anyhow!("{} is not a PEM certificate: {err}", cert_path.display())
        })?;
        let cert = pem.parse_x509().map_err(|err| {
            anyhow::anyhow!("{} is not an X.509 certificate: {err}", cert_path.display())
        })?;
        if !cert.is_ca() {
            bail!(
                "{} is not a CA certificate (it may not sign others); give --ca the directory `tributary cert ca` wrote",
                cert_path.display()
            );
        }
        if cert.public_key().raw != key.subject_public_key_info().as_slice() {
            bail!(
                "{} is not the key of {}; keep the pair `tributary cert ca` wrote together",
                key_path.display(),
                cert_path.display()
            );
        }
        Ok(LoadedCa { cert_pem, key })
    }
}

fn distinguished_name(common_name: &str) -> DistinguishedName {
    let mut name = DistinguishedName::new();
    name.push(DnType::CommonName, common_name);
    name
}

fn set_validity(params: &mut CertificateParams, now: SystemTime, days: u32) {
    assert!((1..=DAYS_MAX).contains(&days), "--days is range-checked");
    params.not_before = (now - NOT_BEFORE_SLACK).into();
    params.not_after = (now + DAY * days).into();
}

/// Node names become file names and DNS names, so only DNS names of a bounded length.
fn check_node_name(name: &str) -> anyhow::Result<()> {
    if name.len() > NODE_NAME_BYTES_MAX || !is_dns_name(name) {
        bail!(
            "--name '{name}' is not a valid node name: use up to {NODE_NAME_BYTES_MAX} letters, digits, '-' and '.' (e.g. node-1)"
        );
    }
    if name == "ca" {
        bail!("--name 'ca' is kept for the CA's own files; choose another node name");
    }
    Ok(())
}

/// Dot-separated labels of ASCII letters, digits and '-', none empty or starting or ending
/// with '-'.
fn is_dns_name(name: &str) -> bool {
    name.len() <= DNS_NAME_BYTES_MAX
        && name.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= DNS_LABEL_BYTES_MAX
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// The name, then `--dns` names, then `--ip` addresses; localhost and 127.0.0.1 when neither
/// flag is given. Duplicates are dropped.
fn subject_alt_names(
    name: &str,
    dns_names: &[String],
    ip_addrs: &[IpAddr],
) -> anyhow::Result<Vec<SanType>> {
    let (dns_names, ip_addrs) = if dns_names.is_empty() && ip_addrs.is_empty() {
        (
            vec!["localhost".to_owned()],
            vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
        )
    } else {
        (dns_names.to_vec(), ip_addrs.to_vec())
    };
    let mut sans = Vec::new();
    for dns_name in std::iter::once(name).chain(dns_names.iter().map(String::as_str)) {
        if !is_dns_name(dns_name) {
            bail!("--dns '{dns_name}' is not a DNS name: use letters, digits, '-' and '.'");
        }
        let san = SanType::DnsName(dns_name.try_into().expect("DNS names are ASCII"));
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    for addr in ip_addrs {
        let san = SanType::IpAddress(addr);
        if !sans.contains(&san) {
            sans.push(san);
        }
    }
    Ok(sans)
}

fn refuse_existing(files: &WrittenFiles, force: bool) -> anyhow::Result<()> {
    if force {
        return Ok(());
    }
    for path in [&files.certificate, &files.key] {
        if path.exists() {
            bail!(
                "{} exists; pass --force to replace it, or choose another --out",
                path.display()
            );
        }
    }
    Ok(())
}

/// Writes the key first, so a certificate on disk always has its key beside it.
fn write_files(
    files: &WrittenFiles,
    cert_pem: &str,
    key_pem: &str,
    force: bool,
) -> anyhow::Result<()> {
    let dir = files
        .certificate
        .parent()
        .expect("certificate paths are joined onto a directory");
    std::fs::create_dir_all(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))?;
    write_new(&files.key, key_pem, KEY_FILE_MODE, force)?;
    write_new(&files.certificate, cert_pem, CERT_FILE_MODE, force)?;
    Ok(())
}

/// Creates `path` with `mode` (an old file is removed first with `force`, so its mode does
/// not carry over).
fn write_new(path: &Path, text: &str, mode: u32, force: bool) -> anyhow::Result<()> {
    if force {
        match std::fs::remove_file(path) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
            Err(err) => {
                return Err(err).with_context(|| format!("cannot replace {}", path.display()));
            }
        }
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;
    use std::sync::Arc;

    use rustls::client::WebPkiServerVerifier;
    use rustls::client::danger::ServerCertVerifier as _;
    use rustls::crypto::CryptoProvider;
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::server::WebPkiClientVerifier;
    use rustls::{
        CertificateError, ClientConfig, ClientConnection, RootCertStore, ServerConfig,
        ServerConnection,
    };

    use super::*;

    /// Handshake flights at most: TLS 1.3 with client authentication needs three.
    const HANDSHAKE_FLIGHTS_MAX: usize = 8;

    fn ca_args(out: &Path) -> CaArgs {
        CaArgs {
            out: out.to_owned(),
            name: "Test CA".to_owned(),
            days: 30,
            force: false,
        }
    }

    fn node_args(ca: &Path, out: &Path, name: &str) -> NodeArgs {
        NodeArgs {
            ca: ca.to_owned(),
            out: out.to_owned(),
            name: name.to_owned(),
            dns_names: Vec::new(),
            ip_addrs: Vec::new(),
            node_id: None,
            days: 30,
            force: false,
        }
    }

    fn provider() -> Arc<CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn certs(path: &Path) -> Vec<CertificateDer<'static>> {
        CertificateDer::pem_file_iter(path)
            .expect("certificate file opens")
            .collect::<Result<_, _>>()
            .expect("certificate file parses")
    }

    fn key(path: &Path) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_file(path).expect("key file parses")
    }

    fn roots(ca_dir: &Path) -> Arc<RootCertStore> {
        let mut roots = RootCertStore::empty();
        for cert in certs(&ca_dir.join(CA_CERT_FILE)) {
            roots.add(cert).expect("CA certificate is a trust anchor");
        }
        Arc::new(roots)
    }

    /// Whether a server verifier built from the CA in `ca_dir` accepts `chain` for `name`.
    fn server_accepts(
        ca_dir: &Path,
        chain: &[CertificateDer<'static>],
        name: &str,
    ) -> Result<(), rustls::Error> {
        let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca_dir), provider())
            .build()
            .expect("server verifier builds");
        let name = ServerName::try_from(name.to_owned()).expect("valid server name");
        verifier
            .verify_server_cert(&chain[0], &chain[1..], &name, &[], UnixTime::now())
            .map(|_| ())
    }

    /// Whether a client verifier built from the CA in `ca_dir` accepts `chain`.
    fn client_accepts(
        ca_dir: &Path,
        chain: &[CertificateDer<'static>],
    ) -> Result<(), rustls::Error> {
        let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_dir), provider())
            .build()
            .expect("client verifier builds");
        verifier
            .verify_client_cert(&chain[0], &chain[1..], UnixTime::now())
            .map(|_| ())
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path)
            .expect("file exists")
            .permissions()
            .mode()
            & 0o777
    }

    #[test]
    fn node_certificate_chains_to_its_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let ca = make_ca(&ca_args(&ca_dir), SystemTime::now()).unwrap();
        assert_eq!(ca.certificate, ca_dir.join("ca.pem"));
        assert_eq!(ca.key, ca_dir.join("ca.key"));

        let mut args = node_args(&ca_dir, &dir.path().join("certs"), "node-1");
        args.dns_names = vec!["node-1.tributary.internal".to_owned()];
        args.ip_addrs = vec!["10.1.2.3".parse().unwrap(), "::1".parse().unwrap()];
        let node = make_node(&args, SystemTime::now()).unwrap();
        assert_eq!(node.certificate, dir.path().join("certs/node-1.pem"));
        assert_eq!(node.key, dir.path().join("certs/node-1.key"));

        let chain = certs(&node.certificate);
        assert_eq!(chain.len(), 2, "the node's certificate, then the CA's");
        assert_eq!(chain[1], certs(&ca.certificate)[0]);
        for name in ["node-1", "node-1.tributary.internal", "10.1.2.3", "::1"] {
            server_accepts(&ca_dir, &chain, name)
                .unwrap_or_else(|err| panic!("{name} is not accepted: {err}"));
        }
        // Only the names asked for: no defaults once --dns or --ip is given.
        for name in ["localhost", "127.0.0.1", "node-2"] {
            assert!(
                server_accepts(&ca_dir, &chain, name).is_err(),
                "{name} accepted"
            );
        }
        client_accepts(&ca_dir, &chain).expect("accepted as a client certificate");
        assert_eq!(certificate_node_id(&chain[0]), None, "no --node-id");

        let mut args = node_args(&ca_dir, &dir.path().join("certs"), "node-7");
        args.node_id = Some(7);
        let node = make_node(&args, SystemTime::now()).unwrap();
        let chain = certs(&node.certificate);
        assert_eq!(certificate_node_id(&chain[0]), Some(7));
        client_accepts(&ca_dir, &chain).expect("accepted as a client certificate");
        server_accepts(&ca_dir, &chain, "localhost").expect("still valid for its names");
    }

    #[test]
    fn a_cluster_key_is_random_private_and_never_replaced_silently() {
        let dir = tempfile::tempdir().unwrap();
        let args = |name: &str, force| ClusterKeyArgs {
            out: dir.path().join("keys").join(name),
            force,
        };
        make_cluster_key(&args("a.key", false)).unwrap();
        make_cluster_key(&args("b.key", false)).unwrap();
        let a = std::fs::read(dir.path().join("keys/a.key")).unwrap();
        let b = std::fs::read(dir.path().join("keys/b.key")).unwrap();
        assert_ne!(a, b);
        tributary_raft::peer_key::ClusterKey::from_text(&a, "a.key").expect("a usable key");
        assert_eq!(mode(&dir.path().join("keys/a.key")), 0o600);
        let error = make_cluster_key(&args("a.key", false))
            .unwrap_err()
            .to_string();
        assert!(error.contains("--force"), "{error}");
        assert_eq!(std::fs::read(dir.path().join("keys/a.key")).unwrap(), a);
        make_cluster_key(&args("a.key", true)).unwrap();
        assert_ne!(std::fs::read(dir.path().join("keys/a.key")).unwrap(), a);
    }

    #[test]
    fn node_certificate_defaults_to_localhost() {
        let dir = tempfile::tempdir().unwrap();
        make_ca(&ca_args(dir.path()), SystemTime::now()).unwrap();
        let node = make_node(&node_args(dir.path(), dir.path(), "n1"), SystemTime::now()).unwrap();
        let chain = certs(&node.certificate);
        for name in ["n1", "localhost", "127.0.0.1"] {
            server_accepts(dir.path(), &chain, name)
                .unwrap_or_else(|err| panic!("{name} is not accepted: {err}"));
        }
    }

    #[test]
    fn another_ca_rejects_the_node_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let ca_dir = dir.path().join("ca");
        let other_ca_dir = dir.path().join("other");
        make_ca(&ca_args(&ca_dir), SystemTime::now()).unwrap();
        make_ca(&ca_args(&other_ca_dir), SystemTime::now()).unwrap();
        let node = make_node(&node_args(&ca_dir, dir.path(), "node-1"), SystemTime::now()).unwrap();
        let chain = certs(&node.certificate);

        assert!(server_accepts(&other_ca_dir, &chain, "node-1").is_err());
        assert!(client_accepts(&other_ca_dir, &chain).is_err());
        // The same CA name does not help: trust follows the CA's key.
        assert!(client_accepts(&other_ca_dir, &chain[..1]).is_err());
    }

    #[test]
    fn expired_node_certificate_is_rejected() {
        let dir = tempfile::tempdir().unwrap();
        let made = SystemTime::now() - DAY * 40;
        make_ca(&ca_args(dir.path()), made).unwrap();
        // Valid for 30 days from 40 days ago.
        let node = make_node(&node_args(dir.path(), dir.path(), "node-1"), made).unwrap();
        let err = client_accepts(dir.path(), &certs(&node.certificate)).unwrap_err();
        assert!(
            matches!(
                err,
                rustls::Error::InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. }
                )
            ),
            "{err}"
        );
    }

    /// Two nodes with certificates from one CA complete a mutual-TLS handshake, each
    /// presenting its own certificate and key.
    #[test]
    fn two_nodes_complete_a_mutual_tls_handshake() {
        let dir = tempfile::tempdir().unwrap();
        make_ca(&ca_args(dir.path()), SystemTime::now()).unwrap();
        let server = make_node(
            &node_args(dir.path(), dir.path(), "node-1"),
            SystemTime::now(),
        )
        .unwrap();
        let client = make_node(
            &node_args(dir.path(), dir.path(), "node-2"),
            SystemTime::now(),
        )
        .unwrap();

        let client_verifier =
            WebPkiClientVerifier::builder_with_provider(roots(dir.path()), provider())
                .build()
                .unwrap();
        let server_config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(client_verifier)
            .with_single_cert(certs(&server.certificate), key(&server.key))
            .expect("node-1's key matches its certificate");
        let client_config = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots(dir.path()))
            .with_client_auth_cert(certs(&client.certificate), key(&client.key))
            .expect("node-2's key matches its certificate");
        let mut server_side = ServerConnection::new(Arc::new(server_config)).unwrap();
        let mut client_side = ClientConnection::new(
            Arc::new(client_config),
            ServerName::try_from("node-1").unwrap(),
        )
        .unwrap();

        for _ in 0..HANDSHAKE_FLIGHTS_MAX {
            if !client_side.is_handshaking() && !server_side.is_handshaking() {
                break;
            }
            let mut flight = Vec::new();
            while client_side.wants_write() {
                client_side.write_tls(&mut flight).unwrap();
            }
            server_side.read_tls(&mut flight.as_slice()).unwrap();
            server_side
                .process_new_packets()
                .expect("server accepts node-2");
            let mut flight = Vec::new();
            while server_side.wants_write() {
                server_side.write_tls(&mut flight).unwrap();
            }
            client_side.read_tls(&mut flight.as_slice()).unwrap();
            client_side
                .process_new_packets()
                .expect("client accepts node-1");
        }
        assert!(!client_side.is_handshaking() && !server_side.is_handshaking());
        let seen = server_side
            .peer_certificates()
            .expect("client presented a certificate");
        assert_eq!(seen[0], certs(&client.certificate)[0]);
    }

    #[test]
    fn key_files_are_private() {
        let dir = tempfile::tempdir().unwrap();
        let ca = make_ca(&ca_args(dir.path()), SystemTime::now()).unwrap();
        let node = make_node(
            &node_args(dir.path(), dir.path(), "node-1"),
            SystemTime::now(),
        )
        .unwrap();
        assert_eq!(mode(&ca.key), 0o600);
        assert_eq!(mode(&node.key), 0o600);
    }

    #[test]
    fn existing_files_are_kept_without_force() {
        let dir = tempfile::tempdir().unwrap();
        let ca = make_ca(&ca_args(dir.path()), SystemTime::now()).unwrap();
        let ca_pem = std::fs::read(&ca.certificate).unwrap();
        let err = make_ca(&ca_args(dir.path()), SystemTime::now()).unwrap_err();
        assert!(format!("{err:#}").contains("pass --force"), "{err:#}");
        assert_eq!(std::fs::read(&ca.certificate).unwrap(), ca_pem);

        let node = make_node(
            &node_args(dir.path(), dir.path(), "node-1"),
            SystemTime::now(),
        )
        .unwrap();
        let node_key = std::fs::read(&node.key).unwrap();
        // Only the key left behind still blocks.
        std::fs::remove_file(&node.certificate).unwrap();
        let err = make_node(
            &node_args(dir.path(), dir.path(), "node-1"),
            SystemTime::now(),
        )
        .unwrap_err();
        assert!(format!("{err:#}").contains("node-1.key exists"), "{err:#}");
        assert_eq!(std::fs::read(&node.key).unwrap(), node_key);
        assert!(!node.certificate.exists());
    }

    #[test]
    fn force_replaces_files_and_keeps_keys_private() {
        let dir = tempfile::tempdir().unwrap();
        let ca = make_ca(&ca_args(dir.path()), SystemTime::now()).unwrap();
        let old_pem = std::fs::read(&ca.certificate).unwrap();
        std::fs::set_permissions(&ca.key, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut args = ca_args(dir.path());
        args.force = true;
        make_ca(&args, SystemTime::now()).unwrap();
        assert_ne!(std::fs::read(&ca.certificate).unwrap(), old_pem);
        assert_eq!(mode(&ca.key), 0o600);
    }

    #[test]
    fn missing_or_mismatched_ca_gives_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out");
        let err = make_node(
            &node_args(&dir.path().join("nowhere"), &out, "node-1"),
            SystemTime::now(),
        )
        .unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("nowhere/ca.pem") && text.contains("tributary cert ca"),
            "{text}"
        );
        assert!(!out.exists(), "nothing written");

        // A CA certificate with another CA's key.
        let a = dir.path().join("a");
        let b = dir.path().join("b");
        make_ca(&ca_args(&a), SystemTime::now()).unwrap();
        make_ca(&ca_args(&b), SystemTime::now()).unwrap();
        std::fs::copy(b.join(CA_KEY_FILE), a.join(CA_KEY_FILE)).unwrap();
        let err = make_node(&node_args(&a, &out, "node-1"), SystemTime::now()).unwrap_err();
        assert!(format!("{err:#}").contains("is not the key of"), "{err:#}");

        std::fs::write(a.join(CA_KEY_FILE), "not a key").unwrap();
        let err = make_node(&node_args(&a, &out, "node-1"), SystemTime::now()).unwrap_err();
        assert!(
            format!("{err:#}").contains("is not a PEM private key"),
            "{err:#}"
        );

        // A node certificate is no CA.
        make_node(&node_args(&b, &b, "node-2"), SystemTime::now()).unwrap();
        std::fs::copy(b.join("node-2.pem"), b.join(CA_CERT_FILE)).unwrap();
        std::fs::copy(b.join("node-2.key"), b.join(CA_KEY_FILE)).unwrap();
        let err = make_node(&node_args(&b, &out, "node-1"), SystemTime::now()).unwrap_err();
        assert!(
            format!("{err:#}").contains("is not a CA certificate"),
            "{err:#}"
        );
    }

    #[test]
    fn bad_names_are_refused() {
        for name in [
            "",
            "ca",
            "../x",
            "a/b",
            "-x",
            "x-",
            "x.",
            "a..b",
            "node_1",
            &"n".repeat(64),
        ] {
            assert!(check_node_name(name).is_err(), "{name:?} accepted");
        }
        for name in ["node-1", "n1.example.com", "N2"] {
            check_node_name(name).unwrap();
        }
        let err = subject_alt_names("n1", &["bad name".to_owned()], &[]).unwrap_err();
        assert!(err.to_string().contains("--dns 'bad name'"), "{err}");
    }
}
