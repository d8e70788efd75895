//! The lock manager port.

use std::fmt;

use async_trait::async_trait;

#[cfg(doc)]
use crate::Wait;
use crate::{AcquireOptions, Attempt, HeldLock, LockGuard, LockKey, Result};

/// A named mutual-exclusion lock service: the port every lock manager implements.
///
/// This trait is written for **implementors**. Callers use the methods of
/// [`LockManagerExt`](crate::LockManagerExt), which every `LockManager` (and
/// `dyn LockManager`) has: [`acquire`](crate::LockManagerExt::acquire),
/// [`try_acquire`](crate::LockManagerExt::try_acquire),
/// [`release`](crate::LockManagerExt::release), [`is_held`](crate::LockManagerExt::is_held),
/// [`with_lock`](crate::LockManagerExt::with_lock) and the shared-mode variants, taking any kind
/// of key. They are written once, on top of the few methods below, so every manager behaves
/// the same for callers; [`release_all`](LockManager::release_all),
/// [`held_locks`](LockManager::held_locks), [`held_lock_count`](LockManager::held_lock_count)
/// and [`holder_id`](LockManager::holder_id) are called directly.
///
/// The crate ships two implementations, [`PostgresLockManager`](crate::PostgresLockManager) and
/// [`InMemoryLockManager`](crate::InMemoryLockManager). The `pglock-testing` crate's conformance
/// suite checks any implementation, including yours, against the rules below. The trait is
/// object safe: code that needs "a lock manager" holds an `Arc<dyn LockManager>`.
///
/// # The contract
///
/// **Keys and holders.** A key is a [`LockKey`]: a name (the common case), a raw 64-bit id or
/// a pair of 32-bit ids. Each manager instance is one *holder*, named by its
/// [`holder_id`](LockManager::holder_id): a manager holds a key at most once, in either mode,
/// and two acquisitions of one key through the same manager exclude each other just as
/// acquisitions through two managers do. Cross-process exclusion, release when a process dies
/// and fairness are properties of an implementation, documented on it, not of this trait.
///
/// **Acquisition.** [`acquire_key`](LockManager::acquire_key) takes the key as its
/// [`AcquireOptions`] say and hands back a [`LockGuard`]. The manager also keeps the lock in its
/// *registry*, from where [`release_key`](LockManager::release_key) and
/// [`release_all`](LockManager::release_all) can take it away; [`LockGuard::leak`] leaves it
/// there alone.
///
/// **Waiting.** [`Wait::No`] makes one attempt and returns [`Attempt::Busy`] when the key is
/// held by anyone, this manager included. [`Wait::Forever`] waits as long as it takes.
/// [`Wait::For(t)`](Wait::For) waits at most `t` from the call, and that one deadline covers
/// everything inside the call: this manager's own queue for the key, getting a connection,
/// the server's queue. Nothing inside the manager gives up earlier, and when `t` runs out the
/// call fails with [`Error::Timeout`](crate::Error::Timeout), whatever stage it was in.
/// `Wait::For(Duration::ZERO)` makes exactly one attempt, which fails with
/// [`Error::Timeout`](crate::Error::Timeout) when the key is held.
///
/// **Callers of one manager take turns.** Acquisitions of a key this manager holds wait, in
/// arrival order, for the holder to let go, whichever task or future they come from: sibling
/// futures of one task (`join!`, `select!`, `for_each_concurrent`, `FuturesUnordered`) queue
/// like separate tasks, as callers of a `tokio::sync::Mutex` do.
/// A manager never asks its backend for a key it holds (no stacking of PostgreSQL's re-entrant
/// locks, no self-deadlock on the server). Nested critical sections are refused by
/// [`LockManagerExt`](crate::LockManagerExt), which knows them, before `acquire_key` is called.
///
/// **A holder is told whenever its lock goes.** A guard's [`loss_signal`](LockGuard::loss_signal)
/// fires when the manager declares the lock lost, and also when the lock is taken away through
/// the manager: [`release_key`](LockManager::release_key) fires it with
/// [`LossCause::Released`](crate::LossCause::Released), [`release_all`](LockManager::release_all)
/// with [`LossCause::ReleasedAll`](crate::LossCause::ReleasedAll). The guard's own release is
/// silent. A guard whose lock went releases nothing: its release returns
/// [`Error::LockLost`](crate::Error::LockLost) with the cause, and its drop does nothing, even
/// if the key has been acquired again meanwhile.
///
/// **Cancel safety.** Every async method is cancel safe: dropping its future at any await point
/// must leave no lock held that the registry does not know about, and must not leave the
/// registry claiming a lock that is not held.
#[async_trait]
pub trait LockManager: Send + Sync + fmt::Debug {
    /// Takes the lock on `key` as `options` say and returns a guard for it.
    ///
    /// Returns [`Attempt::Busy`] only for [`Wait::No`], when the key is held by anyone (this
    /// manager included). Callers use [`acquire`](crate::LockManagerExt::acquire),
    /// [`try_acquire`](crate::LockManagerExt::try_acquire) and their shared-mode twins, which
    /// call this.
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`](crate::Error::Timeout) when the deadline of [`Wait::For`] passes;
    /// the other variants of [`Error`](crate::Error) when the backend fails or refuses. Failures
    /// are errors, never `Busy`: `Busy` always means "held by someone".
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: if the future is dropped, the lock is either not taken or released.
    async fn acquire_key(&self, key: &LockKey, options: AcquireOptions) -> Result<Attempt>;

    /// Takes the acquisition of `key` out of the registry, however it was made, and releases
    /// it. A guard standing for it is told: its loss signal fires with
    /// [`LossCause::Released`](crate::LossCause::Released). Callers use
    /// [`release`](crate::LockManagerExt::release).
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`](crate::Error::NotHeld) when this manager does not hold `key`;
    /// [`Error::ReleaseFailed`](crate::Error::ReleaseFailed) when the release could not be
    /// confirmed (the registry forgets the lock either way).
    ///
    /// # Cancel safety
    ///
    /// Must be cancel safe: once the registry has forgotten the lock, it is released even if
    /// the future is dropped.
    async fn release_key(&self, key: &LockKey) -> Result<()>;

    /// True when this manager holds `key`. Callers use
    /// [`is_held`](crate::LockManagerExt::is_held).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    async fn is_held_key(&self, key: &LockKey) -> bool;

    /// Releases every lock this manager holds and returns how many were released with
    /// confirmation. Use it on shutdown.
    ///
    /// Every guard standing for one of these locks is told: its loss signal fires with
    /// [`LossCause::ReleasedAll`](crate::LossCause::ReleasedAll), which cancels the body of a
    /// running [`with_lock`](crate::LockManagerExt::with_lock).
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
    /// use pglock::{InMemoryLockManager, LossCause};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// locks.try_acquire("a").await?.leak();
    /// let guard = locks.acquire("b", None).await?;
    /// assert_eq!(locks.release_all().await?, 2);
    /// assert_eq!(guard.loss_signal().cause(), Some(LossCause::ReleasedAll));
    /// # Ok(()) }
    /// ```
    async fn release_all(&self) -> Result<usize>;

    /// The locks this manager holds right now, each with how long it has held it, oldest
    /// acquisition first.
    ///
    /// What implementors must return, as one snapshot of the registry:
    ///
    /// * **Exactly the acquisitions granted and held right now**, one per key (a manager holds
    ///   a key at most once), leaked ones included: the same set as
    ///   [`is_held_key`](LockManager::is_held_key) answers for, as many as
    ///   [`held_lock_count`](LockManager::held_lock_count) counts. Never an acquisition still
    ///   waiting, in this manager's queue or the backend's; never one being let go: once
    ///   [`release_key`](LockManager::release_key), [`release_all`](LockManager::release_all),
    ///   a guard's release, or a dropped guard (once the manager has processed the drop) took
    ///   it out of the registry, it is gone from the listing, even while the backend still
    ///   confirms the release. A lock declared lost is gone too.
    /// * **Each acquisition's own [`LockInfo`](crate::LockInfo)**, equal to its guard's
    ///   ([`LockGuard::info`]): key, lock id, mode, `acquired_at`, holder id, fencing token.
    /// * **`held_for`** from the grant of that acquisition to the listing, on a monotonic
    ///   clock: it never goes back, and grows by the time between two listings. A key handed
    ///   from one caller of this manager to the next (without going back to the backend) is a
    ///   new acquisition: new info, and `held_for` from the handover.
    /// * **Ordered by acquisition**, the longest held first: `held_for` never increases along
    ///   the list.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LockMode};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let _report = locks.acquire("report:daily", None).await?;
    /// let _rates = locks.acquire_shared("exchange-rates", None).await?;
    /// for held in locks.held_locks().await {
    ///     println!("{} ({}) for {:?}", held.info.key, held.info.mode, held.held_for);
    /// }
    /// let modes: Vec<LockMode> = locks.held_locks().await.iter().map(|h| h.info.mode).collect();
    /// assert_eq!(modes, [LockMode::Exclusive, LockMode::Shared]);
    /// # Ok(()) }
    /// ```
    async fn held_locks(&self) -> Vec<HeldLock>;

    /// The number of locks this manager holds right now.
    fn held_lock_count(&self) -> usize;

    /// The id of this holder, stamped on every [`LockInfo`](crate::LockInfo) it produces.
    ///
    /// It also names the holder for nesting: a critical section of this manager on a key
    /// refuses acquisitions of that key by any manager with the same holder id.
    fn holder_id(&self) -> &str;

    /// The old name of [`acquire_key`](LockManager::acquire_key), which answers an
    /// [`Attempt`] where this answers an `Option`.
    #[deprecated(
        since = "0.4.0",
        note = "renamed `acquire_key`, which answers an `Attempt`"
    )]
    async fn lock(&self, key: &LockKey, options: AcquireOptions) -> Result<Option<LockGuard>> {
        Ok(self.acquire_key(key, options).await?.into_handle())
    }

    /// The old name of [`release_key`](LockManager::release_key).
    #[deprecated(since = "0.4.0", note = "renamed `release_key`")]
    async fn unlock(&self, key: &LockKey) -> Result<()> {
        self.release_key(key).await
    }

    /// The old name of [`is_held_key`](LockManager::is_held_key).
    #[deprecated(since = "0.4.0", note = "renamed `is_held_key`")]
    async fn holds(&self, key: &LockKey) -> bool {
        self.is_held_key(key).await
    }
}
