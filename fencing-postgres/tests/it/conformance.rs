//! test-support's shared-store conformance suite on PostgreSQL: every scenario
//! against `PgSharedStore`, each on a throwaway database of the shared server.

use crate::common::engine::{Direct, Pg};
use test_support::shared_store_conformance;

shared_store_conformance!(Pg<Direct>);
