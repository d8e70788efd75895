//! The server's version, for the few tests whose documented outcome differs on an older server
//! (`scripts/pg-matrix.sh` runs the tests on PostgreSQL 12 to 18).
//!
//! pglock uses two session settings of PostgreSQL 14 where the server has them:
//! `idle_session_timeout` (the silence bound: without it a frozen holder keeps its locks until
//! it runs again) and `client_connection_check_interval` (without it an abandoned wait stays in
//! the server's queue until the lock is granted to it); `pg_locks.waitstart` (14) dates a
//! waiter for `pglock::inspect`. A test of such a behaviour reads the version and asserts what
//! is documented for that server: it is never skipped.

use sqlx::PgPool;

/// `server_version_num` of the server behind `pool`: 140005 for 14.5, 120022 for 12.22.
pub async fn server_version_num(pool: &PgPool) -> u32 {
    let (version,): (String,) = sqlx::query_as("SHOW server_version_num")
        .fetch_one(pool)
        .await
        .expect("server_version_num");
    version.parse().expect("server_version_num is a number")
}

/// Whether the server is PostgreSQL 14 or later: it has `idle_session_timeout`,
/// `client_connection_check_interval` and `pg_locks.waitstart`.
pub async fn pg14_or_later(pool: &PgPool) -> bool {
    server_version_num(pool).await >= 140_000
}
