//! The schema: the mark table, the claims table and the trigger that
//! announces every claim deleted, made or brought up to date by
//! [`PgFence::migrate`](crate::PgFence::migrate) without ever holding up the
//! replicas already running.
//!
//! A migration that queues for a table lock stands in front of every lock
//! requested after it: a reader holding the mark table (`pg_dump`, a long
//! report) while a new replica's `ALTER TABLE` waited made every replica's
//! renewals wait too, and claims lapsed (issue 47). So a migration first
//! *looks*, reading only the catalog (no lock on the tables), and does nothing
//! when the schema is current. Otherwise it changes what is missing in one
//! transaction, each change waiting at most [`DDL_LOCK_TIMEOUT`] for its lock:
//! when that runs out nothing is changed, and the error names the table.

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use crate::error::FenceError;
use crate::fence::NOTIFY_QUEUE_LIMIT;

/// How long a change of the schema waits for its table lock. While it waits,
/// every replica's renewals and grants on that table queue behind it, so it is
/// short: well under any renewal's bound.
const DDL_LOCK_TIMEOUT: &str = "100ms";

/// How long a migration waits for another replica's migration to finish (the
/// advisory lock that orders them; it holds up no renewal). That one's changes
/// are bounded by [`DDL_LOCK_TIMEOUT`] each.
const TURN_TIMEOUT: &str = "10s";

/// The trigger on the claims table that announces each deleted row.
const RELEASE_TRIGGER: &str = "fencing_claims_released";

/// The migration's two statements for one mark table.
#[derive(Debug, Default)]
pub(crate) struct Migration {
    /// → one row, `true` when the schema is current. Reads only the catalog.
    pub(crate) look: String,
    /// Creates or changes what is missing, in one transaction (one simple query).
    pub(crate) change: String,
}

/// The names a migration works on, quoted (`table.rs`).
pub(crate) struct Names<'a> {
    /// The mark table.
    pub(crate) marks: &'a str,
    /// The claims table, `<marks>_claims`.
    pub(crate) claims: &'a str,
    /// The schema both are in, when the name gives one.
    pub(crate) schema: Option<&'a str>,
    /// The claims channel, on which the trigger announces deletions.
    pub(crate) channel: &'a str,
    /// The claims table's name as given, for the error that names it.
    pub(crate) claims_name: &'a str,
    /// The mark table's name as given.
    pub(crate) marks_name: &'a str,
}

impl Migration {
    pub(crate) fn new(names: &Names<'_>) -> Self {
        let Names { marks, claims, schema, channel, claims_name, marks_name } = *names;
        let function = match schema {
            Some(schema) => format!("{schema}.{RELEASE_TRIGGER}"),
            None => RELEASE_TRIGGER.to_owned(),
        };
        // to_regclass looks a name up without locking the table.
        let has_way = format!(
            "EXISTS (SELECT 1 FROM pg_attribute
                     WHERE attrelid = to_regclass('{marks}') AND attname = 'way' AND NOT attisdropped)"
        );
        let has_trigger = format!(
            "EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = to_regclass('{claims}') AND tgname = '{RELEASE_TRIGGER}')"
        );
        let look = format!(
            "SELECT to_regclass('{marks}') IS NOT NULL AND {has_way}
                AND to_regclass('{claims}') IS NOT NULL AND {has_trigger}"
        );
        // Each step that needs a lock on an existing table names it when the
        // lock was not free in time (RAISE … TABLE: the error's table field).
        let blocked = |table: &str| {
            format!(
                "EXCEPTION WHEN lock_not_available THEN
                     RAISE EXCEPTION USING ERRCODE = 'lock_not_available', TABLE = '{table}',
                         MESSAGE = 'a lock on {table} was not free within {DDL_LOCK_TIMEOUT}';"
            )
        };
        // `previous` is how the raise returns the mark it found: PostgreSQL
        // before 18 returns only the new row from an upsert. `way` records
        // which way of fencing owns the key. Keys compare as bytes (collation
        // "C"), as the layer's do. The trigger announces every deleted claim
        // (a release, an expired row deleted, a row deleted by hand) as
        // `l <token> <key>`, at commit: a replica holding it learns at once.
        let change = format!(
            "SELECT set_config('lock_timeout', '{TURN_TIMEOUT}', true);
             SELECT pg_advisory_xact_lock(hashtext('fencing-postgres migrate'));
             SELECT set_config('lock_timeout', '{DDL_LOCK_TIMEOUT}', true);
             DO $migrate$ BEGIN
                 IF to_regclass('{marks}') IS NULL THEN
                     CREATE TABLE {marks} (
                         key TEXT COLLATE \"C\" PRIMARY KEY,
                         mark NUMERIC(20,0) NOT NULL CHECK (mark BETWEEN 0 AND 18446744073709551615),
                         previous NUMERIC(20,0) NOT NULL,
                         way TEXT
                     );
                 ELSIF NOT {has_way} THEN
                     BEGIN
                         ALTER TABLE {marks} ADD COLUMN IF NOT EXISTS way TEXT;
                     {blocked_marks}
                     END;
                 END IF;
                 IF to_regclass('{claims}') IS NULL THEN
                     CREATE TABLE {claims} (
                         key TEXT COLLATE \"C\" NOT NULL,
                         replica TEXT NOT NULL,
                         token NUMERIC(20,0) NOT NULL,
                         grant_id BIGINT NOT NULL,
                         expires_at TIMESTAMPTZ NOT NULL,
                         PRIMARY KEY (key, replica)
                     );
                 END IF;
                 IF NOT {has_trigger} THEN
                     CREATE OR REPLACE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $announce$
                     BEGIN
                         IF pg_notification_queue_usage() < {NOTIFY_QUEUE_LIMIT} THEN
                             PERFORM pg_notify(TG_ARGV[0], 'l ' || OLD.token::text || ' ' || OLD.key);
                         END IF;
                         RETURN NULL;
                     END $announce$;
                     BEGIN
                         CREATE TRIGGER {RELEASE_TRIGGER} AFTER DELETE ON {claims}
                             FOR EACH ROW EXECUTE FUNCTION {function}('{channel}');
                     {blocked_claims}
                     END;
                 END IF;
             END $migrate$",
            blocked_marks = blocked(marks_name),
            blocked_claims = blocked(claims_name),
        );
        Self { look, change }
    }

    /// Looks, and changes what is missing (see the module docs).
    pub(crate) async fn run(&self, client: &Client) -> Result<(), FenceError> {
        // Unnamed: nothing prepared outlives the statement (a transaction pooler).
        let looked = client.query_typed(&self.look, &[]).await?;
        let current: bool = looked.first().map(|row| row.try_get(0)).transpose()?.unwrap_or(false);
        if current {
            return Ok(());
        }
        // One simple query: one implicit transaction, all or nothing, and
        // nothing left open on the connection whatever happens.
        client.batch_execute(&self.change).await.map_err(|error| {
            let table = error.as_db_error().filter(|db| db.code() == &SqlState::LOCK_NOT_AVAILABLE);
            match table.and_then(|db| db.table()) {
                Some(table) => FenceError::MigrationBlocked { table: table.to_owned(), error },
                None => error.into(),
            }
        })
    }
}
