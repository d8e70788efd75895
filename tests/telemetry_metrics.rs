//! OpenTelemetry metrics (feature `metrics`), read back from an in-memory exporter after real
//! lock operations on both managers: the instruments, their bounded attributes, the stable
//! loss-cause labels and the hold-time histogram.
#![cfg(feature = "metrics")]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::meters::{Pipeline, all_points, attribute_keys, points, series};
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData};
use pglock::telemetry::{self, metrics, outcome};
use pglock::{InMemoryLockManager, LossCause, PostgresLockManager};

const INSTRUMENTS: [&str; 5] = [
    metrics::ACQUIRE_WAIT,
    metrics::ACQUISITIONS,
    metrics::HOLD_DURATION,
    metrics::HELD,
    metrics::LOST,
];

#[tokio::test]
async fn postgres_manager_records_waits_outcomes_held_locks_and_losses() {
    let pipeline = Pipeline::new();
    let locks = PostgresLockManager::builder(common::pool(4).await)
        .holder_id("metrics-postgres")
        .meter(pipeline.meter())
        .probe_interval(Duration::from_millis(100))
        .build();
    let rival = PostgresLockManager::new(common::pool(2).await);
    let (a, b) = (common::key("metrics-a"), common::key("metrics-b"));

    let guard_a = locks.acquire(&a, None).await.expect("acquire");
    // Leaked into the registry: held until released by key below.
    common::hold(&locks, &b).await;
    let held = rival
        .acquire(&common::key("metrics-c"), None)
        .await
        .expect("rival");
    let export = pipeline.collect();
    assert_eq!(points(&export, metrics::HELD, &[]), [2.0], "two locks held");
    // The budget derived at the first session's set-up: max_locks_per_transaction × the pool's
    // 4 connections.
    let per_connection: String = sqlx::query_scalar("SHOW max_locks_per_transaction")
        .fetch_one(&common::pool(1).await)
        .await
        .expect("show");
    let budget = per_connection.parse::<f64>().expect("a number") * 4.0;
    assert_eq!(points(&export, metrics::BUDGET, &[]), [budget]);
    assert_eq!(locks.lock_budget(), Some(budget as usize));

    // A timeout: the rival holds c for longer than the deadline.
    let c = held.info().key.clone();
    let err = locks
        .acquire(c.clone(), Some(Duration::from_millis(120)))
        .await
        .expect_err("held by the rival");
    assert!(err.is_timeout());
    // A busy try.
    assert!(
        locks
            .try_acquire(c)
            .await
            .expect("try")
            .into_handle()
            .is_none()
    );
    guard_a.release().await.expect("release");
    locks.release(&b).await.expect("release");

    let export = pipeline.collect();
    let acquire_ok = [
        (metrics::OPERATION, metrics::ACQUIRE),
        (telemetry::OUTCOME, outcome::ACQUIRED),
        (telemetry::MODE, "exclusive"),
    ];
    let acquire_timeout = [
        (metrics::OPERATION, metrics::ACQUIRE),
        (telemetry::OUTCOME, outcome::TIMEOUT),
    ];
    let try_ok = [
        (metrics::OPERATION, metrics::TRY_ACQUIRE),
        (telemetry::OUTCOME, outcome::ACQUIRED),
    ];
    let try_busy = [
        (metrics::OPERATION, metrics::TRY_ACQUIRE),
        (telemetry::OUTCOME, outcome::BUSY),
    ];
    assert_eq!(points(&export, metrics::ACQUISITIONS, &acquire_ok), [1.0]);
    assert_eq!(
        points(&export, metrics::ACQUISITIONS, &acquire_timeout),
        [1.0]
    );
    assert_eq!(points(&export, metrics::ACQUISITIONS, &try_ok), [1.0]);
    assert_eq!(points(&export, metrics::ACQUISITIONS, &try_busy), [1.0]);
    let timeout_wait = points(&export, metrics::ACQUIRE_WAIT, &acquire_timeout);
    assert_eq!(timeout_wait[0], 1.0, "one timed-out wait recorded");
    assert!(
        timeout_wait[1] >= 0.12,
        "it waited its deadline: {timeout_wait:?}"
    );
    assert_eq!(
        points(&export, metrics::HELD, &[]),
        [0.0],
        "nothing held any more"
    );
    assert_eq!(
        points(
            &export,
            metrics::HOLD_DURATION,
            &[(telemetry::MODE, "exclusive")]
        )[0],
        2.0,
        "two holds ended in a release"
    );

    // A loss, labelled with the cause's stable name.
    let guard = locks.acquire(&a, None).await.expect("acquire");
    let observer = common::observer().await;
    let pid = common::lock_rows(&observer, pglock::lock_id(&a)).await[0].pid;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    tokio::time::timeout(Duration::from_secs(5), guard.loss_signal().lost())
        .await
        .expect("lost");
    let export = pipeline.collect();
    let lost = [(telemetry::CAUSE, "not_on_server")];
    assert_eq!(points(&export, metrics::LOST, &lost), [1.0]);
    assert_eq!(points(&export, metrics::HELD, &[]), [0.0]);
    assert_eq!(
        points(&export, metrics::HOLD_DURATION, &[])[0],
        2.0,
        "a lost lock is counted as lost, not as a hold"
    );

    // Bounded cardinality: no holder id, and only attributes from short fixed lists.
    let keys = attribute_keys(&export, &INSTRUMENTS);
    let allowed: BTreeSet<String> = [
        metrics::OPERATION,
        telemetry::MODE,
        telemetry::OUTCOME,
        telemetry::CAUSE,
    ]
    .map(str::to_owned)
    .into();
    assert!(keys.is_subset(&allowed), "{keys:?}");
    assert!(series(&export, metrics::HELD).len() == 1);
    held.release().await.expect("release");
}

#[tokio::test]
async fn the_hold_histogram_measures_from_grant_to_release() {
    let pipeline = Pipeline::new();
    let locks = PostgresLockManager::builder(common::pool(2).await)
        .meter(pipeline.meter())
        .build();
    let key = common::key("metrics-hold");
    const HOLD: Duration = Duration::from_millis(80);

    let outer = Instant::now();
    let guard = locks.acquire_shared(&key, None).await.expect("acquire");
    // The sleep is the thing measured, not a wait for something to happen.
    tokio::time::sleep(HOLD).await;
    guard.release().await.expect("release");
    let around = outer.elapsed();

    let export = pipeline.collect();
    let shared = points(
        &export,
        metrics::HOLD_DURATION,
        &[(telemetry::MODE, "shared")],
    );
    assert_eq!(shared[0], 1.0, "one hold: {shared:?}");
    assert!(
        shared[1] >= HOLD.as_secs_f64() && shared[1] <= around.as_secs_f64(),
        "held {}s: at least the {HOLD:?} it slept, at most the {around:?} around it",
        shared[1]
    );
    assert!(
        points(
            &export,
            metrics::HOLD_DURATION,
            &[(telemetry::MODE, "exclusive")]
        )
        .is_empty()
    );

    // The histogram's buckets are made for seconds, from sub-millisecond to an hour.
    let bounds: Vec<f64> = export
        .scope_metrics()
        .flat_map(|scope| scope.metrics())
        .filter(|m| m.name() == metrics::HOLD_DURATION)
        .flat_map(|m| match m.data() {
            AggregatedMetrics::F64(MetricData::Histogram(h)) => h
                .data_points()
                .flat_map(|p| p.bounds().collect::<Vec<_>>())
                .collect::<Vec<_>>(),
            other => panic!("not a histogram: {other:?}"),
        })
        .collect();
    assert_eq!(bounds.first(), Some(&0.0005), "{bounds:?}");
    assert_eq!(bounds.last(), Some(&3600.0), "{bounds:?}");
}

#[tokio::test]
async fn the_holder_id_is_an_attribute_only_when_asked_for() {
    let pipeline = Pipeline::new();
    let with = InMemoryLockManager::builder()
        .holder_id("metrics-with-holder")
        .meter(pipeline.meter())
        .metrics_holder_id(true)
        .build();
    let without = InMemoryLockManager::builder()
        .holder_id("metrics-without-holder")
        .meter(pipeline.meter())
        .build();
    for locks in [&with, &without] {
        let guard = locks.acquire("k", None).await.expect("acquire");
        guard.release().await.expect("release");
    }

    let export = pipeline.collect();
    for name in INSTRUMENTS.into_iter().filter(|n| *n != metrics::LOST) {
        let by_holder = [(telemetry::HOLDER_ID, "metrics-with-holder")];
        assert!(
            !points(&export, name, &by_holder).is_empty(),
            "{name} carries the opted-in holder id"
        );
        let holders: BTreeSet<String> = all_points(&export, name)
            .into_iter()
            .flat_map(|p| p.attributes)
            .filter(|(k, _)| k == telemetry::HOLDER_ID)
            .map(|(_, v)| v)
            .collect();
        assert_eq!(
            holders,
            BTreeSet::from(["metrics-with-holder".to_owned()]),
            "{name}: the other manager's series have no holder id"
        );
    }
}

#[tokio::test]
async fn in_memory_manager_records_the_same_instruments() {
    let pipeline = Pipeline::new();
    let locks = InMemoryLockManager::builder()
        .holder_id("metrics-memory")
        .meter(pipeline.meter())
        .metrics_holder_id(true)
        .lock_budget(50)
        .build();
    let key = common::key("metrics-memory");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    assert!(locks.simulate_loss(&key).await);
    assert!(guard.release().await.is_err());
    // Released through the manager: the guard is told, but that is no loss to count.
    let guard = locks.acquire(&key, None).await.expect("acquire");
    locks.release(&key).await.expect("release by key");
    assert_eq!(guard.loss_signal().cause(), Some(LossCause::Released));
    assert!(matches!(
        guard.release().await,
        Err(pglock::Error::LockLost {
            cause: LossCause::Released,
            ..
        })
    ));
    let export = pipeline.collect();
    let by_holder = [(telemetry::HOLDER_ID, "metrics-memory")];
    assert_eq!(points(&export, metrics::ACQUISITIONS, &by_holder), [2.0]);
    let lost = [(telemetry::CAUSE, "simulated"), by_holder[0]];
    assert_eq!(points(&export, metrics::LOST, &lost), [1.0]);
    assert_eq!(
        points(&export, metrics::LOST, &[]),
        [1.0],
        "only the real loss is counted"
    );
    assert_eq!(points(&export, metrics::HELD, &by_holder), [0.0]);
    assert_eq!(points(&export, metrics::BUDGET, &by_holder), [50.0]);
}

#[test]
fn loss_cause_labels_are_stable_names_and_display_stays_a_sentence() {
    let causes = [
        (LossCause::NotOnServer, "not_on_server"),
        (LossCause::Unverifiable, "unverifiable"),
        (LossCause::SessionClosed, "session_closed"),
        (LossCause::Released, "released"),
        (LossCause::ReleasedAll, "released_all"),
        (LossCause::Simulated, "simulated"),
    ];
    for (cause, label) in causes {
        assert_eq!(cause.as_str(), label);
        let sentence = cause.to_string();
        assert!(sentence.contains(' '), "{sentence:?} reads as a sentence");
        assert_ne!(sentence, label);
    }
}
