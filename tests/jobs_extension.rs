//! Scheduled jobs that extend their hold, across operating-system processes: a run that keeps
//! extending past its max hold is never run a second time by another process, while one that
//! stops extending (stuck, or killed) is, once its extended hold has ended.
//!
//! Runners are copies of this test binary, told their part by a command-line argument (a
//! test-name filter that matches no test), never by the environment. The parent ticks as
//! another replica would, on a schedule of its own, and checks every outcome.

mod common;

use std::process::Child;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::child::ChildOutput;
use common::jobs::{job_name, private_table};
use pglock::PostgresLockManager;
use pglock::schedule::{
    Error, JobRecord, JobStore, JobTable, PostgresJobStore, RunOutcome, ScheduledJob, Skip,
};

const SPEC: &str = "pglock-job-extender=";
/// The hold a claim gets, and each extension adds from the moment it is made.
const MAX_HOLD: Duration = Duration::from_millis(1000);
/// How long a runner works between two extensions: a fifth of the hold, so a loaded machine
/// has time to spare before the hold would end.
const STRETCH: Duration = Duration::from_millis(200);
/// How often the parent ticks.
const TICK: Duration = Duration::from_millis(50);
const BOUND: Duration = Duration::from_secs(30);

fn spawn_runner(test: &str, spec: &str) -> Child {
    common::child::spawn_self(test, SPEC, spec)
}

/// The job on a manager and store of this process: hourly (so every run is for one window),
/// no min hold, the max hold above, and extensions allowed up to an hour.
async fn job(table: &str, name: &str, holder: &str) -> (ScheduledJob, Arc<PostgresJobStore>) {
    let pool = common::pool(3).await;
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id(holder)
        .build();
    let table = JobTable::new(table).expect("valid");
    let store = Arc::new(PostgresJobStore::with_table(pool, table));
    let job = ScheduledJob::builder(
        Arc::new(locks),
        Arc::clone(&store) as Arc<dyn JobStore>,
        name,
        Duration::from_secs(3600),
    )
    .min_hold(Duration::ZERO)
    .max_hold(MAX_HOLD)
    .max_total_hold(Duration::from_secs(3600))
    .build()
    .expect("valid");
    (job, store)
}

async fn record(store: &PostgresJobStore, job: &ScheduledJob) -> Option<JobRecord> {
    store.state(job.spec()).await.expect("the record").record
}

/// A runner: extends `extensions` times, a stretch of work apart, reporting each; then
/// finishes (`finish`), or stalls until it is cut off (`stall`) or killed (`die`).
async fn act_as_runner(spec: &str) -> ! {
    let [table, name, extensions, end] = spec.split('|').collect::<Vec<_>>()[..] else {
        panic!("bad spec {spec}")
    };
    let extensions: usize = extensions.parse().expect("a count");
    let (job, _) = job(table, name, "extender").await;
    let end = end.to_owned();
    let outcome = job
        .run(|run| async move {
            println!("\nRUNNING {}", run.run);
            for _ in 0..extensions {
                tokio::time::sleep(STRETCH).await;
                let extension = run.extend(MAX_HOLD).await.expect("extend");
                println!("\nEXTENDED {}", extension.hold_until.to_rfc3339());
            }
            if end != "finish" {
                println!("\nSTALLED");
                std::future::pending::<()>().await;
            }
        })
        .await;
    match outcome {
        Ok(RunOutcome::Ran { run, .. }) => println!("\nRAN {}", run.run),
        Err(Error::Overran { hold, .. }) => println!("\nOVERRAN {}", hold.as_millis()),
        other => println!("\nUNEXPECTED {other:?}"),
    }
    std::process::exit(0);
}

/// Ticks `job` every [`TICK`] until `done` says stop (checked before each tick), and returns
/// every skip and the first run it made, if any.
async fn tick_until<F, Fut>(job: &ScheduledJob, mut done: F) -> (Vec<Skip>, Option<DateTime<Utc>>)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + BOUND;
    let mut skips = Vec::new();
    while !done().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "ticked for {BOUND:?}"
        );
        match job
            .run(|run| async move { run.started_at })
            .await
            .expect("tick")
        {
            RunOutcome::Ran { value, .. } => return (skips, Some(value)),
            RunOutcome::Skipped { reason, .. } => skips.push(reason),
            _ => unreachable!(),
        }
        tokio::time::sleep(TICK).await;
    }
    (skips, None)
}

/// Eight extensions, then the run finishes: 1.6 s of work under a max hold of 1 s.
/// Another process ticking all along never runs the job, and is told the extended ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_keeps_extending_is_not_run_a_second_time() {
    if let Some(spec) = common::child::role(SPEC) {
        act_as_runner(&spec).await;
    }
    let (table, _) = private_table();
    let name = job_name("extending");
    let mut runner = spawn_runner(
        "a_run_that_keeps_extending_is_not_run_a_second_time",
        &format!("{table}|{name}|8|finish"),
    );
    let output = ChildOutput::read(runner.stdout.take().expect("stdout"));
    assert_eq!(output.until("RUNNING "), "RUNNING 1");

    let (job, store) = job(&table, &name, "ticker").await;
    let (skips, ran) = tick_until(&job, || async {
        record(&store, &job)
            .await
            .is_some_and(|record| record.finished_at.is_some())
    })
    .await;
    assert_eq!(
        ran, None,
        "the other process ran the job while it was extended"
    );
    assert_eq!(output.until("RAN "), "RAN 1");
    assert!(runner.wait().expect("reaped").success());

    let record = record(&store, &job).await.expect("a record");
    let held = (record.finished_at.expect("finished") - record.claimed_at)
        .to_std()
        .expect("finished after its claim");
    assert!(held > MAX_HOLD, "the run held {held:?}, past its max hold");
    assert_eq!((record.runs, record.extensions), (1, 8));
    // While the run was past its original max hold, the ticks were told it ran on.
    let original_end = record.claimed_at + chrono::Duration::from_std(MAX_HOLD).expect("short");
    let told_later = skips
        .iter()
        .any(|skip| matches!(skip, Skip::Running { expires_at, .. } if *expires_at > original_end));
    assert!(told_later, "no tick saw an extended hold: {skips:?}");
    let again = job.run(|_| async {}).await.expect("tick");
    assert!(matches!(
        again.skipped(),
        Some(Skip::AlreadyRan { run: 1, .. })
    ));
}

/// Two extensions, then the runner stalls: it is cut off at its extended end, and only then
/// does the other process run the window again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_stops_extending_is_cut_off_and_run_again() {
    if let Some(spec) = common::child::role(SPEC) {
        act_as_runner(&spec).await;
    }
    let (table, _) = private_table();
    let name = job_name("stalling");
    let mut runner = spawn_runner(
        "a_run_that_stops_extending_is_cut_off_and_run_again",
        &format!("{table}|{name}|2|stall"),
    );
    let output = ChildOutput::read(runner.stdout.take().expect("stdout"));
    output.until("STALLED");
    let (job, store) = job(&table, &name, "ticker").await;
    let stalled = record(&store, &job).await.expect("claimed");
    let last = stalled.extended_at.expect("extended twice");
    let (skips, ran) = tick_until(&job, || async { false }).await;
    let started = ran.expect("the window runs again once the stalled run is cut off");
    assert!(
        skips
            .iter()
            .all(|skip| matches!(skip, Skip::Running { .. } | Skip::Busy)),
        "{skips:?}"
    );
    // Cut off at its last extension plus the max hold, by the runner's clock, which starts
    // before the extending statement: allow it the statement's round trip.
    let cut_off = last + chrono::Duration::from_std(MAX_HOLD).expect("short");
    assert!(
        started >= cut_off - chrono::Duration::milliseconds(100),
        "run again at {started}, before the stalled run's extended end {cut_off}"
    );
    let line = output.until("OVERRAN ");
    let held: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|ms| ms.parse().ok())
        .expect("ms");
    assert!(held > MAX_HOLD.as_millis() as u64, "held {held} ms");
    assert!(runner.wait().expect("reaped").success());
    let record = record(&store, &job).await.expect("a record");
    assert_eq!(
        (record.runs, record.extensions),
        (2, 0),
        "run 2, not extended"
    );
}

/// Two extensions, then the runner is killed: its claim holds the job until its extended
/// end, by the database's clock, and the window runs again after it, not before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_run_holds_the_job_until_its_extended_end() {
    if let Some(spec) = common::child::role(SPEC) {
        act_as_runner(&spec).await;
    }
    let (table, _) = private_table();
    let name = job_name("killed");
    let (job, store) = job(&table, &name, "ticker").await;
    let mut runner = spawn_runner(
        "a_killed_run_holds_the_job_until_its_extended_end",
        &format!("{table}|{name}|2|die"),
    );
    let output = ChildOutput::read(runner.stdout.take().expect("stdout"));
    output.until("STALLED");
    runner.kill().expect("kill the runner");
    runner.wait().expect("reaped");
    let claim = record(&store, &job).await.expect("claimed");
    assert_eq!(claim.extensions, 2);
    let original_end = claim.claimed_at + chrono::Duration::from_std(MAX_HOLD).expect("short");
    assert!(
        claim.hold_until > original_end,
        "the extensions moved the claim's end"
    );
    // Until the extended end, every tick is told the dead run still holds the job (or finds
    // its lock held, while the server has not yet noticed the dead session); then it runs.
    let (skips, ran) = tick_until(&job, || async { false }).await;
    let started = ran.expect("the expired claim is taken over");
    assert!(
        started >= claim.hold_until,
        "run at {started}, before {}",
        claim.hold_until
    );
    for skip in &skips {
        match skip {
            Skip::Running { expires_at, .. } => assert_eq!(*expires_at, claim.hold_until),
            Skip::Busy => {}
            other => panic!("unexpected skip {other:?}"),
        }
    }
}
