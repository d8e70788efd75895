//! Helpers for the scheduled-job tests: private tables, the database's clock, the job's row as
//! the table holds it.

use std::time::Duration;

use std::sync::Arc;

use chrono::{DateTime, Utc};
use pglock::schedule::{
    InMemoryJobStore, JobRecord, JobStore, JobTable, PostgresJobStore, ScheduledJob,
    ScheduledJobBuilder,
};
use pglock::{InMemoryLockManager, InMemoryLockServer, LockManager, PostgresLockManager};
use sqlx::PgPool;

/// A scheduled job on `locks`, recorded in `table` of the manager's own database.
pub fn pg_job(
    locks: &PostgresLockManager,
    table: &JobTable,
    name: impl Into<String>,
    period: Duration,
) -> ScheduledJobBuilder {
    let store = PostgresJobStore::with_table(locks.pool().clone(), table.clone());
    ScheduledJob::builder(Arc::new(locks.clone()), Arc::new(store), name, period)
}

/// A job table no other test uses: its name, and the table for builders.
pub fn private_table() -> (String, JobTable) {
    let name = format!(
        "pglock_test_jobs_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    let table = JobTable::new(&name).expect("a valid name");
    (name, table)
}

/// A job name no other test uses.
pub fn job_name(label: &str) -> String {
    format!(
        "{label}-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    )
}

/// The database's clock.
pub async fn db_now(pool: &PgPool) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(pool)
        .await
        .expect("read the clock")
}

/// Waits until the database's clock reads `at` or later (at most 15 s past the call).
pub async fn until_db_time(pool: &PgPool, at: DateTime<Utc>) {
    let bound = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let now = db_now(pool).await;
        if now >= at {
            return;
        }
        assert!(
            tokio::time::Instant::now() < bound,
            "the database's clock never reached {at}"
        );
        let left = (at - now).to_std().unwrap_or_default();
        tokio::time::sleep(left.min(Duration::from_millis(50))).await;
    }
}

/// The offset that makes a window of `period` start `ahead` after `now`.
pub fn offset_for_boundary(now: DateTime<Utc>, period: Duration, ahead: Duration) -> Duration {
    let period = period.as_micros() as i64;
    let boundary = now.timestamp_micros() + ahead.as_micros() as i64;
    Duration::from_micros(boundary.rem_euclid(period) as u64)
}

/// The job's row, read straight from the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub window_start: DateTime<Utc>,
    pub runs: i64,
    pub claimed_by: Option<String>,
    pub claimed_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub hold_until: DateTime<Utc>,
}

/// The row of `job` in the table named `table`.
pub async fn row(pool: &PgPool, table: &str, job: &str) -> Option<Row> {
    let table = JobTable::new(table).expect("a valid name");
    type Tuple = (
        DateTime<Utc>,
        i64,
        Option<String>,
        DateTime<Utc>,
        Option<DateTime<Utc>>,
        DateTime<Utc>,
    );
    let row: Option<Tuple> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT window_start, runs, claimed_by, claimed_at, finished_at, hold_until \
         FROM {table} WHERE job = $1"
    )))
    .bind(job)
    .fetch_optional(pool)
    .await
    .expect("read the job's row");
    row.map(
        |(window_start, runs, claimed_by, claimed_at, finished_at, hold_until)| Row {
            window_start,
            runs,
            claimed_by,
            claimed_at,
            finished_at,
            hold_until,
        },
    )
}

/// Where the replicas of a case that runs on both backends keep their locks and their job's
/// record: memory (what a unit test of a user's job uses), or PostgreSQL.
pub enum Backend {
    Memory {
        server: InMemoryLockServer,
        store: InMemoryJobStore,
    },
    Postgres {
        table: JobTable,
    },
}

impl Backend {
    pub fn memory() -> Self {
        Backend::Memory {
            server: InMemoryLockServer::new(),
            store: InMemoryJobStore::new(),
        }
    }

    pub fn postgres() -> Self {
        Backend::Postgres {
            table: private_table().1,
        }
    }

    /// One replica: a lock manager of its own, and the shared store.
    pub async fn replica(&self) -> (Arc<dyn LockManager>, Arc<dyn JobStore>) {
        match self {
            Backend::Memory { server, store } => (
                Arc::new(InMemoryLockManager::builder().server(server).build()),
                Arc::new(store.clone()),
            ),
            Backend::Postgres { table } => {
                let pool = super::pool(3).await;
                let store = PostgresJobStore::with_table(pool.clone(), table.clone());
                (Arc::new(PostgresLockManager::new(pool)), Arc::new(store))
            }
        }
    }

    /// The job `name` on a new replica: a period of an hour, no min hold.
    pub async fn job(&self, name: &str) -> (Arc<dyn LockManager>, ScheduledJobBuilder) {
        let (locks, store) = self.replica().await;
        let hour = Duration::from_secs(3600);
        let job =
            ScheduledJob::builder(Arc::clone(&locks), store, name, hour).min_hold(Duration::ZERO);
        (locks, job)
    }

    /// The job's record, as a store of this backend reads it.
    pub async fn record(&self, job: &ScheduledJob) -> JobRecord {
        let (_, store) = self.replica().await;
        let state = store.state(job.spec()).await.expect("read the record");
        state.record.expect("the job was claimed")
    }

    /// The store's clock.
    pub async fn now(&self) -> DateTime<Utc> {
        match self {
            Backend::Memory { .. } => Utc::now(),
            Backend::Postgres { .. } => db_now(&super::observer().await).await,
        }
    }

    /// Waits until the store's clock reads `at`.
    pub async fn until(&self, at: DateTime<Utc>) {
        match self {
            Backend::Memory { .. } => {
                tokio::time::sleep((at - Utc::now()).to_std().unwrap_or_default()).await;
            }
            Backend::Postgres { .. } => until_db_time(&super::observer().await, at).await,
        }
    }
}

/// Turns each `async fn case(backend: Backend)` of the calling test file into `memory::case`
/// and `postgres::case`.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::jobs::Backend::memory()).await
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name($crate::common::jobs::Backend::postgres()).await
                }
            )*
        }
    };
}
pub(crate) use on_both;

/// A run of `job`, spawned, whose body never ends: returned once the body has started, so the
/// caller can take its lock away, abort it, or look at its claim.
pub async fn spawn_endless_run(
    job: &ScheduledJob,
) -> tokio::task::JoinHandle<pglock::schedule::Result<pglock::schedule::RunOutcome<()>>> {
    let (started_tx, started) = tokio::sync::oneshot::channel();
    let job = job.clone();
    let running = tokio::spawn(async move {
        job.run(|_| async move {
            let _ = started_tx.send(());
            std::future::pending::<()>().await
        })
        .await
    });
    super::within("the body starts", started)
        .await
        .expect("started");
    running
}
