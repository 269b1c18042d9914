//! fencing-claims-model: a stateright model of fencing-layer's replica-claims protocol, checked
//! exhaustively within bounds (`tests/claims_model.rs`, `claims-mutants.sh`).
//! It is not the protocol's code, nor a library: it holds no code of its own, only the model's tests.
//!
//! A model of [`fencing_layer::claims`]' protocol (replica claims on marks
//! shared by replicas), checked exhaustively within bounds by stateright: see
//! `tests/claims_model.rs` for the model, its invariant and its mutants, and
//! `claims-mutants.sh` for the runs that must catch each mutant.
//!
//! The crate holds no code: it is apart from fencing-layer only so that the
//! release build the check needs does not compile fencing-layer's test stack.
//!
//! [`fencing_layer::claims`]: https://docs.rs/fencing-layer/latest/fencing_layer/claims/

#![deny(missing_docs, unsafe_code, unreachable_pub)]
