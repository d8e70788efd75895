//! What a successful acquisition hands back, and what a manager says it holds.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::LockKey;
#[cfg(doc)]
use crate::lock_id;

/// A description of one held lock: every guard carries one ([`LockGuard::info`](crate::LockGuard::info)).
///
/// The struct is `#[non_exhaustive]` so fields can be added without a breaking change;
/// implementors of [`LockManager`](crate::LockManager) build one with [`LockInfo::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The key that was acquired. It prints as the name for a name key (so messages match the
    /// Python original's) and compares equal to that name: `info.key == "rebuild:orders"`.
    pub key: LockKey,
    /// The PostgreSQL advisory lock id: for a name, the id derived with [`lock_id`]; for a pair
    /// key, the pair packed into one number (see [`LockTarget::packed`](crate::LockTarget::packed)).
    pub lock_id: i64,
    /// When the lock was granted, by the client's clock, in UTC.
    pub acquired_at: DateTime<Utc>,
    /// The holder id of the manager that acquired it.
    pub holder_id: Arc<str>,
    /// A strictly increasing token for this acquisition, when the manager mints them.
    pub fencing_token: Option<i64>,
    /// Whether the lock is held exclusively or shared.
    pub mode: LockMode,
}

/// How a lock is held.
///
/// An exclusive lock excludes every other holder; a shared lock excludes only exclusive
/// holders, so any number of holders may share a key at once. On PostgreSQL these are
/// `pg_advisory_lock` and `pg_advisory_lock_shared` on the same lock id. Waiters are queued in
/// arrival order whatever their mode: a shared request that arrives after a waiting exclusive
/// one waits behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum LockMode {
    /// One holder at a time.
    #[default]
    Exclusive,
    /// Any number of shared holders, while no one holds the key exclusively.
    Shared,
}

impl LockMode {
    /// `"exclusive"` or `"shared"`.
    pub fn as_str(self) -> &'static str {
        match self {
            LockMode::Exclusive => "exclusive",
            LockMode::Shared => "shared",
        }
    }
}

impl std::fmt::Display for LockMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl LockInfo {
    /// Describes `key`, acquired now in `mode` by `holder_id`, with its lock id derived from
    /// the key and no fencing token.
    pub fn new(key: LockKey, mode: LockMode, holder_id: Arc<str>) -> Self {
        LockInfo {
            lock_id: key.target().packed(),
            key,
            acquired_at: Utc::now(),
            holder_id,
            fencing_token: None,
            mode,
        }
    }

    /// Sets the fencing token.
    pub fn with_fencing_token(mut self, token: Option<i64>) -> Self {
        self.fencing_token = token;
        self
    }

    /// As [`new`](Self::new), with a lock id the caller derived already.
    pub(crate) fn with_id(key: LockKey, lock_id: i64, mode: LockMode, holder_id: Arc<str>) -> Self {
        LockInfo {
            key,
            lock_id,
            acquired_at: Utc::now(),
            holder_id,
            fencing_token: None,
            mode,
        }
    }
}

/// One lock a manager holds right now, as [`LockManager::held_locks`](crate::LockManager::held_locks)
/// lists it: the acquisition and how long it has been held.
///
/// `#[non_exhaustive]`: implementors of [`LockManager`](crate::LockManager) build one with
/// [`HeldLock::new`].
///
/// ```
/// use pglock::InMemoryLockManager;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
/// let locks = InMemoryLockManager::new();
/// let guard = locks.acquire("rebuild:orders", None).await?;
/// let held = locks.held_locks().await;
/// assert_eq!(held.len(), 1);
/// assert_eq!(&held[0].info, guard.info());
/// println!("{} held for {:?}", held[0].info.key, held[0].held_for);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldLock {
    /// The acquisition, exactly as its guard describes it ([`LockGuard::info`](crate::LockGuard::info)):
    /// key, lock id, mode, `acquired_at`, holder id, fencing token.
    pub info: LockInfo,
    /// How long this acquisition has held the lock, up to the listing, measured on a monotonic
    /// clock (so a change of the wall clock does not skew it, and tokio's paused test clock
    /// drives it). A key handed from one caller of the manager to the next counts from the
    /// handover: that is a new acquisition.
    pub held_for: Duration,
}

impl HeldLock {
    /// The acquisition `info`, held for `held_for` so far.
    pub fn new(info: LockInfo, held_for: Duration) -> Self {
        HeldLock { info, held_for }
    }
}
