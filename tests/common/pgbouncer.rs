//! The tests' own PgBouncer, and what to look at through it.

use std::time::Duration;

use pglock::{LockKey, LockTarget};
use pglock_testing::{PoolMode, TempPgBouncer};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgConnection, PgPool};

/// A PgBouncer in `mode` in front of the test database, with at most `pool_size` server
/// connections. Fails, never skips, when PgBouncer cannot be started.
pub fn start(mode: PoolMode, pool_size: u32) -> TempPgBouncer {
    TempPgBouncer::start(super::url(), mode, pool_size)
        .unwrap_or_else(|err| panic!("could not start PgBouncer: {err}"))
}

/// Connect options through `bouncer`, tagged `app`.
pub fn options(bouncer: &TempPgBouncer, app: &str) -> PgConnectOptions {
    bouncer.options().application_name(app)
}

/// A pool of at most `max` client connections through `bouncer`.
pub async fn pool(bouncer: &TempPgBouncer, max: u32, app: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options(bouncer, app))
        .await
        .unwrap_or_else(|err| panic!("cannot connect through PgBouncer: {err}\n{}", bouncer.log()))
}

/// The server process running the caller's transaction: pinned to it until the transaction
/// ends. Unprepared, as everything sent through a transaction-mode PgBouncer 1.18 must be.
pub async fn backend_pid(tx: &mut PgConnection) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()")
        .persistent(false)
        .fetch_one(tx)
        .await
        .expect("pg_backend_pid")
}

/// One advisory lock as `pg_locks` shows it: server process, mode, granted.
pub type Holder = (i32, String, bool);

/// The `pg_locks` rows of the advisory lock `key` stands for, granted first, read from the
/// server directly (not through the pooler).
pub async fn holders(observer: &PgPool, key: &LockKey) -> Vec<Holder> {
    let target: LockTarget = key.target();
    let (classid, objid) = pglock::split_lock_id(target.packed());
    sqlx::query_as(
        "SELECT pid, mode, granted FROM pg_locks WHERE locktype = 'advisory' \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = $3 \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) \
         ORDER BY granted DESC, pid",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(target.objsubid())
    .fetch_all(observer)
    .await
    .expect("query pg_locks")
}

/// How many server processes wait for `key`.
pub async fn waiters(observer: &PgPool, key: &LockKey) -> usize {
    holders(observer, key)
        .await
        .iter()
        .filter(|(_, _, granted)| !granted)
        .count()
}
