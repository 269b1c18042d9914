//! etcd's errors as the layer's [`StoreError`]: every one means "the backend
//! did not answer as needed", which the layer turns into 503 or a session
//! opened again; only a lease etcd no longer has is an answer in itself.

use etcd_client::Error;
use fencing_layer::store::StoreError;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_missing_lease_counts_as_gone() {
        assert!(is_lease_gone(&Error::LeaseKeepAliveError("lease not found".into())));
        assert!(!is_lease_gone(&Error::LeaseKeepAliveError("stream closed".into())));
        assert!(!is_lease_gone(&Error::InvalidArgs("x".into())));
    }
}
