//! The migration spans (trigger, execute, rollback, readiness), exported to OpenTelemetry
//! through `tracing-opentelemetry`, carry the names, fields and outcomes documented in
//! `pglock_migration::telemetry`, nest as documented, and record cancellation.

mod common;

use common::otel::Capture;

use common::{Harness, TestLag, TestStores, coordinator};
use opentelemetry::Value;
use opentelemetry::trace::Status;
use opentelemetry_sdk::trace::SpanData;
use pglock::LockManagerExt;
use pglock_migration::telemetry::{self, outcome};
use pglock_migration::{CutoverManager, MigrationConfig, NotReady, Readiness};
use uuid::Uuid;

fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    let mut values = span
        .attributes
        .iter()
        .filter(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value);
    let value = values.next();
    assert!(
        values.next().is_none(),
        "{key} recorded twice on {}",
        span.name
    );
    value
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attr(span, key).map(|value| match value {
        Value::String(s) => s.as_str().to_owned(),
        other => panic!("{key} on {} is not a string: {other:?}", span.name),
    })
}

fn number(span: &SpanData, key: &str) -> Option<f64> {
    attr(span, key).map(|value| match value {
        Value::F64(v) => *v,
        Value::I64(v) => *v as f64,
        other => panic!("{key} on {} is not a number: {other:?}", span.name),
    })
}

fn flag(span: &SpanData, key: &str) -> Option<bool> {
    attr(span, key).map(|value| match value {
        Value::Bool(v) => *v,
        other => panic!("{key} on {} is not a bool: {other:?}", span.name),
    })
}

#[tokio::test(flavor = "current_thread")]
async fn a_triggered_cutover_emits_nested_spans_with_ids_and_outcome() {
    let capture = Capture::install();
    let h = Harness::memory();
    let p = h.process("telemetry").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let coordinator = coordinator(&p, TestStores::new(), TestLag::fixed(Some(0)));

    let result = coordinator.trigger_cutover(m.id).await.unwrap();

    let trigger = capture.only(telemetry::TRIGGER_SPAN);
    let execute = capture.only(telemetry::EXECUTE_SPAN);
    let (migration, tenant) = (Some(m.id.to_string()), Some(tenant.to_string()));
    for span in [&trigger, &execute] {
        assert_eq!(text(span, telemetry::MIGRATION_ID), migration, "{span:#?}");
        assert_eq!(text(span, telemetry::TENANT_ID), tenant, "{span:#?}");
        assert_eq!(
            text(span, telemetry::OUTCOME).as_deref(),
            Some(outcome::SUCCEEDED)
        );
        assert_eq!(attr(span, telemetry::FAILURE), None);
        assert_eq!(span.status, Status::Unset);
    }
    assert_eq!(execute.parent_span_id, trigger.span_context.span_id());
    assert_eq!(
        text(&execute, telemetry::TARGET_STORE_ID).as_deref(),
        Some("dedicated")
    );
    assert_eq!(number(&execute, telemetry::TIMEOUT_MS), Some(500.0));
    assert_eq!(number(&execute, telemetry::LOCK_TIMEOUT_MS), Some(500.0));
    assert_eq!(number(&execute, telemetry::EVENTS_SYNCED), Some(0.0));
    assert_eq!(flag(&execute, telemetry::ROLLED_BACK), Some(false));
    assert_eq!(
        number(&execute, telemetry::DURATION_MS),
        Some(result.duration_ms())
    );
    let attempt = text(&execute, telemetry::ATTEMPT_ID).expect("attempt id");
    let log = h.store.audit_log(m.id).await.unwrap();
    assert_eq!(Some(attempt), log[3].cutover_attempt.map(|a| a.to_string()));
    // The in-memory manager mints tokens: the span records the cutover lock's.
    assert_eq!(
        attr(&execute, telemetry::FENCING_TOKEN),
        Some(&opentelemetry::Value::I64(1))
    );
    // The lock manager's spans nest inside the cutover's.
    let exported = capture.exporter.get_finished_spans().unwrap();
    let lock_waits: Vec<_> = exported
        .iter()
        .filter(|span| span.name == pglock::telemetry::ACQUIRE_SPAN)
        .collect();
    assert_eq!(lock_waits.len(), 2, "the cutover lock and the write gate");
    assert!(
        lock_waits
            .iter()
            .all(|span| span.parent_span_id == execute.span_context.span_id())
    );
    assert_eq!(capture.count(telemetry::ROLLBACK_SPAN), 0);
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_cutover_records_why_and_its_rollback() {
    let capture = Capture::install();
    let h = Harness::memory();
    let p = h.process("telemetry").await;
    let m = h
        .dual_writing(Uuid::new_v4(), MigrationConfig::default())
        .await;
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    let result = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(3)))
        .await;
    assert!(result.expect_err("lag too high").rolled_back);

    let execute = capture.only(telemetry::EXECUTE_SPAN);
    assert_eq!(
        text(&execute, telemetry::OUTCOME).as_deref(),
        Some(outcome::FAILED)
    );
    assert_eq!(
        text(&execute, telemetry::FAILURE).as_deref(),
        Some("lag_too_high")
    );
    assert_eq!(flag(&execute, telemetry::ROLLED_BACK), Some(true));
    assert!(
        matches!(execute.status, Status::Error { .. }),
        "{execute:#?}"
    );
    let rollback = capture.only(telemetry::ROLLBACK_SPAN);
    assert_eq!(rollback.parent_span_id, execute.span_context.span_id());
    assert_eq!(
        text(&rollback, telemetry::OUTCOME).as_deref(),
        Some(outcome::ROLLED_BACK)
    );
    assert_eq!(
        text(&rollback, telemetry::REASON).as_deref(),
        Some("Sync lag too high for cutover: 3 events (max: 0)")
    );
    assert_eq!(
        text(&rollback, telemetry::ATTEMPT_ID),
        text(&execute, telemetry::ATTEMPT_ID)
    );
    assert_eq!(
        text(&rollback, telemetry::MIGRATION_ID),
        Some(m.id.to_string())
    );
}

#[tokio::test(flavor = "current_thread")]
async fn readiness_records_its_answer() {
    let capture = Capture::install();
    let h = Harness::memory();
    let (p, other) = (h.process("telemetry").await, h.process("holder").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());
    let lag = TestLag::fixed(Some(0));

    assert_eq!(
        cutover
            .validate_cutover_readiness(m.id, &*lag)
            .await
            .unwrap(),
        Readiness::Ready
    );
    let ready = capture.only(telemetry::READINESS_SPAN);
    assert_eq!(
        text(&ready, telemetry::OUTCOME).as_deref(),
        Some(outcome::READY)
    );
    assert_eq!(flag(&ready, telemetry::READY), Some(true));
    assert_eq!(attr(&ready, telemetry::REASON), None);
    assert_eq!(text(&ready, telemetry::TENANT_ID), Some(tenant.to_string()));

    capture.reset();
    let held = other
        .locks
        .acquire(&CutoverManager::lock_key(tenant), None)
        .await
        .unwrap();
    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(readiness, Readiness::NotReady(NotReady::LockHeld));
    let not_ready = capture.only(telemetry::READINESS_SPAN);
    assert_eq!(
        text(&not_ready, telemetry::OUTCOME).as_deref(),
        Some(outcome::NOT_READY)
    );
    assert_eq!(flag(&not_ready, telemetry::READY), Some(false));
    assert_eq!(
        text(&not_ready, telemetry::REASON).as_deref(),
        Some("Cutover lock is already held by another process")
    );
    held.release().await.unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn a_dropped_cutover_is_recorded_as_cancelled_and_its_rollback_traced() {
    let capture = Capture::install();
    let h = Harness::memory();
    let (p, next) = (h.process("telemetry").await, h.process("next").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let parked = lag.hold_next();
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());
    {
        let running = cutover.execute_cutover(m.id, &*lag);
        tokio::select! {
            biased;
            result = running => panic!("parked, yet: {result:?}"),
            () = parked.reached() => {}
        }
    }
    // The spawned rollback releases the lock once it is written.
    let guard = next
        .locks
        .acquire(
            &CutoverManager::lock_key(tenant),
            Some(std::time::Duration::from_secs(15)),
        )
        .await
        .unwrap();
    guard.release().await.unwrap();

    let execute = capture.only(telemetry::EXECUTE_SPAN);
    assert_eq!(
        text(&execute, telemetry::OUTCOME).as_deref(),
        Some(outcome::CANCELLED)
    );
    let rollback = capture.only(telemetry::ROLLBACK_SPAN);
    assert_eq!(
        text(&rollback, telemetry::OUTCOME).as_deref(),
        Some(outcome::ROLLED_BACK)
    );
    assert_eq!(
        text(&rollback, telemetry::REASON).as_deref(),
        Some("Cutover was cancelled before it finished")
    );
    assert_eq!(
        text(&rollback, telemetry::ATTEMPT_ID),
        text(&execute, telemetry::ATTEMPT_ID)
    );
}
