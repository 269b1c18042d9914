//! The cluster's members, one client each, asked so that one stalled member
//! holds up nothing while others serve.
//!
//! etcd-client's `Client` balances its requests over all its endpoints at
//! random (tonic's power-of-two-choices, every member's load counted as 0),
//! and cannot be told which member to use. A member that is frozen (SIGSTOP,
//! a stalled disk, a VM pause) keeps its TCP connection open, so it stays in
//! that rotation and gets a third of the requests, which then wait for the
//! client's request timeout. A renewal is a keepalive and then one read per
//! 128 keys (two keys per claim), all of which must come back within
//! `renew_timeout`: with 100 claims, three requests, each landing on the
//! frozen member one time in three; with 10,000 claims, 80 of them at once,
//! so no renewal ever came back and every claim lapsed (issue 47).
//!
//! So [`Members`] holds one client per member and asks the member that
//! answered last first. When it has not answered within its patience (a share
//! of the renewal's bound), or says it cannot serve (no leader, unreachable),
//! the next member is asked too, and so on; the first answer wins and the
//! requests still waiting are dropped. Sending one request to several members
//! is safe for every request this crate makes; each call site says why.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use etcd_client::{Client, Error};
use tokio::task::JoinSet;

use crate::error::{is_lease_gone, sent};

/// gRPC codes with which one member says it cannot serve now (another may):
/// `UNKNOWN`, `DEADLINE_EXCEEDED`, `RESOURCE_EXHAUSTED`, `ABORTED`,
/// `INTERNAL`, `UNAVAILABLE` (etcd's "no leader", "leader changed",
/// "request timed out", and a connection that failed), `CANCELLED`.
const MEMBER_TROUBLE: [i32; 7] = [2, 4, 8, 10, 13, 14, 1];

/// One client per member of one etcd cluster (or one client for several,
/// which then balances as etcd-client does).
pub(crate) struct Members {
    clients: Box<[Client]>,
    /// The member that answered last: asked first.
    last: AtomicUsize,
    /// How long a member may stay silent before the next one is asked too.
    patience: Duration,
}

impl Members {
    /// `clients`, one per member, at least one; a member silent for
    /// `patience` has the next one asked too.
    pub(crate) fn new(clients: Vec<Client>, patience: Duration) -> Self {
        assert!(!clients.is_empty(), "at least one etcd client");
        Self { clients: clients.into(), last: AtomicUsize::new(0), patience }
    }

    /// `request`, made through the member that answered last, then (while no
    /// member answered) through the next one every `patience` or as soon as
    /// one says it cannot serve, until every member was asked. The first
    /// answer: a success, or an error that is the cluster's answer (a lease
    /// gone, a request refused). Only for requests that may be applied more
    /// than once, or applied by one member after another answered.
    pub(crate) async fn ask<T, F, R>(&self, request: F) -> Result<T, Error>
    where
        F: Fn(Client) -> R + Clone + Send + 'static,
        R: Future<Output = Result<T, Error>> + Send + 'static,
        T: Send + 'static,
    {
        let count = self.clients.len();
        let first = self.last.load(Ordering::Relaxed) % count;
        let mut asking = JoinSet::new();
        let mut asked = 0;
        loop {
            // Each turn begins with no answer yet: the first, or one member
            // silent for its patience, or one that said it cannot serve.
            if asked < count {
                let member = (first + asked) % count;
                let (client, request) = (self.clients[member].clone(), request.clone());
                // A request the client could not even send is made again at once (`sent`).
                asking.spawn(async move { (member, sent(&client, request).await) });
                asked += 1;
            }
            let patience = tokio::time::sleep(self.patience);
            tokio::select! {
                done = asking.join_next() => match done {
                    Some(Ok((member, Ok(answer)))) => {
                        self.last.store(member, Ordering::Relaxed);
                        return Ok(answer);
                    }
                    Some(Ok((_, Err(error)))) if member_trouble(&error) => {
                        if asking.is_empty() && asked == count {
                            return Err(error);
                        }
                    }
                    Some(Ok((member, Err(answer)))) => {
                        self.last.store(member, Ordering::Relaxed);
                        return Err(answer);
                    }
                    Some(Err(panicked)) => return Err(Error::IoError(std::io::Error::other(panicked))),
                    None => unreachable!("a request is in flight whenever the set is polled"),
                },
                () = patience, if asked < count => {}
            }
        }
    }
}

/// Whether `error` says that this member cannot serve now, rather than what
/// the cluster answered: another member may.
pub(crate) fn member_trouble(error: &Error) -> bool {
    match error {
        _ if is_lease_gone(error) => false,
        Error::GRpcStatus(status) => MEMBER_TROUBLE.contains(&i32::from(status.code())),
        Error::TransportError(_) | Error::IoError(_) | Error::LeaseKeepAliveError(_) => true,
        Error::WatchError(_) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: tonic::Code, message: &str) -> Error {
        Error::GRpcStatus(tonic::Status::new(code, message))
    }

    #[test]
    fn a_member_without_a_leader_or_out_of_reach_has_another_asked() {
        assert!(member_trouble(&status(tonic::Code::Unavailable, "etcdserver: no leader")));
        assert!(member_trouble(&status(tonic::Code::Unavailable, "tcp connect error")));
        assert!(member_trouble(&status(tonic::Code::DeadlineExceeded, "deadline")));
        assert!(member_trouble(&Error::LeaseKeepAliveError("stream closed".into())));
    }

    #[test]
    fn what_the_cluster_answered_is_final() {
        assert!(!member_trouble(&Error::LeaseKeepAliveError("lease not found".into())));
        assert!(!member_trouble(&status(tonic::Code::NotFound, "etcdserver: requested lease not found")));
        assert!(!member_trouble(&status(
            tonic::Code::InvalidArgument,
            "etcdserver: too many operations in txn request"
        )));
        assert!(!member_trouble(&status(tonic::Code::PermissionDenied, "etcdserver: permission denied")));
        assert!(!member_trouble(&Error::InvalidArgs("x".into())));
    }
}
