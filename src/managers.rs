//! This crate's managers on the port: [`LockManager`](crate::LockManager) and their inherent
//! caller API, written once for both. The engine hands out acquisitions; here they become
//! [`LockGuard`](crate::LockGuard)s, above the engine and the backends, which never name the public guard.

use std::sync::Arc;

use crate::core::{Acquired, Backend, Core, CoreGuard};
use crate::exit::Exit;
use crate::verbs::Take;
use crate::{
    Attempt, InMemoryLockManager, LockGuard, LockKey, LockMode, PostgresLockManager, Wait,
};
#[cfg(doc)]
use crate::{LockManager, LockManagerExt};

/// Implements [`LockManager`](crate::LockManager) for a manager type that wraps
/// `core: Arc<Core<_>>`, and gives it the whole caller API inherently
/// (`inherent_caller_api!`).
macro_rules! delegate_lock_manager {
    ($manager:ident) => {
        crate::ext::inherent_caller_api!($manager);

        #[async_trait::async_trait]
        impl $crate::LockManager for $manager {
            async fn acquire_key(
                &self,
                key: &$crate::LockKey,
                options: $crate::AcquireOptions,
            ) -> $crate::Result<$crate::Attempt> {
                let acquired = self.core.lock(key, options).await?;
                Ok($crate::Attempt::from(acquired.map($crate::LockGuard::from)))
            }

            async fn release_key(&self, key: &$crate::LockKey) -> $crate::Result<()> {
                self.core.release(key).await
            }

            async fn is_held_key(&self, key: &$crate::LockKey) -> bool {
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

/// The inherent caller API's way to the engine: the acquisitions of the port, unboxed.
impl<B: Backend> Take for Arc<Core<B>>
where
    Exit: From<CoreGuard<B>>,
{
    async fn take(&self, key: &LockKey, mode: LockMode, wait: Wait) -> crate::Result<Attempt> {
        crate::scope::refuse_nested(self.holder_id(), key)?;
        Ok(match wait {
            Wait::No => Attempt::from(self.try_acquire(key, mode).await?.map(LockGuard::from)),
            wait => Attempt::Acquired(LockGuard::from(self.acquire(key, mode, wait).await?)),
        })
    }
}
