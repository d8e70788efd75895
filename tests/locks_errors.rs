//! Errors say what happened: a full server and a closed pool are each reported as such, typed,
//! within the manager's bounds (a standby's refusal is tested in `tests/ha.rs`).

mod common;

use std::time::Duration;

use common::{app_name, key};
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
    // Once a connection is free, the same manager works.
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
