//! Where fencing tokens live.

use std::fmt;

use crate::Result;

/// The table in which [`PostgresLockManager`](crate::PostgresLockManager) keeps its fencing
/// tokens: one row per lock id, holding the last token minted for it.
///
/// A fencing token is a number that strictly increases with every acquisition of a key, across
/// releases, process restarts and server restarts, and is never handed out twice. Carry it with
/// every write made under the lock, and have the resource reject writes whose token is lower
/// than the highest it has accepted: a holder that lost its lock without knowing (a long pause,
/// a partition) can then no longer overwrite the work of the holder that came after it. For a
/// read-modify-write, the resource must see the token before the read as well:
/// [`RowFence`](crate::RowFence) does that for rows of your own tables, and `examples/fencing.rs`
/// plays out both checks. Only compare tokens; their numeric layout is not promised.
///
/// The name is used as given, quoted as an identifier (so it is case-sensitive and any
/// character is allowed); `schema.table` names a table in a schema. The table is created on
/// first use if it does not exist (concurrent creators are serialised), or up front with
/// [`PostgresLockManager::ensure_fencing_table`](crate::PostgresLockManager::ensure_fencing_table),
/// or by your own migrations with [`ddl`](FencingTable::ddl).
///
/// ```
/// use pglock::FencingTable;
///
/// let table = FencingTable::new("locks.fencing_tokens")?;
/// assert_eq!(table.to_string(), r#""locks"."fencing_tokens""#);
/// assert!(FencingTable::new("").is_err());
/// # Ok::<(), pglock::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FencingTable {
    quoted: String,
}

impl FencingTable {
    /// The default table name.
    pub const DEFAULT_NAME: &str = "pglock_fencing_tokens";

    /// A table called `name` (`table` or `schema.table`).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`](crate::Error::InvalidIdentifier) when a part is empty,
    /// longer than PostgreSQL's 63 bytes, or contains a NUL byte, or when the name has more
    /// than two parts.
    pub fn new(name: &str) -> Result<Self> {
        Ok(FencingTable {
            quoted: crate::fence::quote_identifier(name, true)?,
        })
    }

    /// The statement that creates the table if it does not exist.
    pub fn ddl(&self) -> String {
        format!(
            "CREATE TABLE IF NOT EXISTS {} (lock_id bigint PRIMARY KEY, token bigint NOT NULL, \
             updated_at timestamptz NOT NULL DEFAULT now())",
            self.quoted
        )
    }

    /// Takes the next token of the lock id in the statement's first parameter, or of the
    /// literal `id`.
    pub(crate) fn mint(&self, id: &str) -> String {
        format!(
            "INSERT INTO {t} AS f (lock_id, token) VALUES ({id}, 1) \
             ON CONFLICT (lock_id) DO UPDATE SET token = f.token + 1, updated_at = now() \
             RETURNING f.token",
            t = self.quoted
        )
    }

    /// As [`mint`](Self::mint), only for the rows of `source` whose `granted` is true.
    pub(crate) fn mint_if_granted(&self, source: &str) -> String {
        format!(
            "INSERT INTO {t} AS f (lock_id, token) SELECT $1, 1 FROM {source} WHERE {source}.granted \
             ON CONFLICT (lock_id) DO UPDATE SET token = f.token + 1, updated_at = now() \
             RETURNING f.token",
            t = self.quoted
        )
    }

    /// Creates the table in one transaction, serialised with every other creator by an
    /// advisory lock, since concurrent `CREATE TABLE IF NOT EXISTS` can collide.
    pub(crate) fn setup(&self) -> String {
        format!(
            "BEGIN; SELECT pg_advisory_xact_lock({}); {}; COMMIT",
            crate::lock_id("pglock:fencing-table-setup"),
            self.ddl()
        )
    }
}

impl Default for FencingTable {
    fn default() -> Self {
        FencingTable::new(Self::DEFAULT_NAME).expect("the default name is valid")
    }
}

impl fmt::Display for FencingTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quoted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Error;

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
            assert!(
                matches!(FencingTable::new(bad), Err(Error::InvalidIdentifier { .. })),
                "{bad:?}"
            );
        }
        assert!(FencingTable::new(&"x".repeat(63)).is_ok());
    }
}
