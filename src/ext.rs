//! The caller's API on every manager, written once on top of the [`LockManager`] port.

use std::future::Future;
use std::time::Duration;

use crate::lock_set::in_lock_order;
use crate::verbs::{self, Port};
use crate::{Attempt, LockGuard, LockInfo, LockKey, LockManager, LockMode, LockSet, Result};

/// Taking and releasing locks: the caller's API on every [`LockManager`], `dyn LockManager`
/// included.
///
/// [`PostgresLockManager`](crate::PostgresLockManager) and
/// [`InMemoryLockManager`](crate::InMemoryLockManager) have every one of these methods
/// inherently, so code that holds a concrete manager needs no import. Code that holds an
/// `Arc<dyn LockManager>`, or is generic over managers, imports this trait
/// (`use pglock::prelude::*;`). Either way the methods mean the same, and every method that
/// takes a key takes any kind of key: a string (hashed with the frozen
/// [`lock_id`](crate::lock_id) derivation), an `i64`, an `(i32, i32)` pair or a [`LockKey`].
///
/// | verb | one key | one key, shared | several keys | several keys, shared |
/// | --- | --- | --- | --- | --- |
/// | wait, until the deadline | [`acquire`](Self::acquire) | [`acquire_shared`](Self::acquire_shared) | [`acquire_all`](Self::acquire_all) | [`acquire_all_shared`](Self::acquire_all_shared) |
/// | try once, never wait | [`try_acquire`](Self::try_acquire) | [`try_acquire_shared`](Self::try_acquire_shared) | [`try_acquire_all`](Self::try_acquire_all) | [`try_acquire_all_shared`](Self::try_acquire_all_shared) |
/// | run a body under the lock | [`with_lock`](Self::with_lock) | [`with_lock_shared`](Self::with_lock_shared) | [`with_locks`](Self::with_locks) | [`with_locks_shared`](Self::with_locks_shared) |
/// | run it if the lock is free | [`try_with_lock`](Self::try_with_lock) | [`try_with_lock_shared`](Self::try_with_lock_shared) | [`try_with_locks`](Self::try_with_locks) | [`try_with_locks_shared`](Self::try_with_locks_shared) |
///
/// The waits hand back a [`LockGuard`] (one key) or a [`LockSet`] (several); the tries an
/// [`Attempt`] of one of them; the scoped forms the body's value, with the lock released on
/// every path. [`release`](Self::release) and [`is_held`](Self::is_held) name a key, however
/// it was taken; [`release_all`](LockManager::release_all),
/// [`held_locks`](LockManager::held_locks), [`held_lock_count`](LockManager::held_lock_count)
/// and [`holder_id`](LockManager::holder_id) are the port's own.
///
/// Every method keeps [the contract](LockManager#the-contract): callers of one manager take
/// turns on a key, and `timeout` is one deadline for the whole call (`None` waits as long as it
/// takes, `Some(Duration::ZERO)` makes exactly one attempt).
///
/// # Nesting
///
/// What this API adds to the contract: asking for a key inside the critical section of the
/// same key (the body of [`with_lock`](Self::with_lock) or [`LockGuard::run`]) returns
/// [`Error::Reentrant`](crate::Error::Reentrant) at once, since waiting would wait for itself.
/// A guard held in a plain variable is not a critical section: asking for its key again waits
/// for the guard like any other caller, within the deadline, as a second `lock()` of a
/// `tokio::sync::Mutex` whose guard is alive does. Wrap the work in [`LockGuard::run`] (or use
/// `with_lock`) to have such a mistake refused instead.
pub trait LockManagerExt: LockManager {
    /// Waits for the exclusive lock on `key` and hands back its guard.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when the deadline passes first;
    /// [`Error::Reentrant`](crate::Error::Reentrant) inside a critical section on `key`;
    /// otherwise the backend's failures (see [`Error`](crate::Error)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use pglock::{InMemoryLockManager, LockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks: Arc<dyn LockManager> = Arc::new(InMemoryLockManager::new());
    /// let guard = locks.acquire("rebuild:orders", Some(Duration::from_secs(5))).await?;
    /// println!("fencing token {:?}", guard.info().fencing_token);
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    fn acquire(
        &self,
        key: impl Into<LockKey>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<LockGuard>> + Send {
        let key = key.into();
        async move { verbs::acquire(&Port(self), key, LockMode::Exclusive, timeout).await }
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
        let key = key.into();
        async move { verbs::acquire(&Port(self), key, LockMode::Shared, timeout).await }
    }

    /// Takes the exclusive lock on `key` if it is free right now, without waiting:
    /// [`Attempt::Busy`] when anyone holds it, this manager included.
    ///
    /// For the Python original's "try, then later `release(key)`", leak the guard into the
    /// manager's registry: `locks.try_acquire(key).await?.leak()` (see [`Attempt`]).
    ///
    /// ```compile_fail,E0599
    /// # use pglock::{LockManager, LockManagerExt};
    /// # async fn port(locks: &dyn LockManager) -> pglock::Result<()> {
    /// // An `Attempt` is not an `Option`: this would drop the guard, and the lock, at once.
    /// if locks.try_acquire("leader:jobs").await?.is_some() {}
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// Failures are errors, never [`Attempt::Busy`];
    /// [`Error::Reentrant`](crate::Error::Reentrant) inside a critical section on `key`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either not taken or released.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use pglock::{Attempt, InMemoryLockManager, LockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks: Arc<dyn LockManager> = Arc::new(InMemoryLockManager::new());
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
        let key = key.into();
        async move { verbs::try_acquire(&Port(self), key, LockMode::Exclusive).await }
    }

    /// Takes `key` in shared mode if no one holds it exclusively right now, without waiting:
    /// [`Attempt::Busy`] when it is held exclusively by anyone, or in any mode by this manager.
    ///
    /// ```compile_fail,E0599
    /// # use pglock::{LockManager, LockManagerExt};
    /// # async fn port(locks: &dyn LockManager) -> pglock::Result<()> {
    /// if locks.try_acquire_shared("rates").await?.is_some() {}
    /// # Ok(()) }
    /// ```
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
        let key = key.into();
        async move { verbs::try_acquire(&Port(self), key, LockMode::Shared).await }
    }

    /// Releases this manager's lock on `key`, however it was taken. A guard standing for it is
    /// told: its loss signal fires with [`LossCause::Released`](crate::LossCause::Released),
    /// and a [`with_lock`](Self::with_lock) body running under it is cancelled.
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
    fn release(&self, key: impl Into<LockKey>) -> impl Future<Output = Result<()>> + Send {
        let key = key.into();
        async move { self.release_key(&key).await }
    }

    /// True when this manager holds `key`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    fn is_held(&self, key: impl Into<LockKey>) -> impl Future<Output = bool> + Send {
        let key = key.into();
        async move { self.is_held_key(&key).await }
    }

    /// Runs `body` while holding the exclusive lock on `key`, and releases the lock afterwards
    /// on every path: success, panic unwinding, or cancellation of the returned future.
    ///
    /// `timeout` bounds the acquisition, as for [`acquire`](Self::acquire). The body receives
    /// the acquisition's [`LockInfo`] (its fencing token included, where the manager mints
    /// them) and runs as a critical section ([`LockGuard::run`]): if the lock goes while it
    /// runs (lost, or released through the manager) it is cancelled, and asking for `key` again
    /// inside it fails at once with [`Error::Reentrant`](crate::Error::Reentrant).
    ///
    /// # Errors
    ///
    /// * the errors of [`acquire`](Self::acquire), when the lock is not acquired (the body does
    ///   not run);
    /// * [`Error::LockLost`](crate::Error::LockLost), when the lock goes before the body
    ///   finishes or before the release.
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
    /// use std::sync::Arc;
    /// use pglock::{InMemoryLockManager, LockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks: Arc<dyn LockManager> = Arc::new(InMemoryLockManager::new());
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
        let key = key.into();
        async move {
            let guard = verbs::acquire(&Port(self), key, LockMode::Exclusive, timeout).await?;
            verbs::scoped(guard, body).await
        }
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
        let key = key.into();
        async move {
            let guard = verbs::acquire(&Port(self), key, LockMode::Shared, timeout).await?;
            verbs::scoped(guard, body).await
        }
    }

    /// Runs `body` under the exclusive lock on `key` if the lock is free right now, and returns
    /// `Ok(None)` without running it when anyone holds the lock: "try, else skip", for work
    /// that another replica doing it right now makes unnecessary. Not for a job on a timer: a
    /// short run ends before a replica whose timer fires late tries, which then runs it again;
    /// [`ScheduledJob`](crate::schedule::ScheduledJob) runs a job at most once per window.
    ///
    /// The `Option` here cannot hold a lock: the lock is released before it is returned.
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
    /// use std::sync::Arc;
    /// use pglock::{InMemoryLockManager, LockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks: Arc<dyn LockManager> = Arc::new(InMemoryLockManager::new());
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
        let key = key.into();
        async move {
            let attempt = verbs::try_acquire(&Port(self), key, LockMode::Exclusive).await?;
            verbs::scoped_if(attempt, body).await
        }
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
        let key = key.into();
        async move {
            let attempt = verbs::try_acquire(&Port(self), key, LockMode::Shared).await?;
            verbs::scoped_if(attempt, body).await
        }
    }

    /// Takes the exclusive locks of every one of `keys` within one deadline, or none of them,
    /// and hands back one [`LockSet`] that releases them all.
    ///
    /// The keys are taken in one order every caller of this method uses (by lock id), whatever
    /// order they are named in, so two callers whose sets overlap never deadlock each other,
    /// in one process or many. A key named twice is taken once. `Some(Duration::ZERO)` makes
    /// one try of each key.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::time::Duration;
    /// use pglock::{InMemoryLockManager, LockManager, LockManagerExt};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks: Arc<dyn LockManager> = Arc::new(InMemoryLockManager::new());
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
    /// The error of the first key that could not be taken
    /// ([`Error::Timeout`](crate::Error::Timeout) naming it when the deadline passed); the keys
    /// taken before it are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the locks taken before the future was dropped are released, in the
    /// background, as dropped guards are.
    fn acquire_all<K: Into<LockKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<LockSet>> + Send {
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move { verbs::acquire_all(&Port(self), keys, LockMode::Exclusive, timeout).await }
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
    ) -> impl Future<Output = Result<LockSet>> + Send {
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move { verbs::acquire_all(&Port(self), keys, LockMode::Shared, timeout).await }
    }

    /// Takes the exclusive locks of every one of `keys` if all are free right now, without
    /// waiting: one try of each, in lock order. [`Attempt::Busy`] when any is held (by anyone,
    /// this manager included), and then none is kept.
    ///
    /// ```compile_fail,E0599
    /// # use pglock::{LockManager, LockManagerExt};
    /// # async fn port(locks: &dyn LockManager) -> pglock::Result<()> {
    /// if locks.try_acquire_all(["a", "b"]).await?.is_some() {}
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// The error of the first key whose try failed (a busy key is not an error); the keys
    /// taken before it are released first.
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_all`](Self::acquire_all).
    fn try_acquire_all<K: Into<LockKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> impl Future<Output = Result<Attempt<LockSet>>> + Send {
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move { verbs::try_acquire_all(&Port(self), keys, LockMode::Exclusive).await }
    }

    /// [`try_acquire_all`](Self::try_acquire_all) in shared mode.
    ///
    /// ```compile_fail,E0599
    /// # use pglock::{LockManager, LockManagerExt};
    /// # async fn port(locks: &dyn LockManager) -> pglock::Result<()> {
    /// if locks.try_acquire_all_shared(["a", "b"]).await?.is_some() {}
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_acquire_all`](Self::try_acquire_all).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire_all`](Self::acquire_all).
    fn try_acquire_all_shared<K: Into<LockKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> impl Future<Output = Result<Attempt<LockSet>>> + Send {
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move { verbs::try_acquire_all(&Port(self), keys, LockMode::Shared).await }
    }

    /// [`with_lock`](Self::with_lock) over several keys: takes them all as
    /// [`acquire_all`](Self::acquire_all) does, runs `body` (given what each lock was granted
    /// as, in lock order) as the critical section of every one of them, then releases them
    /// all.
    ///
    /// # Errors
    ///
    /// As [`acquire_all`](Self::acquire_all);
    /// [`Error::LockLost`](crate::Error::LockLost) when a lock went before `body` finished
    /// (`body` is then dropped).
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
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move {
            let set = verbs::acquire_all(&Port(self), keys, LockMode::Exclusive, timeout).await?;
            verbs::scoped(set, body).await
        }
    }

    /// [`with_locks`](Self::with_locks), every key held in shared mode.
    ///
    /// # Errors
    ///
    /// As [`with_locks`](Self::with_locks).
    ///
    /// # Cancel safety
    ///
    /// As [`with_locks`](Self::with_locks).
    fn with_locks_shared<K, F, Fut, T>(
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
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move {
            let set = verbs::acquire_all(&Port(self), keys, LockMode::Shared, timeout).await?;
            verbs::scoped(set, body).await
        }
    }

    /// [`try_with_lock`](Self::try_with_lock) over several keys: runs `body` under all of them
    /// if all are free right now ([`try_acquire_all`](Self::try_acquire_all)), else returns
    /// `Ok(None)` without running it.
    ///
    /// # Errors
    ///
    /// As [`with_locks`](Self::with_locks); busy keys are `Ok(None)`, not an error.
    ///
    /// # Cancel safety
    ///
    /// As [`with_locks`](Self::with_locks).
    fn try_with_locks<K, F, Fut, T>(
        &self,
        keys: impl IntoIterator<Item = K>,
        body: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        K: Into<LockKey>,
        F: FnOnce(Vec<LockInfo>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move {
            let attempt = verbs::try_acquire_all(&Port(self), keys, LockMode::Exclusive).await?;
            verbs::scoped_if(attempt, body).await
        }
    }

    /// [`try_with_locks`](Self::try_with_locks), every key held in shared mode.
    ///
    /// # Errors
    ///
    /// As [`try_with_locks`](Self::try_with_locks).
    ///
    /// # Cancel safety
    ///
    /// As [`with_locks`](Self::with_locks).
    fn try_with_locks_shared<K, F, Fut, T>(
        &self,
        keys: impl IntoIterator<Item = K>,
        body: F,
    ) -> impl Future<Output = Result<Option<T>>> + Send
    where
        K: Into<LockKey>,
        F: FnOnce(Vec<LockInfo>) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        let keys = in_lock_order(keys.into_iter().map(Into::into));
        async move {
            let attempt = verbs::try_acquire_all(&Port(self), keys, LockMode::Shared).await?;
            verbs::scoped_if(attempt, body).await
        }
    }
}

impl<M: LockManager + ?Sized> LockManagerExt for M {}

/// The inherent caller API of a manager type that wraps `core: Arc<Core<_>>`: every method of
/// [`LockManagerExt`] and the port's [`release_all`](LockManager::release_all),
/// [`held_locks`](LockManager::held_locks), [`held_lock_count`](LockManager::held_lock_count)
/// and [`holder_id`](LockManager::holder_id), so a concrete manager needs no import. Each
/// calls the same verb as the extension trait's method, reaching the engine without the port's
/// boxed future.
macro_rules! inherent_caller_api {
    ($manager:ty) => {
        /// The caller's API, the same as [`LockManagerExt`]'s, without an import. Each method
        /// means exactly what the trait's method of the same name means: follow its link for
        /// the errors, cancel safety and examples.
        impl $manager {
            /// Waits for the exclusive lock on `key`: [`LockManagerExt::acquire`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::acquire`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn acquire(
                &self,
                key: impl Into<$crate::LockKey>,
                timeout: Option<::std::time::Duration>,
            ) -> $crate::Result<$crate::LockGuard> {
                $crate::verbs::acquire(&self.core, key.into(), $crate::LockMode::Exclusive, timeout).await
            }

            /// Waits for `key` in shared mode: [`LockManagerExt::acquire_shared`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::acquire_shared`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn acquire_shared(
                &self,
                key: impl Into<$crate::LockKey>,
                timeout: Option<::std::time::Duration>,
            ) -> $crate::Result<$crate::LockGuard> {
                $crate::verbs::acquire(&self.core, key.into(), $crate::LockMode::Shared, timeout).await
            }

            /// Takes the exclusive lock on `key` if it is free right now:
            /// [`LockManagerExt::try_acquire`].
            ///
            /// ```compile_fail,E0599
            #[doc = concat!("# async fn port(locks: pglock::", stringify!($manager), ") -> pglock::Result<()> {")]
            /// if locks.try_acquire("leader:jobs").await?.is_some() {}
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_acquire`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn try_acquire(&self, key: impl Into<$crate::LockKey>) -> $crate::Result<$crate::Attempt> {
                $crate::verbs::try_acquire(&self.core, key.into(), $crate::LockMode::Exclusive).await
            }

            /// Takes `key` in shared mode if no one holds it exclusively right now:
            /// [`LockManagerExt::try_acquire_shared`].
            ///
            /// ```compile_fail,E0599
            #[doc = concat!("# async fn port(locks: pglock::", stringify!($manager), ") -> pglock::Result<()> {")]
            /// if locks.try_acquire_shared("rates").await?.is_some() {}
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_acquire_shared`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn try_acquire_shared(&self, key: impl Into<$crate::LockKey>) -> $crate::Result<$crate::Attempt> {
                $crate::verbs::try_acquire(&self.core, key.into(), $crate::LockMode::Shared).await
            }

            /// Releases this manager's lock on `key`, however it was taken:
            /// [`LockManagerExt::release`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::release`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: once the registry has forgotten the lock, it is released even if
            /// the future is dropped.
            pub async fn release(&self, key: impl Into<$crate::LockKey>) -> $crate::Result<()> {
                self.core.release(&key.into()).await
            }

            /// True when this manager holds `key`: [`LockManagerExt::is_held`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub async fn is_held(&self, key: impl Into<$crate::LockKey>) -> bool {
                self.core.is_held(&key.into()).await
            }

            /// Runs `body` under the exclusive lock on `key`: [`LockManagerExt::with_lock`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::with_lock`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: dropping the future drops the body and releases the lock in the
            /// background.
            pub async fn with_lock<F, Fut, T>(
                &self,
                key: impl Into<$crate::LockKey>,
                timeout: Option<::std::time::Duration>,
                body: F,
            ) -> $crate::Result<T>
            where
                F: FnOnce($crate::LockInfo) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let guard =
                    $crate::verbs::acquire(&self.core, key.into(), $crate::LockMode::Exclusive, timeout).await?;
                $crate::verbs::scoped(guard, body).await
            }

            /// Runs `body` under `key` held in shared mode:
            /// [`LockManagerExt::with_lock_shared`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::with_lock_shared`].
            ///
            /// # Cancel safety
            ///
            /// As [`with_lock`](Self::with_lock).
            pub async fn with_lock_shared<F, Fut, T>(
                &self,
                key: impl Into<$crate::LockKey>,
                timeout: Option<::std::time::Duration>,
                body: F,
            ) -> $crate::Result<T>
            where
                F: FnOnce($crate::LockInfo) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let guard =
                    $crate::verbs::acquire(&self.core, key.into(), $crate::LockMode::Shared, timeout).await?;
                $crate::verbs::scoped(guard, body).await
            }

            /// Runs `body` under the exclusive lock on `key` if it is free right now:
            /// [`LockManagerExt::try_with_lock`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_with_lock`].
            ///
            /// # Cancel safety
            ///
            /// As [`with_lock`](Self::with_lock).
            pub async fn try_with_lock<F, Fut, T>(
                &self,
                key: impl Into<$crate::LockKey>,
                body: F,
            ) -> $crate::Result<Option<T>>
            where
                F: FnOnce($crate::LockInfo) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let attempt =
                    $crate::verbs::try_acquire(&self.core, key.into(), $crate::LockMode::Exclusive).await?;
                $crate::verbs::scoped_if(attempt, body).await
            }

            /// Runs `body` under `key` in shared mode if no one holds it exclusively right
            /// now: [`LockManagerExt::try_with_lock_shared`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_with_lock_shared`].
            ///
            /// # Cancel safety
            ///
            /// As [`with_lock`](Self::with_lock).
            pub async fn try_with_lock_shared<F, Fut, T>(
                &self,
                key: impl Into<$crate::LockKey>,
                body: F,
            ) -> $crate::Result<Option<T>>
            where
                F: FnOnce($crate::LockInfo) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let attempt = $crate::verbs::try_acquire(&self.core, key.into(), $crate::LockMode::Shared).await?;
                $crate::verbs::scoped_if(attempt, body).await
            }

            /// Takes the exclusive locks of every one of `keys`, or none:
            /// [`LockManagerExt::acquire_all`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::acquire_all`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: the locks taken before the future was dropped are released in the
            /// background.
            pub async fn acquire_all<K: Into<$crate::LockKey>>(
                &self,
                keys: impl IntoIterator<Item = K>,
                timeout: Option<::std::time::Duration>,
            ) -> $crate::Result<$crate::LockSet> {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                $crate::verbs::acquire_all(&self.core, keys, $crate::LockMode::Exclusive, timeout).await
            }

            /// Takes every one of `keys` in shared mode, or none:
            /// [`LockManagerExt::acquire_all_shared`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::acquire_all_shared`].
            ///
            /// # Cancel safety
            ///
            /// As [`acquire_all`](Self::acquire_all).
            pub async fn acquire_all_shared<K: Into<$crate::LockKey>>(
                &self,
                keys: impl IntoIterator<Item = K>,
                timeout: Option<::std::time::Duration>,
            ) -> $crate::Result<$crate::LockSet> {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                $crate::verbs::acquire_all(&self.core, keys, $crate::LockMode::Shared, timeout).await
            }

            /// Takes the exclusive locks of every one of `keys` if all are free right now:
            /// [`LockManagerExt::try_acquire_all`].
            ///
            /// ```compile_fail,E0599
            #[doc = concat!("# async fn port(locks: pglock::", stringify!($manager), ") -> pglock::Result<()> {")]
            /// if locks.try_acquire_all(["a", "b"]).await?.is_some() {}
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_acquire_all`].
            ///
            /// # Cancel safety
            ///
            /// As [`acquire_all`](Self::acquire_all).
            pub async fn try_acquire_all<K: Into<$crate::LockKey>>(
                &self,
                keys: impl IntoIterator<Item = K>,
            ) -> $crate::Result<$crate::Attempt<$crate::LockSet>> {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                $crate::verbs::try_acquire_all(&self.core, keys, $crate::LockMode::Exclusive).await
            }

            /// Takes every one of `keys` in shared mode if none is held exclusively right now:
            /// [`LockManagerExt::try_acquire_all_shared`].
            ///
            /// ```compile_fail,E0599
            #[doc = concat!("# async fn port(locks: pglock::", stringify!($manager), ") -> pglock::Result<()> {")]
            /// if locks.try_acquire_all_shared(["a", "b"]).await?.is_some() {}
            /// # Ok(()) }
            /// ```
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_acquire_all_shared`].
            ///
            /// # Cancel safety
            ///
            /// As [`acquire_all`](Self::acquire_all).
            pub async fn try_acquire_all_shared<K: Into<$crate::LockKey>>(
                &self,
                keys: impl IntoIterator<Item = K>,
            ) -> $crate::Result<$crate::Attempt<$crate::LockSet>> {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                $crate::verbs::try_acquire_all(&self.core, keys, $crate::LockMode::Shared).await
            }

            /// Runs `body` under the exclusive locks of every one of `keys`:
            /// [`LockManagerExt::with_locks`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::with_locks`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: dropping the future drops `body` and releases the locks in the
            /// background.
            pub async fn with_locks<K, F, Fut, T>(
                &self,
                keys: impl IntoIterator<Item = K>,
                timeout: Option<::std::time::Duration>,
                body: F,
            ) -> $crate::Result<T>
            where
                K: Into<$crate::LockKey>,
                F: FnOnce(Vec<$crate::LockInfo>) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                let set = $crate::verbs::acquire_all(&self.core, keys, $crate::LockMode::Exclusive, timeout).await?;
                $crate::verbs::scoped(set, body).await
            }

            /// Runs `body` under every one of `keys` held in shared mode:
            /// [`LockManagerExt::with_locks_shared`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::with_locks_shared`].
            ///
            /// # Cancel safety
            ///
            /// As [`with_locks`](Self::with_locks).
            pub async fn with_locks_shared<K, F, Fut, T>(
                &self,
                keys: impl IntoIterator<Item = K>,
                timeout: Option<::std::time::Duration>,
                body: F,
            ) -> $crate::Result<T>
            where
                K: Into<$crate::LockKey>,
                F: FnOnce(Vec<$crate::LockInfo>) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                let set = $crate::verbs::acquire_all(&self.core, keys, $crate::LockMode::Shared, timeout).await?;
                $crate::verbs::scoped(set, body).await
            }

            /// Runs `body` under the exclusive locks of every one of `keys` if all are free
            /// right now: [`LockManagerExt::try_with_locks`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_with_locks`].
            ///
            /// # Cancel safety
            ///
            /// As [`with_locks`](Self::with_locks).
            pub async fn try_with_locks<K, F, Fut, T>(
                &self,
                keys: impl IntoIterator<Item = K>,
                body: F,
            ) -> $crate::Result<Option<T>>
            where
                K: Into<$crate::LockKey>,
                F: FnOnce(Vec<$crate::LockInfo>) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                let attempt = $crate::verbs::try_acquire_all(&self.core, keys, $crate::LockMode::Exclusive).await?;
                $crate::verbs::scoped_if(attempt, body).await
            }

            /// Runs `body` under every one of `keys` in shared mode if none is held
            /// exclusively right now: [`LockManagerExt::try_with_locks_shared`].
            ///
            /// # Errors
            ///
            /// As [`LockManagerExt::try_with_locks_shared`].
            ///
            /// # Cancel safety
            ///
            /// As [`with_locks`](Self::with_locks).
            pub async fn try_with_locks_shared<K, F, Fut, T>(
                &self,
                keys: impl IntoIterator<Item = K>,
                body: F,
            ) -> $crate::Result<Option<T>>
            where
                K: Into<$crate::LockKey>,
                F: FnOnce(Vec<$crate::LockInfo>) -> Fut + Send,
                Fut: ::std::future::Future<Output = T> + Send,
                T: Send,
            {
                let keys = $crate::lock_set::in_lock_order(keys.into_iter().map(Into::into));
                let attempt = $crate::verbs::try_acquire_all(&self.core, keys, $crate::LockMode::Shared).await?;
                $crate::verbs::scoped_if(attempt, body).await
            }

            /// Releases every lock this manager holds: [`LockManager::release_all`].
            ///
            /// # Errors
            ///
            /// As [`LockManager::release_all`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: locks the registry has already forgotten are released even if the
            /// future is dropped.
            pub async fn release_all(&self) -> $crate::Result<usize> {
                self.core.release_all().await
            }

            /// The locks this manager holds right now: [`LockManager::held_locks`].
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub async fn held_locks(&self) -> Vec<$crate::HeldLock> {
                self.core.held_locks().await
            }

            /// The number of locks this manager holds right now:
            /// [`LockManager::held_lock_count`].
            pub fn held_lock_count(&self) -> usize {
                self.core.held_lock_count()
            }

            /// The id of this holder: [`LockManager::holder_id`].
            pub fn holder_id(&self) -> &str {
                self.core.holder_id()
            }
        }
    };
}
pub(crate) use inherent_caller_api;
