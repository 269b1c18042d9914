//! fencing-postgres: fencing marks in PostgreSQL, shared by every replica: checked in the same
//! transaction as the write ([`PgFence`]), or for the layer as a whole ([`PgSharedStore`], replica claims).
//! It is not a lock or a token source: fencing-client's `PgLockClient` issues tokens; this crate checks them.
//!
//! The fencing layer keeps marks per process. With several replicas behind a
//! load balancer, a stale holder's request can reach a replica that never saw
//! the newer token, and be admitted. For effects in PostgreSQL the cure is to
//! check the token where the effect happens: the handler's own transaction
//! locks the key's mark row, refuses a lower token, raises a higher one, and
//! only then writes. Data and mark commit together, or not at all.
//!
//! ```text
//! BEGIN
//!   fence(&tx, key, token)   -- lower than the mark: Stale (409), roll back
//!   ... the handler's writes ...
//! COMMIT                     -- mark and data together; the mark row unlocks
//! ```
//!
//! Per key, across every replica using the database: the tokens of committed
//! fenced transactions, in commit order, never decrease (monotonic admission),
//! and a higher token's fence returns only after the lower-token transaction
//! holding the row has committed or rolled back (no overlap across holders).
//!
//! # An axum handler
//!
//! ```no_run
//! # #[cfg(feature = "axum")]
//! # mod example {
//! use axum::extract::{Path, State};
//! use axum::{Router, http::StatusCode, routing::put};
//! use deadpool_postgres::Pool;
//! use fencing_layer::{FencingLayer, FencingToken};
//! use fencing_postgres::{FenceError, PgFence, PoolLimits};
//!
//! #[derive(Clone)]
//! struct App {
//!     pool: Pool,
//!     fence: PgFence,
//! }
//!
//! async fn put_doc(
//!     State(app): State<App>,
//!     Path(name): Path<String>,
//!     token: FencingToken,
//!     body: String,
//! ) -> Result<StatusCode, FenceError> {
//!     let mut client = app.pool.get().await?;
//!     let tx = client.transaction().await?;
//!     // The layer's default key is the decoded path: the same key here keeps one mark.
//!     app.fence.fence(&tx, &format!("/docs/{name}"), token.get()).await?;
//!     tx.execute(
//!         "INSERT INTO docs (name, body) VALUES ($1, $2)
//!          ON CONFLICT (name) DO UPDATE SET body = EXCLUDED.body",
//!         &[&name, &body],
//!     )
//!     .await?;
//!     tx.commit().await?;
//!     Ok(StatusCode::NO_CONTENT)
//! }
//!
//! pub async fn serve() -> Result<(), Box<dyn std::error::Error>> {
//!     let config: fencing_postgres::PgConnect = "host=127.0.0.1 user=postgres dbname=app".parse()?;
//!     let pool = fencing_postgres::pool(config, PoolLimits::default())?;
//!     let fence = PgFence::new();
//!     let client = pool.get().await?;
//!     fence.migrate(&client).await?;
//!     drop(client); // back to the pool
//!     let app = Router::new()
//!         .route("/docs/{name}", put(put_doc))
//!         // Parses the token (400, 428) and turns away what this replica already
//!         // knows is stale; the transaction has the last word.
//!         .route_layer(FencingLayer::new())
//!         .with_state(App { pool, fence });
//!     let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
//!     axum::serve(listener, app).await?;
//!     Ok(())
//! }
//! # }
//! # fn main() {}
//! ```
//!
//! With the `axum` feature, a `FenceError` is a response: a stale token gets
//! the layer's own 409 `application/problem+json` (the same bytes as
//! [`fencing_layer::respond::ProblemJson::body`] of [`FenceError::rejection`]), a
//! database that is away or a pool that is exhausted a 503 with `Retry-After`,
//! each with one log line.
//!
//! # The statements
//!
//! One statement, so one round trip per fenced transaction, and it can go out
//! with the write (`try_join!(biased; fence, write)`). A pooled
//! transaction prepares it once per connection; a plain `tokio_postgres` one
//! sends it with typed parameters each time ([`FenceTransaction`]). Which
//! statement depends on the token. Without the token encoding (below):
//!
//! ```sql
//! -- The token this PgFence fenced the key with last (every write of a holder
//! -- after its first): lock the row and read its mark. Nothing is rewritten.
//! SELECT mark FROM fencing_marks WHERE key = $1 FOR NO KEY UPDATE
//! -- Any other token (a raise, a key's first use here): lock, then insert or raise.
//! WITH cur AS (SELECT mark FROM fencing_marks WHERE key = $1 FOR NO KEY UPDATE),
//! up AS (
//!   INSERT INTO fencing_marks AS m (key, mark, previous)
//!   SELECT $1, $2, 0 WHERE NOT EXISTS (SELECT 1 FROM cur WHERE cur.mark >= $2)
//!   ON CONFLICT (key) DO UPDATE SET mark = GREATEST(m.mark, EXCLUDED.mark), previous = m.mark
//!   RETURNING previous, mark
//! )
//! SELECT previous, mark FROM up
//! UNION ALL SELECT mark, mark FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)
//! ```
//!
//! Either locks the key's row until the transaction ends. A token equal to
//! the mark only locks it: no new row version and no dead tuple per write.
//! What the process remembers is only a hint for choosing: the row's mark
//! decides, and a row gone or lowered behind the process's back is created or
//! raised by the second statement. A returned mark above the token is a stale
//! token: the row was locked but not changed, and the caller's rollback
//! releases it. `previous` carries the mark the statement found back to [`Fenced`].
//!
//! Tokens are `u64`; the table keeps them in `NUMERIC(20,0)`, so a mark reads
//! as the token it is and an operator can reset one with plain SQL
//! (`UPDATE fencing_marks SET mark = 41 WHERE key = '/docs/a'`). On the wire
//! they travel as `int8` holding `token − 2⁶³`, which keeps their order.
//!
//! # Isolation levels and waits
//!
//! READ COMMITTED (the default) is the natural level: a fence that waited for
//! the row sees the mark the other transaction committed. Under REPEATABLE
//! READ or SERIALIZABLE, a mark changed after the snapshot was taken is a
//! serialization failure (SQLSTATE 40001), returned as [`FenceError::Retry`]:
//! roll back and run the transaction again. Under READ COMMITTED, fence
//! before reading what the token guards: reads after the fence see every
//! earlier holder's commits.
//!
//! A higher token waits for the lower-token transaction holding the row, as
//! the layer's drain does. [`pool()`] bounds that wait with `lock_timeout`
//! (running out is `Retry`, 503), bounds waiting for a connection, and has the
//! server end a session idle in a transaction, so a paused replica frees the
//! key. A connection that drops mid-transaction is rolled back by the server,
//! which frees the row: nothing is half-applied, nothing stays locked.
//!
//! # A shared store for the layer
//!
//! For effects outside PostgreSQL (a file, a queue, another service), the
//! layer itself can keep its contract across replicas: [`PgSharedStore`]
//! gives every replica's [`FencingLayer`](fencing_layer::FencingLayer) marks
//! in the database and **replica claims**
//! ([`fencing_layer::claims`]): a replica holds a claim on a key's current
//! token, a row with an expiry on the database's clock that it renews in the
//! background, and admits every request with that token in memory. A raise
//! commits the higher mark, tells the replicas (`NOTIFY`), and waits, up to
//! the drain bound, until every lower claim is released or expired (then 503).
//! A replica that cannot renew stops its own requests before its claim can
//! expire. No exclusion rests on a database session staying alive.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use axum::{Router, routing::post};
//! use fencing_layer::FencingLayer;
//! use fencing_postgres::{PgConnect, PgFence, PgSharedStore, PoolLimits};
//!
//! // Over TLS, the server's certificate checked against the CA in the file (see `PgConnect`).
//! let config: PgConnect =
//!     "postgres://app@db.internal/app?sslmode=verify-full&sslrootcert=/etc/ssl/db-ca.pem".parse()?;
//! let pool = fencing_postgres::pool(config.clone(), PoolLimits::default())?;
//! let store = PgSharedStore::new(pool, config, PgFence::new());
//! store.migrate().await?;
//! store.ready().await?; // the background session that renews claims, open before serving
//! let app: Router = Router::new()
//!     .route("/jobs/{name}", post(|| async { "ran" }))
//!     .route_layer(FencingLayer::new().shared_store(store));
//! # let _ = app; Ok(()) }
//! ```
//!
//! A request with the replica's current token costs no round trip and holds
//! no connection; a replica uses two threads (the keeper's, the hints') and two
//! background connections of its own (renewals; `LISTEN`), and its pool only for the short transactions of a
//! grant, a raise or a release. A key is fenced one way: through the shared
//! store or in the transaction ([`FenceError::FencedByClaims`] and a 400 from
//! the store refuse the mix). `claims.rs` and `shared.rs` in this crate give the
//! mapping onto PostgreSQL; the argument for why it holds is in
//! [`fencing_layer::claims`].
//!
//! # Over TLS
//!
//! [`pool()`] and [`PgSharedStore`] connect as a [`PgConnect`] says: a connection string with
//! libpq's `sslmode` (`disable`, `prefer`, `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert`, or a `tokio_postgres::Config` (whose `prefer`, the default, uses TLS when the
//! server offers it, without checking its certificate). TLS is rustls's, with no OpenSSL needed;
//! [`connect`] has what each mode checks, and [`connect::describe_error`] puts a refusal's cause
//! (the certificate, the name) into one line.
//!
//! # Crashes and failover
//!
//! A mark holds only if no later primary can forget it. Each connection that
//! [`pool()`] opens asks the server first and is refused when it could lose an
//! acknowledged commit: `synchronous_commit = off`, or a standby streaming
//! asynchronously, which a failover would promote without the last raises
//! ([`durability`] has the list; [`PoolLimits::accept_volatile_commits`] opts out).
//!
//! # Cargo features
//!
//! - `axum`: `IntoResponse` for [`FenceError`].

#![deny(missing_docs, unsafe_code, unreachable_pub)]
#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "axum")]
mod axum;
mod claims;
pub mod connect;
pub mod durability;
mod error;
mod fence;
mod hints;
mod known;
mod migrate;
mod pool;
pub mod pooling;
mod shared;
mod table;
mod transaction;

pub use crate::connect::PgConnect;
pub use crate::durability::{NotDurable, check_durability, durability_hook};
pub use crate::error::FenceError;
pub use crate::fence::{DEFAULT_TABLE, Fenced, MAX_KEY_BYTES, PgFence};
pub use crate::pool::{PoolLimits, pool};
pub use crate::pooling::Pooling;
pub use crate::shared::PgSharedStore;
pub use crate::table::InvalidTableName;
pub use crate::transaction::FenceTransaction;
