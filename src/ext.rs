//! Conveniences built on the [`LockManager`] port, available on every implementation.

use std::future::Future;
use std::time::Duration;

use crate::{Error, LockGuard, LockInfo, LockKey, LockManager, LockMode, Result};

/// Conveniences for every [`LockManager`], including `dyn LockManager`.
///
/// Import it next to the trait: `use pglock::{LockManager, LockManagerExt};`. Every method takes
/// any key: a string (the frozen name derivation), an `i64`, an `(i32, i32)` pair or a
/// [`LockKey`].
///
/// | method | waits | hands back |
/// | --- | --- | --- |
/// | [`lock`](Self::lock), [`lock_shared`](Self::lock_shared) | until the deadline | a [`LockGuard`] |
/// | [`try_lock`](Self::try_lock), [`try_lock_shared`](Self::try_lock_shared) | never | `Some(LockGuard)`, or `None` when held |
/// | [`with_lock`](Self::with_lock), [`with_lock_shared`](Self::with_lock_shared) | until the deadline | the body's value; the lock is released on every path |
/// | [`try_with_lock`](Self::try_with_lock) | never | `Some(value)`, or `None` (body skipped) when held |
pub trait LockManagerExt: LockManager {
    /// Waits for the exclusive lock on `key`; [`LockManager::acquire`] for any kind of key.
    ///
    /// # Errors
    ///
    /// As for [`LockManager::acquire_key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    fn lock(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let key = key.into();
        async move { self.acquire_key(&key, LockMode::Exclusive, timeout).await }
    }

    /// Waits for `key` in shared mode; [`LockManager::acquire_shared`] for any kind of key.
    ///
    /// # Errors
    ///
    /// As for [`LockManager::acquire_key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    fn lock_shared(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let key = key.into();
        async move { self.acquire_key(&key, LockMode::Shared, timeout).await }
    }

    /// Takes the exclusive lock on `key` if it is free right now, and hands back a guard:
    /// `None` when anyone holds it, this manager included.
    ///
    /// Unlike [`LockManager::try_acquire`], which keeps the lock in the registry until
    /// `release(key)`, the guard releases it on every path (see [`LockGuard`]).
    ///
    /// # Errors
    ///
    /// As for [`LockManager::try_acquire_key`]: failures are errors, never `None`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let Some(guard) = locks.try_lock("job:nightly").await? else {
    ///     return Ok(()); // another replica runs it
    /// };
    /// assert!(locks.try_lock("job:nightly").await?.is_none(), "held, even by us");
    /// // ... the job ...
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    fn try_lock(
        &self,
        key: impl Into<LockKey>,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let key = key.into();
        async move { self.try_acquire_key(&key, LockMode::Exclusive).await }
    }

    /// Takes `key` in shared mode if no one holds it exclusively right now, and hands back a
    /// guard: `None` when it is held exclusively by anyone, or in any mode by this manager.
    ///
    /// # Errors
    ///
    /// As for [`LockManager::try_acquire_key`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    fn try_lock_shared(
        &self,
        key: impl Into<LockKey>,
    ) -> impl Future<Output = Result<Option<LockGuard>>> + Send {
        let key = key.into();
        async move { self.try_acquire_key(&key, LockMode::Shared).await }
    }

    /// Runs `body` while holding the exclusive lock on `key`, and releases the lock afterwards
    /// on every path: success, error, panic unwinding, or cancellation of the returned future.
    ///
    /// `timeout` bounds the acquisition, as for [`LockManager::acquire`]. The body receives the
    /// acquisition's [`LockInfo`] (its fencing token included, where the manager mints them).
    ///
    /// If the manager declares the lock lost while the body runs, the body is **cancelled** (its
    /// future is dropped at its next await point) and the call returns
    /// [`Error::LockLost`]. A body that finishes at the moment the loss is noticed is treated
    /// as lost too: its work cannot be assumed to have been exclusive.
    ///
    /// # Errors
    ///
    /// * the errors of [`LockManager::acquire`], when the lock is not acquired (the body does
    ///   not run);
    /// * [`Error::LockLost`], when the lock is lost before the body finishes or before the
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

    /// Runs `body` under the exclusive lock on `key` if the lock is free right now, and returns
    /// `Ok(None)` without running it when anyone holds the lock: "try, else skip", the usual
    /// shape of a job that one replica of many should run.
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
    /// let ran = locks.try_with_lock("job:nightly", |_| async { "compacted" }).await?;
    /// assert_eq!(ran, Some("compacted"));
    /// let _held = locks.lock("job:nightly", None).await?;
    /// assert_eq!(locks.try_with_lock("job:nightly", |_| async { "twice" }).await?, None);
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
        let key = key.into();
        async move {
            match self.try_acquire_key(&key, LockMode::Exclusive).await? {
                Some(guard) => run_guarded(guard, body).await.map(Some),
                None => Ok(None),
            }
        }
    }
}

impl<M: LockManager + ?Sized> LockManagerExt for M {}

/// Acquires `key` in `mode`, then runs `body` under the guard (see `run_guarded`).
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
    let guard = manager.acquire_key(&key, mode, timeout).await?;
    run_guarded(guard, body).await
}

/// Runs `body` under `guard`, cancelling it if the lock is lost, and releases the lock.
async fn run_guarded<F, Fut, T>(guard: LockGuard, body: F) -> Result<T>
where
    F: FnOnce(LockInfo) -> Fut + Send,
    Fut: Future<Output = T> + Send,
    T: Send,
{
    let loss = guard.loss_signal().clone();
    let body = body(guard.info().clone());
    let finished = tokio::select! {
        biased;
        cause = loss.lost() => Err(cause),
        value = body => Ok(value),
    };
    match finished {
        Ok(value) => match guard.release().await {
            Ok(_) => Ok(value),
            Err(lost @ Error::LockLost { .. }) => Err(lost),
            Err(err) => {
                tracing::warn!(error = %err, "release after with_lock unconfirmed");
                Ok(value)
            }
        },
        Err(cause) => {
            let key = guard.key.clone();
            drop(guard);
            Err(Error::LockLost { key, cause })
        }
    }
}
