//! A service under test: its loopback address(es) and its path template.
//!
//! `--url http://127.0.0.1:8080/api/docs/{key}` names the address and the
//! path; several replicas are separated by commas (connection `i` goes to
//! replica `i % n`) and must share the path. A URL without a path uses the
//! default template (`/logs/{key}`, the demo's route).
//!
//! ```
//! use fencing_benches::load::target::Target;
//!
//! let t = Target::parse("target", "http://127.0.0.1:8080/api/docs/{key}", None, "/logs/{key}").unwrap();
//! assert_eq!(t.template.as_str(), "/api/docs/{key}");
//! let t = Target::parse("target", "http://127.0.0.1:8080", None, "/logs/{key}").unwrap();
//! assert_eq!(t.template.as_str(), "/logs/{key}");
//! assert!(Target::parse("target", "http://192.0.2.1:80", None, "/").is_err());
//! ```

use std::net::{SocketAddr, ToSocketAddrs};

use http::HeaderValue;

use super::template::PathTemplate;

/// One service under test: one server, or several replicas of it.
#[derive(Debug, Clone)]
pub struct Target {
    /// `baseline`, `target`, or an in-process stand-in's name.
    pub label: String,
    /// Each replica's address and `Host` header.
    pub replicas: Vec<(SocketAddr, HeaderValue)>,
    /// The path every request expands.
    pub template: PathTemplate,
}

impl Target {
    /// Parses comma-separated `http://host:port[/path]` URLs; insists every
    /// address is loopback. The path is `path` if given, else the URLs' path,
    /// else `default_path`.
    ///
    /// # Errors
    ///
    /// Not `http://`, not loopback, replicas with different paths, or a bad template.
    pub fn parse(label: &str, urls: &str, path: Option<&str>, default_path: &str) -> Result<Self, String> {
        let mut replicas = Vec::new();
        let mut url_path: Option<&str> = None;
        for url in urls.split(',') {
            let (replica, this_path) = replica(url.trim())?;
            if !replicas.is_empty() && this_path != url_path {
                return Err(format!("{urls}: every replica must have the same path"));
            }
            url_path = this_path;
            replicas.push(replica);
        }
        let template = PathTemplate::parse(path.or(url_path).unwrap_or(default_path))?;
        Ok(Self { label: label.to_owned(), replicas, template })
    }

    /// `--url`'s target, after `--baseline-url`'s when given (which takes the
    /// target's path when it has none of its own).
    ///
    /// # Errors
    ///
    /// As [`Target::parse`].
    pub fn from_urls(
        url: &str,
        baseline: Option<&str>,
        path: Option<&str>,
        default_path: &str,
    ) -> Result<Vec<Self>, String> {
        let fenced = Self::parse("target", url, path, default_path)?;
        let mut targets = Vec::new();
        if let Some(baseline) = baseline {
            targets.push(Self::parse("baseline", baseline, path, fenced.template.as_str())?);
        }
        targets.push(fenced);
        Ok(targets)
    }

    /// The same target with `prefix` before every `{key}`'s number.
    ///
    /// # Errors
    ///
    /// The prefix makes the path invalid.
    pub fn with_key_prefix(mut self, prefix: &str) -> Result<Self, String> {
        self.template = self.template.with_key_prefix(prefix);
        self.template.check()?;
        Ok(self)
    }

    /// The replicas' base URLs, comma-separated.
    #[must_use]
    pub fn urls(&self) -> String {
        self.replicas.iter().map(|(addr, _)| format!("http://{addr}")).collect::<Vec<_>>().join(",")
    }
}

/// One replica's address and `Host`, and its path if it has one (other than `/`).
fn replica(url: &str) -> Result<((SocketAddr, HeaderValue), Option<&str>), String> {
    let rest = url.strip_prefix("http://").ok_or_else(|| format!("{url}: only http:// URLs"))?;
    let (authority, path) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], Some(&rest[i..]).filter(|p| *p != "/")),
        None => (rest, None),
    };
    if path.is_some_and(|p| p.starts_with('?')) {
        return Err(format!("{url}: a query needs a path before it"));
    }
    let addr = authority
        .to_socket_addrs()
        .map_err(|e| format!("{url}: {e}"))?
        .find(|addr| addr.ip().is_loopback())
        .ok_or_else(|| format!("{url}: not a loopback address; refusing"))?;
    let host = HeaderValue::from_str(authority).map_err(|e| format!("{url}: {e}"))?;
    Ok(((addr, host), path))
}
