//! A lock broken on purpose, for the second negative control ([`Mode::BrokenLock`]): a lock
//! manager that takes every lock in shared mode, exclusive requests included, and is otherwise
//! the real one. Two workers asking for one key exclusively then both get it, each with its
//! own fencing token, as a lock that does not exclude would hand it out.
//!
//! [`Mode::BrokenLock`]: crate::spec::Mode::BrokenLock

use async_trait::async_trait;
use pglock::{AcquireOptions, Attempt, HeldLock, LockKey, LockManager, LockMode, Result};

/// A manager that turns exclusive requests into shared ones (see the module docs).
#[derive(Debug)]
pub struct ExclusiveAsShared<M>(pub M);

#[async_trait]
impl<M: LockManager> LockManager for ExclusiveAsShared<M> {
    async fn acquire_key(&self, key: &LockKey, options: AcquireOptions) -> Result<Attempt> {
        let shared = AcquireOptions::new(LockMode::Shared, options.wait);
        self.0.acquire_key(key, shared).await
    }

    async fn release_key(&self, key: &LockKey) -> Result<()> {
        self.0.release_key(key).await
    }

    async fn is_held_key(&self, key: &LockKey) -> bool {
        self.0.is_held_key(key).await
    }

    async fn release_all(&self) -> Result<usize> {
        self.0.release_all().await
    }

    async fn held_locks(&self) -> Vec<HeldLock> {
        self.0.held_locks().await
    }

    fn held_lock_count(&self) -> usize {
        self.0.held_lock_count()
    }

    fn holder_id(&self) -> &str {
        self.0.holder_id()
    }
}
