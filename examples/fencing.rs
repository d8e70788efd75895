//! Fencing tokens: why a lock alone is not enough, and the checks that make it enough.
//!
//! A lock tells a process "you may write now". It cannot stop a process that *was* allowed to
//! write, lost its lock without noticing (a long pause, a network partition, a killed
//! session), and writes anyway. A fencing token can: every acquisition gets a number larger
//! than any before it for its key, the holder sends it along, and the resource refuses a
//! holder whose token is lower than the highest it has seen.
//!
//! Two workers, A and B, play three scenes. In each, A holds the lock, A's database session is
//! killed behind its back (which frees the lock), B takes the lock with a higher token, and A,
//! still believing it holds the lock, carries on:
//!
//! 1. **A blind write** (set an order's status): the check on the write,
//!    `... WHERE fence <= token`, refuses A's late write.
//! 2. **A read-modify-write with the write check alone** (increment a counter): A and B both
//!    read 0, both writes are accepted, and the counter says 1. An accepted increment is lost.
//! 3. **The same increment with the fence raised before the read** ([`RowFence`]): B's raise
//!    locks A out, A's write is refused, and the counter holds exactly the accepted increment.
//!
//! ```text
//! cargo run --example fencing
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do.

use std::time::Duration;

use pglock::fence::Error as FenceError;
use pglock::{FencingTable, LockGuard, PostgresLockManager, RowFence};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const WAIT: Option<Duration> = Some(Duration::from_secs(5));

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let url = pglock_testing::database_url();
    let db = connect(url).await?;
    // The resources: rows that remember the highest fencing token they have seen (`fence`,
    // NULL until the first fenced write).
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS pglock_example_orders \
           (id uuid PRIMARY KEY, status text NOT NULL, fence bigint); \
         CREATE TABLE IF NOT EXISTS pglock_example_counters \
           (id uuid PRIMARY KEY, value bigint NOT NULL, fence bigint)",
    )
    .execute(&db)
    .await?;
    // Two workers, as two processes would be: their own pools, their own managers, fencing on.
    let a = worker(url, "worker-a").await?;
    let b = worker(url, "worker-b").await?;

    let status = blind_write(&db, &a, &b).await?;
    let lost = write_check_alone(&db, &a, &b).await?;
    let kept = raise_before_read(&db, &a, &b).await?;

    if status != "cancelled" || lost != (2, 1) || kept != (1, 1) {
        return Err("an outcome differs from what fencing promises".into());
    }
    println!("\nfencing kept every resource consistent with the writes it accepted");
    Ok(())
}

/// Scene 1: a stale blind write is refused by the write-side check.
async fn blind_write(
    db: &PgPool,
    a: &PostgresLockManager,
    b: &PostgresLockManager,
) -> Result<String, BoxError> {
    println!("1. a blind write");
    let order = Uuid::new_v4();
    sqlx::query("INSERT INTO pglock_example_orders (id, status) VALUES ($1, 'new')")
        .bind(order)
        .execute(db)
        .await?;
    let key = format!("order:{order}");
    let a_guard = a.acquire(&key, WAIT).await?;
    let a_token = token(&a_guard);
    println!(
        "   A (token {a_token}) writes 'packed':    {}",
        verdict(set_status(db, order, a_token, "packed").await?)
    );
    kill_session_of(db, &a_guard).await?;
    let b_guard = b.acquire(&key, WAIT).await?;
    let b_token = token(&b_guard);
    println!(
        "   B (token {b_token}) writes 'cancelled': {}",
        verdict(set_status(db, order, b_token, "cancelled").await?)
    );
    println!(
        "   A (token {a_token}) writes 'shipped':   {}",
        verdict(set_status(db, order, a_token, "shipped").await?)
    );
    let status: String =
        sqlx::query_scalar("SELECT status FROM pglock_example_orders WHERE id = $1")
            .bind(order)
            .fetch_one(db)
            .await?;
    println!("   the order is '{status}'");
    // A does learn it: the loss is reported within the probe interval.
    let cause = tokio::time::timeout(Duration::from_secs(5), a_guard.loss_signal().lost()).await?;
    println!("   A is told its lock was lost: {cause}");
    b_guard.release().await?;
    sqlx::query("DELETE FROM pglock_example_orders WHERE id = $1")
        .bind(order)
        .execute(db)
        .await?;
    Ok(status)
}

/// The write-side check: accept the write only if its token is at least the highest one seen
/// (the same holder may write several times with its own token).
async fn set_status(
    db: &PgPool,
    order: Uuid,
    token: i64,
    status: &str,
) -> Result<bool, sqlx::Error> {
    let updated = sqlx::query(
        "UPDATE pglock_example_orders SET status = $3, fence = $2 \
         WHERE id = $1 AND (fence IS NULL OR fence <= $2)",
    )
    .bind(order)
    .bind(token)
    .bind(status)
    .execute(db)
    .await?;
    Ok(updated.rows_affected() == 1)
}

/// Scene 2: both holders read the same value and both writes pass the write-side check.
/// Returns (increments accepted, final value).
async fn write_check_alone(
    db: &PgPool,
    a: &PostgresLockManager,
    b: &PostgresLockManager,
) -> Result<(i64, i64), BoxError> {
    println!("\n2. a read-modify-write, with the check on the write alone");
    let (counter, key) = new_counter(db).await?;
    let a_guard = a.acquire(&key, WAIT).await?;
    let a_read = read_counter(db, counter).await?;
    println!("   A (token {}) reads {a_read}", token(&a_guard));
    kill_session_of(db, &a_guard).await?;
    let b_guard = b.acquire(&key, WAIT).await?;
    let b_read = read_counter(db, counter).await?;
    println!("   B (token {}) reads {b_read}", token(&b_guard));
    let mut accepted = 0;
    for (name, guard, read) in [("A", &a_guard, a_read), ("B", &b_guard, b_read)] {
        let ok = sqlx::query(
            "UPDATE pglock_example_counters SET value = $3, fence = $2 \
             WHERE id = $1 AND (fence IS NULL OR fence <= $2)",
        )
        .bind(counter)
        .bind(token(guard))
        .bind(read + 1)
        .execute(db)
        .await?
        .rows_affected()
            == 1;
        accepted += i64::from(ok);
        println!("   {name} writes {}:  {}", read + 1, verdict(ok));
    }
    let value = read_counter(db, counter).await?;
    println!("   {accepted} increments accepted, the counter is {value}: an update was lost");
    finish(db, counter, a_guard, b_guard).await?;
    Ok((accepted, value))
}

/// Scene 3: the fence is raised before the read, so the stale holder's write is refused.
/// Returns (increments accepted, final value).
async fn raise_before_read(
    db: &PgPool,
    a: &PostgresLockManager,
    b: &PostgresLockManager,
) -> Result<(i64, i64), BoxError> {
    println!("\n3. the same read-modify-write, with the fence raised before the read");
    let counters =
        RowFence::new("pglock_example_counters", "id", "fence")?.returning(&["value"])?;
    let (counter, key) = new_counter(db).await?;
    let a_guard = a.acquire(&key, WAIT).await?;
    let (a_read,): (i64,) = counters.raise(db, counter, token(&a_guard)).await?;
    println!(
        "   A (token {}) raises the fence and reads {a_read}",
        token(&a_guard)
    );
    kill_session_of(db, &a_guard).await?;
    let b_guard = b.acquire(&key, WAIT).await?;
    let (b_read,): (i64,) = counters.raise(db, counter, token(&b_guard)).await?;
    println!(
        "   B (token {}) raises the fence and reads {b_read}",
        token(&b_guard)
    );
    let mut accepted = 0;
    for (name, guard, read) in [("A", &a_guard, a_read), ("B", &b_guard, b_read)] {
        let written = counters
            .write(db, counter, token(guard), "value", read + 1)
            .await;
        let ok = match written {
            Ok(()) => true,
            Err(FenceError::StaleToken { .. }) => false,
            Err(other) => return Err(other.into()),
        };
        accepted += i64::from(ok);
        println!("   {name} writes {}:  {}", read + 1, verdict(ok));
    }
    let value = read_counter(db, counter).await?;
    println!("   {accepted} increment accepted, the counter is {value}");
    finish(db, counter, a_guard, b_guard).await?;
    Ok((accepted, value))
}

async fn new_counter(db: &PgPool) -> Result<(Uuid, String), sqlx::Error> {
    let counter = Uuid::new_v4();
    sqlx::query("INSERT INTO pglock_example_counters (id, value) VALUES ($1, 0)")
        .bind(counter)
        .execute(db)
        .await?;
    Ok((counter, format!("counter:{counter}")))
}

async fn read_counter(db: &PgPool, counter: Uuid) -> Result<i64, sqlx::Error> {
    sqlx::query_scalar("SELECT value FROM pglock_example_counters WHERE id = $1")
        .bind(counter)
        .fetch_one(db)
        .await
}

/// A's guard reports its loss on release; B releases normally; the counter row goes.
async fn finish(db: &PgPool, counter: Uuid, a: LockGuard, b: LockGuard) -> Result<(), BoxError> {
    let _stale = a.release().await;
    b.release().await?;
    sqlx::query("DELETE FROM pglock_example_counters WHERE id = $1")
        .bind(counter)
        .execute(db)
        .await?;
    Ok(())
}

/// Something kills the holder's session: a failover, an administrator, an idle timeout. The
/// server frees the lock at once; the holder hears of it only at its next probe.
async fn kill_session_of(db: &PgPool, guard: &LockGuard) -> Result<(), sqlx::Error> {
    let (classid, objid) = pglock::split_lock_id(guard.info().lock_id);
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' \
         AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND granted",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .execute(db)
    .await?;
    println!("   -- A's session is terminated; the server hands the lock to B --");
    Ok(())
}

fn token(guard: &LockGuard) -> i64 {
    guard.info().fencing_token.expect("fencing is on")
}

fn verdict(accepted: bool) -> &'static str {
    if accepted {
        "accepted"
    } else {
        "REFUSED (stale token)"
    }
}

async fn worker(url: &str, name: &str) -> Result<PostgresLockManager, sqlx::Error> {
    Ok(PostgresLockManager::builder(connect(url).await?)
        .holder_id(name)
        .fencing(FencingTable::default())
        // A has not noticed the kill when it writes: it checks only every 200 ms.
        .probe_interval(Duration::from_millis(200))
        .build())
}

async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new().max_connections(3).connect(url).await
}
