//! [`LockBackend`](crate::LockBackend) on Redis (feature `redis`): `SET … PX` and `INCR` of a per-lock
//! token counter in one Lua script, compare-and-set scripts for keepalive and release,
//! and a refusal of servers that would lose the counter in a crash.
//!
//! See [`RedisLockClient`].

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisError, Script};

use crate::backend::{Grant, LockError, LockProtocol, LockStatus, check_name_and_holder};
use crate::tls::ClientTls;

/// The key prefix unless [`RedisLockClientBuilder::prefix`] says otherwise.
pub const DEFAULT_REDIS_PREFIX: &str = "fencing:";

/// Bound on one call made outside the lease keeper (which bounds its own), and on connecting.
const DIRECT_CALL_BOUND: Duration = Duration::from_secs(30);
const CONNECT_BOUND: Duration = Duration::from_secs(5);

/// `KEYS[1]` lock, `KEYS[2]` counter; `ARGV[1]` lease id, `ARGV[2]` ttl ms, `ARGV[3]` holder.
/// Granted: `{1, token, ttl ms, ""}`; held: `{0, "0", pttl, current value}`. The token
/// travels as the counter's string (GET after INCR): Lua numbers are doubles.
const ACQUIRE: &str = r"
local current = redis.call('GET', KEYS[1])
if current then
  return {0, '0', redis.call('PTTL', KEYS[1]), current}
end
redis.call('INCR', KEYS[2])
local token = redis.call('GET', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. token .. ' ' .. ARGV[3], 'NX', 'PX', ARGV[2])
return {1, token, tonumber(ARGV[2]), ''}
";

/// `KEYS[1]` lock; `ARGV[1]` our value, `ARGV[2]` ttl ms. 1 if renewed.
const KEEPALIVE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
";

/// `KEYS[1]` lock; `ARGV[1]` our value. 1 if deleted.
const RELEASE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// `KEYS[1]` lock. `{value, pttl}`, or `{"", -2}` when free.
const STATUS: &str = r"
local value = redis.call('GET', KEYS[1])
if not value then
  return {'', -2}
end
return {value, redis.call('PTTL', KEYS[1])}
";

/// A lock backend on Redis: the token is `INCR` of the lock's counter key.
///
/// # Keys
///
/// Lock `name` is the key `{prefix}lock:{name}` (default prefix `fencing:`), whose value
/// is `"{lease id} {token} {holder}"` and whose expiry is the lease's TTL; its token
/// counter is `{prefix}token:{name}`, never deleted. The braces are literal: a Redis
/// Cluster hash tag, so both keys of a lock live in one slot (the scripts touch both).
///
/// # Scripts (each runs atomically on the server)
///
/// * **Acquire**: if the lock key exists, report its holder and `PTTL`
///   ([`LockError::Held`]); else `INCR` the counter and `SET lock value NX PX ttl`.
///   The counter only moves when the lock is granted.
/// * **Keepalive**: `PEXPIRE` the lock key only if its value is still ours, else
///   [`LockError::LeaseNotFound`].
/// * **Release**: `DEL` the lock key only if its value is still ours.
///
/// Expiry is judged by the Redis server's clock (key expiry); no client clock matters.
///
/// # Durability: refused unless AOF with `appendfsync always`
///
/// Tokens only increase across a Redis crash if the `INCR` is on disk before the client
/// sees the token. Redis does that with `appendonly yes` and `appendfsync always` (it
/// fsyncs the AOF before replying). With `appendfsync everysec` up to a second of
/// writes, and with RDB snapshots alone everything since the last snapshot, is lost in
/// a crash: the counter goes back and the next holder gets a token that was already
/// handed out, which a fenced resource then rejects (or worse, admits next to the older
/// holder's writes). So [`RedisLockClient::connect`] reads `CONFIG GET appendonly` and
/// `CONFIG GET appendfsync` and refuses with [`LockError::NotDurable`] unless both are
/// durable (also when `CONFIG` is disabled, as on some managed services).
/// [`RedisLockClientBuilder::accept_volatile_counter`] skips the check for those who
/// accept the risk.
///
/// The check runs at connect only: a server reconfigured later is not noticed. And
/// replication is asynchronous: after a failover to a replica that had not received
/// the last `INCR` (Sentinel, Cluster), tokens can repeat whatever the persistence
/// settings. Use one primary without automatic failover for tokens, or a backend with
/// consensus (etcd, ZooKeeper, PostgreSQL with synchronous replication).
///
/// ```no_run
/// # async fn demo() -> Result<(), fencing_client::LockError> {
/// use std::time::Duration;
/// use fencing_client::{LockBackendExt, RedisLockClient};
///
/// let locks = RedisLockClient::connect("redis://127.0.0.1:6380").await?;
/// let lease = locks.lease("report", "worker-1", Duration::from_secs(10)).await?;
/// println!("token {}", lease.token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisLockClient {
    connection: ConnectionManager,
    prefix: Arc<str>,
    scripts: Arc<Scripts>,
}

struct Scripts {
    acquire: Script,
    keepalive: Script,
    release: Script,
    status: Script,
}

impl fmt::Debug for RedisLockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLockClient").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

/// How a [`RedisLockClient`] connects: see [`RedisLockClient::builder`].
#[derive(Debug, Clone)]
pub struct RedisLockClientBuilder {
    url: String,
    prefix: String,
    accept_volatile_counter: bool,
    tls: Option<ClientTls>,
}

impl RedisLockClientBuilder {
    /// Puts keys under `prefix` instead of [`DEFAULT_REDIS_PREFIX`]. It must not
    /// contain `{` or `}` (the keys' hash tags).
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// With `true`, connects to a Redis whose persistence settings would lose the token
    /// counter in a crash (no AOF, or AOF without `appendfsync always`), or whose
    /// settings cannot be read. After such a crash tokens can repeat or go back, and a
    /// fenced resource can then no longer tell a stale holder from the current one.
    /// Default `false`: such a server is refused with [`LockError::NotDurable`].
    pub fn accept_volatile_counter(mut self, accept: bool) -> Self {
        self.accept_volatile_counter = accept;
        self
    }

    /// Over TLS (a `rediss://` URL), checks the server's certificate with `tls`'s CA
    /// (instead of the system's roots) and shows its client certificate, if any, to a server
    /// that asks (`tls-auth-clients`). Without it, a `rediss://` URL trusts the system's
    /// roots; `rediss://host:port/#insecure` checks no certificate at all (the redis crate's
    /// convention: for tests only, anyone on the path can then read and forge the tokens).
    pub fn tls(mut self, tls: ClientTls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Connects (within 5 s), then checks the server's persistence settings unless
    /// told not to. Requests are bounded to 30 s (the lease keeper bounds its own
    /// tighter); a dropped connection is re-established in the background.
    ///
    /// # Errors
    ///
    /// [`LockError::InvalidArgument`] for a bad URL or prefix, or TLS settings with a URL that
    /// is not `rediss://`; [`LockError::Transport`] naming the server if it cannot be reached
    /// (over TLS: with the TLS error, e.g. `invalid peer certificate: UnknownIssuer`);
    /// [`LockError::NotDurable`] as the type says.
    pub async fn connect(self) -> Result<RedisLockClient, LockError> {
        if self.prefix.contains(['{', '}']) {
            return Err(LockError::InvalidArgument(format!(
                "Redis key prefix {:?} must not contain braces (they are the keys' hash tags)",
                self.prefix
            )));
        }
        let client = self.client()?;
        let server = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(CONNECT_BOUND))
            .set_response_timeout(Some(DIRECT_CALL_BOUND))
            .set_number_of_retries(2);
        let connect = client.get_connection_manager_with_config(config);
        let mut connection = tokio::time::timeout(CONNECT_BOUND * 2, connect)
            .await
            .map_err(|_| LockError::Timeout)?
            .map_err(|e| match redis_error(e) {
                LockError::Transport(why) => LockError::Transport(format!("{why} (connecting to {server})")),
                other => other,
            })?;
        if !self.accept_volatile_counter {
            check_durable(&mut connection).await?;
        }
        Ok(RedisLockClient {
            connection,
            prefix: self.prefix.into(),
            scripts: Arc::new(Scripts {
                acquire: Script::new(ACQUIRE),
                keepalive: Script::new(KEEPALIVE),
                release: Script::new(RELEASE),
                status: Script::new(STATUS),
            }),
        })
    }
}

impl RedisLockClientBuilder {
    /// The redis-rs client of the URL, with the TLS settings if any.
    fn client(&self) -> Result<redis::Client, LockError> {
        let url = self.url.as_str();
        let bad_url = |e: RedisError| LockError::InvalidArgument(format!("bad Redis URL {url:?}: {e}"));
        let tls_url = url.starts_with("rediss://") || url.starts_with("valkeys://");
        if tls_url {
            // redis-rs builds its TLS configuration on the process's rustls provider.
            crate::tls::use_ring_unless_chosen();
        }
        let Some(tls) = &self.tls else { return redis::Client::open(url).map_err(bad_url) };
        if !tls_url {
            return Err(LockError::InvalidArgument(format!(
                "TLS settings given for Redis URL {url:?}: a Redis reached over TLS is written rediss://"
            )));
        }
        let certificates = redis::TlsCertificates {
            client_tls: tls.identity_text().map(|(cert, key)| redis::ClientTlsConfig {
                client_cert: cert.to_vec(),
                client_key: key.to_vec(),
            }),
            root_cert: tls.ca_text().map(<[u8]>::to_vec),
        };
        redis::Client::build_with_tls(url, certificates).map_err(bad_url)
    }
}

/// Refuses a server that would lose an `INCR` acknowledged before a crash.
async fn check_durable(connection: &mut ConnectionManager) -> Result<(), LockError> {
    let appendonly = config_get(connection, "appendonly").await?;
    let appendfsync = config_get(connection, "appendfsync").await?;
    if appendonly == "yes" && appendfsync == "always" {
        return Ok(());
    }
    Err(LockError::NotDurable(format!(
        "this Redis would lose fencing tokens in a crash (appendonly {appendonly}, appendfsync \
         {appendfsync}): tokens are durable only with `appendonly yes` and `appendfsync always`. \
         Configure the server so, or accept the risk with \
         RedisLockClient::builder(url).accept_volatile_counter(true)"
    )))
}

async fn config_get(connection: &mut ConnectionManager, name: &str) -> Result<String, LockError> {
    let unreadable = |why: String| {
        LockError::NotDurable(format!(
            "cannot read Redis's persistence settings (CONFIG GET {name}: {why}), so cannot tell \
             whether fencing tokens survive a crash; if the server has `appendonly yes` and \
             `appendfsync always`, or you accept the risk, use \
             RedisLockClient::builder(url).accept_volatile_counter(true)"
        ))
    };
    let reply: Vec<String> = match redis::cmd("CONFIG").arg("GET").arg(name).query_async(connection).await {
        Ok(reply) => reply,
        Err(e) if e.is_io_error() || e.is_connection_dropped() => return Err(redis_error(e)),
        Err(e) => return Err(unreadable(e.to_string())),
    };
    match reply.as_slice() {
        [key, value] if key.eq_ignore_ascii_case(name) => Ok(value.to_ascii_lowercase()),
        other => Err(unreadable(format!("unexpected reply {other:?}"))),
    }
}

impl RedisLockClient {
    /// Connects to `url` (`redis://[user:password@]host:port[/db]`, or `rediss://…` over
    /// TLS, trusting the system's roots) with the default settings: refuses a server that
    /// is not durable (see the type's docs). A CA of one's own: [`builder`](Self::builder)
    /// and [`RedisLockClientBuilder::tls`].
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        Self::builder(url).connect().await
    }

    /// Settings for connecting to `url`.
    pub fn builder(url: impl Into<String>) -> RedisLockClientBuilder {
        RedisLockClientBuilder {
            url: url.into(),
            prefix: DEFAULT_REDIS_PREFIX.to_owned(),
            accept_volatile_counter: false,
            tls: None,
        }
    }

    /// The key of lock `name`.
    pub fn lock_key(&self, name: &str) -> String {
        format!("{}lock:{{{name}}}", self.prefix)
    }

    /// The token counter's key of lock `name`.
    pub fn counter_key(&self, name: &str) -> String {
        format!("{}token:{{{name}}}", self.prefix)
    }

    /// The connection (a cheap clone shares it).
    pub fn connection(&self) -> &ConnectionManager {
        &self.connection
    }

    /// Who holds `name`, or `None` if it is free. `expires_in` is the key's `PTTL`.
    pub async fn lock_status(&self, name: &str) -> Result<Option<LockStatus>, LockError> {
        let mut connection = self.connection.clone();
        let mut invocation = self.scripts.status.prepare_invoke();
        invocation.key(self.lock_key(name));
        let call = invocation.invoke_async(&mut connection);
        let (value, pttl): (String, i64) = tokio::time::timeout(DIRECT_CALL_BOUND, call)
            .await
            .map_err(|_| LockError::Timeout)?
            .map_err(redis_error)?;
        if value.is_empty() && pttl == -2 {
            return Ok(None);
        }
        let (token, holder) = match parse_value(&value) {
            Some((_, token, holder)) => (token, holder.to_owned()),
            None => {
                return Err(LockError::Protocol(format!("lock key {} holds {value:?}", self.lock_key(name))));
            }
        };
        Ok(Some(LockStatus { name: name.to_owned(), holder, token, expires_in: pttl_duration(pttl) }))
    }
}

impl LockProtocol for RedisLockClient {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        check_name_and_holder(name, holder)?;
        let ttl_ms = ttl_millis(ttl)?;
        let lease_id = new_lease_id();
        let mut connection = self.connection.clone();
        let (granted, token, ttl_or_pttl, current): (i64, String, i64, String) = self
            .scripts
            .acquire
            .key(self.lock_key(name))
            .key(self.counter_key(name))
            .arg(&lease_id)
            .arg(ttl_ms)
            .arg(holder)
            .invoke_async(&mut connection)
            .await
            .map_err(redis_error)?;
        if granted != 1 {
            let holder = parse_value(&current).map_or(current.as_str(), |(_, _, h)| h).to_owned();
            return Err(LockError::Held {
                holder,
                expires_in: pttl_duration(ttl_or_pttl),
                retry_after: None,
            });
        }
        let token = token.parse::<u64>().ok().filter(|&t| t > 0).ok_or_else(|| {
            LockError::Protocol(format!("token counter {} holds {token:?}", self.counter_key(name)))
        })?;
        tracing::debug!(name, holder, token, "Redis lock acquired");
        Ok(Grant {
            lease_id,
            name: name.to_owned(),
            holder: holder.to_owned(),
            token,
            ttl: Duration::from_millis(ttl_ms),
            proof: None,
        })
    }

    async fn keepalive(&self, grant: &Grant) -> Result<(), LockError> {
        let ttl_ms = ttl_millis(grant.ttl)?;
        let mut call = self.scripts.keepalive.key(self.lock_key(&grant.name));
        call.arg(stored_value(grant)).arg(ttl_ms);
        self.on_own_key(&call).await
    }

    async fn release(&self, grant: &Grant) -> Result<(), LockError> {
        let mut call = self.scripts.release.key(self.lock_key(&grant.name));
        call.arg(stored_value(grant));
        self.on_own_key(&call).await
    }
}

impl RedisLockClient {
    /// Runs a script on a grant's lock key that answers 1 when the key still
    /// holds the grant's value (and acted), else 0: the lease is not ours (anymore).
    async fn on_own_key(&self, call: &redis::ScriptInvocation<'_>) -> Result<(), LockError> {
        let mut connection = self.connection.clone();
        let done: i64 = call.invoke_async(&mut connection).await.map_err(redis_error)?;
        if done == 1 { Ok(()) } else { Err(LockError::LeaseNotFound) }
    }
}

/// The lock key's value of `grant`: `"{lease id} {token} {holder}"`.
fn stored_value(grant: &Grant) -> String {
    format!("{} {} {}", grant.lease_id, grant.token, grant.holder)
}

/// `(lease id, token, holder)` of a lock key's value.
fn parse_value(value: &str) -> Option<(&str, u64, &str)> {
    let mut parts = value.splitn(3, ' ');
    let (id, token, holder) = (parts.next()?, parts.next()?, parts.next()?);
    Some((id, token.parse().ok()?, holder))
}

/// A fresh lease id: 128 bits from std's randomly keyed SipHash over a process-wide
/// counter, the time and the pid. Unique, not secret (anyone who can read the key can
/// read it): it tells our lease from a later one of the same holder.
fn new_lease_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let half = |salt: u64| {
        let mut h = RandomState::new().build_hasher();
        h.write_u64(salt);
        h.write_u64(n);
        h.write_u128(now);
        h.write_u32(std::process::id());
        h.finish()
    };
    format!("{:016x}{:016x}", half(1), half(2))
}

/// `ttl` in whole milliseconds, rounded up, at least 1.
fn ttl_millis(ttl: Duration) -> Result<u64, LockError> {
    if ttl.is_zero() {
        return Err(LockError::InvalidArgument("ttl must be positive".into()));
    }
    const MAX_MS: u128 = 100 * 365 * 24 * 3600 * 1000;
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    if ms > MAX_MS {
        return Err(LockError::InvalidArgument("ttl above a century".into()));
    }
    Ok(ms as u64)
}

/// A `PTTL` reply as a duration (-1 "no expiry" and -2 "no key" are zero).
fn pttl_duration(pttl: i64) -> Duration {
    Duration::from_millis(u64::try_from(pttl).unwrap_or(0))
}

fn redis_error(e: RedisError) -> LockError {
    if e.is_timeout() {
        LockError::Timeout
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        LockError::Transport(format!("Redis: {e}"))
    } else {
        LockError::Rejected { status: 0, detail: format!("Redis: {e}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip() {
        let grant = Grant {
            lease_id: new_lease_id(),
            name: "n".into(),
            holder: "worker 1".into(),
            token: 42,
            ttl: Duration::from_secs(1),
            proof: None,
        };
        let value = stored_value(&grant);
        assert_eq!(parse_value(&value), Some((grant.lease_id.as_str(), 42, "worker 1")));
        assert_eq!(parse_value("garbage"), None);
        assert_eq!(parse_value("id notanumber holder"), None);
    }

    #[test]
    fn lease_ids_are_distinct() {
        let ids: std::collections::HashSet<String> = (0..1000).map(|_| new_lease_id()).collect();
        assert_eq!(ids.len(), 1000);
        assert!(ids.iter().all(|id| id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())));
    }

    #[test]
    fn ttls_and_pttls() {
        assert_eq!(ttl_millis(Duration::from_micros(1)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_millis(1500)).unwrap(), 1500);
        assert!(matches!(ttl_millis(Duration::ZERO), Err(LockError::InvalidArgument(_))));
        assert!(matches!(ttl_millis(Duration::MAX), Err(LockError::InvalidArgument(_))));
        assert_eq!(pttl_duration(-2), Duration::ZERO);
        assert_eq!(pttl_duration(-1), Duration::ZERO);
        assert_eq!(pttl_duration(250), Duration::from_millis(250));
    }

    #[tokio::test]
    async fn bad_urls_and_prefixes_are_clear_errors() {
        match RedisLockClient::connect("http://127.0.0.1:6379").await {
            Err(LockError::InvalidArgument(e)) => assert!(e.contains("bad Redis URL"), "{e}"),
            other => panic!("{other:?}"),
        }
        match RedisLockClient::builder("redis://127.0.0.1:9").prefix("{x}").connect().await {
            Err(LockError::InvalidArgument(e)) => assert!(e.contains("braces"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
