//! A server whose advisory locks do not exclude is refused, by name or by proof, before the
//! first lock is taken; a healthy one passes, and says whether it delivers notifications.
//! Without `LISTEN` the manager degrades as documented: waits without a connection of their own
//! poll, and cycles through other managers end in their deadlines instead of `Deadlock`.
//!
//! The engines that only look like PostgreSQL are played by a private server whose
//! `pg_catalog` functions are replaced (allowed with `allow_system_table_mods`): advisory-lock
//! functions that answer `true` and lock nothing, as CockroachDB's do, and a `version()` that
//! names CockroachDB.

mod common;

use std::time::Duration;

use common::proxy::Proxy;
use common::{app_name, key};
use pglock::{Error, PostgresLockManager};
use pglock_testing::TempPostgres;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

/// A private server, and a pool on it whose database's `pg_catalog` has had `replacements`
/// (function definitions) made as its superuser.
async fn server_with(replacements: &[&str]) -> (TempPostgres, PgPool) {
    let server = TempPostgres::start().unwrap_or_else(|err| {
        panic!("this test needs a private server started from the PostgreSQL binaries: {err}")
    });
    // A server setting before PostgreSQL 13, a superuser's from 13 on: set for every version.
    server
        .configure("allow_system_table_mods", "on")
        .and_then(|()| server.stop())
        .and_then(|()| server.start_again())
        .expect("restart with allow_system_table_mods");
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&server.url())
        .await
        .expect("connect");
    let mut sql = String::new();
    for replacement in replacements {
        sql.push_str(replacement);
        sql.push(';');
    }
    sqlx::raw_sql(AssertSqlSafe(sql))
        .execute(&pool)
        .await
        .expect("replace pg_catalog functions");
    (server, pool)
}

fn refused(result: pglock::Result<impl std::fmt::Debug>, found: &str) {
    match result {
        Err(Error::UnsupportedServer { found: said, .. }) => {
            assert!(said.contains(found), "{said:?} does not name {found:?}");
        }
        other => panic!("expected UnsupportedServer ({found}), got {other:?}"),
    }
}

#[tokio::test]
async fn a_server_whose_advisory_locks_exclude_nothing_is_refused() {
    let (_server, pool) = server_with(&[
        "CREATE OR REPLACE FUNCTION pg_catalog.pg_try_advisory_lock(bigint) RETURNS boolean \
         LANGUAGE sql AS 'SELECT true'",
        "CREATE OR REPLACE FUNCTION pg_catalog.pg_try_advisory_lock_shared(bigint) \
         RETURNS boolean LANGUAGE sql AS 'SELECT true'",
    ])
    .await;
    let locks = PostgresLockManager::new(pool.clone());
    refused(locks.check_server().await, "a second session took");
    refused(
        locks.acquire(key("stubbed"), None).await,
        "a second session took",
    );
    refused(
        locks.try_acquire(key("stubbed")).await,
        "a second session took",
    );
    assert_eq!(locks.held_lock_count(), 0);
    assert_eq!(
        locks.lock_session_count(),
        0,
        "the refused session was not kept"
    );
}

#[tokio::test]
async fn an_engine_that_names_itself_cockroachdb_is_refused_by_name() {
    let (_server, pool) = server_with(&[
        "CREATE OR REPLACE FUNCTION pg_catalog.version() RETURNS text LANGUAGE sql \
         AS $$SELECT 'CockroachDB CCL v25.2.0 (x86_64-pc-linux-gnu)'$$",
    ])
    .await;
    let locks = PostgresLockManager::new(pool);
    refused(locks.check_server().await, "CockroachDB");
    refused(locks.acquire(key("cockroach"), None).await, "CockroachDB");
}

#[tokio::test]
async fn a_healthy_server_passes_the_check_and_delivers_notifications() {
    let locks = PostgresLockManager::new(common::pool_named(3, &app_name("check")).await);
    let check = locks
        .check_server()
        .await
        .expect("a PostgreSQL server excludes");
    assert!(check.version.starts_with("PostgreSQL"), "{check:?}");
    assert!(check.notifications, "{check:?}");
    println!("the server check took {:?}", check.took);
    let guard = locks.acquire(key("healthy"), None).await.expect("acquire");
    guard.release().await.expect("release");
}

/// Behind a proxy that refuses `LISTEN`: the check says so, waits without a connection of their
/// own are granted by polling, and a cycle through two managers ends in their deadlines.
#[tokio::test]
async fn without_listen_waits_poll_and_cycles_across_managers_end_in_deadlines() {
    let proxy = Proxy::start().await;
    proxy.refuse_listen();
    let through = |app: &str, max: u32| {
        let options = proxy.options(&app_name(app));
        async move {
            PgPoolOptions::new()
                .max_connections(max)
                .connect_with(options)
                .await
                .expect("connect through the proxy")
        }
    };
    let check = PostgresLockManager::new(through("nolisten-check", 2).await)
        .check_server()
        .await
        .expect("the locks still exclude");
    assert!(!check.notifications, "LISTEN was refused: {check:?}");

    // Four keys held elsewhere, one wait session: three wait without a connection, polled.
    let narrow = PostgresLockManager::builder(through("nolisten", 3).await)
        .max_connections(3)
        .wait_poll_interval(Duration::from_millis(50))
        .build();
    let holder = PostgresLockManager::new(common::pool_named(3, &app_name("holder")).await);
    let keys: Vec<String> = (0..4).map(|i| key(&format!("nolisten-{i}"))).collect();
    let held = holder.acquire_all(&keys, None).await.expect("held");
    let waiters: Vec<_> = keys
        .iter()
        .map(|k| {
            let (narrow, k) = (narrow.clone(), k.clone());
            tokio::spawn(async move { narrow.acquire(&k, Some(Duration::from_secs(30))).await })
        })
        .collect();
    held.release().await.expect("release");
    for waiter in waiters {
        let guard = waiter.await.expect("join").expect("granted by polling");
        guard.release().await.expect("release");
    }

    // A cycle through two managers: no probe is heard, so each waits out its deadline.
    let (a, b) = (
        PostgresLockManager::new(through("nolisten-a", 3).await),
        PostgresLockManager::new(through("nolisten-b", 3).await),
    );
    let outcomes = common::cycle::between(&a, &b, Some(Duration::from_secs(4))).await;
    // The first deadline ends the cycle; the other wait may then be granted before its own.
    let timeouts = outcomes
        .iter()
        .filter(|o| matches!(o, Err(Error::Timeout { .. })));
    assert!(
        timeouts.count() >= 1
            && outcomes
                .iter()
                .all(|o| o.is_ok() || matches!(o, Err(Error::Timeout { .. }))),
        "without notifications the cycle is not found; a deadline ends it: {outcomes:?}"
    );
}
