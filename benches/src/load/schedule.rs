//! Which key each request writes to and which token it carries.
//!
//! Request `s` of connection `c` writes to key `(c + s × connections) % keys`:
//! with as many keys as connections (the default) each connection keeps its
//! own key, with fewer they share, with more they take turns. Every key has a holder whose
//! token starts at the key's first token ([`FIRST_TOKEN`] unless set: `--first-token`, or
//! above the key's mark with `--start-above-mark`); with `new_holder_every = Some(n)` the key
//! gets a new holder (the token rises by one) every `n` valid requests to it,
//! counted over all connections writing to it, so raises, and the drains that
//! go with them, happen under load. When several connections share a key, a
//! request that took the older token can arrive after the raise and is
//! answered 409, as a paused old holder would be. `stale_pct` percent of
//! requests carry [`STALE_TOKEN`] and `malformed_pct` percent [`MALFORMED_TOKEN`].
//!
//! ```
//! use fencing_benches::load::schedule::{Schedule, Token};
//!
//! let schedule = Schedule::new(1, 1, Some(2), 0, 0);
//! let mut rng = schedule.rng(0);
//! let tokens: Vec<Token> = (0..5).map(|seq| schedule.next(0, seq, &mut rng)).collect();
//! assert_eq!(tokens, [Token::Valid(1000), Token::Valid(1000), Token::Valid(1001), Token::Valid(1001), Token::Valid(1002)]);
//!
//! // Per key first tokens (`--start-above-mark`): key 1 had a mark of 41.
//! let schedule = Schedule::new(2, 2, None, 0, 0).with_first_tokens(vec![1000, 42]);
//! assert_eq!(schedule.next(1, 0, &mut schedule.rng(1)), Token::Valid(42));
//! ```

use std::sync::atomic::{AtomicU64, Ordering};

/// Every holder's first token unless set (`--first-token`).
pub const FIRST_TOKEN: u64 = 1000;
/// A token below every holder's (first tokens are at least 1): refused with 409 by a
/// fenced target once the key has a mark.
pub const STALE_TOKEN: &str = "0";
/// Not a token at all (a leading zero and a letter): refused with 400 by a fenced target.
pub const MALFORMED_TOKEN: &str = "01x";

/// The token one request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Token {
    /// The key's current holder's token.
    Valid(u64),
    /// [`STALE_TOKEN`].
    Stale,
    /// [`MALFORMED_TOKEN`].
    Malformed,
}

/// The schedule shared by every connection of a round.
#[derive(Debug)]
pub struct Schedule {
    keys: u32,
    connections: u32,
    new_holder_every: Option<u64>,
    stale_pct: u8,
    malformed_pct: u8,
    /// Every key's first token, or each key's own (`--start-above-mark`).
    first: FirstTokens,
    /// Valid requests sent to each key so far (only counted with `new_holder_every`).
    sent: Vec<AtomicU64>,
}

#[derive(Debug)]
enum FirstTokens {
    All(u64),
    PerKey(Vec<u64>),
}

impl Schedule {
    /// A schedule over `keys` keys for `connections` connections (each at least 1).
    #[must_use]
    pub fn new(
        keys: u32,
        connections: u32,
        new_holder_every: Option<u64>,
        stale_pct: u8,
        malformed_pct: u8,
    ) -> Self {
        let keys = keys.max(1);
        let connections = connections.max(1);
        let counters = if new_holder_every.is_some() { keys as usize } else { 0 };
        Self {
            keys,
            connections,
            new_holder_every: new_holder_every.filter(|&n| n > 0),
            stale_pct,
            malformed_pct,
            first: FirstTokens::All(FIRST_TOKEN),
            sent: (0..counters).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The same schedule with every key's first token `first` (at least 1, so that
    /// [`STALE_TOKEN`] stays below it).
    #[must_use]
    pub fn with_first_token(mut self, first: u64) -> Self {
        self.first = FirstTokens::All(first.max(1));
        self
    }

    /// The same schedule with key `k`'s first token `firsts[k]` (each at least 1; keys past
    /// the end of `firsts` start at [`FIRST_TOKEN`]).
    #[must_use]
    pub fn with_first_tokens(mut self, firsts: Vec<u64>) -> Self {
        self.first = FirstTokens::PerKey(firsts.into_iter().map(|t| t.max(1)).collect());
        self
    }

    /// Key `key`'s first token.
    #[must_use]
    pub fn first_token(&self, key: u32) -> u64 {
        match &self.first {
            FirstTokens::All(first) => *first,
            FirstTokens::PerKey(firsts) => firsts.get(key as usize).copied().unwrap_or(FIRST_TOKEN),
        }
    }

    /// The share of answers a fenced target should give 409, when the schedule can say:
    /// `stale_pct` percent. `None` when new holders take over keys that several
    /// connections share, which makes some in-flight requests stale by a race.
    #[must_use]
    pub fn expected_409_share(&self) -> Option<f64> {
        let races = self.new_holder_every.is_some() && self.keys != self.connections;
        (!races).then(|| f64::from(self.stale_pct) / 100.0)
    }

    /// The key of connection `conn`'s request number `seq`.
    #[must_use]
    pub fn key(&self, conn: u32, seq: u64) -> u32 {
        let turn = u64::from(conn) + seq.wrapping_mul(u64::from(self.connections));
        (turn % u64::from(self.keys)) as u32
    }

    /// Connection `conn`'s own deterministic generator for the stale and malformed mix.
    #[must_use]
    pub fn rng(&self, conn: u32) -> XorShift {
        XorShift(0x9E37_79B9_7F4A_7C15 ^ (u64::from(conn) + 1).wrapping_mul(0xD134_2543_DE82_EF95))
    }

    /// The token of connection `conn`'s request number `seq`.
    pub fn next(&self, conn: u32, seq: u64, rng: &mut XorShift) -> Token {
        if self.stale_pct > 0 || self.malformed_pct > 0 {
            let roll = rng.next_percent();
            if roll < self.stale_pct {
                return Token::Stale;
            }
            if roll < self.stale_pct.saturating_add(self.malformed_pct) {
                return Token::Malformed;
            }
        }
        let key = self.key(conn, seq);
        match self.new_holder_every {
            None => Token::Valid(self.first_token(key)),
            Some(every) => {
                let sent = self.sent[key as usize].fetch_add(1, Ordering::Relaxed);
                Token::Valid(self.first_token(key).saturating_add(sent / every))
            }
        }
    }
}

/// A tiny deterministic generator for the token mix (no need for a crate).
#[derive(Debug)]
pub struct XorShift(u64);

impl XorShift {
    /// A number in `0..100`.
    pub fn next_percent(&mut self) -> u8 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % 100) as u8
    }
}
