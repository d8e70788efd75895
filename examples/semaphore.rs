//! At most two exports at once across the fleet: a semaphore of two permits.
//!
//! Three "replicas" (three lock managers with their own pools and holder ids, as three
//! processes would have) each start four export jobs. Every job waits for a permit, runs,
//! and gives the permit back; never more than two run at once. Each permit carries its slot's
//! fencing token, which grows with every permit on that slot.
//!
//! ```text
//! cargo run --example semaphore
//! DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --example semaphore
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use pglock::semaphore::Semaphore;
use pglock::{FencingTable, LockManager, PostgresLockManager};
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REPLICAS: usize = 3;
const JOBS_PER_REPLICA: usize = 4;
const PERMITS: usize = 2;

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // `DATABASE_URL` if set, otherwise a throwaway server (this blocks while it starts).
    let url = pglock_testing::database_url();
    // One semaphore name per run, so runs never see each other's permits.
    let name = format!("exports-{}", uuid::Uuid::new_v4().simple());

    let running = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut jobs = JoinSet::new();
    for replica in 1..=REPLICAS {
        let pool = PgPoolOptions::new().max_connections(4).connect(url).await?;
        let locks: Arc<dyn LockManager> = Arc::new(
            PostgresLockManager::builder(pool)
                .holder_id(format!("replica-{replica}"))
                .fencing(FencingTable::default())
                .build(),
        );
        // Every replica names the same semaphore with the same number of permits.
        let exports = Semaphore::builder(locks, name.as_str(), PERMITS).build()?;
        for job in 1..=JOBS_PER_REPLICA {
            let (exports, running, most) = (exports.clone(), running.clone(), most.clone());
            jobs.spawn(async move {
                let permit = exports.acquire(Some(Duration::from_secs(30))).await?;
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                println!(
                    "replica {replica} job {job}: exporting on slot {} (token {}), {now} running",
                    permit.slot(),
                    permit.info().fencing_token.unwrap_or_default(),
                );
                // The export; `run` would cancel it if the permit's slot were lost.
                permit
                    .run(tokio::time::sleep(Duration::from_millis(100)))
                    .await?;
                running.fetch_sub(1, Ordering::SeqCst);
                permit.release().await?;
                Ok::<_, BoxError>(())
            });
        }
    }
    while let Some(job) = jobs.join_next().await {
        job??;
    }
    let most = most.load(Ordering::SeqCst);
    println!(
        "{} exports ran, at most {most} at once (permits: {PERMITS})",
        REPLICAS * JOBS_PER_REPLICA
    );
    assert!(most <= PERMITS);
    Ok(())
}
