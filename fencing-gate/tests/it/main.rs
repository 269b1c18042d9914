//! fencing-gate's integration tests, one binary: the gate's binary in front of
//! a resource not written in Rust (Python's standard-library server,
//! `tests/upstream.py`, appending each write and its token to a journal), each
//! on an ephemeral loopback port.

mod common;

mod contract;
mod exchange;
mod framing;
mod marks;
