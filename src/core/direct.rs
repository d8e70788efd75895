//! The caller's acquisitions straight on the engine, for the managers' inherent methods.
//!
//! [`LockManagerExt`](crate::LockManagerExt) reaches the engine through the object-safe port,
//! whose `async_trait` future is boxed: an allocation and a copy of the whole acquisition per
//! call. A manager's inherent `acquire` and `try_acquire` call these instead; they mean exactly
//! what the extension trait's methods mean (same nesting check, same deadlines, same errors).

use std::sync::Arc;
use std::time::Duration;

use super::Acquired;
use super::{Backend, Core};
use crate::{LockKey, LockMode, Result};

impl<B: Backend> Core<B> {
    /// [`LockManagerExt::acquire`](crate::LockManagerExt::acquire) in `mode`.
    pub(crate) async fn acquire_checked(
        self: &Arc<Self>,
        key: LockKey,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<Acquired<B>> {
        crate::scope::refuse_nested(self.holder_id(), &key)?;
        self.acquire(&key, mode, crate::Wait::from(timeout)).await
    }

    /// [`LockManagerExt::try_acquire`](crate::LockManagerExt::try_acquire) in `mode`.
    pub(crate) async fn try_acquire_checked(
        self: &Arc<Self>,
        key: LockKey,
        mode: LockMode,
    ) -> Result<Option<Acquired<B>>> {
        crate::scope::refuse_nested(self.holder_id(), &key)?;
        self.try_acquire(&key, mode).await
    }
}
