//! Semaphores: at most N holders of a name at once, on any lock manager.
//!
//! A [`Semaphore`] of `n` permits is `n` locks, its *slots*, plus a *turnstile* lock. A permit
//! is one slot held exclusively, so no more than `n` holders are inside at once across every
//! process whose managers share a lock server (one PostgreSQL database, or one
//! [`InMemoryLockServer`](crate::InMemoryLockServer)); a holder that dies lets its slot go
//! with its session, as any lock does. Because it only asks its [`LockManager`] for locks, a
//! semaphore works on both managers and on yours, and the conformance suite of
//! `pglock-testing` runs its cases on every manager it checks.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use pglock::{Attempt, InMemoryLockManager};
//! use pglock::semaphore::Semaphore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // At most two exports at once across the fleet.
//! let exports = Semaphore::builder(Arc::new(InMemoryLockManager::new()), "exports", 2).build()?;
//! let first = exports.acquire(Some(Duration::from_secs(5))).await?;
//! let Attempt::Acquired(second) = exports.try_acquire().await? else {
//!     unreachable!("a second permit is free");
//! };
//! assert!(matches!(exports.try_acquire().await?, Attempt::Busy), "two are out");
//! assert_ne!(first.slot(), second.slot());
//! second.release().await?;
//! // Or scoped: the permit is given back on every path.
//! let rows = exports.with_permit(None, |slot| async move { slot.fencing_token }).await?;
//! # let _ = rows;
//! # first.release().await?;
//! # Ok(()) }
//! ```
//!
//! # Keys
//!
//! The locks are plain names, turned into lock ids by [`lock_id`](crate::lock_id) like any
//! other name:
//!
//! | lock | key |
//! | --- | --- |
//! | slot `i`, `0 <= i < n` | `semaphore:{name}:{i}` ([`Semaphore::slot_key`]) |
//! | the turnstile | `semaphore:{name}:turnstile` ([`Semaphore::turnstile_key`]) |
//!
//! A service on the Python original holds the same permit by locking the same name (its key
//! derivation is the same, bit for bit). `pglock holders semaphore:exports:turnstile` shows
//! who waits for a permit, in order, one session per process (a process's other waiters queue
//! inside its manager, behind that session), and `pglock holders semaphore:exports:0` who holds
//! the first slot. Every process must give a semaphore the same name and the
//! same number of permits: a process that believed in more permits would hold slots the others
//! never look at.
//!
//! # Waiting, and fairness
//!
//! [`try_acquire`](Semaphore::try_acquire) looks at each slot once, from a rotating start, and
//! takes the first free one. [`acquire`](Semaphore::acquire) first takes the turnstile, waiting
//! in its queue (the server's first-come, first-served queue across processes, and the
//! manager's FIFO queue within one); only the turnstile's holder looks for a free slot, and it
//! lets the turnstile go once it has one. So permits go in arrival order whoever gives them
//! back, and callers that come back again and again queue behind an earlier waiter instead of
//! starving it. Within one process, a manager may hand the turnstile to its own next caller a
//! few times before the server's queue gets a turn (its handoff limit), so the order across
//! processes is first come, first served per turn, not per caller.
//!
//! `tests/semaphore_permits.rs` defends it: a newcomer on a manager of its own waits at most
//! one turn of each other manager, however fast six others take and give back permits, and
//! callers arriving one after the other get permits in their order.
//!
//! # Costs
//!
//! * The turnstile's holder finds a permit given back with [`Permit::release`] in its own
//!   process (through the [`Semaphore`] or its clones) at once, and any other (dropped, or
//!   given back elsewhere) by looking again, after pauses that start at 2 ms and double up to
//!   50 ms. Each look is a `try_acquire` per slot until one is free:
//!   [`MAX_PERMITS`](Semaphore::MAX_PERMITS) bounds it.
//! * Every look's busy tries are acquisitions like any other: each emits a
//!   `pglock.try_acquire` span and counts in `pglock.acquisitions` with the outcome `busy`,
//!   so a semaphore with a waiter adds up to about twenty busy tries a second per slot. The
//!   semaphore's own spans and metrics ([`telemetry::semaphore`](crate::telemetry::semaphore))
//!   count each permit asked for once.
//! * With a manager that mints fencing tokens, taking the turnstile and taking a slot each
//!   mint one (a write to the fencing table).
//! * Every lock counts against the manager's lock budget: a permit is one lock, a waiter at
//!   the turnstile one more.
//!
//! # Fencing
//!
//! A permit carries its slot's [`LockInfo`]: with a manager that mints fencing tokens, a
//! token that increases with every permit on that slot. Fence a resource per slot, as
//! `tests/semaphore_processes.rs` does: a holder that lost its permit without knowing can then
//! no longer write over the slot's next holder.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::telemetry::instruments::SemaphoreMetrics;
use crate::telemetry::spans::{self, Outcome};
use crate::telemetry::{Telemetry, metrics as metric_names, outcome};
use crate::{
    Attempt, LockGuard, LockHandle, LockInfo, LockKey, LockManager, LockManagerExt, LossSignal,
};

/// The `Result` of 0.3, whose error was the semaphore's for every call. Only
/// [`SemaphoreBuilder::build`] answers a semaphore [`Error`] now; permits fail as locks do,
/// with [`crate::Result`].
#[deprecated(
    since = "0.4.0",
    note = "permits answer `pglock::Result`; `build` answers `Result<Semaphore, semaphore::Error>`"
)]
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`Semaphore`] could not be built. Its permits fail as locks do, with
/// [`crate::Error`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A semaphore needs between 1 and [`Semaphore::MAX_PERMITS`] permits.
    #[error("Semaphore '{name}' cannot have {permits} permits: between 1 and {max} are allowed")]
    InvalidPermits {
        /// The semaphore's name.
        name: String,
        /// The number asked for.
        permits: usize,
        /// [`Semaphore::MAX_PERMITS`].
        max: usize,
    },
}

/// At most `n` holders of a name at once: see the [module documentation](self).
///
/// Cheap to clone; every clone is the same semaphore on the same manager.
#[derive(Clone)]
pub struct Semaphore {
    inner: Arc<Inner>,
}

struct Inner {
    locks: Arc<dyn LockManager>,
    name: String,
    slots: Vec<LockKey>,
    turnstile: LockKey,
    /// Where the next look for a free slot starts, so permits spread over the slots.
    next: AtomicUsize,
    /// Told when a permit of this semaphore (its clones included) is given back, so the
    /// turnstile's holder looks at once instead of at its next pause's end. Permits given back
    /// by other processes are found by the looks alone.
    freed: Notify,
    tracing: bool,
    metrics: SemaphoreMetrics,
}

/// How long the turnstile's holder waits between two looks for a free slot: it starts short
/// and doubles, since a slot usually frees soon after a waiter arrives.
const FIRST_LOOK: Duration = Duration::from_millis(2);
const LONGEST_LOOK: Duration = Duration::from_millis(50);

impl Semaphore {
    /// The most permits a semaphore may have.
    pub const MAX_PERMITS: usize = 1024;

    /// Configures the semaphore `name` of `permits` permits, through `locks`. Every process
    /// must use the same name and the same number of permits.
    pub fn builder(
        locks: Arc<dyn LockManager>,
        name: impl Into<String>,
        permits: usize,
    ) -> SemaphoreBuilder {
        SemaphoreBuilder {
            locks,
            name: name.into(),
            permits,
            telemetry: Telemetry::default(),
        }
    }

    /// The semaphore `name` of `permits` permits, through `locks`, with the default telemetry.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPermits`] unless `1 <= permits <= MAX_PERMITS`.
    #[deprecated(
        since = "0.4.0",
        note = "use `Semaphore::builder(locks, name, permits).build()`"
    )]
    pub fn new(
        locks: Arc<dyn LockManager>,
        name: impl Into<String>,
        permits: usize,
    ) -> std::result::Result<Self, Error> {
        Self::builder(locks, name, permits).build()
    }

    /// The key of slot `slot` of the semaphore `name`: `semaphore:{name}:{slot}`. A Python
    /// service holds the same slot by locking this name.
    ///
    /// ```
    /// use pglock::semaphore::Semaphore;
    /// assert_eq!(Semaphore::slot_key("exports", 1), "semaphore:exports:1");
    /// ```
    pub fn slot_key(name: &str, slot: usize) -> String {
        format!("semaphore:{name}:{slot}")
    }

    /// The key of the semaphore `name`'s turnstile: `semaphore:{name}:turnstile`. Its holder
    /// is the first in line for the next free slot; the others wait for it in the lock's queue.
    ///
    /// ```
    /// use pglock::semaphore::Semaphore;
    /// assert_eq!(Semaphore::turnstile_key("exports"), "semaphore:exports:turnstile");
    /// ```
    pub fn turnstile_key(name: &str) -> String {
        format!("semaphore:{name}:turnstile")
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How many permits it has.
    pub fn permits(&self) -> usize {
        self.inner.slots.len()
    }

    /// Takes a permit if one is free right now, without waiting: [`Attempt::Busy`] when all
    /// are out, or when another caller is at the turnstile (one waiting for a permit, so a
    /// newcomer does not pass a waiter, or a caller of `acquire` or `try_acquire` just passing
    /// through).
    ///
    /// ```compile_fail,E0599
    /// # async fn port(exports: pglock::semaphore::Semaphore) -> pglock::Result<()> {
    /// // An `Attempt` is not an `Option`: this would give the permit back at once.
    /// if exports.try_acquire().await?.is_some() {}
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The lock server's failures (see [`crate::Error`]); a busy semaphore is not an error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no permit is left taken.
    pub async fn try_acquire(&self) -> crate::Result<Attempt<Permit>> {
        let watch = self.watch(true, None);
        let attempt = async {
            let Attempt::Acquired(turnstile) =
                self.inner.locks.try_acquire(&self.inner.turnstile).await?
            else {
                return Ok(None);
            };
            let permit = self.look().await;
            release_turnstile(turnstile, None).await;
            permit
        };
        watch.ended(attempt.await).map(Attempt::from)
    }

    /// Waits for a permit, in arrival order, at most `timeout` (`None`: as long as it takes;
    /// `Some(Duration::ZERO)`: one look). As for a lock, the deadline covers every wait inside
    /// the call (the queue, each look at the slots, getting a connection), and its end is a
    /// timeout.
    ///
    /// # Errors
    ///
    /// [`crate::Error::Timeout`] (naming the turnstile) when the deadline passes first, and
    /// the lock server's failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no permit is left taken, and its place in the
    /// queue is given up (the turnstile, if it was held, is released in the background, as a
    /// dropped guard's lock is).
    ///
    /// The turnstile's release is awaited at most until the deadline, so a call that ends in a
    /// timeout returns at its deadline and lets the turnstile go in the background.
    pub async fn acquire(&self, timeout: Option<Duration>) -> crate::Result<Permit> {
        let watch = self.watch(false, timeout);
        let permit = async {
            let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
            let turnstile = self
                .inner
                .locks
                .acquire(&self.inner.turnstile, timeout)
                .await?;
            let permit = self.wait_for_slot(deadline, timeout).await;
            release_turnstile(turnstile, deadline).await;
            permit.map(Some)
        };
        let permit = watch.ended(permit.await)?;
        Ok(permit.expect("a wait answers a permit or an error"))
    }

    /// Runs `body` while holding a permit, waited for as [`acquire`](Self::acquire) does, and
    /// gives the permit back on every path. The body receives the slot's [`LockInfo`] and is
    /// cancelled if the permit goes ([`Permit::run`]).
    ///
    /// # Errors
    ///
    /// As [`acquire`](Self::acquire); [`crate::Error::LockLost`] when the permit went before
    /// `body` finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body` and gives the permit back in the
    /// background.
    pub async fn with_permit<F, Fut, T>(
        &self,
        timeout: Option<Duration>,
        body: F,
    ) -> crate::Result<T>
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let permit = self.acquire(timeout).await?;
        crate::verbs::scoped(permit, body).await
    }

    /// Runs `body` while holding a permit if one is free right now
    /// ([`try_acquire`](Self::try_acquire)), and gives it back; `Ok(None)` without running it
    /// when none is. The `Option` holds no permit: it is given back before it is returned.
    ///
    /// # Errors
    ///
    /// As [`with_permit`](Self::with_permit); a busy semaphore is `Ok(None)`, not an error.
    ///
    /// # Cancel safety
    ///
    /// As [`with_permit`](Self::with_permit).
    pub async fn try_with_permit<F, Fut, T>(&self, body: F) -> crate::Result<Option<T>>
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let attempt = self.try_acquire().await?;
        crate::verbs::scoped_if(attempt, body).await
    }

    /// The span and metrics of one acquisition, which record how it ended.
    fn watch(&self, try_only: bool, timeout: Option<Duration>) -> Watch<'_> {
        let span = spans::semaphore_span(
            self.inner.tracing,
            try_only,
            &self.inner.name,
            self.permits(),
            timeout,
            self.inner.locks.holder_id(),
        );
        let observed = !span.is_none() || self.inner.metrics.is_on();
        Watch {
            metrics: &self.inner.metrics,
            operation: if try_only {
                metric_names::TRY_ACQUIRE
            } else {
                metric_names::ACQUIRE
            },
            started: observed.then(Instant::now),
            outcome: Outcome::new(span),
        }
    }

    /// The turnstile's holder looks at the slots until one is free or the deadline passes,
    /// pausing between looks.
    async fn wait_for_slot(
        &self,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> crate::Result<Permit> {
        let mut pause = FIRST_LOOK;
        loop {
            let now = Instant::now();
            let look = match deadline {
                // A look cut off by the deadline took nothing: `try_acquire` is cancel safe.
                Some(deadline) if deadline > now => tokio::time::timeout_at(deadline, self.look())
                    .await
                    .unwrap_or(Ok(None)),
                // With no time left (a zero timeout, or the deadline reached while pausing):
                // one last look, each slot one immediate try, as a zero timeout is elsewhere.
                _ => self.look().await,
            };
            if let Some(permit) = look? {
                return Ok(permit);
            }
            let now = Instant::now();
            if deadline.is_some_and(|deadline| deadline <= now) {
                return Err(crate::Error::Timeout {
                    key: self.inner.turnstile.clone(),
                    timeout: timeout.unwrap_or_default(),
                });
            }
            // The last look is made at the deadline itself.
            let wake = deadline.map_or(now + pause, |deadline| deadline.min(now + pause));
            tokio::select! {
                () = tokio::time::sleep_until(wake) => pause = (pause * 2).min(LONGEST_LOOK),
                () = self.inner.freed.notified() => pause = FIRST_LOOK,
            }
        }
    }

    /// One look at every slot, from a rotating start: the first free one, taken.
    async fn look(&self) -> crate::Result<Option<Permit>> {
        let slots = &self.inner.slots;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        for offset in 0..slots.len() {
            let slot = (start + offset) % slots.len();
            match self.inner.locks.try_acquire(&slots[slot]).await {
                Ok(Attempt::Acquired(guard)) => {
                    self.inner.metrics.held(1);
                    let freed = Freed(Arc::clone(&self.inner));
                    return Ok(Some(Permit { guard, slot, freed }));
                }
                Ok(_) => {}
                // Asked from inside this slot's own permit (`Permit::run`): the slot is taken,
                // by the caller; another may be free.
                Err(crate::Error::Reentrant { .. }) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(None)
    }
}

/// One acquisition of a permit, watched: its span's outcome and its metrics, recorded as
/// `cancelled` (the span) if it never ends.
struct Watch<'a> {
    metrics: &'a SemaphoreMetrics,
    operation: &'static str,
    started: Option<Instant>,
    outcome: Outcome,
}

impl Watch<'_> {
    /// Records how the acquisition ended, and hands its result on.
    fn ended(mut self, result: crate::Result<Option<Permit>>) -> crate::Result<Option<Permit>> {
        let ended = match &result {
            Ok(Some(permit)) => {
                self.outcome
                    .record(crate::telemetry::semaphore::SLOT, permit.slot as u64);
                outcome::ACQUIRED
            }
            Ok(None) => outcome::BUSY,
            Err(err) if err.is_timeout() => outcome::TIMEOUT,
            Err(err) => {
                spans::warn_failed(self.outcome.span(), err, "semaphore acquisition failed");
                outcome::ERROR
            }
        };
        if let Some(started) = self.started {
            let waited = started.elapsed();
            self.outcome
                .record(crate::telemetry::WAITED_MS, spans::duration_ms(waited));
            self.metrics.acquisition(self.operation, ended, waited);
        }
        self.outcome.finish(ended, ended == outcome::ERROR);
        result
    }
}

/// Lets the turnstile go, waiting for the release at most until the caller's deadline: past
/// it, the release goes on in the background, as a dropped guard's does. Its failing concerns
/// no permit (an unconfirmed release closes the session, which frees the lock), so it is only
/// logged.
async fn release_turnstile(turnstile: LockGuard, deadline: Option<Instant>) {
    let released = match deadline {
        Some(deadline) => match tokio::time::timeout_at(deadline, turnstile.release()).await {
            Ok(released) => released,
            Err(_) => return,
        },
        None => turnstile.release().await,
    };
    if let Err(err) = released {
        tracing::debug!(error = %err, "a semaphore's turnstile release was not confirmed");
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("permits", &self.inner.slots.len())
            .finish_non_exhaustive()
    }
}

/// Configures a [`Semaphore`]: its telemetry; [`build`](Self::build) checks the number of
/// permits.
#[must_use = "a builder does nothing until `build` is called"]
pub struct SemaphoreBuilder {
    locks: Arc<dyn LockManager>,
    name: String,
    permits: usize,
    telemetry: Telemetry,
}

impl SemaphoreBuilder {
    crate::telemetry::telemetry_setters!(telemetry);

    /// The semaphore.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPermits`] unless `1 <= permits <= MAX_PERMITS`.
    pub fn build(self) -> std::result::Result<Semaphore, Error> {
        let SemaphoreBuilder {
            locks,
            name,
            permits,
            telemetry,
        } = self;
        if !(1..=Semaphore::MAX_PERMITS).contains(&permits) {
            return Err(Error::InvalidPermits {
                name,
                permits,
                max: Semaphore::MAX_PERMITS,
            });
        }
        let slots = (0..permits)
            .map(|slot| LockKey::name(Semaphore::slot_key(&name, slot)))
            .collect();
        let metrics = SemaphoreMetrics::build(telemetry.meter, &name, locks.holder_id());
        Ok(Semaphore {
            inner: Arc::new(Inner {
                turnstile: LockKey::name(Semaphore::turnstile_key(&name)),
                locks,
                name,
                slots,
                next: AtomicUsize::new(0),
                freed: Notify::new(),
                tracing: telemetry.tracing,
                metrics,
            }),
        })
    }
}

impl fmt::Debug for SemaphoreBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphoreBuilder")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .field("tracing", &self.telemetry.tracing)
            .finish_non_exhaustive()
    }
}

/// One permit of a [`Semaphore`]: its slot, held. A [`LockHandle`], with the exits of a
/// [`LockGuard`]: [`release`](Permit::release), drop (the release then runs in the
/// background), and [`leak`](Permit::leak).
#[must_use = "the permit is given back as soon as it is dropped"]
#[derive(Debug)]
pub struct Permit {
    // Dropped in this order: the guard's lock is let go, then the waiter is told.
    guard: LockGuard,
    slot: usize,
    freed: Freed,
}

/// Tells the semaphore's waiter, once dropped, that a permit was given back.
struct Freed(Arc<Inner>);

impl Drop for Freed {
    fn drop(&mut self) {
        self.0.metrics.held(-1);
        self.0.freed.notify_one();
    }
}

impl fmt::Debug for Freed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Freed")
    }
}

impl Permit {
    /// Which slot the permit holds, `0..permits`.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The slot's acquisition: its key, its fencing token (where the manager mints them).
    /// Tokens increase per slot, so fence a resource per slot, or by the token with the slot.
    pub fn info(&self) -> &LockInfo {
        self.guard.info()
    }

    /// Fires when the permit's slot goes: lost, or released through the manager.
    pub fn loss_signal(&self) -> &LossSignal {
        self.guard.loss_signal()
    }

    /// Runs `body` while the permit is held, cancelling it if the permit goes (see
    /// [`LockGuard::run`]).
    ///
    /// # Errors
    ///
    /// [`crate::Error::LockLost`] when the permit went before `body` finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body`; the permit is untouched.
    pub async fn run<F: Future>(&self, body: F) -> crate::Result<F::Output> {
        self.guard.run(body).await
    }

    /// Gives the permit back now.
    ///
    /// # Errors
    ///
    /// As for [`LockGuard::release`]: the permit's slot had gone, or the release could not be
    /// confirmed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockGuard::release`].
    pub async fn release(self) -> crate::Result<()> {
        let Permit { guard, freed, .. } = self;
        let released = guard.release().await;
        drop(freed);
        released
    }

    /// Keeps the permit's slot held without it, in the manager's registry, until
    /// [`release`](crate::LockManagerExt::release) names its key (`info().key`) or
    /// [`release_all`](crate::LockManager::release_all) runs, and returns its [`LockInfo`].
    pub fn leak(self) -> LockInfo {
        let Permit { guard, freed, .. } = self;
        let info = guard.leak();
        drop(freed);
        info
    }
}

impl crate::handle::sealed::Sealed for Permit {}

impl LockHandle for Permit {
    type Info = LockInfo;

    fn info(&self) -> &LockInfo {
        Permit::info(self)
    }

    fn loss_signal(&self) -> &LossSignal {
        Permit::loss_signal(self)
    }

    fn run<F>(&self, body: F) -> impl Future<Output = crate::Result<F::Output>> + Send
    where
        F: Future + Send,
    {
        Permit::run(self, body)
    }

    fn release(self) -> impl Future<Output = crate::Result<()>> + Send {
        Permit::release(self)
    }

    fn leak(self) -> LockInfo {
        Permit::leak(self)
    }
}
