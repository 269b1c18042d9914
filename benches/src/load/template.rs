//! A request path with placeholders, expanded per request.
//!
//! `{conn}` is the connection's number, `{seq}` the request's number on its
//! connection (from 0) and `{key}` the fencing key's number (see
//! [`schedule`](super::schedule)). `{{` and `}}` are literal braces.
//!
//! ```
//! use fencing_benches::load::template::PathTemplate;
//!
//! let template = PathTemplate::parse("/api/docs/{key}?n={seq}").unwrap();
//! assert_eq!(template.expand(3, 7, 1), "/api/docs/1?n=7");
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
        let parsed = Self { pieces, source: template.to_owned() };
        let sample = parsed.expand(0, 0, 0);
        sample
            .parse::<http::uri::PathAndQuery>()
            .map_err(|e| format!("path template {template:?}: {sample:?} is not a valid path: {e}"))?;
        Ok(parsed)
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
                Piece::Key => write!(out, "{key}"),
            };
        }
        out
    }

    /// Whether the template names `{key}`.
    #[must_use]
    pub fn uses_key(&self) -> bool {
        self.pieces.contains(&Piece::Key)
    }

    /// The template as given.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.source
    }
}
