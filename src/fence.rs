//! The resource side of fencing, for rows in PostgreSQL: raise a row's fence before reading
//! it ([`RowFence`]), and the errors of doing so ([`Error`]).

use std::fmt;
use std::sync::Arc;

use sqlx::postgres::PgRow;
use sqlx::{Acquire, AssertSqlSafe, Encode, FromRow, PgConnection, Postgres, Type};

use crate::error::InvalidIdentifier;
use crate::sql::quote_identifier;

/// A `Result` whose error is the fencing [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`RowFence`] refused or failed. It takes no locks, so it has no lock failures.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The row's fence already holds a higher fencing token: a newer lock holder has claimed
    /// the row, so this holder's lock is gone. Nothing was changed; stop, and do not count the
    /// work as done.
    #[error("Stale fencing token {token} for row {row} of {resource}: its fence is at {fence}")]
    StaleToken {
        /// The fenced table.
        resource: String,
        /// The row's key, as displayed.
        row: String,
        /// The token that was presented.
        token: i64,
        /// The higher token the row's fence holds.
        fence: i64,
    },

    /// A [`write`](RowFence::write) found the row's fence below its token or unset: the row
    /// was not raised with this token before the write, a bug in the caller. Nothing was
    /// written.
    #[error(
        "Row {row} of {resource} is not fenced with token {token} (its fence is {}): \
         raise the fence before writing",
        or_unset(.fence)
    )]
    NotRaised {
        /// The fenced table.
        resource: String,
        /// The row's key, as displayed.
        row: String,
        /// The token that was presented.
        token: i64,
        /// The row's fence, `None` when it was never raised.
        fence: Option<i64>,
    },

    /// No row has the given key.
    #[error("No row {row} in fenced table {resource}")]
    RowNotFound {
        /// The fenced table.
        resource: String,
        /// The key that was looked for, as displayed.
        row: String,
    },

    /// A statement failed, or its row did not decode.
    #[error("Fencing on {resource} failed to {operation}: {source}")]
    Failed {
        /// The fenced table.
        resource: String,
        /// What was being done, such as `raise the fence`.
        operation: &'static str,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },

    /// A name given to [`RowFence`] cannot be used.
    #[error(transparent)]
    InvalidIdentifier(#[from] InvalidIdentifier),
}

/// A fence for error messages: its token, or `unset`.
fn or_unset(fence: &Option<i64>) -> String {
    fence.map_or_else(|| "unset".to_owned(), |fence| fence.to_string())
}

/// The fence column of one of your tables: how a holder claims a row with its
/// [fencing token](crate::LockInfo::fencing_token) *before* it reads the row, so that a
/// read-modify-write under a lock stays correct when the lock is lost mid-way.
///
/// # Why the read has to be fenced too
///
/// Checking the token only on the write (`... WHERE fence <= $token`) protects blind writes,
/// whose new value does not depend on what was there. A read-modify-write (a counter, a
/// balance, a projection) is different: a holder whose lock silently went away may read, the
/// next holder reads the same value, the old holder's write lands first (its token is still
/// the highest the row has seen), and the new holder's write lands on top of it. Both were
/// accepted; one of them is lost.
///
/// `RowFence` closes that gap. [`raise`](RowFence::raise) sets the row's fence to the token and
/// returns the row in the same statement, and refuses if a higher token got there first.
/// [`write`](RowFence::write) then stores the new value only while the fence still holds that
/// very token. A stale holder is refused on its read, or on its write if a newer holder raised
/// the fence in between; its increment is never counted as done and never lands.
///
/// # The table
///
/// Any table with a unique key column and a nullable `bigint` fence column (`NULL`: never
/// fenced), for example:
///
/// ```sql
/// CREATE TABLE counters (id uuid PRIMARY KEY, value bigint NOT NULL, fence bigint);
/// ```
///
/// Only compare tokens: they strictly increase per lock key, and nothing else about their
/// numeric values is promised. Fence each row with the tokens of one lock key, the key that
/// guards it.
///
/// # Names
///
/// Names are used as given and quoted as identifiers (case-sensitive, any character but NUL),
/// the same way as [`FencingTable::new`](crate::FencingTable::new): the table may be
/// `schema.table`; columns are single names.
///
/// # Example
///
/// ```no_run
/// use std::time::Duration;
/// use pglock::fence::{self, RowFence};
/// use pglock::{FencingTable, PostgresLockManager};
///
/// # async fn run(pool: sqlx::PgPool, id: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// let locks = PostgresLockManager::builder(pool.clone())
///     .fencing(FencingTable::default())
///     .build();
/// let counters = RowFence::new("counters", "id", "fence")?.returning(&["value"])?;
///
/// let guard = locks.acquire(format!("counter:{id}"), Some(Duration::from_secs(5))).await?;
/// let token = guard.info().fencing_token.expect("fencing is on");
/// let outcome = async {
///     let (value,): (i64,) = counters.raise(&pool, id, token).await?; // fence, then read
///     counters.write(&pool, id, token, "value", value + 1).await      // only while fenced
/// };
/// match outcome.await {
///     Ok(()) => println!("incremented"),
///     Err(fence::Error::StaleToken { fence, .. }) => println!("superseded by token {fence}"),
///     Err(other) => return Err(other.into()),
/// }
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowFence {
    table: String,
    key: String,
    fence: String,
    raise: Arc<str>,
    lookup: Arc<str>,
}

/// Which step a refused statement was, for telling the refusals apart.
#[derive(Clone, Copy)]
enum Step {
    Raise,
    Write,
}

impl RowFence {
    /// The fence column `fence_column` of `table`, whose rows are named by `key_column`.
    /// [`raise`](Self::raise) returns every column (`RETURNING *`) until
    /// [`returning`](Self::returning) says otherwise.
    ///
    /// # Errors
    ///
    /// [`InvalidIdentifier`] when a name (or a part of `schema.table`) is empty, longer
    /// than PostgreSQL's 63 bytes or contains a NUL byte, or the table name has more than two
    /// parts.
    ///
    /// ```
    /// let fence = pglock::RowFence::new("app.counters", "id", "fence")?;
    /// assert_eq!(fence.table(), r#""app"."counters""#);
    /// assert!(pglock::RowFence::new("counters", "", "fence").is_err());
    /// # Ok::<(), pglock::InvalidIdentifier>(())
    /// ```
    pub fn new(
        table: &str,
        key_column: &str,
        fence_column: &str,
    ) -> Result<Self, InvalidIdentifier> {
        let table = quote_identifier(table, true)?;
        let key = quote_identifier(key_column, false)?;
        let fence = quote_identifier(fence_column, false)?;
        let lookup = format!("SELECT {fence} FROM {table} WHERE {key} OPERATOR(pg_catalog.=) $1");
        let mut fenced = RowFence {
            raise: Arc::from(""),
            lookup: Arc::from(lookup),
            table,
            key,
            fence,
        };
        fenced.raise = fenced.raise_statement("*");
        Ok(fenced)
    }

    /// Makes [`raise`](Self::raise) return these columns, in this order (so a tuple can hold
    /// them), instead of every column.
    ///
    /// # Errors
    ///
    /// [`InvalidIdentifier`] when `columns` is empty or a name is not usable (see
    /// [`new`](Self::new)).
    pub fn returning(mut self, columns: &[&str]) -> Result<Self, InvalidIdentifier> {
        if columns.is_empty() {
            return Err(InvalidIdentifier {
                name: String::new(),
                reason: "no column to return",
            });
        }
        let quoted = columns
            .iter()
            .map(|column| quote_identifier(column, false))
            .collect::<Result<Vec<_>, _>>()?;
        self.raise = self.raise_statement(&quoted.join(", "));
        Ok(self)
    }

    /// The table, quoted as it appears in the statements.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// Raises the fence of row `row` to `token` and returns the row as it is now, in one
    /// statement: `UPDATE .. SET fence = token WHERE key = row AND (fence IS NULL OR fence <=
    /// token) RETURNING ..`.
    ///
    /// From then on, holders with lower tokens are refused by this row, and the value returned
    /// is the one to compute from. The same token may raise again (a retry, or the next
    /// read-modify-write of the same acquisition). `conn` is anything that yields a
    /// connection: `&PgPool`, `&mut PgConnection`, or `&mut Transaction` to raise, compute and
    /// write in one transaction.
    ///
    /// # Errors
    ///
    /// * [`Error::StaleToken`] when the row's fence already holds a higher token: a
    ///   newer holder has claimed the row, so this holder's lock is gone. Nothing was changed.
    /// * [`Error::RowNotFound`] when no row has that key.
    /// * [`Error::Failed`] when a statement fails, or the row does not decode as `R`.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the fence raised or not, like any dropped statement.
    /// Either outcome is safe: a raise with your own token only locks out lower tokens, whose
    /// holders are stale anyway, and raising again with the same token succeeds.
    pub async fn raise<'c, A, K, R>(&self, conn: A, row: K, token: i64) -> Result<R>
    where
        A: Acquire<'c, Database = Postgres>,
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + fmt::Display + Send + Sync,
        R: for<'r> FromRow<'r, PgRow> + Send + Unpin,
    {
        let mut conn = conn
            .acquire()
            .await
            .map_err(|source| self.failed("check out a connection", source))?;
        let raised = sqlx::query_as::<_, R>(AssertSqlSafe(Arc::clone(&self.raise)))
            .bind(&row)
            .bind(token)
            .fetch_optional(&mut *conn)
            .await
            .map_err(|source| self.failed("raise the fence", source))?;
        match raised {
            Some(found) => Ok(found),
            None => Err(self.refusal(&mut conn, &row, token, Step::Raise).await),
        }
    }

    /// Sets `column` of row `row` to `value`, if and only if the row's fence holds exactly
    /// `token`: `UPDATE .. SET column = value WHERE key = row AND fence = token`.
    ///
    /// Call it after [`raise`](Self::raise) with the same token. Requiring the very token (not
    /// merely "at most") is what refuses a holder whose read was overtaken. For writes that set
    /// several columns, run your own `UPDATE` with the same `WHERE` clause and treat zero rows
    /// as stale.
    ///
    /// # Errors
    ///
    /// * [`Error::StaleToken`] when a newer holder raised the fence since: this
    ///   holder's read is out of date and nothing was written.
    /// * [`Error::NotRaised`] when the fence holds a lower token or none: the row was not
    ///   raised with `token` first, a bug in the caller. Nothing was written.
    /// * [`Error::RowNotFound`] when no row has that key.
    /// * [`Error::InvalidIdentifier`] when `column` is not a usable name.
    /// * [`Error::Failed`] when a statement fails.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may leave the write applied or not, like any dropped statement; in
    /// a transaction, the transaction's outcome decides.
    pub async fn write<'c, A, K, V>(
        &self,
        conn: A,
        row: K,
        token: i64,
        column: &str,
        value: V,
    ) -> Result<()>
    where
        A: Acquire<'c, Database = Postgres>,
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + fmt::Display + Send + Sync,
        V: for<'q> Encode<'q, Postgres> + Type<Postgres> + Send,
    {
        let statement = format!(
            "UPDATE {t} SET {c} = $3 \
             WHERE {k} OPERATOR(pg_catalog.=) $1 AND {f} OPERATOR(pg_catalog.=) $2",
            t = self.table,
            c = quote_identifier(column, false)?,
            k = self.key,
            f = self.fence,
        );
        let mut conn = conn
            .acquire()
            .await
            .map_err(|source| self.failed("check out a connection", source))?;
        let written = sqlx::query(AssertSqlSafe(statement))
            .bind(&row)
            .bind(token)
            .bind(value)
            .execute(&mut *conn)
            .await
            .map_err(|source| self.failed("write the row", source))?;
        if written.rows_affected() > 0 {
            return Ok(());
        }
        Err(self.refusal(&mut conn, &row, token, Step::Write).await)
    }

    fn raise_statement(&self, returning: &str) -> Arc<str> {
        Arc::from(format!(
            "UPDATE {t} SET {f} = $2 WHERE {k} OPERATOR(pg_catalog.=) $1 \
             AND ({f} IS NULL OR {f} OPERATOR(pg_catalog.<=) $2) RETURNING {returning}",
            t = self.table,
            k = self.key,
            f = self.fence,
        ))
    }

    /// Why a statement matched no row. Fences only grow, so a higher fence read now was
    /// already there (or newer) when the statement was refused.
    async fn refusal<K>(&self, conn: &mut PgConnection, row: &K, token: i64, step: Step) -> Error
    where
        K: for<'q> Encode<'q, Postgres> + Type<Postgres> + fmt::Display + Send + Sync,
    {
        let found = sqlx::query_scalar::<_, Option<i64>>(AssertSqlSafe(Arc::clone(&self.lookup)))
            .bind(row)
            .fetch_optional(conn)
            .await;
        let (resource, row) = (self.table.clone(), row.to_string());
        match (found, step) {
            (Err(source), _) => self.failed("read the fence of a refused row", source),
            (Ok(Some(Some(fence))), _) if fence > token => Error::StaleToken {
                resource,
                row,
                token,
                fence,
            },
            (Ok(Some(fence)), Step::Write) => Error::NotRaised {
                resource,
                row,
                token,
                fence,
            },
            // Not there when raised (it may have been inserted since).
            (Ok(_), _) => Error::RowNotFound { resource, row },
        }
    }

    fn failed(&self, operation: &'static str, source: sqlx::Error) -> Error {
        Error::Failed {
            resource: self.table.clone(),
            operation,
            source,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_validated_and_quoted() {
        let fence = RowFence::new(r#"s"x.t; DROP TABLE y"#, "k.ey", r#"fe"nce"#).unwrap();
        assert_eq!(fence.table(), r#""s""x"."t; DROP TABLE y""#);
        assert_eq!(
            &*fence.raise,
            r#"UPDATE "s""x"."t; DROP TABLE y" SET "fe""nce" = $2 WHERE "k.ey" OPERATOR(pg_catalog.=) $1 AND ("fe""nce" IS NULL OR "fe""nce" OPERATOR(pg_catalog.<=) $2) RETURNING *"#
        );
        let fence = fence.returning(&["value", "a\"b"]).unwrap();
        assert!(fence.raise.ends_with(r#"RETURNING "value", "a""b""#));
        for (table, key, column) in [
            ("", "id", "fence"),
            ("a.b.c", "id", "fence"),
            ("t", "", "fence"),
            ("t", "id", "nul\0"),
            ("t", "id", &*"x".repeat(64)),
        ] {
            assert!(
                RowFence::new(table, key, column).is_err(),
                "{table:?} {key:?} {column:?}"
            );
        }
        let fence = RowFence::new("t", "id", "fence").unwrap();
        assert!(fence.clone().returning(&[]).is_err());
        assert!(fence.returning(&["ok", ""]).is_err());
    }
}
