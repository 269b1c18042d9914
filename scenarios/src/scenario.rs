//! The seed's scenario, end to end over real HTTP: a lease holder paused past its
//! TTL writes after the next holder, first without fencing, then with it; then a
//! stale write that is already inside the handler when the newer holder arrives.
//!
//! Everything runs in this process on ephemeral `127.0.0.1` ports: the demo lock
//! service, and one resource per run, each in a fresh temporary directory. With
//! [`run_with`] the tokens come from etcd, PostgreSQL, Redis or ZooKeeper instead
//! (see [`TokenSource`]), through the same fencing layer.
//! No step waits on a guess about timing: B acquires once the lock service says
//! A's lease has expired, and in the third run B acquires once A's write is known
//! to be inside the handler.
//!
//! The run records what happened when ([`Report::history`]);
//! [`Report::timeline`] draws the three rounds on one time axis
//! (`scenarios --timeline FILE.svg`).
//!
//! ```no_run
//! # async fn demo() -> Result<(), scenarios::Failure> {
//! let report = scenarios::scenario::run().await?;
//! print!("{report}");
//! assert!(report.problems().is_empty());
//! # Ok(()) }
//! ```

mod picture;
mod record;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper-tls"))]
use std::path::Path;
use std::path::PathBuf;
use std::time::Duration;

use demo_lock_service::LockService;
#[cfg(feature = "etcd")]
use fencing_client::EtcdLockClient;
#[cfg(feature = "postgres")]
use fencing_client::PgLockClient;
#[cfg(feature = "redis")]
use fencing_client::RedisLockClient;
#[cfg(feature = "zookeeper")]
use fencing_client::ZkLockClient;
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper-tls"))]
use fencing_client::tls::ClientTls;
use fencing_client::{
    DemoLockClient, Grant, Lease, LockBackend, LockBackendExt, LockError, backend::LockStatus,
    header::fence_reqwest,
};
use serde_json::Value;

use crate::failure::{Failure, STEP_BOUND, bounded, fail};
use demo_resource::{Config, Entry, MAX_DELAY_MS, Resource, RunningResource, Served};
use record::Recorder;
pub use record::{Happening, Holder, Recorded, Round};

/// What B writes, under its valid lease.
pub const B_WRITE: &str = "B: write under valid lease";
/// What A writes after waking up with its expired lease.
pub const A_WRITE: &str = "A: write from expired lease";
/// What A writes in the in-flight run, while its lease is still valid.
pub const A_IN_FLIGHT_WRITE: &str = "A: write admitted before B's grant";

/// A's lease: short, so the runs are quick. A never renews it (it is paused).
const A_TTL: Duration = Duration::from_millis(200);
/// B's lease, kept alive in the background until B releases it.
const B_TTL: Duration = Duration::from_secs(10);

/// How one write was answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The HTTP status.
    pub status: u16,
    /// The status text and, for an error, the problem's `detail`.
    pub reason: String,
}

impl Answer {
    /// Whether the write was applied (2xx).
    pub fn accepted(&self) -> bool {
        (200..300).contains(&self.status)
    }
}

/// One run of the two writers against one resource.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// A's token (the older lease).
    pub a_token: u64,
    /// B's token (the newer lease).
    pub b_token: u64,
    /// How A's write was answered.
    pub a: Answer,
    /// How B's write was answered.
    pub b: Answer,
    /// The log afterwards, in append order.
    pub log: Vec<Entry>,
}

impl Run {
    /// The values of the log, in append order.
    pub fn values(&self) -> Vec<&str> {
        self.log.iter().map(|entry| entry.value.as_str()).collect()
    }
}

/// The three runs' outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// A paused past its TTL writes after B; the resource is not fenced.
    pub without_fencing: Run,
    /// The same with the fencing layer.
    pub with_fencing: Run,
    /// A's write was admitted (and is waiting out `delay_ms`) before B acquired.
    pub in_flight: Run,
    /// In the in-flight run: B's write had reached the layer (its token raised the
    /// mark) while A's write was still inside the handler.
    pub b_arrived_while_a_inside: bool,
    /// What happened when, in all three runs: grants, expiries, writes and
    /// their answers, the marks seen ([`Report::timeline`] draws it).
    pub history: Vec<Recorded>,
}

impl Report {
    /// Every way the outcomes differ from the expected ones (empty when all is well).
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut expect = |ok: bool, what: &str| {
            if !ok {
                problems.push(what.to_owned());
            }
        };
        let (off, on, flight) = (&self.without_fencing, &self.with_fencing, &self.in_flight);
        expect(off.a.accepted() && off.b.accepted(), "without fencing, both writes are accepted");
        expect(off.values() == [B_WRITE, A_WRITE], "without fencing, the log is [B's, A's]");
        expect(on.b.accepted(), "with fencing, B's write is accepted");
        expect(on.a.status == 409, "with fencing, A's write is rejected 409");
        expect(on.values() == [B_WRITE], "with fencing, the log is [B's]");
        expect(flight.a.accepted() && flight.b.accepted(), "in flight, both writes are accepted");
        expect(flight.values() == [A_IN_FLIGHT_WRITE, B_WRITE], "in flight, the log is [A's, B's]");
        expect(tokens_never_fall(&flight.log), "in flight, no older token follows a newer one");
        expect(self.b_arrived_while_a_inside, "in flight, B's write arrives while A's is inside");
        problems
    }
}

/// Whether the log's tokens never decrease (unfenced entries aside).
fn tokens_never_fall(log: &[Entry]) -> bool {
    let tokens: Vec<u64> = log.iter().filter_map(|entry| entry.token).collect();
    tokens.windows(2).all(|pair| pair[0] <= pair[1])
}

/// Go's `%q` of a string slice, as the seed prints it: `["a" "b"]` (the billing report prints lists so too).
pub(crate) struct Quoted<'a>(pub(crate) &'a [&'a str]);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let quoted: Vec<String> = self.0.iter().map(|value| format!("{value:?}")).collect();
        write!(f, "[{}]", quoted.join(" "))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "without fencing: {}", Quoted(&self.without_fencing.values()))?;
        let a = &self.with_fencing.a;
        if a.accepted() {
            writeln!(f, "A not rejected: {} {}", a.status, a.reason)?;
        } else {
            writeln!(f, "A rejected: {} {}", a.status, a.reason)?;
        }
        writeln!(f, "with fencing: {}", Quoted(&self.with_fencing.values()))?;
        let flight = &self.in_flight;
        writeln!(f, "in flight: {}", Quoted(&flight.values()))?;
        let tokens: Vec<String> =
            flight.log.iter().map(|e| e.token.map_or("null".into(), |t| t.to_string())).collect();
        let waited = if self.b_arrived_while_a_inside {
            "B's write arrived while A's was inside the handler, and waited for it"
        } else {
            "B's write did NOT arrive while A's was inside the handler"
        };
        writeln!(f, "  tokens in log order: [{}]; {waited}", tokens.join(", "))
    }
}

/// Where the scenario's fencing tokens come from. Each backend but the demo lock
/// service needs this crate's feature of the same name (`etcd`, `postgres`, `redis`,
/// `zookeeper`); without it, [`run_with`] fails at once and says so.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum TokenSource {
    /// The demo lock service, started in-process on an ephemeral port.
    #[default]
    DemoLockService,
    /// An etcd cluster at `endpoints` (e.g. `http://127.0.0.1:2379`): locks are keys
    /// under `fencing/locks/`, a token is the lock key's create revision. etcd grants
    /// whole-second leases of at least its minimum TTL (2 s by default), so A's 200 ms
    /// lease lasts about 2 s there and the runs take a few seconds longer.
    Etcd {
        /// etcd client URLs (`https://` over TLS).
        endpoints: Vec<String>,
        /// With `https://` endpoints: the PEM file of the CA that signed etcd's
        /// certificates; `None` trusts the system's roots.
        ca_file: Option<PathBuf>,
    },
    /// PostgreSQL at `url`: leases in `fencing_leases` (created if missing), a token from
    /// the counter row `fencing_leases_token`, expiry on the database's clock.
    Postgres {
        /// `postgres://user@host:port/db` or `host=… dbname=…`.
        url: String,
    },
    /// Redis at `url`: a token is `INCR` of the lock's counter key. Refused unless the
    /// server has `appendonly yes` and `appendfsync always`, or `accept_volatile_counter`.
    Redis {
        /// `redis://host:port` (`rediss://` over TLS).
        url: String,
        /// Run against a Redis that would lose its counter in a crash.
        accept_volatile_counter: bool,
        /// With a `rediss://` URL: the PEM file of the CA that signed Redis's
        /// certificate; `None` trusts the system's roots.
        ca_file: Option<PathBuf>,
    },
    /// A ZooKeeper ensemble at `cluster` (`host:port,…`): a lock is an ephemeral znode
    /// under `/fencing/locks`, a token its czxid. A asks for 2 s (a session must connect
    /// within its timeout), which the server raises to its minimum session timeout (2
    /// ticks: 4 s by default), so the runs take longer.
    ZooKeeper {
        /// `host:port[,host:port…]`.
        cluster: String,
        /// Over TLS (the servers' secure client ports), checking their certificates with
        /// the CA in this PEM file. Needs feature `zookeeper-tls`.
        ca_file: Option<PathBuf>,
    },
}

/// The lock backend of a run.
enum Locks {
    Demo(DemoLockClient),
    // Boxed: etcd-client's `Client` is a few kilobytes.
    #[cfg(feature = "etcd")]
    Etcd(Box<EtcdLockClient>),
    #[cfg(feature = "postgres")]
    Postgres(PgLockClient),
    #[cfg(feature = "redis")]
    Redis(RedisLockClient),
    #[cfg(feature = "zookeeper")]
    ZooKeeper(Box<ZkLockClient>),
}

impl Locks {
    /// A raw grant: nothing keeps it alive.
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        match self {
            Locks::Demo(c) => c.acquire(name, holder, ttl).await,
            #[cfg(feature = "etcd")]
            Locks::Etcd(c) => c.acquire(name, holder, ttl).await,
            #[cfg(feature = "postgres")]
            Locks::Postgres(c) => c.acquire(name, holder, ttl).await,
            #[cfg(feature = "redis")]
            Locks::Redis(c) => c.acquire(name, holder, ttl).await,
            #[cfg(feature = "zookeeper")]
            Locks::ZooKeeper(c) => c.acquire(name, holder, ttl).await,
        }
    }

    /// A lease kept alive in the background.
    async fn lease(&self, name: &str, holder: &str, ttl: Duration) -> Result<Lease, LockError> {
        match self {
            Locks::Demo(c) => c.lease(name, holder, ttl).await,
            #[cfg(feature = "etcd")]
            Locks::Etcd(c) => c.lease(name, holder, ttl).await,
            #[cfg(feature = "postgres")]
            Locks::Postgres(c) => c.lease(name, holder, ttl).await,
            #[cfg(feature = "redis")]
            Locks::Redis(c) => c.lease(name, holder, ttl).await,
            #[cfg(feature = "zookeeper")]
            Locks::ZooKeeper(c) => c.lease(name, holder, ttl).await,
        }
    }

    async fn lock_status(&self, name: &str) -> Result<Option<LockStatus>, LockError> {
        match self {
            Locks::Demo(c) => c.lock_status(name).await,
            #[cfg(feature = "etcd")]
            Locks::Etcd(c) => c.lock_status(name).await,
            #[cfg(feature = "postgres")]
            Locks::Postgres(c) => c.lock_status(name).await,
            #[cfg(feature = "redis")]
            Locks::Redis(c) => c.lock_status(name).await,
            #[cfg(feature = "zookeeper")]
            Locks::ZooKeeper(c) => c.lock_status(name).await,
        }
    }

    /// A's lease. ZooKeeper's is 2 s: a new session must connect within its own
    /// timeout, TLS handshake included, which a loaded JVM misses at 200 ms (and the
    /// server makes it at least 2 ticks, 4 s by default, anyway).
    fn a_ttl(&self) -> Duration {
        match self {
            #[cfg(feature = "zookeeper")]
            Locks::ZooKeeper(_) => Duration::from_secs(2),
            _ => A_TTL,
        }
    }

    /// The shortest wait between two status checks: etcd reports whole seconds (0
    /// during the last one) and ZooKeeper no time left at all, so polling them tighter
    /// would only load them.
    fn poll_floor(&self) -> Duration {
        match self {
            Locks::Demo(_) => Duration::from_millis(1),
            #[cfg(feature = "postgres")]
            Locks::Postgres(_) => Duration::from_millis(1),
            #[cfg(feature = "redis")]
            Locks::Redis(_) => Duration::from_millis(1),
            #[cfg(feature = "etcd")]
            Locks::Etcd(_) => Duration::from_millis(50),
            #[cfg(feature = "zookeeper")]
            Locks::ZooKeeper(_) => Duration::from_millis(50),
        }
    }
}

/// What every run needs: the lock backend's client and an HTTP client.
struct Clients {
    locks: Locks,
    http: reqwest::Client,
    record: Recorder,
}

const LOOPBACK: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 0);

/// Runs the three runs with tokens from the demo lock service and reports their outcomes.
///
/// # Errors
///
/// A server could not start, or a step failed or took longer than 10 s. An
/// unexpected outcome is not an error: see [`Report::problems`].
pub async fn run() -> Result<Report, Failure> {
    run_with(TokenSource::DemoLockService).await
}

/// Runs the three runs with tokens from `source` and reports their outcomes.
///
/// # Errors
///
/// As [`run`]; with another backend, also when it cannot be reached (or, for
/// Redis, when it would lose its token counter in a crash).
pub async fn run_with(source: TokenSource) -> Result<Report, Failure> {
    let dir = tempfile::tempdir().map_err(|e| fail("temporary directory", e))?;
    // The demo lock service (kept running until the end) signs its grants and the fenced
    // resources check the proofs (`--signing-key`, `--verify-key`): a forged token could
    // not raise a mark. The other backends have neither.
    let (locks, lock_service, verify_key) = match source {
        TokenSource::DemoLockService => {
            let signer =
                fencing_layer::verify::ProofSigner::generate().map_err(|e| fail("signing key", e))?;
            let verify_key = signer.public_key();
            let config = demo_lock_service::Config::new(dir.path().join("locks")).with_signer(signer);
            let service = LockService::open(config).map_err(|e| fail("lock service", e))?;
            let running = service.spawn(LOOPBACK).await.map_err(|e| fail("lock service", e))?;
            let client = DemoLockClient::new(running.base_url()).map_err(|e| fail("lock client", e))?;
            (Locks::Demo(client), Some(running), Some(verify_key))
        }
        #[cfg(feature = "etcd")]
        TokenSource::Etcd { endpoints, ca_file } => {
            let client = match ca_file {
                Some(ca_file) => EtcdLockClient::connect_tls(&endpoints, &client_tls(&ca_file)?).await,
                None => EtcdLockClient::connect(&endpoints).await,
            };
            (Locks::Etcd(Box::new(client.map_err(|e| fail("etcd client", e))?)), None, None)
        }
        #[cfg(feature = "postgres")]
        TokenSource::Postgres { url } => {
            let client = PgLockClient::connect(&url).map_err(|e| fail("PostgreSQL lock client", e))?;
            client.migrate().await.map_err(|e| fail("PostgreSQL lock tables", e))?;
            (Locks::Postgres(client), None, None)
        }
        #[cfg(feature = "redis")]
        TokenSource::Redis { url, accept_volatile_counter, ca_file } => {
            let builder = RedisLockClient::builder(url).accept_volatile_counter(accept_volatile_counter);
            let builder = match ca_file {
                Some(ca_file) => builder.tls(client_tls(&ca_file)?),
                None => builder,
            };
            let client = builder.connect().await.map_err(|e| match e {
                LockError::NotDurable(_) => {
                    fail("Redis lock client (the CLI's --redis-accept-volatile-counter accepts the risk)", e)
                }
                e => fail("Redis lock client", e),
            })?;
            (Locks::Redis(client), None, None)
        }
        #[cfg(feature = "zookeeper")]
        TokenSource::ZooKeeper { cluster, ca_file } => {
            let client = match ca_file {
                #[cfg(feature = "zookeeper-tls")]
                Some(ca_file) => ZkLockClient::connect_tls(&cluster, &client_tls(&ca_file)?).await,
                #[cfg(not(feature = "zookeeper-tls"))]
                Some(_) => return Err(not_built("zookeeper-tls")),
                None => ZkLockClient::connect(&cluster).await,
            };
            (Locks::ZooKeeper(Box::new(client.map_err(|e| fail("ZooKeeper lock client", e))?)), None, None)
        }
        #[cfg(not(feature = "etcd"))]
        TokenSource::Etcd { .. } => return Err(not_built("etcd")),
        #[cfg(not(feature = "postgres"))]
        TokenSource::Postgres { .. } => return Err(not_built("postgres")),
        #[cfg(not(feature = "redis"))]
        TokenSource::Redis { .. } => return Err(not_built("redis")),
        #[cfg(not(feature = "zookeeper"))]
        TokenSource::ZooKeeper { .. } => return Err(not_built("zookeeper")),
    };
    let clients = Clients {
        locks,
        http: reqwest::Client::builder()
            .no_proxy()
            .timeout(STEP_BOUND * 2)
            .build()
            .map_err(|e| fail("http client", e))?,
        record: Recorder::new(),
    };

    let unfenced = Config::durable(dir.path().join("unfenced")).without_fencing();
    let without_fencing =
        stale_after_newer(&clients, unfenced, Round::WithoutFencing, "without-fencing").await?;
    let verified = |config: Config| match verify_key {
        Some(key) => config.verify_key(key),
        None => config,
    };
    let fenced = verified(Config::durable(dir.path().join("fenced")));
    let with_fencing = stale_after_newer(&clients, fenced, Round::WithFencing, "with-fencing").await?;
    let in_flight = verified(Config::durable(dir.path().join("in-flight")));
    let (in_flight, b_arrived_while_a_inside) = stale_in_flight(&clients, in_flight, "in-flight").await?;

    if let Some(lock_service) = lock_service {
        lock_service.shutdown().await.map_err(|e| fail("lock service shutdown", e))?;
    }
    let history = clients.record.take();
    Ok(Report { without_fencing, with_fencing, in_flight, b_arrived_while_a_inside, history })
}

/// TLS to a lock backend, trusting the CA in the PEM file `ca_file`.
#[cfg(any(feature = "etcd", feature = "redis", feature = "zookeeper-tls"))]
fn client_tls(ca_file: &Path) -> Result<ClientTls, Failure> {
    ClientTls::new().ca_file(ca_file).map_err(|e| fail("TLS to the lock backend", e))
}

/// Why a run with a lock backend (or ZooKeeper's TLS) this build lacks fails at once.
#[cfg(not(all(feature = "etcd", feature = "postgres", feature = "redis", feature = "zookeeper-tls")))]
fn not_built(feature: &str) -> Failure {
    Failure(format!(
        "this lock backend needs scenarios built with feature `{feature}` \
         (cargo build -p scenarios --features {feature})"
    ))
}

/// The seed's scenario: A acquires and is paused past its TTL; B acquires and
/// writes; A wakes and writes with its old token.
async fn stale_after_newer(
    clients: &Clients,
    config: Config,
    round: Round,
    name: &str,
) -> Result<Run, Failure> {
    let resource = start(config).await?;
    let path = format!("/logs/{name}");
    let url = format!("{}{path}", resource.base_url());
    let record = &clients.record;
    record.note(Happening::RoundStarted(round));
    let marks = resource.served().mark_store().cloned();
    let note_mark = || record.note(Happening::Mark(marks.as_ref().and_then(|marks| marks.mark(&path))));
    if marks.is_none() {
        note_mark();
    }

    // A acquires, then is paused: a raw grant, so no keepalive runs for it either.
    let a =
        clients.locks.acquire(name, "A", clients.locks.a_ttl()).await.map_err(|e| fail("A acquires", e))?;
    record.note(Happening::Granted { holder: Holder::A, token: a.token });
    wait_until_expired(clients, name).await?;
    record.note(Happening::Expired { holder: Holder::A });
    let b = clients.locks.lease(name, "B", B_TTL).await.map_err(|e| fail("B acquires", e))?;
    record.note(Happening::Granted { holder: Holder::B, token: b.token() });
    let b_answer = write(clients, Holder::B, &url, b.grant(), B_WRITE).await?;
    if marks.is_some() {
        note_mark();
    }
    // A wakes up, still believing it holds the lock.
    let a_answer = write(clients, Holder::A, &url, &a, A_WRITE).await?;

    let b_token = b.token();
    b.release().await.map_err(|e| fail("B releases", e))?;
    record.note(Happening::Released { holder: Holder::B });
    record.note(Happening::RoundEnded(round));
    let log = read_log(clients, &url).await?;
    resource.shutdown().await.map_err(|e| fail("resource shutdown", e))?;
    Ok(Run { a_token: a.token, b_token, a: a_answer, b: b_answer, log })
}

/// The in-flight variant: A's write is admitted and still inside the handler
/// (waiting out `delay_ms`) when A's lease expires and B writes.
async fn stale_in_flight(clients: &Clients, config: Config, name: &str) -> Result<(Run, bool), Failure> {
    let running = start(config).await?;
    let resource = running.served().clone();
    let path = format!("/logs/{name}");
    let url = format!("{}{path}", running.base_url());
    let record = &clients.record;
    record.note(Happening::RoundStarted(Round::InFlight));
    let marks = resource.mark_store().cloned().ok_or_else(|| Failure("no mark store".into()))?;

    let a =
        clients.locks.acquire(name, "A", clients.locks.a_ttl()).await.map_err(|e| fail("A acquires", e))?;
    record.note(Happening::Granted { holder: Holder::A, token: a.token });
    // A sends a slow write while its lease is valid; then A is paused.
    let slow = format!("{url}?delay_ms={MAX_DELAY_MS}");
    let a_write = tokio::spawn(write_owned(
        clients.http.clone(),
        record.clone(),
        Holder::A,
        slow,
        a.clone(),
        A_IN_FLIGHT_WRITE,
    ));
    // A's write has been admitted by the layer and is inside the handler.
    bounded("A's write is admitted", resource.wait_in_flight(&path, 1)).await?;
    record.note(Happening::WriteInside { holder: Holder::A });
    record.note(Happening::Mark(marks.mark(&path)));

    wait_until_expired(clients, name).await?;
    record.note(Happening::Expired { holder: Holder::A });
    let b = clients.locks.lease(name, "B", B_TTL).await.map_err(|e| fail("B acquires", e))?;
    record.note(Happening::Granted { holder: Holder::B, token: b.token() });
    let b_write = tokio::spawn(write_owned(
        clients.http.clone(),
        record.clone(),
        Holder::B,
        url.clone(),
        b.grant().clone(),
        B_WRITE,
    ));
    // B's token has raised the mark: its write is at the layer, waiting for A's to leave.
    bounded("B's write reaches the layer", async {
        while marks.mark(&path) != Some(b.token()) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await?;
    record.note(Happening::Mark(Some(b.token())));
    record.note(Happening::WriteAtDoor { holder: Holder::B });
    // One write inside and nothing applied yet: that one is A's, B's is held at the layer.
    let b_arrived_while_a_inside =
        resource.in_flight(&path) == 1 && read_log(clients, &url).await?.is_empty();
    // A's slow write reaches the end of its delay and is applied; then B's may enter.
    resource.finish_delays();

    let a_answer = joined(a_write).await?;
    let b_answer = joined(b_write).await?;
    let b_token = b.token();
    b.release().await.map_err(|e| fail("B releases", e))?;
    record.note(Happening::Released { holder: Holder::B });
    record.note(Happening::RoundEnded(Round::InFlight));
    let log = read_log(clients, &url).await?;
    running.shutdown().await.map_err(|e| fail("resource shutdown", e))?;
    let run = Run { a_token: a.token, b_token, a: a_answer, b: b_answer, log };
    Ok((run, b_arrived_while_a_inside))
}

async fn start(config: Config) -> Result<RunningResource, Failure> {
    // Opening creates and commits the database files: blocking work.
    let opened = tokio::task::spawn_blocking(move || Resource::open(config)).await;
    let resource = opened.map_err(|e| fail("resource", e))?.map_err(|e| fail("resource", e))?;
    resource.spawn(LOOPBACK).await.map_err(|e| fail("resource", e))
}

/// Waits until the lock service no longer reports a live lease on `name`: it
/// sleeps the time left that the service reports, then asks again.
async fn wait_until_expired(clients: &Clients, name: &str) -> Result<(), Failure> {
    bounded("A's lease expires", async {
        loop {
            match clients.locks.lock_status(name).await.map_err(|e| fail("lock status", e))? {
                None => return Ok(()),
                Some(status) => tokio::time::sleep(status.expires_in.max(clients.locks.poll_floor())).await,
            }
        }
    })
    .await?
}

async fn joined(task: tokio::task::JoinHandle<Result<Answer, Failure>>) -> Result<Answer, Failure> {
    task.await.map_err(|e| fail("write task", e))?
}

async fn write(
    clients: &Clients,
    holder: Holder,
    url: &str,
    grant: &Grant,
    text: &'static str,
) -> Result<Answer, Failure> {
    let record = clients.record.clone();
    write_owned(clients.http.clone(), record, holder, url.to_owned(), grant.clone(), text).await
}

/// `POST`s `text` with the grant's `Fencing-Token` (and `Fencing-Proof`, when
/// the lock service signed it); returns how it was answered, and records when.
async fn write_owned(
    http: reqwest::Client,
    record: Recorder,
    holder: Holder,
    url: String,
    grant: Grant,
    text: &'static str,
) -> Result<Answer, Failure> {
    let token = grant.token;
    let mut request = fence_reqwest(http.post(url).body(text), token);
    if let Some(proof) = &grant.proof {
        request = request.header("fencing-proof", proof);
    }
    record.note(Happening::WriteSent { holder, token });
    let response = request.send().await.map_err(|e| fail("write", e))?;
    let status = response.status();
    record.note(Happening::WriteAnswered { holder, token, status: status.as_u16() });
    let body = response.text().await.map_err(|e| fail("write", e))?;
    let mut reason = status.canonical_reason().unwrap_or_default().to_owned();
    if !status.is_success() {
        let detail =
            serde_json::from_str::<Value>(&body).ok().and_then(|p| p["detail"].as_str().map(Into::into));
        reason = format!("{reason}: {}", detail.unwrap_or(body));
    }
    Ok(Answer { status: status.as_u16(), reason })
}

async fn read_log(clients: &Clients, url: &str) -> Result<Vec<Entry>, Failure> {
    let response = clients.http.get(url).send().await.map_err(|e| fail("read log", e))?;
    if response.status() == reqwest::StatusCode::NOT_FOUND {
        return Ok(Vec::new());
    }
    let body = response.text().await.map_err(|e| fail("read log", e))?;
    let entries = serde_json::from_str::<Value>(&body).ok().and_then(|v| v.get("entries").cloned());
    let entries = entries.ok_or_else(|| Failure(format!("read log: unexpected body {body}")))?;
    serde_json::from_value(entries).map_err(|e| fail("read log", e))
}
