//! Transaction-scoped advisory locks on the caller's own transaction.

use std::time::Duration;

use sqlx::{PgConnection, Row};

use crate::sql::errors::{has_sqlstate, statement_error};
use crate::sql::{MAX_LOCK_TIMEOUT_MS, whole_ms};
use crate::{Error, LockKey, LockMode, LockTarget, Result};

/// SQLSTATE `no_active_sql_transaction`: what `SAVEPOINT` answers outside a transaction block.
const NO_ACTIVE_TRANSACTION: &str = "25P01";

/// An advisory lock taken inside your own transaction and held until it ends:
/// `pg_advisory_xact_lock` and its shared and non-blocking variants, for any [`LockKey`].
///
/// The lock belongs to the transaction of the connection you pass (a
/// `sqlx::Transaction<'_, Postgres>` dereferences to one: pass `&mut tx`). PostgreSQL releases it
/// when the transaction commits or rolls back, so there is no guard and no unlock, and nothing
/// to forget. It is the lock sqlx users write by hand:
///
/// ```no_run
/// use std::time::Duration;
/// use pglock::TransactionLock;
///
/// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// // Wait at most two seconds; on timeout the transaction is still usable.
/// TransactionLock::exclusive("invoice:42").acquire(&mut tx, Some(Duration::from_secs(2))).await?;
/// sqlx::query("UPDATE invoices SET sent = true WHERE id = 42").execute(&mut *tx).await?;
/// tx.commit().await?; // the lock is released here
/// # Ok(()) }
/// ```
///
/// # When to use these, and when session locks
///
/// | | `TransactionLock` | [`PostgresLockManager`](crate::PostgresLockManager) |
/// | --- | --- | --- |
/// | held | until your transaction ends | until released, across transactions |
/// | PgBouncer, transaction pooling | **works** | does not (see the guide) |
/// | guard, lost-lock signal, fencing tokens | none: the lock cannot outlive the transaction, and its work commits or rolls back with it | yes |
/// | connection | the one your transaction runs on | lock sessions of the manager's pool |
/// | re-entry | the same transaction may take a key again (it stacks) | refused or queued in-process |
///
/// Use a `TransactionLock` when the work the lock protects is the transaction itself (a
/// read-modify-write of rows, an idempotent insert, a serialised update), and whenever your
/// connections go through PgBouncer in transaction pooling mode: these are the only advisory
/// locks that work there, because a transaction keeps its server connection from `BEGIN` to
/// `COMMIT`. Use the lock manager for work that spans transactions or is not database work at
/// all (calling an API, running a job), where you need a guard that tells you when the lock is
/// lost.
///
/// The keys are the same: `TransactionLock::exclusive("jobs")` and a
/// [`PostgresLockManager`](crate::PostgresLockManager) holding `"jobs"` exclude each other,
/// and so do pairs and raw ids ([`LockKey::pair`], [`LockKey::id`]) with the same numbers
/// locked by hand-written SQL.
///
/// # What PostgreSQL decides for you
///
/// * The lock stacks: a transaction that takes a key twice holds it twice, and it is still
///   released at the end. A transaction that holds a key in one mode may take it in the other.
/// * A lock taken inside a savepoint (sqlx's nested transactions) is released when that
///   savepoint is rolled back, and kept when it is released.
/// * Two transactions that wait for each other's keys deadlock; PostgreSQL aborts one of them
///   (SQLSTATE 40P01), as for any other lock.
/// * The lock is taken on the server the connection reaches. These calls refuse a standby
///   ([`Error::Standby`]): advisory locks are not replicated, so a lock on a standby excludes
///   nothing on the primary.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TransactionLock {
    key: LockKey,
    mode: LockMode,
}

impl TransactionLock {
    /// The lock on `key` in `mode`.
    pub fn new(key: impl Into<LockKey>, mode: LockMode) -> Self {
        TransactionLock {
            key: key.into(),
            mode,
        }
    }

    /// The exclusive lock on `key`: one transaction at a time, and no shared holder.
    pub fn exclusive(key: impl Into<LockKey>) -> Self {
        TransactionLock::new(key, LockMode::Exclusive)
    }

    /// The shared lock on `key`: any number of transactions at once, while no one holds the key
    /// exclusively.
    pub fn shared(key: impl Into<LockKey>) -> Self {
        TransactionLock::new(key, LockMode::Shared)
    }

    /// The key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The mode.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Takes the lock in the transaction open on `tx`, waiting in the server's queue for up to
    /// `timeout`; the lock is held until the transaction ends.
    ///
    /// * `Some(t)`: the server ends the wait after `t` (its `lock_timeout`, rounded up to whole
    ///   milliseconds, set for the wait only). On timeout nothing is held, the transaction is
    ///   still usable, and its `lock_timeout` is what it was. `Some(Duration::ZERO)` is one
    ///   try; deadlines beyond PostgreSQL's largest `lock_timeout` (about 24 days) wait
    ///   without limit.
    /// * `None`: one `pg_advisory_xact_lock` statement, exactly as written by hand. It waits
    ///   as long as the session's own `lock_timeout` and `statement_timeout` allow (no limit
    ///   by default); if one of those ends it, the statement fails and, as any failed
    ///   statement does, aborts the transaction.
    ///
    /// The whole call is one message to the server.
    ///
    /// # Errors
    ///
    /// * [`Error::Timeout`] when `timeout` passed first; the transaction goes on.
    /// * [`Error::NotInTransaction`] when `tx` is not in a transaction block: in autocommit a
    ///   transaction lock would be released as soon as it was granted. Nothing was locked.
    /// * [`Error::Standby`] when the server is in recovery. Nothing was locked.
    /// * [`Error::Database`] when the server refused the statement: the transaction had
    ///   already failed, a deadlock was detected, or the session's own `lock_timeout` or
    ///   `statement_timeout` ran out (these three abort the transaction);
    ///   [`Error::LockTableFull`] when the server's lock table is full.
    /// * [`Error::Connection`] when the connection broke.
    ///
    /// # Cancel safety
    ///
    /// Once polled, the message is on its way and the server runs it to its end whatever
    /// becomes of this future; sqlx finishes it before the connection's next statement. So a
    /// dropped call leaves the transaction either without the lock or holding it (when it was
    /// granted after the drop, until the transaction ends, like any other), never with a
    /// setting changed, a savepoint left open, or aborted by the timeout. A dropped wait keeps
    /// its place in the server's queue until it is granted or its `timeout` ends, and the
    /// connection's next statement waits for that: give a timeout to every wait you may
    /// abandon.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use pglock::{LockKey, TransactionLock};
    ///
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// // The two-integer key space of `pg_advisory_xact_lock(int, int)`.
    /// let lock = TransactionLock::exclusive(LockKey::pair(7, 42));
    /// match lock.acquire(&mut tx, Some(Duration::from_millis(500))).await {
    ///     Ok(()) => { /* ... work under the lock ... */ }
    ///     Err(err) if err.is_timeout() => { /* busy: the transaction goes on without it */ }
    ///     Err(err) => return Err(err.into()),
    /// }
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire(&self, tx: &mut PgConnection, timeout: Option<Duration>) -> Result<()> {
        let sql = match timeout.map(lock_timeout_ms) {
            None => self.wait_statement(),
            Some(Some(ms)) => self.bounded_wait_statement(ms),
            Some(None) => self.try_statement(),
        };
        match self.run(tx, sql).await? {
            true => Ok(()),
            false => Err(Error::Timeout {
                key: self.key.clone(),
                timeout: timeout.unwrap_or_default(),
            }),
        }
    }

    /// Takes the lock in the transaction open on `tx` if no one else holds it, without
    /// waiting; returns whether it was granted. A granted lock is held until the transaction
    /// ends; a refusal changes nothing and the transaction goes on.
    ///
    /// # Errors
    ///
    /// * [`Error::NotInTransaction`] when `tx` is not in a transaction block. Nothing was
    ///   locked.
    /// * [`Error::Standby`] when the server is in recovery. Nothing was locked.
    /// * [`Error::Database`] when the server refused the statement (the transaction had
    ///   already failed, for one); [`Error::LockTableFull`] when its lock table is full.
    /// * [`Error::Connection`] when the connection broke.
    ///
    /// # Cancel safety
    ///
    /// Once polled, the message is on its way and the server runs it whatever becomes of this
    /// future, before the connection's next statement: a dropped call may leave the lock held
    /// by the transaction (until it ends, like any other), and never leaves anything else.
    ///
    /// # Example
    ///
    /// ```no_run
    /// use pglock::TransactionLock;
    ///
    /// # async fn run(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
    /// let mut tx = pool.begin().await?;
    /// if TransactionLock::exclusive(42_i64).try_acquire(&mut tx).await? {
    ///     // ... this transaction is the one doing it ...
    /// }
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub async fn try_acquire(&self, tx: &mut PgConnection) -> Result<bool> {
        self.run(tx, self.try_statement()).await
    }

    /// Sends one message and reads its last statement's answer: granted, refused (`false`), or
    /// `NULL` on a standby.
    async fn run(&self, tx: &mut PgConnection, sql: String) -> Result<bool> {
        // The text interpolates only integers computed here (see `args`), never caller text.
        let rows = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .fetch_all(tx)
            .await
            .map_err(|err| self.failure(err))?;
        let granted = rows
            .last()
            .map(|row| row.try_get::<Option<bool>, _>(0))
            .transpose()
            .map_err(|err| self.failure(err))?
            .flatten();
        granted.ok_or_else(|| Error::Standby {
            key: self.key.clone(),
        })
    }

    /// The message of a wait without a deadline of ours: the hand-written statement.
    fn wait_statement(&self) -> String {
        let lock = self.function(false);
        format!(
            "{IN_TRANSACTION}SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
             ELSE {lock}({})::pg_catalog.text OPERATOR(pg_catalog.=) '' END",
            self.args()
        )
    }

    /// The message of a non-blocking try.
    fn try_statement(&self) -> String {
        format!("{IN_TRANSACTION}{}", self.try_select())
    }

    /// A try of the lock, `NULL` on a standby; also the answer of a bounded wait (see there).
    fn try_select(&self) -> String {
        let try_lock = self.function(true);
        format!(
            "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL ELSE {try_lock}({}) END",
            self.args()
        )
    }

    /// The message of a wait the server ends after `ms` milliseconds (0: no limit).
    ///
    /// The wait runs in a PL/pgSQL block with an exception handler, which is a savepoint: a
    /// `lock_timeout` error rolls the block back, undoing the `SET LOCAL` with it, and the
    /// transaction goes on. A granted wait commits the block, and `SET LOCAL` would outlive
    /// it, so the block restores the previous value itself. Whether the lock is now held is
    /// read by a try of the same lock after the block (it stacks when held; when the holder
    /// let go meanwhile, it takes the lock, which is what the caller asked for). All in one
    /// message, so a dropped future cannot leave the transaction halfway.
    fn bounded_wait_statement(&self, ms: u128) -> String {
        let lock = self.function(false);
        let args = self.args();
        format!(
            "{IN_TRANSACTION}DO $pglock$ \
             DECLARE previous pg_catalog.text := pg_catalog.current_setting('lock_timeout'); \
             BEGIN \
               IF pg_catalog.pg_is_in_recovery() THEN RETURN; END IF; \
               PERFORM pg_catalog.set_config('lock_timeout', '{ms}', true); \
               PERFORM {lock}({args}); \
               PERFORM pg_catalog.set_config('lock_timeout', previous, true); \
             EXCEPTION WHEN lock_not_available THEN NULL; \
             END $pglock$; {}",
            self.try_select()
        )
    }

    fn function(&self, try_only: bool) -> String {
        let try_prefix = if try_only { "try_" } else { "" };
        let suffix = match self.mode {
            LockMode::Exclusive => "",
            LockMode::Shared => "_shared",
        };
        format!("pg_catalog.pg_{try_prefix}advisory_xact_lock{suffix}")
    }

    /// The lock function's arguments as typed literals (quoted, so `i64::MIN` parses).
    fn args(&self) -> String {
        match self.key.target() {
            LockTarget::BigInt(id) => format!("'{id}'::bigint"),
            LockTarget::IntPair(a, b) => format!("'{a}'::integer, '{b}'::integer"),
        }
    }

    fn failure(&self, err: sqlx::Error) -> Error {
        if has_sqlstate(&err, NO_ACTIVE_TRANSACTION) {
            return Error::NotInTransaction {
                key: self.key.clone(),
            };
        }
        statement_error(&self.key, err)
    }
}

/// Starts every message: `SAVEPOINT` is refused outside a transaction block (SQLSTATE 25P01),
/// implicit ones included, so a lock is never taken where it would be released at once.
const IN_TRANSACTION: &str =
    "SAVEPOINT pglock_in_transaction; RELEASE SAVEPOINT pglock_in_transaction; ";

/// `lock_timeout` for a deadline: `None` for a deadline of zero (a try), whole milliseconds
/// rounded up otherwise, and 0 (no limit) past PostgreSQL's largest.
fn lock_timeout_ms(timeout: Duration) -> Option<u128> {
    if timeout.is_zero() {
        return None;
    }
    let ms = whole_ms(timeout);
    Some(if ms > MAX_LOCK_TIMEOUT_MS { 0 } else { ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_become_whole_milliseconds() {
        assert_eq!(lock_timeout_ms(Duration::ZERO), None);
        assert_eq!(lock_timeout_ms(Duration::from_nanos(1)), Some(1));
        assert_eq!(lock_timeout_ms(Duration::from_micros(1500)), Some(2));
        assert_eq!(lock_timeout_ms(Duration::from_secs(2)), Some(2000));
        assert_eq!(lock_timeout_ms(Duration::MAX), Some(0));
    }

    #[test]
    fn statements_name_the_function_of_the_mode_and_key_space() {
        let pair = TransactionLock::shared(LockKey::pair(-1, 2));
        assert!(
            pair.try_statement().contains(
                "pg_catalog.pg_try_advisory_xact_lock_shared('-1'::integer, '2'::integer)"
            )
        );
        let id = TransactionLock::exclusive(i64::MIN);
        assert!(
            id.wait_statement()
                .contains("pg_catalog.pg_advisory_xact_lock('-9223372036854775808'::bigint)")
        );
        let bounded = id.bounded_wait_statement(250);
        assert_eq!(bounded.matches(IN_TRANSACTION).count(), 1, "{bounded}");
        assert!(bounded.ends_with(
            "ELSE pg_catalog.pg_try_advisory_xact_lock('-9223372036854775808'::bigint) END"
        ));
    }
}
