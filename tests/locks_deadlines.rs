//! A timeout is one deadline over the whole acquisition, enforced by the server: never early,
//! late by about a round trip, and the same whichever wait the deadline falls in.
//!
//! These tests print the overshoot they observe (run with `--nocapture` to see it). Their
//! bounds are loose on purpose, because CI machines are noisy: they catch a deadline that is
//! missed by a polling interval, not one that is a millisecond late. Speed itself is measured
//! by the benchmarks.

mod common;

use std::time::Duration;

use common::{app_name, key, pool_named};
use pglock::{Error, PostgresLockManager};
use sqlx::postgres::PgPoolOptions;
use tokio::time::Instant;

async fn manager(label: &str, max: u32) -> PostgresLockManager {
    PostgresLockManager::new(pool_named(max, &app_name(label)).await)
}

/// Overshoots past the deadline of `rounds` timed-out acquisitions, sorted.
async fn overshoots(
    locks: &PostgresLockManager,
    key: &str,
    timeout: Duration,
    rounds: usize,
) -> Vec<Duration> {
    let mut overshoots = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let started = Instant::now();
        let err = locks
            .acquire(key, Some(timeout))
            .await
            .expect_err("the key is held elsewhere");
        let elapsed = started.elapsed();
        assert!(err.is_timeout(), "{err:?}");
        assert!(
            elapsed >= timeout,
            "gave up after {elapsed:?}, before its {timeout:?}"
        );
        overshoots.push(elapsed - timeout);
    }
    overshoots.sort();
    overshoots
}

fn report(what: &str, overshoots: &[Duration]) {
    let at = |q: f64| overshoots[((overshoots.len() - 1) as f64 * q).round() as usize];
    println!(
        "{what}: n={} overshoot min={:?} p50={:?} p90={:?} max={:?}",
        overshoots.len(),
        overshoots[0],
        at(0.5),
        at(0.9),
        overshoots[overshoots.len() - 1]
    );
}

fn assert_close(what: &str, overshoots: &[Duration]) {
    report(what, overshoots);
    let median = overshoots[overshoots.len() / 2];
    assert!(
        median < Duration::from_millis(25),
        "{what}: median overshoot {median:?}; a deadline should end within about a round trip"
    );
    let worst = overshoots[overshoots.len() - 1];
    assert!(
        worst < Duration::from_secs(1),
        "{what}: worst overshoot {worst:?}"
    );
}

#[tokio::test]
async fn a_wait_on_the_server_ends_within_a_round_trip_of_the_deadline() {
    let holder = manager("holder", 2).await;
    let waiter = manager("waiter", 2).await;
    let key = key("server-deadline");
    let guard = holder.acquire(&key, None).await.expect("acquire");
    for timeout in [Duration::from_millis(20), Duration::from_millis(120)] {
        let observed = overshoots(&waiter, &key, timeout, 15).await;
        assert_close(&format!("server wait, timeout {timeout:?}"), &observed);
    }
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_wait_behind_the_managers_own_holder_ends_at_the_deadline() {
    let locks = manager("local", 2).await;
    let key = key("local-deadline");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    // Another task of the same manager waits behind the holder.
    let observed = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { overshoots(&locks, &key, Duration::from_millis(60), 15).await }
    })
    .await
    .expect("join");
    assert_close("local turn wait, timeout 60ms", &observed);
    // So does the holding task itself, while its guard is alive in a plain variable: like a
    // second `lock()` of a `tokio::sync::Mutex`, it waits for the guard until its deadline.
    let observed = overshoots(&locks, &key, Duration::from_millis(60), 5).await;
    assert_close("the holding task's own turn wait, timeout 60ms", &observed);
    guard.release().await.expect("release");
}

#[tokio::test]
async fn one_deadline_covers_the_local_queue_and_the_server_wait() {
    // The key is held by another process; a first task of this manager waits on the server
    // for 300 ms, so a second task must first queue behind it locally, then wait on the
    // server itself for what is left of its 500 ms. Its one deadline covers both.
    let observer = common::observer().await;
    let holder = manager("holder", 2).await;
    let locks = manager("two-stage", 2).await;
    let key = key("two-stage-deadline");
    let held = holder.acquire(&key, None).await.expect("acquire");
    let first = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { locks.acquire(&key, Some(Duration::from_millis(300))).await }
    });
    common::eventually("the first task waits on the server", || async {
        common::lock_rows(&observer, pglock::lock_id(&key))
            .await
            .iter()
            .any(|row| !row.granted)
    })
    .await;
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = locks
        .acquire(&key, Some(timeout))
        .await
        .expect_err("queued behind the first task, then on the server");
    let elapsed = started.elapsed();
    println!("local queue then server wait: {elapsed:?} for a {timeout:?} deadline");
    assert!(err.is_timeout(), "{err:?}");
    assert!(elapsed >= timeout, "{elapsed:?}");
    // Given a fresh 500 ms on the server after its turn came, it would take about 800 ms.
    assert!(
        elapsed < timeout + Duration::from_millis(150),
        "the server wait did not get the remaining time only: {elapsed:?}"
    );
    let first = tokio::time::timeout(Duration::from_secs(10), first)
        .await
        .expect("the first task's deadline passed long ago")
        .expect("join")
        .expect_err("held for its whole deadline");
    assert!(first.is_timeout(), "{first:?}");
    held.release().await.expect("release");
}

#[tokio::test]
async fn a_deadline_spent_waiting_for_the_pool_is_reported_as_a_timeout() {
    // Two connections: the lock session's, and one the application keeps busy. A key held
    // elsewhere needs one more to wait on in the server's queue (the manager's cap of 2 leaves
    // it one wait session), which the pool cannot give. The pool's own acquire timeout
    // (200 ms) bounds a checkout only when the caller has no deadline.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(200))
        .connect_with(common::options(&app_name("exhausted")))
        .await
        .expect("connect");
    let locks = PostgresLockManager::new(pool.clone());
    let holder = manager("holder", 2).await;
    let starved = key("starved");
    let held = holder.acquire(&starved, None).await.expect("acquire");
    let pinning = locks.acquire(&key("pinning"), None).await.expect("acquire");
    let busy = pool.acquire().await.expect("the application's connection");
    // A deadline shorter than the pool's acquire timeout, and one longer: either way the
    // caller's deadline is the only bound, and its passing is a timeout.
    for timeout in [Duration::from_millis(50), Duration::from_millis(450)] {
        let mut observed = Vec::new();
        for _ in 0..5 {
            let started = Instant::now();
            let err = locks
                .acquire(&starved, Some(timeout))
                .await
                .expect_err("no connection to wait on");
            let elapsed = started.elapsed();
            match &err {
                Error::Timeout { key, timeout: t } => {
                    assert_eq!(key, &starved);
                    assert_eq!(*t, timeout);
                }
                other => panic!("expected Timeout, got {other:?}"),
            }
            assert!(elapsed >= timeout, "{elapsed:?}");
            observed.push(elapsed - timeout);
        }
        observed.sort();
        assert_close(&format!("pool checkout, timeout {timeout:?}"), &observed);
    }
    // Without a deadline, the pool's acquire timeout ends the checkout: a typed error.
    let started = Instant::now();
    let err = locks
        .acquire(&starved, None)
        .await
        .expect_err("no connection to wait on");
    let elapsed = started.elapsed();
    println!("pool checkout without a deadline: {err} after {elapsed:?}");
    assert!(
        matches!(&err, Error::PoolExhausted { key, max_connections: 2, .. } if key == &starved),
        "{err:?}"
    );
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(1),
        "bounded by the pool's acquire timeout: {elapsed:?}"
    );
    drop(busy);
    pinning.release().await.expect("release");
    held.release().await.expect("release");
}

#[tokio::test]
async fn a_zero_timeout_is_one_immediate_try() {
    let holder = manager("holder", 2).await;
    let locks = manager("zero", 2).await;
    let key = key("zero");
    let guard = locks
        .acquire(&key, Some(Duration::ZERO))
        .await
        .expect("a free key is granted on the single try");
    guard.release().await.expect("release");
    let held = holder.acquire(&key, None).await.expect("acquire");
    let err = locks
        .acquire(&key, Some(Duration::ZERO))
        .await
        .expect_err("held elsewhere");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(
        err.to_string(),
        format!("Failed to acquire lock '{key}': Timeout after 0.0s")
    );
    held.release().await.expect("release");
}

#[tokio::test]
async fn deadlines_beyond_what_the_server_takes_wait_as_asked() {
    let observer = common::observer().await;
    let holder = manager("holder", 2).await;
    let app = app_name("far-deadline");
    let locks = common::manager_for(pool_named(3, &app).await, &app).build();
    let key = key("far-deadline");
    // `Duration::MAX` does not fit the clock: it waits like no deadline. Forty days is more
    // than PostgreSQL's largest lock_timeout (about 24.8 days): it waits in steps of that.
    let forty_days = Duration::from_secs(40 * 24 * 3600);
    for (timeout, lock_timeout) in [
        (Duration::MAX, None),
        (forty_days, Some("lock_timeout = 2147483647")),
    ] {
        let held = holder.acquire(&key, None).await.expect("acquire");
        let waiter = tokio::spawn({
            let (locks, key) = (locks.clone(), key.clone());
            async move { locks.acquire(&key, Some(timeout)).await }
        });
        common::eventually("the waiter queues on the server", || async {
            common::sessions_of(&observer, &app).await.iter().any(|s| {
                s.wait_event.as_deref() == Some("advisory")
                    && s.query.as_deref().is_some_and(|q| match lock_timeout {
                        Some(setting) => q.contains(setting),
                        None => !q.contains("lock_timeout"),
                    })
            })
        })
        .await;
        held.release().await.expect("release");
        let guard = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("granted once released")
            .expect("join")
            .unwrap_or_else(|err| panic!("{timeout:?} must wait, not fail: {err:?}"));
        guard.release().await.expect("release");
    }
}

#[tokio::test]
async fn time_spent_waiting_for_the_pool_comes_off_the_server_wait() {
    // Two connections: the lock session's, and one to wait on, which a first contended
    // acquisition keeps for 300 ms. A second one waits for that connection, then on the
    // server: its one deadline must cover both.
    let holder = manager("holder", 2).await;
    let app = app_name("pool-then-server");
    let locks = common::manager_for(pool_named(2, &app).await, &app)
        .idle_sessions(0, Duration::ZERO)
        .build();
    let (first_key, second_key) = (key("pool-first"), key("pool-second"));
    let held = [
        holder.acquire(&first_key, None).await.expect("acquire"),
        holder.acquire(&second_key, None).await.expect("acquire"),
    ];
    let warm = locks
        .acquire(&key("warm"), None)
        .await
        .expect("open the lock session");
    warm.release().await.expect("release");
    let observer = common::observer().await;
    let first = tokio::spawn({
        let (locks, key) = (locks.clone(), first_key.clone());
        async move { locks.acquire(&key, Some(Duration::from_millis(300))).await }
    });
    common::eventually("the first acquisition waits on the server", || async {
        common::lock_rows(&observer, pglock::lock_id(&first_key))
            .await
            .iter()
            .any(|row| !row.granted)
    })
    .await;
    let timeout = Duration::from_millis(500);
    let started = Instant::now();
    let err = locks
        .acquire(&second_key, Some(timeout))
        .await
        .expect_err("held elsewhere");
    let elapsed = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    println!("pool wait then server wait: {elapsed:?} for a {timeout:?} deadline");
    assert!(elapsed >= timeout, "{elapsed:?}");
    // Given a fresh 500 ms on the server after the pool wait, it would take about 750 ms.
    assert!(
        elapsed < timeout + Duration::from_millis(150),
        "the server wait did not get the remaining time only: {elapsed:?}"
    );
    assert!(
        first
            .await
            .expect("join")
            .expect_err("timed out")
            .is_timeout()
    );
    for guard in held {
        guard.release().await.expect("release");
    }
}

#[tokio::test]
async fn a_deadline_longer_than_the_pools_acquire_timeout_waits_for_a_connection_until_it() {
    // A pool of 2 whose connections are both busy for a while, longer than the pool's own
    // acquire timeout: an acquisition with a longer deadline waits for a connection, through
    // as many of the pool's timeouts as it takes, and is granted once one is free.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(common::options(&app_name("busy-pool")))
        .await
        .expect("connect");
    let busy = [
        pool.acquire().await.expect("busy"),
        pool.acquire().await.expect("busy"),
    ];
    let locks = PostgresLockManager::new(pool);
    let wanted = key("busy-pool");
    let started = Instant::now();
    let acquisition = tokio::spawn({
        let (locks, wanted) = (locks.clone(), wanted.clone());
        async move { locks.acquire(&wanted, Some(Duration::from_secs(20))).await }
    });
    // The connections stay busy for five of the pool's acquire timeouts: the scenario is time
    // passing, so this sleep is the test's subject, not a stand-in for a signal.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(
        !acquisition.is_finished(),
        "the acquisition gave up before its deadline: {:?}",
        acquisition.await
    );
    drop(busy);
    let guard = tokio::time::timeout(Duration::from_secs(15), acquisition)
        .await
        .expect("granted once a connection is free, well before the deadline")
        .expect("join")
        .expect("granted, not PoolExhausted");
    assert!(started.elapsed() >= Duration::from_millis(1500));
    guard.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_deadlines_while_connections_come_and_go_end_in_a_grant_or_a_timeout() {
    // 3 managers × 6 tasks contend for 3 keys with deadlines of 0.5 to 3 ms, on pools whose
    // connections are recycled every 50 ms and whose lock sessions retire at once when idle,
    // so deadlines run out while connections are being opened and set up. Every outcome must
    // be a grant or a timeout: a deadline that ran out is never an outage.
    let seconds: u64 = std::env::var("PGLOCK_TINY_DEADLINE_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let keys: Vec<String> = (0..3).map(|_| key("tiny-deadline")).collect();
    let mut managers = Vec::new();
    for i in 0..3 {
        let app = app_name(&format!("tiny-{i}"));
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .max_lifetime(Duration::from_millis(50))
            .connect_with(common::options(&app))
            .await
            .expect("connect");
        let locks = common::manager_for(pool, &app)
            .session_idle_timeout(Duration::ZERO)
            .idle_sessions(0, Duration::ZERO)
            .build();
        managers.push((app, locks));
    }
    let stop = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for (_, locks) in &managers {
        for task in 0..6 {
            let (locks, keys) = (locks.clone(), keys.clone());
            tasks.push(tokio::spawn(async move {
                let (mut granted, mut timed_out, mut other) = (0u64, 0u64, Vec::new());
                let mut n = task as u64;
                while Instant::now() < stop {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let deadline = Duration::from_micros(500 + (n >> 33) % 2500);
                    let key = &keys[(n >> 20) as usize % keys.len()];
                    match locks.acquire(key, Some(deadline)).await {
                        Ok(guard) => {
                            granted += 1;
                            let _ = guard.release().await;
                        }
                        Err(err) if err.is_timeout() => timed_out += 1,
                        Err(err) => other.push(err.to_string()),
                    }
                }
                (granted, timed_out, other)
            }));
        }
    }
    let (mut granted, mut timed_out, mut other) = (0, 0, Vec::new());
    for task in tasks {
        let (g, t, o) = task.await.expect("join");
        granted += g;
        timed_out += t;
        other.extend(o);
    }
    println!(
        "tiny deadlines: {granted} granted, {timed_out} timed out, {} other",
        other.len()
    );
    assert!(
        other.is_empty(),
        "{} outcomes were neither a grant nor a timeout; the first: {:?}",
        other.len(),
        other.first()
    );
    assert!(
        granted > 0 && timed_out > 0,
        "{granted} granted, {timed_out} timed out"
    );
    // Nothing leaked: every registry is empty, and the server shows no lock of theirs.
    let observer = common::observer().await;
    for (app, locks) in &managers {
        common::eventually("the registry empties", || async {
            locks.held_lock_count() == 0
        })
        .await;
        common::eventually("the server holds nothing for the manager", || async {
            common::advisory_locks_of(&observer, app).await.is_empty()
        })
        .await;
    }
}
