//! The caller's API, written once on top of the [`LockManager`] port.

use std::future::Future;
use std::time::Duration;

use crate::manager::acquire;
use crate::{
    AcquireOptions, Attempt, Error, LockGuard, LockInfo, LockKey, LockManager, LockMode, Result,
    Wait,
};

/// Taking and releasing locks: the methods callers use, on every [`LockManager`] including
/// `dyn LockManager`.
///
/// Import it next to the trait (`use pglock::{LockManager, LockManagerExt};`, or
/// `use pglock::prelude::*;`): that one import gives the same API on a concrete manager and
/// on `Arc<dyn LockManager>`. The managers of this crate also have `acquire`,
/// `acquire_shared`, `try_acquire`, `try_acquire_shared`, `release` and `is_held` as inherent
/// methods, which mean exactly what these do and which method syntax on the concrete type
/// picks: the acquisitions skip the allocation that reaching the engine through the
/// object-safe port costs. Every method that takes a key takes any kind of key: a string
/// (hashed with the frozen [`lock_id`](crate::lock_id) derivation), an `i64`, an `(i32, i32)`
/// pair or a [`LockKey`].
///
/// | method | waits | hands back |
/// | --- | --- | --- |
/// | [`with_lock`](Self::with_lock), [`with_lock_shared`](Self::with_lock_shared) | until the deadline | the body's value; the lock is released on every path |
/// | [`try_with_lock`](Self::try_with_lock), [`try_with_lock_shared`](Self::try_with_lock_shared) | never | `Some(value)`, or `None` (body skipped) when held |
/// | [`acquire`](Self::acquire), [`acquire_shared`](Self::acquire_shared) | until the deadline | a [`LockGuard`] |
/// | [`try_acquire`](Self::try_acquire), [`try_acquire_shared`](Self::try_acquire_shared) | never | [`Attempt::Acquired`] with a [`LockGuard`], or [`Attempt::Busy`] when held |
/// | [`release`](Self::release) | | releases a key's lock, however it was taken |
/// | [`is_held`](Self::is_held) | | whether this manager holds a key |
///
/// Every method keeps [the contract](LockManager#the-contract): callers of one manager take
/// turns on a key, and `timeout` is one deadline for the whole call (`None` waits as long as it
/// takes, `Some(Duration::ZERO)` makes exactly one attempt).
///
/// # Nesting
///
/// What this trait adds to the contract: asking for a key inside the critical section of the
/// same key (the body of [`with_lock`](Self::with_lock) or [`LockGuard::run`]) returns
/// [`Error::Reentrant`] at once, since waiting would wait for itself. A guard held in a plain
/// variable is not a critical section: asking for its key again waits for the guard like any
/// other caller, within the deadline, as a second `lock()` of a `tokio::sync::Mutex` whose
/// guard is alive does. Wrap the work in [`LockGuard::run`] (or use `with_lock`) to have such a
/// mistake refused instead.
pub trait LockManagerExt: LockManager {
    /// Waits for the exclusive lock on `key` and hands back its guard.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when the deadline passes first; [`Error::Reentrant`] inside a
    /// critical section on `key`; otherwise the backend's failures (see [`Error`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pglock::{InMemoryLockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let guard = locks.acquire("rebuild:orders", Some(Duration::from_secs(2))).await?;
    /// assert_eq!(guard.info().key, "rebuild:orders");
    /// // Another caller waits for the first, here until its deadline.
    /// let err = locks.acquire("rebuild:orders", Some(Duration::from_millis(10))).await.unwrap_err();
    /// assert!(err.is_timeout());
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    fn acquire(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        acquire(self, key.into(), LockMode::Exclusive, timeout)
    }

    /// Waits for `key` in shared mode and hands back its guard: shared holders exclude
    /// exclusive ones, not each other. Otherwise as [`acquire`](Self::acquire).
    ///
    /// # Errors
    ///
    /// As for [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    fn acquire_shared(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        acquire(self, key.into(), LockMode::Shared, timeout)
    }

    /// Takes the exclusive lock on `key` if it is free right now, without waiting:
    /// [`Attempt::Busy`] when anyone holds it, this manager included.
    ///
    /// For the Python original's "try, then later `release(key)`", leak the guard into the
    /// manager's registry: `locks.try_acquire(key).await?.leak()` (see [`Attempt`]).
    ///
    /// # Errors
    ///
    /// Failures are errors, never [`Attempt::Busy`]; [`Error::Reentrant`] inside a critical
    /// section on `key`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{Attempt, InMemoryLockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let Attempt::Acquired(guard) = locks.try_acquire("job:nightly").await? else {
    ///     return Ok(()); // another replica runs it
    /// };
    /// let again = locks.try_acquire("job:nightly").await?;
    /// assert!(matches!(again, Attempt::Busy), "held, even by us");
    /// // ... the job ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    fn try_acquire(&self, key: impl Into<LockKey>) -> impl Future<Output = Result<Attempt>> + Send {
        try_acquire(self, key.into(), LockMode::Exclusive)
    }

    /// Takes `key` in shared mode if no one holds it exclusively right now, without waiting:
    /// [`Attempt::Busy`] when it is held exclusively by anyone, or in any mode by this manager.
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](Self::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    fn try_acquire_shared(
        &self,
        key: impl Into<LockKey>,
    ) -> impl Future<Output = Result<Attempt>> + Send {
        try_acquire(self, key.into(), LockMode::Shared)
    }

    /// Releases this manager's lock on `key`, however it was taken. A guard standing for it is
    /// told: its loss signal fires with [`LossCause::Released`](crate::LossCause::Released),
    /// and a [`with_lock`](Self::with_lock) body running under it is cancelled.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] when this manager does not hold `key`;
    /// [`Error::ReleaseFailed`] when the release could not be confirmed (the registry forgets
    /// the lock either way).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once the registry has forgotten the lock, it is released even if the
    /// future is dropped.
    fn release(&self, key: impl Into<LockKey>) -> impl Future<Output = Result<()>> + Send {
        let key = key.into();
        async move { self.unlock(&key).await }
    }

    /// True when this manager holds `key`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn is_held(&self, key: impl Into<LockKey>) -> impl Future<Output = bool> + Send {
        let key = key.into();
        async move { self.holds(&key).await }
    }

    /// Runs `body` while holding the exclusive lock on `key`, and releases the lock afterwards
    /// on every path: success, panic unwinding, or cancellation of the returned future.
    ///
    /// `timeout` bounds the acquisition, as for [`acquire`](Self::acquire). The body receives
    /// the acquisition's [`LockInfo`] (its fencing token included, where the manager mints
    /// them) and runs as a critical section ([`LockGuard::run`]): if the lock goes while it
    /// runs (lost, or released through the manager) it is cancelled, and asking for `key` again
    /// inside it fails at once with [`Error::Reentrant`].
    ///
    /// # Errors
    ///
    /// * the errors of [`acquire`](Self::acquire), when the lock is not acquired (the body does
    ///   not run);
    /// * [`Error::LockLost`], when the lock goes before the body finishes or before the
    ///   release.
    ///
    /// A release that cannot be confirmed once the body has finished is logged and otherwise
    /// ignored: the body ran under the lock, and the lock's session has been closed, which
    /// frees it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the body and releases the lock in the
    /// background (see [`LockGuard`]'s drop).
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let rebuilt = locks
    ///     .with_lock("rebuild:orders", None, |info| async move {
    ///         // ... the critical section ...
    ///         format!("rebuilt under lock {}", info.lock_id)
    ///     })
    ///     .await?;
    /// assert!(rebuilt.starts_with("rebuilt"));
    /// # Ok(()) }
    /// ```
    fn with_lock<F, Fut, T>(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
        body: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        locked(self, key.into(), LockMode::Exclusive, timeout, body)
    }

    /// As [`with_lock`](Self::with_lock), holding `key` in shared mode: readers that must not
    /// overlap a writer, but may overlap each other.
    ///
    /// # Errors
    ///
    /// As for [`with_lock`](Self::with_lock).
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock`](Self::with_lock).
    fn with_lock_shared<F, Fut, T>(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
        body: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        locked(self, key.into(), LockMode::Shared, timeout, body)
    }

    /// Takes the exclusive locks of every one of `keys` within one deadline, or none of them,
    /// and hands back one [`LockSet`](crate::LockSet) that releases them all.
    ///
    /// The keys are taken in one order every caller of this method uses (by lock id), whatever
    /// order they are named in, so two callers whose sets overlap never deadlock each other,
    /// in one process or many. A key named twice is taken once. `Some(Duration::ZERO)` makes
    /// one try of each key.
    ///
    /// ```
    /// use std::time::Duration;
    /// use pglock::{InMemoryLockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// // transfer(a, b) and transfer(b, a) take the same two locks in the same order.
    /// let both = locks
    ///     .acquire_all(["account:b", "account:a"], Some(Duration::from_secs(5)))
    ///     .await?;
    /// assert_eq!(both.len(), 2);
    /// both.release().await?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The error of the first key that could not be taken ([`Error::Timeout`] naming it when
    /// the deadline passed); the keys taken before it are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the locks taken before the future was dropped are released, in the
    /// background, as dropped guards are.
    fn acquire_all<K: Into<LockKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<crate::LockSet>> + Send {
        let keys = crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
        crate::lock_set::acquire_all(self, keys, LockMode::Exclusive, timeout)
    }

    /// [`acquire_all`](Self::acquire_all) in shared mode: every key shared, all or nothing.
    ///
    /// # Errors
    ///
    /// As [`acquire_all`](Self::acquire_all).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_all`](Self::acquire_all).
    fn acquire_all_shared<K: Into<LockKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<crate::LockSet>> + Send {
        let keys = crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
        crate::lock_set::acquire_all(self, keys, LockMode::Shared, timeout)
    }

    /// [`with_lock`](Self::with_lock) over several keys: takes them all as
    /// [`acquire_all`](Self::acquire_all) does, runs `body` (given what each lock was granted
    /// as) as the critical section of every one of them, then releases them all.
    ///
    /// # Errors
    ///
    /// As [`acquire_all`](Self::acquire_all); [`Error::LockLost`] when a lock went before
    /// `body` finished (`body` is then dropped).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body` and releases the locks in the background.
    fn with_locks<K, F, Fut, T>(
        &self,
        keys: impl IntoIterator<Item = K>,
        timeout: Option<Duration>,
        body: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        K: Into<LockKey>,
        F: FnOnce(Vec<LockInfo>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let keys = crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
        async move {
            let set =
                crate::lock_set::acquire_all(self, keys, LockMode::Exclusive, timeout).await?;
            let value = set.run(body(set.infos().cloned().collect())).await?;
            after_section(value, set.release().await)
        }
    }

    /// Runs `body` under the exclusive lock on `key` if the lock is free right now, and returns
    /// `Ok(None)` without running it when anyone holds the lock: "try, else skip", for work
    /// that another replica doing it right now makes unnecessary. Not for a job on a timer: a
    /// short run ends before a replica whose timer fires late tries, which then runs it again;
    /// [`ScheduledJob`](crate::schedule::ScheduledJob) runs a job at most once per window.
    ///
    /// # Errors
    ///
    /// As for [`with_lock`](Self::with_lock); a held lock is `Ok(None)`, not an error.
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock`](Self::with_lock).
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let ran = locks.try_with_lock("rebuild:index", |_| async { "rebuilt" }).await?;
    /// assert_eq!(ran, Some("rebuilt"));
    /// let _held = locks.acquire("rebuild:index", None).await?;
    /// assert_eq!(locks.try_with_lock("rebuild:index", |_| async { "twice" }).await?, None);
    /// # Ok(()) }
    /// ```
    fn try_with_lock<F, Fut, T>(
        &self,
        key: impl Into<LockKey>,
        body: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        try_locked(self, key.into(), LockMode::Exclusive, body)
    }

    /// As [`try_with_lock`](Self::try_with_lock), holding `key` in shared mode.
    ///
    /// # Errors
    ///
    /// As for [`try_with_lock`](Self::try_with_lock).
    ///
    /// # Cancel safety
    ///
    /// As for [`with_lock`](Self::with_lock).
    fn try_with_lock_shared<F, Fut, T>(
        &self,
        key: impl Into<LockKey>,
        body: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        try_locked(self, key.into(), LockMode::Shared, body)
    }
}

impl<M: LockManager + ?Sized> LockManagerExt for M {}

async fn try_acquire<M: LockManager + ?Sized>(
    manager: &M,
    key: LockKey,
    mode: LockMode,
) -> Result<Attempt> {
    crate::scope::refuse_nested(manager.holder_id(), &key)?;
    let guard = manager
        .lock(&key, AcquireOptions::new(mode, Wait::No))
        .await?;
    Ok(Attempt::from(guard))
}

/// `with_lock` in `mode`: waits for the lock, then runs `body` under it.
async fn locked<M, F, Fut, T>(
    manager: &M,
    key: LockKey,
    mode: LockMode,
    timeout: Option<Duration>,
    body: F,
) -> Result<T>
where
    M: LockManager + ?Sized,
    F: FnOnce(LockInfo) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    let guard = acquire(manager, key, mode, timeout).await?;
    run_and_release(guard, body).await
}

/// `try_with_lock` in `mode`: runs `body` under the lock if it is free right now.
async fn try_locked<M, F, Fut, T>(
    manager: &M,
    key: LockKey,
    mode: LockMode,
    body: F,
) -> Result<Option<T>>
where
    M: LockManager + ?Sized,
    F: FnOnce(LockInfo) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    match try_acquire(manager, key, mode).await? {
        Attempt::Acquired(guard) => run_and_release(guard, body).await.map(Some),
        Attempt::Busy => Ok(None),
    }
}

/// Runs `body` as `guard`'s critical section, then releases the lock.
async fn run_and_release<F, Fut, T>(guard: LockGuard, body: F) -> Result<T>
where
    F: FnOnce(LockInfo) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    let value = guard.run(body(guard.info().clone())).await?;
    after_section(value, guard.release().await)
}

/// A section's value once its locks are released: a lock lost before the release is the
/// caller's error; a release the server did not confirm is only logged (the session holding
/// the lock was closed, which frees it).
fn after_section<T>(value: T, released: Result<()>) -> Result<T> {
    match released {
        Ok(()) => Ok(value),
        Err(lost @ Error::LockLost { .. }) => Err(lost),
        Err(err) => {
            tracing::warn!(error = %err, "release after a critical section unconfirmed");
            Ok(value)
        }
    }
}
