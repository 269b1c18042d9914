//! The gate's configuration: what `fencing-gate --config FILE` reads, and what
//! `--listen` and `--upstream` alone give (every unsafe method fenced, keyed by
//! path, marks in memory).
//!
//! Every field has a default but the two addresses; an unknown field is an
//! error, so a misspelt setting is never silently ignored. Durations are
//! whole milliseconds (`_ms`).
//!
//! ```
//! let config = fencing_gate::GateConfig::from_toml(r#"
//!     listen = "127.0.0.1:8080"
//!     upstream = "http://127.0.0.1:8000"
//!
//!     [marks]
//!     kind = "redb"
//!     path = "/var/lib/fencing-gate/marks.redb"
//!
//!     [[route]]
//!     path = "/accounts/{id}/ledger"
//!     key = "account:{id}"
//!
//!     [[route]]
//!     path = "/health"
//!     fenced = false
//! "#).unwrap();
//! assert_eq!(config.routes.len(), 2);
//! ```

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use http::Method;
use http::uri::{Scheme, Uri};
use serde::Deserialize;

/// Everything the gate is configured with.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct GateConfig {
    /// Where the gate listens.
    pub listen: SocketAddr,
    /// The service behind the gate: `http://host:port` (no path).
    #[serde(deserialize_with = "upstream")]
    pub upstream: Uri,
    /// How requests are fenced.
    #[serde(default)]
    pub fencing: Fencing,
    /// Where the marks live.
    #[serde(default)]
    pub marks: Marks,
    /// Bounds on waiting for the upstream.
    #[serde(default)]
    pub timeouts: Timeouts,
    /// Bounds on what a client may send.
    #[serde(default)]
    pub limits: Limits,
    /// How requests are forwarded.
    #[serde(default)]
    pub forwarding: Forwarding,
    /// Routes with keys of their own, or passed through unfenced; others are
    /// fenced by [`Fencing`]'s defaults, keyed by path.
    #[serde(default, rename = "route")]
    pub routes: Vec<Route>,
    /// The Prometheus endpoint, when set.
    #[serde(default)]
    pub metrics: Option<MetricsConfig>,
}

/// `[fencing]`: how requests are fenced.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Fencing {
    /// `false`: a plain reverse proxy, nothing fenced (to measure what fencing costs).
    pub enabled: bool,
    /// The token's header (default `Fencing-Token`).
    pub header: String,
    /// The methods fenced where a route does not say (default: all but GET, HEAD, OPTIONS, TRACE).
    #[serde(deserialize_with = "methods")]
    pub methods: Option<Vec<Method>>,
    /// Let fenced requests without a token through unchecked (default: 428).
    pub allow_unfenced: bool,
    /// How long a higher token waits for lower ones to leave (default 5000 ms).
    pub drain_timeout_ms: u64,
    /// The lock service's Ed25519 public key file: a token may raise a mark only
    /// with a valid `Fencing-Proof`, else 403.
    pub verify_key: Option<PathBuf>,
}

impl Default for Fencing {
    fn default() -> Self {
        Self {
            enabled: true,
            header: "fencing-token".into(),
            methods: None,
            allow_unfenced: false,
            drain_timeout_ms: 5000,
            verify_key: None,
        }
    }
}

/// `[marks]`: where the marks live.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, tag = "kind", rename_all = "lowercase")]
#[non_exhaustive]
pub enum Marks {
    /// In this process (the default): a restart forgets them.
    Memory {
        /// The most keys tracked; a new key past it gets 503 (marks are never evicted).
        #[serde(default = "max_keys")]
        max_keys: usize,
    },
    /// In a redb file, each raise fsync'd before its request goes on.
    Redb {
        /// The file (created if missing).
        path: PathBuf,
        /// As for `memory`.
        #[serde(default = "max_keys")]
        max_keys: usize,
    },
    /// Replica claims in PostgreSQL, shared by every gate using the database (feature `postgres`).
    Postgres {
        /// A libpq connection string or URL (`sslmode`, `sslrootcert` honoured).
        url: String,
    },
    /// Replica claims in etcd, shared by every gate using the prefix (feature `etcd`).
    Etcd {
        /// The members' endpoints (`http://127.0.0.1:2379`).
        endpoints: Vec<String>,
        /// The prefix of the claims' keys (default `fencing/`).
        #[serde(default = "etcd_prefix")]
        prefix: String,
    },
}

impl Default for Marks {
    fn default() -> Self {
        Self::Memory { max_keys: max_keys() }
    }
}

fn max_keys() -> usize {
    fencing_layer::store::DEFAULT_MAX_KEYS
}

fn etcd_prefix() -> String {
    "fencing/".into()
}

/// `[timeouts]`: bounds on waiting for the upstream, and on shutting down.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Timeouts {
    /// Opening a connection to the upstream (then 502; nothing was sent).
    pub connect_ms: u64,
    /// The upstream's response head, and each wait for more of its body (then 504).
    pub upstream_ms: u64,
    /// How long a key stays closed to higher tokens after an exchange whose
    /// outcome is unknown (at least `upstream_ms`).
    pub quarantine_ms: u64,
    /// On shutdown: how long requests inside may take to finish.
    pub shutdown_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Self { connect_ms: 2_000, upstream_ms: 30_000, quarantine_ms: 30_000, shutdown_ms: 10_000 }
    }
}

impl Timeouts {
    /// `connect_ms`.
    pub fn connect(&self) -> Duration {
        Duration::from_millis(self.connect_ms)
    }
    /// `upstream_ms`.
    pub fn upstream(&self) -> Duration {
        Duration::from_millis(self.upstream_ms)
    }
    /// `quarantine_ms`.
    pub fn quarantine(&self) -> Duration {
        Duration::from_millis(self.quarantine_ms)
    }
    /// `shutdown_ms`.
    pub fn shutdown(&self) -> Duration {
        Duration::from_millis(self.shutdown_ms)
    }
}

/// `[limits]`: what a client may send.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Limits {
    /// Header fields per request (then 431).
    pub max_header_count: usize,
    /// Bytes of header names and values per request (then 431).
    pub max_header_bytes: usize,
    /// Client connections open at once; past it, new ones wait in the
    /// listener's backlog until one closes.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        // nginx's default: 4 buffers of 8 KiB for large headers.
        Self { max_header_count: 100, max_header_bytes: 32 * 1024, max_connections: 10_000 }
    }
}

/// `[forwarding]`: how requests are forwarded.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
#[non_exhaustive]
pub struct Forwarding {
    /// Peers whose `X-Forwarded-For`, `X-Forwarded-Proto` and `Forwarded`
    /// are kept (a load balancer in front); from any other peer they are
    /// replaced. Addresses or CIDR blocks (`10.0.0.0/8`).
    #[serde(deserialize_with = "cidrs")]
    pub trusted_hops: Vec<Cidr>,
    /// `Upgrade` requests (WebSocket): refused with 501 (the default), or
    /// passed through unfenced.
    pub upgrades: Upgrades,
}

/// What the gate does with an `Upgrade` request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Upgrades {
    /// 501: nothing after the upgrade could be fenced.
    #[default]
    Refuse,
    /// Passed through, unfenced, as a tunnel to the upstream.
    Pass,
}

/// An address block, `10.0.0.0/8` or one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    network: IpAddr,
    bits: u8,
}

impl Cidr {
    /// Whether `address` is in the block.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        match (self.network, address) {
            (IpAddr::V4(net), IpAddr::V4(a)) => prefix_eq(&net.octets(), &a.octets(), self.bits),
            (IpAddr::V6(net), IpAddr::V6(a)) => prefix_eq(&net.octets(), &a.octets(), self.bits),
            _ => false,
        }
    }
}

fn prefix_eq(net: &[u8], address: &[u8], bits: u8) -> bool {
    let (whole, rest) = (usize::from(bits / 8), bits % 8);
    net[..whole] == address[..whole]
        && (rest == 0 || (net[whole] ^ address[whole]) & (0xff_u8 << (8 - rest)) == 0)
}

impl std::str::FromStr for Cidr {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (address, bits) = match text.split_once('/') {
            Some((address, bits)) => (address, Some(bits)),
            None => (text, None),
        };
        let network: IpAddr =
            address.parse().map_err(|_| format!("`{text}` is not an address or CIDR block"))?;
        let network = network.to_canonical();
        let most = if network.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => most,
            Some(bits) => bits
                .parse::<u8>()
                .ok()
                .filter(|b| *b <= most)
                .ok_or_else(|| format!("`{text}`: the prefix length must be 0 to {most}"))?,
        };
        Ok(Self { network, bits })
    }
}

/// `[[route]]`: requests whose path matches `path` (a template: `{name}` is
/// one segment, `{*name}` the rest).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct Route {
    /// The path template.
    pub path: String,
    /// The key: a template over the path's parameters (`account:{id}`).
    /// Default: the request's path.
    #[serde(default)]
    pub key: Option<String>,
    /// Key by this header's value instead.
    #[serde(default)]
    pub key_header: Option<String>,
    /// The methods fenced on this route (default: `[fencing] methods`).
    #[serde(default, deserialize_with = "methods")]
    pub methods: Option<Vec<Method>>,
    /// `false`: every request passes through unfenced.
    #[serde(default = "yes")]
    pub fenced: bool,
}

fn yes() -> bool {
    true
}

/// `[metrics]`: the Prometheus endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct MetricsConfig {
    /// Where `GET /metrics` is served (keep it off the public network).
    pub listen: SocketAddr,
}

/// A configuration the gate cannot run with, in words that name the line and field.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

impl ConfigError {
    /// A route that cannot be built.
    pub(crate) fn at_route(index: usize, path: &str, why: String) -> Self {
        Self(format!("[[route]] number {} (path = {path:?}): {why}", index + 1))
    }

    /// The same error, with the line of `text` that holds what it names.
    fn located(self, text: &str) -> Self {
        let needle = match self.0.split_once("(path = ") {
            Some((_, rest)) => rest.split_once("):").map(|(path, _)| format!("path = {path}")),
            None => self.0.split_whitespace().find(|w| w.ends_with("_ms")).map(str::to_owned),
        };
        let line = needle.and_then(|needle| text.lines().position(|line| line.contains(&needle)));
        match line {
            Some(line) => Self(format!("line {}: {}", line + 1, self.0)),
            None => self,
        }
    }
}

impl GateConfig {
    /// The one-line gate: every unsafe method fenced, keyed by path, marks in memory.
    pub fn new(listen: SocketAddr, upstream: Uri) -> Result<Self, ConfigError> {
        let config = Self {
            listen,
            upstream: check_upstream(upstream).map_err(ConfigError)?,
            fencing: Fencing::default(),
            marks: Marks::default(),
            timeouts: Timeouts::default(),
            limits: Limits::default(),
            forwarding: Forwarding::default(),
            routes: Vec::new(),
            metrics: None,
        };
        config.validate()?;
        Ok(config)
    }

    /// This configuration, checked again after a change of its fields.
    ///
    /// # Errors
    ///
    /// What [`from_toml`](Self::from_toml) would refuse.
    pub fn checked(self) -> Result<Self, ConfigError> {
        check_upstream(self.upstream.clone()).map_err(ConfigError)?;
        self.validate()?;
        Ok(self)
    }

    /// Reads a TOML configuration; an error names the line and the field.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config: Self = toml::from_str(text).map_err(|e| ConfigError(e.to_string().trim_end().into()))?;
        config.validate().map_err(|e| e.located(text))?;
        Ok(config)
    }

    /// What no single field can say wrong on its own.
    fn validate(&self) -> Result<(), ConfigError> {
        let t = &self.timeouts;
        if t.quarantine_ms < t.upstream_ms {
            return Err(ConfigError(format!(
                "[timeouts] quarantine_ms = {} is shorter than upstream_ms = {}: an exchange whose outcome is \
                 unknown could still be running upstream when the key opens",
                t.quarantine_ms, t.upstream_ms
            )));
        }
        if t.connect_ms == 0 || t.upstream_ms == 0 {
            return Err(ConfigError("[timeouts] connect_ms and upstream_ms must be above 0".into()));
        }
        http::HeaderName::try_from(&self.fencing.header).map_err(|_| {
            ConfigError(format!("[fencing] header = {:?} is not a header name", self.fencing.header))
        })?;
        crate::routes::Routes::new(&self.routes).map(drop)
    }
}

fn upstream<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Uri, D::Error> {
    let text = String::deserialize(d)?;
    let uri: Uri = text.parse().map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))?;
    check_upstream(uri).map_err(serde::de::Error::custom)
}

/// An upstream is `http://host[:port]`: the gate speaks plain HTTP/1.1 to it.
fn check_upstream(uri: Uri) -> Result<Uri, String> {
    if uri.scheme() != Some(&Scheme::HTTP) || uri.authority().is_none() {
        return Err(format!(
            "upstream `{uri}` must be http://host:port (the gate speaks plain HTTP/1.1 to it)"
        ));
    }
    if !matches!(uri.path(), "" | "/") || uri.query().is_some() {
        return Err(format!("upstream `{uri}` must have no path: requests keep theirs"));
    }
    Ok(uri)
}

fn methods<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Vec<Method>>, D::Error> {
    let names = Option::<Vec<String>>::deserialize(d)?;
    names
        .map(|names| {
            names
                .iter()
                .map(|n| Method::from_bytes(n.as_bytes()).map_err(|_| format!("`{n}` is not a method")))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()
        .map_err(serde::de::Error::custom)
}

fn cidrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<Cidr>, D::Error> {
    let blocks = Vec::<String>::deserialize(d)?;
    blocks.iter().map(|b| b.parse()).collect::<Result<_, _>>().map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_field_is_named_with_its_line() {
        let error = GateConfig::from_toml(
            "listen = \"127.0.0.1:8080\"\nupstream = \"http://127.0.0.1:8000\"\n[timeouts]\nupstrem_ms = 5\n",
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("line 4"), "{error}");
        assert!(error.contains("unknown field `upstrem_ms`"), "{error}");
    }

    #[test]
    fn an_upstream_with_a_path_or_tls_is_refused() {
        for upstream in ["https://127.0.0.1:8000", "http://127.0.0.1:8000/api", "127.0.0.1:8000"] {
            let text = format!("listen = \"127.0.0.1:8080\"\nupstream = \"{upstream}\"\n");
            let error = GateConfig::from_toml(&text).unwrap_err().to_string();
            assert!(error.contains("line 2"), "{upstream}: {error}");
        }
    }

    #[test]
    fn a_quarantine_shorter_than_the_upstream_timeout_is_refused() {
        let text = "listen = \"127.0.0.1:8080\"\nupstream = \"http://h:1\"\n[timeouts]\nupstream_ms = 10\nquarantine_ms = 5\n";
        assert!(GateConfig::from_toml(text).unwrap_err().to_string().contains("quarantine_ms = 5"));
    }

    #[test]
    fn cidr_blocks_contain_what_they_should() {
        let block: Cidr = "10.1.0.0/16".parse().unwrap();
        assert!(block.contains("10.1.200.3".parse().unwrap()));
        assert!(!block.contains("10.2.0.1".parse().unwrap()));
        assert!(block.contains("::ffff:10.1.0.9".parse().unwrap()), "v4-mapped v6 is the v4 address");
        let odd: Cidr = "192.168.0.0/23".parse().unwrap();
        assert!(odd.contains("192.168.1.255".parse().unwrap()));
        assert!(!odd.contains("192.168.2.0".parse().unwrap()));
        assert!("10.0.0.0/33".parse::<Cidr>().is_err());
        let one: Cidr = "::1".parse().unwrap();
        assert!(one.contains("::1".parse().unwrap()) && !one.contains("::2".parse().unwrap()));
    }
}
