//! What every request carries besides its path and token: method, headers, body.
//!
//! ```
//! use fencing_benches::load::request::parse_header;
//!
//! let (name, value) = parse_header("Content-Type: application/json").unwrap();
//! assert_eq!(name, "content-type");
//! assert_eq!(value, "application/json");
//! assert!(parse_header("no colon").is_err());
//! ```

use std::path::Path;

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method};

/// The method, extra headers and body shared by every request of a run.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    /// `-X/--method`.
    pub method: Method,
    /// Every `-H 'Name: value'`, in order.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// `--body`, `--body-file`, or `--body-bytes` bytes of `x`.
    pub body: Bytes,
}

/// Parses one `-H` argument, `Name: value` (curl's form; spaces after the colon are dropped).
///
/// # Errors
///
/// No colon, or a name or value that HTTP does not allow.
pub fn parse_header(header: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) =
        header.split_once(':').ok_or_else(|| format!("header {header:?}: expected 'Name: value'"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("header {header:?}: {:?} is not a valid header name", name.trim()))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("header {header:?}: the value is not a valid header value"))?;
    Ok((name, value))
}

/// Parses a method name (`PUT`, `post`, …); lowercase standard methods are accepted.
///
/// # Errors
///
/// Not a valid method token.
pub fn parse_method(method: &str) -> Result<Method, String> {
    let upper = method.to_ascii_uppercase();
    let standard = ["GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"];
    let name = if standard.contains(&upper.as_str()) { upper.as_str() } else { method };
    Method::from_bytes(name.as_bytes()).map_err(|_| format!("method {method:?}: not a valid HTTP method"))
}

/// The request body: `text`, else the contents of `file`, else `default_bytes` bytes of `x`.
///
/// # Errors
///
/// The file cannot be read.
pub fn body(text: Option<&str>, file: Option<&Path>, default_bytes: u32) -> Result<Bytes, String> {
    match (text, file) {
        (Some(text), _) => Ok(Bytes::copy_from_slice(text.as_bytes())),
        (None, Some(path)) => {
            std::fs::read(path).map(Bytes::from).map_err(|e| format!("--body-file {}: {e}", path.display()))
        }
        (None, None) => Ok(Bytes::from(vec![b'x'; default_bytes as usize])),
    }
}
