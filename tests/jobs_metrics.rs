//! Scheduled job metrics (feature `metrics`), read back from an in-memory exporter: every call
//! of `run` counted once, as a run by outcome (a dropped call as `cancelled`) or as a skip by
//! reason, overruns, and extensions by outcome. Every case runs on `InMemoryLockManager` with an `InMemoryJobStore`
//! and on `PostgresLockManager` with a `PostgresJobStore`.
#![cfg(feature = "metrics")]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::jobs::{Backend, job_name, offset_for_boundary, on_both};
use common::meters::{Pipeline, all_points, points};
use common::within;
use futures::future::BoxFuture;
use opentelemetry_sdk::metrics::data::ResourceMetrics;
use pglock::LockManagerExt;
use pglock::schedule::{Error as JobError, JobRun, ScheduledJob, ScheduledJobBuilder, Skip};
use pglock::telemetry::{job, metrics};
use tokio::sync::oneshot;

const HOUR: Duration = Duration::from_secs(3600);

/// The job `name` on a new replica of `backend`, recording into `pipeline`: a period of an
/// hour, no min hold.
async fn metered(backend: &Backend, name: &str, pipeline: &Pipeline) -> ScheduledJobBuilder {
    backend.job(name).await.1.meter(pipeline.meter())
}

on_both!(
    a_run_and_the_skips_of_a_window_done_or_under_way,
    busy_and_too_soon_skips,
    overruns_lost_runs_and_cancelled_runs_are_counted,
    extensions_are_counted_by_outcome,
);

/// The series of counter `name` for `job_name`, by the value of `label`.
fn by(export: &ResourceMetrics, name: &str, job_name: &str, label: &str) -> BTreeMap<String, f64> {
    all_points(export, name)
        .into_iter()
        .filter(|p| p.has(&[(job::JOB, job_name)]))
        .map(|p| {
            let (_, value) = (p.attributes.iter())
                .find(|(k, _)| k == label)
                .unwrap_or_else(|| panic!("{name} without {label}: {p:?}"));
            (value.clone(), p.value)
        })
        .collect()
}

fn runs(export: &ResourceMetrics, job_name: &str) -> BTreeMap<String, f64> {
    by(export, metrics::JOB_RUNS, job_name, job::OUTCOME)
}

fn skips(export: &ResourceMetrics, job_name: &str) -> BTreeMap<String, f64> {
    by(export, metrics::JOB_SKIPS, job_name, job::REASON)
}

/// A body that says it has started, then runs until it is dropped.
fn endless(started: oneshot::Sender<()>) -> impl FnOnce(JobRun) -> BoxFuture<'static, ()> {
    move |_| {
        Box::pin(async move {
            started.send(()).expect("the test waits");
            std::future::pending::<()>().await
        })
    }
}

fn one(label: &str) -> BTreeMap<String, f64> {
    BTreeMap::from([(label.to_owned(), 1.0)])
}

/// Checks that each job of `expected` ran once (or not at all) and skipped once, for the
/// reason given.
fn assert_ran_and_skipped(export: &ResourceMetrics, expected: &[(&String, bool, &str)]) {
    for &(name, ran, reason) in expected {
        let runs_expected = if ran {
            one(job::outcome::RAN)
        } else {
            [].into()
        };
        assert_eq!(
            runs(export, name),
            runs_expected,
            "{name}: a skip is no run"
        );
        assert_eq!(skips(export, name), one(reason), "{name}");
    }
    assert!(all_points(export, metrics::JOB_OVERRUNS).is_empty());
}

async fn a_run_and_the_skips_of_a_window_done_or_under_way(backend: Backend) {
    let pipeline = Pipeline::new();

    // Ran, then the same window again: already ran.
    let done = job_name("metrics-ran");
    let job = metered(&backend, &done, &pipeline)
        .await
        .build()
        .expect("valid");
    assert!(job.run(|_| async {}).await.expect("run").ran());
    let again = job.run(|_| async {}).await.expect("run");
    assert!(matches!(again.skipped(), Some(Skip::AlreadyRan { .. })));

    // Another replica ticks while a run is under way: running.
    let running = job_name("metrics-running");
    let first = metered(&backend, &running, &pipeline)
        .await
        .build()
        .expect("valid");
    let second = metered(&backend, &running, &pipeline)
        .await
        .build()
        .expect("valid");
    let (started_tx, started_rx) = oneshot::channel();
    let (finish_tx, finish_rx) = oneshot::channel::<()>();
    let body = |_| async move {
        started_tx.send(()).expect("the test waits");
        finish_rx.await.expect("the test finishes the body");
    };
    let (ran, skipped) = tokio::join!(first.run(body), async {
        within("the body's start", started_rx)
            .await
            .expect("started");
        let skipped = second.run(|_| async {}).await.expect("run");
        finish_tx.send(()).expect("the body waits");
        skipped
    });
    assert!(ran.expect("run").ran());
    assert!(matches!(skipped.skipped(), Some(Skip::Running { .. })));

    let export = pipeline.collect();
    assert_ran_and_skipped(
        &export,
        &[(&done, true, "already_ran"), (&running, true, "running")],
    );
}

async fn busy_and_too_soon_skips(backend: Backend) {
    let pipeline = Pipeline::new();

    // The job's lock held, with no claim recorded: busy.
    let busy = job_name("metrics-busy");
    let job = metered(&backend, &busy, &pipeline)
        .await
        .build()
        .expect("valid");
    let (holder, _) = backend.replica().await;
    let guard = holder.acquire(job.lock_key(), None).await.expect("acquire");
    let skipped = job.run(|_| async {}).await.expect("run");
    assert!(matches!(skipped.skipped(), Some(Skip::Busy)));
    guard.release().await.expect("release");

    // A run just before a window's boundary, then one just after it, within the min hold:
    // too soon.
    let soon = job_name("metrics-too-soon");
    let now = backend.now().await;
    let ahead = Duration::from_secs(1);
    let job = (metered(&backend, &soon, &pipeline).await)
        .offset(offset_for_boundary(now, HOUR, ahead))
        .skew_tolerance(Duration::ZERO)
        .min_hold(Duration::from_secs(600))
        .max_hold(Duration::from_secs(1200))
        .build()
        .expect("valid");
    assert!(job.run(|_| async {}).await.expect("run").ran());
    backend
        .until(now + chrono::Duration::from_std(ahead).unwrap())
        .await;
    let skipped = job.run(|_| async {}).await.expect("run");
    assert!(matches!(skipped.skipped(), Some(Skip::TooSoon { .. })));

    let export = pipeline.collect();
    assert_ran_and_skipped(
        &export,
        &[(&busy, false, "busy"), (&soon, true, "too_soon")],
    );
}

async fn overruns_lost_runs_and_cancelled_runs_are_counted(backend: Backend) {
    let pipeline = Pipeline::new();

    // Cut off at its max hold: an overrun.
    let overrun = job_name("metrics-overrun");
    let job = (metered(&backend, &overrun, &pipeline).await)
        .max_hold(Duration::from_millis(100))
        .build()
        .expect("valid");
    let cut_off = job.run(|_| std::future::pending::<()>()).await;
    assert!(
        matches!(cut_off, Err(JobError::Overran { .. })),
        "{cut_off:?}"
    );

    // The job's lock released through the manager under the body: lost.
    let lost = job_name("metrics-lost");
    let (locks, store) = backend.replica().await;
    let job = ScheduledJob::builder(Arc::clone(&locks), store, &lost, HOUR)
        .meter(pipeline.meter())
        .build()
        .expect("valid");
    let (started_tx, started_rx) = oneshot::channel();
    let body = endless(started_tx);
    let (taken, ()) = tokio::join!(job.run(body), async {
        within("the body's start", started_rx)
            .await
            .expect("started");
        locks.release(job.lock_key()).await.expect("release by key");
    });
    assert!(
        matches!(taken, Err(JobError::Lock(ref err)) if err.is_lost()),
        "{taken:?}"
    );

    // Dropped by its caller while the body runs: cancelled.
    let cancelled = job_name("metrics-cancelled");
    let job = metered(&backend, &cancelled, &pipeline)
        .await
        .build()
        .expect("valid");
    let (started_tx, started_rx) = oneshot::channel();
    let body = endless(started_tx);
    tokio::select! {
        outcome = job.run(body) => panic!("the body never ends: {outcome:?}"),
        started = within("the body's start", started_rx) => started.expect("started"),
    }

    let export = pipeline.collect();
    assert_eq!(runs(&export, &overrun), one(job::outcome::OVERRAN));
    assert_eq!(runs(&export, &lost), one(job::outcome::LOST));
    assert_eq!(runs(&export, &cancelled), one(job::outcome::CANCELLED));
    for name in [&overrun, &lost, &cancelled] {
        assert!(skips(&export, name).is_empty(), "{name}");
    }
    let overruns = |name: &str| points(&export, metrics::JOB_OVERRUNS, &[(job::JOB, name)]);
    assert_eq!(overruns(&overrun), [1.0]);
    assert!(overruns(&lost).is_empty() && overruns(&cancelled).is_empty());
}

async fn extensions_are_counted_by_outcome(backend: Backend) {
    let pipeline = Pipeline::new();
    let name = job_name("metrics-extend");
    let job = (metered(&backend, &name, &pipeline).await)
        .max_hold(Duration::from_secs(10))
        .max_total_hold(Duration::from_secs(20))
        .build()
        .expect("valid");
    let outcome = job
        .run(|run| async move {
            let extended = run.extend(Duration::from_secs(10)).await.expect("extend");
            assert!(!extended.capped);
            let capped = run.extend(Duration::from_secs(60)).await.expect("extend");
            assert!(capped.capped);
            run
        })
        .await
        .expect("run");
    let run = outcome.into_value().expect("ran");
    // Over: refused.
    assert!(matches!(
        run.extend(Duration::from_secs(1)).await,
        Err(JobError::NotRunning { .. })
    ));
    let export = pipeline.collect();
    let extensions = by(&export, metrics::JOB_EXTENSIONS, &name, job::OUTCOME);
    let expected = [
        job::extension::CAPPED,
        job::extension::EXTENDED,
        job::extension::REFUSED,
    ];
    assert_eq!(
        extensions,
        expected
            .iter()
            .map(|o| (o.to_string(), 1.0))
            .collect::<BTreeMap<_, _>>()
    );
}
