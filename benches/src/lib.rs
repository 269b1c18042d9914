//! Placeholder: the benches issue fills this crate.
