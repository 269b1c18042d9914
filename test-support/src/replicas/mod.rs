//! Replicas of one fenced resource for the shared-store tests (feature
//! `replicas`): each [`Replica`] is a real axum server on 127.0.0.1 with its
//! own layer and store, any [`SharedStore`](fencing_layer::store::SharedStore);
//! one [`Probe`] records what every replica's handler saw, in one order, and
//! checks the layer's two invariants on it.
//!
//! The handler is `POST /r/{key}` (`key` a number): the layer's key is the path, [`key`].

mod probe;
mod replica;
mod rng;

pub use probe::{Event, Probe};
pub use replica::{Replica, Workers};
pub use rng::Rng;

/// The layer's key (the request path) for key number `n`.
pub fn key(n: u64) -> String {
    format!("/r/{n}")
}
