//! The guard handed out by a blocking acquisition.

use std::fmt;
use std::ops::Deref;

use async_trait::async_trait;

use crate::{LockInfo, LossCause, LossSignal, Result};

/// Proof that a lock is held, returned by [`LockManager::acquire`](crate::LockManager::acquire).
///
/// A guard has three exits:
///
/// 1. [`release`](LockGuard::release): release now and learn whether the server confirmed it.
///    This is the exit to use on every normal path.
/// 2. **Drop**: the guard starts the release in the background. It is *not* immediate: the
///    manager forgets the lock at once, but the unlock statement runs on a spawned task. Until it
///    has, other holders cannot take the lock and the same manager queues new acquisitions of
///    the key behind it. If the guard is dropped outside a Tokio runtime, the unlock is queued on
///    the lock's session (or, for a lock held on a session of its own, that session is closed),
///    and the server frees the lock either way.
/// 3. [`leak`](LockGuard::leak): keep the lock held after the guard is gone and hand it to the
///    manager's registry, where [`LockManager::release`](crate::LockManager::release) or
///    [`LockManager::release_all`](crate::LockManager::release_all) can release it later.
///
/// A guard releases **only its own acquisition**. If its lock was already released through
/// [`LockManager::release`](crate::LockManager::release) or
/// [`LockManager::release_all`](crate::LockManager::release_all), the guard's release reports
/// `Ok(false)` and its drop does nothing, even if the same key has been acquired again since.
///
/// # Lost locks
///
/// A lock can be lost while its guard is alive: the session that holds it may be terminated,
/// time out, or become unreachable, and the server then frees the lock for someone else. A
/// manager that watches its locks (as [`PostgresLockManager`](crate::PostgresLockManager) does)
/// declares such a lock lost; the guard exposes it through [`is_lost`](LockGuard::is_lost),
/// [`lost`](LockGuard::lost) and [`lost_token`](LockGuard::lost_token), and its
/// [`release`](LockGuard::release) then fails with [`Error::LockLost`](crate::Error::LockLost).
/// Work that must stop when the lock is gone can race against `lost()`, or use
/// [`LockManagerExt::with_lock`](crate::LockManagerExt::with_lock), which does it for you.
///
/// The guard dereferences to the [`LockInfo`] of the acquisition.
#[must_use = "the lock is released as soon as the guard is dropped; bind it to a variable that lives as long as the critical section"]
pub struct LockGuard {
    info: LockInfo,
    loss: LossSignal,
    backend: Option<Box<dyn GuardBackend>>,
}

impl LockGuard {
    /// Builds a guard from its implementor-side backend.
    ///
    /// Only implementors of [`LockManager`](crate::LockManager) need this.
    pub fn new(info: LockInfo, backend: Box<dyn GuardBackend>) -> Self {
        LockGuard {
            info,
            loss: backend.loss_signal(),
            backend: Some(backend),
        }
    }

    /// The acquisition this guard stands for.
    pub fn info(&self) -> &LockInfo {
        &self.info
    }

    /// True once the manager has declared this lock lost.
    ///
    /// Cheap: it reads a flag. Detection is periodic, so `false` means "not known to be lost";
    /// see the manager's documentation for how quickly a loss is noticed.
    pub fn is_lost(&self) -> bool {
        self.loss.is_lost()
    }

    /// Completes when the manager declares this lock lost, with the cause. It never completes
    /// while the lock is held, nor after a normal release.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only waits.
    pub async fn lost(&self) -> LossCause {
        self.loss.lost().await
    }

    /// A token that is cancelled when this lock is declared lost, for `tokio::select!`,
    /// `CancellationToken::run_until_cancelled` or code that already speaks tokens.
    pub fn lost_token(&self) -> tokio_util::sync::CancellationToken {
        self.loss.token()
    }

    /// The loss signal itself, which outlives the guard (clone it before releasing).
    pub fn loss_signal(&self) -> &LossSignal {
        &self.loss
    }

    /// Releases the lock now.
    ///
    /// Returns `Ok(true)` when this call released the lock and the server confirmed it, and
    /// `Ok(false)` when there was nothing left to release because the lock had already been
    /// released through [`LockManager::release`](crate::LockManager::release) or
    /// [`LockManager::release_all`](crate::LockManager::release_all).
    ///
    /// # Errors
    ///
    /// * [`Error::LockLost`](crate::Error::LockLost) when the lock had been declared lost: the
    ///   critical section may have overlapped with another holder's.
    /// * [`Error::ReleaseFailed`](crate::Error::ReleaseFailed) when the release could not be
    ///   confirmed. The lock's session has then been closed, which frees the lock on the server.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe. If the future is dropped before it completes, the release carries on as if
    /// the guard had been dropped: either the unlock finishes in the background or the session
    /// that holds the lock is closed. The lock is never left held.
    pub async fn release(mut self) -> Result<bool> {
        match self.backend.take() {
            Some(backend) => backend.release().await,
            None => Ok(false),
        }
    }

    /// Keeps the lock held without this guard, owned by the manager's registry.
    ///
    /// The lock then behaves like one taken with
    /// [`LockManager::try_acquire`](crate::LockManager::try_acquire): it stays held until
    /// [`LockManager::release`](crate::LockManager::release) or
    /// [`LockManager::release_all`](crate::LockManager::release_all) names it, or until the
    /// manager is dropped. Returns the acquisition's [`LockInfo`].
    pub fn leak(mut self) -> LockInfo {
        if let Some(backend) = self.backend.take() {
            backend.leak();
        }
        self.info.clone()
    }
}

impl Deref for LockGuard {
    type Target = LockInfo;

    fn deref(&self) -> &LockInfo {
        &self.info
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("info", &self.info)
            .field("loss", &self.loss)
            .field("backend", &self.backend)
            .finish()
    }
}

// Dropping `backend` is the background release: see `GuardBackend`.

/// The implementor's side of a [`LockGuard`].
///
/// Implementations of [`LockManager`](crate::LockManager) hand one of these to
/// [`LockGuard::new`]. The guard calls exactly one of [`release`](GuardBackend::release) and
/// [`leak`](GuardBackend::leak), or neither, in which case it drops the backend.
///
/// # Contract
///
/// * **Drop releases.** Dropping a backend on which neither method was called must start
///   releasing its acquisition without blocking (typically on a spawned task). Dropping the
///   future returned by `release` before it completes must do the same.
/// * **Own acquisition only.** A backend must release only the acquisition it was created for.
///   If that acquisition was already released through the manager (`release(key)`,
///   `release_all()`), `release` returns `Ok(false)` and dropping does nothing, even when the
///   same key has been acquired again since.
/// * **Loss.** If the manager can detect lost locks, [`loss_signal`](GuardBackend::loss_signal)
///   returns the acquisition's signal, and `release` of a lost acquisition returns
///   [`Error::LockLost`](crate::Error::LockLost).
#[async_trait]
pub trait GuardBackend: Send + Sync + fmt::Debug + 'static {
    /// Releases the acquisition now; see [`LockGuard::release`] for the meaning of the result.
    async fn release(self: Box<Self>) -> Result<bool>;

    /// Hands the acquisition to the manager's registry without releasing it; see
    /// [`LockGuard::leak`].
    fn leak(self: Box<Self>);

    /// The signal fired if this acquisition is declared lost. The default never fires, for
    /// managers that cannot detect loss.
    fn loss_signal(&self) -> LossSignal {
        LossSignal::new()
    }
}
