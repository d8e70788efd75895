//! A running job's hold on the job: when its body is cut off, and how a run extends it.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{RwLock, watch};
use tokio::time::{Instant, sleep_until};

use super::{Error, Extension, Inner, JobRun, Result};

/// The hold of one claimed run, as this process keeps it: the local moment its body is cut
/// off, which extensions move later, and whether the run is over.
pub(super) struct Lease {
    inner: Arc<Inner>,
    run: i64,
    /// Taken before the claim was sent: every local deadline counts from here, so it passes
    /// before the claim the store stamped a little later expires.
    claimed: Instant,
    deadline: watch::Sender<Instant>,
    /// True once the run is over. An extension holds it for reading until the store has
    /// answered, and ending the run takes it for writing, so no extension lands in the store
    /// after the run has finished or been given up.
    ended: RwLock<bool>,
}

impl Lease {
    /// The hold of run `run`, whose claim was sent after `claimed`: the max hold from there.
    pub(super) fn new(inner: &Arc<Inner>, run: i64, claimed: Instant) -> Arc<Self> {
        let (deadline, _) = watch::channel(later(claimed, inner.spec.max_hold));
        Arc::new(Lease {
            inner: Arc::clone(inner),
            run,
            claimed,
            deadline,
            ended: RwLock::new(false),
        })
    }

    /// The run number.
    pub(super) fn run(&self) -> i64 {
        self.run
    }

    /// The run is over: it can no longer extend. Waits for an extension under way.
    pub(super) async fn end(&self) {
        *self.ended.write().await = true;
    }

    /// How long the run may hold the job now, from its claim: the max hold plus extensions.
    pub(super) fn hold(&self) -> Duration {
        self.deadline
            .borrow()
            .saturating_duration_since(self.claimed)
    }

    /// Polls `body` until it finishes (`Some`) or the hold's end passes (`None`, the body
    /// dropped). An overrun wins over a body finishing at the same moment.
    pub(super) async fn cut_off<F: Future>(&self, body: F) -> Option<F::Output> {
        let mut deadline = self.deadline.subscribe();
        let mut body = std::pin::pin!(body);
        loop {
            let at = *deadline.borrow_and_update();
            tokio::select! {
                biased;
                () = sleep_until(at) => {
                    // Extensions only move the end later: wake at the old one, then sleep on.
                    if !deadline.has_changed().unwrap_or(false) {
                        return None;
                    }
                }
                value = &mut body => return Some(value),
            }
        }
    }

    /// Extends the hold by `by` and counts the outcome.
    async fn extend(&self, by: Duration) -> Result<Extension> {
        use crate::telemetry::job::extension;
        let extended = self.extend_hold(by).await;
        self.inner.metrics.extension(match &extended {
            Ok(Extension { capped: false, .. }) => extension::EXTENDED,
            Ok(Extension { capped: true, .. }) => extension::CAPPED,
            Err(_) => extension::REFUSED,
        });
        extended
    }

    /// Extends the hold by `by`: in the store first, then here, so the body is never let run
    /// past what the store granted.
    async fn extend_hold(&self, by: Duration) -> Result<Extension> {
        let Inner { store, spec, .. } = &*self.inner;
        let not_running = || Error::NotRunning {
            job: spec.name.clone(),
            run: self.run,
        };
        let ended = self.ended.read().await;
        if *ended {
            return Err(not_running());
        }
        // More than the max total hold is capped anyway; bounding it keeps the arithmetic in
        // range whatever the caller asks.
        let by = by.min(spec.max_total_hold);
        let asked = Instant::now();
        let extension = store
            .extend(spec, self.run, by)
            .await?
            .ok_or_else(not_running)?;
        drop(ended);
        let end = later(asked, by).min(later(self.claimed, spec.max_total_hold));
        self.deadline.send_if_modified(|deadline| {
            let longer = end > *deadline;
            if longer {
                *deadline = end;
            }
            longer
        });
        Ok(extension)
    }
}

/// `at + by`, or as late as the clock goes.
fn later(at: Instant, by: Duration) -> Instant {
    at.checked_add(by)
        .unwrap_or_else(|| at + Duration::from_secs(100 * 366 * 24 * 3600))
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("run", &self.run)
            .field("hold", &self.hold())
            .field("ended", &self.ended.try_read().map(|ended| *ended).ok())
            .finish_non_exhaustive()
    }
}

impl JobRun {
    /// Extends this run's hold on the job: from now on it holds the job until `by` from now
    /// (ShedLock's `LockExtender.extendActiveLock`), and its body is cut off then instead of
    /// at the max hold, unless it extends again. Call it from the body, before the hold ends,
    /// as a long run makes progress.
    ///
    /// The record shows it: the claim's `hold_until` moves (others skip with
    /// [`Skip::Running`](super::Skip::Running) until then), and `extensions` and
    /// `extended_at` count it. A run never holds the job past its claim plus the
    /// [`max_total_hold`](super::ScheduledJobBuilder::max_total_hold) (by default the max
    /// hold, so nothing is gained): the returned [`Extension`] says when the hold now ends,
    /// and whether that limit cut the extension short. An extension never shortens a hold.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use pglock::InMemoryLockManager;
    /// use pglock::schedule::{InMemoryJobStore, ScheduledJob};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::schedule::Result<()> {
    /// let job = ScheduledJob::builder(
    ///     Arc::new(InMemoryLockManager::new()),
    ///     Arc::new(InMemoryJobStore::new()),
    ///     "reindex",
    ///     Duration::from_secs(3600),
    /// )
    /// .max_hold(Duration::from_secs(60))         // each stretch of work: a minute at most
    /// .max_total_hold(Duration::from_secs(1800)) // the whole run: half an hour at most
    /// .build()?;
    /// let outcome = job
    ///     .run(|run| async move {
    ///         for _batch in 0..3 {
    ///             // ... one batch of work ...
    ///             run.extend(Duration::from_secs(60)).await?; // another minute
    ///         }
    ///         Ok::<_, pglock::schedule::Error>(())
    ///     })
    ///     .await?;
    /// assert!(outcome.ran());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// * [`Error::NotRunning`] when the run is over (its body returned or was cut off, or its
    ///   claim expired and was taken over): nothing was extended;
    /// * [`Error::Storage`] when the store could not be written; the hold is unchanged here,
    ///   and may or may not have been extended in the store.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the store may have extended the hold while this
    /// process did not, so the body is cut off at the earlier end; the claim then holds the job
    /// a little longer than the run, as after a crash, never less.
    pub async fn extend(&self, by: Duration) -> Result<Extension> {
        self.lease.extend(by).await
    }
}
