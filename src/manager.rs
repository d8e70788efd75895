//! The lock manager port.

use std::fmt;
use std::time::Duration;

use async_trait::async_trait;

use crate::{LockGuard, LockInfo, LockKey, LockMode, Result};

/// A named mutual-exclusion lock service: the contract every lock manager fulfils.
///
/// This trait is written for **implementors** as much as for callers. The crate ships two
/// implementations, [`PostgresLockManager`](crate::PostgresLockManager) and
/// [`InMemoryLockManager`](crate::InMemoryLockManager); the `testing` feature's conformance
/// suite checks any implementation, including yours, against the rules below. The trait is
/// object safe, so code that needs "a lock manager" can hold an `Arc<dyn LockManager>`.
///
/// # The contract
///
/// **Keys and holders.** A key is a [`LockKey`]: a name (any string, the common case, which
/// the `&str` methods take), a raw 64-bit id or a pair of 32-bit ids. Each manager instance is
/// one *holder*: two acquisitions of one key through the same manager exclude each other just
/// as acquisitions through two managers do. Cross-process exclusion, release when a process
/// dies and fairness are properties of an implementation, documented on it, not of this trait.
///
/// **Required and provided methods.** Implementors write the key-based primitives
/// ([`acquire_key`](LockManager::acquire_key), [`try_acquire_key`](LockManager::try_acquire_key),
/// [`release_key`](LockManager::release_key), [`is_key_held`](LockManager::is_key_held),
/// [`release_all`](LockManager::release_all), [`held_lock_count`](LockManager::held_lock_count),
/// [`holder_id`](LockManager::holder_id)); the name-based methods that mirror the Python
/// original ([`acquire`](LockManager::acquire), [`try_acquire`](LockManager::try_acquire),
/// [`release`](LockManager::release), ...) are provided on top of them. Conveniences for callers
/// (`try_lock` returning a guard, `with_lock` and friends) live in
/// [`LockManagerExt`](crate::LockManagerExt).
///
/// **Acquisition.** [`acquire`](LockManager::acquire) waits for the lock and returns a
/// [`LockGuard`]; [`try_acquire`](LockManager::try_acquire) never waits and leaves the lock in
/// the manager's *registry*, from where [`release`](LockManager::release) or
/// [`release_all`](LockManager::release_all) let it go. A guard can also be moved into the
/// registry with [`LockGuard::leak`].
///
/// **Timeouts.** `None` waits for as long as it takes. `Some(t)` is one deadline, `t` from the
/// call, covering every wait inside the call; when it passes, the call fails with
/// [`Error::AcquisitionFailed`](crate::Error::AcquisitionFailed) whose reason is
/// [`AcquireFailure::Timeout`](crate::AcquireFailure::Timeout) and whose `timeout` is
/// `Some(t)`. `Some(Duration::ZERO)` makes exactly one immediate attempt, which succeeds if the
/// key is free.
///
/// **Re-acquiring a key the same manager holds** never deadlocks silently and never stacks.
/// A task that waits for a key it holds itself would wait forever, so `acquire` from the task
/// that holds the key fails at once with [`Error::Reentrant`](crate::Error::Reentrant); from any
/// other task it waits, within its deadline, for the manager's own holder to release.
/// `try_acquire` returns `None` whoever holds the key. This holds across modes: a manager holds
/// a key at most once. (The holding task is the one that acquired the lock; a guard moved to
/// another task still counts as its acquirer's.)
///
/// **Modes.** [`acquire_shared`](LockManager::acquire_shared) and
/// [`try_acquire_shared`](LockManager::try_acquire_shared) take a key in shared mode: different
/// holders may share it, while an exclusive holder excludes everyone. A lock's mode is in its
/// [`LockInfo::mode`]; `release`, `release_all` and guards work the same in both modes.
///
/// **Guards release only their own acquisition.** After `release(key)` or `release_all()` has
/// released a lock that a guard stood for, that guard's release returns `Ok(false)` and its
/// drop does nothing, even if the key has been acquired again meanwhile.
///
/// **Cancel safety.** Every async method is cancel safe: dropping its future at any await point
/// must leave no lock held that the registry does not know about, and must not leave the
/// registry claiming a lock that is not held.
#[async_trait]
pub trait LockManager: Send + Sync + fmt::Debug {
    /// Waits for the lock on `key` in `mode` and returns a guard for it: the primitive behind
    /// [`acquire`](LockManager::acquire) and [`acquire_shared`](LockManager::acquire_shared).
    ///
    /// `timeout` bounds the whole call; see the trait documentation for its exact meaning.
    ///
    /// # Errors
    ///
    /// [`Error::AcquisitionFailed`](crate::Error::AcquisitionFailed) when the deadline passes or
    /// the backend refuses; [`Error::Reentrant`](crate::Error::Reentrant) when the calling task
    /// holds the key already; implementations may also return the connection-related variants
    /// of [`Error`](crate::Error).
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: if the future is dropped, the lock is either not taken or released.
    async fn acquire_key(
        &self,
        key: &LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<LockGuard>;

    /// Takes the lock on `key` in `mode` if it is free right now, without waiting, and returns
    /// a guard for it: the primitive behind [`try_acquire`](LockManager::try_acquire) and
    /// [`LockManagerExt::try_lock`](crate::LockManagerExt::try_lock).
    ///
    /// Returns `Ok(None)` when any holder has it, this manager included.
    ///
    /// # Errors
    ///
    /// Backend failures are errors, never `None`: `None` always means "held by someone".
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: if the future is dropped, the lock is either not taken or released.
    async fn try_acquire_key(&self, key: &LockKey, mode: LockMode) -> Result<Option<LockGuard>>;

    /// Releases the lock on `key` held by this manager, however it was acquired: the primitive
    /// behind [`release`](LockManager::release).
    ///
    /// # Errors
    ///
    /// As for [`release`](LockManager::release).
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: once the registry has forgotten the lock, it is released even if
    /// the future is dropped.
    async fn release_key(&self, key: &LockKey) -> Result<()>;

    /// True when this manager holds `key`: the primitive behind
    /// [`is_held`](LockManager::is_held).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn is_key_held(&self, key: &LockKey) -> bool;

    /// Releases every lock this manager holds and returns how many were released with
    /// confirmation.
    ///
    /// Guards standing for these locks are marked released. Use it on shutdown.
    ///
    /// # Errors
    ///
    /// Implementations report per-lock failures through logs or tracing and keep going; an
    /// error means the manager could not attempt the release at all.
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: locks the registry has already forgotten are released even if the
    /// future is dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// locks.try_acquire("a").await?;
    /// let guard = locks.acquire("b", None).await?;
    /// assert_eq!(locks.release_all().await?, 2);
    /// assert!(!guard.release().await?, "the guard's lock was released already");
    /// # Ok(()) }
    /// ```
    async fn release_all(&self) -> Result<usize>;

    /// The number of locks this manager holds right now.
    fn held_lock_count(&self) -> usize;

    /// The holder id this manager stamps on every [`LockInfo`] it produces.
    fn holder_id(&self) -> Option<&str>;

    /// Waits for the exclusive lock on the key named `key` and returns a guard for it.
    ///
    /// `timeout` bounds the whole call; see the trait documentation for its exact meaning.
    ///
    /// # Errors
    ///
    /// As for [`acquire_key`](LockManager::acquire_key).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::time::Duration;
    /// use pglock::{InMemoryLockManager, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let guard = locks.acquire("rebuild:orders", Some(Duration::from_secs(2))).await?;
    /// assert_eq!(guard.key, "rebuild:orders");
    /// // Another task's acquisition of the same key waits for the first, here until its deadline.
    /// let other = locks.clone();
    /// let err = tokio::spawn(async move {
    ///     other.acquire("rebuild:orders", Some(Duration::from_millis(10))).await
    /// })
    /// .await
    /// .unwrap()
    /// .unwrap_err();
    /// assert!(err.is_timeout());
    /// // The holding task itself is told at once that it would wait for itself.
    /// let err = locks.acquire("rebuild:orders", None).await.unwrap_err();
    /// assert!(matches!(err, pglock::Error::Reentrant { .. }));
    /// assert!(guard.release().await?);
    /// # Ok(()) }
    /// ```
    async fn acquire(&self, key: &str, timeout: Option<Duration>) -> Result<LockGuard> {
        self.acquire_key(&LockKey::from(key), LockMode::Exclusive, timeout)
            .await
    }

    /// Takes the exclusive lock on the key named `key` if it is free right now, without
    /// waiting, and keeps it in the manager's registry (the Python original's API; for a guard,
    /// use [`LockManagerExt::try_lock`](crate::LockManagerExt::try_lock)).
    ///
    /// Returns `Ok(None)` when any holder has it, this manager included. On success the lock
    /// stays in the registry until [`release`](LockManager::release) or
    /// [`release_all`](LockManager::release_all) names it.
    ///
    /// # Errors
    ///
    /// Backend failures are errors, never `None`: `None` always means "held by someone".
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// if let Some(info) = locks.try_acquire("job:nightly").await? {
    ///     assert!(locks.try_acquire("job:nightly").await?.is_none(), "held, even by us");
    ///     // ... the job ...
    ///     locks.release(&info.key).await?;
    /// }
    /// # Ok(()) }
    /// ```
    async fn try_acquire(&self, key: &str) -> Result<Option<LockInfo>> {
        let guard = self
            .try_acquire_key(&LockKey::from(key), LockMode::Exclusive)
            .await?;
        Ok(guard.map(LockGuard::leak))
    }

    /// Waits for the key named `key` in [shared mode](crate::LockMode::Shared) and returns a
    /// guard for it.
    ///
    /// Shared holders exclude exclusive ones, not each other. Within one manager a key is held
    /// at most once, in either mode: a manager that holds a key (shared or not) queues further
    /// acquisitions of it in-process, as for [`acquire`](LockManager::acquire). Everything else
    /// (timeouts, errors, guards, the registry) is as for `acquire`.
    ///
    /// # Errors
    ///
    /// As for [`acquire`](LockManager::acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    async fn acquire_shared(&self, key: &str, timeout: Option<Duration>) -> Result<LockGuard> {
        self.acquire_key(&LockKey::from(key), LockMode::Shared, timeout)
            .await
    }

    /// Takes the key named `key` in [shared mode](crate::LockMode::Shared) if no one holds it
    /// exclusively right now, without waiting, and keeps it in the registry.
    ///
    /// Returns `Ok(None)` when the key is held exclusively by anyone, or held in any mode by
    /// this manager. Otherwise as for [`try_acquire`](LockManager::try_acquire).
    ///
    /// # Errors
    ///
    /// As for [`try_acquire`](LockManager::try_acquire).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    async fn try_acquire_shared(&self, key: &str) -> Result<Option<LockInfo>> {
        let guard = self
            .try_acquire_key(&LockKey::from(key), LockMode::Shared)
            .await?;
        Ok(guard.map(LockGuard::leak))
    }

    /// Releases the lock on the key named `key` held by this manager, however it was acquired.
    ///
    /// If a [`LockGuard`] stands for the lock, the guard is marked released: its own release
    /// then returns `Ok(false)` and its drop does nothing.
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when this manager does not hold `key`;
    /// [`Error::ReleaseFailed`](crate::Error::ReleaseFailed) when the release could not be
    /// confirmed (the registry forgets the lock either way).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: once the registry has forgotten the lock, it is released even if the
    /// future is dropped.
    async fn release(&self, key: &str) -> Result<()> {
        self.release_key(&LockKey::from(key)).await
    }

    /// True when this manager holds the key named `key`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn is_held(&self, key: &str) -> bool {
        self.is_key_held(&LockKey::from(key)).await
    }
}
