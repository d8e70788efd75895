//! The spans of lock operations, with their fields declared up front and the outcome recorded
//! when the operation ends (or `cancelled` when it never does).

use std::time::Duration;

use tracing::{Span, field::Empty};

use crate::telemetry;
use crate::{LockKey, LockMode};

pub(crate) fn acquire_span(
    enabled: bool,
    key: &LockKey,
    lock_id: i64,
    mode: LockMode,
    timeout: Option<Duration>,
    holder_id: &str,
) -> Span {
    if !enabled {
        return Span::none();
    }
    let span = only_if_wanted(tracing::info_span!(
        telemetry::ACQUIRE_SPAN,
        { telemetry::KEY } = %key,
        { telemetry::LOCK_ID } = lock_id,
        { telemetry::MODE } = mode.as_str(),
        { telemetry::TIMEOUT_MS } = Empty,
        { telemetry::HOLDER_ID } = holder_id,
        { telemetry::OUTCOME } = Empty,
        { telemetry::WAITED_MS } = Empty,
        otel.status_code = Empty,
    ));
    if let Some(timeout) = timeout {
        span.record(telemetry::TIMEOUT_MS, duration_ms(timeout));
    }
    span
}

pub(crate) fn try_acquire_span(
    enabled: bool,
    key: &LockKey,
    lock_id: i64,
    mode: LockMode,
    holder_id: &str,
) -> Span {
    if !enabled {
        return Span::none();
    }
    only_if_wanted(tracing::info_span!(
        telemetry::TRY_ACQUIRE_SPAN,
        { telemetry::KEY } = %key,
        { telemetry::LOCK_ID } = lock_id,
        { telemetry::MODE } = mode.as_str(),
        { telemetry::HOLDER_ID } = holder_id,
        { telemetry::OUTCOME } = Empty,
        otel.status_code = Empty,
    ))
}

/// The release span; the lock id and mode are recorded once the entry is known.
pub(crate) fn release_span(
    enabled: bool,
    key: &LockKey,
    holder_id: &str,
    how: &'static str,
) -> Span {
    if !enabled {
        return Span::none();
    }
    only_if_wanted(tracing::info_span!(
        telemetry::RELEASE_SPAN,
        { telemetry::KEY } = %key,
        { telemetry::LOCK_ID } = Empty,
        { telemetry::MODE } = Empty,
        { telemetry::HOLDER_ID } = holder_id,
        { telemetry::RELEASE_VIA } = how,
        { telemetry::OUTCOME } = Empty,
        otel.status_code = Empty,
    ))
}

/// `span`, or no span at all when no subscriber wants it. A disabled span still costs a check
/// (and, with `tracing`'s `log` feature, which sqlx turns on, a look at the `log` level) at
/// every enter, exit and record of every poll; `Span::none()` costs nothing.
fn only_if_wanted(span: Span) -> Span {
    if span.is_disabled() {
        Span::none()
    } else {
        span
    }
}

/// Emits the `pglock.lost` span and its warning.
pub(crate) fn lost(
    key: &LockKey,
    lock_id: i64,
    mode: LockMode,
    holder_id: &str,
    cause: &crate::LossCause,
) {
    let span = tracing::warn_span!(
        telemetry::LOST_SPAN,
        { telemetry::KEY } = %key,
        { telemetry::LOCK_ID } = lock_id,
        { telemetry::MODE } = mode.as_str(),
        { telemetry::HOLDER_ID } = holder_id,
        { telemetry::CAUSE } = %cause,
        otel.status_code = "ERROR",
    );
    tracing::warn!(parent: &span, %cause, "lock lost");
}

/// Records a span's outcome when an operation ends, and `cancelled` if it never does.
pub(crate) type Outcome = crate::telemetry::SpanOutcome;

/// A lock operation's outcome recorder: its span's outcome field is [`telemetry::OUTCOME`].
pub(crate) fn outcome(span: Span) -> Outcome {
    crate::telemetry::SpanOutcome::new(span, telemetry::OUTCOME)
}

pub(crate) fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
