//! Connections to the test database: pools tagged by application name, unique keys.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The database of this test run (see `pglock_testing::database_url`).
pub fn url() -> &'static str {
    pglock_testing::database_url()
}

/// Connect options for the test database, tagged with `application_name` `app`.
pub fn options(app: &str) -> PgConnectOptions {
    let options: PgConnectOptions = url().parse().expect("a valid DATABASE_URL");
    options.application_name(app)
}

/// A new pool of at most `max` connections, tagged with `application_name` `app` so the
/// server's views can tell its sessions apart.
pub async fn pool_named(max: u32, app: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options(app))
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {}: {err}", url()))
}

/// A new pool of at most `max` connections.
pub async fn pool(max: u32) -> PgPool {
    pool_named(max, "pglock-tests").await
}

/// A unique `application_name` for one test's pool.
pub fn app_name(label: &str) -> String {
    format!(
        "pglock-{label}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A key no other test uses.
pub fn key(label: &str) -> String {
    format!("pglock-test:{label}:{}", uuid::Uuid::new_v4())
}

/// A manager on `pool` whose holder id is the pool's `application_name`, so the sessions it
/// tags (`pglock:{app}`) can be attributed to the pool.
pub fn manager_for(pool: PgPool, app: &str) -> pglock::PostgresLockManagerBuilder {
    pglock::PostgresLockManager::builder(pool).holder_id(app)
}

/// A manager on a pool of its own of at most `max` connections, tagged with `application_name`
/// `app`, whose holder id is `app` (see [`manager_for`]).
pub async fn manager_named(app: &str, max: u32) -> pglock::PostgresLockManager {
    manager_for(pool_named(max, app).await, app).build()
}

/// A pool for looking at the server's views from outside the code under test.
pub async fn observer() -> PgPool {
    pool_named(2, "pglock-observer").await
}

/// A private server with the stock `max_connections` of 100 (the shared test server allows
/// more) and `max_locks_per_transaction` of 64, so its shared lock table has its stock size
/// too: 6,400 slots.
pub async fn stock_server() -> pglock_testing::TempPostgres {
    let server = pglock_testing::TempPostgres::start().unwrap_or_else(|err| {
        panic!(
            "this test needs a private server with stock settings, started from the PostgreSQL \
             server binaries (install them, or point PGLOCK_PG_BIN at them): {err}"
        )
    });
    let admin = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .expect("connect");
    sqlx::query("ALTER SYSTEM SET max_connections = 100")
        .execute(&admin)
        .await
        .expect("configure");
    admin.close().await;
    server.stop().expect("stop");
    server.start_again().expect("restart");
    server
}
