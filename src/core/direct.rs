//! The caller's acquisitions straight on the engine, for the managers' inherent methods.
//!
//! [`LockManagerExt`](crate::LockManagerExt) reaches the engine through the object-safe port,
//! whose `async_trait` future is boxed: an allocation and a copy of the whole acquisition per
//! call. A manager's inherent `acquire` and `try_acquire` call these instead; they mean exactly
//! what the extension trait's methods mean (same nesting check, same deadlines, same errors).

use std::sync::Arc;
use std::time::Duration;

use super::{Backend, Core};
use crate::{LockGuard, LockKey, LockMode, Result};

impl<B: Backend> Core<B> {
    /// [`LockManagerExt::acquire`](crate::LockManagerExt::acquire) in `mode`.
    pub(crate) async fn acquire_checked(
        self: &Arc<Self>,
        key: LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<LockGuard> {
        crate::scope::refuse_nested(self.holder_id(), &key)?;
        self.acquire(&key, mode, crate::Wait::from(timeout)).await
    }

    /// [`LockManagerExt::try_acquire`](crate::LockManagerExt::try_acquire) in `mode`.
    pub(crate) async fn try_acquire_checked(
        self: &Arc<Self>,
        key: LockKey,
        mode: LockMode,
    ) -> Result<Option<LockGuard>> {
        crate::scope::refuse_nested(self.holder_id(), &key)?;
        self.try_acquire(&key, mode).await
    }
}

/// The inherent `acquire`, `acquire_shared`, `try_acquire`, `try_acquire_shared`, `release`
/// and `is_held` of a manager type that wraps `core: Arc<Core<_>>`. Method calls on the concrete type pick these
/// over [`LockManagerExt`](crate::LockManagerExt)'s, which stay for generic and `dyn` callers.
macro_rules! direct_acquisitions {
    ($manager:ty) => {
        impl $manager {
            /// Waits for the exclusive lock on `key` and hands back its guard: exactly
            /// [`LockManagerExt::acquire`]($crate::LockManagerExt::acquire), without boxing the
            /// call as the object-safe [`LockManager`]($crate::LockManager) port must.
            ///
            /// # Errors
            ///
            /// [`Error::Timeout`]($crate::Error::Timeout) when the deadline passes first;
            /// [`Error::Reentrant`]($crate::Error::Reentrant) inside a critical section on
            /// `key`; otherwise the backend's failures (see [`Error`]($crate::Error)).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn acquire(
                &self,
                key: impl Into<$crate::LockKey>,
                timeout: Option<std::time::Duration>,
            ) -> $crate::Result<$crate::LockGuard> {
                let key = key.into();
                self.core
                    .acquire_checked(key, $crate::LockMode::Exclusive, timeout)
                    .await
            }

            /// Waits for `key` in shared mode: exactly
            /// [`LockManagerExt::acquire_shared`]($crate::LockManagerExt::acquire_shared),
            /// unboxed.
            ///
            /// # Errors
            ///
            /// As for [`acquire`](Self::acquire).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn acquire_shared(
                &self,
                key: impl Into<$crate::LockKey>,
                timeout: Option<std::time::Duration>,
            ) -> $crate::Result<$crate::LockGuard> {
                let key = key.into();
                self.core
                    .acquire_checked(key, $crate::LockMode::Shared, timeout)
                    .await
            }

            /// Takes the exclusive lock on `key` if it is free right now: exactly
            /// [`LockManagerExt::try_acquire`]($crate::LockManagerExt::try_acquire), unboxed.
            ///
            /// # Errors
            ///
            /// Failures are errors, never [`Attempt::Busy`]($crate::Attempt::Busy);
            /// [`Error::Reentrant`]($crate::Error::Reentrant) inside a critical section on
            /// `key`.
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn try_acquire(
                &self,
                key: impl Into<$crate::LockKey>,
            ) -> $crate::Result<$crate::Attempt> {
                let key = key.into();
                self.core
                    .try_acquire_checked(key, $crate::LockMode::Exclusive)
                    .await
                    .map($crate::Attempt::from)
            }

            /// Takes `key` in shared mode if no one holds it exclusively right now: exactly
            /// [`LockManagerExt::try_acquire_shared`]($crate::LockManagerExt::try_acquire_shared),
            /// unboxed.
            ///
            /// # Errors
            ///
            /// As for [`try_acquire`](Self::try_acquire).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: if the future is dropped, the lock is either not taken or released.
            pub async fn try_acquire_shared(
                &self,
                key: impl Into<$crate::LockKey>,
            ) -> $crate::Result<$crate::Attempt> {
                let key = key.into();
                self.core
                    .try_acquire_checked(key, $crate::LockMode::Shared)
                    .await
                    .map($crate::Attempt::from)
            }

            /// Releases this manager's lock on `key`, however it was taken: exactly
            /// [`LockManagerExt::release`]($crate::LockManagerExt::release).
            ///
            /// # Errors
            ///
            /// [`Error::NotHeld`]($crate::Error::NotHeld) when this manager does not hold
            /// `key`; [`Error::ReleaseFailed`]($crate::Error::ReleaseFailed) when the release
            /// could not be confirmed (the registry forgets the lock either way).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: once the registry has forgotten the lock, it is released even if
            /// the future is dropped.
            pub async fn release(&self, key: impl Into<$crate::LockKey>) -> $crate::Result<()> {
                self.core.release(&key.into()).await
            }

            /// True when this manager holds `key`: exactly
            /// [`LockManagerExt::is_held`]($crate::LockManagerExt::is_held).
            ///
            /// # Cancel safety
            ///
            /// Cancel safe: it only reads.
            pub async fn is_held(&self, key: impl Into<$crate::LockKey>) -> bool {
                self.core.is_held(&key.into()).await
            }
        }
    };
}
pub(crate) use direct_acquisitions;
