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
//! use pglock::InMemoryLockManager;
//! use pglock::semaphore::Semaphore;
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::semaphore::Result<()> {
//! // At most two exports at once across the fleet.
//! let exports = Semaphore::new(Arc::new(InMemoryLockManager::new()), "exports", 2)?;
//! let first = exports.acquire(Some(Duration::from_secs(5))).await?;
//! let second = exports.try_acquire().await?.expect("a second permit is free");
//! assert!(exports.try_acquire().await?.is_none(), "two are out");
//! assert_ne!(first.slot(), second.slot());
//! second.release().await?;
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
//! `tests/semaphore_permits.rs` measures it: six callers on three managers take and give back two
//! permits as fast as they can while a seventh arrives on a manager of its own, and the test
//! counts the permits the others got between the moment the server queued the newcomer's wait
//! and its permit. It asserts at most one turn of each other manager (53) and prints the
//! count: 18 runs on a busy two-core machine printed 1 to 39, 9 at the median. Four callers
//! arriving one after the other get the permit in their order.
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
//!   so a semaphore with a waiter adds up to about twenty busy tries a second per slot.
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
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::{Attempt, LockGuard, LockInfo, LockKey, LockManager, LockManagerExt, LossSignal};

/// A `Result` whose error is the semaphore [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a [`Semaphore`] call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lock of the semaphore failed: the deadline passed while every permit was out
    /// ([`crate::Error::Timeout`], naming the turnstile or a slot), or the lock server refused.
    #[error(transparent)]
    Lock(#[from] crate::Error),

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
}

/// How long the turnstile's holder waits between two looks for a free slot: it starts short
/// and doubles, since a slot usually frees soon after a waiter arrives.
const FIRST_LOOK: Duration = Duration::from_millis(2);
const LONGEST_LOOK: Duration = Duration::from_millis(50);

impl Semaphore {
    /// The most permits a semaphore may have.
    pub const MAX_PERMITS: usize = 1024;

    /// The semaphore `name` of `permits` permits, through `locks`. Every process must use the
    /// same name and the same number of permits.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPermits`] unless `1 <= permits <= MAX_PERMITS`.
    pub fn new(
        locks: Arc<dyn LockManager>,
        name: impl Into<String>,
        permits: usize,
    ) -> Result<Self> {
        let name = name.into();
        if !(1..=Self::MAX_PERMITS).contains(&permits) {
            return Err(Error::InvalidPermits {
                name,
                permits,
                max: Self::MAX_PERMITS,
            });
        }
        let slots = (0..permits)
            .map(|slot| LockKey::name(Self::slot_key(&name, slot)))
            .collect();
        Ok(Semaphore {
            inner: Arc::new(Inner {
                locks,
                turnstile: LockKey::name(Self::turnstile_key(&name)),
                name,
                slots,
                next: AtomicUsize::new(0),
                freed: Notify::new(),
            }),
        })
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

    /// Takes a permit if one is free right now, without waiting: `None` when all are out, or
    /// when another caller is at the turnstile (one waiting for a permit, so a newcomer does
    /// not pass a waiter, or a caller of `acquire` or `try_acquire` just passing through).
    ///
    /// # Errors
    ///
    /// [`Error::Lock`] when the lock server fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no permit is left taken.
    pub async fn try_acquire(&self) -> Result<Option<Permit>> {
        let Attempt::Acquired(turnstile) =
            self.inner.locks.try_acquire(&self.inner.turnstile).await?
        else {
            return Ok(None);
        };
        let permit = self.look().await;
        release_turnstile(turnstile, None).await;
        permit
    }

    /// Waits for a permit, in arrival order, at most `timeout` (`None`: as long as it takes).
    /// As for a lock, the deadline covers every wait inside the call (the queue, each look at
    /// the slots, getting a connection), and its end is a timeout.
    ///
    /// # Errors
    ///
    /// [`Error::Lock`] with [`crate::Error::Timeout`] (naming the turnstile) when the deadline
    /// passes first, and the lock server's failures.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, no permit is left taken, and its place in the
    /// queue is given up (the turnstile, if it was held, is released in the background, as a
    /// dropped guard's lock is).
    ///
    /// The turnstile's release is awaited at most until the deadline, so a call that ends in a
    /// timeout returns at its deadline and lets the turnstile go in the background.
    pub async fn acquire(&self, timeout: Option<Duration>) -> Result<Permit> {
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let turnstile = self
            .inner
            .locks
            .acquire(&self.inner.turnstile, timeout)
            .await?;
        let permit = self.wait_for_slot(deadline, timeout).await;
        release_turnstile(turnstile, deadline).await;
        permit
    }

    /// The turnstile's holder looks at the slots until one is free or the deadline passes,
    /// pausing between looks.
    async fn wait_for_slot(
        &self,
        deadline: Option<Instant>,
        timeout: Option<Duration>,
    ) -> Result<Permit> {
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
                return Err(Error::Lock(crate::Error::Timeout {
                    key: self.inner.turnstile.clone(),
                    timeout: timeout.unwrap_or_default(),
                }));
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
    async fn look(&self) -> Result<Option<Permit>> {
        let slots = &self.inner.slots;
        let start = self.inner.next.fetch_add(1, Ordering::Relaxed);
        for offset in 0..slots.len() {
            let slot = (start + offset) % slots.len();
            match self.inner.locks.try_acquire(&slots[slot]).await {
                Ok(Attempt::Acquired(guard)) => {
                    let freed = Freed(Arc::clone(&self.inner));
                    return Ok(Some(Permit { guard, slot, freed }));
                }
                Ok(Attempt::Busy) => {}
                // Asked from inside this slot's own permit (`Permit::run`): the slot is taken,
                // by the caller; another may be free.
                Err(crate::Error::Reentrant { .. }) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(None)
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

/// One permit of a [`Semaphore`]: its slot, held. It has the exits of a [`LockGuard`]:
/// [`release`](Permit::release), drop (the release then runs in the background), and no leak.
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
    pub async fn run<F: std::future::Future>(&self, body: F) -> crate::Result<F::Output> {
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
}
