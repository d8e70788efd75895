//! The crate's error type.

use std::fmt;
use std::time::Duration;

use crate::LossCause;

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in `pglock`.
///
/// Variants about one lock carry its key, so a log line alone says which lock failed;
/// [`Error::key`] returns it when there is one.
/// The enum is `#[non_exhaustive]`: match the variants you handle and keep a fallback arm.
///
/// # What to do about each
///
/// | variant | meaning | typical reaction |
/// | --- | --- | --- |
/// | [`AcquisitionFailed`](Error::AcquisitionFailed) with [`AcquireFailure::Timeout`] | someone else held the lock until the deadline | skip this round, or retry later |
/// | [`AcquisitionFailed`](Error::AcquisitionFailed) with [`AcquireFailure::Database`] | the server refused the statement | inspect the message; often a server-side `lock_timeout` or `statement_timeout` |
/// | [`PoolExhausted`](Error::PoolExhausted) | every pooled connection was busy until the deadline | give the lock manager room in the pool (see the manager's pool sizing), or a pool of its own |
/// | [`PoolClosed`](Error::PoolClosed) | the pool was closed | the application is shutting down |
/// | [`TooManyConnections`](Error::TooManyConnections) | the server refused a new connection: too many clients | lower the pools' sizes, or raise the server's `max_connections` |
/// | [`TransactionPooling`](Error::TransactionPooling) | the pool goes through a transaction-pooling proxy | connect the lock pool directly or in session mode, or use transaction-scoped locks |
/// | [`Standby`](Error::Standby) | the pool points at a standby | point the lock pool at the primary |
/// | [`NotInTransaction`](Error::NotInTransaction) | a [`TransactionLock`](crate::TransactionLock) on a connection in autocommit | begin a transaction and lock on it |
/// | [`Connection`](Error::Connection) | no session could be opened or it broke | the database is unreachable; retry with backoff |
/// | [`Reentrant`](Error::Reentrant) | the calling task already holds the key | release it first; only other tasks queue for a held key |
/// | [`NotHeld`](Error::NotHeld) | `release` of a key this manager does not hold | a bookkeeping bug in the caller, or the lock was already released |
/// | [`ReleaseFailed`](Error::ReleaseFailed) | the server did not confirm the unlock | nothing to undo: the session was closed, which frees the lock on the server |
/// | [`LockLost`](Error::LockLost) | the lock was lost while held | work done under it may have overlapped another holder's; stop, and re-check before acting on its results (fencing tokens make this safe) |
/// | [`StaleFencingToken`](Error::StaleFencingToken) | a newer lock holder has claimed the row | stop: this holder's lock is gone; do not count the work as done |
/// | [`FenceNotRaised`](Error::FenceNotRaised), [`FencedRowNotFound`](Error::FencedRowNotFound) | a write without its raise, or a missing row | a bug in the caller, or the row was never created |
/// | [`FencingFailed`](Error::FencingFailed) | a fenced-row statement failed | inspect the message (a wrong column, a lost connection); retry if transient |
/// | [`InspectionFailed`](Error::InspectionFailed) | [`inspect`](crate::inspect) could not read the server's lock views | the database is unreachable, or the query was refused; retry later |
/// | [`InvalidIdentifier`](Error::InvalidIdentifier) | a configured table, schema or column name is unusable | fix the configuration |
/// | [`ElectionStopped`](Error::ElectionStopped) | a [`LeaderElection`](crate::LeaderElection) was asked to lead after it stopped | start a new election |
/// | [`InvalidSchedule`](Error::InvalidSchedule) | a scheduled job's settings cannot work | fix the configuration |
/// | [`JobStorage`](Error::JobStorage) | a scheduled job's table could not be created, read or written | the database is unreachable or refused; the next tick tries again |
/// | [`JobOverran`](Error::JobOverran) | a scheduled job's body outlived its max hold and was cut off | raise the max hold, or make the job shorter; the window may run again |
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The lock was not acquired: the deadline passed first, or the database refused.
    ///
    /// Displays as `Failed to acquire lock '{key}': {reason}`, with the reasons of the Python
    /// original: `Timeout after {t}s` and `Database error: {e}`.
    #[error("Failed to acquire lock '{key}': {reason}")]
    AcquisitionFailed {
        /// The key that was requested.
        key: String,
        /// Why the lock was not acquired.
        reason: AcquireFailure,
        /// The timeout the caller asked for, if any.
        timeout: Option<Duration>,
        /// The driver error behind a [`AcquireFailure::Database`] reason.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// The calling task asked for a key it holds already, which would wait for itself forever.
    ///
    /// Release the lock first, or pass the guard's [`LockInfo`](crate::LockInfo) to the code
    /// that needs it. Other tasks asking for the key wait, within their deadline, as usual.
    #[error("Lock '{key}' is already held by this task; waiting for it would never end")]
    Reentrant {
        /// The key that was requested.
        key: String,
    },

    /// A release named a key this manager does not hold.
    ///
    /// Displays as `Lock '{key}' is not held by this session`.
    #[error("Lock '{key}' is not held by this session")]
    NotHeld {
        /// The key that was named.
        key: String,
    },

    /// Every connection of the pool stayed checked out until the deadline.
    ///
    /// A manager needs a few connections of its pool: its lock sessions, and one per key it
    /// waits for on the server (see the manager's documentation on pool sizing).
    #[error(
        "Failed to acquire lock '{key}': connection pool exhausted \
         (all {max_connections} connections in use, waited {waited:?})"
    )]
    PoolExhausted {
        /// The key that was requested.
        key: String,
        /// The pool's `max_connections`.
        max_connections: u32,
        /// How long the checkout waited before giving up.
        waited: Duration,
    },

    /// The pool was closed ([`sqlx::Pool::close`]), so no session can be had from it.
    #[error("Failed to acquire lock '{key}': the connection pool is closed")]
    PoolClosed {
        /// The key that was requested.
        key: String,
    },

    /// The server refused a new connection because it serves as many clients as it allows
    /// (SQLSTATE 53300, `max_connections`).
    ///
    /// Every pool of every process counts against that limit: lower the pools' sizes, or raise
    /// the server's `max_connections`.
    #[error("Failed to acquire lock '{key}': the server refused a new connection: {reason}")]
    TooManyConnections {
        /// The key that was requested.
        key: String,
        /// The server's message.
        reason: String,
    },

    /// The server is a standby (in recovery) and the manager refuses to take locks there.
    ///
    /// Advisory locks are not replicated: a lock granted by a standby excludes nothing on the
    /// primary or on other standbys, so two holders could both believe they hold the key. Point
    /// the lock manager's pool at the primary (a read-write endpoint).
    #[error(
        "Failed to acquire lock '{key}': the server is a standby (in recovery); advisory locks \
         taken there exclude nothing on the primary. Point the lock pool at the primary."
    )]
    Standby {
        /// The key that was requested.
        key: String,
    },

    /// The pool's connections go through a transaction-pooling proxy (such as PgBouncer with
    /// `pool_mode = transaction`): consecutive statements of one connection ran on different
    /// server sessions. Nothing was taken.
    ///
    /// A session advisory lock belongs to the server session that took it, so it cannot work
    /// through such a proxy. Point the lock manager's pool at PostgreSQL directly or at a
    /// session-pooling proxy, or use transaction-scoped locks on your own transactions.
    #[error(
        "Failed to acquire lock '{key}': the connection's statements run on different server \
         sessions (a transaction-pooling proxy such as PgBouncer in transaction mode); session \
         locks need a session of their own. Connect the lock pool directly or in session \
         pooling mode, or use transaction-scoped locks."
    )]
    TransactionPooling {
        /// The key that was requested.
        key: String,
    },

    /// A [`TransactionLock`](crate::TransactionLock) was asked of a connection that is not in a
    /// transaction block. In autocommit, a transaction-scoped lock would be released as soon
    /// as it was granted, so nothing was locked.
    #[error(
        "Failed to acquire lock '{key}': the connection is not in a transaction, where a \
         transaction lock would be released at once. Begin a transaction and lock on it."
    )]
    NotInTransaction {
        /// The key that was requested.
        key: String,
    },

    /// No database session could be opened, or the session broke mid-operation.
    #[error("Failed to acquire lock '{key}': connection failed: {reason}")]
    Connection {
        /// The key that was requested.
        key: String,
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
        key: String,
        /// Why the release is unconfirmed.
        reason: ReleaseFailure,
        /// The driver error, when one was reported.
        #[source]
        source: Option<sqlx::Error>,
    },

    /// A configured SQL identifier (a fencing table or schema name) is not usable.
    #[error("Invalid identifier {name:?}: {reason}")]
    InvalidIdentifier {
        /// The name as given.
        name: String,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A [`RowFence`](crate::RowFence) refused a holder: the row's fence already holds a
    /// higher fencing token, so a newer holder has claimed the row and this holder's lock is
    /// gone. Nothing was changed.
    #[error("Stale fencing token {token} for row {row} of {resource}: its fence is at {fence}")]
    StaleFencingToken {
        /// The fenced table.
        resource: String,
        /// The row's key, as displayed.
        row: String,
        /// The token that was presented.
        token: i64,
        /// The higher token the row's fence holds.
        fence: i64,
    },

    /// A [`RowFence::write`](crate::RowFence::write) found the row's fence below its token or
    /// unset: the row was not raised with this token before the write, a bug in the caller.
    /// Nothing was written.
    #[error(
        "Row {row} of {resource} is not fenced with token {token} (its fence is {}): \
         raise the fence before writing",
        crate::error::or_unset(.fence)
    )]
    FenceNotRaised {
        /// The fenced table.
        resource: String,
        /// The row's key, as displayed.
        row: String,
        /// The token that was presented.
        token: i64,
        /// The row's fence, `None` when it was never raised.
        fence: Option<i64>,
    },

    /// A [`RowFence`](crate::RowFence) found no row with the given key.
    #[error("No row {row} in fenced table {resource}")]
    FencedRowNotFound {
        /// The fenced table.
        resource: String,
        /// The key that was looked for, as displayed.
        row: String,
    },

    /// A statement of a [`RowFence`](crate::RowFence) failed, or its row did not decode.
    #[error("Fencing on {resource} failed to {operation}: {source}")]
    FencingFailed {
        /// The fenced table.
        resource: String,
        /// What was being done, such as `raise the fence`.
        operation: &'static str,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },

    /// The lock was lost while it was held.
    ///
    /// Returned by the release of a lock that had been declared lost, and by
    /// [`LockManagerExt::with_lock`](crate::LockManagerExt::with_lock) when the loss cut its body
    /// short.
    #[error("Lock '{key}' was lost: {cause}")]
    LockLost {
        /// The key of the lost lock.
        key: String,
        /// Why it was declared lost.
        cause: LossCause,
    },

    /// A query of [`inspect`](crate::inspect) failed: the server could not be reached, or
    /// refused it.
    #[error("Lock inspection failed{}: {source}", for_key(.key))]
    InspectionFailed {
        /// The key that was inspected, when one was.
        key: Option<String>,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },

    /// A [`ScheduledJob`](crate::schedule::ScheduledJob) was configured with settings that
    /// cannot work (see [`build`](crate::schedule::ScheduledJobBuilder::build)).
    #[error("Invalid schedule for job '{job}': {reason}")]
    InvalidSchedule {
        /// The job's name, as given.
        job: String,
        /// What is wrong, with the values involved.
        reason: String,
    },

    /// A scheduled job's table could not be created, read or written.
    #[error("Scheduled job '{job}' could not {operation}: {source}")]
    JobStorage {
        /// The job's name.
        job: String,
        /// What was being done, such as `claim a window`.
        operation: &'static str,
        /// The driver error.
        #[source]
        source: sqlx::Error,
    },

    /// A scheduled job's body ran for its whole max hold and was cut off (its future
    /// dropped). The window did not complete and may run again.
    #[error("Scheduled job '{job}' was cut off after its max hold of {max_hold:?}")]
    JobOverran {
        /// The job's name.
        job: String,
        /// The max hold it ran for.
        max_hold: Duration,
    },

    /// A [`LeaderElection`](crate::LeaderElection) was asked to lead after it stopped
    /// campaigning, or stopped while its leader work ran: it resigned, or its campaign ended
    /// with the runtime.
    #[error("Leader election on '{key}' has stopped campaigning")]
    ElectionStopped {
        /// The election's lock key, `leader:{name}`.
        key: String,
    },
}

impl Error {
    /// The lock key this error concerns: every variant about one lock has one. The variants
    /// about a configuration, a fenced row or a scheduled job's record
    /// ([`InvalidIdentifier`](Error::InvalidIdentifier), the fencing and the job variants)
    /// have none, and [`InspectionFailed`](Error::InspectionFailed) one when a single key was
    /// inspected.
    pub fn key(&self) -> Option<&str> {
        match self {
            Error::AcquisitionFailed { key, .. }
            | Error::NotHeld { key }
            | Error::Reentrant { key }
            | Error::PoolExhausted { key, .. }
            | Error::PoolClosed { key }
            | Error::TooManyConnections { key, .. }
            | Error::Standby { key }
            | Error::TransactionPooling { key }
            | Error::NotInTransaction { key }
            | Error::Connection { key, .. }
            | Error::ReleaseFailed { key, .. }
            | Error::LockLost { key, .. }
            | Error::ElectionStopped { key } => Some(key),
            Error::InvalidIdentifier { .. }
            | Error::StaleFencingToken { .. }
            | Error::FenceNotRaised { .. }
            | Error::FencedRowNotFound { .. }
            | Error::FencingFailed { .. }
            | Error::InvalidSchedule { .. }
            | Error::JobStorage { .. }
            | Error::JobOverran { .. } => None,
            Error::InspectionFailed { key, .. } => key.as_deref(),
        }
    }

    /// True when the error is an acquisition that ran out of time waiting for another holder.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self,
            Error::AcquisitionFailed {
                reason: AcquireFailure::Timeout(_),
                ..
            }
        )
    }

    pub(crate) fn timeout(key: &str, timeout: Duration) -> Self {
        Error::AcquisitionFailed {
            key: key.to_owned(),
            reason: AcquireFailure::Timeout(timeout),
            timeout: Some(timeout),
            source: None,
        }
    }

    pub(crate) fn database(key: &str, timeout: Option<Duration>, source: sqlx::Error) -> Self {
        Error::AcquisitionFailed {
            key: key.to_owned(),
            reason: AcquireFailure::Database(source.to_string()),
            timeout,
            source: Some(source),
        }
    }
}

/// Why an acquisition failed; the `reason` of [`Error::AcquisitionFailed`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AcquireFailure {
    /// The deadline passed while another holder kept the lock. Carries the requested timeout.
    ///
    /// Displays as `Timeout after {t}s`, with `t` written the way Python writes a float
    /// (`0.5`, `1.0`, `0.05`), so log lines match the Python original's.
    Timeout(Duration),
    /// The database reported an error. Carries the driver's message.
    ///
    /// Displays as `Database error: {message}`.
    Database(String),
}

impl fmt::Display for AcquireFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AcquireFailure::Timeout(t) => write!(f, "Timeout after {}s", python_float(t)),
            AcquireFailure::Database(message) => write!(f, "Database error: {message}"),
        }
    }
}

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

/// A fence for error messages: its token, or `unset`.
fn or_unset(fence: &Option<i64>) -> String {
    fence.map_or_else(|| "unset".to_owned(), |fence| fence.to_string())
}

/// ` for '{key}'`, or nothing.
fn for_key(key: &Option<String>) -> String {
    key.as_ref()
        .map(|key| format!(" for '{key}'"))
        .unwrap_or_default()
}

/// Formats seconds the way Python's `repr(float)` does: shortest round-trip digits, always a
/// decimal point, and exponent notation (with a two-digit exponent) outside `1e-4 ..= 1e16`.
fn python_float(duration: &Duration) -> String {
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
        let err = Error::timeout("cutover:t1", Duration::from_millis(500));
        assert_eq!(
            err.to_string(),
            "Failed to acquire lock 'cutover:t1': Timeout after 0.5s"
        );
        assert!(err.is_timeout());
        assert_eq!(err.key(), Some("cutover:t1"));
        let err = Error::NotHeld { key: "k".into() };
        assert_eq!(err.to_string(), "Lock 'k' is not held by this session");
        let err = Error::InvalidIdentifier {
            name: String::new(),
            reason: "it is empty",
        };
        assert_eq!(err.key(), None, "a configuration error concerns no lock");
        let reason = AcquireFailure::Database("boom".into());
        assert_eq!(reason.to_string(), "Database error: boom");
    }
}
