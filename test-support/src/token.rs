//! The contract's definition of a valid `Fencing-Token` value, written
//! independently of fencing-layer's parser: the oracle its proptests
//! (demo-resource's `hostile`) and its libFuzzer target (`fuzz/`) compare it with.

/// The token `bytes` stand for, if they are a canonical decimal `u64` (ASCII digits
/// only, no sign, space or leading zero, at most `u64::MAX`); `None` otherwise.
///
/// ```
/// assert_eq!(test_support::canonical_token(b"42"), Some(42));
/// assert_eq!(test_support::canonical_token(b"042"), None);
/// assert_eq!(test_support::canonical_token(b"18446744073709551616"), None);
/// ```
pub fn canonical_token(bytes: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(bytes).ok()?;
    let canonical = !text.is_empty()
        && text.bytes().all(|b| b.is_ascii_digit())
        && (text.len() == 1 || !text.starts_with('0'));
    canonical.then(|| text.parse::<u64>().ok()).flatten()
}
