//! [`PgConnect`]: where and how to connect to PostgreSQL, TLS included.
//!
//! A connection string in either of libpq's forms, a URL
//! (`postgres://user@host:5432/db?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem`)
//! or `key=value` pairs (`host=db.internal dbname=app sslmode=verify-full sslrootcert='/etc/ssl/db-ca.pem'`),
//! with libpq's meaning of `sslmode` and `sslrootcert`. tokio-postgres reads every other parameter;
//! these two are read here, since its own parser knows only `disable`, `prefer` and `require`.
//!
//! | `sslmode` | TLS | the server's certificate |
//! | --- | --- | --- |
//! | `disable` | never | — |
//! | `prefer` (the default) | if the server offers it, else plain TCP | not checked\* |
//! | `require` | always (a server without TLS is refused) | not checked\* |
//! | `verify-ca` | always | signed by a CA in `sslrootcert`; any name |
//! | `verify-full` | always | signed by a CA in `sslrootcert`, and for the host connected to (an IP host must be an IP address in the certificate) |
//!
//! \* With an explicit `sslrootcert`, `prefer` and `require` check the chain as `verify-ca` does, as
//! libpq does. A mode that does not check the certificate still checks the handshake's signatures,
//! so the session is encrypted to whoever holds the certificate's key, but anyone on the path can
//! present a certificate of their own: only `verify-full` stops a man in the middle.
//!
//! `sslrootcert` is a PEM file of one or more CA certificates. Without it, `verify-ca` and
//! `verify-full` trust the system's CAs: its trust store as
//! [rustls-native-certs](https://docs.rs/rustls-native-certs) finds it (`SSL_CERT_FILE`,
//! `SSL_CERT_DIR`, else the distribution's bundle, such as
//! `/etc/ssl/certs/ca-certificates.crt`). `sslrootcert=system` asks for the system's CAs by name,
//! and then, as in libpq, `sslmode` defaults to `verify-full` and nothing weaker is taken. Unlike
//! libpq, `~/.postgresql/root.crt` is not read by default, and `PGSSLMODE` and `PGSSLROOTCERT` are not
//! looked at. Client certificates (`sslcert`, `sslkey`) are not supported.
//!
//! TLS is rustls's, on the `ring` provider: no OpenSSL on the machine is needed.
//!
//! ```
//! use fencing_postgres::PgConnect;
//! use fencing_postgres::connect::SslMode;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let managed: PgConnect = "postgres://app@db.example.com:5432/app?sslmode=require".parse()?;
//! assert_eq!(managed.ssl_mode(), SslMode::Require);
//! assert_eq!(managed.config().get_dbname(), Some("app"));
//!
//! let plain: PgConnect = "host=127.0.0.1 user=postgres sslmode=disable".parse()?;
//! assert_eq!(plain.ssl_mode(), SslMode::Disable);
//!
//! // A mode libpq does not have, or a CA file that cannot be read: an error naming the parameter.
//! let typo = "host=db sslmode=verify".parse::<PgConnect>().unwrap_err();
//! assert!(typo.to_string().starts_with("sslmode"), "{typo}");
//! let missing = "host=db sslmode=verify-full sslrootcert=/nonexistent/ca.pem".parse::<PgConnect>();
//! assert!(missing.unwrap_err().to_string().contains("sslrootcert=/nonexistent/ca.pem"));
//! # Ok(()) }
//! ```
//!
//! A refused handshake names its cause: [`describe_error`] of the error a connection (or a pool)
//! returns reads like `TLS: the server's certificate is not valid for 127.0.0.2, only for
//! 127.0.0.1 and localhost (sslmode=verify-full, sslrootcert=/etc/ssl/db-ca.pem)`, where
//! tokio-postgres's own message is only "error performing TLS handshake".

use std::borrow::Cow;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use percent_encoding::percent_decode_str;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{Client, Config, Connection, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

/// libpq's `sslmode`: whether to use TLS, and what of the server's certificate to check
/// (the [module's table](self)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SslMode {
    /// Plain TCP only.
    Disable,
    /// TLS if the server offers it, without checking its certificate; plain TCP otherwise.
    #[default]
    Prefer,
    /// TLS, without checking the server's certificate.
    Require,
    /// TLS; the certificate must be signed by a trusted CA, for any name.
    VerifyCa,
    /// TLS; the certificate must be signed by a trusted CA and be for the host connected to.
    VerifyFull,
}

impl SslMode {
    /// The mode as libpq spells it (`verify-full`).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }
}

impl fmt::Display for SslMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SslMode {
    type Err = PgConnectError;

    fn from_str(mode: &str) -> Result<Self, PgConnectError> {
        Ok(match mode {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            "allow" => {
                return Err(PgConnectError::new(
                    "sslmode=allow is not supported (plain TCP first, TLS only if refused): use \
                     prefer, or disable",
                ));
            }
            other => {
                return Err(PgConnectError::new(format!(
                    "sslmode={other:?} is not a mode: disable, prefer, require, verify-ca or verify-full"
                )));
            }
        })
    }
}

/// Where and how to connect: tokio-postgres's [`Config`] and the TLS connector that its `sslmode`
/// and `sslrootcert` call for ([`PgTls`]). Parse it from a connection string (the
/// [module's docs](self) say what each `sslmode` checks), or convert a `Config`.
///
/// [`pool`](crate::pool()), [`PgSharedStore`](crate::PgSharedStore) and fencing-client's
/// `PgLockClient` take one (or anything that converts into one).
#[derive(Clone, Debug)]
pub struct PgConnect {
    config: Config,
    tls: PgTls,
}

impl PgConnect {
    /// `config` with TLS as `mode` and `root_cert` (`sslrootcert`: a PEM file of CA certificates,
    /// or `system` for the system's CAs) say. The mode given to `config` is replaced by the one
    /// tokio-postgres needs for `mode` (`require` for both `verify-*`).
    ///
    /// # Errors
    ///
    /// A `root_cert` that cannot be read or holds no valid CA certificate; no CA certificate in the
    /// system's trust store when one is needed; `sslrootcert=system` with a mode weaker than
    /// `verify-full`.
    pub fn new(mut config: Config, mode: SslMode, root_cert: Option<&Path>) -> Result<Self, PgConnectError> {
        let roots = match root_cert {
            Some(path) if path == Path::new("system") => Roots::System,
            Some(path) => Roots::File(path.to_owned()),
            None => Roots::System,
        };
        if matches!(roots, Roots::System) && root_cert.is_some() && mode != SslMode::VerifyFull {
            return Err(PgConnectError::new(format!(
                "sslrootcert=system needs sslmode=verify-full, not {mode} (as in libpq: a weaker \
                 mode would not check what the system's CAs vouch for)"
            )));
        }
        let check = match (mode, root_cert.is_some()) {
            (SslMode::Disable, _) | (SslMode::Prefer | SslMode::Require, false) => Check::Nothing,
            (SslMode::Prefer | SslMode::Require | SslMode::VerifyCa, _) => Check::Chain,
            (SslMode::VerifyFull, _) => Check::ChainAndName,
        };
        config.ssl_mode(match mode {
            SslMode::Disable => tokio_postgres::config::SslMode::Disable,
            SslMode::Prefer => tokio_postgres::config::SslMode::Prefer,
            SslMode::Require | SslMode::VerifyCa | SslMode::VerifyFull => {
                tokio_postgres::config::SslMode::Require
            }
        });
        name_hosts(&mut config);
        let tls = PgTls::new(mode, check, roots)?;
        Ok(Self { config, tls })
    }

    /// tokio-postgres's settings: host, port, user, database, timeouts, and the rest of the
    /// connection string.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The settings, to change (TLS stays as parsed: its connector is [`tls`](Self::tls)).
    pub fn config_mut(&mut self) -> &mut Config {
        &mut self.config
    }

    /// The TLS connector, for tokio-postgres (`config().connect(tls().clone())`) or a pool's
    /// `Manager`: `Clone + Send + Sync + 'static`.
    #[must_use]
    pub fn tls(&self) -> &PgTls {
        &self.tls
    }

    /// The settings and the connector, apart (for a pool's `Manager`, say).
    #[must_use]
    pub fn into_parts(self) -> (Config, PgTls) {
        (self.config, self.tls)
    }

    /// The `sslmode` in effect.
    #[must_use]
    pub fn ssl_mode(&self) -> SslMode {
        self.tls.mode
    }

    /// Opens one connection: the client, and the connection to drive (spawn it).
    ///
    /// # Errors
    ///
    /// tokio-postgres's: no answer, refused, authentication, a TLS handshake refused
    /// ([`describe_error`] says why: a certificate, a name).
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, PgTlsStream>), tokio_postgres::Error> {
        self.config.connect(self.tls.clone()).await
    }
}

impl FromStr for PgConnect {
    type Err = PgConnectError;

    /// A URL (`postgres://…` or `postgresql://…`) or `key=value` pairs, as libpq takes them.
    fn from_str(conninfo: &str) -> Result<Self, PgConnectError> {
        let Split { rest, ssl_mode, root_cert } = split(conninfo)?;
        // "invalid connection string: unknown option `sslcert`", say.
        let config: Config = rest.parse().map_err(|error: tokio_postgres::Error| {
            PgConnectError::with_source(describe_error(&error), error)
        })?;
        let ssl_mode = match ssl_mode {
            Some(mode) => mode.parse()?,
            None if root_cert.as_deref() == Some("system") => SslMode::VerifyFull,
            None => SslMode::Prefer,
        };
        Self::new(config, ssl_mode, root_cert.as_deref().map(Path::new))
    }
}

impl From<Config> for PgConnect {
    /// `config`'s `sslmode` as libpq means it: `prefer` (the default) tries TLS without a
    /// certificate check, `require` insists on it, `disable` never uses it.
    fn from(mut config: Config) -> Self {
        name_hosts(&mut config);
        let mode = match config.get_ssl_mode() {
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            _ => SslMode::Prefer,
        };
        let tls = PgTls::new(mode, Check::Nothing, Roots::System).expect("a TLS set-up that reads no file");
        Self { config, tls }
    }
}

/// With `hostaddr` and no `host`, each address is the name the certificate is checked against, as
/// in libpq: tokio-postgres takes TLS's name from `host` only, and without one refuses to start a
/// handshake (which `prefer` does whenever the server offers TLS).
fn name_hosts(config: &mut Config) {
    if config.get_hosts().is_empty() {
        for addr in config.get_hostaddrs().to_vec() {
            config.host(addr.to_string());
        }
    }
}

/// The connection string without `sslmode` and `sslrootcert`, and their values.
struct Split {
    rest: String,
    ssl_mode: Option<String>,
    root_cert: Option<String>,
}

impl Split {
    /// Takes `key = value` if it is one of ours (the last one given wins, as in libpq).
    fn take(&mut self, key: &str, value: String) -> bool {
        match key {
            "sslmode" => self.ssl_mode = Some(value),
            "sslrootcert" => self.root_cert = Some(value),
            _ => return false,
        }
        true
    }
}

/// Takes `sslmode` and `sslrootcert` out of a URL's query or out of `key=value` pairs.
fn split(conninfo: &str) -> Result<Split, PgConnectError> {
    let mut split = Split { rest: String::new(), ssl_mode: None, root_cert: None };
    let is_url = ["postgres://", "postgresql://"].iter().any(|prefix| conninfo.starts_with(prefix));
    if is_url {
        // As tokio-postgres reads a URL: the credentials end at the first `@`, the query
        // starts at the first `?` after them, and its pairs are split at `&` and `=`.
        let after_credentials = conninfo.find('@').map_or(0, |at| at + 1);
        let Some(query) = conninfo[after_credentials..].find('?').map(|q| after_credentials + q) else {
            split.rest = conninfo.to_owned();
            return Ok(split);
        };
        let mut kept = Vec::new();
        for pair in conninfo[query + 1..].split('&') {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            let decode = |text: &str| percent_decode_str(text).decode_utf8().map(Cow::into_owned);
            let key = decode(key).unwrap_or_default();
            if ["sslmode", "sslrootcert"].contains(&key.as_str()) {
                let value = decode(value)
                    .map_err(|error| PgConnectError::with_source(format!("{key}: not UTF-8"), error))?;
                split.take(&key, value);
            } else {
                kept.push(pair);
            }
        }
        split.rest = conninfo[..query].to_owned();
        if !kept.is_empty() {
            split.rest = format!("{}?{}", split.rest, kept.join("&"));
        }
        return Ok(split);
    }
    let mut pairs = Vec::new();
    let mut chars = conninfo.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace() && *c != '=')).collect();
        if key.is_empty() {
            break;
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        if chars.next() != Some('=') {
            return Err(PgConnectError::new(format!("invalid connection string: `{key}` without `= value`")));
        }
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let value = kv_value(&mut chars, &key)?;
        if !split.take(&key, value.clone()) {
            pairs.push(format!("{key}='{}'", value.replace('\\', "\\\\").replace('\'', "\\'")));
        }
    }
    split.rest = pairs.join(" ");
    Ok(split)
}

/// A value of `key=value` pairs as libpq (and tokio-postgres) read it: up to the next space, or
/// in single quotes; a backslash takes the next character as it is.
fn kv_value(
    chars: &mut std::iter::Peekable<std::str::Chars<'_>>,
    key: &str,
) -> Result<String, PgConnectError> {
    let quoted = chars.next_if_eq(&'\'').is_some();
    let mut value = String::new();
    loop {
        match chars.next() {
            Some('\'') if quoted => return Ok(value),
            None if quoted => {
                return Err(PgConnectError::new(format!(
                    "invalid connection string: the quoted value of `{key}` has no closing quote"
                )));
            }
            Some(c) if c.is_whitespace() && !quoted => break,
            None => break,
            Some('\\') => value.extend(chars.next()),
            Some(c) => value.push(c),
        }
    }
    if value.is_empty() {
        return Err(PgConnectError::new(format!("invalid connection string: `{key}=` has no value")));
    }
    Ok(value)
}

/// Which CAs a checked certificate must come from.
#[derive(Debug, Clone)]
enum Roots {
    /// `sslrootcert`'s.
    File(PathBuf),
    /// The system's trust store.
    System,
}

impl Roots {
    fn load(&self) -> Result<RootCertStore, PgConnectError> {
        let mut roots = RootCertStore::empty();
        match self {
            Self::File(path) => {
                let named = |what: &str| format!("sslrootcert={}: {what}", path.display());
                let pem = std::fs::read(path).map_err(|error| {
                    PgConnectError::with_source(named(&format!("cannot be read: {error}")), error)
                })?;
                for cert in CertificateDer::pem_slice_iter(&pem) {
                    let cert = cert.map_err(|error| {
                        PgConnectError::with_source(
                            named(&format!("is not a valid PEM file: {error}")),
                            error,
                        )
                    })?;
                    roots.add(cert).map_err(|error| {
                        PgConnectError::with_source(
                            named(&format!("holds an invalid certificate: {error}")),
                            error,
                        )
                    })?;
                }
                if roots.is_empty() {
                    return Err(PgConnectError::new(named(
                        "holds no certificate (expected PEM: -----BEGIN CERTIFICATE-----)",
                    )));
                }
            }
            Self::System => {
                let found = rustls_native_certs::load_native_certs();
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
                    return Err(PgConnectError::new(format!(
                        "sslrootcert: none given, and no CA certificate was found in the system's trust \
                         store ({}); give the server's CA as sslrootcert=/path/to/ca.pem",
                        if errors.is_empty() { "it is empty".to_owned() } else { errors.join("; ") }
                    )));
                }
            }
        }
        Ok(roots)
    }
}

impl fmt::Display for Roots {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File(path) => write!(f, "sslrootcert={}", path.display()),
            Self::System => f.write_str("the system's trust store"),
        }
    }
}

/// What of the server's certificate is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Check {
    /// Only the handshake's signatures (`prefer`, `require`).
    Nothing,
    /// The chain to a trusted CA (`verify-ca`, or a mode below it with `sslrootcert`).
    Chain,
    /// The chain and the host's name (`verify-full`).
    ChainAndName,
}

/// The TLS connector of a [`PgConnect`]: tokio-postgres's `MakeTlsConnect` over rustls (`ring`),
/// checking what its `sslmode` and `sslrootcert` call for. A cheap clone shares its set-up.
#[derive(Clone)]
pub struct PgTls {
    rustls: MakeRustlsConnect,
    mode: SslMode,
    /// The CAs, when the chain is checked: named in a refusal.
    roots: Option<Arc<Roots>>,
}

impl fmt::Debug for PgTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgTls").field("mode", &self.mode).field("roots", &self.roots).finish_non_exhaustive()
    }
}

impl PgTls {
    fn new(mode: SslMode, check: Check, roots: Roots) -> Result<Self, PgConnectError> {
        // ring, not aws-lc-rs: no cmake or NASM to build it. rustls 0.23.48 deprecates ring's
        // provider for having no post-quantum key exchange; PostgreSQL servers (OpenSSL) agree
        // on X25519 or a NIST curve with it as with any client.
        #[allow(deprecated)]
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let webpki = match check {
            Check::Nothing => None,
            Check::Chain | Check::ChainAndName => Some(
                WebPkiServerVerifier::builder_with_provider(Arc::new(roots.load()?), Arc::clone(&provider))
                    .build()
                    .map_err(|error| PgConnectError::with_source(format!("{roots}: {error}"), error))?,
            ),
        };
        let verifier =
            Arc::new(Verifier { provider: Arc::clone(&provider), webpki, any_name: check == Check::Chain });
        let mut config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|error| PgConnectError::with_source(format!("TLS: {error}"), error))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // What libpq 17 sends, and what a server taking TLS straight away (sslnegotiation=direct) requires.
        config.alpn_protocols = vec![b"postgresql".to_vec()];
        let roots = (check != Check::Nothing).then(|| Arc::new(roots));
        Ok(Self { rustls: MakeRustlsConnect::new(config), mode, roots })
    }

    /// What a refusal says it was asked for: `sslmode=verify-full, sslrootcert=/path/ca.pem`.
    fn context(&self) -> String {
        match self.roots.as_deref() {
            Some(Roots::File(path)) => format!("sslmode={}, sslrootcert={}", self.mode, path.display()),
            _ => format!("sslmode={}", self.mode),
        }
    }
}

/// The stream of a TLS connection of [`PgTls`]'s (tokio-postgres's `Connection<Socket, PgTlsStream>`).
pub type PgTlsStream = <MakeRustlsConnect as MakeTlsConnect<Socket>>::Stream;

impl MakeTlsConnect<Socket> for PgTls {
    type Stream = PgTlsStream;
    type TlsConnect = PgTlsConnect;
    type Error = std::convert::Infallible;

    fn make_tls_connect(&mut self, host: &str) -> Result<PgTlsConnect, Self::Error> {
        let inner = <MakeRustlsConnect as MakeTlsConnect<Socket>>::make_tls_connect(&mut self.rustls, host)?;
        let roots = self.roots.as_deref().map_or_else(String::new, ToString::to_string);
        Ok(PgTlsConnect { inner, host: host.to_owned(), context: self.context(), roots })
    }
}

/// One handshake of [`PgTls`]'s, for one host (tokio-postgres makes it; nothing to do with it).
pub struct PgTlsConnect {
    inner: <MakeRustlsConnect as MakeTlsConnect<Socket>>::TlsConnect,
    host: String,
    context: String,
    roots: String,
}

impl TlsConnect<Socket> for PgTlsConnect {
    type Stream = PgTlsStream;
    type Error = TlsHandshakeError;
    type Future = Pin<Box<dyn Future<Output = Result<PgTlsStream, TlsHandshakeError>> + Send>>;

    fn connect(self, stream: Socket) -> Self::Future {
        let Self { inner, host, context, roots } = self;
        Box::pin(async move {
            inner.connect(stream).await.map_err(|error| TlsHandshakeError { error, host, context, roots })
        })
    }
}

/// A TLS handshake with the server that did not complete: its [`Display`](fmt::Display) names the
/// cause (the certificate, the name, the CA it was checked against) and the `sslmode` asked for.
#[derive(Debug)]
pub struct TlsHandshakeError {
    error: io::Error,
    host: String,
    context: String,
    roots: String,
}

impl TlsHandshakeError {
    /// The TLS layer's refusal (a certificate, a protocol version), not a lost connection.
    fn rustls(&self) -> Option<&rustls::Error> {
        self.error.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
    }

    /// Whether the connection failed under the handshake (reset, closed, timed out), rather than
    /// TLS refusing it: trying again later may succeed.
    #[must_use]
    pub fn is_io(&self) -> bool {
        self.rustls().is_none()
    }
}

impl fmt::Display for TlsHandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let host = &self.host;
        let what = match self.rustls() {
            None => format!("the connection failed during the handshake: {}", self.error),
            Some(rustls::Error::InvalidCertificate(refused)) => match refused {
                CertificateError::NotValidForName => {
                    format!("the server's certificate is not valid for {host}")
                }
                CertificateError::NotValidForNameContext { presented, .. } => {
                    let names: Vec<&str> = presented.iter().map(|name| bare_name(name)).collect();
                    match names.split_last() {
                        None => format!("the server's certificate is not valid for {host}, nor for any name"),
                        Some((last, [])) => {
                            format!("the server's certificate is not valid for {host}, only for {last}")
                        }
                        Some((last, first)) => format!(
                            "the server's certificate is not valid for {host}, only for {} and {last}",
                            first.join(", ")
                        ),
                    }
                }
                CertificateError::UnknownIssuer => {
                    format!("the server's certificate is not signed by a CA in {}", self.roots)
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    format!("the server's certificate has expired ({refused})")
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    format!("the server's certificate is not valid yet ({refused})")
                }
                other => format!("the server's certificate was refused: {other}"),
            },
            Some(other) => other.to_string(),
        };
        write!(f, "TLS: {what} ({})", self.context)
    }
}

impl StdError for TlsHandshakeError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.error)
    }
}

/// A name as webpki lists it (`DnsName("localhost")`, `IpAddress(127.0.0.1)`), bare.
fn bare_name(presented: &str) -> &str {
    for (prefix, suffix) in [("DnsName(\"", "\")"), ("IpAddress(", ")")] {
        if let Some(name) = presented.strip_prefix(prefix).and_then(|rest| rest.strip_suffix(suffix)) {
            return name;
        }
    }
    presented
}

/// What [`PgTls`] checks of the server's certificate. Always: that the server holds the
/// certificate's key (the handshake's signatures, with the provider's algorithms). With `webpki`:
/// its chain to a trusted CA, and its name unless `any_name` (`verify-ca`). webpki checks the
/// chain first, so a name mismatch is the one refusal left after a chain that holds.
#[derive(Debug)]
struct Verifier {
    provider: Arc<CryptoProvider>,
    webpki: Option<Arc<WebPkiServerVerifier>>,
    any_name: bool,
}

impl ServerCertVerifier for Verifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(webpki) = &self.webpki else { return Ok(ServerCertVerified::assertion()) };
        match webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if self.any_name => Ok(ServerCertVerified::assertion()),
            checked => checked,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// A connection string [`PgConnect`] cannot take; the message names the parameter.
#[derive(Debug)]
pub struct PgConnectError {
    message: String,
    source: Option<Box<dyn StdError + Send + Sync>>,
}

impl PgConnectError {
    fn new(message: impl Into<String>) -> Self {
        Self { message: message.into(), source: None }
    }

    fn with_source(message: String, source: impl StdError + Send + Sync + 'static) -> Self {
        Self { message, source: Some(Box::new(source)) }
    }
}

impl fmt::Display for PgConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for PgConnectError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|source| source as &(dyn StdError + 'static))
    }
}

/// `error` and its causes in one line. tokio-postgres's errors say little by themselves ("db
/// error", "error performing TLS handshake"); their causes say what happened (the server's
/// message, the certificate refused). A cause already in the text is not repeated, and a TLS
/// refusal of [`PgTls`]'s stands in for tokio-postgres's "error performing TLS handshake".
#[must_use]
pub fn describe_error(error: &(dyn StdError + 'static)) -> String {
    /// tokio-postgres's whole message for a failed handshake.
    const HANDSHAKE: &str = "error performing TLS handshake";
    let mut text = String::new();
    let mut current = Some(error);
    while let Some(error) = current {
        let said = error.to_string();
        let mut said = said.trim_end();
        if said.ends_with(HANDSHAKE) && tls_refusal_below(error) {
            said = said[..said.len() - HANDSHAKE.len()].trim_end_matches([':', ' ']);
        }
        if !said.is_empty() && !text.contains(said) {
            if !text.is_empty() {
                text.push_str(": ");
            }
            text.push_str(said);
        }
        if error.is::<TlsHandshakeError>() {
            // Its own cause (rustls's words, or the I/O error) is in its message already.
            break;
        }
        current = error.source();
    }
    text
}

/// Whether a [`TlsHandshakeError`] is among `error`'s causes.
fn tls_refusal_below(error: &(dyn StdError + 'static)) -> bool {
    let mut cause = error.source();
    while let Some(error) = cause {
        if error.is::<TlsHandshakeError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// A connection the claims' session could not open, as its keeper logs it: with its causes.
pub(crate) fn store_error(error: tokio_postgres::Error) -> fencing_layer::store::StoreError {
    fencing_layer::store::StoreError::log(Described(error))
}

/// A tokio-postgres error whose message is [`describe_error`]'s.
#[derive(Debug)]
struct Described(tokio_postgres::Error);

impl fmt::Display for Described {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&describe_error(&self.0))
    }
}

impl StdError for Described {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(conninfo: &str) -> PgConnect {
        conninfo.parse().unwrap_or_else(|error| panic!("{conninfo}: {error}"))
    }

    fn refused(conninfo: &str) -> String {
        match conninfo.parse::<PgConnect>() {
            Ok(connect) => panic!("{conninfo} was taken: {connect:?}"),
            Err(error) => error.to_string(),
        }
    }

    #[test]
    fn urls_keep_every_other_parameter() {
        let connect = parsed(
            "postgres://app:p%40ss@db.example.com:6543/orders?application_name=billing&sslmode=require&connect_timeout=7",
        );
        assert_eq!(connect.ssl_mode(), SslMode::Require);
        let config = connect.config();
        assert_eq!(config.get_user(), Some("app"));
        assert_eq!(config.get_password(), Some(&b"p@ss"[..]));
        assert_eq!(config.get_ports(), [6543]);
        assert_eq!(config.get_dbname(), Some("orders"));
        assert_eq!(config.get_application_name(), Some("billing"));
        assert_eq!(config.get_connect_timeout(), Some(&std::time::Duration::from_secs(7)));
        assert_eq!(config.get_ssl_mode(), tokio_postgres::config::SslMode::Require);
    }

    #[test]
    fn the_default_is_prefer_in_both_forms() {
        for conninfo in ["postgres://u@h/db", "postgresql://h", "host=h user=u", ""] {
            let connect = parsed(conninfo);
            assert_eq!(connect.ssl_mode(), SslMode::Prefer, "{conninfo}");
            assert_eq!(
                connect.config().get_ssl_mode(),
                tokio_postgres::config::SslMode::Prefer,
                "{conninfo}"
            );
        }
    }

    #[test]
    fn each_mode_in_both_forms() {
        // Any certificate parses as a CA to trust; this one is made here.
        let ca = std::env::temp_dir().join(format!("fencing-connect-ca-{}.pem", std::process::id()));
        std::fs::write(&ca, rcgen::generate_simple_self_signed(["127.0.0.1".to_owned()]).unwrap().cert.pem())
            .unwrap();
        let ca_text = ca.display().to_string();
        for (mode, expected, wire) in [
            ("disable", SslMode::Disable, tokio_postgres::config::SslMode::Disable),
            ("prefer", SslMode::Prefer, tokio_postgres::config::SslMode::Prefer),
            ("require", SslMode::Require, tokio_postgres::config::SslMode::Require),
            ("verify-ca", SslMode::VerifyCa, tokio_postgres::config::SslMode::Require),
            ("verify-full", SslMode::VerifyFull, tokio_postgres::config::SslMode::Require),
        ] {
            let root = percent_encoding::utf8_percent_encode(&ca_text, percent_encoding::NON_ALPHANUMERIC);
            for conninfo in [
                format!("postgres://u@127.0.0.1:5432/db?sslmode={mode}&sslrootcert={root}"),
                format!("postgres://u@127.0.0.1:5432/db?sslrootcert={ca_text}&sslmode={mode}"),
                format!("host=127.0.0.1 sslmode={mode} sslrootcert='{ca_text}' dbname=db"),
                format!("host = 127.0.0.1   sslmode = '{mode}' sslrootcert={ca_text}"),
            ] {
                let connect = parsed(&conninfo);
                assert_eq!(connect.ssl_mode(), expected, "{conninfo}");
                assert_eq!(connect.config().get_ssl_mode(), wire, "{conninfo}");
                assert_eq!(connect.config().get_hosts().len(), 1, "{conninfo}");
                // With a CA file, every mode that uses TLS checks the chain, as libpq does.
                let checked = connect.tls().roots.is_some();
                assert_eq!(checked, expected != SslMode::Disable, "{conninfo}");
            }
        }
        let _ = std::fs::remove_file(ca);
    }

    #[test]
    fn key_value_quoting_is_kept_for_the_other_parameters() {
        let connect = parsed(
            r"host=127.0.0.1 password='it\'s a \\secret' application_name=a\ b sslmode=disable options='-c x=1'",
        );
        let config = connect.config();
        assert_eq!(config.get_password(), Some(&br"it's a \secret"[..]));
        assert_eq!(config.get_application_name(), Some("a b"));
        assert_eq!(config.get_options(), Some("-c x=1"));
        assert_eq!(connect.ssl_mode(), SslMode::Disable);
        // The last one given wins.
        assert_eq!(parsed("host=h sslmode=require sslmode=disable").ssl_mode(), SslMode::Disable);
        assert_eq!(parsed("postgres://h/?sslmode=disable&sslmode=require").ssl_mode(), SslMode::Require);
    }

    #[test]
    fn bad_values_name_the_parameter() {
        for conninfo in ["host=h sslmode=verify", "postgres://h/db?sslmode=VERIFY-FULL", "host=h sslmode=''"]
        {
            assert!(refused(conninfo).starts_with("sslmode="), "{conninfo}: {}", refused(conninfo));
        }
        assert!(refused("host=h sslmode=allow").contains("sslmode=allow is not supported"));
        let missing = refused("host=h sslmode=verify-ca sslrootcert=/nonexistent/ca.pem");
        assert!(missing.starts_with("sslrootcert=/nonexistent/ca.pem: cannot be read"), "{missing}");
        let missing = refused("postgres://h/db?sslmode=require&sslrootcert=%2Fnonexistent%2Fca%20x.pem");
        assert!(missing.starts_with("sslrootcert=/nonexistent/ca x.pem: cannot be read"), "{missing}");
        let not_pem = std::env::temp_dir().join(format!("fencing-connect-not-pem-{}", std::process::id()));
        std::fs::write(&not_pem, "not a certificate\n").unwrap();
        let empty = refused(&format!("host=h sslmode=verify-full sslrootcert={}", not_pem.display()));
        assert!(empty.contains("holds no certificate"), "{empty}");
        std::fs::write(&not_pem, "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n")
            .unwrap();
        let garbled = refused(&format!("host=h sslmode=verify-full sslrootcert={}", not_pem.display()));
        assert!(garbled.starts_with(&format!("sslrootcert={}", not_pem.display())), "{garbled}");
        let _ = std::fs::remove_file(not_pem);
        let weak = refused("host=h sslmode=require sslrootcert=system");
        assert!(weak.contains("sslrootcert=system needs sslmode=verify-full"), "{weak}");
        // What tokio-postgres refuses, with its reason rather than "invalid connection string" alone.
        let unknown = refused("host=h sslcert=/client.pem");
        assert_eq!(unknown, "invalid connection string: unknown option `sslcert`");
        let bad_port = refused("postgres://h:port/db?sslmode=require");
        assert!(
            bad_port.starts_with("invalid connection string: ") && bad_port.contains("port"),
            "{bad_port}"
        );
        assert!(refused("host='h").contains("no closing quote"));
        assert!(refused("host").contains("without `= value`"));
    }

    #[test]
    fn a_config_keeps_its_mode_as_libpq_means_it() {
        let mut config = Config::new();
        config.host("127.0.0.1");
        assert_eq!(PgConnect::from(config.clone()).ssl_mode(), SslMode::Prefer);
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        assert_eq!(PgConnect::from(config.clone()).ssl_mode(), SslMode::Disable);
        config.ssl_mode(tokio_postgres::config::SslMode::Require);
        let connect = PgConnect::from(config);
        assert_eq!(connect.ssl_mode(), SslMode::Require);
        assert!(connect.tls().roots.is_none(), "no certificate check");
    }

    #[test]
    fn an_address_alone_is_also_the_name() {
        let connect = parsed("hostaddr=127.0.0.1 port=5432 sslmode=require");
        assert_eq!(connect.config().get_hosts(), [tokio_postgres::config::Host::Tcp("127.0.0.1".into())]);
        let mut config = Config::new();
        config.hostaddr([10, 0, 0, 7].into());
        let connect = PgConnect::from(config);
        assert_eq!(connect.config().get_hosts(), [tokio_postgres::config::Host::Tcp("10.0.0.7".into())]);
        // A host given is the name, whatever the address.
        let named = parsed("host=db.internal hostaddr=127.0.0.1");
        assert_eq!(named.config().get_hosts(), [tokio_postgres::config::Host::Tcp("db.internal".into())]);
    }

    #[test]
    fn names_are_listed_bare() {
        assert_eq!(bare_name("DnsName(\"localhost\")"), "localhost");
        assert_eq!(bare_name("IpAddress(127.0.0.1)"), "127.0.0.1");
        assert_eq!(bare_name("DirectoryName"), "DirectoryName");
    }

    #[test]
    fn causes_are_told_once() {
        #[derive(Debug)]
        struct Layer(&'static str, Option<Box<Layer>>);
        impl fmt::Display for Layer {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.0)
            }
        }
        impl StdError for Layer {
            fn source(&self) -> Option<&(dyn StdError + 'static)> {
                self.1.as_deref().map(|layer| layer as &(dyn StdError + 'static))
            }
        }
        let inner = Layer("FATAL: no pg_hba.conf entry", None);
        let middle = Layer("db error", Some(Box::new(inner)));
        let outer = Layer("pool: db error", Some(Box::new(middle)));
        assert_eq!(describe_error(&outer), "pool: db error: FATAL: no pg_hba.conf entry");
    }
}
