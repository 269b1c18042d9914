//! What the gate changes in a request on its way to the upstream and in a
//! response on its way back, and what it refuses before anything is fenced.
//!
//! As RFC 9110 §7.6 asks of a proxy, and as nginx and Pingora do:
//! - hop-by-hop fields (`Connection`, `Keep-Alive`, `Proxy-Connection`, `TE`,
//!   `Transfer-Encoding`, `Upgrade`) and every field `Connection` names are
//!   removed both ways; the body's framing is the gate's own on each side;
//! - `X-Forwarded-For`, `X-Forwarded-Proto` and `Forwarded` are kept only from
//!   trusted hops, and the peer is appended;
//! - trailers pass both ways: those the sender declared in `Trailer` (hyper sends
//!   no others), with `TE: trailers` upstream when the client sent it;
//! - `Expect` is answered by the gate (hyper sends `100 Continue` when the
//!   body is first read, which is after the upstream has been reached);
//! - everything else passes untouched: `Fencing-Token`, `Fencing-Proof`,
//!   conditional headers, `Host`.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Request, Uri, Version};
use percent_encoding::percent_decode_str;

use crate::config::{Cidr, Limits};
use crate::problem::GateProblem;

const KEEP_ALIVE: HeaderName = HeaderName::from_static("keep-alive");
const PROXY_CONNECTION: HeaderName = HeaderName::from_static("proxy-connection");
const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");

/// The hop-by-hop fields (RFC 9110 §7.6.1), whatever `Connection` names.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    KEEP_ALIVE,
    PROXY_CONNECTION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is one of [`HOP_BY_HOP`], without building the array: the
/// standard names compare as numbers, the two others as text.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::TE
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || matches!(name.as_str(), "keep-alive" | "proxy-connection")
}

/// Whether `headers` holds a hop-by-hop field. One pass over the names costs
/// less than the six removals it spares most messages (each hashes its name).
fn has_hop_by_hop(headers: &HeaderMap) -> bool {
    headers.keys().any(is_hop_by_hop)
}

/// Removes the hop-by-hop fields and those `Connection` names.
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    if has_hop_by_hop(headers) {
        remove_hop_by_hop(headers);
    }
}

fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if let Some(named) = connection_names(headers) {
        for name in named {
            headers.remove(name);
        }
    }
    for name in HOP_BY_HOP {
        headers.remove(name);
    }
}

/// The field names listed in `Connection`, if it has any.
fn connection_names(headers: &HeaderMap) -> Option<Vec<HeaderName>> {
    let mut values = headers.get_all(header::CONNECTION).iter().peekable();
    values.peek()?;
    let names = values
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    Some(names)
}

/// Whether `TE` lists `trailers`.
fn accepts_trailers(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::TE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|coding| coding.trim().eq_ignore_ascii_case("trailers"))
}

/// What the gate refuses before the layer sees a request.
pub(crate) fn refusal<B>(request: &Request<B>, limits: &Limits) -> Option<(GateProblem, String)> {
    if request.method() == http::Method::CONNECT {
        let detail = "CONNECT opens a tunnel to anywhere: this gate only forwards to its upstream";
        return Some((GateProblem::ConnectRefused, detail.into()));
    }
    let headers = request.headers();
    if headers.len() > limits.max_header_count {
        let detail =
            format!("{} header fields; at most {} are taken", headers.len(), limits.max_header_count);
        return Some((GateProblem::HeadersTooLarge, detail));
    }
    let bytes: usize = headers.iter().map(|(name, value)| name.as_str().len() + value.len()).sum();
    if bytes > limits.max_header_bytes {
        let detail = format!("{bytes} bytes of header fields; at most {} are taken", limits.max_header_bytes);
        return Some((GateProblem::HeadersTooLarge, detail));
    }
    // hyper has refused any coding that does not end in `chunked`; a coding
    // before it would be forwarded as plain bytes, its name lost.
    for coding in headers.get_all(header::TRANSFER_ENCODING) {
        if !coding.as_bytes().eq_ignore_ascii_case(b"chunked") {
            let detail = format!("Transfer-Encoding {coding:?}: only chunked is forwarded");
            return Some((GateProblem::UnsupportedTransferCoding, detail));
        }
    }
    if let Err(why) = canonical_path(request.uri().path()) {
        return Some((GateProblem::AmbiguousPath, why.into()));
    }
    None
}

/// Whether `path` means one thing to the gate and to any upstream: no `.` or
/// `..` segments, no empty ones (`//`), no escaped `/` or `\`, escapes that
/// decode to UTF-8. A stale holder could otherwise spell its path so that the
/// gate keys it apart from the resource the upstream writes.
pub(crate) fn canonical_path(path: &str) -> Result<(), &'static str> {
    let decoded = decode_path(path).ok_or("the path does not percent-decode to UTF-8")?;
    if decoded.len() != path.len() {
        let lower = path.to_ascii_lowercase();
        if lower.contains("%2f") || lower.contains("%5c") {
            return Err("the path has an escaped `/` or `\\`");
        }
    }
    let mut segments = decoded.split('/').skip(1).peekable();
    while let Some(segment) = segments.next() {
        let last = segments.peek().is_none();
        if segment == "." || segment == ".." {
            return Err("the path has a `.` or `..` segment");
        }
        if segment.is_empty() && !last {
            return Err("the path has an empty segment (`//`)");
        }
        if segment.contains('\\') {
            return Err("the path has a `\\`");
        }
    }
    Ok(())
}

/// `path`, percent-decoded; `None` unless it decodes to UTF-8.
pub(crate) fn decode_path(path: &str) -> Option<Cow<'_, str>> {
    if !path.contains('%') {
        return Some(Cow::Borrowed(path));
    }
    percent_decode_str(path).decode_utf8().ok()
}

/// Whose forwarding headers are believed.
#[derive(Debug, Clone)]
pub(crate) struct Forwarder {
    trusted: Vec<Cidr>,
}

impl Forwarder {
    pub(crate) fn new(trusted: Vec<Cidr>) -> Self {
        Self { trusted }
    }

    /// Turns a client's request into the upstream's.
    pub(crate) fn rewrite<B>(&self, request: &mut Request<B>, peer: &Peer) {
        let headers = request.headers_mut();
        // What is there, in one pass over the names: most requests have none of these.
        let (mut hop_by_hop, mut expect) = (false, false);
        for name in headers.keys() {
            hop_by_hop |= is_hop_by_hop(name);
            expect |= name == header::EXPECT;
        }
        if hop_by_hop {
            let trailers = accepts_trailers(headers);
            remove_hop_by_hop(headers);
            if trailers {
                // The gate passes trailers on, so it may say it takes them, as its client did.
                headers.insert(header::TE, HeaderValue::from_static("trailers"));
            }
        }
        if expect {
            headers.remove(header::EXPECT);
        }
        Self::forwarded(headers, peer);
        if let Some(authority) = request.uri().authority() {
            // An HTTP/2 request names its host in the URI: HTTP/1.1 wants it in `Host`.
            let host = HeaderValue::from_str(authority.as_str()).ok();
            if let (false, Some(host)) = (request.headers().contains_key(header::HOST), host) {
                request.headers_mut().insert(header::HOST, host);
            }
            // Origin form (`/path?query`), as HTTP/1.1 sends it to an origin server.
            let origin =
                request.uri().path_and_query().cloned().unwrap_or_else(|| PathAndQuery::from_static("/"));
            *request.uri_mut() = Uri::from(origin);
        }
        *request.version_mut() = Version::HTTP_11;
    }

    /// What a connection from `address` adds to each of its requests, made once.
    pub(crate) fn peer(&self, address: SocketAddr) -> Peer {
        let ip = address.ip().to_canonical();
        let node = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("\"[{v6}]\""),
        };
        let value = |text: String| HeaderValue::from_str(&text).expect("an address is a valid header value");
        Peer {
            trusted: self.trusted.iter().any(|block| block.contains(ip)),
            for_: value(ip.to_string()),
            forwarded: value(format!("for={node};proto=http")),
        }
    }

    fn forwarded(headers: &mut HeaderMap, peer: &Peer) {
        if !peer.trusted {
            // The common case: whatever the client said is replaced, no string built.
            headers.insert(X_FORWARDED_FOR, peer.for_.clone());
            headers.insert(header::FORWARDED, peer.forwarded.clone());
            headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
            return;
        }
        append(headers, X_FORWARDED_FOR, &peer.for_, ", ");
        append(headers, header::FORWARDED, &peer.forwarded, ", ");
        if !headers.contains_key(X_FORWARDED_PROTO) {
            headers.insert(X_FORWARDED_PROTO, HeaderValue::from_static("http"));
        }
    }
}

/// A client connection's peer, as its requests' forwarding headers name it.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    trusted: bool,
    for_: HeaderValue,
    forwarded: HeaderValue,
}

/// Appends `value` to the one field `name`, joining what was there with `separator`.
fn append(headers: &mut HeaderMap, name: HeaderName, value: &HeaderValue, separator: &str) {
    let Ok(value) = value.to_str() else { return };
    let mut joined = String::new();
    for old in headers.get_all(&name) {
        if let Ok(old) = old.to_str() {
            joined.push_str(old);
            joined.push_str(separator);
        }
    }
    joined.push_str(value);
    if let Ok(value) = HeaderValue::from_str(&joined) {
        headers.insert(name, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ambiguous_paths_are_refused() {
        for path in ["/a/./b", "/a/../b", "/a//b", "/a/%2e%2E/b", "/a%2Fb", "/a%5cb", "/a\\b", "/%ff"] {
            assert!(canonical_path(path).is_err(), "{path}");
        }
        for path in ["/", "/a", "/a/", "/a/b.txt", "/a/..b", "/%61"] {
            assert!(canonical_path(path).is_ok(), "{path}");
        }
    }

    #[test]
    fn hop_by_hop_fields_and_those_connection_names_go() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("close, x-secret"));
        headers.insert("x-secret", HeaderValue::from_static("1"));
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        headers.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        headers.insert("fencing-token", HeaderValue::from_static("7"));
        headers.insert(header::IF_MATCH, HeaderValue::from_static("\"v1\""));
        strip_hop_by_hop(&mut headers);
        let left: Vec<_> = headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["fencing-token", "if-match"]);
    }

    #[test]
    fn forwarding_headers_are_kept_only_from_trusted_hops() {
        let forwarder = Forwarder::new(vec!["10.0.0.0/8".parse().unwrap()]);
        let request = || {
            Request::post("/x")
                .header("x-forwarded-for", "6.6.6.6")
                .header("forwarded", "for=6.6.6.6")
                .body(())
                .unwrap()
        };
        let mut from_anyone = request();
        forwarder.rewrite(&mut from_anyone, &forwarder.peer("192.0.2.1:5000".parse().unwrap()));
        assert_eq!(from_anyone.headers()["x-forwarded-for"], "192.0.2.1");
        assert_eq!(from_anyone.headers()["forwarded"], "for=192.0.2.1;proto=http");
        let mut from_balancer = request();
        forwarder.rewrite(&mut from_balancer, &forwarder.peer("10.1.2.3:5000".parse().unwrap()));
        assert_eq!(from_balancer.headers()["x-forwarded-for"], "6.6.6.6, 10.1.2.3");
        assert_eq!(from_balancer.headers()["forwarded"], "for=6.6.6.6, for=10.1.2.3;proto=http");
        assert_eq!(from_balancer.uri(), "/x");
        let mut v6 = request();
        forwarder.rewrite(&mut v6, &forwarder.peer("[2001:db8::1]:5000".parse().unwrap()));
        assert_eq!(v6.headers()["forwarded"], "for=\"[2001:db8::1]\";proto=http");
    }
}
