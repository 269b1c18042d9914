//! A small deterministic generator for the randomised scenarios.

use std::time::{SystemTime, UNIX_EPOCH};

/// splitmix64, seeded from the clock or `FENCING_SEED`; the seed is printed so
/// that a failing run can be replayed.
pub struct Rng(u64);

impl Rng {
    /// Seeded from `FENCING_SEED` if set, else from the clock; prints the seed.
    pub fn from_clock() -> Self {
        let seed = SystemTime::now().duration_since(UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64);
        let seed = std::env::var("FENCING_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(seed);
        eprintln!("FENCING_SEED={seed}");
        Rng(seed)
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A generator of its own, for another task.
    pub fn fork(&mut self) -> Self {
        Rng(self.next_u64())
    }

    /// A number in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
