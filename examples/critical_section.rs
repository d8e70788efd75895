//! Run the main job: a critical section that only one worker at a time may enter, across
//! replicas.
//!
//! Two "replicas" (two lock managers with their own pools and holder ids, as two processes
//! would have) each run several tasks. Every task repeatedly increments a counter row with a
//! read and then a separate write. Two workers interleaving between those statements would
//! both write the same value and lose an increment; under the lock, none is lost.
//!
//! ```text
//! cargo run --example critical_section
//! DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --example critical_section
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do.

use std::time::Duration;

use pglock::PostgresLockManager;
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REPLICAS: usize = 2;
const TASKS_PER_REPLICA: usize = 4;
const INCREMENTS_PER_TASK: i64 = 25;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // `DATABASE_URL` if set, otherwise a throwaway server (this blocks while it starts).
    let url = pglock_testing::database_url();

    // One counter row and one lock key per run, so runs never see each other's data.
    let run = Uuid::new_v4();
    let key = format!("examples:critical-section:{run}");
    let setup = connect(url).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pglock_example_counter \
         (run_id uuid PRIMARY KEY, value bigint NOT NULL)",
    )
    .execute(&setup)
    .await?;
    sqlx::query("INSERT INTO pglock_example_counter (run_id, value) VALUES ($1, 0)")
        .bind(run)
        .execute(&setup)
        .await?;

    let mut workers = JoinSet::new();
    for replica in 1..=REPLICAS {
        // Each replica has its own pool and one lock manager, with a holder id that says who
        // it is. Its pool serves both the locks and the critical section's queries.
        let pool = connect(url).await?;
        let locks = PostgresLockManager::builder(pool.clone())
            .holder_id(format!("replica-{replica}-pid-{}", std::process::id()))
            .build();
        for _ in 0..TASKS_PER_REPLICA {
            let (locks, pool, key) = (locks.clone(), pool.clone(), key.clone());
            workers.spawn(async move {
                for _ in 0..INCREMENTS_PER_TASK {
                    increment(&locks, &pool, &key, run).await?;
                }
                Ok::<(), BoxError>(())
            });
        }
    }
    while let Some(finished) = workers.join_next().await {
        finished??;
    }

    let (value,): (i64,) =
        sqlx::query_as("SELECT value FROM pglock_example_counter WHERE run_id = $1")
            .bind(run)
            .fetch_one(&setup)
            .await?;
    sqlx::query("DELETE FROM pglock_example_counter WHERE run_id = $1")
        .bind(run)
        .execute(&setup)
        .await?;

    let expected = (REPLICAS * TASKS_PER_REPLICA) as i64 * INCREMENTS_PER_TASK;
    println!("final counter: {value}");
    println!("expected:      {expected}");
    if value != expected {
        return Err(format!("{} update(s) were lost", expected - value).into());
    }
    println!("no update was lost: every read-then-write ran alone under the lock");
    Ok(())
}

/// One pass through the critical section.
async fn increment(
    locks: &PostgresLockManager,
    pool: &PgPool,
    key: &str,
    run: Uuid,
) -> Result<(), BoxError> {
    // Wait for the lock, at most 10 seconds. Holding the guard means no other worker, in
    // this process or any other, holds the key.
    let guard = locks.acquire(key, Some(Duration::from_secs(10))).await?;

    // The critical section: a read, then a separate write based on it.
    let (value,): (i64,) =
        sqlx::query_as("SELECT value FROM pglock_example_counter WHERE run_id = $1")
            .bind(run)
            .fetch_one(pool)
            .await?;
    sqlx::query("UPDATE pglock_example_counter SET value = $1 WHERE run_id = $2")
        .bind(value + 1)
        .bind(run)
        .execute(pool)
        .await?;

    // Release explicitly to learn that the server confirmed it. (If a `?` above returns
    // early, dropping the guard releases the lock in the background instead.)
    guard.release().await?;
    Ok(())
}

/// A small pool: the held lock pins one connection, the critical section's queries use another.
async fn connect(url: &str) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(4)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
}
