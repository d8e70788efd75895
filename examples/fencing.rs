//! Fencing tokens: why a lock alone is not enough, and the check that makes it enough.
//!
//! A lock tells a process "you may write now". It cannot stop a process that *was* allowed to
//! write, lost its lock without noticing (a long pause, a network partition), and writes
//! anyway. A fencing token can: every acquisition gets a number larger than any before it, the
//! writer sends it along, and the resource refuses writes whose token is lower than the highest
//! it has accepted.
//!
//! This example plays it out with two workers updating one order:
//!
//! 1. Worker A takes the lock (token n) and writes.
//! 2. A's database session is killed behind its back, which frees the lock.
//! 3. Worker B takes the lock (token n+1) and writes.
//! 4. A, still believing it holds the lock, writes again with token n: the order refuses it.
//!
//! ```text
//! cargo run --example fencing
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do.

use std::time::Duration;

use pglock::{FencingTable, LockManager, PostgresLockManager};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = pglock::testing::database_url();
    let db = connect(url).await?;

    // The resource: an order row that remembers the highest fencing token it has accepted.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pglock_example_orders \
         (id uuid PRIMARY KEY, status text NOT NULL, fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&db)
    .await?;
    let order = Uuid::new_v4();
    sqlx::query("INSERT INTO pglock_example_orders (id, status) VALUES ($1, 'new')")
        .bind(order)
        .execute(&db)
        .await?;

    // Two workers, as two processes would be: their own pools, their own managers, fencing on.
    let key = format!("order:{order}");
    let worker = |name: &'static str| async move {
        let locks = PostgresLockManager::builder(connect(url).await?)
            .holder_id(name)
            .fencing(FencingTable::default())
            .probe_interval(Duration::from_millis(200))
            .build();
        Ok::<_, BoxError>(locks)
    };
    let (a, b) = (worker("worker-a").await?, worker("worker-b").await?);

    let a_guard = a.acquire(&key, Some(Duration::from_secs(5))).await?;
    let a_token = a_guard.fencing_token.expect("fencing is on");
    println!("A holds the lock with token {a_token}");
    println!(
        "A writes 'packed':    {}",
        verdict(write(&db, order, a_token, "packed").await?)
    );

    // Something kills A's session: a failover, an admin, an idle timeout.
    let (classid, objid) = pglock::split_lock_id(a_guard.lock_id);
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND granted",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .execute(&db)
    .await?;
    println!("A's session is terminated; the server frees the lock");

    let b_guard = b.acquire(&key, Some(Duration::from_secs(5))).await?;
    let b_token = b_guard.fencing_token.expect("fencing is on");
    println!("B holds the lock with token {b_token}");
    println!(
        "B writes 'cancelled': {}",
        verdict(write(&db, order, b_token, "cancelled").await?)
    );

    // A has not noticed yet (its manager checks every 200 ms) and writes with its old token.
    println!(
        "A writes 'shipped':   {}",
        verdict(write(&db, order, a_token, "shipped").await?)
    );

    let status: String =
        sqlx::query_scalar("SELECT status FROM pglock_example_orders WHERE id = $1")
            .bind(order)
            .fetch_one(&db)
            .await?;
    println!("the order is '{status}'");
    // A does learn it: the loss is reported within the probe interval.
    let cause = tokio::time::timeout(Duration::from_secs(5), a_guard.lost()).await?;
    println!("A is told its lock was lost: {cause}");

    b_guard.release().await?;
    sqlx::query("DELETE FROM pglock_example_orders WHERE id = $1")
        .bind(order)
        .execute(&db)
        .await?;
    if status != "cancelled" {
        return Err("the stale write got through".into());
    }
    println!("the stale write was refused: fencing kept the order consistent");
    Ok(())
}

/// The resource-side check: accept the write only if its token is at least the highest one
/// accepted so far (the same holder may write several times with its own token).
async fn write(db: &PgPool, order: Uuid, token: i64, status: &str) -> Result<bool, sqlx::Error> {
    let updated = sqlx::query(
        "UPDATE pglock_example_orders SET status = $3, fence = $2 WHERE id = $1 AND fence <= $2",
    )
    .bind(order)
    .bind(token)
    .bind(status)
    .execute(db)
    .await?;
    Ok(updated.rows_affected() == 1)
}

fn verdict(accepted: bool) -> &'static str {
    if accepted {
        "accepted"
    } else {
        "REFUSED (stale token)"
    }
}

async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new().max_connections(3).connect(url).await
}
