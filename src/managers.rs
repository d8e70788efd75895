//! This crate's managers on the port: [`LockManager`](crate::LockManager) and their inherent
//! methods, written once for both. The engine hands out acquisitions; here they become
//! [`LockGuard`](crate::LockGuard)s, above the engine and the backends, which never name the public guard.

use crate::core::{Acquired, Backend, CoreGuard};
use crate::exit::Exit;
use crate::{InMemoryLockManager, LockGuard, PostgresLockManager};

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
                    .map($crate::LockGuard::from)
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
                    .map($crate::LockGuard::from)
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
                    .map(|acquired| $crate::Attempt::from(acquired.map($crate::LockGuard::from)))
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
                    .map(|acquired| $crate::Attempt::from(acquired.map($crate::LockGuard::from)))
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

/// Implements [`LockManager`](crate::LockManager) for a manager type that wraps
/// `core: Arc<Core<_>>`, and gives it its inherent methods (`direct_acquisitions!`).
macro_rules! delegate_lock_manager {
    ($manager:ty) => {
        direct_acquisitions!($manager);

        #[async_trait::async_trait]
        impl $crate::LockManager for $manager {
            async fn lock(
                &self,
                key: &$crate::LockKey,
                options: $crate::AcquireOptions,
            ) -> $crate::Result<Option<$crate::LockGuard>> {
                let acquired = self.core.lock(key, options).await?;
                Ok(acquired.map($crate::LockGuard::from))
            }

            async fn unlock(&self, key: &$crate::LockKey) -> $crate::Result<()> {
                self.core.release(key).await
            }

            async fn holds(&self, key: &$crate::LockKey) -> bool {
                self.core.is_held(key).await
            }

            async fn release_all(&self) -> $crate::Result<usize> {
                self.core.release_all().await
            }

            async fn held_locks(&self) -> Vec<$crate::HeldLock> {
                self.core.held_locks().await
            }

            fn held_lock_count(&self) -> usize {
                self.core.held_lock_count()
            }

            fn holder_id(&self) -> &str {
                self.core.holder_id()
            }
        }
    };
}

delegate_lock_manager!(InMemoryLockManager);
delegate_lock_manager!(PostgresLockManager);

/// A guard for an acquisition of the engine, whatever its backend, so long as the backend has
/// its variant of [`Exit`].
impl<B: Backend> From<Acquired<B>> for LockGuard
where
    Exit: From<CoreGuard<B>>,
{
    fn from(acquired: Acquired<B>) -> Self {
        LockGuard::with_exit(acquired.info, acquired.loss, Exit::from(acquired.guard))
    }
}
