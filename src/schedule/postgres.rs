//! The job store in a PostgreSQL table.

use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;
use sqlx::{PgConnection, PgPool, Postgres, Row};
use tokio::sync::OnceCell;

use super::store::{Extension, JobRecord, JobSpec, JobState, JobStore, micros};
use super::{Error, JobTable, Result};
use crate::sql::errors::{INSUFFICIENT_PRIVILEGE, has_sqlstate};
use crate::sql::table::Unready;

/// A [`JobStore`] in a PostgreSQL table ([`JobTable`]): the record survives restarts of every
/// replica, and every time is the database's clock, so replicas agree on the windows whatever
/// their own clocks say.
///
/// Each claim is one statement: the row lock of `INSERT ... ON CONFLICT DO UPDATE` serialises
/// concurrent claimers, and each re-checks the rule ([`JobState::skip`]) on the latest row.
///
/// ```no_run
/// use std::sync::Arc;
/// use std::time::Duration;
/// use pglock::schedule::{PostgresJobStore, ScheduledJob};
/// use pglock::{LockManager, PostgresLockManager};
///
/// # fn run(pool: sqlx::PgPool) -> pglock::schedule::Result<()> {
/// let locks: Arc<dyn LockManager> = Arc::new(PostgresLockManager::new(pool.clone()));
/// let job = ScheduledJob::builder(
///     locks,
///     Arc::new(PostgresJobStore::new(pool)),
///     "nightly-report",
///     Duration::from_secs(24 * 3600),
/// )
/// .build()?;
/// # let _ = job; Ok(()) }
/// ```
#[derive(Debug)]
pub struct PostgresJobStore {
    pool: PgPool,
    table: JobTable,
    sql: Statements,
    /// Set once the table is known to be usable.
    ready: OnceCell<()>,
}

#[derive(Debug)]
struct Statements {
    state: String,
    claim: String,
    finish: String,
    abandon: String,
    extend: String,
}

impl PostgresJobStore {
    /// A store in the default table ([`JobTable::default`], `pglock_scheduled_jobs`) of
    /// `pool`'s database.
    pub fn new(pool: PgPool) -> Self {
        Self::with_table(pool, JobTable::default())
    }

    /// A store in `table`. Jobs with different names share a table.
    pub fn with_table(pool: PgPool, table: JobTable) -> Self {
        let sql = Statements {
            state: table.state(),
            claim: table.claim(),
            finish: table.finish(),
            abandon: table.abandon(),
            extend: table.extend(),
        };
        PostgresJobStore {
            pool,
            table,
            sql,
            ready: OnceCell::new(),
        }
    }

    /// The table the records are in.
    pub fn table(&self) -> &JobTable {
        &self.table
    }

    /// A statement with the job, period, offset and skew tolerance bound as `$1` to `$4`.
    fn bind<'q>(&self, sql: &'q str, spec: &'q JobSpec) -> Query<'q, Postgres, PgArguments> {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&spec.name)
            .bind(micros(spec.period))
            .bind(micros(spec.offset))
            .bind(micros(spec.skew_tolerance))
    }

    /// Adds the columns a table made by an earlier version lacks (see
    /// [`JobTable::upgrade_ddl`]). Adding columns takes the table's owner: any other role is
    /// told which columns are missing, as a missing privilege.
    async fn add_missing_columns(&self, conn: &mut PgConnection, spec: &JobSpec) -> Result<()> {
        let missing: Vec<String> = sqlx::query_scalar(JobTable::missing_columns())
            .bind(self.table.table().quoted())
            .fetch_one(&mut *conn)
            .await
            .map_err(storage(spec, "look up the job table's columns"))?;
        if missing.is_empty() {
            return Ok(());
        }
        let added = sqlx::raw_sql(sqlx::AssertSqlSafe(self.table.upgrade_ddl()))
            .execute(&mut *conn)
            .await;
        match added {
            Ok(_) => Ok(()),
            Err(err) if has_sqlstate(&err, INSUFFICIENT_PRIVILEGE) => {
                Err(Error::PermissionDenied {
                    job: spec.name.clone(),
                    object: format!(
                        "table {}, to add its missing columns {} (JobTable::upgrade_ddl)",
                        self.table,
                        missing.join(", ")
                    ),
                    privilege: "ownership".to_owned(),
                })
            }
            Err(err) => Err(storage(spec, "add the job table's new columns")(err)),
        }
    }

    /// Runs the finish or abandon statement for `run`; returns whether it changed the record.
    async fn settle(
        &self,
        sql: &str,
        spec: &JobSpec,
        run: i64,
        what: &'static str,
    ) -> Result<bool> {
        let done = sqlx::query(sqlx::AssertSqlSafe(sql))
            .bind(&spec.name)
            .bind(run)
            .bind(micros(spec.min_hold))
            .execute(&self.pool)
            .await
            .map_err(storage(spec, what))?;
        Ok(done.rows_affected() > 0)
    }
}

#[async_trait]
impl JobStore for PostgresJobStore {
    async fn prepare(&self, spec: &JobSpec) -> Result<()> {
        self.ready
            .get_or_try_init(|| async {
                let mut conn = self
                    .pool
                    .acquire()
                    .await
                    .map_err(storage(spec, "look up the job table"))?;
                let prepared = (self.table.table())
                    .prepare(&mut conn, &self.table.ddl(), "pglock:job-table-setup")
                    .await;
                match prepared {
                    Ok(()) => self.add_missing_columns(&mut conn, spec).await,
                    Err(Unready::Denied { object, privilege }) => Err(Error::PermissionDenied {
                        job: spec.name.clone(),
                        object,
                        privilege,
                    }),
                    Err(Unready::Failed(source)) => {
                        // A failure inside the creating transaction would leave it aborted.
                        conn.close_on_drop();
                        Err(storage(spec, "create the job table")(source))
                    }
                }
            })
            .await
            .map(|_| ())
    }

    async fn state(&self, spec: &JobSpec) -> Result<JobState> {
        let failed = storage(spec, "read the job's record");
        let row = self
            .bind(&self.sql.state, spec)
            .fetch_one(&self.pool)
            .await
            .map_err(failed)?;
        state(&row).map_err(failed)
    }

    async fn claim(
        &self,
        spec: &JobSpec,
        holder_id: &str,
    ) -> Result<std::result::Result<JobRecord, JobState>> {
        let failed = storage(spec, "claim a window");
        let row = self
            .bind(&self.sql.claim, spec)
            .bind(micros(spec.max_hold))
            .bind(holder_id)
            .fetch_one(&self.pool)
            .await
            .map_err(failed)?;
        let claimed: bool = row.try_get("claimed").map_err(failed)?;
        let state = state(&row).map_err(failed)?;
        match state.record {
            Some(record) if claimed => Ok(Ok(record)),
            _ => Ok(Err(state)),
        }
    }

    async fn finish(&self, spec: &JobSpec, run: i64) -> Result<bool> {
        self.settle(&self.sql.finish, spec, run, "record a finished run")
            .await
    }

    async fn abandon(&self, spec: &JobSpec, run: i64) -> Result<()> {
        self.settle(&self.sql.abandon, spec, run, "give a run up")
            .await
            .map(drop)
    }

    async fn extend(&self, spec: &JobSpec, run: i64, by: Duration) -> Result<Option<Extension>> {
        let failed = storage(spec, "extend a run's hold");
        let row = sqlx::query(sqlx::AssertSqlSafe(self.sql.extend.as_str()))
            .bind(&spec.name)
            .bind(run)
            .bind(micros(by))
            .bind(micros(spec.max_total_hold))
            .fetch_optional(&self.pool)
            .await
            .map_err(failed)?;
        row.map(|row| {
            Ok(Extension {
                hold_until: row.try_get("hold_until")?,
                capped: row.try_get("capped")?,
            })
        })
        .transpose()
        .map_err(failed)
    }

    async fn until_next_window(&self, spec: &JobSpec) -> Result<Duration> {
        let micros: i64 = sqlx::query_scalar(JobTable::until_next_window())
            .bind(micros(spec.period))
            .bind(micros(spec.offset))
            .fetch_one(&self.pool)
            .await
            .map_err(storage(spec, "read the database's clock"))?;
        Ok(Duration::from_micros(micros.max(0).unsigned_abs()))
    }
}

/// The job's record as a statement returned it, next to the database's clock.
fn state(row: &PgRow) -> std::result::Result<JobState, sqlx::Error> {
    let window_start: Option<DateTime<Utc>> = row.try_get("window_start")?;
    let record = match window_start {
        None => None,
        Some(window_start) => Some(
            JobRecord::new(
                window_start,
                row.try_get("runs")?,
                row.try_get("claimed_by")?,
                row.try_get("claimed_at")?,
                row.try_get("finished_at")?,
                row.try_get("hold_until")?,
            )
            .extended(row.try_get("extensions")?, row.try_get("extended_at")?),
        ),
    };
    Ok(JobState {
        now: row.try_get("now")?,
        current_window: row.try_get("current_window")?,
        record,
    })
}

/// The storage error of `spec`'s job while it did `operation`.
fn storage<'a>(
    spec: &'a JobSpec,
    operation: &'static str,
) -> impl Fn(sqlx::Error) -> Error + Copy + 'a {
    move |source| Error::Storage {
        job: spec.name.clone(),
        operation,
        source: Box::new(source),
    }
}
