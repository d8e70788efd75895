//! Scheduled jobs across operating-system processes: replicas ticking on skewed schedules run
//! each window exactly once, and a runner killed mid-run holds the job until its max hold.
//!
//! Replicas are copies of this test binary. Each learns its part from a command-line argument
//! (a test-name filter that matches no test), never from the environment, so a variable left
//! in the parent's environment cannot turn the parent into a replica.

mod common;

use std::process::Child;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::child::ChildOutput;
use common::jobs::{db_now, job_name, private_table, row, until_db_time};
use pglock::PostgresLockManager;
use pglock::schedule::{JobTable, RunOutcome, ScheduledJob, Skip};
use sqlx::PgPool;

const SPEC: &str = "pglock-job-replica=";
const PERIOD: Duration = Duration::from_secs(1);
const WINDOWS: i64 = 4;

/// (offset from each window's start in ms, body duration in ms, ticks only on even windows).
/// Some run early (their clocks ahead), some late, some finish fast, one is slow.
const REPLICAS: [(i64, u64, bool); 5] = [
    (-150, 5, true),
    (0, 250, false),
    (70, 5, false),
    (200, 60, false),
    (400, 5, false),
];

/// A logged run: window start, run number, replica, started, finished.
type LoggedRun = (
    DateTime<Utc>,
    i64,
    i32,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
);

fn spawn_replica(test: &str, spec: &str) -> Child {
    common::child::spawn_self(test, SPEC, spec)
}

fn skewed_job(locks: PostgresLockManager, table: &str, name: &str) -> ScheduledJob {
    common::jobs::pg_job(&locks, &JobTable::new(table).expect("valid"), name, PERIOD)
        .skew_tolerance(Duration::from_millis(200))
        .min_hold(Duration::from_millis(100))
        .max_hold(Duration::from_millis(900))
        .build()
        .expect("valid")
}

async fn log_table(pool: &PgPool) {
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pglock_test_job_log (job text NOT NULL, \
         window_start timestamptz NOT NULL, run bigint NOT NULL, replica int NOT NULL, \
         started timestamptz NOT NULL, finished timestamptz)",
    )
    .execute(pool)
    .await
    .expect("create the log table");
}

/// One replica: ticks at each window's start plus its offset, runs the job, reports.
async fn act_as_skewed_replica(spec: &str) {
    let parts: Vec<&str> = spec.split('|').collect();
    let [_, table, name, first, replica] = parts[..] else {
        panic!("bad spec {spec}")
    };
    let first: i64 = first.parse().expect("first window");
    let replica: usize = replica.parse().expect("replica");
    let (offset_ms, body_ms, even_only) = REPLICAS[replica];
    let pool = common::pool(3).await;
    let log = common::pool(1).await;
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id(format!("replica-{replica}"))
        .build();
    let job = skewed_job(locks, table, name);
    for k in 0..WINDOWS {
        if even_only && k % 2 == 1 {
            continue;
        }
        let tick = first + k * PERIOD.as_micros() as i64 + offset_ms * 1000;
        until_db_time(&pool, DateTime::from_timestamp_micros(tick).expect("time")).await;
        let log = log.clone();
        let outcome = job
            .run(|run| async move {
                sqlx::query(
                    "INSERT INTO pglock_test_job_log VALUES ($1, $2, $3, $4, clock_timestamp(), NULL)",
                )
                .bind(&run.job)
                .bind(run.window_start)
                .bind(run.run)
                .bind(replica as i32)
                .execute(&log)
                .await
                .expect("log the start");
                tokio::time::sleep(Duration::from_millis(body_ms)).await;
                sqlx::query(
                    "UPDATE pglock_test_job_log SET finished = clock_timestamp() \
                     WHERE job = $1 AND run = $2",
                )
                .bind(&run.job)
                .bind(run.run)
                .execute(&log)
                .await
                .expect("log the end");
            })
            .await
            .expect("run");
        match outcome {
            RunOutcome::Ran { run, .. } => println!("\nRAN {k} {}", run.window_start),
            RunOutcome::Skipped { reason, .. } => println!("\nSKIP {k} {}", reason.as_str()),
            _ => unreachable!(),
        }
    }
    println!("\nDONE");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_on_skewed_schedules_run_each_window_exactly_once() {
    if let Some(spec) = common::child::role(SPEC).filter(|s| s.starts_with("skew|")) {
        return act_as_skewed_replica(&spec).await;
    }
    let observer = common::observer().await;
    log_table(&observer).await;
    let (table, _) = private_table();
    let name = job_name("skewed");
    let period = PERIOD.as_micros() as i64;
    // The first window starts at least 1.5 s from now, leaving the replicas time to start.
    let now = db_now(&observer).await.timestamp_micros();
    let first = (now + 1_500_000).div_euclid(period) * period + period;
    let mut replicas: Vec<Child> = (0..REPLICAS.len())
        .map(|i| {
            spawn_replica(
                "replicas_on_skewed_schedules_run_each_window_exactly_once",
                &format!("skew|{table}|{name}|{first}|{i}"),
            )
        })
        .collect();
    let mut reported = 0;
    for replica in &mut replicas {
        let lines = ChildOutput::read(replica.stdout.take().expect("stdout")).all();
        assert!(lines.iter().any(|l| l == "DONE"), "{lines:?}");
        reported += lines.iter().filter(|l| l.starts_with("RAN ")).count();
        println!("{lines:?}");
        assert!(replica.wait().expect("wait").success());
    }

    let runs: Vec<LoggedRun> = sqlx::query_as(
        "SELECT window_start, run, replica, started, finished FROM pglock_test_job_log \
             WHERE job = $1 ORDER BY started",
    )
    .bind(&name)
    .fetch_all(&observer)
    .await
    .expect("read the log");
    assert_eq!(runs.len(), reported, "every run was logged");
    for k in 0..WINDOWS {
        let window = DateTime::from_timestamp_micros(first + k * period).expect("time");
        let count = runs.iter().filter(|r| r.0 == window).count();
        assert_eq!(
            count, 1,
            "window {k} ({window}) ran {count} times: {runs:#?}"
        );
    }
    let windows: std::collections::BTreeSet<_> = runs.iter().map(|r| r.0).collect();
    assert_eq!(windows.len(), runs.len(), "no window ran twice: {runs:#?}");
    for pair in runs.windows(2) {
        let finished = pair[0].4.expect("every run finished");
        assert!(finished <= pair[1].3, "runs overlapped: {pair:#?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_runner_holds_the_job_until_its_max_hold_then_the_window_runs_again() {
    const MAX_HOLD: Duration = Duration::from_secs(2);
    let crash_job = |locks, table: &str, name: &str| {
        common::jobs::pg_job(
            &locks,
            &JobTable::new(table).expect("valid"),
            name,
            Duration::from_secs(3600),
        )
        .min_hold(Duration::ZERO)
        .max_hold(MAX_HOLD)
        .build()
        .expect("valid")
    };
    if let Some(spec) = common::child::role(SPEC).filter(|s| s.starts_with("crash|")) {
        let [_, table, name] = spec.split('|').collect::<Vec<_>>()[..] else {
            panic!("bad spec {spec}")
        };
        let locks = PostgresLockManager::builder(common::pool(3).await)
            .holder_id("doomed-runner")
            .build();
        let job = crash_job(locks, table, name);
        let outcome = job
            .run(|run| async move {
                println!("\nRUNNING {}", run.run);
                std::future::pending::<()>().await
            })
            .await;
        unreachable!("killed while running, yet it ended: {outcome:?}");
    }
    let observer = common::observer().await;
    let (table, _) = private_table();
    let name = job_name("crash");
    let mut runner = spawn_replica(
        "a_killed_runner_holds_the_job_until_its_max_hold_then_the_window_runs_again",
        &format!("crash|{table}|{name}"),
    );
    let line = ChildOutput::read(runner.stdout.take().expect("stdout")).until("RUNNING ");
    assert_eq!(line, "RUNNING 1");
    runner.kill().expect("kill the runner");
    runner.wait().expect("reap the runner");
    let claimed = row(&observer, &table, &name).await.expect("claimed");
    assert_eq!(claimed.finished_at, None);

    let locks = PostgresLockManager::new(common::pool(3).await);
    let job = crash_job(locks, &table, &name);
    let expires_at = claimed.claimed_at + chrono::Duration::from_std(MAX_HOLD).unwrap();
    let outcome = job.run(|_| async {}).await.expect("run");
    assert_eq!(
        outcome.skipped(),
        Some(&Skip::Running {
            window_start: claimed.window_start,
            run: 1,
            by: Some("doomed-runner".to_owned()),
            expires_at,
        }),
        "the dead runner's claim still holds the job"
    );

    // The claim's expiry is a fact of the database's clock: wait for it, then run.
    until_db_time(&observer, expires_at).await;
    let outcome = job.run(|_| async {}).await.expect("run");
    let run = outcome.run().expect("the expired claim is taken over");
    assert_eq!(
        run.window_start, claimed.window_start,
        "the same window, again"
    );
    assert_eq!(run.run, 2);
    assert!(run.started_at >= expires_at);
    assert!(
        row(&observer, &table, &name)
            .await
            .unwrap()
            .finished_at
            .is_some()
    );
}
