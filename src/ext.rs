//! Conveniences built on the [`LockManager`] port, available on every implementation.

use std::future::Future;
use std::time::Duration;

use crate::{Error, LockInfo, LockManager, Result};

/// Conveniences for every [`LockManager`], including `dyn LockManager`.
///
/// Import it next to the trait: `use pglock::{LockManager, LockManagerExt};`.
pub trait LockManagerExt: LockManager {
    /// Runs `body` while holding the lock on `key`, and releases the lock afterwards on every
    /// path: success, error, panic unwinding, or cancellation of the returned future.
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
    /// background (see [`LockGuard`](crate::LockGuard)'s drop).
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
        key: &str,
        timeout: Option<Duration>,
        body: F,
    ) -> impl Future<Output = Result<T>> + Send
    where
        F: FnOnce(LockInfo) -> Fut + Send,
        Fut: Future<Output = T> + Send,
        T: Send,
    {
        async move {
            let guard = self.acquire(key, timeout).await?;
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
                    drop(guard);
                    Err(Error::LockLost {
                        key: key.to_owned(),
                        cause,
                    })
                }
            }
        }
    }
}

impl<M: LockManager + ?Sized> LockManagerExt for M {}
