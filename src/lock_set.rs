//! Several keys at once: [`LockManagerExt::acquire_all`](crate::LockManagerExt::acquire_all),
//! [`with_locks`](crate::LockManagerExt::with_locks) and the [`LockSet`] they hand back.
//!
//! The keys are taken one by one in one order that every caller of this API uses, whatever
//! order it named them in: by lock id (`LockTarget::packed`), then by kind. Two callers of
//! these methods can therefore never wait for each other in a cycle, however their sets
//! overlap, in one process or many (the order is the same in every process, and in the Python
//! original's key derivation).

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::{Error, LockGuard, LockInfo, LockKey, LockManager, LockMode, LossSignal, Result};

/// The locks of several keys, taken together; released together by
/// [`release`](Self::release) or, in the background, when dropped.
///
/// Its [`loss_signal`](Self::loss_signal) fires when any of its locks goes.
#[must_use = "the locks are released as soon as the set is dropped; bind it to a variable that lives as long as the critical section"]
pub struct LockSet {
    guards: Vec<LockGuard>,
    loss: LossSignal,
}

impl LockSet {
    fn new(guards: Vec<LockGuard>) -> LockSet {
        // A declared loss of any lock is the set's at that very moment (a lock that went
        // while the others were being taken, at once), and a silence past any lock's expiry
        // is the set's as soon as anyone looks: before every poll of the set's body.
        let loss = LossSignal::any_of(guards.iter().map(|g| g.loss_signal().clone()).collect());
        LockSet { guards, loss }
    }

    /// What each lock of the set was granted as, in the order they were taken.
    pub fn infos(&self) -> impl Iterator<Item = &LockInfo> {
        self.guards.iter().map(LockGuard::info)
    }

    /// How many locks the set holds.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// True for the set of no keys.
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// Fires, with the cause, when any lock of the set goes.
    pub fn loss_signal(&self) -> &LossSignal {
        &self.loss
    }

    /// Runs `body` as the critical section of every key of the set: an acquisition of any of
    /// them inside it fails at once with [`Error::Reentrant`], and `body` is dropped as soon
    /// as any lock of the set goes.
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`], naming the first key of the set, when a lock went before `body`
    /// finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body`; the locks stay held.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output> {
        let holder = self.guards.first().map(|g| g.info().holder_id.clone());
        let keys = self.infos().map(|info| (info.key.clone(), info.mode));
        let body = crate::scope::inside_all(holder.unwrap_or_default(), keys, body);
        self.loss.run_until_lost(body).await.map_err(|cause| {
            let key = self.guards.first().map(|g| g.info().key.clone());
            Error::LockLost {
                key: key.unwrap_or_else(|| LockKey::id(0)),
                cause,
            }
        })
    }

    /// Releases every lock of the set, last taken first.
    ///
    /// # Errors
    ///
    /// The first failure among the releases (every lock is released regardless, as
    /// [`LockGuard::release`] does).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the locks not yet released are released in the background, as on drop.
    pub async fn release(mut self) -> Result<()> {
        let mut first = Ok(());
        while let Some(guard) = self.guards.pop() {
            let released = guard.release().await;
            if first.is_ok() {
                first = released;
            }
        }
        first
    }
}

impl std::fmt::Debug for LockSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSet")
            .field("keys", &self.infos().map(|i| &i.key).collect::<Vec<_>>())
            .field("lost", &self.loss.is_lost())
            .finish()
    }
}

/// `keys` in the order every caller takes them: by lock id, then kind; each key once.
pub(crate) fn in_lock_order(keys: impl IntoIterator<Item = LockKey>) -> Vec<LockKey> {
    let mut keys: Vec<LockKey> = keys.into_iter().collect();
    keys.sort_by_key(|k| {
        let target = k.target();
        (target.packed(), target.objsubid())
    });
    keys.dedup_by_key(|k| {
        let target = k.target();
        (target.packed(), target.objsubid())
    });
    keys
}

/// Takes every one of `keys` (in lock order) in `mode` within one `timeout`, or none.
pub(crate) async fn acquire_all<M: LockManager + ?Sized>(
    manager: &M,
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
        let acquired = crate::manager::acquire(manager, key, mode, left).await;
        match acquired {
            Ok(guard) => guards.push(guard),
            Err(err) => {
                // All or nothing: what was taken goes back, last first.
                while let Some(guard) = guards.pop() {
                    let _ = guard.release().await;
                }
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

#[cfg(test)]
mod tests {
    use crate::{InMemoryLockManager, LockManager, LockManagerExt, LossCause};

    /// The set hears of a lock that goes at the moment its guard does, with no task switch in
    /// between (the simulation's seeds 30 and 581).
    #[tokio::test(flavor = "current_thread")]
    async fn a_set_is_told_at_the_moment_one_of_its_locks_goes() {
        let locks = InMemoryLockManager::new();
        let set = locks
            .acquire_all(["a", "b"], None)
            .await
            .expect("free keys");
        assert_eq!(set.loss_signal().cause(), None);
        locks.release_all().await.expect("release_all");
        assert_eq!(set.loss_signal().cause(), Some(LossCause::ReleasedAll));
    }
}
