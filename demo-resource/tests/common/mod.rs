//! Throwaway databases on the local PostgreSQL (127.0.0.1:5432, user postgres,
//! trust auth): one per test, dropped when the test ends, panics included; and
//! the stalling proxy. Both are test-support's, shared with the other crates.

#![allow(dead_code, unreachable_pub, unused_imports)]

pub use test_support::{BOUND, TestDb};

/// The proxy that can stall and sever (test-support's).
pub mod stall {
    pub use test_support::StallProxy;
}
