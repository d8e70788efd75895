//! Scheduled jobs: run a job at most once per time window across every process, the way
//! ShedLock's `@SchedulerLock` or a `TaskLock` gate a cron job.
//!
//! Every replica runs the same schedule (a `tokio` interval, a cron crate, a loop) and, at each
//! tick, calls [`ScheduledJob::run`] with the job's body. The first replica to arrive in a
//! window claims it and runs the body; the others are told why they skipped
//! ([`Skip`]). The record of the claim lives in a [`JobStore`]: in production a PostgreSQL
//! table ([`PostgresJobStore`], [`JobTable`]), so it survives restarts of every replica; in unit
//! tests memory ([`InMemoryJobStore`], next to an [`InMemoryLockManager`](crate::InMemoryLockManager)).
//!
//! ```no_run
//! use std::sync::Arc;
//! use std::time::Duration;
//! use pglock::LockManager;
//! use pglock::schedule::{PostgresJobStore, RunOutcome, ScheduledJob};
//!
//! # async fn run(pool: sqlx::PgPool, locks: Arc<dyn LockManager>) -> pglock::schedule::Result<()> {
//! // Every 5 minutes (00:00, 00:05, ... by the database's clock), at most once per window.
//! let store = Arc::new(PostgresJobStore::new(pool));
//! let job = ScheduledJob::builder(locks, store, "nightly-report", Duration::from_secs(300))
//!     .max_hold(Duration::from_secs(120)) // a run is cut off, and a dead runner's claim ends, after 2 min
//!     .build()?;
//! loop {
//!     tokio::time::sleep(job.until_next_window().await?).await;
//!     match job.run(|run| async move { send_report(run.run).await }).await? {
//!         RunOutcome::Ran { run, .. } => println!("ran window {}", run.window_start),
//!         RunOutcome::Skipped { reason, .. } => println!("skipped: {reason:?}"),
//!         _ => {}
//!     }
//! }
//! # }
//! # async fn send_report(_: i64) {}
//! ```
//!
//! # Windows
//!
//! Windows are **aligned to the wall clock of the database**: a window starts at every whole
//! multiple of the period since the Unix epoch, shifted by
//! [`offset`](ScheduledJobBuilder::offset) (a period of a day with an offset of two hours runs
//! daily at 02:00 UTC). Every replica computes the same windows whatever its own clock says,
//! because the window of a claim is computed by the claiming statement from the database's
//! `now()`, never from the client's time.
//!
//! # Clock skew and schedules that drift
//!
//! Replicas tick at slightly different moments: their clocks differ from the database's, their
//! timers fire late, a process pauses. Three rules keep that from running the job twice or
//! not at all:
//!
//! * **Late ticks** find the window already claimed: a window runs at most once to
//!   completion, however late a replica arrives in it ([`Skip::AlreadyRan`]).
//! * **Early ticks**: a claim up to the [`skew_tolerance`](ScheduledJobBuilder::skew_tolerance)
//!   before a window's start counts for that window (default: a tenth of the period, at most
//!   5 s). Without it, a replica whose clock runs ahead of the database's would tick just
//!   before every boundary, find the previous window done, and never run the job.
//! * **The min hold**: once a run starts, no other run of the job starts before
//!   [`min_hold`](ScheduledJobBuilder::min_hold) has passed, even when the run finishes in
//!   50 ms ([`Skip::TooSoon`]). A replica that ticks more than the tolerance early may run the
//!   previous window just before the boundary; the min hold stops a punctual replica from then
//!   running the next one a moment later. The price: a window whose every tick falls within
//!   the min hold of the previous run's start is skipped. Default: half the period.
//!
//! # Claims, the max hold, and crashed runners
//!
//! A run holds the job from its claim until it finishes. While it holds it, other replicas
//! skip ([`Skip::Running`]): runs never overlap. It holds the job at most
//! [`max_hold`](ScheduledJobBuilder::max_hold) (default: the period):
//!
//! * a body still running when the max hold has passed (by the local clock, counted from
//!   before the claim was sent, so it ends before the claim does) is **cut off**: its future is
//!   dropped and `run` returns [`Error::Overran`];
//! * a runner that dies (a crash, a kill, a lost machine) leaves its claim in the table; it
//!   expires at its start plus the max hold, by the database's clock. Until then other replicas
//!   skip; after it, the next replica to tick claims the job: the same window again if it is
//!   still the current one.
//!
//! # Runs that take long: extending the hold
//!
//! A run whose length is not known up front (a backfill, a reindex) extends its hold as it
//! makes progress, ShedLock's `LockExtender`: [`JobRun::extend`] moves the claim's end to a
//! given time from now, in the store (others skip with [`Skip::Running`] until then) and here
//! (the body is cut off then, unless it extends again). It is bounded: no run holds the job
//! past its claim plus the [`max_total_hold`](ScheduledJobBuilder::max_total_hold) (by default
//! the max hold, so runs cannot extend), so a stuck job that keeps calling `extend` is still
//! cut off, and a runner that stops extending, stuck or dead, frees the job at the end of its
//! last extension. The record counts the extensions ([`JobRecord::extensions`],
//! [`JobRecord::extended_at`]).
//!
//! A window counts as done only once a run of it has **finished**: its body returned. A run
//! that did not finish (it crashed, was cut off, was cancelled, or lost its lock) did not
//! complete the window, so the window may be run again: at once after a cancellation or a cut
//! off (once the min hold has passed, too), or when the claim expires after a crash. This is
//! at most one *completed* run per window; code whose partial runs must not repeat should use
//! the run number, a fencing token, to make its writes idempotent.
//!
//! # The job's advisory lock
//!
//! While it claims and runs, a replica also holds the lock `scheduled-job:{name}` through its
//! [`LockManager`], taken without waiting (a
//! replica that finds it held skips with [`Skip::Busy`]). It excludes a second runner in the one
//! case the table cannot: a process that froze mid-run (a long pause, a suspended VM) past its
//! max hold keeps its lock until the server ends its silent session (the
//! [`silence_timeout`](crate::PostgresLockManagerBuilder::silence_timeout); on PostgreSQL 13 and
//! older, until it wakes); when it wakes, its body is cut off before it is polled again. If the
//! manager declares the lock lost, the body is cancelled and `run`
//! returns [`Error::Lock`] with [`crate::Error::LockLost`], as
//! [`with_lock`](crate::LockManagerExt::with_lock) does. `pglock holders scheduled-job:{name}`
//! shows who runs a job right now.
//!
//! A [`PostgresJobStore`]'s statements (reading the record, claiming, recording the end) use
//! its pool: given the lock manager's pool, leave it a connection to spare next to the lock
//! sessions.

mod builder;
#[cfg(test)]
pub(crate) use self::builder::documented_defaults;
mod error;
mod lease;
mod memory;
mod outcome;
mod postgres;
mod store;
mod table;

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{Instrument, Span, field::Empty};

pub use self::builder::ScheduledJobBuilder;
pub use self::error::{Error, Result};
pub use self::memory::InMemoryJobStore;
pub use self::outcome::{JobRun, RunOutcome, Skip};
pub use self::postgres::PostgresJobStore;
pub use self::store::{Extension, JobRecord, JobSpec, JobState, JobStore};
pub use self::table::JobTable;

use self::lease::Lease;
use crate::telemetry::instruments::JobMetrics;
use crate::telemetry::{SpanOutcome, job as names};
use crate::{Attempt, LockGuard, LockKey, LockManager, LockManagerExt, LossCause};

/// A job that runs at most once per window across every process sharing its store. See the
/// [module documentation](self) for the rules.
///
/// Cheap to clone; clones share the job's settings.
#[derive(Clone)]
pub struct ScheduledJob {
    inner: Arc<Inner>,
}

struct Inner {
    locks: Arc<dyn LockManager>,
    store: Arc<dyn JobStore>,
    spec: JobSpec,
    key: LockKey,
    metrics: JobMetrics,
    tracing: bool,
}

impl ScheduledJob {
    /// Configures the job `name`, run at most once per window of `period`: its record is kept
    /// in `store`, and each run holds the job's lock through `locks`.
    ///
    /// The name identifies the job across the fleet: every replica must use the same name, the
    /// same store and the same settings.
    pub fn builder(
        locks: Arc<dyn LockManager>,
        store: Arc<dyn JobStore>,
        name: impl Into<String>,
        period: Duration,
    ) -> ScheduledJobBuilder {
        ScheduledJobBuilder {
            locks,
            store,
            name: name.into(),
            period,
            offset: Duration::ZERO,
            tolerance: None,
            min_hold: None,
            max_hold: None,
            max_total_hold: None,
            telemetry: Default::default(),
        }
    }

    /// The job's name.
    pub fn name(&self) -> &str {
        &self.inner.spec.name
    }

    /// The job's schedule, as its store sees it.
    pub fn spec(&self) -> &JobSpec {
        &self.inner.spec
    }

    /// The key of the lock a run holds: `scheduled-job:{name}`.
    pub fn lock_key(&self) -> &LockKey {
        &self.inner.key
    }

    /// Claims the current window and runs `body` if the job's record allows it; otherwise says
    /// why not. The body receives the claimed [`JobRun`], with its window and run number.
    ///
    /// One call is one attempt: it never waits for another runner. Call it at every tick of
    /// your schedule.
    ///
    /// # Errors
    ///
    /// * [`Error::Storage`] when the store cannot be read or written (the body has not run,
    ///   unless the failure is in recording its end, which is logged instead);
    ///   [`Error::PermissionDenied`] when the role may not use or create the job table;
    /// * [`Error::Lock`] with the errors of
    ///   [`try_acquire`](crate::LockManagerExt::try_acquire) when the job's lock cannot be
    ///   asked for (a busy lock is [`Skip::Busy`], not an error);
    /// * [`Error::Overran`] when the body was cut off at the max hold;
    /// * [`Error::Lock`] with [`crate::Error::LockLost`] when the job's lock went (lost, or
    ///   released through the manager) and the body was cancelled.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: whichever await point the future is dropped at, no lock and no busy
    /// connection is left, and the job can run again.
    ///
    /// * Before the claim is sent (creating the table, reading the record, taking the job's
    ///   lock), nothing is recorded; a lock already taken is released in the background, as a
    ///   dropped guard's is.
    /// * While the claim statement is in flight, the claim may still land after the future is
    ///   gone. Nobody runs it then: like a crashed runner's, it holds the job until its max
    ///   hold.
    /// * Once the claim is recorded (the body running, its end being recorded, the lock being
    ///   released), the body's future is dropped with the run's, and the claim is given up in
    ///   the background unless its end was recorded: the window may run again once the min
    ///   hold since the claim has passed. If that update cannot be made, the claim expires at
    ///   the max hold.
    pub async fn run<F, Fut, T>(&self, body: F) -> Result<RunOutcome<T>>
    where
        F: FnOnce(JobRun) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let span = if self.inner.tracing {
            tracing::info_span!(
                names::RUN_SPAN,
                { names::JOB } = %self.inner.spec.name,
                { names::WINDOW_START } = Empty,
                { names::RUN } = Empty,
                { crate::telemetry::HOLDER_ID } = self.inner.locks.holder_id(),
                { names::OUTCOME } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let mut record = RunRecord::new(span.clone(), &self.inner.metrics);
        let result = self.attempt(body, &span).instrument(span.clone()).await;
        record.finish(&result);
        result
    }

    async fn attempt<F, Fut, T>(&self, body: F, span: &Span) -> Result<RunOutcome<T>>
    where
        F: FnOnce(JobRun) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let Inner {
            locks, store, spec, ..
        } = &*self.inner;
        store.prepare(spec).await?;
        let state = store.state(spec).await?;
        span.record(names::WINDOW_START, state.current_window.to_rfc3339());
        if let Some(reason) = state.skip() {
            return Ok(skipped(&state, reason));
        }
        let Attempt::Acquired(guard) = locks.try_acquire(self.inner.key.clone()).await? else {
            return Ok(skipped(&state, Skip::Busy));
        };
        // Counted from before the claim is sent, so the body is cut off before the claim,
        // stamped by the store a little later, expires.
        let claimed = Instant::now();
        let record = match store.claim(spec, locks.holder_id()).await? {
            Ok(record) => record,
            Err(state) => {
                release(guard).await;
                let reason = state.skip().unwrap_or(Skip::Busy);
                return Ok(skipped(&state, reason));
            }
        };
        let lease = Lease::new(&self.inner, record.runs, claimed);
        let claim = Claim::new(&self.inner, Arc::clone(&lease));
        let run = spec.run_of(record, lease);
        span.record(names::WINDOW_START, run.window_start.to_rfc3339());
        span.record(names::RUN, run.run);
        self.supervise(body, run, claim, guard).await
    }

    /// Runs the body of a claimed window until it finishes, overruns or loses its lock, and
    /// records how it ended.
    async fn supervise<F, Fut, T>(
        &self,
        body: F,
        run: JobRun,
        claim: Claim,
        guard: LockGuard,
    ) -> Result<RunOutcome<T>>
    where
        F: FnOnce(JobRun) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        // The body runs as the job lock's critical section, cut off at the end of its hold
        // (the max hold, or later once extended); both ends drop it before anything below
        // runs, so nothing is given up or released while it can still act. A loss wins over
        // an overrun, and either over a body finishing at the same moment.
        let lease = Arc::clone(&run.lease);
        let run_body = async { lease.cut_off(body(run.clone())).await.ok_or(Ended::Overran) };
        let ended = (guard.section(run_body).await).unwrap_or_else(|cause| Err(Ended::Lost(cause)));
        claim.lease.end().await;
        match ended {
            Ok(value) => {
                if let Err(err) = claim.finish().await {
                    tracing::warn!(error = %err, "the run finished but could not be recorded; \
                        the window may run again once its claim expires");
                }
                release(guard).await;
                Ok(RunOutcome::Ran { run, value })
            }
            Err(Ended::Overran) => {
                self.inner.metrics.overrun();
                if let Err(err) = claim.abandon().await {
                    tracing::warn!(error = %err, "an overrun claim could not be given up");
                }
                release(guard).await;
                Err(Error::Overran {
                    job: self.inner.spec.name.clone(),
                    hold: lease.hold(),
                })
            }
            Err(Ended::Lost(cause)) => {
                drop(guard);
                if let Err(err) = claim.abandon().await {
                    tracing::warn!(error = %err, "a claim whose lock was lost could not be given up");
                }
                Err(Error::Lock(crate::Error::LockLost {
                    key: self.inner.key.clone(),
                    cause,
                }))
            }
        }
    }

    /// How long until the next window starts, by the store's clock (the database's, for a
    /// [`PostgresJobStore`]): sleep that long before the next [`run`](Self::run) to tick on the
    /// windows' boundaries.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the store cannot be asked.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn until_next_window(&self) -> Result<Duration> {
        self.inner.store.until_next_window(&self.inner.spec).await
    }

    /// Prepares the store now instead of on the first run: for a [`PostgresJobStore`], checks
    /// the job table (creating it where it is missing and the role may). A table that exists
    /// already (created by your migrations, say) is used as it is: the role then needs no
    /// privilege to create tables, only `SELECT, INSERT, UPDATE` on that one (see
    /// [`JobTable`]).
    ///
    /// # Errors
    ///
    /// [`Error::PermissionDenied`] naming the object and the privilege the role lacks;
    /// [`Error::Storage`] when the store cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a table's creation is one transaction; a later call tries again.
    pub async fn prepare(&self) -> Result<()> {
        self.inner.store.prepare(&self.inner.spec).await
    }
}

enum Ended {
    Overran,
    Lost(LossCause),
}

/// Releases the job's lock; the outcome of the run does not depend on it, so a failure is only
/// logged (an unconfirmed release closes the session, which frees the lock).
async fn release(guard: LockGuard) {
    if let Err(err) = guard.release().await {
        tracing::warn!(error = %err, "the job's lock release was not confirmed");
    }
}

fn skipped<T>(state: &JobState, reason: Skip) -> RunOutcome<T> {
    RunOutcome::Skipped {
        window_start: state.current_window,
        reason,
    }
}

/// A claimed window not yet finished. Dropped while armed (the run's future was dropped), it
/// gives the claim up in the background. Dropped in any way, it ends the run's lease.
struct Claim {
    inner: Arc<Inner>,
    lease: Arc<Lease>,
    run: i64,
    armed: bool,
}

impl Claim {
    fn new(inner: &Arc<Inner>, lease: Arc<Lease>) -> Self {
        Claim {
            inner: Arc::clone(inner),
            run: lease.run(),
            lease,
            armed: true,
        }
    }

    async fn finish(mut self) -> Result<()> {
        let finished = (self.inner.store)
            .finish(&self.inner.spec, self.run)
            .await?;
        if !finished {
            // Only if the claim expired and was taken over while this run held the lock: the
            // lock was lost without this process noticing in time.
            tracing::warn!(
                run = self.run,
                "the run finished after its claim was taken over"
            );
        }
        self.armed = false;
        Ok(())
    }

    async fn abandon(mut self) -> Result<()> {
        (self.inner.store)
            .abandon(&self.inner.spec, self.run)
            .await?;
        self.armed = false;
        Ok(())
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Without a runtime (it is shutting down) the claim simply expires at the max hold.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (inner, lease, run) = (Arc::clone(&self.inner), Arc::clone(&self.lease), self.run);
            runtime.spawn(async move {
                // First end the run, so that no extension lands after the claim is given up.
                lease.end().await;
                if let Err(err) = inner.store.abandon(&inner.spec, run).await {
                    tracing::warn!(error = %err, job = %inner.spec.name, "a dropped run's claim could not be given up");
                }
            });
        }
    }
}

/// How one call of `run` ended, recorded once on its span and its metrics: by
/// [`finish`](Self::finish), or as cancelled when the caller dropped the future first. Its drop
/// is the one place that sees every exit, so every call is counted exactly once.
struct RunRecord<'a> {
    span: SpanOutcome,
    metrics: &'a JobMetrics,
    counted: Counted,
}

/// What a call of `run` counts as.
#[derive(Clone, Copy)]
enum Counted {
    /// A run that did not skip, and its outcome (one of [`names::outcome`]).
    Run(&'static str),
    /// A skip, and its reason ([`Skip::as_str`]).
    Skip(&'static str),
}

impl<'a> RunRecord<'a> {
    fn new(span: Span, metrics: &'a JobMetrics) -> Self {
        RunRecord {
            span: SpanOutcome::new(span, names::OUTCOME),
            metrics,
            counted: Counted::Run(names::outcome::CANCELLED),
        }
    }

    fn finish<T>(&mut self, result: &Result<RunOutcome<T>>) {
        let (counted, failed) = match result {
            Ok(RunOutcome::Ran { .. }) => (Counted::Run(names::outcome::RAN), false),
            Ok(RunOutcome::Skipped { reason, .. }) => (Counted::Skip(reason.as_str()), false),
            Err(Error::Overran { .. }) => (Counted::Run(names::outcome::OVERRAN), true),
            Err(Error::Lock(lock)) if lock.is_lost() => (Counted::Run(names::outcome::LOST), true),
            Err(err) => {
                tracing::warn!(parent: self.span.span(), error = %err, "scheduled job failed");
                (Counted::Run(names::outcome::ERROR), true)
            }
        };
        let (Counted::Run(outcome) | Counted::Skip(outcome)) = counted;
        self.span.finish(outcome, failed);
        self.counted = counted;
    }
}

impl Drop for RunRecord<'_> {
    fn drop(&mut self) {
        match self.counted {
            Counted::Run(outcome) => self.metrics.run(outcome),
            Counted::Skip(reason) => self.metrics.skip(reason),
        }
    }
}

impl fmt::Debug for ScheduledJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScheduledJob")
            .field("spec", &self.inner.spec)
            .field("store", &self.inner.store)
            .field("locks", &self.inner.locks)
            .finish_non_exhaustive()
    }
}
