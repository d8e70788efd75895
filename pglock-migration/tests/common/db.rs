//! The test database: pools tagged by application name, and what `pg_locks` shows.

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The database of this test run (see `pglock_testing::database_url`): the run's shared
/// throwaway server unless `DATABASE_URL` is set.
pub fn url() -> &'static str {
    pglock_testing::database_url()
}

/// A new pool of at most `max` connections, tagged with `application_name` `app`.
pub async fn pool_named(max: u32, app: &str) -> PgPool {
    let options: PgConnectOptions = url().parse().expect("a valid DATABASE_URL");
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options.application_name(app))
        .await
        .unwrap_or_else(|err| panic!("cannot connect to {}: {err}", url()))
}

/// A unique `application_name` for one test's pool.
pub fn app_name(label: &str) -> String {
    format!(
        "pglock-{label}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// A pool for looking at the server's views from outside the code under test.
pub async fn observer() -> PgPool {
    pool_named(2, "pglock-observer").await
}

/// One advisory lock as `pg_locks` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRow {
    pub pid: i32,
    pub mode: String,
    pub granted: bool,
}

/// The `pg_locks` rows (granted or waiting) of the advisory lock `lock_id`.
pub async fn lock_rows(observer: &PgPool, lock_id: i64) -> Vec<LockRow> {
    let (classid, objid) = pglock::split_lock_id(lock_id);
    let rows: Vec<(i32, String, bool)> = sqlx::query_as(
        "SELECT pid, mode, granted FROM pg_locks WHERE locktype = 'advisory' \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid ORDER BY granted DESC, pid",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .fetch_all(observer)
    .await
    .expect("query pg_locks");
    rows.into_iter()
        .map(|(pid, mode, granted)| LockRow { pid, mode, granted })
        .collect()
}

/// Waits until `condition` holds, checking every 10 ms for up to 15 s.
///
/// Only for states that the server reaches on its own time with no signal to wait on (a
/// waiter showing up in `pg_locks`); it panics with `what` if the state never comes.
pub async fn eventually<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        if condition().await {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Awaits `signal` (a task, a channel), panicking with `what` if it has not come within 30 s,
/// so a regression fails the test instead of hanging it.
pub async fn within<T>(what: &str, signal: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(30), signal)
        .await
        .unwrap_or_else(|_| panic!("waited 30 s for {what}"))
}
