//! Scheduled jobs over the port: every case runs twice, on `InMemoryLockManager` with an
//! `InMemoryJobStore` (what a unit test of a user's job uses) and on `PostgresLockManager`
//! with a `PostgresJobStore`, so the two stores keep the same rules.

mod common;

use std::time::Duration;

use common::jobs::{Backend, on_both};

use pglock::schedule::{RunOutcome, ScheduledJobBuilder, Skip};
use pglock::{Error, LockManagerExt, LossCause};

const HOUR: Duration = Duration::from_secs(3600);
const BOUND: Duration = Duration::from_secs(10);

on_both!(
    a_window_runs_once_across_replicas,
    a_body_cut_off_at_its_max_hold_leaves_the_window_open,
    a_run_whose_lock_is_taken_away_is_cancelled_and_the_window_stays_open,
    the_body_is_a_critical_section_of_the_jobs_lock,
    a_dropped_run_gives_its_claim_up,
    until_next_window_is_within_a_period,
    a_run_that_extends_outlives_its_max_hold_and_the_record_shows_it,
    extensions_stop_at_the_max_total_hold,
);

fn skip<T>(outcome: &RunOutcome<T>) -> &Skip {
    outcome.skipped().expect("skipped")
}

async fn a_window_runs_once_across_replicas(backend: Backend) {
    let name = common::jobs::job_name("once");
    let mut jobs = Vec::new();
    for _ in 0..3 {
        jobs.push(backend.job(&name).await.1.build().expect("valid"));
    }
    let outcomes =
        futures::future::join_all(jobs.iter().map(|job| job.run(|run| async move { run.run })))
            .await;
    let ran: Vec<i64> = outcomes
        .iter()
        .filter_map(|outcome| outcome.as_ref().expect("no error").run().map(|run| run.run))
        .collect();
    assert_eq!(ran, [1], "exactly one replica ran the window, as run 1");
    for outcome in &outcomes {
        if let Ok(outcome @ RunOutcome::Skipped { .. }) = outcome {
            assert!(
                matches!(
                    skip(outcome),
                    Skip::Busy | Skip::Running { .. } | Skip::AlreadyRan { .. }
                ),
                "{outcome:?}"
            );
        }
    }
    // Later in the same window, every replica is told it ran already.
    for job in &jobs {
        let outcome = job.run(|_| async {}).await.expect("no error");
        assert!(
            matches!(skip(&outcome), Skip::AlreadyRan { run: 1, .. }),
            "{outcome:?}"
        );
    }
}

async fn a_body_cut_off_at_its_max_hold_leaves_the_window_open(backend: Backend) {
    let name = common::jobs::job_name("overrun");
    let (_, builder) = backend.job(&name).await;
    let job = builder
        .max_hold(Duration::from_millis(200))
        .build()
        .expect("valid");
    let err = job
        .run(|_| std::future::pending::<()>())
        .await
        .expect_err("cut off at the max hold");
    assert!(
        matches!(err, pglock::schedule::Error::Overran { .. }),
        "{err:?}"
    );
    // The window did not complete: it runs again, as the next run.
    let outcome = job
        .run(|run| async move { run.run })
        .await
        .expect("no error");
    assert_eq!(outcome.into_value(), Some(2));
}

async fn a_run_whose_lock_is_taken_away_is_cancelled_and_the_window_stays_open(backend: Backend) {
    let name = common::jobs::job_name("taken-away");
    let (locks, builder) = backend.job(&name).await;
    let job = builder.build().expect("valid");
    let running = common::jobs::spawn_endless_run(&job).await;
    locks
        .release(job.lock_key())
        .await
        .expect("the job's lock is held by this manager");
    let err = common::within("the run ends", running)
        .await
        .expect("join")
        .expect_err("the body was cancelled");
    match err {
        pglock::schedule::Error::Lock(Error::LockLost {
            cause: LossCause::Released,
            ..
        }) => {}
        other => panic!("expected LockLost(Released), got {other:?}"),
    }
    // The claim was given up: the window runs again.
    let outcome = job
        .run(|run| async move { run.run })
        .await
        .expect("no error");
    assert_eq!(outcome.into_value(), Some(2));
}

async fn the_body_is_a_critical_section_of_the_jobs_lock(backend: Backend) {
    let name = common::jobs::job_name("nested");
    let (locks, builder) = backend.job(&name).await;
    let job = builder.build().expect("valid");
    let key = job.lock_key().clone();
    let nested = job
        .run(|_| async move {
            tokio::time::timeout(BOUND, locks.try_acquire(key))
                .await
                .expect("refused at once")
                .map(drop)
        })
        .await
        .expect("no error")
        .into_value()
        .expect("ran");
    assert!(matches!(nested, Err(Error::Reentrant { .. })), "{nested:?}");
}

async fn a_dropped_run_gives_its_claim_up(backend: Backend) {
    let name = common::jobs::job_name("dropped");
    let (_, builder) = backend.job(&name).await;
    let job = builder.build().expect("valid");
    let running = common::jobs::spawn_endless_run(&job).await;
    running.abort();
    assert!(running.await.expect_err("aborted").is_cancelled());
    // The claim is given up in the background, and the lock released: the window runs again.
    common::eventually("the window runs again", || async {
        job.run(|_| async {}).await.expect("no error").ran()
    })
    .await;
}

async fn until_next_window_is_within_a_period(backend: Backend) {
    let name = common::jobs::job_name("next");
    let (_, builder) = backend.job(&name).await;
    let job = builder.build().expect("valid");
    let left = job.until_next_window().await.expect("ask");
    assert!(left > Duration::ZERO && left <= HOUR, "{left:?}");
}

/// A run that keeps extending its hold runs on past its max hold without being cut off;
/// meanwhile other replicas skip, told the extended end, and the record counts the extensions.
async fn a_run_that_extends_outlives_its_max_hold_and_the_record_shows_it(backend: Backend) {
    const MAX_HOLD: Duration = Duration::from_millis(1000);
    let name = common::jobs::job_name("extends");
    let build = |builder: ScheduledJobBuilder| {
        builder
            .max_hold(MAX_HOLD)
            .max_total_hold(HOUR)
            .build()
            .expect("valid")
    };
    let job = build(backend.job(&name).await.1);
    let other = build(backend.job(&name).await.1);
    let started = tokio::time::Instant::now();
    let outcome = job
        .run(|run| {
            let other = other.clone();
            async move {
                let mut extensions = Vec::new();
                for _ in 0..6 {
                    // A stretch of work, a quarter of the max hold, then another max hold
                    // from now: 1.5 s in all, past the max hold, with room to spare.
                    tokio::time::sleep(MAX_HOLD / 4).await;
                    let extension = run.extend(MAX_HOLD).await.expect("extended");
                    assert!(!extension.capped);
                    let seen = other.run(|_| async {}).await.expect("no error");
                    match seen.skipped() {
                        Some(Skip::Running { expires_at, .. }) => {
                            assert_eq!(*expires_at, extension.hold_until)
                        }
                        _ => panic!("another replica ran an extended run's job: {seen:?}"),
                    }
                    extensions.push(extension.hold_until);
                }
                (run, extensions)
            }
        })
        .await
        .expect("not cut off: it extended its hold");
    assert!(started.elapsed() > MAX_HOLD, "it ran past its max hold");
    let RunOutcome::Ran {
        value: (run, extensions),
        ..
    } = outcome
    else {
        panic!("the job ran")
    };
    assert!(
        extensions.windows(2).all(|pair| pair[0] < pair[1]),
        "{extensions:?}"
    );
    let record = backend.record(&job).await;
    assert_eq!(record.extensions, 6);
    assert!(record.extended_at.is_some() && record.finished_at.is_some());
    let late = run.extend(MAX_HOLD).await;
    assert!(
        matches!(
            late,
            Err(pglock::schedule::Error::NotRunning { run: 1, .. })
        ),
        "{late:?}"
    );
}

/// Extensions are bounded: a run that keeps asking is capped at its claim plus the max total
/// hold, and cut off there.
async fn extensions_stop_at_the_max_total_hold(backend: Backend) {
    const TOTAL: Duration = Duration::from_millis(600);
    let name = common::jobs::job_name("capped");
    let job = backend
        .job(&name)
        .await
        .1
        .max_hold(Duration::from_millis(200))
        .max_total_hold(TOTAL)
        .build()
        .expect("valid");
    let err = job
        .run(|run| async move {
            loop {
                let extension = run.extend(Duration::from_secs(60)).await.expect("extend");
                if extension.capped {
                    let claimed = run.started_at;
                    let limit = claimed + chrono::Duration::from_std(TOTAL).expect("short");
                    assert_eq!(extension.hold_until, limit);
                    break;
                }
            }
            // A stuck job: it would run for ever.
            std::future::pending::<()>().await
        })
        .await
        .expect_err("cut off at the max total hold");
    match err {
        pglock::schedule::Error::Overran { hold, .. } => {
            assert!(hold <= TOTAL, "held {hold:?} of at most {TOTAL:?}")
        }
        other => panic!("expected an overrun, got {other:?}"),
    }
    assert_eq!(backend.record(&job).await.extensions, 1);
}
