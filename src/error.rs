//! The lock error type.

use std::fmt;
use std::time::Duration;

use crate::{LockKey, LossCause};

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a lock operation failed: the error of every [`LockManager`](crate::LockManager) and
/// [`TransactionLock`](crate::TransactionLock) operation.
///
/// Every variant concerns one lock and carries its key ([`Error::key`]), so a log line alone
/// says which lock failed. The recipes built on locks have errors of their own that wrap this
/// one ([`leader::Error`](crate::leader::Error), [`schedule::Error`](crate::schedule::Error),
/// [`fence::Error`](crate::fence::Error)), so a caller of `acquire` matches lock failures
/// only. The enum is `#[non_exhaustive]`: match the variants you handle and keep a fallback
/// arm.
///
/// # What to do about each
///
/// | variant | meaning | typical reaction |
/// | --- | --- | --- |
/// | [`Timeout`](Error::Timeout) | the caller's deadline passed, at whatever stage the acquisition was (the local queue, getting a connection, the server's queue) | skip this round, or retry later |
/// | [`Reentrant`](Error::Reentrant) | the caller asked for a key inside its own critical section for that key | pass the [`LockInfo`](crate::LockInfo) down instead of locking again |
/// | [`Deadlock`](Error::Deadlock) | waiting would close a cycle of callers, each in a critical section waiting for the next one's key | let the section end (its locks go), then retry; take keys in one order, or all at once |
/// | [`BudgetExhausted`](Error::BudgetExhausted) | the manager holds as many locks as its budget allows; nothing was asked of the server | release locks, or raise the budget on purpose (see the manager's docs) |
/// | [`LockTableFull`](Error::LockTableFull) | the server's shared lock table is full (SQLSTATE 53200) | every session of the database is short of locks: release some, lower budgets, or raise `max_locks_per_transaction` |
/// | [`PoolExhausted`](Error::PoolExhausted) | with no deadline, every pooled connection stayed busy for the pool's `acquire_timeout` | give the lock manager room in the pool, or a pool of its own |
/// | [`PoolClosed`](Error::PoolClosed) | the pool was closed | the application is shutting down |
/// | [`TooManyConnections`](Error::TooManyConnections) | the server refused a new connection: too many clients | lower the pools' sizes, or raise the server's `max_connections` |
/// | [`PermissionDenied`](Error::PermissionDenied) | the role lacks a privilege on a table pglock uses | grant it (the error names the object and the privilege), or create the table in your migrations |
/// | [`UnsupportedServer`](Error::UnsupportedServer) | the server's advisory locks do not exclude (an engine that only looks like PostgreSQL, a pool spread over several servers) | point the lock pool at one PostgreSQL primary; the error names what was found |
/// | [`TransactionPooling`](Error::TransactionPooling) | the pool goes through a transaction-pooling proxy | connect the lock pool directly or in session mode, or use [`TransactionLock`](crate::TransactionLock) |
/// | [`Standby`](Error::Standby) | the pool points at a standby | point the lock pool at the primary |
/// | [`NotInTransaction`](Error::NotInTransaction) | a [`TransactionLock`](crate::TransactionLock) on a connection in autocommit | begin a transaction and lock on it |
/// | [`Database`](Error::Database) | the server refused the lock statement | inspect the message; often a server-side `statement_timeout` |
/// | [`Connection`](Error::Connection) | no session could be opened or it broke | the database is unreachable; retry with backoff |
/// | [`NotHeld`](Error::NotHeld) | `release` of a key this manager does not hold | a bookkeeping bug in the caller, or the lock was already released |
/// | [`ReleaseFailed`](Error::ReleaseFailed) | the server did not confirm the unlock | nothing to undo: the session was closed, which frees the lock on the server |
/// | [`LockLost`](Error::LockLost) | the lock went while held: lost, or released through the manager | work done under it may have overlapped another holder's; stop, and re-check before acting on its results (fencing tokens make this safe) |
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The caller's deadline passed before the lock was granted.
    ///
    /// The deadline covers the whole acquisition: waiting for this manager's own turn on the
    /// key, getting a connection, and waiting in the server's queue. Whatever stage it ran out
    /// in, the caller gets this error. A zero timeout makes one attempt and fails with this
    /// error when the key is held.
    ///
    /// Displays as the Python original does: `Failed to acquire lock '{key}': Timeout after
    /// {t}s`, with `t` written as Python writes a float (`0.5`, `1.0`, `0.05`).
    #[error("Failed to acquire lock '{key}': Timeout after {}s", python_float(.timeout))]
    Timeout {
        /// The key that was requested.
        key: LockKey,
        /// The timeout the caller asked for.
        timeout: Duration,
    },

    /// The key was asked for inside the caller's own critical section for it: within the
    /// body of [`with_lock`](crate::LockManagerExt::with_lock) or
    /// [`LockGuard::run`](crate::LockGuard::run) on the same key and the same holder. Waiting
    /// would wait for itself forever, so the call fails at once.
    ///
    /// Sibling futures of one task (`join!`, `select!`, `for_each_concurrent`, ...) are not
    /// nested: they queue for the key like any other caller.
    #[error(
        "Lock '{key}' is already held by the calling critical section; waiting for it would never end"
    )]
    Reentrant {
        /// The key that was requested.
        key: LockKey,
    },

    /// Waiting for the key would close a lock-order cycle: each caller on it is inside a
    /// critical section ([`with_lock`](crate::LockManagerExt::with_lock),
    /// [`LockGuard::run`](crate::LockGuard::run)) and waits for a key a section of the next
    /// one holds, so none of them could ever go on. The caller that would close the cycle
    /// fails, at once, and the others proceed once its sections end.
    ///
    /// Only sections are seen: a guard kept in a variable holds its key unseen.
    #[error("Waiting for lock '{key}' would deadlock: a cycle of waits through {}", cycle_text(.cycle))]
    Deadlock {
        /// The key that was requested.
        key: LockKey,
        /// The keys waited for around the cycle, starting with `key`.
        cycle: Vec<LockKey>,
    },

    /// A release named a key this manager does not hold.
    ///
    /// Displays as the Python original does: `Lock '{key}' is not held by this session`.
    #[error("Lock '{key}' is not held by this session")]
    NotHeld {
        /// The key that was named.
        key: LockKey,
    },

    /// The lock went while it was held: the manager declared it lost, or it was released
    /// through the manager ([`release`](crate::LockManagerExt::release),
    /// [`release_all`](crate::LockManager::release_all)) rather than through its guard.
    ///
    /// Returned by the release of such a lock, and by
    /// [`with_lock`](crate::LockManagerExt::with_lock) and [`LockGuard::run`](crate::LockGuard::run)
    /// when it cut their body short. The [`cause`](LossCause) says which.
    #[error("Lock '{key}' was lost: {cause}")]
    LockLost {
        /// The key of the lost lock.
        key: LockKey,
        /// Why the lock went.
        cause: LossCause,
    },

    /// The manager already holds as many locks as its budget allows, so it refused to take
    /// another before asking the server.
    ///
    /// The budget keeps one manager from filling the server's shared lock table, which every
    /// session of the database needs (see
    /// [`PostgresLockManagerBuilder::lock_budget`](crate::PostgresLockManagerBuilder::lock_budget)).
    #[error(
        "Failed to acquire lock '{key}': this manager holds {held} locks, its budget; \
         release some, or raise the budget on purpose"
    )]
    BudgetExhausted {
        /// The key that was requested.
        key: LockKey,
        /// Locks the manager held (or was taking) when it refused.
        held: usize,
        /// The manager's budget.
        budget: usize,
    },

    /// The server's shared lock table is full (SQLSTATE 53200, "out of shared memory"). It is
    /// shared by every session of the database, so other clients are short of locks too.
    #[error(
        "Failed to acquire lock '{key}': the server's shared lock table is full \
         (max_locks_per_transaction); {source}"
    )]
    LockTableFull {
        /// The key that was requested.
        key: LockKey,
        /// The server's error.
        #[source]
        source: sqlx::Error,
    },

    /// With no deadline of the caller's, every connection of the pool stayed checked out for
    /// the pool's `acquire_timeout`, which bounds getting a connection then.
    ///
    /// A manager needs a few connections of its pool, at most its
    /// [`max_connections`](crate::PostgresLockManagerBuilder::max_connections): its lock
    /// sessions, and its waits in the server's queue (see the manager's documentation on pool
    /// sizing).
    #[error(
        "Failed to acquire lock '{key}': connection pool exhausted \
         (all {max_connections} connections in use, waited {waited:?})"
    )]
    PoolExhausted {
        /// The key that was requested.
        key: LockKey,
        /// The pool's `max_connections`.
        max_connections: u32,
        /// How long the checkout waited before giving up.
        waited: Duration,
    },

    /// The pool was closed ([`sqlx::Pool::close`]), so no session can be had from it.
    #[error("Failed to acquire lock '{key}': the connection pool is closed")]
    PoolClosed {
        /// The key that was requested.
        key: LockKey,
    },

    /// The server refused a new connection because it serves as many clients as it allows
    /// (SQLSTATE 53300, `max_connections`).
    #[error("Failed to acquire lock '{key}': the server refused a new connection: {reason}")]
    TooManyConnections {
        /// The key that was requested.
        key: LockKey,
        /// The server's message.
        reason: String,
    },

    /// The role lacks a privilege that a table pglock uses needs (SQLSTATE 42501), or may not
    /// create it where it is missing. Nothing was taken.
    ///
    /// Create the table in your own migrations and grant the privilege named here; each
    /// table's documentation lists the exact grants.
    #[error(
        "Failed to acquire lock '{key}': permission denied: the role needs {privilege} on \
         {object}"
    )]
    PermissionDenied {
        /// The key that was requested.
        key: LockKey,
        /// The object, such as `table "pglock_fencing_tokens"` or `schema "public"`.
        object: String,
        /// The privilege, such as `INSERT, UPDATE` or `CREATE`.
        privilege: String,
        /// The server's error, when it reported one.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The server is a standby (in recovery) and the manager refuses to take locks there.
    ///
    /// Advisory locks are not replicated: a lock granted by a standby excludes nothing on the
    /// primary or on other standbys. Point the lock manager's pool at the primary.
    #[error(
        "Failed to acquire lock '{key}': the server is a standby (in recovery); advisory locks \
         taken there exclude nothing on the primary. Point the lock pool at the primary."
    )]
    Standby {
        /// The key that was requested.
        key: LockKey,
    },

    /// The server's advisory locks cannot be trusted to exclude, so the manager refuses to
    /// take locks there. Found once per manager, at the first lock session's set-up (or by
    /// [`check_server`](crate::PostgresLockManager::check_server)): an engine refused by name
    /// (CockroachDB, YugabyteDB with its advisory locks silenced, a Citus node other than the
    /// coordinator), a server without session advisory locks, or a proof that failed: a salted
    /// lock held by one session was taken by a second session of the same pool. Nothing was
    /// taken, and retrying does not help.
    #[error(
        "Failed to acquire lock '{key}': the server cannot be trusted to exclude: {found}. {advice}"
    )]
    UnsupportedServer {
        /// The key that was requested.
        key: LockKey,
        /// What was found.
        found: String,
        /// What to do instead.
        advice: String,
    },

    /// The pool's connections go through a transaction-pooling proxy (such as PgBouncer with
    /// `pool_mode = transaction`): consecutive statements of one connection ran on different
    /// server sessions. Nothing was taken.
    #[error(
        "Failed to acquire lock '{key}': the connection's statements run on different server \
         sessions (a transaction-pooling proxy such as PgBouncer in transaction mode); session \
         locks need a session of their own. Connect the lock pool directly or in session \
         pooling mode, or use transaction-scoped locks."
    )]
    TransactionPooling {
        /// The key that was requested.
        key: LockKey,
    },

    /// A [`TransactionLock`](crate::TransactionLock) was asked of a connection that is not in a
    /// transaction block, where the lock would be released as soon as it was granted.
    #[error(
        "Failed to acquire lock '{key}': the connection is not in a transaction, where a \
         transaction lock would be released at once. Begin a transaction and lock on it."
    )]
    NotInTransaction {
        /// The key that was requested.
        key: LockKey,
    },

    /// The server refused the lock statement; the session goes on.
    ///
    /// Displays as the Python original does: `Failed to acquire lock '{key}': Database error:
    /// {message}`.
    #[error("Failed to acquire lock '{key}': Database error: {source}")]
    Database {
        /// The key that was requested.
        key: LockKey,
        /// The server's error.
        #[source]
        source: sqlx::Error,
    },

    /// No database session could be opened, or the session broke mid-operation.
    #[error("Failed to acquire lock '{key}': connection failed: {reason}")]
    Connection {
        /// The key that was requested.
        key: LockKey,
        /// A one-line description.
        reason: String,
        /// The driver error, when one was reported.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The server did not confirm an unlock.
    ///
    /// The session that held the lock has been closed rather than returned to the pool, so the
    /// server frees the lock as soon as it notices the session is gone. Nothing is left for the
    /// caller to undo; the error says that the release could not be *confirmed*.
    #[error("Failed to release lock '{key}': {reason}")]
    ReleaseFailed {
        /// The key that was being released.
        key: LockKey,
        /// Why the release is unconfirmed.
        reason: ReleaseFailure,
        /// The driver error, when one was reported.
        #[source]
        source: Option<sqlx::Error>,
    },
}

impl Error {
    /// The key of the lock this error concerns.
    pub fn key(&self) -> &LockKey {
        match self {
            Error::Timeout { key, .. }
            | Error::Reentrant { key }
            | Error::Deadlock { key, .. }
            | Error::NotHeld { key }
            | Error::LockLost { key, .. }
            | Error::BudgetExhausted { key, .. }
            | Error::LockTableFull { key, .. }
            | Error::PoolExhausted { key, .. }
            | Error::PoolClosed { key }
            | Error::TooManyConnections { key, .. }
            | Error::PermissionDenied { key, .. }
            | Error::Standby { key }
            | Error::TransactionPooling { key }
            | Error::UnsupportedServer { key, .. }
            | Error::NotInTransaction { key }
            | Error::Database { key, .. }
            | Error::Connection { key, .. }
            | Error::ReleaseFailed { key, .. } => key,
        }
    }

    /// True for [`Error::Timeout`]: the deadline passed while the lock was busy.
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True for [`Error::Deadlock`]: waiting would have closed a lock-order cycle.
    pub fn is_deadlock(&self) -> bool {
        matches!(self, Error::Deadlock { .. })
    }

    /// True for [`Error::LockLost`]: the lock went while it was held.
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::LockLost { .. })
    }
}

/// What every recipe's error whose `Lock` variant carries the lock's [`Error`] has, the same
/// on each ([`leader::Error`](crate::leader::Error),
/// [`schedule::Error`](crate::schedule::Error)): the lock's error when it is one, the two
/// questions a caller asks of it, and a fallible conversion for code that mixes them with
/// lock calls.
macro_rules! lock_error_conversions {
    ($error:ident) => {
        impl $error {
            /// The lock's error, when the lock is what failed.
            pub fn lock_error(&self) -> Option<&$crate::Error> {
                match self {
                    $error::Lock(err) => Some(err),
                    _ => None,
                }
            }

            /// True when the lock went while it was held ([`crate::Error::is_lost`]).
            pub fn is_lost(&self) -> bool {
                self.lock_error().is_some_and($crate::Error::is_lost)
            }

            /// True when the caller's deadline passed first ([`crate::Error::is_timeout`]).
            pub fn is_timeout(&self) -> bool {
                self.lock_error().is_some_and($crate::Error::is_timeout)
            }
        }

        /// The lock's error, for code whose own error is [`crate::Error`]; any other failure
        /// is handed back.
        impl TryFrom<$error> for $crate::Error {
            type Error = $error;

            fn try_from(err: $error) -> std::result::Result<Self, $error> {
                match err {
                    $error::Lock(err) => Ok(err),
                    other => Err(other),
                }
            }
        }
    };
}
pub(crate) use lock_error_conversions;

/// Why a release could not be confirmed; the `reason` of [`Error::ReleaseFailed`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseFailure {
    /// `pg_advisory_unlock` returned false: the session no longer held the lock.
    NotHeldOnServer,
    /// The unlock statement failed. Carries the driver's message.
    Database(String),
    /// The server did not answer the unlock within the release timeout.
    Timeout(Duration),
    /// The session holding the lock had already closed (its connection broke, or an earlier
    /// statement on it went unanswered), which frees the lock on the server.
    SessionClosed,
    /// The unlock ran on another server session than the lock's: the connection goes through a
    /// transaction-pooling proxy, and the lock stays with the proxy's server session until that
    /// session ends.
    TransactionPooling,
}

impl fmt::Display for ReleaseFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReleaseFailure::NotHeldOnServer => {
                f.write_str("the server reports that the session no longer held the lock")
            }
            ReleaseFailure::Database(message) => write!(f, "Database error: {message}"),
            ReleaseFailure::Timeout(t) => {
                write!(f, "no answer to the unlock within {}s", python_float(t))
            }
            ReleaseFailure::SessionClosed => f.write_str("the session holding the lock had closed"),
            ReleaseFailure::TransactionPooling => f.write_str(
                "the unlock ran on another server session (a transaction-pooling proxy); the lock \
                 stays with the proxy's session until it ends",
            ),
        }
    }
}

/// A configured SQL name (a table, schema or column) that cannot be used.
///
/// Returned by the constructors that take names: [`FencingTable::new`](crate::FencingTable::new),
/// [`RowFence::new`](crate::fence::RowFence::new) and the scheduled jobs' table. Names are
/// quoted as identifiers, so any character but NUL is allowed; what is refused is an empty
/// part, a part longer than PostgreSQL's 63 bytes, or more parts than `schema.table`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Invalid identifier {name:?}: {reason}")]
pub struct InvalidIdentifier {
    /// The name as given.
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

/// Formats seconds the way Python's `repr(float)` does: shortest round-trip digits, always a
/// decimal point, and exponent notation (with a two-digit exponent) outside `1e-4 ..= 1e16`.
pub(crate) fn python_float(duration: &Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs != 0.0 && !(1e-4..1e16).contains(&secs) {
        // Rust writes `5e-8`; Python writes `5e-08`.
        let rust = format!("{secs:e}");
        let (mantissa, exponent) = rust.split_once('e').expect("`{:e}` always has an exponent");
        let exponent: i32 = exponent.parse().expect("integer exponent");
        let sign = if exponent < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exponent.abs());
    }
    let plain = format!("{secs}");
    if plain.contains('.') {
        plain
    } else {
        format!("{plain}.0")
    }
}

/// The keys of a cycle, as `'a' -> 'b' -> 'a'`.
fn cycle_text(cycle: &[LockKey]) -> String {
    let mut text: Vec<String> = cycle.iter().map(|k| format!("'{k}'")).collect();
    if let Some(first) = text.first().cloned() {
        text.push(first);
    }
    text.join(" -> ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeouts_print_like_python_floats() {
        // Each expectation is what `print(f"{x}")` gives in CPython for the same float.
        let cases = [
            (Duration::from_millis(500), "0.5"),
            (Duration::from_secs(1), "1.0"),
            (Duration::ZERO, "0.0"),
            (Duration::from_millis(50), "0.05"),
            (Duration::from_millis(250), "0.25"),
            (Duration::from_secs(90), "90.0"),
            (Duration::from_nanos(50), "5e-08"),
            (Duration::from_micros(100), "0.0001"),
        ];
        for (duration, expected) in cases {
            assert_eq!(python_float(&duration), expected, "{duration:?}");
        }
    }

    #[test]
    fn messages_match_the_python_original() {
        let err = Error::Timeout {
            key: "cutover:t1".into(),
            timeout: Duration::from_millis(500),
        };
        assert_eq!(
            err.to_string(),
            "Failed to acquire lock 'cutover:t1': Timeout after 0.5s"
        );
        assert!(err.is_timeout());
        assert_eq!(err.key(), "cutover:t1");
        let err = Error::NotHeld { key: "k".into() };
        assert_eq!(err.to_string(), "Lock 'k' is not held by this session");
    }
}
