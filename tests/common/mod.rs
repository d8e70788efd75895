//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The database of this test run (see `pglock::testing::database_url`).
pub fn url() -> &'static str {
    pglock::testing::database_url()
}

/// A new pool of at most `max` connections, tagged with `application_name` `app`.
pub async fn pool_named(max: u32, app: &str) -> PgPool {
    let options: sqlx::postgres::PgConnectOptions = url().parse().expect("a valid DATABASE_URL");
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.application_name(app))
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {}: {err}", url()))
}

/// A new pool of at most `max` connections.
pub async fn pool(max: u32) -> PgPool {
    pool_named(max, "pglock-tests").await
}

/// A key no other test uses.
pub fn key(label: &str) -> String {
    format!("pglock-test:{label}:{}", uuid::Uuid::new_v4())
}
