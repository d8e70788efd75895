//! `pglock::schedule` against a real PostgreSQL, in one process: windows, the skew tolerance,
//! the min and max hold, the record surviving a new manager, the job's lock, and what the
//! table holds after each.

mod common;

use common::hooked::BuildHooked;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::jobs::{
    db_now, job_name, offset_for_boundary, pg_job, private_table, row, until_db_time,
};
use common::{app_name, assert_pool_clean, observer, pool_named};
use pglock::schedule::Error;
use pglock::schedule::{JobTable, RunOutcome, ScheduledJob, ScheduledJobBuilder, Skip};
use pglock::{PostgresLockManager, lock_id};
use pglock_testing::{Stage, pause_at};

const HOUR: Duration = Duration::from_secs(3600);

async fn manager(label: &str) -> (PostgresLockManager, String) {
    let app = app_name(label);
    let locks = common::manager_for(pool_named(3, &app).await, &app).build();
    (locks, app)
}

fn job(locks: &PostgresLockManager, table: &JobTable, name: &str) -> ScheduledJobBuilder {
    pg_job(locks, table, name, HOUR)
}

fn ran<T>(outcome: RunOutcome<T>) -> (pglock::schedule::JobRun, T) {
    match outcome {
        RunOutcome::Ran { run, value } => (run, value),
        other => panic!("expected a run, got {:?}", other.skipped()),
    }
}

fn skip<T>(outcome: RunOutcome<T>) -> Skip {
    match outcome {
        RunOutcome::Skipped { reason, .. } => reason,
        RunOutcome::Ran { run, .. } => panic!("expected a skip, it ran {run:?}"),
        _ => unreachable!(),
    }
}

#[tokio::test]
async fn a_window_runs_once_and_the_record_survives_a_new_manager() {
    let observer = observer().await;
    let (table_name, table) = private_table();
    let name = job_name("restart");
    let (first, first_app) = manager("job-first").await;
    let job_a = job(&first, &table, &name).build().expect("valid");

    let (run, value) = ran(job_a
        .run(|run| async move { run.run * 10 })
        .await
        .expect("run"));
    assert_eq!((run.run, value), (1, 10));
    assert_eq!(run.job, name);
    assert_eq!(run.holder_id.as_deref(), Some(first_app.as_str()));
    assert_eq!(
        run.window_end - run.window_start,
        chrono::Duration::hours(1)
    );
    let now = db_now(&observer).await;
    assert!(
        run.window_start <= now && now < run.window_end,
        "{run:?} at {now}"
    );
    let stored = row(&observer, &table_name, &name).await.expect("recorded");
    assert_eq!(stored.window_start, run.window_start);
    assert_eq!((stored.runs, stored.claimed_at), (1, run.started_at));
    assert!(stored.finished_at.is_some());
    // Default min hold: half the period after the start.
    assert_eq!(
        stored.hold_until,
        run.started_at + chrono::Duration::minutes(30)
    );

    // The same manager, again: the window is done.
    let again = job_a.run(|_| async { unreachable!("already ran") }).await;
    assert!(matches!(
        skip(again.expect("run")),
        Skip::AlreadyRan { run: 1, .. }
    ));

    // A new manager on a new pool, as after a restart: the record is in the database.
    first.release_all().await.expect("release");
    drop((job_a, first));
    let (second, _) = manager("job-second").await;
    let job_b = job(&second, &table, &name).build().expect("valid");
    let outcome = job_b.run(|_| async { unreachable!("already ran") }).await;
    match skip(outcome.expect("run")) {
        Skip::AlreadyRan {
            run,
            by,
            finished_at,
        } => {
            assert_eq!(run, 1);
            assert_eq!(by.as_deref(), Some(first_app.as_str()));
            assert_eq!(Some(finished_at), stored.finished_at);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(row(&observer, &table_name, &name).await, Some(stored));
    assert_pool_clean(&observer, &first_app).await;
}

#[tokio::test]
async fn a_claim_just_before_a_window_counts_for_it_within_the_skew_tolerance() {
    let observer = observer().await;
    let (_, table) = private_table();
    let (locks, _) = manager("job-skew").await;
    let period = Duration::from_secs(60);
    let now = db_now(&observer).await;
    // The next window starts 4 s from now; the tolerance is 8 s.
    let offset = offset_for_boundary(now, period, Duration::from_secs(4));
    let boundary = now + chrono::Duration::seconds(4);
    let early = pg_job(&locks, &table, job_name("early"), period)
        .offset(offset)
        .skew_tolerance(Duration::from_secs(8))
        .build()
        .expect("valid");
    let (run, ()) = ran(early.run(|_| async {}).await.expect("run"));
    assert_eq!(
        run.window_start, boundary,
        "the coming window, not the current one"
    );

    // Without the tolerance, the same moment belongs to the current window.
    let strict = pg_job(&locks, &table, job_name("strict"), period)
        .offset(offset)
        .skew_tolerance(Duration::ZERO)
        .build()
        .expect("valid");
    let (run, ()) = ran(strict.run(|_| async {}).await.expect("run"));
    assert!(run.window_start < boundary, "{run:?}");
    assert!(db_now(&observer).await < boundary, "the test ran late");
}

#[tokio::test]
async fn the_min_hold_keeps_the_next_window_from_running_right_after_a_late_run() {
    let observer = observer().await;
    let (table_name, table) = private_table();
    let (locks, _) = manager("job-min-hold").await;
    let name = job_name("min-hold");
    let now = db_now(&observer).await;
    let offset = offset_for_boundary(now, HOUR, Duration::from_secs(1));
    let boundary = now + chrono::Duration::seconds(1);
    let min_hold = Duration::from_millis(2500);
    let job = job(&locks, &table, &name)
        .offset(offset)
        .skew_tolerance(Duration::ZERO)
        .min_hold(min_hold)
        .max_hold(Duration::from_secs(10))
        .build()
        .expect("valid");

    // A replica running the closing window just before the boundary, in 0 ms...
    let (first, ()) = ran(job.run(|_| async {}).await.expect("run"));
    assert!(first.window_start < boundary);
    let hold_end = first.started_at + chrono::Duration::milliseconds(2500);
    assert_eq!(
        row(&observer, &table_name, &name).await.unwrap().hold_until,
        hold_end
    );

    // ...keeps a punctual replica from running the next window a moment later.
    until_db_time(&observer, boundary).await;
    let outcome = job
        .run(|_| async { unreachable!("too soon") })
        .await
        .expect("run");
    let RunOutcome::Skipped {
        window_start,
        reason,
    } = outcome
    else {
        panic!("ran too soon")
    };
    assert_eq!(window_start, boundary);
    assert_eq!(
        reason,
        Skip::TooSoon {
            run: 1,
            until: hold_end
        }
    );

    until_db_time(&observer, hold_end).await;
    let (second, ()) = ran(job.run(|_| async {}).await.expect("run"));
    assert_eq!((second.window_start, second.run), (boundary, 2));
    assert!(second.started_at >= hold_end);
}

#[tokio::test]
async fn a_check_that_passed_before_another_run_does_not_run_the_window_again() {
    let (_, table) = private_table();
    let name = job_name("race");
    let (hook, pause) = pause_at(Stage::Server);
    let app = app_name("job-late");
    let late_locks =
        common::manager_for(pool_named(3, &app).await, &app).build_with_stage_hook(hook);
    let late = job(&late_locks, &table, &name)
        .min_hold(Duration::ZERO)
        .build()
        .expect("valid");
    let (locks, _) = manager("job-early").await;
    let early = job(&locks, &table, &name)
        .min_hold(Duration::ZERO)
        .build()
        .expect("valid");
    early.prepare().await.expect("table");

    // The late replica finds the window free, then stops before asking for the job's lock.
    let late_run = tokio::spawn(async move { late.run(|_| async { "late" }).await });
    tokio::time::timeout(Duration::from_secs(10), pause.reached())
        .await
        .expect("the late replica reaches the lock");
    // Meanwhile the early one runs the window to completion and lets the lock go.
    let (run, _) = ran(early.run(|_| async { "early" }).await.expect("run"));
    pause.resume();
    let outcome = tokio::time::timeout(Duration::from_secs(10), late_run)
        .await
        .expect("the late replica finishes")
        .expect("join")
        .expect("run");
    assert!(
        matches!(skip(outcome), Skip::AlreadyRan { run: 1, .. }),
        "the claim itself refuses a window done since the check"
    );
    assert_eq!(run.run, 1);
}

#[tokio::test]
async fn a_body_that_outlives_the_max_hold_is_cut_off_and_the_window_stays_open() {
    let observer = observer().await;
    let (table_name, table) = private_table();
    let (locks, app) = manager("job-overrun").await;
    let name = job_name("overrun");
    let job = job(&locks, &table, &name)
        .min_hold(Duration::ZERO)
        .max_hold(Duration::from_millis(300))
        .build()
        .expect("valid");
    let dropped = Arc::new(AtomicUsize::new(0));
    let body = {
        let dropped = Arc::clone(&dropped);
        move |_| async move {
            let _count_the_drop = DropCounter(dropped);
            std::future::pending::<()>().await
        }
    };
    let err = tokio::time::timeout(Duration::from_secs(10), job.run(body))
        .await
        .expect("cut off, not hung")
        .expect_err("cut off");
    assert!(
        matches!(err, Error::Overran { ref job, hold } if *job == name && hold == Duration::from_millis(300)),
        "{err:?}"
    );
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        1,
        "the body's future was dropped"
    );
    let stored = row(&observer, &table_name, &name).await.expect("claimed");
    assert_eq!(stored.finished_at, None, "the window did not complete");
    assert!(
        stored.hold_until <= db_now(&observer).await,
        "the claim was given up: {stored:?}"
    );
    assert_pool_clean(&observer, &app).await;

    // The window may run again at once (the min hold is zero).
    let (run, ()) = ran(job.run(|_| async {}).await.expect("run"));
    assert_eq!((run.run, run.window_start), (2, stored.window_start));
}

struct DropCounter(Arc<AtomicUsize>);

impl Drop for DropCounter {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

#[tokio::test]
async fn a_held_job_lock_means_busy_and_a_lost_one_cancels_the_body() {
    let observer = observer().await;
    let (table_name, table) = private_table();
    let name = job_name("lock");
    let app = app_name("job-lock");
    let locks = common::manager_for(pool_named(3, &app).await, &app)
        .probe_interval(Duration::from_millis(100))
        .build();
    let job = job(&locks, &table, &name)
        .min_hold(Duration::ZERO)
        .build()
        .expect("valid");

    // Someone else holds the job's lock: skip, without a claim.
    let (other, _) = manager("job-other").await;
    let held = other
        .acquire(job.lock_key().clone(), None)
        .await
        .expect("acquire");
    let outcome = job
        .run(|_| async { unreachable!("busy") })
        .await
        .expect("run");
    assert_eq!(skip(outcome), Skip::Busy);
    assert_eq!(
        row(&observer, &table_name, &name).await,
        None,
        "no claim was made"
    );
    held.release().await.expect("release");

    // The job's lock is lost mid-run: the body is cancelled, the claim given up.
    let running = common::jobs::spawn_endless_run(&job).await;
    let pid = common::lock_rows(&observer, job.lock_key().target().packed()).await[0].pid;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    let err = tokio::time::timeout(Duration::from_secs(10), running)
        .await
        .expect("cancelled, not hung")
        .expect("join")
        .expect_err("lost");
    assert!(
        matches!(err, Error::Lock(pglock::Error::LockLost { ref key, .. }) if key == job.lock_key()),
        "{err:?}"
    );
    let stored = row(&observer, &table_name, &name).await.expect("claimed");
    assert_eq!(stored.finished_at, None);
    let (run, ()) = ran(job.run(|_| async {}).await.expect("run"));
    assert_eq!(run.run, 2, "the given-up window ran again");
}

#[tokio::test]
async fn until_next_window_counts_down_by_the_database_clock() {
    let observer = observer().await;
    let (locks, _) = manager("job-next").await;
    let period = Duration::from_secs(60);
    let now = db_now(&observer).await;
    let offset = offset_for_boundary(now, period, Duration::from_secs(20));
    let job = pg_job(&locks, &JobTable::default(), job_name("next"), period)
        .offset(offset)
        .build()
        .expect("valid");
    let before = db_now(&observer).await;
    let left = job.until_next_window().await.expect("ask");
    let after = db_now(&observer).await;
    let boundary = now + chrono::Duration::seconds(20);
    let (most, least) = (
        (boundary - before).to_std().unwrap(),
        (boundary - after).to_std().unwrap(),
    );
    assert!(
        least <= left && left <= most,
        "{least:?} <= {left:?} <= {most:?}"
    );
}

#[tokio::test]
async fn the_table_is_created_once_under_any_valid_name() {
    let observer = observer().await;
    let schema = format!(
        "pglock_test_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE SCHEMA \"{schema}\"")))
        .execute(&observer)
        .await
        .expect("schema");
    let table = JobTable::new(&format!("{schema}.Odd \"Name\"")).expect("valid");
    let (locks, _) = manager("job-table").await;
    let jobs: Vec<ScheduledJob> = (0..4)
        .map(|_| {
            job(&locks, &table, &job_name("table"))
                .build()
                .expect("valid")
        })
        .collect();
    // Concurrent first uses create it once, without colliding.
    let ensured = futures::future::join_all(jobs.iter().map(|job| job.prepare())).await;
    assert!(ensured.iter().all(Result::is_ok), "{ensured:?}");
    for job in &jobs {
        ran(job.run(|_| async {}).await.expect("run"));
    }
    let count: i64 =
        sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
            .fetch_one(&observer)
            .await
            .expect("count");
    assert_eq!(count, 4);
}

#[tokio::test]
async fn a_table_made_by_migrations_is_used_as_it_is() {
    let observer = observer().await;
    let (table_name, table) = private_table();
    // The application's migrations created the table from the published statement.
    sqlx::query(sqlx::AssertSqlSafe(table.ddl()))
        .execute(&observer)
        .await
        .expect("migrate");
    // While anyone holds the creation lock, a job that tried to create its table would wait.
    let mut blocker = observer.begin().await.expect("begin");
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(lock_id("pglock:job-table-setup"))
        .execute(&mut *blocker)
        .await
        .expect("hold the creation lock");
    let (locks, _) = manager("job-migrated").await;
    let name = job_name("migrated");
    let job = job(&locks, &table, &name).build().expect("valid");
    let outcome = tokio::time::timeout(Duration::from_secs(10), job.run(|_| async {}))
        .await
        .expect("no table creation was attempted")
        .expect("run");
    blocker.rollback().await.expect("rollback");
    assert!(outcome.ran());
    assert_eq!(
        row(&observer, &table_name, &name).await.map(|r| r.runs),
        Some(1)
    );
}

/// The table as pglock 0.1 made it, before runs could extend their hold.
const TABLE_OF_0_1: &str = "CREATE TABLE {} (job text PRIMARY KEY, \
    window_start timestamptz NOT NULL, runs bigint NOT NULL, claimed_by text, \
    claimed_at timestamptz NOT NULL, finished_at timestamptz, hold_until timestamptz NOT NULL)";

#[tokio::test]
async fn a_table_made_by_0_1_gets_the_columns_it_lacks() {
    let observer = observer().await;
    let (table_name, table) = private_table();
    let old = TABLE_OF_0_1.replace("{}", &table.to_string());
    sqlx::query(sqlx::AssertSqlSafe(old))
        .execute(&observer)
        .await
        .expect("the 0.1 table");
    let (locks, _) = manager("job-upgraded").await;
    let name = job_name("upgraded");
    let job = job(&locks, &table, &name)
        .max_total_hold(2 * HOUR)
        .build()
        .expect("valid");
    let (_, extension) = ran(job
        .run(|run| async move { run.extend(HOUR).await })
        .await
        .expect("the role owns the table: its columns are added"));
    assert!(!extension.expect("extended").capped);
    let extensions: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT extensions FROM {table} WHERE job = $1"
    )))
    .bind(&name)
    .fetch_one(&observer)
    .await
    .expect("the new column");
    assert_eq!(extensions, 1);
    assert!(row(&observer, &table_name, &name).await.is_some());
}
