//! The fencing token and its strict header parser.

use std::fmt;
use std::str::FromStr;

use http::header::{GetAll, HeaderMap, HeaderName, HeaderValue};

/// Up to this many header values, [`FencingToken::from_headers`] compares names
/// instead of hashing.
const SCAN_AT_MOST: usize = 16;

/// A fencing token: the strictly increasing number a lock service hands out with
/// every grant.
///
/// While the inner service works on an admitted request, the token the layer
/// admitted it with is [`FencingToken::current`] (and, with the `axum` feature,
/// `FencingToken` is an extractor that reads it), so a handler can pass it on
/// to a store that checks it again (a database version column, say).
///
/// On the wire a token is a canonical decimal `u64`: ASCII digits only, no sign,
/// no spaces, no leading zeros (`0` itself is fine), at most `u64::MAX`.
///
/// ```
/// use fencing_layer::FencingToken;
///
/// let token: FencingToken = "42".parse().unwrap();
/// assert_eq!(token.get(), 42);
/// assert!("042".parse::<FencingToken>().is_err());
/// assert_eq!(token.to_string(), "42");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    /// Wraps a token value.
    #[must_use]
    pub const fn new(value: u64) -> Self {
        Self(value)
    }

    /// The token's value.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// Parses a canonical decimal token from raw header bytes.
    ///
    /// # Errors
    ///
    /// Returns the first way in which `bytes` is not a canonical decimal `u64`.
    #[inline]
    pub fn parse_bytes(bytes: &[u8]) -> Result<Self, TokenError> {
        let (first, rest) = bytes.split_first().ok_or(TokenError::Empty)?;
        if !first.is_ascii_digit() || !rest.iter().all(u8::is_ascii_digit) {
            return Err(TokenError::NotDecimal);
        }
        if *first == b'0' && !rest.is_empty() {
            return Err(TokenError::LeadingZero);
        }
        bytes
            .iter()
            .try_fold(0u64, |acc, digit| acc.checked_mul(10)?.checked_add(u64::from(digit - b'0')))
            .map(Self)
            .ok_or(TokenError::Overflow)
    }

    /// Reads the token from every value of a header: none is `Ok(None)`, one is
    /// parsed, more than one is [`TokenError::Repeated`].
    ///
    /// # Errors
    ///
    /// A repeated header, or a value that is not a canonical decimal `u64`.
    pub fn from_header_values(values: GetAll<'_, HeaderValue>) -> Result<Option<Self>, TokenError> {
        let mut values = values.iter();
        let Some(value) = values.next() else {
            return Ok(None);
        };
        if values.next().is_some() {
            return Err(TokenError::Repeated);
        }
        Self::parse_bytes(value.as_bytes()).map(Some)
    }

    /// Reads the token from the values of `name` in `headers`, as
    /// [`from_header_values`](Self::from_header_values) does. A write request
    /// carries a handful of headers, and comparing their names is cheaper than
    /// hashing a custom name for the map's lookup; big maps are looked up.
    #[inline(always)]
    pub(crate) fn from_headers(headers: &HeaderMap, name: &HeaderName) -> Result<Option<Self>, TokenError> {
        if headers.len() > SCAN_AT_MOST {
            return Self::from_header_values(headers.get_all(name));
        }
        let name = name.as_str().as_bytes();
        let mut found = None;
        for (header, value) in headers {
            if same_name(header.as_str().as_bytes(), name) && found.replace(value).is_some() {
                return Err(TokenError::Repeated);
            }
        }
        found.map(|value| Self::parse_bytes(value.as_bytes())).transpose()
    }

    /// The token as a header value, for clients that send it.
    ///
    /// ```
    /// use fencing_layer::FencingToken;
    ///
    /// let request = http::Request::post("/logs/billing")
    ///     .header("fencing-token", FencingToken::new(7).to_header_value())
    ///     .body(())
    ///     .unwrap();
    /// assert_eq!(request.headers()["fencing-token"], "7");
    /// ```
    #[must_use]
    pub fn to_header_value(self) -> HeaderValue {
        HeaderValue::from(self.0)
    }
}

/// Whether two lower-case header names are equal: for names of 8 to 16 bytes
/// (`fencing-token` is 13) two overlapping word compares, inline, where the
/// slice comparison would call `memcmp`; byte by byte otherwise.
#[inline(always)]
fn same_name(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    match (a.first_chunk::<8>(), a.last_chunk::<8>(), b.first_chunk::<8>(), b.last_chunk::<8>()) {
        (Some(a0), Some(a1), Some(b0), Some(b1)) if a.len() <= 16 => a0 == b0 && a1 == b1,
        _ => a == b,
    }
}

impl From<u64> for FencingToken {
    fn from(value: u64) -> Self {
        Self(value)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl FromStr for FencingToken {
    type Err = TokenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_bytes(s.as_bytes())
    }
}

/// Why a fencing-token header was refused (400 Bad Request).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TokenError {
    /// The header was present with an empty value.
    Empty,
    /// The header appeared more than once.
    Repeated,
    /// A byte other than an ASCII digit: a sign, a space, hex, an exponent, non-ASCII.
    NotDecimal,
    /// Leading zeros make one token spellable many ways; only the canonical form is accepted.
    LeadingZero,
    /// The value is larger than `u64::MAX`.
    Overflow,
}

impl fmt::Display for TokenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Empty => "the fencing token header is empty",
            Self::Repeated => "the fencing token header appears more than once",
            Self::NotDecimal => "the fencing token must be ASCII decimal digits only",
            Self::LeadingZero => "the fencing token must not have leading zeros",
            Self::Overflow => "the fencing token is larger than 18446744073709551615",
        })
    }
}

impl std::error::Error for TokenError {}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        // The word compares agree with the slice comparison, for every length
        // around the 8-to-16 window and a difference anywhere.
        #[test]
        fn same_name_is_byte_equality(a in proptest::collection::vec(b'a'..=b'c', 0..20),
                                      flip in any::<prop::sample::Index>()) {
            prop_assert!(same_name(&a, &a));
            let mut b = a.clone();
            if !b.is_empty() {
                let i = flip.index(b.len());
                b[i] = b'z';
                prop_assert!(!same_name(&a, &b));
            }
            let longer = [a.as_slice(), b"x"].concat();
            prop_assert!(!same_name(&a, &longer));
        }
    }

    #[test]
    fn accepts_canonical_decimals() {
        for (text, value) in [("0", 0), ("1", 1), ("10", 10), ("18446744073709551615", u64::MAX)] {
            assert_eq!(text.parse::<FencingToken>(), Ok(FencingToken(value)), "{text}");
        }
    }

    #[test]
    fn rejects_every_non_canonical_spelling() {
        let cases: [(&[u8], TokenError); 16] = [
            (b"", TokenError::Empty),
            (b"+5", TokenError::NotDecimal),
            (b"-1", TokenError::NotDecimal),
            (b" 5", TokenError::NotDecimal),
            (b"5 ", TokenError::NotDecimal),
            (b"5 5", TokenError::NotDecimal),
            (b"1e3", TokenError::NotDecimal),
            (b"0x10", TokenError::NotDecimal),
            (b"1.0", TokenError::NotDecimal),
            (b"\xd9\xa5", TokenError::NotDecimal),
            (b"\xef\xbc\x95", TokenError::NotDecimal),
            (b"05", TokenError::LeadingZero),
            (b"00", TokenError::LeadingZero),
            (b"18446744073709551616", TokenError::Overflow),
            (b"99999999999999999999", TokenError::Overflow),
            (b"100000000000000000000000000000", TokenError::Overflow),
        ];
        for (bytes, error) in cases {
            assert_eq!(FencingToken::parse_bytes(bytes), Err(error), "{bytes:?}");
        }
    }

    #[test]
    fn counts_header_repetitions() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(FencingToken::from_header_values(headers.get_all("t")), Ok(None));
        headers.append("t", HeaderValue::from_static("3"));
        assert_eq!(FencingToken::from_header_values(headers.get_all("t")), Ok(Some(FencingToken(3))));
        headers.append("t", HeaderValue::from_static("3"));
        assert_eq!(FencingToken::from_header_values(headers.get_all("t")), Err(TokenError::Repeated));
    }

    proptest! {
        #[test]
        fn scanning_the_headers_agrees_with_the_map_lookup(
            headers in proptest::collection::vec((0..6usize, proptest::sample::select(vec!["7", "07", "", "x", "9"])), 0..40)
        ) {
            // Few or many headers (either side of SCAN_AT_MOST), the token header
            // among standard and custom names, absent, once or repeated.
            let names = ["fencing-token", "content-type", "x-tenant", "host", "fencing-tokens", "accept"];
            let mut map = HeaderMap::new();
            for (name, value) in headers {
                map.append(names[name], HeaderValue::from_static(value));
            }
            let name = HeaderName::from_static("fencing-token");
            prop_assert_eq!(
                FencingToken::from_headers(&map, &name),
                FencingToken::from_header_values(map.get_all(&name))
            );
        }
    }

    proptest! {
        #[test]
        fn round_trips_every_u64(value: u64) {
            let text = value.to_string();
            prop_assert_eq!(text.parse::<FencingToken>(), Ok(FencingToken(value)));
            let header = FencingToken(value).to_header_value();
            prop_assert_eq!(header.as_bytes(), text.as_bytes());
        }

        #[test]
        fn accepts_exactly_what_display_would_print(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            // The canonical spelling is unique: whatever parses must print back as the same bytes.
            if let Ok(token) = FencingToken::parse_bytes(&bytes) {
                let printed = token.to_string();
                prop_assert_eq!(printed.as_bytes(), &bytes[..]);
            }
        }
    }
}
