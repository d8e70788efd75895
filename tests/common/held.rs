//! Locks held the Python original's way: taken with `try_acquire` and left in the manager's
//! registry until released by key.

use pglock::{LockGuard, LockInfo, LockKey, LockManager, LockManagerExt};

/// Takes `key` exclusively and leaves it in `locks`' registry; panics unless it was free.
pub async fn hold<M: LockManager + ?Sized>(locks: &M, key: impl Into<LockKey>) -> LockInfo {
    locks
        .try_acquire(key)
        .await
        .expect("try_acquire")
        .leak()
        .expect("the key is free")
}

/// Takes `key` in shared mode and leaves it in `locks`' registry; panics unless it was free
/// of exclusive holders.
pub async fn hold_shared<M: LockManager + ?Sized>(locks: &M, key: impl Into<LockKey>) -> LockInfo {
    locks
        .try_acquire_shared(key)
        .await
        .expect("try_acquire_shared")
        .leak()
        .expect("the key is free of exclusive holders")
}
