//! fencing-gate's integration tests.
