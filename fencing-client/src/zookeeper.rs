//! [`LockBackend`](crate::LockBackend) on ZooKeeper (feature `zookeeper`): one ephemeral lock znode per
//! lock, on a session of its own per grant; the token is the znode's creation zxid.
//!
//! See [`ZkLockClient`].

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use zookeeper_client as zk;

use crate::backend::{Grant, LockError, LockProtocol, LockStatus, check_name_and_holder};

/// The znode lock znodes live under unless [`ZkLockClient::with_prefix`] says otherwise.
pub const DEFAULT_ZK_PREFIX: &str = "/fencing/locks";

/// Bound on one call made outside the lease keeper (which bounds its own).
const DIRECT_CALL_BOUND: Duration = Duration::from_secs(30);
/// Bound on waiting for a closed session's confirmation.
const CLOSE_BOUND: Duration = Duration::from_secs(5);

/// Lock names become one path segment: everything but letters, digits, `-` and `_` is
/// percent-encoded (so `/`, `.` and `..` cannot change the path).
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'_');

/// A lock backend on ZooKeeper: the lock is an ephemeral znode, the token its `czxid`.
///
/// * **Acquire**: open a new ZooKeeper session whose timeout is the TTL, and create the
///   ephemeral znode `{prefix}/{name}` (name percent-encoded into one segment, data: the
///   holder) on it. Created: the token is the znode's `czxid`, the zxid of the
///   transaction that created it. Exists already: [`LockError::Held`] with the holder
///   from its data, and the new session is closed.
/// * **Keepalive**: re-attach to the grant's session (which proves to the server that the
///   holder lives, and so restarts the session's timeout), `sync`, and check that the
///   znode is still there with our `czxid` and our session as its ephemeral owner. An
///   expired session (its ephemeral znodes are gone) or another znode is
///   [`LockError::LeaseNotFound`].
/// * **Release**: re-attach and close the session: ZooKeeper deletes its ephemeral
///   znodes, ours and only ours, in the same transaction.
///
/// Between renewals the session has no connection: a holder that stops renewing (paused,
/// crashed, partitioned) loses the lock when its session times out on the server, as a
/// lease expires elsewhere. (A connected ZooKeeper client pings by itself, which would
/// keep a paused holder's lock alive for as long as its process lives.)
///
/// # Why the czxid is a fencing token
///
/// Every ZooKeeper write gets a zxid: the high 32 bits are the leader's epoch, which
/// grows at every leader election (and at every restart of a standalone server), the
/// low 32 bits count the epoch's transactions. zxids therefore strictly increase in
/// the order the ensemble commits writes. A lock znode can only be created after the
/// previous one was deleted (by release or session expiry), which is an earlier
/// transaction, so each grant's `czxid` is higher than every earlier grant's, of this
/// lock and of every other. Durability is ZooKeeper's own: a write is acknowledged
/// once a quorum has it in its transaction log (fsync'd, with the default
/// `forceSync=yes`), and a restart replays the log, so tokens never go back. (The
/// sequence suffix of sequential znodes would be no better: it counts the parent's
/// child changes and starts again at 0 if the parent is ever deleted and re-created.)
///
/// # TTLs are session timeouts
///
/// The server clamps a session timeout to `[minSessionTimeout, maxSessionTimeout]`,
/// by default 2 and 20 ticks (4 s and 40 s with the default 2 s `tickTime`).
/// [`Grant::ttl`] is the negotiated timeout; [`Lease`](crate::Lease) trusts the smaller of it and the
/// requested TTL. Expiry is judged by the server (sessions expire on tick boundaries,
/// never before their timeout); no client clock matters. ZooKeeper does not tell
/// others when a session will expire: [`LockError::Held`] and [`LockStatus`] report
/// `expires_in` as zero.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencing_client::LockError> {
/// use std::time::Duration;
/// use fencing_client::{LockBackendExt, ZkLockClient};
///
/// let locks = ZkLockClient::connect("127.0.0.1:2181").await?;
/// let lease = locks.lease("report", "worker-1", Duration::from_secs(10)).await?;
/// println!("token {} (zxid {:#x})", lease.token(), lease.token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ZkLockClient {
    ensemble: Ensemble,
    prefix: Arc<str>,
    /// A session of its own for reads (status, the pre-check before acquiring) and for
    /// creating the prefix; it never holds a lock.
    reader: zk::Client,
    /// The session of each live grant, by lease id. Never held across an `.await`.
    sessions: Arc<Mutex<HashMap<String, zk::SessionInfo>>>,
}

impl fmt::Debug for ZkLockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ZkLockClient")
            .field("cluster", &self.ensemble.cluster)
            .field("tls", &self.ensemble.tls.is_some())
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// The servers, and how every session (the reader's, each grant's) reaches them.
#[derive(Clone)]
struct Ensemble {
    cluster: Arc<str>,
    /// TLS to every server not written `tcp://` (feature `zookeeper-tls`).
    #[cfg(feature = "zookeeper-tls")]
    tls: Option<(zk::TlsOptions, crate::tls::ClientTls)>,
    #[cfg(not(feature = "zookeeper-tls"))]
    tls: Option<std::convert::Infallible>,
}

impl Ensemble {
    /// A session through `connector`, over TLS if the client was made so.
    async fn open(&self, connector: zk::Connector) -> Result<zk::Client, zk::Error> {
        #[cfg(feature = "zookeeper-tls")]
        if let Some((options, _)) = &self.tls {
            return connector.with_tls(options.clone()).secure_connect(&self.cluster).await;
        }
        connector.connect(&self.cluster).await
    }
}

impl ZkLockClient {
    /// Connects to the ZooKeeper ensemble `cluster` (`host:port[,host:port…]`), failing
    /// fast if no server answers. A server written `tcp+tls://host:port` is reached over
    /// TLS: that needs [`connect_tls`](Self::connect_tls) (feature `zookeeper-tls`).
    pub async fn connect(cluster: &str) -> Result<Self, LockError> {
        if cluster.contains("tcp+tls://") {
            return Err(LockError::InvalidArgument(format!(
                "ZooKeeper {cluster}: tcp+tls:// servers need TLS settings: ZkLockClient::connect_tls \
                 (fencing-client feature `zookeeper-tls`) with a CA"
            )));
        }
        Self::open(Ensemble { cluster: cluster.into(), tls: None }).await
    }

    /// Connects to `cluster` over TLS, checking each server's certificate with `tls`'s CA
    /// (required: the ZooKeeper client does not read the system's roots). Every server
    /// is reached over TLS unless written `tcp://host:port`: give the servers' secure client
    /// ports (`secureClientPort`), e.g. `zk-1:2281,zk-2:2281` (`tcp+tls://zk-1:2281` says
    /// the same). A certificate the CA did not sign fails the connect with the TLS error.
    ///
    /// # Errors
    ///
    /// As [`connect`](Self::connect); [`LockError::InvalidArgument`] without a CA.
    #[cfg(feature = "zookeeper-tls")]
    pub async fn connect_tls(cluster: &str, tls: &crate::tls::ClientTls) -> Result<Self, LockError> {
        let options = tls_options(tls)?;
        crate::tls::use_ring_unless_chosen();
        let ensemble = Ensemble { cluster: cluster.into(), tls: Some((options, tls.clone())) };
        match Self::open(ensemble.clone()).await {
            Err(LockError::Transport(e)) => Err(LockError::Transport(tls_failure(&ensemble, e).await)),
            other => other,
        }
    }

    /// The client of `ensemble`, once its reading session is open.
    async fn open(ensemble: Ensemble) -> Result<Self, LockError> {
        if ensemble.cluster.trim().is_empty() {
            return Err(LockError::InvalidArgument("empty ZooKeeper connect string".into()));
        }
        let connector =
            zk::Client::connector().with_session_timeout(Duration::from_secs(10)).with_fail_eagerly();
        let reader = tokio::time::timeout(DIRECT_CALL_BOUND, ensemble.open(connector))
            .await
            .map_err(|_| LockError::Timeout)?
            .map_err(|e| match e {
                zk::Error::BadArguments(m) => {
                    LockError::InvalidArgument(format!("ZooKeeper connect string: {m}"))
                }
                e => zk_error(e),
            })?;
        Ok(ZkLockClient { ensemble, prefix: DEFAULT_ZK_PREFIX.into(), reader, sessions: Arc::default() })
    }

    /// Puts lock znodes under `prefix` (an absolute path such as `/app/locks`, without a
    /// trailing `/`) instead of [`DEFAULT_ZK_PREFIX`]. It is created when first needed.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, LockError> {
        let valid = prefix.starts_with('/')
            && prefix.len() > 1
            && !prefix.ends_with('/')
            && prefix.split('/').skip(1).all(|s| !s.is_empty() && s != "." && s != "..")
            && !prefix.chars().any(char::is_control);
        if !valid {
            return Err(LockError::InvalidArgument(format!(
                "ZooKeeper prefix {prefix:?} must be an absolute path like /app/locks (no trailing `/`, \
                 no empty, `.` or `..` segments)"
            )));
        }
        self.prefix = prefix.into();
        Ok(self)
    }

    /// The znode of lock `name`.
    pub fn lock_path(&self, name: &str) -> String {
        format!("{}/{}", self.prefix, utf8_percent_encode(name, SEGMENT))
    }

    /// The reading session's client (a cheap clone shares its session).
    pub fn client(&self) -> &zk::Client {
        &self.reader
    }

    /// Who holds `name` (from the znode's data), or `None` if it is free. `expires_in`
    /// is zero: ZooKeeper does not say when another session will expire.
    pub async fn lock_status(&self, name: &str) -> Result<Option<LockStatus>, LockError> {
        let read = async {
            match self.reader.get_data(&self.lock_path(name)).await {
                Ok((data, stat)) => Ok(Some(LockStatus {
                    name: name.to_owned(),
                    holder: String::from_utf8_lossy(&data).into_owned(),
                    token: token_of(&stat)?,
                    expires_in: Duration::ZERO,
                })),
                Err(zk::Error::NoNode) => Ok(None),
                Err(e) => Err(zk_error(e)),
            }
        };
        tokio::time::timeout(DIRECT_CALL_BOUND, read).await.map_err(|_| LockError::Timeout)?
    }

    fn sessions(&self) -> MutexGuard<'_, HashMap<String, zk::SessionInfo>> {
        self.sessions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-attaches to `session`. `detached`: dropping the client leaves the session open.
    async fn attach(
        &self,
        session: zk::SessionInfo,
        ttl: Duration,
        detached: bool,
    ) -> Result<zk::Client, LockError> {
        let mut connector =
            zk::Client::connector().with_session(session).with_session_timeout(ttl).with_fail_eagerly();
        if detached {
            connector = connector.with_detached();
        }
        self.ensemble.open(connector).await.map_err(session_error)
    }

    /// Closes `client`'s session (its ephemeral znodes go with it) and waits, bounded,
    /// for the server's confirmation.
    async fn close(client: zk::Client) {
        let mut watcher = client.state_watcher();
        drop(client);
        let closed = tokio::time::timeout(CLOSE_BOUND, async {
            while !watcher.peek_state().is_terminated() {
                watcher.changed().await;
            }
        });
        if closed.await.is_err() {
            tracing::debug!("closing a ZooKeeper session was not confirmed in time");
        }
    }

    /// One try at creating the lock's znode in a new session.
    async fn attempt(
        &self,
        path: &str,
        name: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Attempt, LockError> {
        // Held already: no need for a session.
        if let Some(held) = self.held(path).await? {
            return Ok(Attempt::Held(held));
        }
        let connector = zk::Client::connector().with_session_timeout(ttl).with_fail_eagerly().with_detached();
        let session = self.ensemble.open(connector).await.map_err(zk_error)?;
        let options = zk::CreateMode::Ephemeral.with_acls(zk::Acls::anyone_all());
        let mut created = session.create(path, holder.as_bytes(), &options).await;
        if matches!(created, Err(zk::Error::NoNode)) {
            let dir = zk::CreateMode::Persistent.with_acls(zk::Acls::anyone_all());
            created = match session.mkdir(&self.prefix, &dir).await {
                Ok(()) | Err(zk::Error::NodeExists) => {
                    session.create(path, holder.as_bytes(), &options).await
                }
                Err(e) => Err(e),
            };
        }
        let info = session.session().clone();
        let granted_ttl = session.session_timeout();
        match created {
            Ok((stat, _)) => {
                let token = token_of(&stat)?;
                let lease_id = format!("{:x}-{token:x}", info.id().0);
                self.sessions().insert(lease_id.clone(), info);
                // Detached: dropping the connection leaves the session to our keepalives.
                drop(session);
                tracing::debug!(name, holder, token, "ZooKeeper lock acquired");
                Ok(Attempt::Granted(Grant {
                    lease_id,
                    name: name.to_owned(),
                    holder: holder.to_owned(),
                    token,
                    ttl: granted_ttl,
                    proof: None,
                }))
            }
            Err(e) => {
                // The session holds nothing: close it rather than leave it to time out.
                drop(session);
                if let Ok(client) = self.attach(info, ttl, false).await {
                    Self::close(client).await;
                }
                match e {
                    zk::Error::NodeExists => {
                        Ok(self.held(path).await?.map_or(Attempt::Vanished, Attempt::Held))
                    }
                    e => Err(zk_error(e)),
                }
            }
        }
    }
}

/// How one try at the lock ended.
enum Attempt {
    Granted(Grant),
    Held(LockError),
    /// Taken at the create, gone at the look: free now.
    Vanished,
}

impl ZkLockClient {
    /// `Some(Held)` if the lock znode at `path` exists.
    async fn held(&self, path: &str) -> Result<Option<LockError>, LockError> {
        match self.reader.get_data(path).await {
            Ok((data, _)) => Ok(Some(LockError::Held {
                holder: String::from_utf8_lossy(&data).into_owned(),
                expires_in: Duration::ZERO,
                retry_after: None,
            })),
            Err(zk::Error::NoNode) => Ok(None),
            Err(e) => Err(zk_error(e)),
        }
    }

    /// Whether `client`'s session still owns the lock znode of `grant`.
    async fn owns(client: &zk::Client, path: &str, grant: &Grant) -> Result<bool, LockError> {
        // A re-attached session may be served by a follower behind the leader: catch up first.
        client.sync(path).await.map_err(session_error)?;
        let stat = client.check_stat(path).await.map_err(session_error)?;
        Ok(stat.is_some_and(|s| {
            s.ephemeral_owner == client.session_id().0 && token_of(&s).ok() == Some(grant.token)
        }))
    }
}

impl LockProtocol for ZkLockClient {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        check_name_and_holder(name, holder)?;
        if ttl.is_zero() || ttl > Duration::from_secs(24 * 3600) {
            return Err(LockError::InvalidArgument(format!(
                "ttl {ttl:?} must be positive and at most a day"
            )));
        }
        let path = self.lock_path(name);
        // The holder's znode can go (released, or its session expired) between our
        // create and the look at who holds it; then the lock is free, and worth
        // trying again (a few times: each retry means another holder left meanwhile).
        for _ in 0..3 {
            match self.attempt(&path, name, holder, ttl).await? {
                Attempt::Granted(grant) => return Ok(grant),
                Attempt::Held(held) => return Err(held),
                Attempt::Vanished => {}
            }
        }
        // Held at each attempt and free at each look: held, by nobody known.
        Err(LockError::Held { holder: String::new(), expires_in: Duration::ZERO, retry_after: None })
    }

    async fn keepalive(&self, grant: &Grant) -> Result<(), LockError> {
        let found = self.sessions().get(&grant.lease_id).cloned();
        let Some(info) = found else {
            return Err(LockError::LeaseNotFound);
        };
        let result = async {
            let client = self.attach(info, grant.ttl, true).await?;
            if Self::owns(&client, &self.lock_path(&grant.name), grant).await? {
                Ok(())
            } else {
                tracing::warn!(
                    name = grant.name,
                    token = grant.token,
                    "ZooKeeper lock znode deleted or replaced"
                );
                // The session is ours to end: it holds nothing we want.
                drop(client);
                Err(LockError::LeaseNotFound)
            }
        }
        .await;
        if result == Err(LockError::LeaseNotFound) {
            // Out of the map first: the guard must not live across the `.await`.
            let removed = self.sessions().remove(&grant.lease_id);
            if let Some(info) = removed
                && let Ok(client) = self.attach(info, grant.ttl, false).await
            {
                Self::close(client).await;
            }
        }
        result
    }

    async fn release(&self, grant: &Grant) -> Result<(), LockError> {
        let removed = self.sessions().remove(&grant.lease_id);
        let Some(info) = removed else {
            return Err(LockError::LeaseNotFound);
        };
        let client = self.attach(info, grant.ttl, false).await?;
        let ours = Self::owns(&client, &self.lock_path(&grant.name), grant).await;
        // Closing deletes the session's ephemeral znodes: ours, and nobody else's.
        Self::close(client).await;
        match ours? {
            true => Ok(()),
            false => Err(LockError::LeaseNotFound),
        }
    }
}

/// `tls` as the ZooKeeper client takes it: its CA (required) and client certificate.
#[cfg(feature = "zookeeper-tls")]
fn tls_options(tls: &crate::tls::ClientTls) -> Result<zk::TlsOptions, LockError> {
    let pem = |text: &[u8]| String::from_utf8_lossy(text).into_owned();
    let Some(ca) = tls.ca_text() else {
        return Err(LockError::InvalidArgument(
            "ZooKeeper over TLS needs a CA (ClientTls::ca_file): its client does not read the system's roots"
                .into(),
        ));
    };
    let tls_error = |e: zk::Error| LockError::InvalidArgument(format!("ZooKeeper TLS settings: {e}"));
    let options = zk::TlsOptions::new().with_pem_ca(&pem(ca)).map_err(tls_error)?;
    match tls.identity_text() {
        Some((cert, key)) => options.with_pem_identity(&pem(cert), &pem(key)).map_err(tls_error),
        None => Ok(options),
    }
}

/// `failure` (no server reached), with why TLS to the first TLS server failed, if it did: the
/// ZooKeeper client says only that it lost the connection.
#[cfg(feature = "zookeeper-tls")]
async fn tls_failure(ensemble: &Ensemble, failure: String) -> String {
    let Some((_, tls)) = &ensemble.tls else { return failure };
    let Some((host, port)) = first_tls_server(&ensemble.cluster) else { return failure };
    match crate::tls::handshake(tls, host, port).await {
        Err(why) => format!("{failure}; TLS to {host}:{port} failed: {why}"),
        Ok(()) => failure,
    }
}

/// The host and port of the first server of `cluster` reached over TLS (all but `tcp://` ones).
#[cfg(feature = "zookeeper-tls")]
fn first_tls_server(cluster: &str) -> Option<(&str, u16)> {
    let server = cluster.split(',').map(str::trim).find(|s| !s.starts_with("tcp://"))?;
    let server = server.strip_prefix("tcp+tls://").unwrap_or(server);
    // The last server may be followed by the chroot path.
    let server = server.split('/').next().unwrap_or(server);
    Some(match server.rsplit_once(':') {
        Some((host, port)) => (host.trim_start_matches('[').trim_end_matches(']'), port.parse().ok()?),
        None => (server, 2181),
    })
}

fn token_of(stat: &zk::Stat) -> Result<u64, LockError> {
    u64::try_from(stat.czxid)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| LockError::Protocol(format!("bad czxid {}", stat.czxid)))
}

/// Errors of operations on a grant's own session: an expired session is a lost lease.
fn session_error(e: zk::Error) -> LockError {
    match e {
        zk::Error::SessionExpired => LockError::LeaseNotFound,
        e => zk_error(e),
    }
}

fn zk_error(e: zk::Error) -> LockError {
    use zk::Error as E;
    match e {
        E::Timeout => LockError::Timeout,
        E::NoHosts | E::ConnectionLoss | E::ClientClosed | E::SessionExpired | E::SessionMoved => {
            LockError::Transport(format!("ZooKeeper: {e}"))
        }
        E::BadArguments(m) => LockError::InvalidArgument(format!("ZooKeeper: {m}")),
        E::NoAuth | E::AuthFailed | E::InvalidAcl | E::QuotaExceeded | E::Throttled | E::NotReadOnly => {
            LockError::Rejected { status: 0, detail: format!("ZooKeeper: {e}") }
        }
        e => LockError::Protocol(format!("ZooKeeper: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn names_are_one_segment_and_prefixes_are_checked() {
        // Nothing listens on port 9.
        assert!(matches!(ZkLockClient::connect("").await, Err(LockError::InvalidArgument(_))));
        let err = ZkLockClient::connect("127.0.0.1:9").await.unwrap_err();
        assert!(matches!(err, LockError::Transport(_) | LockError::Timeout), "{err:?}");
        assert_eq!(utf8_percent_encode("a/b", SEGMENT).to_string(), "a%2Fb");
        assert_eq!(utf8_percent_encode("..", SEGMENT).to_string(), "%2E%2E");
        assert_eq!(utf8_percent_encode("job-1_x", SEGMENT).to_string(), "job-1_x");
    }
}
