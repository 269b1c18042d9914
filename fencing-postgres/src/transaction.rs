//! `FenceTransaction`: the transactions [`PgFence::fence`](crate::PgFence::fence) runs in.
//!
//! The fence statement is the same every time, so what it costs the server is
//! mostly parsing and planning it, unless it is prepared. A pooled
//! (`deadpool_postgres`) transaction prepares it once per connection and keeps
//! it in the connection's statement cache (the first fence on a connection
//! sends it unprepared beside its preparation, so that even then it goes out
//! before anything sent after it); a plain `tokio_postgres` transaction
//! has no cache to keep it in, so it sends the statement with typed parameters
//! (parse, bind and execute in one batch: no prepare round trip, but a parse
//! and a plan each time). BENCHMARKS.md §13 has the difference.

use std::future::Future;
use std::task::Poll;

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
        // The fence must go out on this future's first poll, ahead of a write
        // the caller polls after it (`try_join!`). A cached statement is ready at
        // once. Preparing one waits a round trip, which would let that write go
        // first: so on a miss the statement goes out unprepared now, right behind
        // the preparation, which is kept for this connection's next fence.
        let mut prepared = std::pin::pin!(self.prepare_typed_cached(sql, &PARAMS));
        match std::future::poll_fn(|cx| Poll::Ready(prepared.as_mut().poll(cx))).await {
            Poll::Ready(statement) => self.query(&statement?, &[&key, &wire]).await,
            Poll::Pending => {
                let params = [(&key as _, PARAMS[0].clone()), (&wire as _, PARAMS[1].clone())];
                let (rows, _) = tokio::try_join!(biased; self.query_typed(sql, &params), prepared)?;
                Ok(rows)
            }
        }
    }
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for tokio_postgres::Transaction<'_> {}
    impl Sealed for deadpool_postgres::Transaction<'_> {}
}
