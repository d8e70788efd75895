//! What a scheduled run reports: the run it made, or why it skipped.

use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::lease::Lease;

/// One claimed window of a [`ScheduledJob`](super::ScheduledJob), as the job's body receives it.
/// A long run extends its hold on the job with [`extend`](JobRun::extend).
///
/// Two runs are equal when their fields are.
#[derive(Clone)]
#[non_exhaustive]
pub struct JobRun {
    /// The job's name.
    pub job: String,
    /// The start of the window this run is for (database time).
    pub window_start: DateTime<Utc>,
    /// The end of that window: its start plus the period.
    pub window_end: DateTime<Utc>,
    /// The run number: how many claims the job has had, this one included. It strictly
    /// increases with every claim of the job, across processes and restarts, so it serves as a
    /// fencing token for what the run writes.
    pub run: i64,
    /// When the window was claimed, by the database's clock.
    pub started_at: DateTime<Utc>,
    /// The holder id of the manager that claimed it.
    pub holder_id: Option<String>,
    /// This process's hold on the job for the run.
    pub(super) lease: Arc<Lease>,
}

impl JobRun {
    fn fields(&self) -> impl PartialEq + '_ {
        (
            &self.job,
            self.window_start,
            self.window_end,
            self.run,
            self.started_at,
            &self.holder_id,
        )
    }
}

impl PartialEq for JobRun {
    fn eq(&self, other: &Self) -> bool {
        self.fields() == other.fields()
    }
}

impl Eq for JobRun {}

impl fmt::Debug for JobRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRun")
            .field("job", &self.job)
            .field("window_start", &self.window_start)
            .field("window_end", &self.window_end)
            .field("run", &self.run)
            .field("started_at", &self.started_at)
            .field("holder_id", &self.holder_id)
            .finish_non_exhaustive()
    }
}

/// What [`ScheduledJob::run`](super::ScheduledJob::run) did.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a skipped run did not run the job"]
#[non_exhaustive]
pub enum RunOutcome<T> {
    /// This process claimed the window and the body ran to completion.
    Ran {
        /// The claimed window.
        run: JobRun,
        /// What the body returned.
        value: T,
    },
    /// The body did not run.
    Skipped {
        /// The window a claim made now would have been for.
        window_start: DateTime<Utc>,
        /// Why not.
        reason: Skip,
    },
}

impl<T> RunOutcome<T> {
    /// True when the body ran.
    pub fn ran(&self) -> bool {
        matches!(self, RunOutcome::Ran { .. })
    }

    /// The run, when the body ran.
    pub fn run(&self) -> Option<&JobRun> {
        match self {
            RunOutcome::Ran { run, .. } => Some(run),
            RunOutcome::Skipped { .. } => None,
        }
    }

    /// Why the body did not run, when it did not.
    pub fn skipped(&self) -> Option<&Skip> {
        match self {
            RunOutcome::Ran { .. } => None,
            RunOutcome::Skipped { reason, .. } => Some(reason),
        }
    }

    /// The body's value, when it ran.
    pub fn into_value(self) -> Option<T> {
        match self {
            RunOutcome::Ran { value, .. } => Some(value),
            RunOutcome::Skipped { .. } => None,
        }
    }
}

/// Why a run was skipped.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Skip {
    /// The current window has been run to completion already.
    AlreadyRan {
        /// The run that completed it.
        run: i64,
        /// Who ran it.
        by: Option<String>,
        /// When it finished (database time).
        finished_at: DateTime<Utc>,
    },
    /// A run that has not finished still holds the job: it is running, or its runner stopped
    /// without finishing (crashed, cut off) and its claim has not expired yet.
    Running {
        /// The window it is for: this one, when it is retried, or an earlier one.
        window_start: DateTime<Utc>,
        /// Its run number.
        run: i64,
        /// Who claimed it.
        by: Option<String>,
        /// When its claim ends if nothing is recorded before (its start plus the max hold).
        expires_at: DateTime<Utc>,
    },
    /// The previous run finished, but less than the min hold has passed since it started.
    TooSoon {
        /// Its run number.
        run: i64,
        /// When the job may run again (its start plus the min hold, database time).
        until: DateTime<Utc>,
    },
    /// Another process holds the job's advisory lock right now: it is claiming or running the
    /// job.
    Busy,
}

impl Skip {
    /// A stable name for logs and telemetry: `already_ran`, `running`, `too_soon` or `busy`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Skip::AlreadyRan { .. } => "already_ran",
            Skip::Running { .. } => "running",
            Skip::TooSoon { .. } => "too_soon",
            Skip::Busy => "busy",
        }
    }
}
