//! Faults between the holder and the server: the server restarts, the network goes silent,
//! the server times idle sessions out. In each case the holder is told, within the documented
//! time, and the manager keeps working once the fault is gone.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{app_name, key, lock_rows, observer, pool_named};
use pglock::testing::TempPostgres;
use pglock::{Error, LockManager, LossCause, PostgresLockManager, lock_id};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::time::Instant;

const PROBE: Duration = Duration::from_millis(100);
const GRACE: Duration = Duration::from_millis(300);

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
    assert!(checked.try_acquire(&b).await.expect("try").is_some());
    let other = unchecked.acquire(&c, None).await.expect("acquire");
    // Warm both pools with idle connections that the restart will kill.
    for locks in [&checked, &unchecked] {
        let k = key("warm");
        let g = locks.acquire(&k, None).await.expect("acquire");
        assert!(g.release().await.expect("release"));
    }

    server.stop().expect("stop the server");
    let stopped_at = Instant::now();
    for guard in [&guard, &other] {
        let cause = tokio::time::timeout(Duration::from_secs(10), guard.lost())
            .await
            .expect("held locks are reported lost while the server is down");
        assert_eq!(
            cause,
            LossCause::Unverifiable,
            "the server cannot be asked while down"
        );
    }
    let reported = stopped_at.elapsed();
    println!("server down: locks reported lost after {reported:?}");
    assert!(
        reported <= PROBE + GRACE + PROBE + Duration::from_millis(200),
        "{reported:?}"
    );
    assert_eq!(checked.held_lock_count(), 0);
    assert_eq!(unchecked.held_lock_count(), 0);
    assert!(matches!(guard.release().await, Err(Error::LockLost { .. })));

    server.start_again().expect("start the server again");
    for (locks, key) in [(&checked, &a), (&checked, &b), (&unchecked, &c)] {
        let guard = locks
            .acquire(key, Some(Duration::from_secs(10)))
            .await
            .expect("the manager works again once the server is back");
        assert!(guard.release().await.expect("release"));
        assert!(locks.try_acquire(key).await.expect("try").is_some());
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
    let guard = locks.acquire(&key, None).await.expect("acquire");
    // Let the monitor confirm the lock once, through the proxy.
    common::eventually("the monitor is connected", || async {
        !common::sessions_of(&observer, &format!("{app}:pglock-monitor"))
            .await
            .is_empty()
    })
    .await;

    proxy.blackhole();
    let silent_at = Instant::now();
    let cause = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the holder is told");
    let reported = silent_at.elapsed();
    println!("blackhole: lock reported lost after {reported:?}");
    assert_eq!(cause, LossCause::Unverifiable);
    // Unknown since the last confirmation (at most one interval before the blackhole), then
    // declared lost at interval + grace.
    assert!(
        reported <= PROBE + GRACE + Duration::from_millis(200),
        "{reported:?}"
    );
    assert!(!locks.is_held(&key).await);

    // Inside the blackhole, a bounded acquisition is a typed error within its deadline.
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
        matches!(
            err,
            Error::Connection { .. } | Error::AcquisitionFailed { .. }
        ),
        "{err:?}"
    );
    assert!(
        elapsed < Duration::from_millis(300) + Duration::from_millis(500),
        "{elapsed:?}"
    );

    // The server still believes the old session holds the lock until the network gives up.
    assert_eq!(lock_rows(&observer, lock_id(&key)).await.len(), 1);
    proxy.sever();
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let taken = rival
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("once the connection is gone, the server frees the lock");
    assert!(taken.release().await.expect("release"));
}

#[tokio::test]
async fn idle_session_timeout_kills_are_reported_as_lost() {
    let (server, _admin) = configured_server("idle_session_timeout = '400ms'").await;
    // New sessions pick the setting up; this pool's connections are all new.
    let locks = watched(connect(&server.url(), true).await);
    let key = key("idle-session");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let acquired_at = Instant::now();
    let cause = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the server's timeout is reported, never silent");
    println!(
        "idle_session_timeout 400ms: reported lost after {:?}",
        acquired_at.elapsed()
    );
    assert_eq!(cause, LossCause::NotOnServer);
    assert!(acquired_at.elapsed() >= Duration::from_millis(400));
    assert!(!locks.is_held(&key).await);
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
    assert!(!guard.is_lost());
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
    assert!(
        guard
            .release()
            .await
            .expect("the lock was kept, so it is released")
    );
}
