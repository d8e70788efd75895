//! What a try hands back.

use crate::{LockGuard, LockInfo};

/// The outcome of [`try_acquire`](crate::LockManagerExt::try_acquire) and
/// [`try_acquire_shared`](crate::LockManagerExt::try_acquire_shared): the lock's guard, or
/// `Busy`.
///
/// Take the guard with a pattern; the lock is released when the guard is, as always:
///
/// ```
/// use pglock::{Attempt, InMemoryLockManager, LockManagerExt};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
/// let locks = InMemoryLockManager::new();
/// let Attempt::Acquired(guard) = locks.try_acquire("job:nightly").await? else {
///     return Ok(()); // another replica runs it
/// };
/// // ... the job ...
/// guard.release().await?;
/// # Ok(()) }
/// ```
///
/// # Why not an `Option`
///
/// Code ported from the Python original tries, works, then releases *the key*. Written against
/// an `Option<LockGuard>`, `if locks.try_acquire(key).await?.is_some()` compiles, drops the
/// guard at the end of the condition, and so works without the lock and fails to release it.
/// An `Attempt` has no `is_some`, so that port does not compile:
///
/// ```compile_fail,E0599
/// # use pglock::{InMemoryLockManager, LockManagerExt};
/// # async fn port(locks: InMemoryLockManager) -> pglock::Result<()> {
/// if locks.try_acquire("leader:jobs").await?.is_some() {
///     // ... lead ...
///     locks.release("leader:jobs").await?;
/// }
/// # Ok(()) }
/// ```
///
/// Its faithful form keeps the lock in the manager's registry until `release(key)`, with
/// [`leak`](Attempt::leak):
///
/// ```
/// # use pglock::{InMemoryLockManager, LockManagerExt};
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
/// # let locks = InMemoryLockManager::new();
/// if let Some(term) = locks.try_acquire("leader:jobs").await?.leak() {
///     // ... lead, with term.fencing_token ...
///     assert!(locks.is_held("leader:jobs").await);
///     locks.release("leader:jobs").await?;
/// }
/// # Ok(()) }
/// ```
#[must_use = "an acquired lock is released as soon as the `Attempt` is dropped: take its guard with `if let Attempt::Acquired(guard) = ..`, or keep the lock until `release(key)` with `.leak()`"]
#[derive(Debug)]
pub enum Attempt {
    /// The lock was free and is now held, by this guard.
    Acquired(LockGuard),
    /// Someone holds the lock in a conflicting mode (this manager included); nothing was taken.
    Busy,
}

impl Attempt {
    /// The guard, if the lock was acquired.
    ///
    /// The guard is dropped, and the lock released, wherever the `Option` is: bind it
    /// (`if let Some(guard) = attempt.into_guard()`); `attempt.into_guard().is_some()` releases
    /// at once.
    pub fn into_guard(self) -> Option<LockGuard> {
        match self {
            Attempt::Acquired(guard) => Some(guard),
            Attempt::Busy => None,
        }
    }

    /// Keeps an acquired lock held without a guard, in the manager's registry, until
    /// [`release`](crate::LockManagerExt::release) or
    /// [`release_all`](crate::LockManager::release_all) names it (as
    /// [`LockGuard::leak`]), and returns its [`LockInfo`]; `None` when the lock was busy.
    pub fn leak(self) -> Option<LockInfo> {
        self.into_guard().map(LockGuard::leak)
    }
}

impl From<Option<LockGuard>> for Attempt {
    fn from(guard: Option<LockGuard>) -> Self {
        guard.map_or(Attempt::Busy, Attempt::Acquired)
    }
}

impl From<Attempt> for Option<LockGuard> {
    fn from(attempt: Attempt) -> Self {
        attempt.into_guard()
    }
}
