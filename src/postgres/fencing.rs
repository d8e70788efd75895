//! Where fencing tokens live.

use std::fmt;

use crate::error::InvalidIdentifier;
use crate::sql::table::OwnTable;

/// The table in which [`PostgresLockManager`](crate::PostgresLockManager) keeps its fencing
/// tokens: one row per lock id, holding the last token minted for it.
///
/// A fencing token is a number that strictly increases with every acquisition of a key, across
/// releases, process restarts, server restarts and crashes, and failovers to a promoted
/// standby, and is never handed out twice (within the limits below). Carry it with
/// every write made under the lock, and have the resource reject writes whose token is lower
/// than the highest it has accepted: a holder that lost its lock without knowing (a long pause,
/// a partition) can then no longer overwrite the work of the holder that came after it. For a
/// read-modify-write, the resource must see the token before the read as well:
/// [`RowFence`](crate::RowFence) does that for rows of your own tables, and `examples/fencing.rs`
/// plays out both checks. Only compare tokens, and store them as 64-bit integers (`bigint`).
///
/// # How tokens survive crashes and failovers
///
/// * The statement that mints a token commits durably (its WAL is flushed to the server's disk
///   before the lock is reported granted), whatever the session's or the server's
///   `synchronous_commit`, so a server crash cannot take back a token that was handed out. It
///   does not wait for synchronous standbys (`synchronous_commit = local`), so a slow standby
///   cannot hold up an acquisition. `tests/ha.rs` crashes a server
///   (immediate stop) that commits asynchronously and loses commits in the crash: no token is
///   handed out twice.
/// * With asynchronous replication a promoted standby may lack the latest tokens of the old
///   primary. Tokens therefore carry the server's WAL timeline, which grows at every promotion,
///   in their high bits: `(timeline << 40) + n`. The first token after a promotion exceeds
///   every token before it. `tests/ha.rs` mints tokens on a primary that its standby never
///   receives, kills the primary and promotes the standby: every new token exceeds every old
///   one.
/// * Tokens minted by versions of pglock that counted from 1 stay below every such token, so an
///   upgrade keeps them increasing; expect a jump to about 2^40 at the first acquisition after
///   upgrading.
///
/// # `updated_at`: when the latest acquisition was granted
///
/// Each mint also sets the row's `updated_at` to the time of the grant by the server's clock
/// (read right after the lock function returned, in the same statement or message), including
/// the mint of an in-process handoff, which is a new acquisition.
/// [`Inspector::fencing_table`](crate::inspect::Inspector::fencing_table) reads it to report
/// the true age of an exclusive holder's lock, where `pg_locks` has none.
///
/// Limits: the timeline is only as good as the cluster's history. Two servers promoted from
/// the same timeline (two standbys, or a split brain) can mint equal tokens; a copy of the
/// table moved into a new cluster (dump and restore) repeats unreplicated tokens at its first
/// failovers until its timeline passes the stored tokens'; restoring an old copy of the data
/// directory without recovery takes tokens back. Durability against a machine crash rests on
/// the server's `fsync`, as for any commit. The [failure model](https://github.com/pglock-rs/pglock/blob/main/docs/failure-model.md)
/// has the limits.
///
/// The name is used as given, quoted as an identifier (so it is case-sensitive and any
/// character is allowed); `schema.table` names a table in a schema, and an unqualified name
/// is looked up (and created) by the role's `search_path`.
///
/// # Creating the table, and the role that uses it
///
/// Before its first fenced acquisition, the manager checks that the table exists and that its
/// role may use it, in one round trip. If the table is missing and the role may create tables
/// in the schema, the manager creates it (concurrent creators are serialised); if the role may
/// not, the acquisition fails with [`Error::PermissionDenied`](crate::Error::PermissionDenied)
/// naming the schema and `CREATE`. An application role that owns nothing works when the table
/// was made by your migrations, with [`ddl`](FencingTable::ddl), and granted:
///
/// ```sql
/// -- as the owner, in a migration
/// CREATE TABLE IF NOT EXISTS pglock_fencing_tokens (lock_id bigint PRIMARY KEY,
///   token bigint NOT NULL, updated_at timestamp with time zone NOT NULL
///   DEFAULT pg_catalog.now());
/// GRANT SELECT, INSERT, UPDATE ON pglock_fencing_tokens TO app;
/// ```
///
/// A missing grant is [`Error::PermissionDenied`](crate::Error::PermissionDenied) naming the
/// table and the privileges missing, at the first fenced acquisition, never a connection
/// error. [`PostgresLockManager::ensure_fencing_table`](crate::PostgresLockManager::ensure_fencing_table)
/// runs the same check up front, at start-up.
///
/// ```
/// use pglock::FencingTable;
///
/// let table = FencingTable::new("locks.fencing_tokens")?;
/// assert_eq!(table.to_string(), r#""locks"."fencing_tokens""#);
/// assert!(FencingTable::new("").is_err());
/// # Ok::<(), pglock::InvalidIdentifier>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingTable {
    table: OwnTable,
}

impl FencingTable {
    /// The default table name.
    pub const DEFAULT_NAME: &str = "pglock_fencing_tokens";

    /// A table called `name` (`table` or `schema.table`).
    ///
    /// # Errors
    ///
    /// [`InvalidIdentifier`] when a part is empty, longer than PostgreSQL's 63 bytes, or
    /// contains a NUL byte, or when the name has more than two parts.
    pub fn new(name: &str) -> Result<Self, InvalidIdentifier> {
        Ok(FencingTable {
            table: OwnTable::new(name)?,
        })
    }

    /// The table, for making it ready.
    pub(crate) fn table(&self) -> &OwnTable {
        &self.table
    }

    /// The statement that creates the table if it does not exist.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (lock_id bigint PRIMARY KEY, token bigint NOT NULL, \
             updated_at timestamp with time zone NOT NULL DEFAULT pg_catalog.now())",
            self.table.quoted()
        )
    }

    /// Takes the next token of the lock id in the statement's first parameter, or of the
    /// literal `id`.
    pub(crate) fn mint(&self, id: &str) -> String {
        format!(
            "INSERT INTO {t} AS f (lock_id, token, updated_at) \
             SELECT {id}, {EPOCH} OPERATOR(pg_catalog.+) 1, {GRANTED_AT} WHERE {DURABLE} {NEXT}",
            t = self.table.quoted()
        )
    }

    /// As [`mint`](Self::mint) for the row `id` (an SQL expression), only for the rows of
    /// `source` whose `granted` is true.
    pub(crate) fn mint_if_granted(&self, source: &str, id: &str) -> String {
        format!(
            "INSERT INTO {t} AS f (lock_id, token, updated_at) \
             SELECT {id}, {EPOCH} OPERATOR(pg_catalog.+) 1, {GRANTED_AT} FROM {source} \
             WHERE {source}.granted AND {DURABLE} {NEXT}",
            t = self.table.quoted()
        )
    }
}

// DO NOT CHANGE the layout below without a migration story: tokens already handed out must stay
// lower than every token handed out after an upgrade.
//
// A token is `(epoch << 40) + n`. The epoch is the server's WAL timeline, which grows by one at
// every promotion of a standby; `n` counts acquisitions within the epoch. A promoted standby may
// have missed the latest tokens of the old primary (asynchronous replication), but its first
// token is `((epoch + 1) << 40) + 1`, above all of them. Rows written before the epoch existed
// (plain counters) are below every epoch's first token, so upgrading keeps tokens increasing.
const EPOCH: &str = "((('x' OPERATOR(pg_catalog.||) \
     pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8)\
     )::bit(32)::bigint) OPERATOR(pg_catalog.<<) 40)";
/// Makes the minting transaction's commit wait for its WAL flush whatever the session's
/// `synchronous_commit`: a token lost in a crash could be handed out again. `local`, not `on`:
/// the flush to this server's disk is what a crash needs; waiting for a synchronous standby
/// would let a slow or missing standby stall the statement past the lock session's statement
/// bound, and closing the session would drop every other lock on it. The timeline in the
/// token covers what a standby missed.
const DURABLE: &str = "pg_catalog.set_config('synchronous_commit', 'local', true) IS NOT NULL";
/// The next token: one above the last, and never below the epoch's first.
const NEXT: &str = "ON CONFLICT (lock_id) DO UPDATE \
     SET token = GREATEST(f.token OPERATOR(pg_catalog.+) 1, EXCLUDED.token), \
       updated_at = EXCLUDED.updated_at \
     RETURNING f.token";
/// The row's `updated_at`: the grant, by the server's clock, which `pglock::inspect` reads as
/// an exclusive holder's true grant time. Read as the row is written, after the lock function
/// returned (earlier in the statement, or in an earlier statement of the same message), so it
/// is never before the grant. Not `now()`: that is the transaction's start, which for a wait
/// message (one implicit transaction) is the start of the wait.
const GRANTED_AT: &str = "pg_catalog.clock_timestamp()";

impl Default for FencingTable {
    fn default() -> Self {
        FencingTable::new(Self::DEFAULT_NAME).expect("the default name is valid")
    }
}

impl fmt::Display for FencingTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.table.quoted())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_quoted_whatever_they_contain() {
        assert_eq!(
            FencingTable::new(r#"we"ird; DROP TABLE x"#)
                .unwrap()
                .to_string(),
            r#""we""ird; DROP TABLE x""#
        );
        assert_eq!(
            FencingTable::default().to_string(),
            "\"pglock_fencing_tokens\""
        );
        for bad in ["", "a.", ".b", "a.b.c", "nul\0", &"x".repeat(64)] {
            assert!(FencingTable::new(bad).is_err(), "{bad:?}");
        }
        assert!(FencingTable::new(&"x".repeat(63)).is_ok());
    }
}
