//! [`Room`]: a place for one more key under `max_keys`, taken before a claim
//! goes to the backend and given back when its grant is installed (the key
//! then counts in the claim table), refused, or released.
//!
//! Checking the limit before the round trip and counting the key only after
//! it let 24 requests for new keys race past a limit of 2: each saw room, and
//! each was granted. Counting the key on its way closes that: the table's
//! keys plus the keys on their way never exceed the limit (both change under
//! the store's `install` lock). An abandoned grant keeps its room until its
//! row is released, so the backend never holds more of this replica's keys.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Inner;

/// Room for one key's claim on its way to the backend; given back when dropped.
pub(super) struct Room {
    /// The store whose count this room is in; `None` for a claim on a key the
    /// replica holds already (it replaces that key's claim: no new key).
    counted: Option<Arc<Inner>>,
}

impl Room {
    /// A room counted in `inner`'s keys on their way (the caller counted it).
    pub(super) fn taken(inner: &Arc<Inner>) -> Self {
        Self { counted: Some(Arc::clone(inner)) }
    }

    /// A claim on a key already held: it takes no new room.
    pub(super) fn within_key() -> Self {
        Self { counted: None }
    }

    /// Whether this room counts a key of its own.
    pub(super) fn counts_a_key(&self) -> bool {
        self.counted.is_some()
    }
}

impl Drop for Room {
    fn drop(&mut self) {
        if let Some(inner) = self.counted.take() {
            inner.reserved.fetch_sub(1, Ordering::SeqCst);
        }
    }
}
