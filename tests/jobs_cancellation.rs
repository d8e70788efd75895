//! `ScheduledJob::run` cancelled at each of its await points leaves no advisory lock, no busy
//! or dirty pooled connection, and a job record that lets the job run again: at once, or (for
//! a claim statement that was in flight) once the claim's max hold has passed.
//!
//! Statements are held at their await points for real: another transaction locks the table (or
//! the table-creation lock), the server makes the job's statement wait, and the run is dropped
//! while `pg_stat_activity` shows it waiting. The lock manager's own await points are reached
//! with its stage hooks.

mod common;

use common::hooked::BuildHooked;

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use common::jobs::{db_now, job_name, private_table, row, until_db_time};
use common::{app_name, assert_pool_clean, eventually, observer, pool_named, within};
use pglock::schedule::{JobTable, RunOutcome, ScheduledJob};
use pglock::{PostgresLockManager, lock_id};
use pglock_testing::{Pause, Stage, pause_at};
use sqlx::{Connection, PgConnection, PgPool};

/// Long enough that no claim in these tests ends by expiring, except where a test says so.
const MAX_HOLD: Duration = Duration::from_secs(60);

struct Harness {
    app: String,
    observer: PgPool,
    table_name: String,
    name: String,
    job: ScheduledJob,
    locks: PostgresLockManager,
}

impl Harness {
    async fn new(label: &str, stage: Option<Stage>) -> (Harness, Option<Pause>) {
        Harness::with_max_hold(label, stage, MAX_HOLD).await
    }

    async fn with_max_hold(
        label: &str,
        stage: Option<Stage>,
        max_hold: Duration,
    ) -> (Harness, Option<Pause>) {
        let app = app_name(label);
        let builder = common::manager_for(pool_named(3, &app).await, &app);
        let (locks, pause) = match stage {
            Some(stage) => {
                let (hook, pause) = pause_at(stage);
                (builder.build_with_stage_hook(hook), Some(pause))
            }
            None => (builder.build(), None),
        };
        let (table_name, table) = private_table();
        let name = job_name(label);
        let job = job_on(&locks, table, &name, max_hold);
        let harness = Harness {
            app,
            observer: observer().await,
            table_name,
            name,
            job,
            locks,
        };
        (harness, pause)
    }

    /// A connection outside the code under test, with a transaction open.
    async fn blocker(&self) -> PgConnection {
        let mut conn = PgConnection::connect(common::url()).await.expect("connect");
        sqlx::raw_sql("BEGIN")
            .execute(&mut conn)
            .await
            .expect("begin");
        conn
    }

    async fn lock_table(&self, mode: &str) -> PgConnection {
        self.job.prepare().await.expect("table");
        let mut conn = self.blocker().await;
        let table = JobTable::new(&self.table_name).unwrap();
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "LOCK TABLE {table} IN {mode} MODE"
        )))
        .execute(&mut conn)
        .await
        .expect("lock the table");
        conn
    }

    /// True while a session of the job's pool waits for a lock in a statement containing
    /// `text`.
    async fn waits_in(&self, text: &str) -> bool {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name IN ($1, left('pglock:' || $1, 63)) \
             AND wait_event_type = 'Lock' AND strpos(query, $2) > 0",
        )
        .bind(&self.app)
        .bind(text)
        .fetch_one(&self.observer)
        .await
        .expect("pg_stat_activity");
        waiting > 0
    }

    /// Nothing is left behind, and the job can run: it runs the window again.
    async fn assert_clean_and_runnable(&self) {
        assert_pool_clean(&self.observer, &self.app).await;
        assert!(!self.locks.is_held(self.job.lock_key().clone()).await);
        eventually("the job's lock is free", || async {
            common::lock_rows(&self.observer, self.job.lock_key().target().packed())
                .await
                .is_empty()
        })
        .await;
        let outcome = self
            .job
            .run(|run| async move { run.run })
            .await
            .expect("run");
        assert!(outcome.ran(), "{:?}", outcome.skipped());
        assert_pool_clean(&self.observer, &self.app).await;
    }
}

fn job_on(
    locks: &PostgresLockManager,
    table: JobTable,
    name: &str,
    max_hold: Duration,
) -> ScheduledJob {
    common::jobs::pg_job(locks, &table, name, Duration::from_secs(3600))
        .min_hold(Duration::ZERO)
        .max_hold(max_hold)
        .build()
        .expect("valid")
}

/// Polls `run` until `reached` is true, then drops it there.
async fn drop_when<F, C, Fut>(run: F, mut reached: C)
where
    F: Future,
    F::Output: std::fmt::Debug,
    C: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let mut run = pin!(run);
    let bound = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        tokio::select! {
            output = &mut run => panic!("finished ({output:?}) before the await point"),
            () = tokio::time::sleep(Duration::from_millis(10)) => {}
        }
        if reached().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < bound,
            "never reached the await point"
        );
    }
}

async fn drop_when_parked<F: Future>(run: F, pause: &Pause)
where
    F::Output: std::fmt::Debug,
{
    tokio::select! {
        biased;
        () = pause.reached() => {}
        output = run => panic!("finished ({output:?}) without parking"),
    }
}

#[tokio::test]
async fn cancelled_while_creating_the_table() {
    let (h, _) = Harness::new("job-cancel-setup", None).await;
    let mut blocker = h.blocker().await;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_id("pglock:job-table-setup"))
        .execute(&mut blocker)
        .await
        .expect("hold the creation lock");
    drop_when(h.job.run(|_| async {}), || h.waits_in("CREATE TABLE")).await;
    blocker.close().await.expect("end the transaction");
    h.assert_clean_and_runnable().await;
}

#[tokio::test]
async fn cancelled_while_reading_the_record() {
    let (h, _) = Harness::new("job-cancel-read", None).await;
    let blocker = h.lock_table("ACCESS EXCLUSIVE").await;
    drop_when(h.job.run(|_| async {}), || h.waits_in("LEFT JOIN")).await;
    blocker.close().await.expect("end the transaction");
    assert_eq!(row(&h.observer, &h.table_name, &h.name).await, None);
    h.assert_clean_and_runnable().await;
}

#[tokio::test]
async fn cancelled_while_taking_the_job_lock() {
    let (h, pause) = Harness::new("job-cancel-lock", Some(Stage::Server)).await;
    drop_when_parked(h.job.run(|_| async {}), pause.as_ref().unwrap()).await;
    assert_eq!(row(&h.observer, &h.table_name, &h.name).await, None);
    h.assert_clean_and_runnable().await;
}

#[tokio::test]
async fn cancelled_while_claiming_the_window() {
    let max_hold = Duration::from_secs(1);
    let (h, _) = Harness::with_max_hold("job-cancel-claim", None, max_hold).await;
    // EXCLUSIVE lets the record be read, and makes the claim wait.
    let blocker = h.lock_table("EXCLUSIVE").await;
    drop_when(h.job.run(|_| async {}), || h.waits_in("claimed AS")).await;
    blocker.close().await.expect("end the transaction");
    // The claim was on its way: it may land with no one to run it. Then it holds the job
    // until its max hold, like a crashed runner's.
    assert_pool_clean(&h.observer, &h.app).await;
    if let Some(ghost) = row(&h.observer, &h.table_name, &h.name).await {
        assert_eq!(ghost.finished_at, None);
        let max_hold = chrono::Duration::from_std(max_hold).unwrap();
        assert_eq!(ghost.hold_until, ghost.claimed_at + max_hold);
        let outcome = h.job.run(|_| async {}).await.expect("run");
        assert!(!outcome.ran(), "the claim holds until its max hold");
        until_db_time(&h.observer, ghost.hold_until).await;
    }
    h.assert_clean_and_runnable().await;
}

#[tokio::test]
async fn cancelled_while_the_body_runs() {
    let (h, _) = Harness::new("job-cancel-body", None).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let run = h.job.run(|_| async move {
        let _ = started_tx.send(());
        std::future::pending::<()>().await
    });
    tokio::select! {
        output = run => panic!("finished: {output:?}"),
        started = within("the body to start", started_rx) => started.expect("the body started"),
    }
    // The claim is given up in the background: the window may run again right away.
    eventually("the dropped run's claim is given up", || async {
        let record = row(&h.observer, &h.table_name, &h.name)
            .await
            .expect("claimed");
        record.finished_at.is_none() && record.hold_until <= db_now(&h.observer).await
    })
    .await;
    h.assert_clean_and_runnable().await;
}

#[tokio::test]
async fn cancelled_while_recording_the_end() {
    let (h, _) = Harness::new("job-cancel-finish", None).await;
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (finish_tx, finish_rx) = tokio::sync::oneshot::channel::<()>();
    // Boxed, so handing it to `drop_when` hands over the future itself, to be dropped there.
    let mut run = Box::pin(h.job.run(|_| async move {
        let _ = started_tx.send(());
        let _ = finish_rx.await;
    }));
    tokio::select! {
        output = &mut run => panic!("finished: {output:?}"),
        started = within("the body to start", started_rx) => started.expect("the body started"),
    }
    let blocker = h.lock_table("EXCLUSIVE").await;
    finish_tx.send(()).expect("let the body end");
    drop_when(run, || h.waits_in("finished_at = pg_catalog.now()")).await;
    blocker.close().await.expect("end the transaction");
    // Either the end was recorded, or the claim was given up; never held to the max hold.
    eventually("the record is finished or given up", || async {
        let record = row(&h.observer, &h.table_name, &h.name)
            .await
            .expect("claimed");
        record.finished_at.is_some() || record.hold_until <= db_now(&h.observer).await
    })
    .await;
    assert_pool_clean(&h.observer, &h.app).await;
    eventually("the job's lock is free", || async {
        common::lock_rows(&h.observer, h.job.lock_key().target().packed())
            .await
            .is_empty()
    })
    .await;
}

#[tokio::test]
async fn cancelled_while_releasing_the_job_lock() {
    let (h, pause) = Harness::new("job-cancel-release", Some(Stage::Unlock)).await;
    drop_when_parked(h.job.run(|_| async {}), pause.as_ref().unwrap()).await;
    let record = row(&h.observer, &h.table_name, &h.name)
        .await
        .expect("claimed");
    assert!(
        record.finished_at.is_some(),
        "the run was recorded before the release"
    );
    assert_pool_clean(&h.observer, &h.app).await;
    eventually("the job's lock is free", || async {
        common::lock_rows(&h.observer, h.job.lock_key().target().packed())
            .await
            .is_empty()
    })
    .await;
    let outcome = h.job.run(|_| async {}).await.expect("run");
    assert!(
        matches!(outcome, RunOutcome::Skipped { .. }),
        "the window is done"
    );
}
