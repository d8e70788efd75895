//! What a try hands back.

use crate::{LockGuard, LockHandle};

/// The outcome of every try that can hand back a held lock: the lock's handle, or `Busy`.
///
/// | try | hands back |
/// | --- | --- |
/// | [`try_acquire`](crate::LockManagerExt::try_acquire), [`try_acquire_shared`](crate::LockManagerExt::try_acquire_shared) | `Attempt<LockGuard>` (the default) |
/// | [`try_acquire_all`](crate::LockManagerExt::try_acquire_all), [`try_acquire_all_shared`](crate::LockManagerExt::try_acquire_all_shared) | `Attempt<LockSet>` |
/// | [`Semaphore::try_acquire`](crate::semaphore::Semaphore::try_acquire) | `Attempt<Permit>` |
///
/// Take the handle with a pattern; the lock is released when the handle is, as always:
///
/// ```
/// use pglock::{Attempt, InMemoryLockManager};
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
/// An `Attempt` has no `is_some`, so that port does not compile, whatever it tried:
///
/// ```compile_fail,E0599
/// # use pglock::InMemoryLockManager;
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
/// # use pglock::InMemoryLockManager;
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
/// # let locks = InMemoryLockManager::new();
/// if let Some(term) = locks.try_acquire("leader:jobs").await?.leak() {
///     println!("leading with token {:?}", term.fencing_token);
///     assert!(locks.is_held("leader:jobs").await);
///     locks.release("leader:jobs").await?;
/// }
/// # Ok(()) }
/// ```
#[must_use = "an acquired lock is released as soon as the `Attempt` is dropped: take its handle with `if let Attempt::Acquired(handle) = ..`, or keep the lock until `release(key)` with `.leak()`"]
#[derive(Debug)]
#[non_exhaustive]
pub enum Attempt<H = LockGuard> {
    /// The lock was free and is now held, by this handle.
    Acquired(H),
    /// Someone holds the lock in a conflicting mode (this manager included); nothing was taken.
    Busy,
}

impl<H> Attempt<H> {
    /// The handle, if the lock was acquired.
    ///
    /// The handle is dropped, and the lock released, wherever the `Option` is: bind it
    /// (`if let Some(guard) = attempt.into_handle()`); `attempt.into_handle().is_some()`
    /// releases at once.
    pub fn into_handle(self) -> Option<H> {
        match self {
            Attempt::Acquired(handle) => Some(handle),
            Attempt::Busy => None,
        }
    }

    /// The attempt with its handle, if any, turned into another by `f`: for a manager that
    /// wraps another one's guards.
    pub fn map<U>(self, f: impl FnOnce(H) -> U) -> Attempt<U> {
        match self {
            Attempt::Acquired(handle) => Attempt::Acquired(f(handle)),
            Attempt::Busy => Attempt::Busy,
        }
    }

    /// The old name of [`into_handle`](Self::into_handle).
    #[deprecated(since = "0.4.0", note = "renamed `into_handle`")]
    pub fn into_guard(self) -> Option<H> {
        self.into_handle()
    }
}

impl<H: LockHandle> Attempt<H> {
    /// Keeps an acquired lock held without its handle, in the manager's registry, until
    /// [`release`](crate::LockManagerExt::release) or
    /// [`release_all`](crate::LockManager::release_all) names it (see
    /// [`LockHandle::leak`]), and returns what was granted; `None` when the lock was busy.
    pub fn leak(self) -> Option<<H::Info as ToOwned>::Owned> {
        self.into_handle().map(LockHandle::leak)
    }
}

impl<H> From<Option<H>> for Attempt<H> {
    fn from(handle: Option<H>) -> Self {
        handle.map_or(Attempt::Busy, Attempt::Acquired)
    }
}

impl<H> From<Attempt<H>> for Option<H> {
    fn from(attempt: Attempt<H>) -> Self {
        attempt.into_handle()
    }
}
