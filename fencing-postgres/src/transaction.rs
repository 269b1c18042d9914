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
//!
//! Through a pooler in transaction mode ([`Pooling::Transaction`](crate::Pooling))
//! nothing named may outlive the transaction, and the session has no bounds:
//! both kinds then send `SET LOCAL` of the bounds and the statement unnamed,
//! back to back (one round trip).

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
    /// Runs the fence statement `sql` with `(key, token on the wire)`; with
    /// `set_local`, that first and the statement unnamed, in one round trip.
    #[doc(hidden)]
    fn fence_query<'a>(
        &'a self,
        sql: &'a str,
        key: &'a str,
        wire: i64,
        set_local: Option<&'a str>,
    ) -> impl Future<Output = Result<Vec<Row>, Error>> + Send + 'a;
}

/// The fence statement's parameter types: the key and the token on the wire.
pub(crate) const PARAMS: [Type; 2] = [Type::TEXT, Type::INT8];

impl FenceTransaction for tokio_postgres::Transaction<'_> {
    async fn fence_query(
        &self,
        sql: &str,
        key: &str,
        wire: i64,
        set_local: Option<&str>,
    ) -> Result<Vec<Row>, Error> {
        unnamed(self.client(), sql, key, wire, set_local).await
    }
}

/// The statement with typed parameters (unnamed), after `set_local` if any.
async fn unnamed(
    client: &tokio_postgres::Client,
    sql: &str,
    key: &str,
    wire: i64,
    set_local: Option<&str>,
) -> Result<Vec<Row>, Error> {
    let params = [(&key as _, PARAMS[0].clone()), (&wire as _, PARAMS[1].clone())];
    match set_local {
        None => client.query_typed(sql, &params).await,
        Some(bounds) => {
            let ((), rows) =
                tokio::try_join!(biased; client.batch_execute(bounds), client.query_typed(sql, &params))?;
            Ok(rows)
        }
    }
}

impl FenceTransaction for deadpool_postgres::Transaction<'_> {
    async fn fence_query(
        &self,
        sql: &str,
        key: &str,
        wire: i64,
        set_local: Option<&str>,
    ) -> Result<Vec<Row>, Error> {
        if set_local.is_some() {
            return unnamed(self.client(), sql, key, wire, set_local).await;
        }
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
