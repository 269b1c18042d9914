//! etcd's errors as the layer's [`StoreError`]: every one means "the backend
//! did not answer as needed", which the layer turns into 503 or a session
//! opened again; only a lease etcd no longer has is an answer in itself.

use std::future::Future;

use etcd_client::Error;
use fencing_layer::store::StoreError;

/// Attempts at a request that fails before reaching any member.
const SEND_ATTEMPTS: usize = 4;

/// gRPC's `UNAVAILABLE`.
const UNAVAILABLE: i32 = 14;

pub(crate) trait ToStore {
    fn to_store(self) -> StoreError;
}

impl ToStore for Error {
    fn to_store(self) -> StoreError {
        StoreError::log(self)
    }
}

/// etcd says the lease is gone (expired or revoked), with every key on it:
/// a keepalive answered with TTL 0, or a request naming it refused.
pub(crate) fn is_lease_gone(error: &Error) -> bool {
    match error {
        Error::LeaseKeepAliveError(message) => message == "lease not found",
        // etcd's text: "etcdserver: requested lease not found".
        Error::GRpcStatus(status) => status.message().contains("lease not found"),
        _ => false,
    }
}

/// The request never left: the client could not connect to the member its
/// balancer picked (tonic's "tcp connect error").
pub(crate) fn never_sent(error: &Error) -> bool {
    matches!(error, Error::GRpcStatus(status)
        if i32::from(status.code()) == UNAVAILABLE && status.message() == "tcp connect error")
}

/// `request` through a clone of `client`, made again (at most
/// [`SEND_ATTEMPTS`] times) while it fails without having been sent.
///
/// Why: etcd-client's balancer keeps a dead member in its rotation and fails
/// the requests it routes there at once instead of sending them elsewhere.
/// With one of three members down, a third of all requests failed, and a
/// renewal (a keepalive, then reads) or a grant (a keepalive, two Txns) often
/// had one of them fail: sessions reopened, claims lapsed, raises waited,
/// while two members served (found by `tests/cluster/cluster_faults.rs`, its leader
/// killed). A request that was never sent changed nothing, and one sent
/// later is as good: a keepalive extends the lease from a later time, a read
/// is as fresh, a Txn compares again.
pub(crate) async fn sent<C: Clone, T, F, R>(client: &C, mut request: F) -> Result<T, Error>
where
    F: FnMut(C) -> R,
    R: Future<Output = Result<T, Error>>,
{
    let mut attempts = 1;
    loop {
        match request(client.clone()).await {
            Err(error) if attempts < SEND_ATTEMPTS && never_sent(&error) => attempts += 1,
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_lease_counts_as_gone() {
        assert!(is_lease_gone(&Error::LeaseKeepAliveError("lease not found".into())));
        assert!(!is_lease_gone(&Error::LeaseKeepAliveError("stream closed".into())));
        assert!(!is_lease_gone(&Error::InvalidArgs("x".into())));
    }

    fn status(code: tonic::Code, message: &str) -> Error {
        Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn only_a_failed_connect_counts_as_never_sent() {
        assert!(never_sent(&status(tonic::Code::Unavailable, "tcp connect error")));
        assert!(!never_sent(&status(tonic::Code::Unavailable, "etcdserver: no leader")));
        assert!(!never_sent(&status(tonic::Code::Cancelled, "tcp connect error")));
        assert!(!never_sent(&Error::InvalidArgs("tcp connect error".into())));
    }

    #[tokio::test]
    async fn a_request_never_sent_is_made_again_a_bounded_number_of_times() {
        let calls = std::sync::atomic::AtomicUsize::new(0);
        let failing = |fails: usize| {
            let calls = &calls;
            move |()| {
                let n = calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let answer = if n < fails {
                    Err(status(tonic::Code::Unavailable, "tcp connect error"))
                } else {
                    Ok(n)
                };
                std::future::ready(answer)
            }
        };
        assert_eq!(sent(&(), failing(2)).await.unwrap(), 2, "sent on the third attempt");
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        assert!(sent(&(), failing(usize::MAX)).await.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), SEND_ATTEMPTS);
        calls.store(0, std::sync::atomic::Ordering::SeqCst);
        let refused = |()| {
            calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            std::future::ready(Err::<(), _>(status(tonic::Code::Unavailable, "etcdserver: no leader")))
        };
        assert!(sent(&(), refused).await.is_err());
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1, "an answer from etcd is final");
    }
}
