//! [`LockBackend`](crate::LockBackend) on PostgreSQL (feature `postgres`): a lease table, a durable token
//! counter row, and expiry judged on the database's clock.
//!
//! See [`PgLockClient`] for the tables, the statements and why the tokens are durable.
//! Every statement is sent unnamed (`query_typed`): nothing prepared outlives it, so the
//! client works through a pooler in transaction mode (PgBouncer `pool_mode = transaction`).

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use deadpool_postgres::{HookError, Manager, Pool, PoolError, Runtime};
use fencing_postgres::PgConnect;
use fencing_postgres::connect::describe_error;
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;

use crate::backend::{Grant, LockError, LockProtocol, LockStatus, check_name_and_holder};
use crate::pg_durability;

/// The lease table unless [`PgLockClient::with_table`] says otherwise. The token
/// counter lives in `{table}_token`.
pub const DEFAULT_PG_LOCK_TABLE: &str = "fencing_leases";

/// Bound on one call made outside the lease keeper (which bounds its own), and on
/// opening a connection.
const DIRECT_CALL_BOUND: Duration = Duration::from_secs(30);
const CONNECT_BOUND: Duration = Duration::from_secs(5);

/// PostgreSQL silently truncates longer identifiers (NAMEDATALEN − 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

/// A lock backend on PostgreSQL: one row per held lock, tokens from one counter row.
///
/// # Tables
///
/// [`PgLockClient::migrate`] creates (if missing) the lease table (default
/// `fencing_leases`: `name`, `holder`, `token`, `ttl_ms`, `expires_at`) and the counter
/// table `fencing_leases_token`, one row holding the last token handed out.
///
/// # Statements (each one statement, so one transaction, in one round trip)
///
/// * **Acquire**: increment the counter row, then
///   `INSERT … ON CONFLICT (name) DO UPDATE … WHERE expires_at <= clock_timestamp()`
///   with the new value as the token and `clock_timestamp() + ttl` as the expiry:
///   the lock is taken only if it is free or its lease has expired. When the lock is
///   held the counter is not touched (a guard skips it); only two acquires racing for
///   the same free lock can spend a value that then goes unused: tokens may skip,
///   never repeat or go back. The counter row is locked until the statement commits,
///   so grants are serialized: a grant that commits later has a higher token.
/// * **Keepalive**: `UPDATE … SET expires_at = clock_timestamp() + ttl WHERE name AND
///   token match AND expires_at > clock_timestamp()`: only our own, still live lease;
///   no row is [`LockError::LeaseNotFound`].
/// * **Release**: `DELETE … WHERE name AND token match`: only our own lease.
///
/// Tokens are unique per grant, so a grant is identified by (name, token);
/// [`Grant::lease_id`] is the token in decimal.
///
/// # Clocks
///
/// Expiry is decided by `clock_timestamp()`, the database server's clock at the
/// moment each statement runs (not `now()`, which is the transaction's start and
/// would be stale after waiting on the counter row's lock). No client clock takes
/// part. `clock_timestamp()` is the server's wall clock: if an operator steps it
/// forward, leases end early on the server while their holders still trust them
/// for the rest of their local deadline; the fencing token is what protects the
/// resource then (as from any holder paused past its TTL).
///
/// # Durability
///
/// The counter is an ordinary row, updated in the same committed transaction that
/// records the grant, so it is WAL-logged and, with PostgreSQL's defaults
/// (`fsync = on`, `synchronous_commit = on`), on disk before the client sees the
/// token: after a crash (kill -9 included) and restart, the next token is higher
/// than every token handed out before. With `synchronous_commit = off` the last
/// few commits can be lost in a crash, and a token could then be handed out
/// twice: leave it on for the database (or role) this client uses; the client refuses
/// a session with it off, and a server streaming to an asynchronous standby (see below).
/// (A sequence would also work: `nextval` logs ahead and never goes back after a crash,
/// *provided* the transaction that handed the value out committed durably, but it
/// skips values on every rollback and its crash behaviour is subtler to state.)
///
/// # Durability: refused unless commits survive a crash and a failover
///
/// Each connection the client's pool opens first asks the server, in one round trip,
/// whether it could lose an acknowledged grant, and fails with [`LockError::NotDurable`]
/// if so: `synchronous_commit = off` in the session; a physical standby streaming
/// asynchronously (not named in `synchronous_standby_names`: promoted, it lacks the last
/// grants, and tokens repeat); `synchronous_commit = local` while standbys stream; or
/// standbys whose state the role cannot read (grant it `pg_monitor`). A standby in
/// `synchronous_standby_names` is accepted: the failover tooling must promote only a
/// synchronous one. [`PgLockClient::accept_volatile_counter`] skips the check for those
/// who accept the risk. A pool given to [`PgLockClient::from_pool`] is not checked
/// unless [`PgLockClient::check_durability`] is called.
///
/// ```no_run
/// # async fn demo() -> Result<(), fencing_client::LockError> {
/// use std::time::Duration;
/// use fencing_client::{LockBackendExt, PgLockClient};
///
/// let locks = PgLockClient::connect("postgres://postgres@127.0.0.1:5432/app")?;
/// locks.migrate().await?;
/// let lease = locks.lease("report", "worker-1", Duration::from_secs(10)).await?;
/// println!("token {}", lease.token());
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PgLockClient {
    pool: Pool,
    sql: Arc<Statements>,
    /// Read by the pool's durability hook when it opens a connection.
    accept_volatile: Arc<AtomicBool>,
}

impl fmt::Debug for PgLockClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgLockClient").field("table", &self.sql.table).finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Statements {
    table: String,
    migrate: String,
    acquire: String,
    holder: String,
    keepalive: String,
    release: String,
    status: String,
}

impl Statements {
    fn new(table: &str) -> Result<Self, LockError> {
        let leases = quote(table)?;
        let counter = quote(&format!("{table}_token"))?;
        // Remaining time of a lease in whole milliseconds, rounded up, never negative.
        let left = "GREATEST(0, CEIL(EXTRACT(EPOCH FROM (expires_at - clock_timestamp())) * 1000))::int8";
        Ok(Statements {
            table: table.to_owned(),
            migrate: format!(
                "SELECT pg_advisory_xact_lock(hashtext('fencing-client pg locks migrate'));
                 CREATE TABLE IF NOT EXISTS {leases} (
                     name TEXT COLLATE \"C\" PRIMARY KEY,
                     holder TEXT NOT NULL,
                     token INT8 NOT NULL CHECK (token > 0),
                     ttl_ms INT8 NOT NULL CHECK (ttl_ms > 0),
                     expires_at TIMESTAMPTZ NOT NULL
                 );
                 CREATE TABLE IF NOT EXISTS {counter} (
                     one BOOL PRIMARY KEY DEFAULT true CHECK (one),
                     last_token INT8 NOT NULL CHECK (last_token >= 0)
                 );
                 INSERT INTO {counter} (one, last_token) VALUES (true, 0) ON CONFLICT DO NOTHING"
            ),
            // $1 name, $2 holder, $3 ttl_ms → (token, ttl_ms) if granted, no row if held.
            // The NOT EXISTS guard keeps a held lock from spending counter values; the
            // ON CONFLICT … WHERE is what decides (on the latest row version).
            acquire: format!(
                "WITH next AS (
                     UPDATE {counter} SET last_token = last_token + 1
                     WHERE one AND NOT EXISTS (
                         SELECT 1 FROM {leases} WHERE name = $1::text AND expires_at > clock_timestamp()
                     )
                     RETURNING last_token
                 )
                 INSERT INTO {leases} AS l (name, holder, token, ttl_ms, expires_at)
                 SELECT $1::text, $2::text, next.last_token, $3::int8,
                        clock_timestamp() + $3::int8 * interval '1 millisecond'
                 FROM next
                 ON CONFLICT (name) DO UPDATE
                     SET holder = EXCLUDED.holder, token = EXCLUDED.token,
                         ttl_ms = EXCLUDED.ttl_ms, expires_at = EXCLUDED.expires_at
                     WHERE l.expires_at <= clock_timestamp()
                 RETURNING l.token, l.ttl_ms"
            ),
            // $1 name → (holder, ms left) of a live lease.
            holder: format!(
                "SELECT holder, {left} FROM {leases} WHERE name = $1 AND expires_at > clock_timestamp()"
            ),
            // $1 name, $2 token → one row if renewed.
            keepalive: format!(
                "UPDATE {leases} SET expires_at = clock_timestamp() + ttl_ms * interval '1 millisecond'
                 WHERE name = $1 AND token = $2 AND expires_at > clock_timestamp() RETURNING 1"
            ),
            // $1 name, $2 token → one row if it was ours.
            release: format!("DELETE FROM {leases} WHERE name = $1 AND token = $2 RETURNING 1"),
            // $1 name → (holder, token, ms left) of a live lease.
            status: format!(
                "SELECT holder, token, {left} FROM {leases} WHERE name = $1 AND expires_at > clock_timestamp()"
            ),
        })
    }
}

impl PgLockClient {
    /// A client of the database at `url`: a `postgres://user@host:port/db` URL or a
    /// `host=… dbname=…` string, TLS as its `sslmode` and `sslrootcert` say, as in libpq
    /// (`?sslmode=verify-full&sslrootcert=/path/ca.pem`; [`fencing_postgres::connect`] has
    /// what each mode checks). Connections open on first use, at most 8 at once, each
    /// within 5 s (unless the URL sets `connect_timeout`).
    /// Run [`PgLockClient::migrate`] once before the first lock.
    pub fn connect(url: &str) -> Result<Self, LockError> {
        let config: PgConnect =
            url.parse().map_err(|e| LockError::InvalidArgument(format!("bad PostgreSQL URL: {e}")))?;
        Self::connect_with(config)
    }

    /// As [`PgLockClient::connect`], from parsed settings: a [`PgConnect`], or a
    /// `tokio_postgres::Config` (its `sslmode` as libpq means it: `prefer`, the default,
    /// uses TLS when the server offers it, without checking its certificate).
    pub fn connect_with(config: impl Into<PgConnect>) -> Result<Self, LockError> {
        let (mut config, tls) = config.into().into_parts();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_BOUND);
        }
        let accept_volatile = Arc::new(AtomicBool::new(false));
        let pool = Pool::builder(Manager::new(config, tls))
            .post_create(pg_durability::hook(Arc::clone(&accept_volatile)))
            .max_size(8)
            .wait_timeout(Some(CONNECT_BOUND))
            .create_timeout(Some(CONNECT_BOUND))
            .recycle_timeout(Some(CONNECT_BOUND))
            .runtime(Runtime::Tokio1)
            .build()
            .map_err(|e| LockError::InvalidArgument(format!("PostgreSQL pool: {e}")))?;
        let sql = Statements::new(DEFAULT_PG_LOCK_TABLE).expect("the default table name is valid");
        Ok(PgLockClient { pool, sql: Arc::new(sql), accept_volatile })
    }

    /// Uses an existing deadpool-postgres pool (TLS, sizes and timeouts of your own).
    /// Its connections are not checked for durability: call
    /// [`PgLockClient::check_durability`].
    pub fn from_pool(pool: Pool) -> Self {
        let sql = Statements::new(DEFAULT_PG_LOCK_TABLE).expect("the default table name is valid");
        PgLockClient { pool, sql: Arc::new(sql), accept_volatile: Arc::new(AtomicBool::new(true)) }
    }

    /// With `true`, uses a server that could lose an acknowledged grant in a crash or
    /// a failover (see the type's docs); tokens could then repeat or go back, and a
    /// fenced resource could no longer tell a stale holder from the current one.
    /// Default `false`: such a server is refused with [`LockError::NotDurable`] when a
    /// connection opens. Clones share the setting (and the pool).
    #[must_use]
    pub fn accept_volatile_counter(self, accept: bool) -> Self {
        self.accept_volatile.store(accept, Ordering::Relaxed);
        self
    }

    /// Asks the server now whether it could lose an acknowledged grant:
    /// [`LockError::NotDurable`] if so. The pool [`PgLockClient::connect`] builds does this
    /// on every new connection by itself.
    pub async fn check_durability(&self) -> Result<(), LockError> {
        bounded(async {
            let client = self.pool.get().await.map_err(pool_error)?;
            match pg_durability::refusal(&client).await.map_err(pg_error)? {
                None => Ok(()),
                Some(reason) => Err(LockError::NotDurable(reason)),
            }
        })
        .await
    }

    /// Keeps leases in `table` (`table` or `schema.table`: ASCII letters, digits and
    /// underscores, not starting with a digit) and the counter in `{table}_token`,
    /// instead of [`DEFAULT_PG_LOCK_TABLE`]. Anything else is refused before it can
    /// reach SQL.
    pub fn with_table(mut self, table: &str) -> Result<Self, LockError> {
        self.sql = Arc::new(Statements::new(table)?);
        Ok(self)
    }

    /// The lease table's name, as given.
    pub fn table(&self) -> &str {
        &self.sql.table
    }

    /// The pool (a cheap clone shares it).
    pub fn pool(&self) -> &Pool {
        &self.pool
    }

    /// Creates the lease and counter tables if missing. Idempotent, and safe when
    /// several clients start at once (an advisory lock orders them). A schema in the
    /// table name must exist already.
    pub async fn migrate(&self) -> Result<(), LockError> {
        bounded(async {
            let client = self.pool.get().await.map_err(pool_error)?;
            client.batch_execute(&self.sql.migrate).await.map_err(pg_error)
        })
        .await
    }

    /// Who holds `name`, or `None` if it is free (or its lease has expired).
    /// `expires_in` is judged on the database's clock, rounded up to the millisecond.
    pub async fn lock_status(&self, name: &str) -> Result<Option<LockStatus>, LockError> {
        bounded(async {
            let client = self.pool.get().await.map_err(pool_error)?;
            let rows =
                client.query_typed(&self.sql.status, &[(&name, Type::TEXT)]).await.map_err(pg_error)?;
            let Some(row) = rows.into_iter().next() else { return Ok(None) };
            let token: i64 = row.try_get(1).map_err(pg_error)?;
            Ok(Some(LockStatus {
                name: name.to_owned(),
                holder: row.try_get(0).map_err(pg_error)?,
                token: token_from_db(token)?,
                expires_in: millis(row.try_get(2).map_err(pg_error)?),
            }))
        })
        .await
    }
}

impl LockProtocol for PgLockClient {
    async fn acquire(&self, name: &str, holder: &str, ttl: Duration) -> Result<Grant, LockError> {
        check_name_and_holder(name, holder)?;
        if name.contains('\0') || holder.contains('\0') {
            return Err(LockError::InvalidArgument("lock name and holder must not contain NUL".into()));
        }
        let ttl_ms = ttl_millis(ttl)?;
        let client = self.pool.get().await.map_err(pool_error)?;
        // The lock can be released or expire between the attempt and the look at its
        // holder; then it is free, and the attempt is worth making again (a few times:
        // each retry means another client released or let it expire meanwhile).
        for _ in 0..3 {
            let asked = [(&name as _, Type::TEXT), (&holder as _, Type::TEXT), (&ttl_ms as _, Type::INT8)];
            let granted = client.query_typed(&self.sql.acquire, &asked).await.map_err(pg_error)?;
            if let Some(row) = granted.into_iter().next() {
                let token = token_from_db(row.try_get(0).map_err(pg_error)?)?;
                let ttl = millis(row.try_get(1).map_err(pg_error)?);
                tracing::debug!(name, holder, token, "PostgreSQL lock acquired");
                return Ok(Grant {
                    lease_id: token.to_string(),
                    name: name.to_owned(),
                    holder: holder.to_owned(),
                    token,
                    ttl,
                    proof: None,
                });
            }
            // Held (or taken by a racing acquire): report who holds it now.
            let held =
                client.query_typed(&self.sql.holder, &[(&name, Type::TEXT)]).await.map_err(pg_error)?;
            if let Some(row) = held.into_iter().next() {
                let (held_by, expires_in) =
                    (row.try_get(0).map_err(pg_error)?, millis(row.try_get(1).map_err(pg_error)?));
                return Err(LockError::Held { holder: held_by, expires_in, retry_after: None });
            }
        }
        // Held at each attempt and free at each look: held, by nobody known.
        Err(LockError::Held { holder: String::new(), expires_in: Duration::ZERO, retry_after: None })
    }

    async fn keepalive(&self, grant: &Grant) -> Result<(), LockError> {
        self.on_own_row(&self.sql.keepalive, grant).await
    }

    async fn release(&self, grant: &Grant) -> Result<(), LockError> {
        self.on_own_row(&self.sql.release, grant).await
    }
}

impl PgLockClient {
    /// Runs `sql` ($1 name, $2 token) on `grant`'s row: one row touched, or the
    /// lease is not ours (anymore).
    async fn on_own_row(&self, sql: &str, grant: &Grant) -> Result<(), LockError> {
        let token = token_to_db(grant.token)?;
        let client = self.pool.get().await.map_err(pool_error)?;
        let params = [(&grant.name as _, Type::TEXT), (&token as _, Type::INT8)];
        match client.query_typed(sql, &params).await.map_err(pg_error)?.len() {
            1 => Ok(()),
            _ => Err(LockError::LeaseNotFound),
        }
    }
}

async fn bounded<T>(work: impl Future<Output = Result<T, LockError>>) -> Result<T, LockError> {
    tokio::time::timeout(DIRECT_CALL_BOUND, work).await.map_err(|_| LockError::Timeout)?
}

/// `ttl` in whole milliseconds, rounded up, at least 1.
fn ttl_millis(ttl: Duration) -> Result<i64, LockError> {
    if ttl.is_zero() {
        return Err(LockError::InvalidArgument("ttl must be positive".into()));
    }
    let ms = ttl.as_nanos().div_ceil(1_000_000);
    // Far below i64::MAX: PostgreSQL intervals and timestamps end long before.
    const MAX_MS: u128 = 100 * 365 * 24 * 3600 * 1000;
    if ms > MAX_MS {
        return Err(LockError::InvalidArgument("ttl above a century".into()));
    }
    Ok(ms as i64)
}

fn millis(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn token_from_db(token: i64) -> Result<u64, LockError> {
    u64::try_from(token)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| LockError::Protocol(format!("bad token {token} in the lease table")))
}

fn token_to_db(token: u64) -> Result<i64, LockError> {
    i64::try_from(token)
        .ok()
        .filter(|&t| t > 0)
        .ok_or_else(|| LockError::InvalidArgument(format!("token {token} was not issued by PostgreSQL")))
}

fn pool_error(e: PoolError) -> LockError {
    match e {
        PoolError::Timeout(_) => LockError::Timeout,
        PoolError::Backend(e) | PoolError::PostCreateHook(HookError::Backend(e)) => pg_error(e),
        PoolError::PostCreateHook(HookError::Message(refused)) => LockError::NotDurable(refused.into_owned()),
        other => LockError::Transport(format!("PostgreSQL pool: {}", describe_error(&other))),
    }
}

fn pg_error(e: tokio_postgres::Error) -> LockError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::QUERY_CANCELED || *code == SqlState::LOCK_NOT_AVAILABLE {
            return LockError::Timeout;
        }
        if *code == SqlState::UNDEFINED_TABLE {
            return LockError::Rejected {
                status: 0,
                detail: format!("{} (run PgLockClient::migrate first)", db.message()),
            };
        }
        return LockError::Rejected { status: 0, detail: format!("{}: {}", code.code(), db.message()) };
    }
    // Its causes too: tokio-postgres's own message is often only "db error" or "error
    // performing TLS handshake".
    LockError::Transport(format!("PostgreSQL: {}", describe_error(&e)))
}

/// `name` as a quoted, possibly schema-qualified identifier: `"schema"."table"`.
fn quote(name: &str) -> Result<String, LockError> {
    let refuse = |reason: &str| {
        LockError::InvalidArgument(format!(
            "invalid lease table name {name:?}: {reason} (expected `table` or `schema.table`, each an \
             ASCII letter or underscore followed by letters, digits or underscores, at most \
             {MAX_IDENTIFIER_BYTES} bytes with the `_token` suffix)"
        ))
    };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(refuse("more than one `.`"));
    }
    for part in &parts {
        let mut chars = part.chars();
        match chars.next() {
            None => return Err(refuse("an empty name or schema")),
            Some(c) if !(c.is_ascii_alphabetic() || c == '_') => {
                return Err(refuse("a name must start with an ASCII letter or an underscore"));
            }
            Some(_) => {}
        }
        if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(refuse("only ASCII letters, digits and underscores are allowed"));
        }
        if part.len() > MAX_IDENTIFIER_BYTES {
            return Err(refuse("longer than PostgreSQL keeps"));
        }
    }
    Ok(parts.iter().map(|part| format!("\"{part}\"")).collect::<Vec<_>>().join("."))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_milliseconds() {
        assert_eq!(ttl_millis(Duration::from_nanos(1)).unwrap(), 1);
        assert_eq!(ttl_millis(Duration::from_micros(1500)).unwrap(), 2);
        assert_eq!(ttl_millis(Duration::from_secs(10)).unwrap(), 10_000);
        assert!(matches!(ttl_millis(Duration::ZERO), Err(LockError::InvalidArgument(_))));
        assert!(matches!(ttl_millis(Duration::MAX), Err(LockError::InvalidArgument(_))));
    }

    #[test]
    fn tokens_outside_int8_are_refused() {
        assert_eq!(token_to_db(7).unwrap(), 7);
        assert!(matches!(token_to_db(0), Err(LockError::InvalidArgument(_))));
        assert!(matches!(token_to_db(u64::MAX), Err(LockError::InvalidArgument(_))));
        assert!(matches!(token_from_db(-1), Err(LockError::Protocol(_))));
        assert!(matches!(token_from_db(0), Err(LockError::Protocol(_))));
    }

    #[test]
    fn table_names_are_checked_then_quoted() {
        assert_eq!(quote("fencing_leases").unwrap(), r#""fencing_leases""#);
        assert_eq!(quote("ops.Leases_2").unwrap(), r#""ops"."Leases_2""#);
        for bad in ["", ".", "a.b.c", "1abc", "a-b", "a;DROP TABLE x", "a\"b", "é", &"a".repeat(64)] {
            assert!(matches!(quote(bad), Err(LockError::InvalidArgument(_))), "{bad:?}");
        }
        // The counter table's name (`_token` appended) must fit too.
        let client = PgLockClient::connect("host=127.0.0.1 user=postgres").unwrap();
        assert!(client.clone().with_table(&"a".repeat(58)).is_err());
        assert_eq!(client.with_table("ops.locks").unwrap().table(), "ops.locks");
    }

    #[test]
    fn bad_urls_are_clear_errors() {
        match PgLockClient::connect("postgres://[bad") {
            Err(LockError::InvalidArgument(e)) => assert!(e.contains("bad PostgreSQL URL"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
