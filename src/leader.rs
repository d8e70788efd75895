//! Leader election on any lock manager: [`LeaderElection`], and its [`Error`].

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::sync::{Mutex, OwnedRwLockReadGuard, RwLock, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::{Instrument, Span, field::Empty};

use crate::sync::{First, first};
use crate::telemetry::Telemetry;
use crate::telemetry::instruments::LeaderMetrics;
use crate::telemetry::{self, leader as names};
use crate::{
    Attempt, LockGuard, LockInfo, LockKey, LockManager, LockManagerExt, LossCause, LossSignal,
};

/// A `Result` whose error is the leader election [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`LeaderElection`] call did not lead: a lock failure, or a stopped campaign.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The election's lock failed. For leader work, [`crate::Error::LockLost`] is the usual
    /// one: the term ended because the lock was lost, or released through the manager (the
    /// cause says which).
    #[error(transparent)]
    Lock(#[from] crate::Error),

    /// The election was asked to lead after it stopped campaigning, or stopped while its
    /// leader work ran: it resigned, or its campaign ended with the runtime.
    #[error("Leader election on '{key}' has stopped campaigning")]
    Stopped {
        /// The election's lock key, `leader:{name}`.
        key: LockKey,
    },

    /// [`build`](LeaderElectionBuilder::build) was called outside a Tokio runtime, where the
    /// campaign cannot be spawned. Build the election inside the runtime that will run it.
    #[error("Leader election on '{key}' must be built within a Tokio runtime")]
    NoRuntime {
        /// The election's lock key, `leader:{name}`.
        key: LockKey,
    },
}

// `is_lost`: the term ended under the work because the lock went (lost, or released through
// the manager), and the candidate campaigns again. `is_timeout`: the caller's deadline passed
// before the candidate led.
crate::error::lock_error_conversions!(Error);

/// Where a candidate stands, as published by [`LeaderElection::subscribe`].
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Leadership {
    /// Not leading: campaigning, or stopped.
    #[default]
    Follower,
    /// Leading, under this acquisition of the election's lock: its holder id is the
    /// candidate's identity, its fencing token (where the manager mints them) the term's.
    Leader(LockInfo),
}

impl Leadership {
    /// True while leading.
    pub fn is_leader(&self) -> bool {
        matches!(self, Leadership::Leader(_))
    }

    /// The acquisition the candidate leads under, while it leads.
    pub fn info(&self) -> Option<&LockInfo> {
        match self {
            Leadership::Leader(info) => Some(info),
            Leadership::Follower => None,
        }
    }
}

/// Leader election on any [`LockManager`]: at most one candidate leads per name, among all
/// candidates whose managers share a lock server (one PostgreSQL database, or one
/// [`InMemoryLockServer`](crate::InMemoryLockServer)).
///
/// Each candidate is one `LeaderElection`, best on a lock manager of its own: a manager is one
/// holder, so its holder id then names the candidate (two candidates on one manager still
/// exclude each other, but show the same identity). [`build`](LeaderElectionBuilder::build)
/// spawns a *campaign*: it tries the lock `leader:{name}` once, without waiting, and again
/// every [`retry_interval`](LeaderElectionBuilder::retry_interval) plus a random
/// [`jitter`](LeaderElectionBuilder::jitter) until it gets it. It then leads, holding that one
/// lock, until one of these ends the term:
///
/// * the lock **goes**: the manager declares it lost (for [`PostgresLockManager`], within
///   about its probe interval of the session dying), or it is released through the manager
///   ([`release`](crate::LockManagerExt::release), [`release_all`](LockManager::release_all)).
///   The guard's loss signal tells the campaign at once: the candidate becomes a follower, its
///   leader work is cancelled with [`crate::Error::LockLost`] (the cause says which), and it
///   campaigns again after the interval;
/// * [`resign`](LeaderElection::resign) or **dropping the handle**: leader work is cancelled
///   (with [`Error::Stopped`]) and dropped, *then* the lock is released, so the next
///   leader never overlaps this one's work; the campaign stops.
///
/// While leading, the campaign never asks the manager for the lock again: it holds exactly
/// one guard, so a lock is never stacked (on PostgreSQL, where advisory locks are re-entrant
/// per session, re-locking to "renew" would leave the lock held after one unlock).
///
/// Leadership is published as a [`watch`] channel ([`subscribe`](LeaderElection::subscribe))
/// whose value is the term's [`LockInfo`]: the candidate's identity is its
/// [`holder_id`](LockInfo::holder_id) (the manager's, by default
/// `{host}:{pid}:{16 random hex digits}`, unique per process and per manager), and its
/// [`fencing_token`](LockInfo::fencing_token) is the term's. Carry the token with every write
/// the leader makes and have the resource reject lower ones: a deposed leader that has not yet
/// heard of its loss can then no longer overwrite its successor's work.
///
/// [`PostgresLockManager`]: crate::PostgresLockManager
///
/// # Examples
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use pglock::{InMemoryLockManager, InMemoryLockServer, LeaderElection};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::leader::Result<()> {
/// let server = InMemoryLockServer::new();
/// let candidate = |id: &str| {
///     let locks = InMemoryLockManager::builder().server(&server).holder_id(id).build();
///     LeaderElection::builder(Arc::new(locks), "billing")
///         .retry_interval(Duration::from_millis(100))
///         .build()
/// };
/// let (a, b) = (candidate("a")?, candidate("b")?);
///
/// let leader = a.wait_for_leadership(None).await?;
/// assert_eq!(&*leader.holder_id, "a");
/// assert!(!b.is_leader());
///
/// // Leader-only work gets the term's lock info, fencing token included.
/// let token = a.run_as_leader(None, |info| async move { info.fencing_token }).await?;
/// assert_eq!(token, Some(1));
///
/// assert!(a.resign().await?);
/// let next = b.wait_for_leadership(Some(Duration::from_secs(5))).await?;
/// assert_eq!((&*next.holder_id, next.fencing_token), ("b", Some(2)));
/// # Ok(()) }
/// ```
pub struct LeaderElection {
    key: LockKey,
    manager: Arc<dyn LockManager>,
    leadership: watch::Receiver<Leadership>,
    terms: watch::Receiver<Option<Arc<Term>>>,
    stop: CancellationToken,
    resigned: Arc<AtomicBool>,
    campaign: Mutex<Option<JoinHandle<Result<bool>>>>,
    // Dropping the handle stops the campaign, which then releases the lock.
    _stop_on_drop: DropGuard,
}

impl LeaderElection {
    /// Configures a candidate for the leadership called `name`, campaigning through `locks`
    /// for the lock `leader:{name}`.
    pub fn builder(locks: Arc<dyn LockManager>, name: impl Into<String>) -> LeaderElectionBuilder {
        LeaderElectionBuilder {
            manager: locks,
            name: name.into(),
            retry_interval: Duration::from_secs(1),
            jitter: 0.1,
            telemetry: Telemetry::default(),
        }
    }

    /// The election's lock key, `leader:{name}`.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The identity this candidate campaigns with: its manager's
    /// [`holder_id`](LockManager::holder_id), stamped on every term's [`LockInfo`].
    pub fn holder_id(&self) -> &str {
        self.manager.holder_id()
    }

    /// A receiver of this candidate's [`Leadership`], its current value marked seen.
    ///
    /// The channel closes (`changed()` returns an error) once the campaign has stopped, after
    /// its final [`Leadership::Follower`].
    pub fn subscribe(&self) -> watch::Receiver<Leadership> {
        let mut receiver = self.leadership.clone();
        receiver.mark_unchanged();
        receiver
    }

    /// True while this candidate leads.
    pub fn is_leader(&self) -> bool {
        self.leadership.borrow().is_leader()
    }

    /// The acquisition this candidate leads under, while it leads.
    pub fn leader_info(&self) -> Option<LockInfo> {
        self.leadership.borrow().info().cloned()
    }

    /// Waits, at most `timeout` (`None`: as long as it takes; `Some(Duration::ZERO)`: one
    /// look), until this candidate leads, and returns the term's [`LockInfo`]; at once if it
    /// leads already.
    ///
    /// # Errors
    ///
    /// [`Error::Lock`] with [`crate::Error::Timeout`] (naming the election's key) when the
    /// deadline passed first ([`Error::is_timeout`]); [`Error::Stopped`] once the campaign has
    /// stopped ([`resign`](LeaderElection::resign)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn wait_for_leadership(&self, timeout: Option<Duration>) -> Result<LockInfo> {
        let (term, _lease) = self.enter_term(timeout).await?;
        Ok(term.info.clone())
    }

    /// Waits, at most `timeout`, until this candidate leads (as
    /// [`wait_for_leadership`](Self::wait_for_leadership)), then runs `work` as its leader, and
    /// cancels it if the leadership ends first. The deadline bounds the wait, not the work.
    ///
    /// `work` receives the term's [`LockInfo`] (identity and fencing token). If the term ends
    /// before `work` finishes, `work`'s future is dropped at its next await point and the call
    /// returns the reason. A `work` that finishes at the moment the term ends counts as cut
    /// short: its exclusivity cannot be assumed. Finishing `work` does not give up the
    /// leadership (use [`resign`](LeaderElection::resign) for that); calling `run_as_leader`
    /// again while still leading runs the next work in the same term at once.
    ///
    /// A graceful end ([`resign`](LeaderElection::resign), or dropping the handle) waits for
    /// every running `work` to be dropped before it releases the lock, so the next leader never
    /// overlaps it; a lost lock, by definition, cannot wait. `work` runs as the lock's critical
    /// section: asking for the election's key inside it fails at once
    /// ([`crate::Error::Reentrant`]).
    ///
    /// # Errors
    ///
    /// * [`Error::Lock`] with [`crate::Error::Timeout`] when the deadline passed before the
    ///   candidate led ([`Error::is_timeout`]; `work` did not run);
    /// * [`Error::Lock`] with [`crate::Error::LockLost`] when the lock went while `work` ran
    ///   (lost, or released through the manager; [`Error::is_lost`]);
    /// * [`Error::Stopped`] when the campaign stopped before or while `work` ran.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `work` (if it started) and leaves the
    /// leadership as it was; a graceful end no longer waits for it.
    ///
    /// # Examples
    ///
    /// The usual shape: a replica's leader-only job, run whenever the replica is elected.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pglock::leader::{Error, LeaderElection};
    /// use pglock::{InMemoryLockManager, LockInfo};
    ///
    /// async fn rebuild_projections(info: LockInfo) {
    ///     // Write with the token, so a deposed leader's writes are refused.
    ///     let _token = info.fencing_token;
    /// #   std::future::pending::<()>().await
    /// }
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::leader::Result<()> {
    /// let election = Arc::new(
    ///     LeaderElection::builder(Arc::new(InMemoryLockManager::new()), "projections").build()?,
    /// );
    /// let replica = tokio::spawn({
    ///     let election = Arc::clone(&election);
    ///     async move {
    ///         loop {
    ///             match election.run_as_leader(None, rebuild_projections).await {
    ///                 // Done, and still the leader.
    ///                 Ok(()) => {}
    ///                 // Deposed, and campaigning again.
    ///                 Err(err) if err.is_lost() => {}
    ///                 // Resigned: this replica is shutting down.
    ///                 Err(Error::Stopped { .. }) => break,
    ///                 Err(other) => return Err(other),
    ///             }
    ///         }
    ///         Ok(())
    ///     }
    /// });
    /// election.wait_for_leadership(None).await?;
    /// assert!(election.resign().await?); // cancels the job, then releases the lock
    /// replica.await.expect("the replica's task")?;
    /// # Ok(()) }
    /// ```
    pub async fn run_as_leader<F, Fut, T>(&self, timeout: Option<Duration>, work: F) -> Result<T>
    where
        F: FnOnce(LockInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        let (term, lease) = self.enter_term(timeout).await?;
        Self::lead_with(term, lease, work).await
    }

    /// Runs `work` as leader if this candidate leads right now, as
    /// [`run_as_leader`](Self::run_as_leader) does; `Ok(None)` without running it when it does
    /// not: "if I lead, do this", for a tick every replica has but only the leader should act
    /// on.
    ///
    /// # Errors
    ///
    /// As [`run_as_leader`](Self::run_as_leader), except that not leading is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// As [`run_as_leader`](Self::run_as_leader).
    pub async fn try_run_as_leader<F, Fut, T>(&self, work: F) -> Result<Option<T>>
    where
        F: FnOnce(LockInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        match self.enter_term(Some(Duration::ZERO)).await {
            Ok((term, lease)) => Self::lead_with(term, lease, work).await.map(Some),
            Err(err) if err.is_timeout() => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// Runs `work` in `term`, under the lease a graceful end waits for.
    async fn lead_with<F, Fut, T>(
        term: Arc<Term>,
        _lease: OwnedRwLockReadGuard<()>,
        work: F,
    ) -> Result<T>
    where
        F: FnOnce(LockInfo) -> Fut,
        Fut: Future<Output = T>,
    {
        let info = term.info.clone();
        // The term's lock is held by the campaign: its work is a critical section of that
        // lock, run until the lock goes or the campaign ends the term.
        let (holder, key, mode) = (info.holder_id.clone(), info.key.clone(), info.mode);
        let work = crate::scope::inside(holder, key, mode, work(info));
        match first(term.ended.cancelled(), term.loss.run_until_lost(work)).await {
            First::Right(Ok(value)) => Ok(value),
            First::Left(()) | First::Right(Err(_)) => Err(term.error(&term.info.key)),
        }
    }

    /// Stops campaigning and, if this candidate leads, cancels its leader work, waits for that
    /// work to be dropped and releases the lock. Returns once the lock is released.
    ///
    /// Returns `Ok(true)` when it released a lock the candidate led under, and `Ok(false)`
    /// when the candidate was not leading (or an earlier `resign` already reported the
    /// release). Afterwards the candidate is a follower for good: waiting for leadership fails
    /// with [`Error::Stopped`]. Build a new election to campaign again.
    ///
    /// # Errors
    ///
    /// [`Error::Lock`] with the errors of [`LockGuard::release`]: [`crate::Error::LockLost`]
    /// when the lock turned out to be gone, [`crate::Error::ReleaseFailed`] when the release
    /// was not confirmed (the manager has then closed the session, which frees the lock).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the campaign stops and releases the lock whether or not this future is
    /// polled to completion; calling `resign` again waits for that release.
    pub async fn resign(&self) -> Result<bool> {
        self.resigned.store(true, Ordering::SeqCst);
        self.stop.cancel();
        let mut campaign = self.campaign.lock().await;
        let Some(task) = campaign.as_mut() else {
            return Ok(false);
        };
        let joined = task.await;
        *campaign = None;
        match joined {
            Ok(result) => result,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            // The runtime is shutting down: the campaign and its guard were dropped with it.
            Err(_) => Ok(false),
        }
    }

    /// The current term, once there is one (within `timeout`), with a lease that a graceful
    /// end waits for.
    async fn enter_term(
        &self,
        timeout: Option<Duration>,
    ) -> Result<(Arc<Term>, OwnedRwLockReadGuard<()>)> {
        let Some(timeout) = timeout else {
            return self.next_term().await;
        };
        let deadline = Instant::now().checked_add(timeout);
        let entered = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, self.next_term()).await,
            None => Ok(self.next_term().await),
        };
        // A zero timeout still takes a term that is current right now: the first poll of
        // `next_term` finds it before the timer is looked at.
        entered.unwrap_or_else(|_| {
            Err(Error::Lock(crate::Error::Timeout {
                key: self.key.clone(),
                timeout,
            }))
        })
    }

    /// The current term, once there is one, with a lease that a graceful end waits for.
    async fn next_term(&self) -> Result<(Arc<Term>, OwnedRwLockReadGuard<()>)> {
        let mut terms = self.terms.clone();
        loop {
            let term = terms
                .wait_for(|term| term.as_ref().is_some_and(|term| !term.is_over()))
                .await
                .map_err(|_| Error::Stopped {
                    key: self.key.clone(),
                })?
                .clone()
                .expect("the predicate accepts only a term");
            let lease = Arc::clone(&term.work).read_owned().await;
            // The term may have ended while we queued for the lease; its work must not start.
            if !term.is_over() {
                return Ok((term, lease));
            }
        }
    }
}

impl fmt::Debug for LeaderElection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElection")
            .field("key", &self.key)
            .field("holder_id", &self.holder_id())
            .field("leadership", &*self.leadership.borrow())
            .finish_non_exhaustive()
    }
}

/// Configures and starts a [`LeaderElection`].
#[must_use = "a builder does nothing until `start` is called"]
pub struct LeaderElectionBuilder {
    manager: Arc<dyn LockManager>,
    name: String,
    retry_interval: Duration,
    jitter: f64,
    telemetry: Telemetry,
}

impl LeaderElectionBuilder {
    /// How long a follower waits between two attempts, before jitter. Default: 1 second.
    ///
    /// With a lock manager that detects lost locks, a failover takes up to this interval (times
    /// `1 + jitter`) after the old leader's lock is freed on the server.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Adds a random extra wait of up to `fraction` × the retry interval to each follower's
    /// wait, so candidates started together do not try in lockstep. Clamped to `0.0 ..= 1.0`.
    /// Default: 0.1.
    pub fn jitter(mut self, fraction: f64) -> Self {
        self.jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    crate::telemetry::telemetry_setters!(telemetry);

    /// Spawns the campaign on the current Tokio runtime and returns its handle. The first
    /// attempt is made at once.
    ///
    /// # Errors
    ///
    /// [`Error::NoRuntime`] outside a Tokio runtime.
    pub fn build(self) -> Result<LeaderElection> {
        let key = LockKey::name(format!("leader:{}", self.name));
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return Err(Error::NoRuntime { key });
        };
        let (leadership, leadership_rx) = watch::channel(Leadership::Follower);
        let (terms, terms_rx) = watch::channel(None);
        let stop = CancellationToken::new();
        let resigned = Arc::new(AtomicBool::new(false));
        let holder_id = self.manager.holder_id();
        let campaign = Campaign {
            metrics: LeaderMetrics::build(self.telemetry.meter, &self.name, holder_id),
            key: key.clone(),
            manager: Arc::clone(&self.manager),
            retry: self.retry_interval,
            jitter: self.jitter,
            tracing: self.telemetry.tracing,
            stop: stop.clone(),
            resigned: Arc::clone(&resigned),
            leadership,
            terms,
        };
        let task = runtime.spawn(campaign.run());
        Ok(LeaderElection {
            key,
            manager: self.manager,
            leadership: leadership_rx,
            terms: terms_rx,
            _stop_on_drop: stop.clone().drop_guard(),
            stop,
            resigned,
            campaign: Mutex::new(Some(task)),
        })
    }

    /// The old form of [`build`](Self::build), which panics where `build` answers
    /// [`Error::NoRuntime`].
    ///
    /// # Panics
    ///
    /// When called outside a Tokio runtime.
    #[deprecated(
        since = "0.4.0",
        note = "use `build()?`, which answers `Error::NoRuntime` outside a runtime"
    )]
    pub fn start(self) -> LeaderElection {
        self.build()
            .expect("LeaderElectionBuilder::start must be called within a Tokio runtime")
    }
}

impl fmt::Debug for LeaderElectionBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaderElectionBuilder")
            .field("name", &self.name)
            .field("retry_interval", &self.retry_interval)
            .field("jitter", &self.jitter)
            .field("tracing", &self.telemetry.tracing)
            .finish_non_exhaustive()
    }
}

/// One leadership term, shared by the campaign and the leader work running in it.
struct Term {
    info: LockInfo,
    /// The guard's: leader work stops on a loss without waiting for the campaign to notice.
    loss: LossSignal,
    /// Cancelled when the campaign ends the term, after `why` is set.
    ended: CancellationToken,
    why: OnceLock<TermEnd>,
    /// Read-held by each running leader work; a graceful end takes it for writing, which
    /// waits until every work has been dropped (and, tokio's lock being fair, admits no new
    /// one meanwhile).
    work: Arc<RwLock<()>>,
}

#[derive(Debug, Clone)]
enum TermEnd {
    /// The lock went: lost, or released through the manager.
    Lost(LossCause),
    Stopped,
}

impl Term {
    fn end(&self, why: TermEnd) {
        let _ = self.why.set(why);
        self.ended.cancel();
    }

    fn is_over(&self) -> bool {
        self.ended.is_cancelled() || self.loss.is_lost()
    }

    /// Why the term is over, for the leader work it cut short.
    fn error(&self, key: &LockKey) -> Error {
        let key = key.clone();
        let cause = self.loss.cause().or_else(|| match self.why.get() {
            Some(TermEnd::Lost(cause)) => Some(cause.clone()),
            Some(TermEnd::Stopped) | None => None,
        });
        match cause {
            Some(cause) => Error::Lock(crate::Error::LockLost { key, cause }),
            None => Error::Stopped { key },
        }
    }

    async fn drained(&self) {
        drop(self.work.write().await);
    }
}

/// The campaign task's state; it owns the only senders, so the channels close when it ends.
struct Campaign {
    key: LockKey,
    manager: Arc<dyn LockManager>,
    retry: Duration,
    jitter: f64,
    tracing: bool,
    stop: CancellationToken,
    resigned: Arc<AtomicBool>,
    leadership: watch::Sender<Leadership>,
    terms: watch::Sender<Option<Arc<Term>>>,
    metrics: LeaderMetrics,
}

impl Campaign {
    /// Campaigns until stopped; the result is the final release's.
    async fn run(self) -> Result<bool> {
        // Since when the office may have been vacant, as far as this candidate knows: the
        // last time it saw the lock taken (by someone else, or by itself).
        let mut vacant_since = Instant::now();
        loop {
            // An attempt in flight when the campaign stops is dropped: acquisitions are cancel
            // safe, so it leaves nothing held.
            let attempt = self.manager.try_acquire(self.key.clone());
            match first(self.stop.cancelled(), attempt).await {
                First::Left(()) => return Ok(false),
                First::Right(Ok(Attempt::Acquired(guard))) => {
                    if let Some(released) = self.lead(guard, vacant_since).await {
                        return released;
                    }
                    vacant_since = Instant::now();
                }
                First::Right(Ok(Attempt::Busy)) => vacant_since = Instant::now(), // someone else leads
                First::Right(Err(err)) => {
                    if self.tracing {
                        tracing::warn!(
                            { telemetry::KEY } = %self.key,
                            { telemetry::HOLDER_ID } = self.manager.holder_id(),
                            error = %err,
                            "leader election attempt failed; retrying",
                        );
                    }
                }
            }
            if let First::Left(()) = first(self.stop.cancelled(), sleep(self.next_wait())).await {
                return Ok(false);
            }
        }
    }

    /// Leads under `guard` until the term ends. `Some` carries the final release's result
    /// when the campaign must stop; `None` means campaign again.
    async fn lead(&self, guard: LockGuard, vacant_since: Instant) -> Option<Result<bool>> {
        let info = guard.info().clone();
        let span = self.term_span(&info);
        let started = Instant::now();
        let term = Arc::new(Term {
            info: info.clone(),
            loss: guard.loss_signal().clone(),
            ended: CancellationToken::new(),
            why: OnceLock::new(),
            work: Arc::new(RwLock::new(())),
        });
        // Recorded before the term is published, so whoever sees it sees the metrics too.
        let measured = self.metrics.won(vacant_since.elapsed());
        // Leadership first, then the term (and the reverse at the end): whoever has entered
        // the term (`wait_for_leadership`, `run_as_leader`) already sees itself the leader.
        self.leadership.send_replace(Leadership::Leader(info));
        self.terms.send_replace(Some(Arc::clone(&term)));
        if self.tracing {
            tracing::info!(parent: &span, "became leader");
        }

        let end = self.term_end(&guard).await;
        // Step down before anything else: no one may act on this term any more.
        term.end(end.clone());
        self.terms.send_replace(None);
        measured.ended(self.outcome(&end));
        self.leadership.send_replace(Leadership::Follower);
        span.record(names::TERM_MS, started.elapsed().as_secs_f64() * 1000.0);
        self.record_end(&span, &end);
        if !matches!(end, TermEnd::Stopped) {
            // The lock is gone already: nothing to release. Let the old term's work finish
            // dropping before a new term can start one.
            drop(guard);
            return match first(self.stop.cancelled(), term.drained()).await {
                First::Left(()) => Some(Ok(false)),
                First::Right(()) => None,
            };
        }
        Some(self.step_down(guard, &term, &span).await)
    }

    /// Waits for the end of the term: a stop, or the lock going (lost, or released through
    /// the manager, both of which fire the guard's signal). Never acquires again: one guard,
    /// one lock.
    async fn term_end(&self, guard: &LockGuard) -> TermEnd {
        match first(self.stop.cancelled(), guard.loss_signal().lost()).await {
            First::Left(()) => TermEnd::Stopped,
            First::Right(cause) => TermEnd::Lost(cause),
        }
    }

    /// Records on the term's span how a term that did not stop gracefully ended.
    fn record_end(&self, span: &Span, end: &TermEnd) {
        match end {
            TermEnd::Lost(cause) => {
                span.record(names::OUTCOME, self.outcome(end));
                span.record(telemetry::CAUSE, tracing::field::display(cause));
                span.record("otel.status_code", "ERROR");
                if self.tracing {
                    tracing::warn!(parent: span, %cause, "leadership lost");
                }
            }
            TermEnd::Stopped => {}
        }
    }

    /// The graceful end of a term: the leader work is gone before the lock is, so a successor
    /// never overlaps it.
    async fn step_down(&self, guard: LockGuard, term: &Term, span: &Span) -> Result<bool> {
        term.drained().instrument(span.clone()).await;
        let released = guard.release().instrument(span.clone()).await;
        let released = released.map(|()| true).map_err(Error::Lock);
        span.record(names::OUTCOME, self.outcome(&TermEnd::Stopped));
        if let Err(err) = &released {
            span.record("otel.status_code", "ERROR");
            if self.tracing {
                tracing::warn!(parent: span, error = %err, "resigned, release unconfirmed");
            }
        } else if self.tracing {
            tracing::info!(parent: span, "resigned");
        }
        released
    }

    /// How a term ended, one of [`names::outcome`]. A stop is a resignation or a dropped
    /// handle: `resign` says so before it stops the campaign.
    fn outcome(&self, end: &TermEnd) -> &'static str {
        match end {
            TermEnd::Lost(cause) if cause.is_release() => names::outcome::RELEASED_ELSEWHERE,
            TermEnd::Lost(_) => names::outcome::LOST,
            TermEnd::Stopped if self.resigned.load(Ordering::SeqCst) => names::outcome::RESIGNED,
            TermEnd::Stopped => names::outcome::DROPPED,
        }
    }

    fn term_span(&self, info: &LockInfo) -> Span {
        if !self.tracing {
            return Span::none();
        }
        tracing::info_span!(
            names::TERM_SPAN,
            { telemetry::KEY } = %self.key,
            { telemetry::LOCK_ID } = info.lock_id,
            { telemetry::HOLDER_ID } = &*info.holder_id,
            { names::FENCING_TOKEN } = info.fencing_token,
            { names::OUTCOME } = Empty,
            { telemetry::CAUSE } = Empty,
            { names::TERM_MS } = Empty,
            otel.status_code = Empty,
        )
    }

    /// The retry interval plus a random share of the jitter.
    fn next_wait(&self) -> Duration {
        // 53 random bits make a uniform f64 in [0, 1).
        let random = (uuid::Uuid::new_v4().as_u64_pair().0 >> 11) as f64 / (1u64 << 53) as f64;
        self.retry.mul_f64(1.0 + self.jitter * random)
    }
}

/// The defaults `docs/defaults.md` documents, as the code has them (see `defaults_table`).
#[cfg(test)]
pub(crate) fn documented_defaults() -> Vec<(&'static str, String)> {
    let builder = LeaderElection::builder(Arc::new(crate::InMemoryLockManager::new()), "l");
    vec![
        (
            "LeaderElection retry_interval",
            format!("{:?}", builder.retry_interval),
        ),
        ("LeaderElection jitter", builder.jitter.to_string()),
    ]
}
