//! The guard every acquisition hands back.

use std::fmt;
use std::future::Future;

use crate::exit::{Exit, GuardBackend};
use crate::{Error, LockHandle, LockInfo, LossCause, LossSignal, Result};

/// Proof that a lock is held, handed back by every acquisition of one key
/// ([`acquire`](crate::LockManagerExt::acquire), [`try_acquire`](crate::LockManagerExt::try_acquire)
/// and their shared-mode variants): the [`LockHandle`] of one lock.
///
/// A guard has three exits:
///
/// 1. [`release`](LockGuard::release): release now and learn whether it was confirmed. This is
///    the exit to use on every normal path.
/// 2. **Drop**: the guard starts the release in the background. It is *not* immediate: the
///    manager forgets the lock at once, but the unlock statement runs on a spawned task. Until it
///    has, other holders cannot take the lock and the same manager queues new acquisitions of
///    the key behind it. Dropped outside a Tokio runtime, the lock's session is closed instead,
///    and the server frees the lock either way.
/// 3. [`leak`](LockGuard::leak): keep the lock held after the guard is gone, in the manager's
///    registry, until [`release`](crate::LockManagerExt::release) or
///    [`release_all`](crate::LockManager::release_all) names it: the Python original's "try,
///    then later release the key", as in a leader loop.
///
/// # When the lock goes
///
/// A lock can go while its guard is alive: the session holding it may be terminated, time out
/// or become unreachable (the server then frees the lock for someone else, and a manager that
/// watches its locks declares it lost), or code elsewhere may release it through the manager.
/// Either way the guard's [`loss_signal`](LockGuard::loss_signal) fires with the
/// [cause](crate::LossCause), [`run`](LockGuard::run) cancels its body, and
/// [`release`](LockGuard::release) fails with [`Error::LockLost`]. A guard only ever releases
/// its own acquisition: once its lock went, it releases nothing, even if the key has been
/// acquired again since.
#[must_use = "the lock is released as soon as the guard is dropped; bind it to a variable that lives as long as the critical section"]
pub struct LockGuard {
    info: LockInfo,
    loss: LossSignal,
    exit: Option<Exit>,
}

impl LockGuard {
    /// Builds a guard from its implementor-side backend.
    ///
    /// Only implementors of [`LockManager`](crate::LockManager) need this.
    pub fn new(info: LockInfo, backend: Box<dyn GuardBackend>) -> Self {
        LockGuard {
            info,
            loss: backend.loss_signal(),
            exit: Some(Exit::Custom(backend)),
        }
    }

    /// A guard of one of this crate's managers.
    pub(crate) fn with_exit(info: LockInfo, loss: LossSignal, exit: Exit) -> Self {
        LockGuard {
            info,
            loss,
            exit: Some(exit),
        }
    }

    /// The acquisition this guard stands for: key, lock id, time, holder, fencing token, mode.
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// The signal that fires when this lock goes before the guard releases it: declared lost,
    /// or released through the manager.
    ///
    /// Cheap to check ([`is_lost`](LossSignal::is_lost)), awaitable
    /// ([`lost`](LossSignal::lost)), convertible into a `CancellationToken`
    /// ([`token`](LossSignal::token)), and it outlives the guard when cloned. Detection of a
    /// lost session is periodic: see the manager's documentation for how quickly it is noticed.
    pub fn loss_signal(&self) -> &LossSignal {
        &self.loss
    }

    /// Runs `body` as this lock's critical section.
    ///
    /// * If the lock goes while `body` runs (declared lost, or released through the manager),
    ///   `body` is **cancelled** (dropped at its next await point) and the call returns
    ///   [`Error::LockLost`] with the cause. A body that finishes at the moment the loss is
    ///   noticed counts as lost too: its work cannot be assumed to have been exclusive.
    /// * Inside `body`, acquiring the same key from the same holder fails at once with
    ///   [`Error::Reentrant`] instead of waiting for itself. Sibling futures that run next to
    ///   `run` (not inside `body`) queue for the key as usual, and so do tasks spawned from
    ///   `body`.
    ///
    /// The guard stays held afterwards; release it, or use
    /// [`with_lock`](crate::LockManagerExt::with_lock), which does both.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`] when the lock went before `body` finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body`; the guard is untouched.
    ///
    /// # Examples
    ///
    /// ```
    /// use pglock::{Error, InMemoryLockManager};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let guard = locks.acquire("report:daily", None).await?;
    /// let rows = guard
    ///     .run(async {
    ///         // Asking for the key again in here would wait for itself: refused at once.
    ///         let again = locks.try_acquire("report:daily").await;
    ///         assert!(matches!(again, Err(Error::Reentrant { .. })));
    ///         42
    ///     })
    ///     .await?;
    /// guard.release().await?;
    /// assert_eq!(rows, 42);
    /// # Ok(()) }
    /// ```
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output> {
        self.section(body).await.map_err(|cause| Error::LockLost {
            key: self.info.key.clone(),
            cause,
        })
    }

    /// [`run`](Self::run), with the cause of a loss as the error.
    pub(crate) async fn section<F: Future>(&self, body: F) -> Result<F::Output, LossCause> {
        let info = &self.info;
        let body = crate::scope::inside(info.holder_id.clone(), info.key.clone(), info.mode, body);
        self.loss.run_until_lost(body).await
    }

    /// Releases the lock now.
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`] when the lock had gone already (declared lost, or released
    ///   through the manager): the critical section may have overlapped another holder's. The
    ///   cause is the loss signal's.
    /// * [`Error::ReleaseFailed`] when the release could not be confirmed. The lock's session
    ///   has then been closed, which frees the lock on the server.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. If the future is dropped before it completes, the release carries on as if
    /// the guard had been dropped: either the unlock finishes in the background or the session
    /// that holds the lock is closed. The lock is never left held.
    pub async fn release(mut self) -> Result<()> {
        match self.exit.take() {
            Some(exit) => exit.release(&self.loss).await,
            None => Ok(()),
        }
    }

    /// Keeps the lock held without this guard, owned by the manager's registry, and returns
    /// the acquisition's [`LockInfo`].
    ///
    /// The lock stays held until [`release`](crate::LockManagerExt::release) or
    /// [`release_all`](crate::LockManager::release_all) names it, or the manager is dropped.
    /// [`Attempt::leak`](crate::Attempt::leak) does the same for a try: the Python original's
    /// "try, then later `release(key)`".
    ///
    /// ```
    /// use pglock::InMemoryLockManager;
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
    /// let locks = InMemoryLockManager::new();
    /// let info = locks.acquire("leader:jobs", None).await?.leak();
    /// assert!(locks.is_held(&info.key).await);
    /// locks.release("leader:jobs").await?;
    /// # Ok(()) }
    /// ```
    pub fn leak(mut self) -> LockInfo {
        if let Some(exit) = self.exit.take() {
            exit.leak();
        }
        self.info.clone()
    }
}

impl crate::handle::sealed::Sealed for LockGuard {}

impl LockHandle for LockGuard {
    type Info = LockInfo;

    fn info(&self) -> &LockInfo {
        LockGuard::info(self)
    }

    fn loss_signal(&self) -> &LossSignal {
        LockGuard::loss_signal(self)
    }

    fn run<F>(&self, body: F) -> impl Future<Output = Result<F::Output>> + Send
    where
        F: Future + Send,
    {
        LockGuard::run(self, body)
    }

    fn release(self) -> impl Future<Output = Result<()>> + Send {
        LockGuard::release(self)
    }

    fn leak(self) -> LockInfo {
        LockGuard::leak(self)
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("info", &self.info)
            .field("loss", &self.loss)
            .field("backend", &self.exit)
            .finish()
    }
}

// Dropping `exit` is the background release: see `GuardBackend` and `CoreGuard`'s `Drop`.
