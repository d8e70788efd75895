//! pglock's spans, exported to OpenTelemetry through `tracing-opentelemetry`, carry the names,
//! fields and values documented in `pglock::telemetry`, for a real `PostgresLockManager`.

mod common;

use common::otel::Capture;

use std::time::Duration;

use opentelemetry::Value;
use opentelemetry::trace::{SpanId, Status};
use opentelemetry_sdk::trace::SpanData;
use pglock::telemetry::{self, outcome, via};
use pglock::{PostgresLockManager, lock_id};
use tracing::Instrument;

/// The value of attribute `key`, asserting it was recorded at most once.
fn attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    let mut values = span
        .attributes
        .iter()
        .filter(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value);
    let value = values.next();
    assert!(
        values.next().is_none(),
        "{key} recorded twice on {}: {:?}",
        span.name,
        span.attributes
    );
    value
}

fn str_attr<'a>(span: &'a SpanData, key: &str) -> Option<&'a str> {
    attr(span, key).map(|value| match value {
        Value::String(s) => s.as_str(),
        other => panic!("{key} on {} is not a string: {other:?}", span.name),
    })
}

fn f64_attr(span: &SpanData, key: &str) -> Option<f64> {
    attr(span, key).map(|value| match value {
        Value::F64(v) => *v,
        other => panic!("{key} on {} is not a float: {other:?}", span.name),
    })
}

fn i64_attr(span: &SpanData, key: &str) -> Option<i64> {
    attr(span, key).map(|value| match value {
        Value::I64(v) => *v,
        other => panic!("{key} on {} is not an integer: {other:?}", span.name),
    })
}

/// The spans named `name` whose key is `key`, in the order they started; asserts there are
/// exactly `expected` of them.
fn spans_named<'a>(
    spans: &'a [SpanData],
    name: &str,
    key: &str,
    expected: usize,
) -> Vec<&'a SpanData> {
    let mut found: Vec<&SpanData> = spans
        .iter()
        .filter(|span| span.name == name && str_attr(span, telemetry::KEY) == Some(key))
        .collect();
    found.sort_by_key(|span| span.start_time);
    assert_eq!(
        found.len(),
        expected,
        "expected {expected} {name} span(s) for {key}, found {found:#?}"
    );
    found
}

/// Checks the fields every pglock span carries, and that the span is not marked as failed.
fn assert_identity(span: &SpanData, key: &str, holder: &str) {
    assert_eq!(str_attr(span, telemetry::KEY), Some(key), "{span:#?}");
    assert_eq!(
        i64_attr(span, telemetry::LOCK_ID),
        Some(lock_id(key)),
        "{span:#?}"
    );
    assert_eq!(
        str_attr(span, telemetry::HOLDER_ID),
        Some(holder),
        "{span:#?}"
    );
    assert_eq!(span.status, Status::Unset, "{span:#?}");
}

fn assert_acquire(span: &SpanData, key: &str, holder: &str, timeout_ms: Option<f64>, result: &str) {
    assert_eq!(span.name, telemetry::ACQUIRE_SPAN);
    assert_identity(span, key, holder);
    assert_eq!(
        f64_attr(span, telemetry::TIMEOUT_MS),
        timeout_ms,
        "{span:#?}"
    );
    assert_eq!(
        str_attr(span, telemetry::OUTCOME),
        Some(result),
        "{span:#?}"
    );
    let waited = f64_attr(span, telemetry::WAITED_MS).expect("waited_ms is recorded");
    assert!(waited.is_finite() && waited >= 0.0, "waited_ms = {waited}");
    assert_eq!(attr(span, telemetry::RELEASE_VIA), None, "{span:#?}");
}

fn assert_try_acquire(span: &SpanData, key: &str, holder: &str, result: &str) {
    assert_eq!(span.name, telemetry::TRY_ACQUIRE_SPAN);
    assert_identity(span, key, holder);
    assert_eq!(
        str_attr(span, telemetry::OUTCOME),
        Some(result),
        "{span:#?}"
    );
    assert_eq!(attr(span, telemetry::TIMEOUT_MS), None, "{span:#?}");
    assert_eq!(attr(span, telemetry::WAITED_MS), None, "{span:#?}");
}

fn assert_release(span: &SpanData, key: &str, holder: &str, how: &str, result: &str) {
    assert_eq!(span.name, telemetry::RELEASE_SPAN);
    assert_identity(span, key, holder);
    assert_eq!(
        str_attr(span, telemetry::RELEASE_VIA),
        Some(how),
        "{span:#?}"
    );
    assert_eq!(
        str_attr(span, telemetry::OUTCOME),
        Some(result),
        "{span:#?}"
    );
}

fn is_pglock_span(span: &SpanData) -> bool {
    [
        telemetry::ACQUIRE_SPAN,
        telemetry::TRY_ACQUIRE_SPAN,
        telemetry::RELEASE_SPAN,
    ]
    .contains(&span.name.as_ref())
}

const HOLDER_A: &str = "telemetry-a";
const HOLDER_B: &str = "telemetry-b";
const ROOT_SPAN: &str = "telemetry-test";

#[tokio::test(flavor = "current_thread")]
async fn spans_carry_the_documented_names_fields_and_outcomes() {
    let capture = Capture::install();
    let a = PostgresLockManager::builder(common::pool(4).await)
        .holder_id(HOLDER_A)
        .build();
    let b = PostgresLockManager::builder(common::pool(4).await)
        .holder_id(HOLDER_B)
        .build();
    let guarded = common::key("telemetry-guard");
    let held = common::key("telemetry-held");
    let tried = common::key("telemetry-try");
    let never = common::key("telemetry-never");
    let dropped = common::key("telemetry-drop");
    let taken = common::key("telemetry-taken");

    async {
        // acquire + guard.release(), holding the lock for a while in between.
        let guard = a.acquire(&guarded, None).await.expect("a free key");
        tokio::time::sleep(Duration::from_millis(50)).await;
        guard.release().await.expect("release");

        // On a key another manager holds: acquire times out, try_acquire is busy.
        let other = b.acquire(&held, None).await.expect("a free key");
        let err = a
            .acquire(&held, Some(Duration::from_millis(200)))
            .await
            .expect_err("the key is held by b");
        assert!(err.is_timeout(), "{err:?}");
        assert!(
            a.try_acquire(&held)
                .await
                .expect("try_acquire")
                .into_handle()
                .is_none()
        );
        other.release().await.expect("release");

        // try_acquire, then release by key.
        // The guard is leaked into the registry: the lock stays held until released by key.
        assert!(
            a.try_acquire(&tried)
                .await
                .expect("try_acquire")
                .leak()
                .is_some()
        );
        a.release(&tried).await.expect("release by key");

        // release of a key never held.
        let err = a.release(&never).await.expect_err("never held");
        assert!(matches!(err, pglock::Error::NotHeld { .. }), "{err:?}");

        // A dropped guard is released in the background; the same manager's next acquire of
        // the key waits for that release to finish.
        let guard = a.acquire(&dropped, None).await.expect("a free key");
        drop(guard);
        let again = a
            .acquire(&dropped, Some(Duration::from_secs(10)))
            .await
            .expect("the dropped guard's lock is released");
        again.release().await.expect("release");

        // A guard whose lock was released by key: told at once, and its own release then
        // finds the lock already released.
        let guard = a.acquire(&taken, None).await.expect("a free key");
        a.release(&taken).await.expect("release by key");
        assert_eq!(
            guard.loss_signal().cause(),
            Some(pglock::LossCause::Released)
        );
        let err = guard.release().await.expect_err("released by key already");
        assert!(
            matches!(
                err,
                pglock::Error::LockLost {
                    cause: pglock::LossCause::Released,
                    ..
                }
            ),
            "{err:?}"
        );
    }
    .instrument(tracing::info_span!(ROOT_SPAN))
    .await;

    let spans = capture.finished_spans();
    let roots: Vec<&SpanData> = spans.iter().filter(|s| s.name == ROOT_SPAN).collect();
    assert_eq!(roots.len(), 1, "{roots:#?}");
    let root = roots[0].span_context.span_id();
    assert_ne!(root, SpanId::INVALID);

    // Nothing beyond the spans checked below carries this test's keys.
    let keys = [&guarded, &held, &tried, &never, &dropped, &taken];
    let ours = spans
        .iter()
        .filter(|s| is_pglock_span(s))
        .filter(|s| str_attr(s, telemetry::KEY).is_some_and(|k| keys.iter().any(|key| *key == k)))
        .count();
    assert_eq!(ours, 2 + 4 + 2 + 1 + 4 + 3, "{spans:#?}");

    // acquire + guard.release()
    let acquire = spans_named(&spans, telemetry::ACQUIRE_SPAN, &guarded, 1)[0];
    assert_acquire(acquire, &guarded, HOLDER_A, None, outcome::ACQUIRED);
    let release = spans_named(&spans, telemetry::RELEASE_SPAN, &guarded, 1)[0];
    assert_release(release, &guarded, HOLDER_A, via::GUARD, outcome::RELEASED);
    // The acquire span covers the wait only: it ended before the release began, and the
    // release is not its child but its sibling under the caller's span.
    assert!(
        acquire.end_time <= release.start_time,
        "acquire ended at {:?}, release started at {:?}",
        acquire.end_time,
        release.start_time
    );
    assert_eq!(acquire.parent_span_id, root);
    assert_eq!(release.parent_span_id, root);
    assert_ne!(release.parent_span_id, acquire.span_context.span_id());

    // The held key: b's acquire and release, a's timeout and busy.
    let acquires = spans_named(&spans, telemetry::ACQUIRE_SPAN, &held, 2);
    assert_acquire(acquires[0], &held, HOLDER_B, None, outcome::ACQUIRED);
    let timed_out = acquires[1];
    assert_acquire(timed_out, &held, HOLDER_A, Some(200.0), outcome::TIMEOUT);
    let waited = f64_attr(timed_out, telemetry::WAITED_MS).expect("waited_ms");
    // The wait lasts until the deadline (1 ms of slack for rounding).
    assert!(
        waited >= 199.0,
        "timed out after {waited} ms of a 200 ms timeout"
    );
    let busy = spans_named(&spans, telemetry::TRY_ACQUIRE_SPAN, &held, 1)[0];
    assert_try_acquire(busy, &held, HOLDER_A, outcome::BUSY);
    let release = spans_named(&spans, telemetry::RELEASE_SPAN, &held, 1)[0];
    assert_release(release, &held, HOLDER_B, via::GUARD, outcome::RELEASED);

    // try_acquire + release(key)
    let acquired = spans_named(&spans, telemetry::TRY_ACQUIRE_SPAN, &tried, 1)[0];
    assert_try_acquire(acquired, &tried, HOLDER_A, outcome::ACQUIRED);
    let release = spans_named(&spans, telemetry::RELEASE_SPAN, &tried, 1)[0];
    assert_release(release, &tried, HOLDER_A, via::KEY, outcome::RELEASED);

    // release of a never-held key
    let release = spans_named(&spans, telemetry::RELEASE_SPAN, &never, 1)[0];
    assert_release(release, &never, HOLDER_A, via::KEY, outcome::NOT_HELD);

    // The dropped guard: acquire, background release, acquire again (with a timeout), release.
    let acquires = spans_named(&spans, telemetry::ACQUIRE_SPAN, &dropped, 2);
    assert_acquire(acquires[0], &dropped, HOLDER_A, None, outcome::ACQUIRED);
    assert_acquire(
        acquires[1],
        &dropped,
        HOLDER_A,
        Some(10_000.0),
        outcome::ACQUIRED,
    );
    let releases = spans_named(&spans, telemetry::RELEASE_SPAN, &dropped, 2);
    // The next acquisition was already queued in-process when the background release ran, so
    // the lock was handed straight to it, unless the handoff time limit had passed.
    let dropped_outcome = str_attr(releases[0], telemetry::OUTCOME).expect("an outcome");
    let expected = if dropped_outcome == outcome::HANDED_OVER {
        outcome::HANDED_OVER
    } else {
        outcome::RELEASED
    };
    assert_release(releases[0], &dropped, HOLDER_A, via::DROP, expected);
    assert_release(
        releases[1],
        &dropped,
        HOLDER_A,
        via::GUARD,
        outcome::RELEASED,
    );
    assert!(acquires[0].end_time <= releases[0].start_time);
    // The second acquire was granted only once the background release had finished.
    assert!(
        releases[0].end_time <= acquires[1].end_time,
        "background release ended at {:?}, the next acquire at {:?}",
        releases[0].end_time,
        acquires[1].end_time
    );

    // Released by key under a live guard: the key's release releases it, the guard's finds
    // it already released, and neither is a failure.
    let acquire = spans_named(&spans, telemetry::ACQUIRE_SPAN, &taken, 1)[0];
    assert_acquire(acquire, &taken, HOLDER_A, None, outcome::ACQUIRED);
    let releases = spans_named(&spans, telemetry::RELEASE_SPAN, &taken, 2);
    assert_release(releases[0], &taken, HOLDER_A, via::KEY, outcome::RELEASED);
    assert_release(
        releases[1],
        &taken,
        HOLDER_A,
        via::GUARD,
        outcome::ALREADY_RELEASED,
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_manager_built_with_tracing_off_emits_no_spans() {
    let capture = Capture::install();
    let quiet = PostgresLockManager::builder(common::pool(4).await)
        .holder_id("telemetry-quiet")
        .tracing(false)
        .build();
    // A traced manager in the same test proves the pipeline exports spans here.
    let loud = PostgresLockManager::builder(common::pool(4).await)
        .holder_id("telemetry-loud")
        .build();
    let guarded = common::key("quiet-guard");
    let tried = common::key("quiet-try");
    let never = common::key("quiet-never");
    let dropped = common::key("quiet-drop");
    let shared = common::key("quiet-shared");

    let guard = quiet.acquire(&guarded, None).await.expect("a free key");
    guard.release().await.expect("release");
    common::hold(&quiet, &tried).await;
    quiet.release(&tried).await.expect("release by key");
    quiet.release(&never).await.expect_err("never held");
    drop(quiet.acquire(&dropped, None).await.expect("a free key"));
    let again = quiet
        .acquire(&dropped, Some(Duration::from_secs(10)))
        .await
        .expect("the dropped guard's lock is released");
    again.release().await.expect("release");

    let other = loud.acquire(&shared, None).await.expect("a free key");
    let err = quiet
        .acquire(&shared, Some(Duration::from_millis(100)))
        .await
        .expect_err("the key is held");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        quiet
            .try_acquire(&shared)
            .await
            .expect("try_acquire")
            .into_handle()
            .is_none()
    );
    other.release().await.expect("release");

    let spans = capture.finished_spans();
    // The traced manager's two spans on the shared key, and nothing from the quiet one.
    let acquire = spans_named(&spans, telemetry::ACQUIRE_SPAN, &shared, 1)[0];
    assert_acquire(acquire, &shared, "telemetry-loud", None, outcome::ACQUIRED);
    let release = spans_named(&spans, telemetry::RELEASE_SPAN, &shared, 1)[0];
    assert_release(
        release,
        &shared,
        "telemetry-loud",
        via::GUARD,
        outcome::RELEASED,
    );
    spans_named(&spans, telemetry::TRY_ACQUIRE_SPAN, &shared, 0);
    for key in [&guarded, &tried, &never, &dropped] {
        for name in [
            telemetry::ACQUIRE_SPAN,
            telemetry::TRY_ACQUIRE_SPAN,
            telemetry::RELEASE_SPAN,
        ] {
            spans_named(&spans, name, key, 0);
        }
    }
    let from_quiet: Vec<&SpanData> = spans
        .iter()
        .filter(|s| str_attr(s, telemetry::HOLDER_ID) == Some("telemetry-quiet"))
        .collect();
    assert!(from_quiet.is_empty(), "{from_quiet:#?}");
}

#[tokio::test(flavor = "current_thread")]
async fn a_lost_lock_emits_a_lost_span_with_its_cause() {
    let capture = Capture::install();
    let locks = pglock::InMemoryLockManager::builder()
        .holder_id("telemetry-lost")
        .build();
    let key = common::key("telemetry-lost");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    assert!(locks.simulate_loss(&key).await);
    let cause = tokio::time::timeout(Duration::from_secs(10), guard.loss_signal().lost())
        .await
        .expect("the simulated loss is signalled");
    assert_eq!(cause, pglock::LossCause::Simulated);
    assert!(guard.release().await.is_err());

    let spans = capture.finished_spans();
    let lost = spans_named(&spans, telemetry::LOST_SPAN, &key, 1)[0];
    assert_eq!(str_attr(lost, telemetry::KEY), Some(key.as_str()));
    assert_eq!(i64_attr(lost, telemetry::LOCK_ID), Some(lock_id(&key)));
    assert_eq!(str_attr(lost, telemetry::HOLDER_ID), Some("telemetry-lost"));
    assert_eq!(str_attr(lost, telemetry::MODE), Some("exclusive"));
    assert_eq!(
        str_attr(lost, telemetry::CAUSE),
        Some(pglock::LossCause::Simulated.to_string().as_str())
    );
    assert!(matches!(lost.status, Status::Error { .. }), "{lost:#?}");
    // The guard's release after the loss is reported as such.
    let release = spans_named(&spans, telemetry::RELEASE_SPAN, &key, 1)[0];
    assert_eq!(str_attr(release, telemetry::OUTCOME), Some(outcome::LOST));
}

/// What a `fmt` subscriber writes, kept for the test to read.
#[derive(Clone, Default)]
struct Written(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Written {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Where nobody wants the spans (a subscriber that takes warnings only) and no metrics are
/// kept, the manager takes its quiet path, which reads no clock and records nothing: a failed
/// acquisition is still a warning there.
#[tokio::test(flavor = "current_thread")]
async fn a_failed_acquisition_warns_where_no_span_is_wanted() {
    let written = Written::default();
    let writer = written.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let locks = pglock::InMemoryLockManager::builder()
        .lock_budget(1)
        .metrics(false)
        .build();
    let held = locks.acquire("warned-first", None).await.expect("acquire");
    let blocking = locks
        .acquire("warned-second", None)
        .await
        .expect_err("over budget");
    let trying = locks
        .try_acquire("warned-second")
        .await
        .expect_err("over budget");
    for err in [&blocking, &trying] {
        assert!(
            matches!(err, pglock::Error::BudgetExhausted { .. }),
            "{err:?}"
        );
    }
    let out = String::from_utf8(written.0.lock().unwrap().clone()).expect("utf-8");
    assert_eq!(out.matches("lock acquisition failed").count(), 2, "{out}");
    assert_eq!(out.matches("warned-second").count(), 2, "{out}");
    held.release().await.expect("release");
}
