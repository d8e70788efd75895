//! Several keys at once: the [`LockSet`] that
//! [`acquire_all`](crate::LockManagerExt::acquire_all) and its kin hand back.
//!
//! The keys are taken one by one in one order that every caller of this API uses, whatever
//! order it named them in: by lock id (`LockTarget::packed`), then by kind. Two callers of
//! these methods can therefore never wait for each other in a cycle, however their sets
//! overlap, in one process or many (the order is the same in every process, and in the Python
//! original's key derivation).

use std::future::Future;

use crate::{Error, LockGuard, LockHandle, LockInfo, LockKey, LossSignal, Result};

/// The locks of several keys, taken together, all or nothing
/// ([`acquire_all`](crate::LockManagerExt::acquire_all),
/// [`try_acquire_all`](crate::LockManagerExt::try_acquire_all) and their shared twins): a
/// [`LockHandle`] with the exits of a [`LockGuard`], for every lock at once.
///
/// [`release`](Self::release) releases them together (last taken first), dropping the set
/// releases them in the background, and [`leak`](Self::leak) leaves them in the manager's
/// registry. Its [`loss_signal`](Self::loss_signal) fires when any of its locks goes, and
/// [`run`](Self::run) is the critical section of every one of its keys.
#[must_use = "the locks are released as soon as the set is dropped; bind it to a variable that lives as long as the critical section"]
pub struct LockSet {
    guards: Vec<LockGuard>,
    /// What each lock was granted as, in the order taken (the guards' own, gathered).
    infos: Vec<LockInfo>,
    loss: LossSignal,
}

impl LockSet {
    pub(crate) fn new(guards: Vec<LockGuard>) -> LockSet {
        // A declared loss of any lock is the set's at that very moment (a lock that went
        // while the others were being taken, at once), and a silence past any lock's expiry
        // is the set's as soon as anyone looks: before every poll of the set's body.
        let loss = LossSignal::any_of(guards.iter().map(|g| g.loss_signal().clone()).collect());
        let infos = guards.iter().map(|g| g.info().clone()).collect();
        LockSet {
            guards,
            infos,
            loss,
        }
    }

    /// What each lock of the set was granted as (key, lock id, mode, holder id, fencing
    /// token), in the order they were taken: by lock id.
    pub fn info(&self) -> &[LockInfo] {
        &self.infos
    }

    /// The old form of [`info`](Self::info).
    #[deprecated(since = "0.4.0", note = "use `info()`, a slice, as every handle has")]
    pub fn infos(&self) -> impl Iterator<Item = &LockInfo> {
        self.infos.iter()
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
    /// as any lock of the set goes, also when the silence of one of its sessions ran out
    /// while the process was frozen (checked before every poll of `body`).
    ///
    /// # Errors
    ///
    /// [`Error::LockLost`], naming the key whose lock went, when a lock went before `body`
    /// finished.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops `body`; the locks stay held.
    pub async fn run<F: Future>(&self, body: F) -> Result<F::Output> {
        let holder = self.infos.first().map(|info| info.holder_id.clone());
        let keys = self.infos.iter().map(|info| (info.key.clone(), info.mode));
        let body = crate::scope::inside_all(holder.unwrap_or_default(), keys, body);
        self.loss.run_until_lost(body).await.map_err(|cause| {
            let gone = self.guards.iter().find(|g| g.loss_signal().is_lost());
            let key = gone.or(self.guards.first()).map(|g| g.info().key.clone());
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
    /// The first failure among the releases, naming its key (every lock is released
    /// regardless, as [`LockGuard::release`] does).
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

    /// Keeps every lock of the set held without it, in the manager's registry, until
    /// [`release`](crate::LockManagerExt::release) or
    /// [`release_all`](crate::LockManager::release_all) names them, and returns what each was
    /// granted as.
    pub fn leak(self) -> Vec<LockInfo> {
        for guard in self.guards {
            guard.leak();
        }
        self.infos
    }
}

impl crate::handle::sealed::Sealed for LockSet {}

impl LockHandle for LockSet {
    type Info = [LockInfo];

    fn info(&self) -> &[LockInfo] {
        LockSet::info(self)
    }

    fn loss_signal(&self) -> &LossSignal {
        LockSet::loss_signal(self)
    }

    fn run<F>(&self, body: F) -> impl Future<Output = Result<F::Output>> + Send
    where
        F: Future + Send,
    {
        LockSet::run(self, body)
    }

    fn release(self) -> impl Future<Output = Result<()>> + Send {
        LockSet::release(self)
    }

    fn leak(self) -> Vec<LockInfo> {
        LockSet::leak(self)
    }
}

impl std::fmt::Debug for LockSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSet")
            .field(
                "keys",
                &self.infos.iter().map(|i| &i.key).collect::<Vec<_>>(),
            )
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

#[cfg(test)]
mod tests {
    use crate::{InMemoryLockManager, LossCause};

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
