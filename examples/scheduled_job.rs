//! A job that every replica schedules, run once per window across all of them.
//!
//! Three replicas (each its own pool and lock manager, as three processes would have) tick on
//! timers that fire at slightly different moments, as real timers do. The job takes a few
//! milliseconds, so a replica whose timer fires late would run it again if it merely took a
//! lock and skipped when busy: by then the first run is long over. `ScheduledJob` records each
//! window's run in PostgreSQL, so the late replicas find the window done (`AlreadyRan`).
//!
//! ```text
//! cargo run --example scheduled_job
//! DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --example scheduled_job
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use pglock::schedule::{JobTable, PostgresJobStore, RunOutcome, ScheduledJob};
use pglock::{LockManager, PostgresLockManager};
use sqlx::postgres::PgPoolOptions;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REPLICAS: u64 = 3;
const PERIOD: Duration = Duration::from_secs(2);
const WINDOWS: usize = 3;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // `DATABASE_URL` if set, otherwise a throwaway server (this blocks while it starts).
    let url = pglock_testing::database_url();
    // A table of this run's own, so runs of the example never see each other's windows.
    let name = format!("pglock_example_jobs_{}", Uuid::new_v4().simple());
    let table = JobTable::new(&name)?;
    let mut replicas = Vec::new();
    for replica in 0..REPLICAS {
        let pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
        let locks: Arc<dyn LockManager> = Arc::new(
            PostgresLockManager::builder(pool.clone())
                .holder_id(format!("replica-{replica}"))
                .build(),
        );
        let store = Arc::new(PostgresJobStore::with_table(pool, table.clone()));
        let job = ScheduledJob::builder(locks, store, "nightly-report", PERIOD).build()?;
        replicas.push(tokio::spawn(tick(replica, job)));
    }
    let mut runs: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for replica in replicas {
        for (window, ran_by) in replica.await?? {
            runs.entry(window).or_default().push(ran_by);
        }
    }
    for (window, ran_by) in &runs {
        println!("window {window}: run by replica {ran_by:?}");
    }
    assert!(
        runs.values().all(|ran_by| ran_by.len() == 1),
        "a window ran twice: {runs:?}"
    );
    println!("every window ran exactly once across {REPLICAS} replicas");
    let db = PgPoolOptions::new().max_connections(1).connect(url).await?;
    sqlx::query(sqlx::AssertSqlSafe(format!("DROP TABLE {name}")))
        .execute(&db)
        .await?;
    Ok(())
}

/// One replica's schedule: at each window's start, plus its own timer's lateness, asks to
/// run. Returns the windows it ran.
async fn tick(replica: u64, job: ScheduledJob) -> Result<Vec<(String, u64)>, BoxError> {
    let late = Duration::from_millis(40 * replica);
    let mut ran = Vec::new();
    for _ in 0..WINDOWS {
        tokio::time::sleep(job.until_next_window().await? + late).await;
        let outcome = job
            .run(|_run| async { tokio::time::sleep(Duration::from_millis(5)).await })
            .await?;
        match outcome {
            RunOutcome::Ran { run, .. } => {
                println!("replica {replica} ran the window of {}", run.window_start);
                ran.push((run.window_start.to_string(), replica));
            }
            RunOutcome::Skipped { reason, .. } => {
                println!("replica {replica} skipped: {}", reason.as_str());
            }
            _ => {}
        }
    }
    Ok(ran)
}
