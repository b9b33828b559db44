//! The cluster key: how nodes without certificates prove to each other that they belong to
//! the same cluster before any peer RPC (Raft, membership, status, forwarding) is served.
//!
//! Every peer connection starts with a challenge-response handshake, both ways, before
//! HTTP/2 (inside TLS when mutual TLS is on too):
//!
//! ```text
//! dialer  -> server  "TRBPEER1" ‖ dialer nonce (32 bytes)
//! server  -> dialer  server nonce (32) ‖ HMAC-SHA256(key, "server" ‖ dialer nonce ‖ server nonce)
//! dialer  -> server  HMAC-SHA256(key, "dialer" ‖ dialer nonce ‖ server nonce)
//! server  -> dialer  1 (admitted) or 0 (refused, then closed)
//! ```
//!
//! The key never crosses the wire. Each side's nonce is fresh, so bytes recorded from one
//! connection and replayed on another carry a proof for the wrong nonces and are refused;
//! the server proves the key first, so a node never sends a request to an impostor.
//! The two proofs are made with different labels: a server's answer cannot be reflected
//! back as a dialer's proof. The handshake authenticates the connection; it does not
//! encrypt it (mutual TLS does, see the README's threat model).

use std::path::Path;

use hmac::{Hmac, Mac};
use rand::RngCore as _;
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// The first bytes of a keyed peer connection: names the handshake and its version.
pub const MAGIC: &[u8; 8] = b"TRBPEER1";
/// Fewest bytes a cluster key may have.
pub const KEY_BYTES_MIN: usize = 32;
const NONCE_BYTES: usize = 32;
const PROOF_BYTES: usize = 32;
const ADMITTED: u8 = 1;
const REFUSED: u8 = 0;
const SERVER_LABEL: &[u8] = b"tributary peer v1 server";
const DIALER_LABEL: &[u8] = b"tributary peer v1 dialer";

/// A cluster's shared secret (`--cluster-key-file`). Its `Debug` never shows it.
#[derive(Clone)]
pub struct ClusterKey(std::sync::Arc<[u8]>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(..)")
    }
}

/// Why a cluster key cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read the cluster key file {file}: {reason}")]
    Unreadable { file: String, reason: String },
    #[error(
        "the cluster key file {file} holds {len} bytes; a cluster key has at least \
         {KEY_BYTES_MIN} (make one with `tributary cert cluster-key --out FILE`)"
    )]
    TooShort { file: String, len: usize },
}

impl ClusterKey {
    /// The key in `text`: its bytes, leading and trailing whitespace (a final newline)
    /// left out. `file` names where it came from, for errors.
    pub fn from_text(text: &[u8], file: &str) -> Result<ClusterKey, KeyError> {
        let key = text.trim_ascii();
        if key.len() < KEY_BYTES_MIN {
            return Err(KeyError::TooShort {
                file: file.to_owned(),
                len: key.len(),
            });
        }
        Ok(ClusterKey(key.into()))
    }

    /// Reads the key file.
    pub fn read(path: &Path) -> Result<ClusterKey, KeyError> {
        let text = std::fs::read(path).map_err(|error| KeyError::Unreadable {
            file: path.display().to_string(),
            reason: error.to_string(),
        })?;
        ClusterKey::from_text(&text, &path.display().to_string())
    }

    /// A new random key, as the text of a key file: 64 hexadecimal digits (256 bits) and a
    /// newline.
    pub fn generate() -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let mut text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        text.push('\n');
        text
    }

    fn mac(&self, label: &[u8], dialer: &[u8], server: &[u8]) -> Hmac<Sha256> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes any key");
        mac.update(label);
        mac.update(dialer);
        mac.update(server);
        mac
    }

    fn proof(&self, label: &[u8], dialer: &[u8], server: &[u8]) -> [u8; PROOF_BYTES] {
        self.mac(label, dialer, server)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Compares in constant time.
    fn verify(&self, label: &[u8], dialer: &[u8], server: &[u8], proof: &[u8]) -> bool {
        self.mac(label, dialer, server).verify_slice(proof).is_ok()
    }
}

/// Why the server side of a handshake refused a connection.
#[derive(Debug)]
pub enum Refused {
    /// The connection did not start the handshake: its first bytes, to answer it in its
    /// own protocol (a gRPC client's HTTP/2 preface).
    NotKeyed { first: Vec<u8> },
    /// The dialer's proof is wrong: another key, or bytes replayed from another connection.
    WrongKey,
    /// The dialer hung up on the server's proof: it holds another key (a dialer checks the
    /// server's proof first and goes no further when it does not match).
    DialerHungUp,
    /// Closed or failed mid-handshake.
    Io(std::io::Error),
}

impl Refused {
    /// The `reason` label of `tributary_peer_refused_total`.
    pub fn reason(&self) -> &'static str {
        match self {
            Refused::NotKeyed { .. } => "no_key",
            Refused::WrongKey | Refused::DialerHungUp => "wrong_key",
            Refused::Io(_) => "handshake_failed",
        }
    }
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::NotKeyed { .. } => f.write_str(
                "the connection did not start the cluster-key handshake (a client without \
                 --cluster-key-file, or not a Tributary node)",
            ),
            Refused::WrongKey => f.write_str(
                "the dialer's proof of the cluster key is wrong (another cluster key, or a \
                 replayed connection)",
            ),
            Refused::DialerHungUp => f.write_str(
                "the dialer hung up on this node's proof of the cluster key: it holds another \
                 key (another cluster, or another --cluster-key-file)",
            ),
            Refused::Io(error) => write!(f, "the cluster-key handshake failed: {error}"),
        }
    }
}

/// The server side: admits the connection once the dialer has proved it knows `key`.
pub async fn accept<IO>(io: &mut IO, key: &ClusterKey) -> Result<(), Refused>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let mut hello = [0u8; MAGIC.len() + NONCE_BYTES];
    let mut first = [0u8; MAGIC.len()];
    io.read_exact(&mut first).await.map_err(Refused::Io)?;
    if &first != MAGIC {
        return Err(Refused::NotKeyed {
            first: first.to_vec(),
        });
    }
    hello[..MAGIC.len()].copy_from_slice(&first);
    io.read_exact(&mut hello[MAGIC.len()..])
        .await
        .map_err(Refused::Io)?;
    let dialer_nonce = &hello[MAGIC.len()..];
    let server_nonce = nonce();
    let mut answer = Vec::with_capacity(NONCE_BYTES + PROOF_BYTES);
    answer.extend_from_slice(&server_nonce);
    answer.extend_from_slice(&key.proof(SERVER_LABEL, dialer_nonce, &server_nonce));
    io.write_all(&answer).await.map_err(Refused::Io)?;
    io.flush().await.map_err(Refused::Io)?;
    let mut proof = [0u8; PROOF_BYTES];
    io.read_exact(&mut proof).await.map_err(|error| {
        if error.kind() == std::io::ErrorKind::UnexpectedEof {
            Refused::DialerHungUp
        } else {
            Refused::Io(error)
        }
    })?;
    if !key.verify(DIALER_LABEL, dialer_nonce, &server_nonce, &proof) {
        let _ = io.write_all(&[REFUSED]).await;
        let _ = io.flush().await;
        return Err(Refused::WrongKey);
    }
    io.write_all(&[ADMITTED]).await.map_err(Refused::Io)?;
    io.flush().await.map_err(Refused::Io)?;
    Ok(())
}

/// Why the dialing side of a handshake failed.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    #[error(
        "the peer does not know this cluster's key: it answered with a wrong proof (a node \
         of another cluster, or started with another --cluster-key-file)"
    )]
    WrongServerKey,
    #[error(
        "the peer refused this node's cluster key: it was started with another \
         --cluster-key-file"
    )]
    Refused,
    #[error(
        "the peer did not answer the cluster-key handshake ({0}): it runs without \
         --cluster-key-file, or is not a Tributary peer port"
    )]
    NotKeyed(std::io::Error),
}

/// The dialing side: proves this node knows `key`, once the server has proved it too.
pub async fn dial<IO>(io: &mut IO, key: &ClusterKey) -> Result<(), DialError>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let dialer_nonce = nonce();
    let mut hello = Vec::with_capacity(MAGIC.len() + NONCE_BYTES);
    hello.extend_from_slice(MAGIC);
    hello.extend_from_slice(&dialer_nonce);
    io.write_all(&hello).await.map_err(DialError::NotKeyed)?;
    io.flush().await.map_err(DialError::NotKeyed)?;
    let mut answer = [0u8; NONCE_BYTES + PROOF_BYTES];
    io.read_exact(&mut answer)
        .await
        .map_err(DialError::NotKeyed)?;
    let (server_nonce, server_proof) = answer.split_at(NONCE_BYTES);
    if !key.verify(SERVER_LABEL, &dialer_nonce, server_nonce, server_proof) {
        return Err(DialError::WrongServerKey);
    }
    let proof = key.proof(DIALER_LABEL, &dialer_nonce, server_nonce);
    io.write_all(&proof).await.map_err(DialError::NotKeyed)?;
    io.flush().await.map_err(DialError::NotKeyed)?;
    let mut verdict = [0u8; 1];
    match io.read_exact(&mut verdict).await {
        Ok(_) if verdict[0] == ADMITTED => Ok(()),
        Ok(_) => Err(DialError::Refused),
        Err(error) => Err(DialError::NotKeyed(error)),
    }
}

fn nonce() -> [u8; NONCE_BYTES] {
    let mut nonce = [0u8; NONCE_BYTES];
    rand::rng().fill_bytes(&mut nonce);
    nonce
}

#[cfg(test)]
mod tests {
    use tokio::io::duplex;

    use super::*;

    fn key(text: &str) -> ClusterKey {
        ClusterKey::from_text(text.as_bytes(), "test").unwrap()
    }

    const KEY: &str = "0123456789abcdef0123456789abcdef";

    fn the_key() -> &'static ClusterKey {
        static THE_KEY: std::sync::OnceLock<ClusterKey> = std::sync::OnceLock::new();
        THE_KEY.get_or_init(|| key(KEY))
    }

    /// Runs both sides over an in-memory pipe.
    async fn handshake(
        dialer_key: &ClusterKey,
        server_key: &ClusterKey,
    ) -> (Result<(), DialError>, Result<(), Refused>) {
        let (mut near, mut far) = duplex(1024);
        // Each side hangs up when done, as a connection would be closed.
        let dialer = async move { dial(&mut near, dialer_key).await };
        let server = async move { accept(&mut far, server_key).await };
        tokio::join!(dialer, server)
    }

    #[tokio::test]
    async fn nodes_with_the_same_key_admit_each_other_and_can_then_talk() {
        let (mut near, mut far) = duplex(1024);
        let (dialed, accepted) =
            tokio::join!(dial(&mut near, the_key()), accept(&mut far, the_key()));
        dialed.unwrap();
        accepted.unwrap();
        near.write_all(b"after").await.unwrap();
        let mut buf = [0u8; 5];
        far.read_exact(&mut buf).await.unwrap();
        assert_eq!(
            &buf, b"after",
            "the handshake leaves the stream to the protocol"
        );
    }

    #[tokio::test]
    async fn a_different_key_is_refused_on_both_sides() {
        let other = key("fedcba9876543210fedcba9876543210");
        let (dialed, accepted) = handshake(&other, the_key()).await;
        // The dialer sees the server's proof is wrong first and goes no further.
        assert!(
            matches!(dialed, Err(DialError::WrongServerKey)),
            "{dialed:?}"
        );
        let refused = accepted.unwrap_err();
        assert!(matches!(refused, Refused::DialerHungUp), "{refused:?}");
        assert_eq!(refused.reason(), "wrong_key");
    }

    #[tokio::test]
    async fn a_dialer_that_skips_checking_the_server_is_refused_for_its_own_proof() {
        // An impostor that answers the server's challenge with a proof made with its own key.
        let (mut near, mut far) = duplex(1024);
        let impostor = async {
            near.write_all(MAGIC).await.unwrap();
            near.write_all(&[7u8; NONCE_BYTES]).await.unwrap();
            let mut answer = [0u8; NONCE_BYTES + PROOF_BYTES];
            near.read_exact(&mut answer).await.unwrap();
            let wrong = key("fedcba9876543210fedcba9876543210").proof(
                DIALER_LABEL,
                &[7u8; NONCE_BYTES],
                &answer[..NONCE_BYTES],
            );
            near.write_all(&wrong).await.unwrap();
            let mut verdict = [9u8; 1];
            near.read_exact(&mut verdict).await.unwrap();
            verdict[0]
        };
        let (verdict, accepted) = tokio::join!(impostor, accept(&mut far, the_key()));
        assert_eq!(verdict, REFUSED);
        assert!(matches!(accepted, Err(Refused::WrongKey)), "{accepted:?}");
    }

    #[tokio::test]
    async fn bytes_recorded_from_one_connection_are_refused_on_another() {
        // Record what a genuine dialer sends.
        let (mut near, far) = duplex(1024);
        let (mut far_read, mut far_write) = tokio::io::split(far);
        let recorder = async {
            let mut recorded = Vec::new();
            let mut hello = [0u8; MAGIC.len() + NONCE_BYTES];
            far_read.read_exact(&mut hello).await.unwrap();
            recorded.extend_from_slice(&hello);
            // Answer as a genuine server would, so the dialer sends its proof.
            let mut server = Vec::new();
            let server_nonce = nonce();
            server.extend_from_slice(&server_nonce);
            server.extend_from_slice(&the_key().proof(
                SERVER_LABEL,
                &hello[MAGIC.len()..],
                &server_nonce,
            ));
            far_write.write_all(&server).await.unwrap();
            let mut proof = [0u8; PROOF_BYTES];
            far_read.read_exact(&mut proof).await.unwrap();
            recorded.extend_from_slice(&proof);
            far_write.write_all(&[ADMITTED]).await.unwrap();
            recorded
        };
        let (dialed, recorded) = tokio::join!(dial(&mut near, the_key()), recorder);
        dialed.unwrap();
        // Replayed to a server: its fresh nonce makes the recorded proof wrong.
        let (mut replay, mut server_side) = duplex(1024);
        let replayer = async {
            replay.write_all(&recorded).await.unwrap();
            let mut rest = Vec::new();
            replay.read_to_end(&mut rest).await.unwrap();
            rest
        };
        let server = async {
            let result = accept(&mut server_side, the_key()).await;
            drop(server_side);
            result
        };
        let (heard, accepted) = tokio::join!(replayer, server);
        assert!(matches!(accepted, Err(Refused::WrongKey)), "{accepted:?}");
        assert_eq!(
            heard.last(),
            Some(&REFUSED),
            "the replayer is told it was refused"
        );
    }

    #[tokio::test]
    async fn a_plain_grpc_client_is_refused_with_its_first_bytes_kept() {
        let (mut near, mut far) = duplex(1024);
        near.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await
            .unwrap();
        let refused = accept(&mut far, the_key()).await.unwrap_err();
        match refused {
            Refused::NotKeyed { first } => assert_eq!(first, b"PRI * HT"),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_server_without_the_handshake_is_reported_as_such() {
        let (mut near, mut far) = duplex(1024);
        let server = async {
            let mut buf = [0u8; 24];
            let _ = far.read(&mut buf).await;
            drop(far);
        };
        let (dialed, ()) = tokio::join!(dial(&mut near, the_key()), server);
        let error = dialed.unwrap_err();
        assert!(matches!(error, DialError::NotKeyed(_)), "{error:?}");
        assert!(error.to_string().contains("--cluster-key-file"), "{error}");
    }

    #[test]
    fn keys_are_long_enough_and_trimmed_and_new_ones_differ() {
        let error = ClusterKey::from_text(b"short\n", "key.txt").unwrap_err();
        assert!(error.to_string().contains("key.txt"), "{error}");
        assert!(error.to_string().contains("cert cluster-key"), "{error}");
        let a = ClusterKey::generate();
        let b = ClusterKey::generate();
        assert_ne!(a, b);
        assert_eq!(a.len(), 65);
        let parsed = ClusterKey::from_text(a.as_bytes(), "a").unwrap();
        assert_eq!(&*parsed.0, a.trim().as_bytes());
        assert_eq!(format!("{parsed:?}"), "ClusterKey(..)");
    }
}
