//! [`LockBackend`](crate::LockBackend) on etcd v3 (feature `etcd`): a lock key on an etcd lease, whose
//! create revision is the fencing token.
//!
//! See [`EtcdLockClient`] for how locks, tokens and TTLs map onto etcd.

use std::fmt;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetResponse, Identity, KeyValue, PutOptions,
    TlsOptions, Txn, TxnOp, TxnOpResponse,
};

use crate::backend::{Grant, LockError, LockProtocol, LockStatus, check_name_and_holder};
use crate::tls::{ClientTls, with_sources};

/// etcd-client's error text for a keepalive answered with TTL 0 (the lease is gone).
const KEEPALIVE_TTL_ZERO: &str = "lease not found";

/// The key prefix lock keys live under unless [`EtcdLockClient::with_prefix`] says otherwise.
pub const DEFAULT_ETCD_PREFIX: &str = "fencing/locks/";

/// A lock backend on etcd v3: tokens are the lock key's create revision.
///
/// * **Acquire**: grant an etcd lease with the TTL, then one transaction on the lock
///   key (`{prefix}{name}`, default prefix `fencing/locks/`):
///   `if create_revision(key) == 0 then put(key, holder, lease); get(key) else get(key)`.
///   Won: the token is the key's create revision. Lost: the fresh lease is revoked and
///   the error is [`LockError::Held`] with the holder (the key's value) and the holder
///   lease's remaining TTL.
/// * **Keepalive**: one request/response on a fresh etcd `LeaseKeepAlive` stream per
///   renewal; an answer with TTL 0 means the lease is gone ([`LockError::LeaseNotFound`]).
///   The same renewal then reads the key: if it was deleted or re-created (another
///   create revision, another lease), the lock is no longer ours, also `LeaseNotFound`.
/// * **Release**: delete the key if its create revision is still our token, then
///   revoke the lease.
///
/// Revisions are cluster-wide and strictly increasing, and a key deleted and created
/// again gets a new, higher create revision, so every grant's token is higher than
/// every earlier grant's, across lock names and across etcd restarts (etcd persists its
/// revision counter).
///
/// # TTLs are whole seconds
///
/// etcd lease TTLs are whole seconds. The requested TTL is rounded **up** to the next
/// whole second (1500 ms asks for 2 s, 200 ms for 1 s), and etcd may raise it further
/// to its minimum lease TTL (`ceil(1.5 × election timeout)`: 2 s with etcd's default
/// 1 s election timeout). [`Grant::ttl`] is what etcd granted. [`Lease`](crate::Lease) trusts the
/// smaller of the requested and granted TTL for its local deadline and renews every
/// third of the requested TTL, so a client never works longer than it asked for; the
/// cost of rounding up is that after a crash the lock stays taken for the granted TTL.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencing_client::LockError> {
/// use std::time::Duration;
/// use fencing_client::{EtcdLockClient, LockBackendExt};
///
/// let locks = EtcdLockClient::connect(["http://127.0.0.1:2379"]).await?;
/// let lease = locks.lease("report", "worker-1", Duration::from_secs(10)).await?;
/// println!("token {} (etcd lease {})", lease.token(), lease.lease_id());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct EtcdLockClient {
    client: Client,
    prefix: String,
    /// The endpoints, for messages (empty: [`EtcdLockClient::from_client`]).
    endpoints: String,
}

impl fmt::Debug for EtcdLockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdLockClient").field("prefix", &self.prefix).finish_non_exhaustive()
    }
}

impl EtcdLockClient {
    /// Connects to etcd at `endpoints` (e.g. `["http://127.0.0.1:2379"]`). Connecting
    /// is bounded to 5 s and each direct request to 30 s (the lease keeper bounds its
    /// own calls tighter). The connection is made lazily: an unreachable etcd shows up
    /// as an error of the first request, not here.
    ///
    /// `https://` endpoints are reached over TLS, trusting the system's roots; for a
    /// cluster with a CA of its own, or a client certificate, see
    /// [`connect_tls`](Self::connect_tls).
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(endpoints: S) -> Result<Self, LockError> {
        let https = endpoints.as_ref().iter().any(|e| e.as_ref().starts_with("https://"));
        let options = default_options();
        let options = if https { options.with_tls(ClientTls::new().etcd_options()) } else { options };
        Self::connect_with(endpoints, options).await
    }

    /// As [`connect`](Self::connect), over TLS as `tls` says, to `https://` endpoints
    /// (e.g. `["https://127.0.0.1:2379"]`; an `http://` one is refused). A server whose
    /// certificate `tls`'s CA did not sign fails the first request, naming the TLS error
    /// (`invalid peer certificate: UnknownIssuer`).
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fencing_client::LockError> {
    /// use fencing_client::{EtcdLockClient, tls::ClientTls};
    ///
    /// let tls = ClientTls::new()
    ///     .ca_file("/etc/etcd/ca.pem")?
    ///     .identity_files("/etc/etcd/client.pem", "/etc/etcd/client-key.pem")?;
    /// let locks = EtcdLockClient::connect_tls(["https://10.0.0.1:2379", "https://10.0.0.2:2379"], &tls).await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect_tls<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        tls: &ClientTls,
    ) -> Result<Self, LockError> {
        Self::connect_with(endpoints, default_options().with_tls(tls.etcd_options())).await
    }

    /// Connects with explicit etcd-client options (TLS, user and password, timeouts).
    /// [`ClientTls::etcd_options`] makes the TLS part from PEM files.
    pub async fn connect_with<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        options: ConnectOptions,
    ) -> Result<Self, LockError> {
        let named: Vec<&str> = endpoints.as_ref().iter().map(AsRef::as_ref).collect();
        let named = named.join(",");
        let client = Client::connect(endpoints, Some(options)).await.map_err(etcd_error)?;
        Ok(EtcdLockClient { endpoints: named, ..Self::from_client(client) })
    }

    /// Uses an already connected etcd client.
    pub fn from_client(client: Client) -> Self {
        EtcdLockClient { client, prefix: DEFAULT_ETCD_PREFIX.to_owned(), endpoints: String::new() }
    }

    /// [`etcd_error`], naming the endpoints in a transport error (which may be a TLS one).
    fn error(&self, e: etcd_client::Error) -> LockError {
        match etcd_error(e) {
            LockError::Transport(why) if !self.endpoints.is_empty() => {
                LockError::Transport(format!("{why} (etcd at {})", self.endpoints))
            }
            other => other,
        }
    }

    /// Puts lock keys under `prefix` instead of [`DEFAULT_ETCD_PREFIX`]. The key of
    /// lock `name` is `prefix` followed by `name`, verbatim.
    pub fn with_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// The etcd key of lock `name`.
    pub fn lock_key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }

    /// The underlying etcd client (a cheap clone shares its connection).
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Who holds `name`, or `None` if it is free. `expires_in` is etcd's remaining
    /// lease TTL, which it reports in whole seconds.
    pub async fn lock_status(&self, name: &str) -> Result<Option<LockStatus>, LockError> {
        let mut client = self.client.clone();
        let resp = client.get(self.lock_key(name), None).await.map_err(|e| self.error(e))?;
        let Some(kv) = resp.kvs().first() else { return Ok(None) };
        let (holder, expires_in) = self.holder_of(kv).await?;
        Ok(Some(LockStatus { name: name.to_owned(), holder, token: token_of(kv)?, expires_in }))
    }

    /// The holder named in `kv` and its lease's remaining TTL (zero if already gone).
    async fn holder_of(&self, kv: &KeyValue) -> Result<(String, Duration), LockError> {
        let holder = String::from_utf8_lossy(kv.value()).into_owned();
        if kv.lease() == 0 {
            return Ok((holder, Duration::ZERO));
        }
        let mut client = self.client.clone();
        let expires_in = match client.lease_time_to_live(kv.lease(), None).await {
            // TTL is -1 once the lease has expired.
            Ok(r) => Duration::from_secs(u64::try_from(r.ttl()).unwrap_or(0)),
            Err(e) => match self.error(e) {
                LockError::LeaseNotFound => Duration::ZERO,
                other => return Err(other),
            },
        };
        Ok((holder, expires_in))
    }

    async fn revoke_quietly(&self, lease_id: i64) {
        if let Err(e) = self.client.clone().lease_revoke(lease_id).await {
            tracing::debug!(lease = format_args!("{lease_id:x}"), error = %e, "revoking an unused etcd lease failed");
        }
    }
}

impl LockProtocol for EtcdLockClient {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        check_name_and_holder(name, holder)?;
        let ttl_secs = ttl_seconds(ttl)?;
        let mut client = self.client.clone();
        let granted = client.lease_grant(ttl_secs, None).await.map_err(|e| self.error(e))?;
        if !granted.error().is_empty() {
            return Err(LockError::Rejected { status: 0, detail: granted.error().to_owned() });
        }
        let lease_id = granted.id();
        let granted_ttl = Duration::from_secs(u64::try_from(granted.ttl()).unwrap_or(0));

        let key = self.lock_key(name);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, 0)])
            .and_then([
                TxnOp::put(key.as_str(), holder, Some(PutOptions::new().with_lease(lease_id))),
                TxnOp::get(key.as_str(), None),
            ])
            .or_else([TxnOp::get(key.as_str(), None)]);
        let outcome = match client.txn(txn).await {
            Ok(r) => r,
            Err(e) => {
                self.revoke_quietly(lease_id).await;
                return Err(self.error(e));
            }
        };
        let current = last_get(&outcome.op_responses());
        if outcome.succeeded() {
            let Some(kv) = current.as_ref().and_then(|g| g.kvs().first()) else {
                self.revoke_quietly(lease_id).await;
                return Err(LockError::Protocol("lock key missing right after its put".into()));
            };
            let token = token_of(kv)?;
            tracing::debug!(name, holder, token, lease = format_args!("{lease_id:x}"), "etcd lock acquired");
            return Ok(Grant {
                lease_id: format!("{lease_id:x}"),
                name: name.to_owned(),
                holder: holder.to_owned(),
                token,
                ttl: granted_ttl,
                proof: None,
            });
        }
        // Held by someone else: our fresh lease holds nothing; do not leave it to expire.
        self.revoke_quietly(lease_id).await;
        match current.as_ref().and_then(|g| g.kvs().first()) {
            Some(kv) => {
                let (holder, expires_in) = self.holder_of(kv).await?;
                Err(LockError::Held { holder, expires_in, retry_after: None })
            }
            // Deleted between the compare and the read cannot happen inside one txn.
            None => Err(LockError::Protocol("lock key neither free nor readable".into())),
        }
    }

    async fn keepalive(&self, grant: &Grant) -> Result<(), LockError> {
        let id = parse_lease_id(&grant.lease_id)?;
        let mut client = self.client.clone();
        // Opening the stream sends one keepalive request and reads its one answer;
        // etcd-client turns an answer with TTL 0 (the lease is gone) into an error.
        match client.lease_keep_alive(id).await {
            Ok(_) => {}
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m == KEEPALIVE_TTL_ZERO => {
                return Err(LockError::LeaseNotFound);
            }
            Err(e) => return Err(self.error(e)),
        }
        // The lease lives; is the key still the one we created on it?
        let resp = client.get(self.lock_key(&grant.name), None).await.map_err(|e| self.error(e))?;
        match resp.kvs().first() {
            Some(kv) if kv.lease() == id && token_of(kv)? == grant.token => Ok(()),
            other => {
                tracing::warn!(
                    name = grant.name,
                    token = grant.token,
                    now = ?other.map(|kv| (kv.create_revision(), kv.lease())),
                    "etcd lock key deleted or replaced while our lease lives"
                );
                Err(LockError::LeaseNotFound)
            }
        }
    }

    async fn release(&self, grant: &Grant) -> Result<(), LockError> {
        let id = parse_lease_id(&grant.lease_id)?;
        let revision = i64::try_from(grant.token).map_err(|_| {
            LockError::InvalidArgument(format!("token {} is not an etcd revision", grant.token))
        })?;
        let mut client = self.client.clone();
        let key = self.lock_key(&grant.name);
        let txn = Txn::new()
            .when([Compare::create_revision(key.as_str(), CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(key.as_str(), None)]);
        let deleted = client.txn(txn).await.map_err(|e| self.error(e))?.succeeded();
        match client.lease_revoke(id).await {
            Ok(_) => Ok(()),
            Err(e) => match self.error(e) {
                // The lease was gone already; fine if we still removed our key.
                LockError::LeaseNotFound if deleted => Ok(()),
                other => Err(other),
            },
        }
    }
}

/// What [`EtcdLockClient::connect`] connects with: 5 s to connect, 30 s a request.
fn default_options() -> ConnectOptions {
    ConnectOptions::new().with_connect_timeout(Duration::from_secs(5)).with_timeout(Duration::from_secs(30))
}

impl ClientTls {
    /// These settings as etcd-client takes them ([`ConnectOptions::with_tls`]): the CA
    /// given (else the system's roots), and the client certificate, if given.
    pub fn etcd_options(&self) -> TlsOptions {
        let options = TlsOptions::new();
        let options = match self.ca_text() {
            Some(ca) => options.ca_certificate(Certificate::from_pem(ca)),
            None => options.with_native_roots(),
        };
        match self.identity_text() {
            Some((cert, key)) => options.identity(Identity::from_pem(cert, key)),
            None => options,
        }
    }
}

/// `ttl` in whole seconds, rounded up, at least 1.
fn ttl_seconds(ttl: Duration) -> Result<i64, LockError> {
    if ttl.is_zero() {
        return Err(LockError::InvalidArgument("ttl must be positive".into()));
    }
    let secs = ttl.as_secs().saturating_add(u64::from(ttl.subsec_nanos() > 0));
    i64::try_from(secs).map_err(|_| LockError::InvalidArgument("ttl too long".into()))
}

/// etcd lease ids travel in [`Grant::lease_id`] as lowercase hex, as `etcdctl` prints them.
fn parse_lease_id(s: &str) -> Result<i64, LockError> {
    u64::from_str_radix(s, 16)
        .ok()
        .and_then(|v| i64::try_from(v).ok())
        .filter(|&v| v != 0)
        .ok_or_else(|| LockError::InvalidArgument(format!("not an etcd lease id: {s:?}")))
}

fn token_of(kv: &KeyValue) -> Result<u64, LockError> {
    u64::try_from(kv.create_revision())
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| LockError::Protocol(format!("bad create revision {}", kv.create_revision())))
}

fn last_get(responses: &[TxnOpResponse]) -> Option<GetResponse> {
    responses.iter().rev().find_map(|r| match r {
        TxnOpResponse::Get(g) => Some(g.clone()),
        _ => None,
    })
}

fn etcd_error(e: etcd_client::Error) -> LockError {
    use etcd_client::Error as E;
    use std::error::Error as _;
    use tonic::Code;
    match e {
        E::GRpcStatus(status) => match status.code() {
            Code::NotFound => LockError::LeaseNotFound,
            Code::DeadlineExceeded => LockError::Timeout,
            // A failed connection's cause (a TLS error among them) is in the sources.
            Code::Unavailable | Code::Cancelled | Code::Unknown => {
                LockError::Transport(format!("etcd: {}", with_sources(status.message(), status.source())))
            }
            code => LockError::Rejected { status: code as u16, detail: status.message().to_owned() },
        },
        E::TransportError(e) => LockError::Transport(format!("etcd: {}", with_sources(&e, e.source()))),
        E::IoError(e) => LockError::Transport(format!("etcd: {e}")),
        E::LeaseKeepAliveError(e) => LockError::Transport(format!("etcd keepalive: {e}")),
        E::InvalidArgs(e) => LockError::InvalidArgument(e),
        E::InvalidUri(e) => LockError::InvalidArgument(format!("bad etcd endpoint: {e}")),
        other => LockError::Protocol(format!("etcd: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_seconds(Duration::from_millis(1)).unwrap(), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(200)).unwrap(), 1);
        assert_eq!(ttl_seconds(Duration::from_secs(1)).unwrap(), 1);
        assert_eq!(ttl_seconds(Duration::from_millis(1001)).unwrap(), 2);
        assert_eq!(ttl_seconds(Duration::from_millis(1500)).unwrap(), 2);
        assert_eq!(ttl_seconds(Duration::from_secs(30)).unwrap(), 30);
        assert!(matches!(ttl_seconds(Duration::ZERO), Err(LockError::InvalidArgument(_))));
        assert!(matches!(ttl_seconds(Duration::MAX), Err(LockError::InvalidArgument(_))));
    }

    #[test]
    fn lease_ids_are_hex() {
        assert_eq!(parse_lease_id("694d7a3b2c1d0e0f").unwrap(), 0x694d7a3b2c1d0e0f);
        assert_eq!(parse_lease_id(&format!("{:x}", 12345i64)).unwrap(), 12345);
        for bad in ["", "0", "xyz", "-1", "ffffffffffffffff", "1ffffffffffffffff"] {
            assert!(parse_lease_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn grpc_errors_map_to_lock_errors() {
        let not_found = etcd_client::Error::GRpcStatus(tonic::Status::not_found("requested lease not found"));
        assert_eq!(etcd_error(not_found), LockError::LeaseNotFound);
        let slow = etcd_client::Error::GRpcStatus(tonic::Status::deadline_exceeded("slow"));
        assert_eq!(etcd_error(slow), LockError::Timeout);
        let down = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
        assert!(matches!(etcd_error(down), LockError::Transport(_)));
        let denied = etcd_client::Error::GRpcStatus(tonic::Status::permission_denied("no"));
        assert_eq!(etcd_error(denied), LockError::Rejected { status: 7, detail: "no".into() });
    }

    #[tokio::test]
    async fn lock_keys_use_the_prefix() {
        // Connecting is lazy: nothing listens on port 9 and no request is made.
        let c = EtcdLockClient::connect(["http://127.0.0.1:9"]).await.unwrap();
        assert_eq!(c.lock_key("report"), "fencing/locks/report");
        let c = c.with_prefix("app/");
        assert_eq!(c.lock_key("a/b"), "app/a/b");
    }
}
