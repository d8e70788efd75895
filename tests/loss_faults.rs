//! Faults between the holder and the server: the server restarts, the network goes silent,
//! the server times idle sessions out. In each case the holder is told, within the documented
//! time, and the manager keeps working once the fault is gone.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{app_name, key, lock_rows, observer, pool_named};
use pglock::{Error, LossCause, PostgresLockManager, lock_id};
use pglock_testing::TempPostgres;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::Instant;

const PROBE: Duration = Duration::from_millis(200);
/// A whole number of intervals, so an unreachable server is declared at interval + grace, not
/// up to an interval later.
const GRACE: Duration = Duration::from_millis(400);
/// Room on top of a documented bound: the probe's own round trip, and the scheduling of a
/// machine whose two cores are busy with other work. Half an interval, so a loss reported an
/// interval late fails the test.
const SLACK: Duration = Duration::from_millis(100);
/// Room on top of interval + grace for a loss found by a ping left unanswered: two timers run
/// out one after the other (the ping's, then its grace), and the monitor and the test wake up,
/// on a machine whose two cores are busy with other work. Three quarters of an interval: a
/// loss declared an interval late (at 800 ms) still fails.
const UNANSWERED_SLACK: Duration = Duration::from_millis(150);
/// How long a test waits for a signal before it fails instead of hanging.
const BOUND: Duration = Duration::from_secs(10);

fn private_server() -> TempPostgres {
    TempPostgres::start().unwrap_or_else(|err| {
        panic!(
            "this test restarts or reconfigures its server, so it needs a private one started \
             from the PostgreSQL server binaries (install them, or point PGLOCK_PG_BIN at them): \
             {err}"
        )
    })
}

fn watched(pool: PgPool) -> PostgresLockManager {
    PostgresLockManager::builder(pool)
        .probe_interval(PROBE)
        .probe_grace(GRACE)
        .build()
}

/// A private server with `setting` applied server-wide (`ALTER SYSTEM`, then a reload), and an
/// admin pool on it. Sessions opened afterwards pick the setting up.
async fn configured_server(setting: &str) -> (TempPostgres, PgPool) {
    let server = private_server();
    let admin = connect(&server.url(), true).await;
    sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET {setting}")))
        .execute(&admin)
        .await
        .expect("configure");
    sqlx::query("SELECT pg_reload_conf()")
        .execute(&admin)
        .await
        .expect("reload");
    (server, admin)
}

async fn connect(url: &str, test_before_acquire: bool) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .test_before_acquire(test_before_acquire)
        .connect(url)
        .await
        .expect("connect")
}

#[tokio::test]
async fn a_server_restart_loses_held_locks_and_the_manager_recovers() {
    let server = private_server();
    // With and without the pool's own health check on checkout: either way the manager must
    // get past the connections the restart killed.
    let checked = watched(connect(&server.url(), true).await);
    let unchecked = watched(connect(&server.url(), false).await);
    let (a, b, c) = (key("restart-a"), key("restart-b"), key("restart-c"));
    let guard = checked.acquire(&a, None).await.expect("acquire");
    common::hold(&checked, &b).await;
    let other = unchecked.acquire(&c, None).await.expect("acquire");
    // Warm both pools with idle connections that the restart will kill.
    for locks in [&checked, &unchecked] {
        let k = key("warm");
        let g = locks.acquire(&k, None).await.expect("acquire");
        g.release().await.expect("release");
    }
    // A third manager holds nothing through the restart: its lock session, idle, learns that
    // its connection died only when it next sends a statement.
    let idle = watched(connect(&server.url(), false).await);
    let d = key("restart-d");
    let g = idle.acquire(&d, None).await.expect("acquire");
    g.release().await.expect("release");
    assert_eq!(idle.lock_session_count(), 1);

    // The clock starts as the stop is asked for: the fault cannot begin earlier. The stop runs
    // on a thread of its own, so the managers keep running while `pg_ctl` waits.
    let stopping_at = Instant::now();
    let stopping = tokio::task::spawn_blocking(move || {
        let stopped = server.stop();
        (server, stopped)
    });
    for guard in [&guard, &other] {
        let cause = tokio::time::timeout(BOUND, guard.loss_signal().lost())
            .await
            .expect("held locks are reported lost while the server is down");
        // The stopping server ends its sessions, and the next heartbeat finds them gone.
        assert_eq!(
            cause,
            LossCause::NotOnServer,
            "the server ended the sessions as it stopped"
        );
        let reported = stopping_at.elapsed();
        println!("server down: a lock reported lost {reported:?} after the stop was asked for");
        assert!(
            reported <= PROBE + GRACE + SLACK,
            "reported {reported:?} after the stop, more than interval + grace ({:?}) + {SLACK:?}",
            PROBE + GRACE
        );
    }
    let (server, stopped) = stopping.await.expect("join");
    stopped.expect("stop the server");
    assert_eq!(checked.held_lock_count(), 0);
    assert_eq!(unchecked.held_lock_count(), 0);
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));

    server.start_again().expect("start the server again");
    for (locks, key) in [
        (&checked, &a),
        (&checked, &b),
        (&unchecked, &c),
        (&idle, &d),
    ] {
        let guard = locks
            .acquire(key, Some(Duration::from_secs(10)))
            .await
            .expect("the manager works again once the server is back");
        guard.release().await.expect("release");
        common::hold(locks, key).await;
        locks.release(key).await.expect("release");
    }
}

#[tokio::test]
async fn a_network_blackhole_is_reported_within_interval_and_grace() {
    let observer = observer().await;
    let proxy = Proxy::start().await;
    let app = app_name("blackhole");
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .acquire_timeout(Duration::from_secs(2))
        .connect_with(proxy.options(&app))
        .await
        .expect("connect through the proxy");
    let locks = watched(pool);
    let key = key("blackhole");
    // Granted through the proxy: the lock session was heard as the grant came back.
    let guard = locks.acquire(&key, None).await.expect("acquire");

    let silent_at = Instant::now();
    proxy.blackhole();
    let cause = tokio::time::timeout(BOUND, guard.loss_signal().lost())
        .await
        .expect("the holder is told");
    let reported = silent_at.elapsed();
    println!("blackhole: lock reported lost after {reported:?}");
    assert_eq!(cause, LossCause::Unverifiable);
    // The session is pinged at most an interval after it was last heard (no later than the
    // blackhole), and given up when the ping has gone unanswered for the grace.
    assert!(
        reported <= PROBE + GRACE + UNANSWERED_SLACK,
        "reported {reported:?} after the blackhole, more than interval + grace ({:?}) + \
         {UNANSWERED_SLACK:?}",
        PROBE + GRACE
    );
    assert!(!locks.is_held(&key).await);

    // Inside the blackhole, a bounded acquisition times out at its deadline.
    let started = Instant::now();
    let err = locks
        .acquire(
            &common::key("blackhole-other"),
            Some(Duration::from_millis(300)),
        )
        .await
        .expect_err("nothing gets through");
    let elapsed = started.elapsed();
    assert!(
        matches!(err, Error::Timeout { timeout, .. } if timeout == Duration::from_millis(300)),
        "{err:?}"
    );
    println!("blackhole: a 300 ms acquisition failed after {elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(300) + SLACK,
        "beyond its 300 ms deadline: {elapsed:?}"
    );
    // So does a first acquisition of a manager that has no lock session yet: opening one is
    // bounded by the deadline too, not by the pool's acquire timeout (10 s), and the caller
    // gets its timeout at the deadline.
    let cold = watched(
        PgPoolOptions::new()
            .max_connections(3)
            .acquire_timeout(Duration::from_secs(10))
            .connect_lazy_with(proxy.options(&app_name("blackhole-cold"))),
    );
    let started = Instant::now();
    let err = cold
        .acquire(
            &common::key("blackhole-cold"),
            Some(Duration::from_millis(300)),
        )
        .await
        .expect_err("nothing gets through");
    let elapsed = started.elapsed();
    println!("blackhole: a cold manager's 300 ms acquisition failed after {elapsed:?}: {err:?}");
    assert!(
        matches!(err, Error::Timeout { timeout, .. } if timeout == Duration::from_millis(300)),
        "{err:?}"
    );
    assert!(
        elapsed < Duration::from_millis(300) + SLACK,
        "beyond its 300 ms deadline: {elapsed:?}"
    );

    // The server still believes the old session holds the lock until the network gives up.
    assert_eq!(lock_rows(&observer, lock_id(&key)).await.len(), 1);
    proxy.sever();
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let taken = rival
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("once the connection is gone, the server frees the lock");
    taken.release().await.expect("release");
}

#[tokio::test]
async fn a_servers_idle_session_timeout_never_ends_a_healthy_holder() {
    // The server ends sessions idle for 400 ms; the manager, without a silence timeout of its
    // own (which would replace the server's on its sessions), pings its sessions every 200 ms.
    let (server, admin) = configured_server("idle_session_timeout = '400ms'").await;
    let locks = PostgresLockManager::builder(connect(&server.url(), true).await)
        .probe_interval(PROBE)
        .probe_grace(GRACE)
        .silence_timeout(Duration::ZERO)
        .build();
    let key = key("idle-session");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    // Holding is the property: three times the server's timeout, and the lock is still there.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(guard.loss_signal().cause(), None);
    assert_eq!(lock_rows(&admin, lock_id(&key)).await.len(), 1);
    guard
        .release()
        .await
        .expect("the lock was kept, so it is released");

    // A session left unheard is ended by the server, and its holder is told: the heartbeat
    // turned off with detection, and the silence timeout too.
    let deaf = PostgresLockManager::builder(connect(&server.url(), true).await)
        .detect_lost_locks(false)
        .silence_timeout(Duration::ZERO)
        .build();
    let guard = deaf.acquire(&key, None).await.expect("acquire");
    common::eventually("the server ends the unheard session", || async {
        lock_rows(&admin, lock_id(&key)).await.is_empty()
    })
    .await;
    drop(guard);
}

#[tokio::test]
async fn idle_in_transaction_timeouts_never_touch_a_held_lock() {
    let (server, admin) = configured_server("idle_in_transaction_session_timeout = '200ms'").await;
    let locks = watched(connect(&server.url(), true).await);
    let key = key("idle-in-transaction");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    // Locks are held in autocommit, so the session is `idle`, never `idle in transaction`:
    // hold well past the timeout and the lock is still there.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!guard.loss_signal().is_lost());
    let holders: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid",
    )
    .bind(i64::from(pglock::split_lock_id(lock_id(&key)).0))
    .bind(i64::from(pglock::split_lock_id(lock_id(&key)).1))
    .fetch_one(&admin)
    .await
    .expect("pg_locks");
    assert_eq!(holders, 1);
    guard
        .release()
        .await
        .expect("the lock was kept, so it is released");
}
