//! What a write may carry: the bounds the routes check, re-exported at the crate root.

/// Largest accepted body of a write, in bytes (64 KiB); a larger one gets 413.
pub const MAX_BODY_BYTES: usize = 64 * 1024;
/// Largest accepted `delay_ms` (10 s); a larger one gets 400.
pub const MAX_DELAY_MS: u64 = 10_000;
/// Longest log name or key, in bytes; a longer one gets 400.
pub const MAX_NAME_BYTES: usize = 256;
