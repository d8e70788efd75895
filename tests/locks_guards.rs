//! A guard releases only its own acquisition, whichever way its release goes: through
//! `release`, through a drop while the registry is free, or through a drop while the registry
//! is busy (which defers the release to a task). And a task that dropped its guard holds the
//! key no more: asking for it again waits for the deferred release, it is not re-entry.

mod common;

use common::hooked::BuildHooked;

use std::time::Duration;

use common::{app_name, eventually, key, lock_rows, observer, pool_named};
use pglock::{
    InMemoryLockManager, LockGuard, LockManager, LockManagerExt, PostgresLockManager, lock_id,
};

/// Drops a stale guard on the deferred path while a newer acquisition of its key is
/// registered, then drops a current guard of another key on the same path as a sentinel: the
/// deferred releases queue on the registry in order, so once the sentinel's key is free the
/// stale guard's release has run too.
async fn stale_deferred_drop_spares_the_newer_acquisition(
    locks: &dyn LockManager,
    server: Option<&sqlx::PgPool>,
) {
    let (key, sentinel) = (key("deferred"), key("sentinel"));
    let stale: LockGuard = locks.acquire(&key, None).await.expect("acquire");
    locks.release(&key).await.expect("release by key");
    // A newer acquisition of the key, held by key.
    common::hold(locks, &key).await;
    let current = locks.acquire(&sentinel, None).await.expect("acquire");
    drop(stale);
    drop(current);
    tokio::time::timeout(Duration::from_secs(10), async {
        while locks.is_held(&sentinel).await {
            tokio::task::yield_now().await;
        }
    })
    .await
    .expect("the sentinel's deferred release ran");
    assert!(
        locks.is_held(&key).await,
        "the stale guard released the newer acquisition"
    );
    assert_eq!(locks.held_lock_count(), 1);
    if let Some(server) = server {
        assert_eq!(
            lock_rows(server, lock_id(&key)).await.len(),
            1,
            "still held on the server"
        );
    }
    locks
        .release(&key)
        .await
        .expect("the newer acquisition is still there");
}

#[tokio::test]
async fn in_memory_stale_guards_dropped_while_the_registry_is_busy_release_nothing() {
    let locks = InMemoryLockManager::builder().build_deferring_drops();
    stale_deferred_drop_spares_the_newer_acquisition(&locks, None).await;
}

#[tokio::test]
async fn postgres_stale_guards_dropped_while_the_registry_is_busy_release_nothing() {
    let observer = observer().await;
    let locks = PostgresLockManager::builder(pool_named(3, &app_name("deferred")).await)
        .build_deferring_drops();
    stale_deferred_drop_spares_the_newer_acquisition(&locks, Some(&observer)).await;
    eventually("no lock of the manager is left", || async {
        locks.held_lock_count() == 0
    })
    .await;
}

/// The task drops its guard on the deferred path (the registry entry stays until the release
/// task runs) and asks for the key again at once: it waits for the release and is served.
async fn a_dropped_guard_is_not_held_by_its_task(locks: &dyn LockManager) {
    let key = key("dropped-again");
    for _ in 0..3 {
        let guard = locks.acquire(&key, None).await.expect("acquire");
        drop(guard);
        let again = tokio::time::timeout(
            Duration::from_secs(10),
            locks.acquire(&key, Some(Duration::from_secs(5))),
        )
        .await
        .expect("bounded")
        .expect("the task let the key go: it waits for the release, it is not re-entry");
        again.release().await.expect("release");
    }
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn in_memory_a_task_that_dropped_its_guard_may_ask_again() {
    let locks = InMemoryLockManager::builder().build_deferring_drops();
    a_dropped_guard_is_not_held_by_its_task(&locks).await;
}

#[tokio::test]
async fn postgres_a_task_that_dropped_its_guard_may_ask_again() {
    let locks = PostgresLockManager::builder(pool_named(3, &app_name("dropped-again")).await)
        .build_deferring_drops();
    a_dropped_guard_is_not_held_by_its_task(&locks).await;
}
