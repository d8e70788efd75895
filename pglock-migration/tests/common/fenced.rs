//! A lock manager wrapper that stamps fencing tokens of a counter the test controls.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

use async_trait::async_trait;
use pglock::{
    AcquireOptions, Attempt, GuardBackend, LockGuard, LockInfo, LockKey, LockManager, LossSignal,
};

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
    async fn release(self: Box<Self>) -> pglock::Result<()> {
        self.0.release().await
    }

    fn leak(self: Box<Self>) {
        self.0.leak();
    }

    fn loss_signal(&self) -> LossSignal {
        self.0.loss_signal().clone()
    }
}

#[async_trait]
impl LockManager for Fenced {
    async fn acquire_key(&self, key: &LockKey, options: AcquireOptions) -> pglock::Result<Attempt> {
        let attempt = self.inner.acquire_key(key, options).await?;
        Ok(attempt.map(|guard| self.wrap(guard)))
    }

    async fn release_key(&self, key: &LockKey) -> pglock::Result<()> {
        self.inner.release_key(key).await
    }

    async fn is_held_key(&self, key: &LockKey) -> bool {
        self.inner.is_held_key(key).await
    }

    async fn release_all(&self) -> pglock::Result<usize> {
        self.inner.release_all().await
    }

    async fn held_locks(&self) -> Vec<pglock::HeldLock> {
        self.inner.held_locks().await
    }

    fn held_lock_count(&self) -> usize {
        self.inner.held_lock_count()
    }

    fn holder_id(&self) -> &str {
        self.inner.holder_id()
    }
}
