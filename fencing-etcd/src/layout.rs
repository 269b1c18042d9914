//! Where marks and claims live in etcd, and how their values read.
//!
//! - A key's **mark**: `{prefix}m/{key}`, the token as 20 decimal digits, so
//!   that etcd's byte-wise value compares order tokens as numbers.
//! - A replica's **claim** on a key: `{prefix}c/{key}\0{replica}`, value
//!   `{token:020} {grant:020}`, on the replica's lease. One key per key and
//!   replica: a replica holds at most one claim per key. Keys never contain
//!   NUL (the store refuses them), so `{prefix}c/{key}\0` prefixes exactly
//!   that key's claims.

use fencing_layer::claims::ClaimEvent;

/// A fenced key's longest length, in bytes (as in fencing-postgres).
pub(crate) const MAX_KEY_BYTES: usize = 1024;

/// The keys of one store's marks and claims, under one prefix.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    prefix: String,
}

/// A claim's value, read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ClaimValue {
    pub(crate) token: u64,
    pub(crate) grant: u64,
}

impl Layout {
    pub(crate) fn new(prefix: impl Into<String>) -> Self {
        Self { prefix: prefix.into() }
    }

    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    pub(crate) fn mark(&self, key: &str) -> String {
        format!("{}m/{key}", self.prefix)
    }

    pub(crate) fn claim(&self, key: &str, replica: &str) -> String {
        format!("{}c/{key}\0{replica}", self.prefix)
    }

    /// The prefix of every replica's claim on `key`.
    pub(crate) fn claims_of(&self, key: &str) -> String {
        format!("{}c/{key}\0", self.prefix)
    }

    /// What a watched change means: a mark written is a raise, a claim deleted
    /// (released, or its lease gone) a release. Anything else is nothing.
    pub(crate) fn event(&self, put: bool, key: &[u8], value: Option<&[u8]>) -> Option<ClaimEvent> {
        let rest = std::str::from_utf8(key.strip_prefix(self.prefix.as_bytes())?).ok()?;
        if let Some(key) = rest.strip_prefix("m/")
            && put
        {
            let token = token(value?)?;
            return (key.len() <= MAX_KEY_BYTES).then(|| ClaimEvent::Raised { key: key.to_owned(), token });
        }
        let (key, _replica) = rest.strip_prefix("c/")?.split_once('\0')?;
        if put || key.len() > MAX_KEY_BYTES {
            return None;
        }
        // The deleted value, when etcd still had it: a release with an unknown token is still a release.
        let token = value.and_then(claim_value).map_or(0, |claim| claim.token);
        Some(ClaimEvent::Released { key: key.to_owned(), token })
    }
}

/// A token as a mark's value: 20 digits, ordered as numbers byte by byte.
pub(crate) fn padded(token: u64) -> String {
    format!("{token:020}")
}

pub(crate) fn claim_value(value: &[u8]) -> Option<ClaimValue> {
    let (token, grant) = std::str::from_utf8(value).ok()?.split_once(' ')?;
    Some(ClaimValue { token: token.parse().ok()?, grant: grant.parse().ok()? })
}

pub(crate) fn encode_claim(token: u64, grant: u64) -> String {
    format!("{token:020} {grant:020}")
}

pub(crate) fn token(value: &[u8]) -> Option<u64> {
    std::str::from_utf8(value).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn padded_tokens_order_as_numbers() {
        let tokens = [0, 1, 9, 10, 99, 1_000, u64::MAX / 2, u64::MAX - 1, u64::MAX];
        for pair in tokens.windows(2) {
            assert!(padded(pair[0]) < padded(pair[1]), "{pair:?}");
        }
        assert_eq!(padded(u64::MAX).len(), 20);
        assert_eq!(token(padded(u64::MAX).as_bytes()), Some(u64::MAX));
    }

    #[test]
    fn claim_values_round_trip_and_start_with_the_token() {
        let value = encode_claim(7, 42);
        assert!(value.starts_with(&padded(7)));
        assert_eq!(claim_value(value.as_bytes()), Some(ClaimValue { token: 7, grant: 42 }));
        assert_eq!(claim_value(b"7"), None);
        assert_eq!(claim_value(b"x 1"), None);
    }

    #[test]
    fn watched_changes_become_hints() {
        let layout = Layout::new("f/");
        let raised = layout.event(true, layout.mark("/a b").as_bytes(), Some(padded(9).as_bytes()));
        assert_eq!(raised, Some(ClaimEvent::Raised { key: "/a b".into(), token: 9 }));
        let claim = layout.claim("/k", "r1");
        let released = layout.event(false, claim.as_bytes(), Some(encode_claim(3, 1).as_bytes()));
        assert_eq!(released, Some(ClaimEvent::Released { key: "/k".into(), token: 3 }));
        assert_eq!(
            layout.event(false, claim.as_bytes(), None),
            Some(ClaimEvent::Released { key: "/k".into(), token: 0 })
        );
        assert_eq!(layout.event(true, claim.as_bytes(), None), None, "a grant is no event");
        assert_eq!(layout.event(false, layout.mark("/k").as_bytes(), None), None);
        assert_eq!(layout.event(true, b"other/m/k", Some(b"1")), None);
        let long = layout.mark(&"k".repeat(MAX_KEY_BYTES + 1));
        assert_eq!(layout.event(true, long.as_bytes(), Some(b"1")), None, "nobody's key: dropped");
    }

    #[test]
    fn a_keys_claims_share_a_prefix_no_other_key_has() {
        let layout = Layout::new("f/");
        assert!(layout.claim("a", "r").starts_with(&layout.claims_of("a")));
        assert!(!layout.claim("ab", "r").starts_with(&layout.claims_of("a")));
        assert!(!layout.claim("a/b", "r").starts_with(&layout.claims_of("a")));
    }
}
