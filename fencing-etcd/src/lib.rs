//! fencing-etcd: the fencing layer's marks in etcd, shared by every replica
//! ([`EtcdSharedStore`]), for teams whose locks already live in etcd.
//!
//! It is a [`ClaimStore`] over etcd: each replica holds a claim on a key's
//! current token, an etcd key on the replica's one lease, and admits every
//! request with that token in memory. [`fencing_layer::claims`] states the
//! protocol and why a higher token never runs beside a lower one; this crate
//! maps each step onto etcd's own primitives:
//!
//! | claims | etcd |
//! |---|---|
//! | a claim's term | the replica's lease, TTL = the term rounded up to whole seconds |
//! | renewal | one keepalive of that lease (every claim of the replica at once), then a read |
//! | a raise | a Txn that writes the mark only if it is lower |
//! | a grant | a Txn that puts the claim only if the mark's revision is the one read |
//! | raise and release notifications | a Watch on the prefix (hints: the replica reads what it acts on) |
//! | expired claims swept | nothing: etcd deletes a lease's keys when it ends |
//!
//! ```no_run
//! use fencing_etcd::EtcdSharedStore;
//! use fencing_layer::FencingLayer;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let marks = EtcdSharedStore::connect(["http://127.0.0.1:2379"], "fencing/docs/").await?;
//! marks.ready().await?; // the replica's watch is open: an unreachable etcd is an error now, not 503s later
//! let layer = FencingLayer::new().shared_store(marks);
//! # let _ = layer;
//! # Ok(()) }
//! ```
//!
//! # The timing assumption
//!
//! A claim lasts as long as the replica's lease. etcd measures a lease on its
//! leader's monotonic clock from the last keepalive the leader processed; a
//! new leader gives every lease its whole TTL again (longer, never shorter).
//! The replica stops a claim's requests `term − margin` after it *sent* the
//! grant or renewal that extended it, and every grant and renewal sends a
//! keepalive of its own after taking that time. So, as with PostgreSQL: the
//! replica's clock and etcd's leader's must run at the same rate within the
//! margin over a term, and `renew_every + renew_timeout < term − margin`
//! ([`ClaimTiming::check`]).
//!
//! # What etcd adds, and what happens then
//!
//! - **A member that stalls** (frozen, swapping, its disk stalled, cut off
//!   while it still thinks it leads): with one client per member
//!   ([`connect`](EtcdSharedStore::connect), [`with_members`](EtcdSharedStore::with_members)),
//!   every request goes to the member that answered last; one silent for a
//!   quarter of `renew_timeout`, or answering that it cannot serve, has the
//!   next member asked too, and the first answer wins. So renewals (the
//!   keepalive and the reads after it, 128 per Txn) and grants go on through
//!   the others: with a follower frozen 8 s, a replica holding 10,000 claims
//!   lost none (`tests/cluster/stalled_member.rs`). The watch stays on one member;
//!   when that member stops answering, HTTP/2 keepalives end it within about
//!   2 s and it is opened again on another from the revision after the last
//!   one it delivered: hints come late, renewals never stop. With one client
//!   for all endpoints ([`new`](EtcdSharedStore::new), [`with_timing`](EtcdSharedStore::with_timing)),
//!   etcd-client picks a member at random per request and keeps a frozen one
//!   in its rotation (its TCP connection stays open): a renewal is a
//!   keepalive and one Txn per 64 claims, any of which may wait there for the
//!   request timeout, so renewals timed out one after another and every claim
//!   lapsed (50, 140 and 10,040 claims tried).
//! - **A leader change**: requests fail until a leader is elected (grants
//!   answer 503, a renewal that fails ends the session and the keeper opens
//!   another); leases get their whole TTL again, so raises wait longer, never
//!   shorter. A request a member cannot serve meanwhile ("no leader") is sent
//!   to the next member at once; one the client could not even send is sent
//!   again at once. A replica whose renewals fail past `term − margin` stops
//!   its requests, as on any backend outage.
//! - **A compacted revision under a watch**: etcd cancels the watch; the
//!   session ends, the keeper opens another, and every waiting raise looks
//!   again. Notifications are hints only: every claim is renewed at least every
//!   other renewal period, and a renewal reads the marks of the keys it renews,
//!   so a missed raise delays a release by at most two periods.
//! - **A lease revoked, or a claim deleted, by hand**: only an operator does
//!   that (`etcdctl lease revoke`, `etcdctl del`). Like deleting claim rows in
//!   PostgreSQL, it frees claims while their requests may be inside. The watch
//!   sees the claim deleted; the replica renews that claim at once, finds it
//!   gone and stops its requests: 3–9 ms later in `tests/cluster/revoked_by_hand.rs`
//!   (without the watch, at its next renewal: up to two `renew_every` later).
//!   Give no one but the replicas write access to the prefix.
//! - **A member cut off from the others**: every read here is linearizable
//!   (etcd-client's default), and [`connect_options`] asks for
//!   `require_leader`, so a member without a leader answers nothing and ends
//!   its watches: never a stale read. The replica renews and grants through
//!   another member (with the old leader cut off, 0 of about 400 requests for
//!   new keys got 503 once the others had a leader; 70 % with one client for
//!   all endpoints), or stops its requests in time.
//!
//! Sending one request to several members is safe for every request made
//! here: keepalives only extend the lease (from when a leader processes
//! them, after the replica took its `sent` time); reads change nothing; a
//! raise writes the mark only if lower; a grant's copies put the same claim
//! under the same compare, and a copy that finds the mark moved reads whether
//! an earlier copy put it; a release deletes only the revision it read. One
//! residual: a grant's copy that a stalled member applies *after* the replica
//! gave up on it and released that claim would put the claim back, on the
//! replica's lease, which the replica keeps alive: raises of that key answer
//! 503 at their drain bound until the replica stops. It needs the member to
//! take the request before it sees the client cancel it, and the mark
//! unchanged since; a request that timed out with one client is exposed the
//! same way.
//!
//! Marks stay in etcd (a holder of a lower token may write as long as it
//! lives); a replica that dies leaves its claims until its lease ends.

#![deny(missing_docs, unsafe_code, unreachable_pub)]

mod backend;
mod error;
mod layout;
mod lease;
mod members;
mod session;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

pub use etcd_client;
use etcd_client::{Certificate, Client, ConnectOptions, TlsOptions};
use fencing_layer::claims::check_text_key;
pub use fencing_layer::claims::{ClaimStore, ClaimTiming, ClaimTimingError};
use fencing_layer::store::{SharedAdmission, SharedPermit, SharedRefusal, SharedStore, StoreError};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject as _;

use crate::backend::EtcdClaims;
use crate::layout::{Layout, MAX_KEY_BYTES};
use crate::lease::ReplicaLease;
use crate::members::Members;

/// The claims' term unless told otherwise: 4 s, one less than
/// [`fencing_layer::claims::DEFAULT_TERM`], because etcd deletes an expired
/// lease's keys up to half a second after it expires (its lessor looks twice
/// a second). So a dead replica's claims are gone within the layer's default
/// 5 s drain bound, and a raise waiting that long gets in.
pub const DEFAULT_TERM: Duration = Duration::from_secs(4);

/// A member's patience is `renew_timeout` divided by this: a renewal (a
/// keepalive, then reads) can wait that long on a silent member, move on, and
/// still be answered within its bound.
const PATIENCE_SHARES: u32 = 4;

/// The layer's marks in etcd: give it to
/// [`FencingLayer::shared_store`](fencing_layer::FencingLayer::shared_store)
/// on every replica, with the same etcd cluster and prefix.
///
/// Each replica holds one etcd lease for all its claims and one watch on the
/// prefix; grants, raises and releases are one or two Txns each. See the
/// [crate docs](crate) for the mapping and the failure modes.
#[derive(Debug, Clone)]
pub struct EtcdSharedStore {
    claims: ClaimStore,
    prefix: Arc<str>,
}

/// The client options the store expects: `require_leader` (a member cut off
/// from its cluster refuses, rather than serves stale), HTTP/2 keepalives that
/// notice a dead connection in 2 s, connecting bounded to 2 s and each request
/// to 5 s (the keeper bounds renewals tighter). Add TLS or a user to them.
#[must_use]
pub fn connect_options() -> ConnectOptions {
    ConnectOptions::new()
        .with_require_leader(true)
        .with_keep_alive(Duration::from_secs(1), Duration::from_secs(1))
        .with_keep_alive_while_idle(true)
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5))
}

/// TLS to `https://` endpoints ([`ConnectOptions::with_tls`]): trust the certificate
/// authorities in the PEM file `ca_file` (a cluster's own CA), or with `None` the system's
/// roots. Add a client certificate for etcd's `--client-cert-auth` with
/// [`TlsOptions::identity`]. A server whose certificate the CA did not sign fails the
/// first request (etcd-client connects lazily): [`EtcdSharedStore::ready`] names the TLS
/// error (`invalid peer certificate: UnknownIssuer`).
///
/// ```no_run
/// # async fn demo() -> Result<(), etcd_client::Error> {
/// use std::path::Path;
///
/// let tls = fencing_etcd::tls_options(Some(Path::new("/etc/etcd/ca.pem")))?;
/// let store = fencing_etcd::EtcdSharedStore::connect_tls(["https://10.0.0.1:2379"], "app/marks/", tls).await?;
/// # Ok(()) }
/// ```
///
/// # Errors
///
/// [`etcd_client::Error::InvalidArgs`] naming the file, if it cannot be read or holds no
/// PEM certificate.
pub fn tls_options(ca_file: Option<&Path>) -> Result<TlsOptions, etcd_client::Error> {
    let Some(path) = ca_file else { return Ok(TlsOptions::new().with_native_roots()) };
    let refused = |why: String| etcd_client::Error::InvalidArgs(format!("CA file {}: {why}", path.display()));
    let pem = std::fs::read(path).map_err(|e| refused(format!("cannot read it: {e}")))?;
    let certificates = CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>();
    match certificates.map_err(|e| refused(format!("bad PEM: {e}")))?.len() {
        0 => Err(refused("no PEM certificate in it".to_owned())),
        _ => Ok(TlsOptions::new().ca_certificate(Certificate::from_pem(pem))),
    }
}

/// One client per endpoint, each made with `options` (lazily: a member out of
/// reach shows when it is asked): what [`EtcdSharedStore::with_members`] takes,
/// so that a member that stalls is passed over rather than waited for.
///
/// # Errors
///
/// An endpoint that is not a URL.
pub async fn member_clients<E: AsRef<str>>(
    endpoints: impl IntoIterator<Item = E>,
    options: ConnectOptions,
) -> Result<Vec<Client>, etcd_client::Error> {
    let mut clients = Vec::new();
    for endpoint in endpoints {
        clients.push(Client::connect([endpoint], Some(options.clone())).await?);
    }
    Ok(clients)
}

impl EtcdSharedStore {
    /// Connects to `endpoints`, one client each with [`connect_options`]
    /// (lazily: an unreachable etcd shows in [`ready`](Self::ready)), marks and
    /// claims under `prefix`, with claims of [`DEFAULT_TERM`].
    ///
    /// # Errors
    ///
    /// An endpoint that is not a URL, or none.
    ///
    /// `https://` endpoints are reached over TLS, trusting the system's roots; a
    /// cluster with a CA of its own: [`connect_tls`](Self::connect_tls).
    pub async fn connect<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        prefix: impl Into<String>,
    ) -> Result<Self, etcd_client::Error> {
        let https = endpoints.as_ref().iter().any(|e| e.as_ref().starts_with("https://"));
        let options = if https { connect_options().with_tls(tls_options(None)?) } else { connect_options() };
        Self::connect_with(endpoints, prefix, options).await
    }

    /// As [`connect`](Self::connect), to `https://` endpoints over TLS as `tls` says
    /// (see [`tls_options`]).
    ///
    /// # Errors
    ///
    /// An endpoint that is not a URL, or is `http://`, or none.
    pub async fn connect_tls<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        prefix: impl Into<String>,
        tls: TlsOptions,
    ) -> Result<Self, etcd_client::Error> {
        Self::connect_with(endpoints, prefix, connect_options().with_tls(tls)).await
    }

    /// One client per endpoint with `options` (made from [`connect_options`]).
    async fn connect_with<E: AsRef<str>, S: AsRef<[E]>>(
        endpoints: S,
        prefix: impl Into<String>,
        options: ConnectOptions,
    ) -> Result<Self, etcd_client::Error> {
        let clients = member_clients(endpoints.as_ref(), options).await?;
        if clients.is_empty() {
            return Err(etcd_client::Error::InvalidArgs("no etcd endpoint".into()));
        }
        let timing = ClaimTiming::for_term(DEFAULT_TERM);
        Ok(Self::with_members(clients, prefix, timing).expect("the default timing is safe"))
    }

    /// Marks and claims under `prefix` (every replica must use the same), through
    /// `client` (made with [`connect_options`], or options that keep `require_leader`),
    /// with claims of [`DEFAULT_TERM`].
    ///
    /// One client balances over its endpoints and cannot be told to pass over
    /// a member that stalls: prefer [`with_members`](Self::with_members) (or
    /// [`connect`](Self::connect)) with a cluster of several members.
    #[must_use]
    pub fn new(client: Client, prefix: impl Into<String>) -> Self {
        let timing = ClaimTiming::for_term(DEFAULT_TERM);
        Self::with_timing(client, prefix, timing).expect("the default timing is safe")
    }

    /// As [`new`](Self::new), with `timing`. etcd's leases last whole seconds:
    /// the lease is the term rounded up (raises wait for a dead replica that long).
    ///
    /// # Errors
    ///
    /// A timing that cannot keep claims safely ([`ClaimTiming::check`]).
    pub fn with_timing(
        client: Client,
        prefix: impl Into<String>,
        timing: ClaimTiming,
    ) -> Result<Self, ClaimTimingError> {
        Self::with_members(vec![client], prefix, timing)
    }

    /// Marks and claims under `prefix`, with `timing`, through `clients`: one
    /// per member of the cluster ([`member_clients`]), each made with
    /// [`connect_options`] or options that keep `require_leader`. Each request
    /// goes to the member that answered last; one that has not answered
    /// within a quarter of `renew_timeout`, or says it cannot serve (no
    /// leader, unreachable), has the next member asked too, and the first
    /// answer wins: a stalled member holds up no renewal and no grant while
    /// the others serve.
    ///
    /// # Errors
    ///
    /// A timing that cannot keep claims safely ([`ClaimTiming::check`]).
    ///
    /// # Panics
    ///
    /// `clients` is empty.
    pub fn with_members(
        clients: Vec<Client>,
        prefix: impl Into<String>,
        timing: ClaimTiming,
    ) -> Result<Self, ClaimTimingError> {
        timing.check()?;
        let members = Arc::new(Members::new(clients, timing.renew_timeout / PATIENCE_SHARES));
        let prefix = prefix.into();
        let lease = Arc::new(ReplicaLease::new(Arc::clone(&members), timing.term));
        let backend = EtcdClaims { members, layout: Arc::new(Layout::new(prefix.clone())), lease };
        let claims = ClaimStore::with_timing(backend, timing).expect("checked above");
        Ok(Self { claims, prefix: prefix.into() })
    }

    /// At most `limit` keys claimed by this replica at once ([`ClaimStore::max_keys`]).
    #[must_use]
    pub fn max_keys(mut self, limit: usize) -> Self {
        self.claims = self.claims.max_keys(limit);
        self
    }

    /// Opens the replica's watch and waits for it (see [`ClaimStore::ready`]):
    /// call it at start-up, so that an etcd out of reach is an error then.
    ///
    /// # Errors
    ///
    /// The watch did not open within `renew_every + renew_timeout`.
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.claims.ready().await
    }

    /// The claims this replica holds.
    #[must_use]
    pub fn claims(&self) -> &ClaimStore {
        &self.claims
    }

    /// The prefix marks and claims live under.
    #[must_use]
    pub fn prefix(&self) -> &str {
        &self.prefix
    }
}

impl SharedStore for EtcdSharedStore {
    #[inline]
    fn try_admit(&self, key: &str, token: u64) -> Option<Result<SharedPermit, SharedRefusal>> {
        self.claims.try_admit(key, token)
    }

    fn admit(&self, key: &str, token: u64, drain: Duration) -> SharedAdmission {
        match check_text_key(key, MAX_KEY_BYTES) {
            Ok(()) => self.claims.admit(key, token, drain),
            Err(refusal) => Box::pin(std::future::ready(Err(refusal))),
        }
    }
}
