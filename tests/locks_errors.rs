//! Errors say what happened: a full server, a closed pool, an exhausted pool, a pool that cannot
//! give a lock session, an unreachable server and a server that refuses the connection are each
//! reported as such, typed, within the manager's bounds or the caller's deadline (a standby's
//! refusal is tested in `tests/ha.rs`, a full lock table in `tests/locks_budget.rs`).

mod common;

use std::time::Duration;

use common::{app_name, key, manager_named};
use pglock::{Error, PostgresLockManager};
use pglock_testing::TempPostgres;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, PgConnection};
use tokio::time::Instant;

/// A private server that accepts at most `max` connections, superusers included.
async fn small_server(max: u32) -> TempPostgres {
    let server = TempPostgres::start().unwrap_or_else(|err| {
        panic!(
            "this test reconfigures its server, so it needs a private one started from the \
             PostgreSQL server binaries (install them, or point PGLOCK_PG_BIN at them): {err}"
        )
    });
    let mut admin = connect(&server).await;
    for setting in [
        format!("max_connections = {max}"),
        "superuser_reserved_connections = 0".to_owned(),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(format!("ALTER SYSTEM SET {setting}")))
            .execute(&mut admin)
            .await
            .expect("configure");
    }
    drop(admin);
    server.stop().expect("stop");
    server.start_again().expect("restart");
    server
}

async fn connect(server: &TempPostgres) -> PgConnection {
    options(server).connect().await.expect("connect")
}

fn options(server: &TempPostgres) -> PgConnectOptions {
    server.url().parse().expect("url")
}

#[tokio::test]
async fn a_full_server_is_reported_as_too_many_connections() {
    let server = small_server(3).await;
    let mut taken = Vec::new();
    for _ in 0..3 {
        taken.push(connect(&server).await);
    }
    // Without a deadline of the caller's, the pool's own `acquire_timeout` bounds getting a
    // connection; the manager then says why none could be had.
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(500))
        .connect_lazy_with(options(&server).application_name(&app_name("full")));
    let locks = PostgresLockManager::new(pool);
    let key = key("full");
    let started = Instant::now();
    let err = locks
        .try_acquire(&key)
        .await
        .expect_err("the server is full");
    match &err {
        Error::TooManyConnections { key: k, reason } => {
            assert_eq!(k, &key);
            assert!(reason.contains("too many clients"), "{reason}");
        }
        other => panic!("expected TooManyConnections, got {other:?}"),
    }
    // The pool's acquire timeout (500 ms), then at most 100 ms to ask the server why, and
    // room for a busy machine.
    let elapsed = started.elapsed();
    println!("a full server: refused after {elapsed:?}");
    assert!(
        elapsed < Duration::from_millis(500 + 100 + 100),
        "bounded by the pool's acquire timeout: {elapsed:?}"
    );
    assert!(
        err.to_string().contains("refused a new connection"),
        "{err}"
    );
    // With a deadline, the deadline is the only bound: the full server is waited out until
    // then, and the caller gets its timeout.
    let deadline = Duration::from_millis(800);
    let started = Instant::now();
    let err = locks
        .acquire(&key, Some(deadline))
        .await
        .expect_err("the server is still full");
    let elapsed = started.elapsed();
    println!("a full server with a deadline: gave up after {elapsed:?}");
    match &err {
        Error::Timeout { key: k, timeout } => {
            assert_eq!(k, &key);
            assert_eq!(*timeout, deadline);
        }
        other => panic!("expected Timeout at the caller's deadline, got {other:?}"),
    }
    assert!(
        elapsed >= deadline && elapsed < deadline + Duration::from_millis(300),
        "bounded by the caller's deadline: {elapsed:?}"
    );
    // Once the server has room, the same manager works: room for two, as a manager's first
    // lock session proves that the server's locks exclude on a second connection of its own.
    drop(taken.pop());
    drop(taken.pop());
    let guard = locks
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("acquire once the server has room");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_closed_pool_is_reported_as_closed() {
    let pool = common::pool_named(2, &app_name("closed")).await;
    let locks = PostgresLockManager::new(pool.clone());
    pool.close().await;
    let key = key("closed");
    for err in [
        locks.try_acquire(&key).await.map(drop).expect_err("closed"),
        locks
            .acquire(&key, None)
            .await
            .map(drop)
            .expect_err("closed"),
    ] {
        assert!(
            matches!(&err, Error::PoolClosed { key: k } if k == &key),
            "{err:?}"
        );
        assert!(err.to_string().contains("pool is closed"), "{err}");
    }
}

#[tokio::test]
async fn pool_exhaustion_is_a_typed_error_within_the_deadline() {
    // Two connections: the lock session's, and one the application keeps busy. A key held
    // elsewhere is waited for in the server's queue on a connection of its own (the manager's
    // cap of 2 leaves it one wait session), which the pool cannot give. The pool's own acquire
    // timeout bounds a checkout without a deadline of the caller's.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(common::options(&app_name("exhausted")))
        .await
        .expect("connect");
    let locks = PostgresLockManager::new(pool.clone());
    // The lock session takes one connection; the lock on it costs nothing more.
    let first = locks
        .acquire(&key("on-the-lock-session"), None)
        .await
        .expect("acquire");
    let busy = pool.acquire().await.expect("the application's connection");
    let elsewhere = manager_named(&app_name("elsewhere"), 2).await;
    let other = key("needs-a-connection");
    let held = elsewhere.acquire(&other, None).await.expect("acquire");

    // With a deadline, the deadline is the only bound, and its passing while no connection
    // is free is a timeout like any other.
    let started = Instant::now();
    let err = locks
        .acquire(&other, Some(Duration::from_millis(200)))
        .await
        .expect_err("no connection is free");
    let elapsed = started.elapsed();
    match &err {
        Error::Timeout { key, timeout } => {
            assert_eq!(key, &other);
            assert_eq!(*timeout, Duration::from_millis(200));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(2),
        "took {elapsed:?}"
    );

    // Without one, the pool's acquire timeout (300 ms) bounds the checkout: a typed error.
    let started = Instant::now();
    let err = locks
        .acquire(&other, None)
        .await
        .expect_err("no connection is free");
    let elapsed = started.elapsed();
    match &err {
        Error::PoolExhausted {
            key,
            max_connections,
            waited,
        } => {
            assert_eq!(key, &other);
            assert_eq!(*max_connections, 2);
            assert!(*waited >= Duration::from_millis(250), "{waited:?}");
        }
        other => panic!("expected PoolExhausted, got {other:?}"),
    }
    assert!(
        err.to_string().contains("connection pool exhausted"),
        "{err}"
    );
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");

    // try_acquire runs on the lock session: it never waits for the pool.
    assert!(
        locks
            .try_acquire(&other)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    drop(busy);
    held.release().await.expect("release");
    common::hold(&locks, &other).await;
    locks.release(&other).await.expect("release");
    first.release().await.expect("release");
}

#[tokio::test]
async fn without_a_lock_session_a_try_fails_typed_within_the_pools_acquire_timeout() {
    let app = app_name("no-session");
    // Without a deadline of the caller's, the pool's own acquire timeout bounds the checkout.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(common::options(&app))
        .await
        .expect("connect");
    let locks = common::manager_for(pool.clone(), &app).build();
    // The application holds the pool's only connection, so no lock session can be opened.
    let taken = pool.acquire().await.expect("checkout");
    for attempt in [None, Some(Duration::ZERO)] {
        let started = Instant::now();
        let err = match attempt {
            None => locks.try_acquire(&key("cold")).await.map(|_| ()),
            Some(zero) => locks.acquire(&key("cold"), Some(zero)).await.map(|_| ()),
        }
        .expect_err("no lock session can be had");
        assert!(matches!(err, Error::PoolExhausted { .. }), "{err:?}");
        let elapsed = started.elapsed();
        println!("no lock session: {attempt:?} failed after {elapsed:?}");
        assert!(
            elapsed < Duration::from_millis(300 + 150),
            "bounded by the pool's acquire timeout (300 ms): {elapsed:?}"
        );
    }
    // With a deadline, the deadline alone bounds it, and its passing is a timeout.
    let started = Instant::now();
    let err = locks
        .acquire(&key("cold"), Some(Duration::from_millis(500)))
        .await
        .expect_err("no lock session can be had");
    let elapsed = started.elapsed();
    println!("no lock session: a 500 ms deadline failed after {elapsed:?}");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(500 + 150),
        "bounded by the deadline, not the pool's acquire timeout: {elapsed:?}"
    );
    drop(taken);
    common::hold(&locks, &key("warm")).await;
    assert_eq!(locks.release_all().await.expect("release all"), 1);
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error_within_the_deadline() {
    // Nothing listens on a port we just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(400))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .expect("lazy pool");
    let locks = PostgresLockManager::new(pool);
    let key = key("unreachable");

    let started = Instant::now();
    let err = locks
        .acquire(&key, Some(Duration::from_millis(300)))
        .await
        .expect_err("nothing to connect to");
    let elapsed = started.elapsed();
    println!("unreachable server: failed after {elapsed:?}");
    // With a deadline, a connection that cannot be had yet is tried again until then: the
    // caller gets its timeout.
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        elapsed < Duration::from_millis(300 + 150),
        "beyond its 300 ms deadline: {elapsed:?}"
    );

    let err = locks
        .try_acquire(&key)
        .await
        .expect_err("nothing to connect to");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert_eq!(err.key(), &key);
    let err = locks
        .acquire(&key, None)
        .await
        .expect_err("nothing to connect to");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn a_refusing_server_is_a_typed_error_with_its_reason() {
    let options = common::options(&app_name("refused")).database("no_such_database_for_pglock");
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    let locks = PostgresLockManager::new(pool);
    let err = locks
        .acquire(&key("refused"), Some(Duration::from_secs(5)))
        .await
        .expect_err("the database does not exist");
    match &err {
        Error::Connection { reason, .. } => assert!(reason.contains("does not exist"), "{reason}"),
        other => panic!("expected Connection, got {other:?}"),
    }
}

/// PostgreSQL 11 and older lack syntax the session set-up needs; the error names the server's
/// version and the oldest supported one rather than a syntax error. `scripts/pg-matrix.sh` runs
/// this test on PostgreSQL 11 (and the other tests on 12 to 18, where it takes a lock).
#[tokio::test]
async fn a_server_older_than_12_is_refused_with_its_version() {
    let pool = common::pool_named(2, &app_name("old-server")).await;
    let supported = common::server_version_num(&pool).await >= 120_000;
    let locks = PostgresLockManager::new(pool);
    let key = key("old-server");
    let attempt = locks.try_acquire(&key).await;
    if supported {
        assert!(
            matches!(attempt, Ok(pglock::Attempt::Acquired(_))),
            "{attempt:?}"
        );
        return;
    }
    let err = attempt.map(drop).expect_err("an unsupported server");
    assert!(
        matches!(&err, Error::Connection { reason, .. }
            if reason.contains("is not supported: pglock needs PostgreSQL 12 or later")),
        "{err:?}"
    );
}

/// A manager whose pool reaches a server in recovery is refused with `Error::Standby`, on
/// every version `scripts/pg-matrix.sh` runs (a lone server in recovery: the packages it uses
/// have no `pg_basebackup` for a streaming standby, which `ha.rs` uses on the main server).
#[tokio::test]
async fn a_server_in_recovery_is_refused_as_a_standby() {
    let server = TempPostgres::start_in_recovery().expect("a server in recovery");
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options(&server))
        .await
        .expect("connect");
    let (in_recovery,): (bool,) = sqlx::query_as("SELECT pg_is_in_recovery()")
        .fetch_one(&pool)
        .await
        .expect("pg_is_in_recovery");
    assert!(in_recovery, "the server must be in recovery");
    let locks = PostgresLockManager::new(pool);
    let key = key("in-recovery");
    let attempts = [
        locks.try_acquire(&key).await.map(drop),
        locks
            .acquire(&key, Some(Duration::from_secs(2)))
            .await
            .map(drop),
    ];
    for attempt in attempts {
        assert!(
            matches!(&attempt, Err(Error::Standby { key: k }) if k == &key),
            "{attempt:?}"
        );
    }
    assert_eq!(locks.held_lock_count(), 0);
}
