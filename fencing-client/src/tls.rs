//! TLS to the lock backends (features `etcd`, `redis`, `zookeeper-tls`): which certificate
//! authority to trust, and a client certificate for servers that ask for one. See [`ClientTls`].

use std::fmt;
use std::path::Path;
#[cfg(feature = "zookeeper-tls")]
use std::sync::Arc;
#[cfg(feature = "zookeeper-tls")]
use std::time::Duration;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::backend::LockError;

/// How a lock client checks the server's certificate over TLS, and which certificate it
/// shows if the server asks for one (mutual TLS). Over rustls, with `ring`.
///
/// The backend's address says whether TLS is used: `https://` etcd endpoints, `rediss://`
/// Redis URLs, `tcp+tls://` ZooKeeper servers (or every server, with
/// `ZkLockClient::connect_tls`). [`ClientTls::new`] trusts the system's certificate store
/// (etcd and Redis; ZooKeeper needs a CA); [`ca_file`](Self::ca_file) trusts the
/// certificate authorities in a PEM file instead, which is what a cluster with a CA of its
/// own needs. The server's certificate must name the host of the address (an IP address
/// as an IP address name).
///
/// A file that cannot be read, or holds no PEM certificate (or key), is refused here,
/// naming the file. A server whose certificate the CA did not sign fails the first
/// connection (etcd: the first request), with the TLS error (`invalid peer certificate:
/// UnknownIssuer`).
///
/// ```no_run
/// # #[cfg(all(feature = "etcd", feature = "redis"))]
/// # async fn demo() -> Result<(), fencing_client::LockError> {
/// use fencing_client::{EtcdLockClient, RedisLockClient, tls::ClientTls};
///
/// let tls = ClientTls::new().ca_file("/etc/fencing/ca.pem")?;
/// let etcd = EtcdLockClient::connect_tls(["https://etcd-1:2379"], &tls).await?;
/// let redis = RedisLockClient::builder("rediss://redis-1:6380").tls(tls).connect().await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct ClientTls {
    ca: Option<Pem>,
    identity: Option<(Pem, Pem)>,
}

/// PEM text, and where it came from (for messages).
#[derive(Clone)]
struct Pem {
    origin: String,
    text: Vec<u8>,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Where the files came from, never what they hold (a private key).
        f.debug_struct("ClientTls")
            .field("ca", &self.ca.as_ref().map_or("the system's roots", |ca| ca.origin.as_str()))
            .field("identity", &self.identity.as_ref().map(|(cert, _)| cert.origin.as_str()))
            .finish()
    }
}

impl ClientTls {
    /// The system's trusted roots (etcd, Redis), no client certificate.
    pub fn new() -> Self {
        Self::default()
    }

    /// Trusts the certificate authorities in the PEM file at `path` (and not the
    /// system's): a server's certificate must have been signed by one of them.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidArgument`] naming the file, if it cannot be read or holds no
    /// PEM certificate.
    pub fn ca_file(self, path: impl AsRef<Path>) -> Result<Self, LockError> {
        let ca = Pem::read(path.as_ref(), "CA file")?;
        Ok(Self { ca: Some(ca.certificates()?), ..self })
    }

    /// As [`ca_file`](Self::ca_file), with the PEM text itself.
    pub fn ca_pem(self, pem: impl Into<Vec<u8>>) -> Result<Self, LockError> {
        let ca = Pem { origin: "the CA PEM given".to_owned(), text: pem.into() };
        Ok(Self { ca: Some(ca.certificates()?), ..self })
    }

    /// Shows the certificate (chain) in the PEM file `cert`, with its private key in the PEM
    /// file `key`, to a server that asks for one (mutual TLS: etcd's `--client-cert-auth`,
    /// Redis's `tls-auth-clients`, ZooKeeper's `ssl.clientAuth`).
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidArgument`] naming the file, if either cannot be read, `cert`
    /// holds no PEM certificate or `key` no PEM private key.
    pub fn identity_files(self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Result<Self, LockError> {
        let cert = Pem::read(cert.as_ref(), "client certificate file")?.certificates()?;
        let key = Pem::read(key.as_ref(), "client key file")?;
        PrivateKeyDer::from_pem_slice(&key.text).map_err(|e| {
            LockError::InvalidArgument(format!("{}: no PEM private key in it: {e}", key.origin))
        })?;
        Ok(Self { identity: Some((cert, key)), ..self })
    }

    /// The CA's PEM, if one was given.
    pub(crate) fn ca_text(&self) -> Option<&[u8]> {
        self.ca.as_ref().map(|ca| ca.text.as_slice())
    }

    /// The client certificate's and key's PEM, if given.
    pub(crate) fn identity_text(&self) -> Option<(&[u8], &[u8])> {
        self.identity.as_ref().map(|(cert, key)| (cert.text.as_slice(), key.text.as_slice()))
    }
}

impl Pem {
    /// The file at `path`, called `what` in messages.
    fn read(path: &Path, what: &str) -> Result<Pem, LockError> {
        let origin = format!("{what} {}", path.display());
        match std::fs::read(path) {
            Ok(text) => Ok(Pem { origin, text }),
            Err(e) => Err(LockError::InvalidArgument(format!("{origin}: cannot read it: {e}"))),
        }
    }

    /// This PEM, if it holds certificates, and only well-formed ones.
    fn certificates(self) -> Result<Pem, LockError> {
        let mut count = 0;
        for cert in CertificateDer::pem_slice_iter(&self.text) {
            cert.map_err(|e| LockError::InvalidArgument(format!("{}: bad PEM: {e}", self.origin)))?;
            count += 1;
        }
        if count == 0 {
            return Err(LockError::InvalidArgument(format!("{}: no PEM certificate in it", self.origin)));
        }
        Ok(self)
    }
}

/// A TLS handshake with `host:port` as `tls` says (within 5 s): why it failed, if it did.
/// What a client that only says it lost the connection (ZooKeeper's) is asked again with.
#[cfg(feature = "zookeeper-tls")]
pub(crate) async fn handshake(tls: &ClientTls, host: &str, port: u16) -> Result<(), String> {
    use std::net::ToSocketAddrs as _;
    const BOUND: Duration = Duration::from_secs(5);
    let config = Arc::new(tls.rustls_config()?);
    let name = rustls::pki_types::ServerName::try_from(host.to_owned()).map_err(|e| e.to_string())?;
    let address = (host.to_owned(), port);
    let probe = move || -> std::io::Result<()> {
        let address = address.to_socket_addrs()?.next().ok_or(std::io::ErrorKind::NotFound)?;
        let mut socket = std::net::TcpStream::connect_timeout(&address, BOUND)?;
        socket.set_read_timeout(Some(BOUND))?;
        socket.set_write_timeout(Some(BOUND))?;
        let mut connection = rustls::ClientConnection::new(config, name).map_err(std::io::Error::other)?;
        while connection.is_handshaking() {
            connection.complete_io(&mut socket)?;
        }
        Ok(())
    };
    match tokio::task::spawn_blocking(probe).await {
        Ok(done) => done.map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(feature = "zookeeper-tls")]
impl ClientTls {
    /// A rustls configuration (on `ring`) that trusts this CA and shows this identity.
    fn rustls_config(&self) -> Result<rustls::ClientConfig, String> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(self.ca_text().unwrap_or_default()) {
            roots.add(cert.map_err(|e| e.to_string())?).map_err(|e| e.to_string())?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(ring()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots);
        let Some((cert, key)) = self.identity_text() else { return Ok(builder.with_no_client_auth()) };
        let chain =
            CertificateDer::pem_slice_iter(cert).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
        let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
        builder.with_client_auth_cert(chain, key).map_err(|e| e.to_string())
    }
}

/// Makes `ring` the process's rustls provider, unless one was chosen already. The Redis and
/// ZooKeeper clients build their TLS configurations with the process's provider, which rustls
/// cannot choose by itself in a build that has two (`zookeeper-tls` brings aws-lc-rs).
#[cfg(any(feature = "redis", feature = "zookeeper-tls"))]
pub(crate) fn use_ring_unless_chosen() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have installed one meanwhile: theirs stands.
        let _ = ring().install_default();
    }
}

/// rustls's `ring` provider: the workspace's (aws-lc-rs would need its C build, and cmake
/// elsewhere). rustls 0.23.48 deprecates it for having no post-quantum key exchange; etcd
/// (Go), Redis and ZooKeeper (OpenSSL, Java) agree on X25519 or a NIST curve with it.
#[cfg(any(feature = "redis", feature = "zookeeper-tls"))]
fn ring() -> rustls::crypto::CryptoProvider {
    #[allow(deprecated)]
    rustls::crypto::ring::default_provider()
}

/// `head`, then each of `source` and its sources that `head` does not say already,
/// `: `-separated: a TLS failure is often only in a source (tonic's "transport error",
/// hyper's "client error (Connect)" say nothing of the certificate).
#[cfg(feature = "etcd")]
pub(crate) fn with_sources(
    head: impl fmt::Display,
    mut source: Option<&(dyn std::error::Error + 'static)>,
) -> String {
    let mut text = head.to_string();
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text = format!("{text}: {said}");
        }
        source = cause.source();
    }
    text
}
