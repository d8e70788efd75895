//! OpenTelemetry metrics (feature `metrics`), read back from an in-memory exporter after real
//! lock operations on both managers.
#![cfg(feature = "metrics")]

mod common;

use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};
use pglock::telemetry::{self, metrics, outcome};
use pglock::{InMemoryLockManager, LockManager, PostgresLockManager};

struct Pipeline {
    exporter: InMemoryMetricExporter,
    provider: SdkMeterProvider,
}

impl Pipeline {
    fn new() -> Self {
        let exporter = InMemoryMetricExporter::default();
        let provider = SdkMeterProvider::builder()
            .with_reader(PeriodicReader::builder(exporter.clone()).build())
            .build();
        Pipeline { exporter, provider }
    }

    fn meter(&self) -> opentelemetry::metrics::Meter {
        self.provider.meter("pglock-tests")
    }

    /// Flushes, then returns the latest export.
    fn collect(&self) -> ResourceMetrics {
        self.provider.force_flush().expect("flush");
        self.exporter
            .get_finished_metrics()
            .expect("exported metrics")
            .pop()
            .expect("at least one export")
    }
}

/// The data points of metric `name` whose attributes include all of `wanted`, as
/// (sum or count, attributes) pairs.
fn points(export: &ResourceMetrics, name: &str, wanted: &[(&str, &str)]) -> Vec<f64> {
    let mut found = Vec::new();
    for scope in export.scope_metrics() {
        for metric in scope.metrics().filter(|m| m.name() == name) {
            let matches = |attrs: &mut dyn Iterator<Item = &opentelemetry::KeyValue>| {
                let attrs: Vec<(String, String)> = attrs
                    .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                    .collect();
                wanted
                    .iter()
                    .all(|(k, v)| attrs.iter().any(|(ak, av)| ak == k && av == v))
            };
            match metric.data() {
                AggregatedMetrics::F64(MetricData::Histogram(h)) => {
                    for p in h.data_points() {
                        if matches(&mut p.attributes()) {
                            found.push(p.count() as f64);
                            found.push(p.sum());
                        }
                    }
                }
                AggregatedMetrics::U64(MetricData::Sum(s)) => {
                    for p in s.data_points() {
                        if matches(&mut p.attributes()) {
                            found.push(p.value() as f64);
                        }
                    }
                }
                AggregatedMetrics::I64(MetricData::Sum(s)) => {
                    for p in s.data_points() {
                        if matches(&mut p.attributes()) {
                            found.push(p.value() as f64);
                        }
                    }
                }
                other => panic!("unexpected data for {name}: {other:?}"),
            }
        }
    }
    found
}

#[tokio::test]
async fn postgres_manager_records_waits_outcomes_held_locks_and_losses() {
    let pipeline = Pipeline::new();
    let holder = "metrics-postgres";
    let locks = PostgresLockManager::builder(common::pool(4).await)
        .holder_id(holder)
        .meter(pipeline.meter())
        .probe_interval(Duration::from_millis(100))
        .build();
    let rival = PostgresLockManager::new(common::pool(2).await);
    let (a, b) = (common::key("metrics-a"), common::key("metrics-b"));

    let guard_a = locks.acquire(&a, None).await.expect("acquire");
    assert!(locks.try_acquire(&b).await.expect("try").is_some());
    let held = rival
        .acquire(&common::key("metrics-c"), None)
        .await
        .expect("rival");
    let export = pipeline.collect();
    let by_holder = [(telemetry::HOLDER_ID, holder)];
    assert_eq!(
        points(&export, metrics::HELD, &by_holder),
        [2.0],
        "two locks held"
    );

    // A timeout: the rival holds c for longer than the deadline.
    let c = held.key.clone();
    let err = locks
        .acquire(&c, Some(Duration::from_millis(120)))
        .await
        .expect_err("held by the rival");
    assert!(err.is_timeout());
    // A busy try.
    assert!(locks.try_acquire(&c).await.expect("try").is_none());
    assert!(guard_a.release().await.expect("release"));
    locks.release(&b).await.expect("release");

    let export = pipeline.collect();
    let acquire_ok = [
        (metrics::OPERATION, metrics::ACQUIRE),
        (telemetry::OUTCOME, outcome::ACQUIRED),
        (telemetry::HOLDER_ID, holder),
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
        points(&export, metrics::HELD, &by_holder),
        [0.0],
        "nothing held any more"
    );

    // A loss.
    let guard = locks.acquire(&a, None).await.expect("acquire");
    let observer = common::observer().await;
    let pid = common::lock_rows(&observer, pglock::lock_id(&a)).await[0].pid;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("lost");
    let export = pipeline.collect();
    let lost = [
        (telemetry::CAUSE, pglock::LossCause::NotOnServer.to_string()),
        (telemetry::HOLDER_ID, holder.to_owned()),
    ];
    let lost: Vec<(&str, &str)> = lost.iter().map(|(k, v)| (*k, v.as_str())).collect();
    assert_eq!(points(&export, metrics::LOST, &lost), [1.0]);
    assert_eq!(points(&export, metrics::HELD, &by_holder), [0.0]);
    assert!(held.release().await.expect("release"));
}

#[tokio::test]
async fn in_memory_manager_records_the_same_instruments() {
    let pipeline = Pipeline::new();
    let locks = InMemoryLockManager::builder()
        .holder_id("metrics-memory")
        .meter(pipeline.meter())
        .build();
    let key = common::key("metrics-memory");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    assert!(locks.simulate_loss(&key).await);
    assert!(guard.release().await.is_err());
    let export = pipeline.collect();
    let by_holder = [(telemetry::HOLDER_ID, "metrics-memory")];
    assert_eq!(points(&export, metrics::ACQUISITIONS, &by_holder), [1.0]);
    assert_eq!(points(&export, metrics::LOST, &by_holder), [1.0]);
    assert_eq!(points(&export, metrics::HELD, &by_holder), [0.0]);
}
