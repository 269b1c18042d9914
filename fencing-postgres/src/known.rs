//! `KnownMarks`: the token this process last fenced each key with, so that the
//! next fence with the same token can be one cheap statement.
//!
//! Only a hint, never a decision: the row is still locked and its mark read in
//! the transaction, and what the row says wins. What the hint buys is the
//! order of locks. A fence with a token it remembers sends the plain lock,
//! which finds the row in place; anything else (a raise, a key's first use, a
//! forgotten key) sends the statement that creates or raises the row first.
//! So a write sent behind the fence always runs after the key's row is locked
//! or created, never before it, as the write of a transaction that fenced
//! before writing does: two transactions on one key never take their locks
//! in opposite orders (which PostgreSQL would break as a deadlock).
//!
//! The one exception is a hint that is wrong because the row changed behind
//! the process's back (an operator deleted or lowered it, or a raise rolled
//! back): the plain lock then finds no row or a lower mark, and the fence
//! creates or raises it with a second statement, after a write sent with it.
//! That stays safe (mark and write commit together or not at all); at worst
//! PostgreSQL refuses one of two such transactions as a deadlock, a retry.

use std::collections::hash_map::RandomState;

use dashmap::DashMap;

/// At most this many keys are remembered; then the memory starts over (the
/// keys in use come back after one fence each).
const CAPACITY: usize = 65_536;

#[derive(Debug, Default)]
pub(crate) struct KnownMarks {
    tokens: DashMap<Box<str>, u64, RandomState>,
}

impl KnownMarks {
    /// Whether this process last fenced `key` with `token`.
    pub(crate) fn is(&self, key: &str, token: u64) -> bool {
        self.tokens.get(key).is_some_and(|known| *known == token)
    }

    /// Remembers a fence that found or left `key`'s mark at `token`.
    pub(crate) fn remember(&self, key: &str, token: u64) {
        if let Some(mut known) = self.tokens.get_mut(key) {
            *known = token;
            return;
        }
        if self.tokens.len() >= CAPACITY {
            self.tokens.clear();
        }
        self.tokens.insert(key.into(), token);
    }
}
