//! The primitives the admission rule is built on: std's and tokio's, or under
//! `cfg(loom)` loom's models of them, so that the loom model in
//! `store/loom_model.rs` checks the very code that runs.

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};
#[cfg(not(loom))]
pub(crate) use tokio::sync::Notify;
#[cfg(not(loom))]
pub(crate) use tokio::sync::futures::OwnedNotified;

#[cfg(loom)]
mod notify;
#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(loom)]
pub(crate) use notify::{Notify, OwnedNotified};
