//! The error of scheduled jobs.

use std::time::Duration;

/// A `Result` whose error is the scheduled jobs' [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`ScheduledJob`](super::ScheduledJob) call failed. A busy job is not an error but a
/// [`Skip`](super::Skip).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The job's lock failed: it could not be asked for, or it went while the body ran
    /// ([`crate::Error::LockLost`]: the body was cancelled).
    #[error(transparent)]
    Lock(#[from] crate::Error),

    /// The job was configured with settings that cannot work (see
    /// [`build`](super::ScheduledJobBuilder::build)).
    #[error("Invalid schedule for job '{job}': {reason}")]
    InvalidSchedule {
        /// The job's name, as given.
        job: String,
        /// What is wrong, with the values involved.
        reason: String,
    },

    /// The role lacks a privilege the job's table needs, or may not create the missing table
    /// ([`PostgresJobStore`](super::PostgresJobStore)).
    /// Create it in your migrations with [`JobTable::ddl`](super::JobTable::ddl) and grant
    /// `SELECT, INSERT, UPDATE` on it.
    #[error("Scheduled job '{job}': permission denied: the role needs {privilege} on {object}")]
    PermissionDenied {
        /// The job's name.
        job: String,
        /// The object, such as `table "pglock_scheduled_jobs"` or `schema "public"`.
        object: String,
        /// The privilege, such as `INSERT, UPDATE` or `CREATE`.
        privilege: String,
    },

    /// The job's store could not be prepared, read or written.
    #[error("Scheduled job '{job}' could not {operation}: {source}")]
    Storage {
        /// The job's name.
        job: String,
        /// What was being done, such as `claim a window`.
        operation: &'static str,
        /// The store's error: for [`PostgresJobStore`](super::PostgresJobStore), a
        /// [`sqlx::Error`].
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// The body ran for its whole hold and was cut off (its future dropped). The window did
    /// not complete and may run again.
    #[error("Scheduled job '{job}' was cut off after its hold of {hold:?}")]
    Overran {
        /// The job's name.
        job: String,
        /// The hold it ran for: the max hold, plus what the run's extensions added.
        hold: Duration,
    },

    /// [`JobRun::extend`](super::JobRun::extend) was called for a run that is over: its body
    /// returned or was cut off, or its claim expired and was taken over.
    #[error("Scheduled job '{job}': run {run} is over, its hold cannot be extended")]
    NotRunning {
        /// The job's name.
        job: String,
        /// The run number.
        run: i64,
    },
}

crate::error::lock_error_conversions!(Error);
