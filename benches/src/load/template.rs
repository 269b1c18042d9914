//! A request path with placeholders, expanded per request.
//!
//! `{conn}` is the connection's number, `{seq}` the request's number on its
//! connection (from 0) and `{key}` the fencing key: its number (see
//! [`schedule`](super::schedule)) after the run's key prefix (`fencing-load`
//! sets `load-<run id>-`, so that a run only ever writes to keys of its own).
//! `{{` and `}}` are literal braces.
//!
//! ```
//! use fencing_benches::load::template::PathTemplate;
//!
//! let template = PathTemplate::parse("/api/docs/{key}?n={seq}").unwrap();
//! assert_eq!(template.expand(3, 7, 1), "/api/docs/1?n=7");
//! let template = template.with_key_prefix("load-5f3a9c21-");
//! assert_eq!(template.expand(3, 7, 1), "/api/docs/load-5f3a9c21-1?n=7");
//! assert!(template.key_in_path());
//! assert!(!PathTemplate::parse("/api/docs/hot?k={key}").unwrap().key_in_path());
//! assert!(PathTemplate::parse("/api/{user}").is_err());
//! ```

use std::fmt::Write as _;

/// One piece of a [`PathTemplate`].
#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Literal(String),
    Conn,
    Seq,
    Key,
}

/// A parsed path-and-query template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathTemplate {
    pieces: Vec<Piece>,
    source: String,
    key_prefix: String,
}

impl PathTemplate {
    /// Parses `template`, which must start with `/` and expand to a valid URI path.
    ///
    /// # Errors
    ///
    /// An unknown or unclosed placeholder, or a path that is not a valid URI path.
    pub fn parse(template: &str) -> Result<Self, String> {
        if !template.starts_with('/') {
            return Err(format!("path template {template:?}: must start with '/'"));
        }
        let mut pieces = Vec::new();
        let mut literal = String::new();
        let mut chars = template.chars().peekable();
        while let Some(c) = chars.next() {
            match c {
                '{' if chars.peek() == Some(&'{') => {
                    chars.next();
                    literal.push('{');
                }
                '}' if chars.peek() == Some(&'}') => {
                    chars.next();
                    literal.push('}');
                }
                '{' => {
                    let mut name = String::new();
                    loop {
                        match chars.next() {
                            Some('}') => break,
                            Some(c) => name.push(c),
                            None => return Err(format!("path template {template:?}: unclosed '{{'")),
                        }
                    }
                    let piece = match name.as_str() {
                        "conn" => Piece::Conn,
                        "seq" => Piece::Seq,
                        "key" => Piece::Key,
                        _ => {
                            return Err(format!(
                                "path template {template:?}: unknown placeholder {{{name}}} \
                                 (known: {{conn}}, {{seq}}, {{key}})"
                            ));
                        }
                    };
                    if !literal.is_empty() {
                        pieces.push(Piece::Literal(std::mem::take(&mut literal)));
                    }
                    pieces.push(piece);
                }
                '}' => return Err(format!("path template {template:?}: unmatched '}}'")),
                c => literal.push(c),
            }
        }
        if !literal.is_empty() {
            pieces.push(Piece::Literal(literal));
        }
        let parsed = Self { pieces, source: template.to_owned(), key_prefix: String::new() };
        parsed.check()?;
        Ok(parsed)
    }

    /// The same template with `prefix` before every `{key}`'s number; [`PathTemplate::check`]
    /// says whether the prefix keeps the path valid.
    #[must_use]
    pub fn with_key_prefix(mut self, prefix: &str) -> Self {
        prefix.clone_into(&mut self.key_prefix);
        self
    }

    /// The text before every `{key}`'s number (empty unless set).
    #[must_use]
    pub fn key_prefix(&self) -> &str {
        &self.key_prefix
    }

    /// Whether the expanded template is a valid URI path and query.
    ///
    /// # Errors
    ///
    /// Names the template and the invalid expansion.
    pub fn check(&self) -> Result<(), String> {
        let sample = self.expand(0, 0, 0);
        sample
            .parse::<http::uri::PathAndQuery>()
            .map(|_| ())
            .map_err(|e| format!("path template {:?}: {sample:?} is not a valid path: {e}", self.source))
    }

    /// The path for connection `conn`'s request number `seq` on key `key`.
    #[must_use]
    pub fn expand(&self, conn: u32, seq: u64, key: u32) -> String {
        let mut out = String::with_capacity(self.source.len() + 8);
        for piece in &self.pieces {
            // Writing to a String cannot fail.
            let _ = match piece {
                Piece::Literal(s) => out.write_str(s),
                Piece::Conn => write!(out, "{conn}"),
                Piece::Seq => write!(out, "{seq}"),
                Piece::Key => write!(out, "{}{key}", self.key_prefix),
            };
        }
        out
    }

    /// Whether the template names `{key}`.
    #[must_use]
    pub fn uses_key(&self) -> bool {
        self.pieces.contains(&Piece::Key)
    }

    /// Whether `{key}` is in the path, before any `?`: then every key of the
    /// run is a path of its own (the layer's default key is the path, without the query).
    #[must_use]
    pub fn key_in_path(&self) -> bool {
        for piece in &self.pieces {
            match piece {
                Piece::Key => return true,
                Piece::Literal(s) if s.contains('?') => return false,
                _ => {}
            }
        }
        false
    }

    /// The template as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.source
    }
}
