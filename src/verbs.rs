//! The caller's verbs, written once: [`LockManagerExt`](crate::LockManagerExt) and the
//! managers' inherent methods both call these, reaching the manager through [`Take`].

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::lock_set::LockSet;
use crate::{
    AcquireOptions, Attempt, Error, LockGuard, LockHandle, LockKey, LockManager, LockMode, Result,
    Wait,
};

/// How the verbs take one lock: through the object-safe port (any manager), or straight to the
/// engine (this crate's managers, whose port future would be boxed).
pub(crate) trait Take: Sync {
    /// Takes `key` in `mode`, waiting as `wait` says, after refusing an acquisition nested in a
    /// critical section of the key. `Busy` only for [`Wait::No`].
    fn take(
        &self,
        key: &LockKey,
        mode: LockMode,
        wait: Wait,
    ) -> impl Future<Output = Result<Attempt>> + Send;
}

/// Any manager, through the port.
pub(crate) struct Port<'a, M: ?Sized>(pub(crate) &'a M);

impl<M: LockManager + ?Sized> Take for Port<'_, M> {
    async fn take(&self, key: &LockKey, mode: LockMode, wait: Wait) -> Result<Attempt> {
        crate::scope::refuse_nested(self.0.holder_id(), key)?;
        let options = AcquireOptions::new(mode, wait);
        self.0.acquire_key(key, options).await
    }
}

/// Waits for `key` in `mode` for at most `timeout` (`None`: as long as it takes).
pub(crate) async fn acquire<T: Take + ?Sized>(
    taker: &T,
    key: LockKey,
    mode: LockMode,
    timeout: Option<Duration>,
) -> Result<LockGuard> {
    match taker.take(&key, mode, Wait::from(timeout)).await? {
        Attempt::Acquired(guard) => Ok(guard),
        // Only `Wait::No` may answer `Busy`; a manager that does so for a wait breaks the
        // port's contract, and the caller still deserves its timeout.
        _ => Err(Error::Timeout {
            key,
            timeout: timeout.unwrap_or_default(),
        }),
    }
}

/// One try of `key` in `mode`.
pub(crate) async fn try_acquire<T: Take + ?Sized>(
    taker: &T,
    key: LockKey,
    mode: LockMode,
) -> Result<Attempt> {
    taker.take(&key, mode, Wait::No).await
}

/// Runs `body` under `handle`'s locks as their critical section, then releases them: the one
/// home of every scoped verb (`with_lock`, `with_locks`, `with_permit` and their tries).
pub(crate) async fn scoped<H, F, Fut, V>(handle: H, body: F) -> Result<V>
where
    H: LockHandle,
    F: FnOnce(<H::Info as ToOwned>::Owned) -> Fut,
    Fut: Future<Output = V> + Send,
{
    let value = handle.run(body(handle.info().to_owned())).await?;
    after_section(value, handle.release().await)
}

/// [`scoped`], when the try took the lock; `None` (the body skipped) when it was busy.
pub(crate) async fn scoped_if<H, F, Fut, V>(attempt: Attempt<H>, body: F) -> Result<Option<V>>
where
    H: LockHandle,
    F: FnOnce(<H::Info as ToOwned>::Owned) -> Fut,
    Fut: Future<Output = V> + Send,
{
    match attempt.into_handle() {
        Some(handle) => scoped(handle, body).await.map(Some),
        None => Ok(None),
    }
}

/// A section's value once its locks are released: a lock lost before the release is the
/// caller's error; a release the server did not confirm is only logged (the session holding
/// the lock was closed, which frees it).
fn after_section<T>(value: T, released: Result<()>) -> Result<T> {
    match released {
        Ok(()) => Ok(value),
        Err(lost @ Error::LockLost { .. }) => Err(lost),
        Err(err) => {
            tracing::warn!(error = %err, "release after a critical section unconfirmed");
            Ok(value)
        }
    }
}

/// Takes every one of `keys` (in lock order) in `mode` within one `timeout`, or none.
pub(crate) async fn acquire_all<T: Take + ?Sized>(
    taker: &T,
    keys: Vec<LockKey>,
    mode: LockMode,
    timeout: Option<Duration>,
) -> Result<LockSet> {
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    let mut guards = Vec::with_capacity(keys.len());
    for key in keys {
        // What is left of the one deadline; a zero timeout stays one try per key.
        let left = match (timeout, deadline) {
            (Some(_), Some(deadline)) => Some(deadline.saturating_duration_since(Instant::now())),
            (timeout, _) => timeout,
        };
        match acquire(taker, key, mode, left).await {
            Ok(guard) => guards.push(guard),
            Err(err) => {
                give_back(guards).await;
                return Err(match err {
                    Error::Timeout { key, .. } => Error::Timeout {
                        key,
                        timeout: timeout.unwrap_or_default(),
                    },
                    err => err,
                });
            }
        }
    }
    Ok(LockSet::new(guards))
}

/// One try of every one of `keys` (in lock order) in `mode`: all of them, or `Busy` and none.
pub(crate) async fn try_acquire_all<T: Take + ?Sized>(
    taker: &T,
    keys: Vec<LockKey>,
    mode: LockMode,
) -> Result<Attempt<LockSet>> {
    let mut guards = Vec::with_capacity(keys.len());
    for key in keys {
        match taker.take(&key, mode, Wait::No).await {
            Ok(Attempt::Acquired(guard)) => guards.push(guard),
            Ok(_) => {
                give_back(guards).await;
                return Ok(Attempt::Busy);
            }
            Err(err) => {
                give_back(guards).await;
                return Err(err);
            }
        }
    }
    Ok(Attempt::Acquired(LockSet::new(guards)))
}

/// All or nothing: what a set had taken goes back, last first. (Dropped midway, the guards
/// left release in the background.)
async fn give_back(mut guards: Vec<LockGuard>) {
    while let Some(guard) = guards.pop() {
        let _ = guard.release().await;
    }
}
