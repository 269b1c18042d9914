//! The mark table's name: checked once, then quoted into every statement.
//!
//! Statements cannot take an identifier as a parameter, so the name is put into
//! the SQL text. Only names made of ASCII letters, digits and underscores (one
//! optional `schema.` prefix) are taken: nothing a client or a config typo sends
//! can then change what a statement does.

use std::fmt;

/// PostgreSQL silently truncates longer identifiers (NAMEDATALEN − 1).
const MAX_IDENTIFIER_BYTES: usize = 63;

/// A table name `PgFence` refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTableName {
    name: String,
    reason: &'static str,
}

impl fmt::Display for InvalidTableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid fencing mark table name {:?}: {} (expected `table` or `schema.table`, \
             each an ASCII letter or underscore followed by letters, digits or underscores, \
             at most {MAX_IDENTIFIER_BYTES} bytes)",
            self.name, self.reason
        )
    }
}

impl std::error::Error for InvalidTableName {}

/// `name` as a quoted, possibly schema-qualified identifier: `"schema"."table"`.
pub(crate) fn quote(name: &str) -> Result<String, InvalidTableName> {
    let refuse = |reason| InvalidTableName { name: name.to_owned(), reason };
    let parts: Vec<&str> = name.split('.').collect();
    if parts.len() > 2 {
        return Err(refuse("more than one `.`"));
    }
    for part in &parts {
        check(part).map_err(refuse)?;
    }
    // Quoted, so a reserved word (`user`, `order`) works, and the case is kept as given.
    Ok(parts.iter().map(|part| format!("\"{part}\"")).collect::<Vec<_>>().join("."))
}

fn check(part: &str) -> Result<(), &'static str> {
    let mut chars = part.chars();
    match chars.next() {
        None => return Err("an empty name or schema"),
        Some(first) if !(first.is_ascii_alphabetic() || first == '_') => {
            return Err("a name must start with an ASCII letter or an underscore");
        }
        Some(_) => {}
    }
    if !chars.all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err("only ASCII letters, digits and underscores are allowed");
    }
    if part.len() > MAX_IDENTIFIER_BYTES {
        return Err("longer than PostgreSQL keeps");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quotes_plain_and_qualified_names() {
        assert_eq!(quote("fencing_marks").unwrap(), r#""fencing_marks""#);
        assert_eq!(quote("ops.Marks_2").unwrap(), r#""ops"."Marks_2""#);
        assert_eq!(quote("_x").unwrap(), r#""_x""#);
        assert_eq!(quote(&"a".repeat(63)).unwrap().len(), 65);
    }

    #[test]
    fn refuses_anything_else() {
        for bad in [
            "",
            ".",
            "a.",
            ".a",
            "a.b.c",
            "1abc",
            "a-b",
            "a b",
            "a\"b",
            "a;drop table x",
            "ä",
            "a\0",
            "\"quoted\"",
            &"a".repeat(64),
        ] {
            let error = quote(bad).unwrap_err();
            assert!(error.to_string().contains("invalid fencing mark table name"), "{bad:?}: {error}");
        }
    }
}
