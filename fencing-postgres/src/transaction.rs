//! `FenceTransaction`: the transactions [`PgFence::fence`](crate::PgFence::fence) runs in.
//!
//! The fence statement is the same every time, so what it costs the server is
//! mostly parsing and planning it, unless it is prepared. A pooled
//! (`deadpool_postgres`) transaction prepares it once per connection and keeps
//! it in the connection's statement cache; a plain `tokio_postgres` transaction
//! has no cache to keep it in, so it sends the statement with typed parameters
//! (parse, bind and execute in one batch: no prepare round trip, but a parse
//! and a plan each time). BENCHMARKS.md §13 has the difference.

use std::future::Future;

use tokio_postgres::types::Type;
use tokio_postgres::{Error, Row};

/// A transaction that [`PgFence::fence`](crate::PgFence::fence) can fence in:
/// a `deadpool_postgres::Transaction` (the statement prepared once per pooled
/// connection) or a `tokio_postgres::Transaction` (sent unprepared each time).
///
/// Sealed: the fence is only sound inside a transaction, which both of these are.
pub trait FenceTransaction: sealed::Sealed + Sync {
    /// Runs the fence statement `sql` with `(key, token on the wire)`.
    #[doc(hidden)]
    fn fence_query<'a>(
        &'a self,
        sql: &'a str,
        key: &'a str,
        wire: i64,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a;
}

/// The fence statement's parameter types: the key and the token on the wire.
pub(crate) const PARAMS: [Type; 2] = [Type::TEXT, Type::INT8];

impl FenceTransaction for tokio_postgres::Transaction<'_> {
    async fn fence_query(&self, sql: &str, key: &str, wire: i64) -> Result<Vec<Row>, Error> {
        self.query_typed(sql, &[(&key, PARAMS[0].clone()), (&wire, PARAMS[1].clone())]).await
    }
}

impl FenceTransaction for deadpool_postgres::Transaction<'_> {
    async fn fence_query(&self, sql: &str, key: &str, wire: i64) -> Result<Vec<Row>, Error> {
        // A cache hit does not wait: the execute goes out on this future's
        // first poll, ahead of anything the caller sends after it.
        let statement = self.prepare_typed_cached(sql, &PARAMS).await?;
        self.query(&statement, &[&key, &wire]).await
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tokio_postgres::Transaction<'_> {}
    impl Sealed for deadpool_postgres::Transaction<'_> {}
}
