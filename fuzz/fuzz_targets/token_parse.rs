//! `FencingToken::parse_bytes` and `from_header_values` on arbitrary bytes:
//! never panics, and accepts exactly the canonical decimal `u64`s.
#![no_main]

use fencing_layer::{FencingToken, TokenError};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
// The contract's definition of a valid token, written independently of the parser (demo-resource's
// proptests hold it to the same one).
use test_support::canonical_token;

fuzz_target!(|data: &[u8]| {
    let parsed = FencingToken::parse_bytes(data);
    assert_eq!(parsed.as_ref().ok().map(|t| t.get()), canonical_token(data), "{data:?}");
    if data.is_empty() {
        assert_eq!(parsed, Err(TokenError::Empty));
    }
    // The same bytes split at 0x00 into header values (up to 3).
    let name = HeaderName::from_static("fencing-token");
    let mut headers = HeaderMap::new();
    let values: Vec<HeaderValue> =
        data.split(|b| *b == 0).take(3).filter_map(|v| HeaderValue::from_bytes(v).ok()).collect();
    for v in &values {
        headers.append(&name, v.clone());
    }
    let read = FencingToken::from_header_values(headers.get_all(&name));
    match values.as_slice() {
        [] => assert_eq!(read, Ok(None)),
        [one] => assert_eq!(read.ok().map(|t| t.map(FencingToken::get)), canonical_token(one.as_bytes()).map(Some)),
        _ => assert_eq!(read, Err(TokenError::Repeated)),
    }
});
