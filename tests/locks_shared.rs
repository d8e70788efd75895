//! Shared-mode locks across holders: sharers coexist, an exclusive holder excludes them, and the
//! queue is FIFO across modes, on PostgreSQL and in memory alike.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{app_name, key, lock_rows, observer, pool_named};
use pglock::{
    InMemoryLockManager, InMemoryLockServer, LockManager, LockManagerExt, PostgresLockManager,
    lock_id,
};

const SHORT: Option<Duration> = Some(Duration::from_millis(50));
const EVENTUALLY: Option<Duration> = Some(Duration::from_secs(10));

async fn postgres_holders(n: usize) -> Vec<Arc<dyn LockManager>> {
    let mut holders: Vec<Arc<dyn LockManager>> = Vec::new();
    for i in 0..n {
        let pool = pool_named(3, &app_name(&format!("shared-{i}"))).await;
        holders.push(Arc::new(PostgresLockManager::new(pool)));
    }
    holders
}

fn memory_holders(n: usize) -> Vec<Arc<dyn LockManager>> {
    let server = InMemoryLockServer::new();
    (0..n)
        .map(|_| {
            Arc::new(InMemoryLockManager::builder().server(&server).build()) as Arc<dyn LockManager>
        })
        .collect()
}

async fn sharers_coexist_and_exclude_an_exclusive_holder(holders: &[Arc<dyn LockManager>]) {
    let [a, b, c] = holders else {
        panic!("three holders")
    };
    let key = key("sharers");
    let first = a.acquire_shared(&key, None).await.expect("a shares");
    // b's first acquisition opens its lock session: given time for that on a busy machine.
    let second = b
        .acquire_shared(&key, EVENTUALLY)
        .await
        .expect("b shares alongside a");
    assert!(
        c.try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    let err = c.acquire(&key, SHORT).await.expect_err("sharers exclude c");
    assert!(err.is_timeout(), "{err:?}");
    first.release().await.expect("release");
    assert!(
        c.acquire(&key, SHORT)
            .await
            .expect_err("b still shares")
            .is_timeout()
    );
    second.release().await.expect("release");

    let exclusive = c.acquire(&key, EVENTUALLY).await.expect("c alone");
    assert!(
        a.try_acquire_shared(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    assert!(
        a.acquire_shared(&key, SHORT)
            .await
            .expect_err("c excludes")
            .is_timeout()
    );
    exclusive.release().await.expect("release");
    assert!(
        a.try_acquire_shared(&key)
            .await
            .expect("try")
            .leak()
            .is_some()
    );
    a.release(&key).await.expect("release");
}

/// A sharer arriving after a queued exclusive request waits behind it, so a stream of sharers
/// cannot starve an exclusive waiter (the cutover's write gate relies on this).
async fn a_queued_exclusive_request_holds_back_later_sharers(holders: &[Arc<dyn LockManager>]) {
    let [a, b, c] = holders else {
        panic!("three holders")
    };
    let key = key("fifo-modes");
    let reader = a.acquire_shared(&key, None).await.expect("a shares");
    let writer = tokio::spawn({
        let (b, key) = (b.clone(), key.clone());
        async move { b.acquire(&key, EVENTUALLY).await }
    });
    // Wait until b's exclusive request is queued: a later sharer is then refused.
    let mut refused = false;
    for _ in 0..500 {
        let pglock::Attempt::Acquired(probe) = c.try_acquire_shared(&key).await.expect("try")
        else {
            refused = true;
            break;
        };
        probe.release().await.expect("release the probe");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(
        refused,
        "a sharer was admitted past a queued exclusive request"
    );
    reader.release().await.expect("release");
    let writer = writer
        .await
        .expect("join")
        .expect("b gets it once a is gone");
    writer.release().await.expect("release");
}

#[tokio::test]
async fn postgres_sharers_coexist_and_exclude_an_exclusive_holder() {
    sharers_coexist_and_exclude_an_exclusive_holder(&postgres_holders(3).await).await;
}

#[tokio::test]
async fn memory_sharers_coexist_and_exclude_an_exclusive_holder() {
    sharers_coexist_and_exclude_an_exclusive_holder(&memory_holders(3)).await;
}

#[tokio::test]
async fn postgres_queued_exclusive_request_holds_back_later_sharers() {
    a_queued_exclusive_request_holds_back_later_sharers(&postgres_holders(3).await).await;
}

#[tokio::test]
async fn memory_queued_exclusive_request_holds_back_later_sharers() {
    a_queued_exclusive_request_holds_back_later_sharers(&memory_holders(3)).await;
}

#[tokio::test]
async fn pg_locks_shows_shared_locks_as_share_locks() {
    let observer = observer().await;
    let holders = postgres_holders(2).await;
    let key = key("share-rows");
    let first = holders[0].acquire_shared(&key, None).await.expect("shared");
    let second = holders[1]
        .acquire_shared(&key, EVENTUALLY)
        .await
        .expect("a second sharer is let in");
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows.iter()
            .all(|row| row.mode == "ShareLock" && row.granted)
    );
    first.release().await.expect("release");
    second.release().await.expect("release");
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}
