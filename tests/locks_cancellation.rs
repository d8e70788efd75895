//! Every lock-touching operation, cancelled at each of its await points, leaves nothing behind:
//! no advisory lock on the server, no pooled connection holding a lock or running a statement,
//! no registry entry, and the key free for the next holder.
//!
//! Await points inside the crate are reached with stage hooks (`pglock_testing::pause_at`),
//! which park an operation exactly there so the test can drop it. Await points inside the
//! driver (a statement in flight, a pool checkout) are reached for real: the server is made to
//! keep the statement waiting, or the pool is exhausted, and the operation is dropped while it
//! waits.

mod common;

use common::hooked::BuildHooked;

use std::future::Future;
use std::time::Duration;

use common::{app_name, assert_pool_clean, eventually, key, lock_rows, observer, pool_named};
use pglock::{InMemoryLockManager, InMemoryLockServer, PostgresLockManager, lock_id};
use pglock_testing::{Stage, pause_at};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::Instant;

const EVENTUALLY: Duration = Duration::from_secs(10);
/// How often a waiting backend checks that its client is still there (the manager sets
/// `client_connection_check_interval` for each wait).
const CLIENT_CHECK: Duration = Duration::from_millis(200);
/// Room on top of the check interval for an abandoned wait to be seen gone: closing the
/// connection, the backend's exit, the observer's polling (every 10 ms, a query each time),
/// and the scheduling of a machine whose two cores are busy with other work. A server that
/// checked every second instead (the manager's setting lost) would be seen after about
/// 1,000 ms: the room keeps the bound, 400 ms, well below that.
const SLACK: Duration = Duration::from_millis(200);

/// Drives `operation` until the hook parks it, then drops it there.
async fn cancel_when_parked<F: Future>(operation: F, pause: &pglock_testing::Pause, stage: Stage)
where
    F::Output: std::fmt::Debug,
{
    let parked = async {
        tokio::select! {
            biased;
            () = pause.reached() => {}
            output = operation => panic!("finished ({output:?}) without reaching {stage:?}"),
        }
    };
    tokio::time::timeout(EVENTUALLY, parked)
        .await
        .unwrap_or_else(|_| panic!("never reached {stage:?}"));
}

struct Pg {
    app: String,
    pool: PgPool,
    observer: PgPool,
}

impl Pg {
    async fn new(label: &str, max: u32) -> Pg {
        let app = app_name(label);
        let pool = pool_named(max, &app).await;
        Pg {
            app,
            pool,
            observer: observer().await,
        }
    }

    fn manager_parking_at(&self, stage: Stage) -> (PostgresLockManager, pglock_testing::Pause) {
        let (hook, pause) = pause_at(stage);
        let manager = common::manager_for(self.pool.clone(), &self.app).build_with_stage_hook(hook);
        (manager, pause)
    }

    /// Nothing of `manager` is left: no registry entry, no lock or statement on any of its
    /// pool's sessions, and the keys free for a new holder.
    async fn assert_nothing_left(&self, manager: &PostgresLockManager, keys: &[&str]) {
        assert_eq!(manager.held_lock_count(), 0);
        for &key in keys {
            assert!(!manager.is_held(key).await);
        }
        assert_pool_clean(&self.observer, &self.app).await;
        let next = PostgresLockManager::new(pool_named(2, &app_name("next")).await);
        for &key in keys {
            let guard = next
                .acquire(key, Some(EVENTUALLY))
                .await
                .expect("the key is free for the next holder");
            guard.release().await.expect("release");
            assert!(lock_rows(&self.observer, lock_id(key)).await.is_empty());
        }
        // The manager itself is still fully usable.
        let guard = manager
            .acquire(keys[0], Some(EVENTUALLY))
            .await
            .expect("the manager works after the cancellation");
        guard.release().await.expect("release");
        assert_pool_clean(&self.observer, &self.app).await;
    }
}

#[tokio::test]
async fn postgres_acquire_cancelled_at_each_stage() {
    for stage in [Stage::Turn, Stage::Server, Stage::Register] {
        for timeout in [None, Some(EVENTUALLY)] {
            let pg = Pg::new("cancel-acquire", 4).await;
            let (locks, pause) = pg.manager_parking_at(stage);
            let key = key("cancel-acquire");
            cancel_when_parked(locks.acquire(&key, timeout), &pause, stage).await;
            pg.assert_nothing_left(&locks, &[&key]).await;
        }
    }
}

#[tokio::test]
async fn postgres_try_acquire_cancelled_at_each_stage() {
    for stage in [Stage::Turn, Stage::Server, Stage::Register] {
        let pg = Pg::new("cancel-try", 4).await;
        let (locks, pause) = pg.manager_parking_at(stage);
        let key = key("cancel-try");
        cancel_when_parked(locks.try_acquire(&key), &pause, stage).await;
        pg.assert_nothing_left(&locks, &[&key]).await;
    }
}

#[tokio::test]
async fn postgres_releases_cancelled_before_the_unlock_still_release() {
    // release(key)
    let pg = Pg::new("cancel-release", 4).await;
    let (locks, pause) = pg.manager_parking_at(Stage::Unlock);
    let released = key("cancel-release");
    common::hold(&locks, &released).await;
    cancel_when_parked(locks.release(&released), &pause, Stage::Unlock).await;
    pg.assert_nothing_left(&locks, &[&released]).await;

    // LockGuard::release
    let pg = Pg::new("cancel-guard-release", 4).await;
    let (locks, pause) = pg.manager_parking_at(Stage::Unlock);
    let guarded = key("cancel-guard-release");
    let guard = locks.acquire(&guarded, None).await.expect("acquire");
    cancel_when_parked(guard.release(), &pause, Stage::Unlock).await;
    pg.assert_nothing_left(&locks, &[&guarded]).await;

    // release_all, parked at its first unlock with two more to go.
    let pg = Pg::new("cancel-release-all", 6).await;
    let (locks, pause) = pg.manager_parking_at(Stage::Unlock);
    let keys = [key("all-1"), key("all-2"), key("all-3")];
    for key in &keys {
        common::hold(&locks, key).await;
    }
    cancel_when_parked(locks.release_all(), &pause, Stage::Unlock).await;
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    pg.assert_nothing_left(&locks, &keys).await;
}

/// A release that hands its lock to a task of the same manager first asks the session to
/// answer: dropped while that statement is in flight, the lock still reaches the waiting task
/// (through the server), and nothing is left.
// On one thread, so that waiting for the task to reach the turn queue is exact.
#[tokio::test(flavor = "current_thread")]
async fn postgres_release_cancelled_while_its_handoff_is_confirmed() {
    let pg = Pg::new("cancel-handoff", 4).await;
    let stages = common::stages::StageCounts::default();
    let locks = common::manager_for(pg.pool.clone(), &pg.app).build_with_stage_hook(stages.hook());
    let key = key("cancel-handoff");
    let first = locks.acquire(&key, None).await.expect("acquire");
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { locks.acquire(&key, Some(EVENTUALLY)).await }
    });
    stages.wait_for(Stage::Turn, &key, 2).await;
    // Boxed, so that dropping it drops the release itself.
    let mut release = Box::pin(first.release());
    assert!(
        futures::poll!(release.as_mut()).is_pending(),
        "the handoff's statement was answered within one poll"
    );
    assert_eq!(stages.count(Stage::Unlock, &key), 1, "not at the handoff");
    drop(release);
    let guard = tokio::time::timeout(EVENTUALLY, waiter)
        .await
        .expect("the waiting task gets the lock")
        .expect("join")
        .expect("acquire");
    guard.release().await.expect("release");
    pg.assert_nothing_left(&locks, &[&key]).await;
}

#[tokio::test]
async fn postgres_acquire_cancelled_while_waiting_on_the_server() {
    for timeout in [None, Some(EVENTUALLY)] {
        let pg = Pg::new("cancel-server-wait", 4).await;
        let locks = common::manager_for(pg.pool.clone(), &pg.app).build();
        let holder = PostgresLockManager::new(pool_named(2, &app_name("holder")).await);
        let key = key("cancel-server-wait");
        let guard = holder.acquire(&key, None).await.expect("acquire");
        {
            let waiting = locks.acquire(&key, timeout);
            tokio::pin!(waiting);
            let queued = eventually("the acquisition waits on the server", || async {
                lock_rows(&pg.observer, lock_id(&key))
                    .await
                    .iter()
                    .any(|row| !row.granted)
            });
            tokio::select! {
                biased;
                output = &mut waiting => panic!("the key is held, yet: {output:?}"),
                () = queued => {}
            }
        } // The waiting acquisition is dropped with its statement in flight.
        let dropped_at = Instant::now();
        if !common::pg14_or_later(&pg.observer).await {
            // PostgreSQL 13 and older have no `client_connection_check_interval`: the server
            // does not look at a waiting session's client, so the abandoned wait stays queued
            // until the lock is granted to it; its backend then finds the client gone and
            // exits, which frees the key.
            tokio::time::sleep(CLIENT_CHECK + SLACK).await;
            let rows = lock_rows(&pg.observer, lock_id(&key)).await;
            assert!(
                rows.iter().any(|row| !row.granted),
                "the abandoned wait left the queue of a server without \
                 client_connection_check_interval: {rows:?}"
            );
            guard.release().await.expect("release");
            eventually(
                "the abandoned wait, granted, ends and frees the key",
                || async { lock_rows(&pg.observer, lock_id(&key)).await.is_empty() },
            )
            .await;
            pg.assert_nothing_left(&locks, &[&key]).await;
            continue;
        }
        // The abandoned server-side wait goes away on its own, well before the holder lets go:
        // the server checks every 200 ms (`client_connection_check_interval`) whether the
        // waiting session's client is still there.
        eventually("the abandoned wait leaves the server's queue", || async {
            lock_rows(&pg.observer, lock_id(&key))
                .await
                .iter()
                .all(|row| row.granted)
        })
        .await;
        let gone = dropped_at.elapsed();
        println!("the abandoned wait left the server's queue {gone:?} after the drop");
        assert!(
            gone <= CLIENT_CHECK + SLACK,
            "the abandoned wait lingered {gone:?}, more than the server's check interval \
             ({CLIENT_CHECK:?}) + {SLACK:?}"
        );
        guard.release().await.expect("release");
        pg.assert_nothing_left(&locks, &[&key]).await;
    }
}

/// A key held by another manager, so that acquiring it means waiting on a session of its own.
async fn held_elsewhere(label: &str) -> (String, pglock::LockGuard) {
    let other = PostgresLockManager::new(pool_named(2, &app_name("elsewhere")).await);
    let key = key(label);
    let guard = other.acquire(&key, None).await.expect("acquire elsewhere");
    (key, guard)
}

#[tokio::test]
async fn postgres_acquire_cancelled_while_waiting_for_a_pooled_connection() {
    // One connection: the lock session takes it, so a contended acquisition (which waits on a
    // session of its own) finds the pool empty.
    let pg = Pg::new("cancel-checkout", 1).await;
    let locks = common::manager_for(pg.pool.clone(), &pg.app).build();
    let pinning = key("pins-the-pool");
    let (starved, elsewhere) = held_elsewhere("starved").await;
    let guard = locks.acquire(&pinning, None).await.expect("acquire");
    for timeout in [None, Some(EVENTUALLY)] {
        let waiting = locks.acquire(&starved, timeout);
        let outcome = tokio::time::timeout(Duration::from_millis(100), waiting).await;
        assert!(
            outcome.is_err(),
            "the only connection is the lock session, so the wait waits for the pool"
        );
    }
    assert_eq!(locks.held_lock_count(), 1);
    guard.release().await.expect("release");
    elsewhere.release().await.expect("release");
    pg.assert_nothing_left(&locks, &[&pinning, &starved]).await;
}

#[tokio::test]
async fn postgres_acquire_cancelled_while_queued_behind_its_own_manager() {
    let pg = Pg::new("cancel-turn-wait", 4).await;
    let locks = common::manager_for(pg.pool.clone(), &pg.app).build();
    let key = key("cancel-turn-wait");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    for timeout in [None, Some(EVENTUALLY)] {
        // Another task of the manager queues behind the local holder, and is cancelled there.
        let mut waiting = tokio::spawn({
            let (locks, key) = (locks.clone(), key.clone());
            async move { locks.acquire(&key, timeout).await }
        });
        let outcome = tokio::time::timeout(Duration::from_millis(50), &mut waiting).await;
        assert!(outcome.is_err(), "queued behind the local holder");
        waiting.abort();
        assert!(waiting.await.expect_err("aborted").is_cancelled());
    }
    guard.release().await.expect("release");
    pg.assert_nothing_left(&locks, &[&key]).await;
}

/// Cancels acquisitions and releases at arbitrary moments, under contention from another
/// holder, and checks that nothing is left once the dust settles.
#[tokio::test]
async fn postgres_cancellation_sweep() {
    let pg = Pg::new("cancel-sweep", 4).await;
    let locks = common::manager_for(pg.pool.clone(), &pg.app).build();
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let keys: Vec<String> = (0..3).map(|n| key(&format!("sweep-{n}"))).collect();
    for round in 0u64..300 {
        let key = &keys[(round % 3) as usize];
        // Let the rival hold the key in some rounds, so some acquisitions wait on the server.
        let rival_guard = if round % 4 == 0 {
            Some(
                rival
                    .acquire(key, Some(EVENTUALLY))
                    .await
                    .expect("the key is free for the rival"),
            )
        } else {
            None
        };
        let budget = Duration::from_micros(round * 37 % 3000);
        let timeout = if round % 2 == 0 {
            None
        } else {
            Some(EVENTUALLY)
        };
        if let Ok(Ok(guard)) = tokio::time::timeout(budget, locks.acquire(key, timeout)).await {
            // Cancel the release as well, at an arbitrary point.
            let _ = tokio::time::timeout(budget / 2, guard.release()).await;
        }
        if let Some(guard) = rival_guard {
            guard.release().await.expect("rival release");
        }
    }
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    // Dropped guards release in the background; wait for the registry to empty.
    eventually("dropped guards released", || async {
        locks.held_lock_count() == 0
    })
    .await;
    pg.assert_nothing_left(&locks, &keys).await;
}

#[tokio::test]
async fn in_memory_operations_cancelled_at_each_stage() {
    let server = InMemoryLockServer::new();
    let next = InMemoryLockManager::builder().server(&server).build();
    let build = |stage| {
        let (hook, pause) = pause_at(stage);
        let manager = InMemoryLockManager::builder()
            .server(&server)
            .build_with_stage_hook(hook);
        (manager, pause)
    };
    let assert_free = |manager: InMemoryLockManager, key: String| {
        let next = next.clone();
        async move {
            assert_eq!(manager.held_lock_count(), 0);
            assert!(
                next.try_acquire(&key).await.expect("try").leak().is_some(),
                "key left held"
            );
            next.release(&key).await.expect("release");
            assert!(
                manager
                    .try_acquire(&key)
                    .await
                    .expect("try")
                    .into_handle()
                    .is_some()
            );
        }
    };
    for stage in [Stage::Turn, Stage::Server, Stage::Register] {
        let (manager, pause) = build(stage);
        let acquired = key("memory-acquire");
        cancel_when_parked(manager.acquire(&acquired, None), &pause, stage).await;
        assert_free(manager, acquired).await;

        let (manager, pause) = build(stage);
        let tried = key("memory-try");
        cancel_when_parked(manager.try_acquire(&tried), &pause, stage).await;
        assert_free(manager, tried).await;
    }
    let (manager, pause) = build(Stage::Unlock);
    let released = key("memory-release");
    common::hold(&manager, &released).await;
    cancel_when_parked(manager.release(&released), &pause, Stage::Unlock).await;
    assert_free(manager, released).await;

    let (manager, pause) = build(Stage::Unlock);
    let guarded = key("memory-guard-release");
    let guard = manager.acquire(&guarded, None).await.expect("acquire");
    cancel_when_parked(guard.release(), &pause, Stage::Unlock).await;
    assert_free(manager, guarded).await;
}

#[tokio::test]
async fn a_pool_checkout_that_never_comes_is_bounded_by_the_deadline_and_leaves_nothing() {
    let app = app_name("bounded-checkout");
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(60))
        .connect_with(common::options(&app))
        .await
        .expect("connect");
    let locks = common::manager_for(pool, &app).build();
    let pinning = key("pinning");
    let (starved, elsewhere) = held_elsewhere("starved").await;
    let guard = locks.acquire(&pinning, None).await.expect("acquire");
    let err = locks
        .acquire(&starved, Some(Duration::from_millis(100)))
        .await
        .expect_err("no connection within the deadline");
    // The deadline is the only bound on the checkout: its passing is a timeout.
    assert!(
        matches!(&err, pglock::Error::Timeout { key, timeout }
            if key == &starved && *timeout == Duration::from_millis(100)),
        "{err:?}"
    );
    guard.release().await.expect("release");
    elsewhere.release().await.expect("release");
    assert_pool_clean(&observer().await, &app).await;
}
