//! A lock manager wrapper that stamps fencing tokens of a counter the test controls.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use pglock::{GuardBackend, LockGuard, LockInfo, LockManager};

/// A lock manager that stamps a fencing token on every acquisition, strictly increasing
/// across every manager sharing `counter`: the lock core's coming fencing, played by a
/// wrapper so the cutover's use of tokens can be tested today.
#[derive(Debug, Clone)]
pub struct Fenced {
    inner: Arc<dyn LockManager>,
    counter: Arc<AtomicI64>,
}

impl Fenced {
    pub fn new(inner: Arc<dyn LockManager>, counter: Arc<AtomicI64>) -> Fenced {
        Fenced { inner, counter }
    }

    fn stamp(&self, info: LockInfo) -> LockInfo {
        info.with_fencing_token(Some(self.counter.fetch_add(1, Ordering::SeqCst) + 1))
    }

    fn wrap(&self, guard: LockGuard) -> LockGuard {
        let info = self.stamp(guard.info().clone());
        LockGuard::new(info, Box::new(Wrapped(guard)))
    }
}

#[derive(Debug)]
struct Wrapped(LockGuard);

#[async_trait]
impl GuardBackend for Wrapped {
    async fn release(self: Box<Self>) -> pglock::Result<bool> {
        self.0.release().await
    }

    fn leak(self: Box<Self>) {
        self.0.leak();
    }
}

#[async_trait]
impl LockManager for Fenced {
    async fn acquire(&self, key: &str, timeout: Option<Duration>) -> pglock::Result<LockGuard> {
        Ok(self.wrap(self.inner.acquire(key, timeout).await?))
    }

    async fn try_acquire(&self, key: &str) -> pglock::Result<Option<LockInfo>> {
        Ok(self
            .inner
            .try_acquire(key)
            .await?
            .map(|info| self.stamp(info)))
    }

    async fn acquire_shared(
        &self,
        key: &str,
        timeout: Option<Duration>,
    ) -> pglock::Result<LockGuard> {
        Ok(self.wrap(self.inner.acquire_shared(key, timeout).await?))
    }

    async fn try_acquire_shared(&self, key: &str) -> pglock::Result<Option<LockInfo>> {
        Ok(self
            .inner
            .try_acquire_shared(key)
            .await?
            .map(|info| self.stamp(info)))
    }

    async fn release(&self, key: &str) -> pglock::Result<()> {
        self.inner.release(key).await
    }

    async fn release_all(&self) -> pglock::Result<usize> {
        self.inner.release_all().await
    }

    async fn is_held(&self, key: &str) -> bool {
        self.inner.is_held(key).await
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held_lock_count()
    }

    fn holder_id(&self) -> Option<&str> {
        self.inner.holder_id()
    }
}
