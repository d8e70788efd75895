//! In-process handoff: a lock released while another task of the same manager waits goes
//! straight to that task without an unlock and a new lock on the server, and a bound (count and
//! time) sends it back to the server queue so other processes are not starved.

mod common;

use common::hooked::BuildHooked;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::stages::StageCounts;
use common::{app_name, key, lock_rows, observer, pool_named};
use pglock::{LockManager, PostgresLockManager, lock_id};
use pglock_testing::Stage;
use sqlx::PgPool;
use tokio::time::Instant;

/// How long a test waits for a signal before it fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

/// The backend holding `key`'s lock and when it last started a statement.
async fn holder_statement(observer: &PgPool, key: &str) -> (i32, chrono::DateTime<chrono::Utc>) {
    let rows = lock_rows(observer, lock_id(key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    sqlx::query_as("SELECT pid, query_start FROM pg_stat_activity WHERE pid = $1")
        .bind(rows[0].pid)
        .fetch_one(observer)
        .await
        .expect("pg_stat_activity")
}

/// Three tasks of one manager take the lock in turn, queued behind each other; each records
/// which session held it on the server and when that session last sent a statement. `stages`
/// counts the manager's operations at each await point.
async fn relay(
    locks: &PostgresLockManager,
    stages: &StageCounts,
    observer: &PgPool,
    key: &str,
) -> Vec<(i32, chrono::DateTime<chrono::Utc>)> {
    let first = locks.acquire(key, None).await.expect("acquire");
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (locks, observer, key) = (locks.clone(), observer.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let guard = locks.acquire(&key, Some(BOUND)).await.expect("acquire");
            let seen = holder_statement(&observer, &key).await;
            guard.release().await.expect("release");
            seen
        }));
    }
    // Both tasks are queued behind the first holder before it lets go: on this one thread, a
    // task seen at the turn queue's door has walked in before this test runs again.
    stages.wait_for(Stage::Turn, key, 3).await;
    assert_eq!(
        stages.count(Stage::Server, key),
        1,
        "only the first went to the server"
    );
    let mut seen = vec![holder_statement(observer, key).await];
    first.release().await.expect("release");
    for task in tasks {
        seen.push(
            tokio::time::timeout(BOUND, task)
                .await
                .expect("each task is served within its deadline")
                .expect("join"),
        );
    }
    seen
}

// On one thread, so that waiting for the tasks to reach the turn queue is exact (see `relay`).
#[tokio::test(flavor = "current_thread")]
async fn queued_local_tasks_inherit_the_session_without_a_round_trip() {
    let observer = observer().await;
    let stages = StageCounts::default();
    // A generous time bound: the first holder waits for the others to queue before it lets go.
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("handoff")).await)
        .handoff_limits(16, Duration::from_secs(10))
        .build_with_stage_hook(stages.hook());
    let key = key("handoff");
    let seen = relay(&locks, &stages, &observer, &key).await;
    // The same session held the lock for all three, and sent no statement in between: no
    // unlock, no new lock. The two later holders never went to the server.
    assert!(seen.iter().all(|s| *s == seen[0]), "{seen:?}");
    assert_eq!(stages.count(Stage::Server, &key), 1);
    assert_eq!(stages.count(Stage::Register, &key), 3);
    assert_eq!(locks.held_lock_count(), 0);
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn without_handoff_every_task_goes_to_the_server() {
    let observer = observer().await;
    let stages = StageCounts::default();
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("no-handoff")).await)
        .handoff_limits(0, Duration::ZERO)
        .build_with_stage_hook(stages.hook());
    let key = key("no-handoff");
    let seen = relay(&locks, &stages, &observer, &key).await;
    // Each holder took the lock with a statement of its own.
    assert_ne!(seen[0], seen[1], "{seen:?}");
    assert_ne!(seen[1], seen[2], "{seen:?}");
    assert_eq!(stages.count(Stage::Server, &key), 3);
}

/// Four tasks of manager A hammer one key; process B asks for it once. Returns how long B
/// waited. `limits: None` keeps the builder's defaults.
async fn starvation(limits: Option<(u32, Duration)>) -> Duration {
    let key = key("starvation");
    let builder = PostgresLockManager::builder(pool_named(4, &app_name("hammer")).await);
    let a = match limits {
        Some((max_handoffs, max_hold)) => builder.handoff_limits(max_handoffs, max_hold),
        None => builder,
    }
    .build();
    let b_options = common::options(&app_name("starved"));
    let b = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async move {
                let pool = sqlx::postgres::PgPoolOptions::new()
                    .max_connections(2)
                    .connect_lazy_with(b_options);
                PostgresLockManager::new(pool)
            })
    })
    .join()
    .expect("B's manager");
    let stop = Arc::new(AtomicBool::new(false));
    let mut hammers = Vec::new();
    for _ in 0..4 {
        let (a, key, stop) = (a.clone(), key.clone(), stop.clone());
        hammers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = a.acquire(&key, None).await.expect("acquire");
                // A short critical section, as if it did a little I/O.
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await.expect("release");
            }
        }));
    }
    // Make sure A is running its relay before B arrives.
    let warm = a.acquire(&key, None).await.expect("acquire");
    warm.release().await.expect("release");
    // B is another process: give it a thread and a runtime of its own, so A's busy tasks
    // cannot starve it of CPU, only (if the bound failed) of the lock.
    let waited = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let asked = Instant::now();
            let guard = b
                .acquire(&key, Some(Duration::from_secs(30)))
                .await
                .expect("B is served once A's relay reaches its bound");
            let waited = asked.elapsed();
            guard.release().await.expect("release");
            waited
        })
    });
    let waited = tokio::task::spawn_blocking(move || waited.join().expect("B's thread"))
        .await
        .expect("join");

    stop.store(true, Ordering::Relaxed);
    for hammer in hammers {
        tokio::time::timeout(BOUND, hammer)
            .await
            .expect("a hammering task stops once told to")
            .expect("join");
    }
    waited
}

// One test for both bounds, run one after the other: two hammering managers at once on a
// two-core machine would measure CPU contention, not the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounds_limit_how_long_another_process_waits() {
    let max_hold = Duration::from_millis(50);
    let mut waits = Vec::new();
    for _ in 0..5 {
        waits.push(starvation(Some((u32::MAX, max_hold))).await);
    }
    waits.sort();
    println!("time bound {max_hold:?}: another process waited {waits:?}");
    // The relay in progress ends within max_hold. If B arrives between its first try and its
    // queued wait just as a relay ends, one more relay may start ahead of it: so at most two
    // relays, plus round trips; far below an unbounded relay (the test's 30 s deadline).
    let worst = waits[waits.len() - 1];
    assert!(
        worst < 2 * max_hold + Duration::from_millis(150),
        "waited {waits:?}"
    );

    // Four handoffs of 1 ms critical sections: a relay lasts a few milliseconds.
    let mut waits = Vec::new();
    for _ in 0..5 {
        waits.push(starvation(Some((4, Duration::from_secs(3600)))).await);
    }
    waits.sort();
    println!("count bound 4: another process waited {waits:?}");
    let worst = waits[waits.len() - 1];
    assert!(worst < Duration::from_millis(150), "waited {waits:?}");

    // The defaults the guide documents: 16 handoffs or 10 ms, whichever comes first.
    let mut waits = Vec::new();
    for _ in 0..5 {
        waits.push(starvation(None).await);
    }
    waits.sort();
    println!("default bounds: another process waited {waits:?}");
    let worst = waits[waits.len() - 1];
    assert!(
        worst < 2 * Duration::from_millis(10) + Duration::from_millis(150),
        "waited {waits:?}"
    );
}
