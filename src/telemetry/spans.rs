//! The spans of lock operations, with their fields declared up front and the outcome recorded
//! when the operation ends (or `cancelled` when it never does).

use std::time::Duration;

use tracing::{Span, field::Empty};

use crate::telemetry::{self, SpanOutcome};
use crate::{LockKey, LockMode};

pub(crate) fn acquire_span(
    enabled: bool,
    key: &LockKey,
    lock_id: i64,
    mode: LockMode,
    timeout: Option<Duration>,
    holder_id: &str,
) -> Span {
    if !wanted(enabled) {
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
    if !wanted(enabled) {
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

/// The release's outcome recorder and its span; the lock id and mode are recorded once the
/// entry is known.
#[inline]
pub(crate) fn release(enabled: bool, key: &LockKey, holder_id: &str, how: &'static str) -> Outcome {
    if !wanted(enabled) {
        return Outcome(None);
    }
    Outcome::new(release_span(key, holder_id, how))
}

fn release_span(key: &LockKey, holder_id: &str, how: &'static str) -> Span {
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

/// The span of a semaphore's `acquire` (a `timeout`) or `try_acquire` (none).
pub(crate) fn semaphore_span(
    enabled: bool,
    try_only: bool,
    name: &str,
    permits: usize,
    timeout: Option<Duration>,
    holder_id: &str,
) -> Span {
    if !wanted(enabled) {
        return Span::none();
    }
    use telemetry::semaphore as names;
    let span = if try_only {
        tracing::info_span!(
            names::TRY_ACQUIRE_SPAN,
            { names::SEMAPHORE } = name,
            { names::PERMITS } = permits,
            { telemetry::HOLDER_ID } = holder_id,
            { telemetry::OUTCOME } = Empty,
            { telemetry::WAITED_MS } = Empty,
            { names::SLOT } = Empty,
            otel.status_code = Empty,
        )
    } else {
        tracing::info_span!(
            names::ACQUIRE_SPAN,
            { names::SEMAPHORE } = name,
            { names::PERMITS } = permits,
            { telemetry::HOLDER_ID } = holder_id,
            { telemetry::TIMEOUT_MS } = Empty,
            { telemetry::OUTCOME } = Empty,
            { telemetry::WAITED_MS } = Empty,
            { names::SLOT } = Empty,
            otel.status_code = Empty,
        )
    };
    let span = only_if_wanted(span);
    if let Some(timeout) = timeout {
        span.record(telemetry::TIMEOUT_MS, duration_ms(timeout));
    }
    span
}

/// Whether the manager traces and any subscriber takes `INFO` spans at all: one atomic load,
/// where making a span just to find it disabled costs a callsite check and, with `tracing`'s
/// `log` feature (which sqlx turns on), a log record at its creation and drop.
#[inline]
fn wanted(enabled: bool) -> bool {
    enabled && tracing::level_enabled!(tracing::Level::INFO)
}

/// `span`, or no span at all when no subscriber wants it (one may take `INFO` but filter this
/// target out). A disabled span still costs a check
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

/// A lock operation's outcome recorder: records [`telemetry::OUTCOME`] on its span when the
/// operation ends, and `cancelled` if it never does. Without a span (nobody wants it) it holds
/// nothing, and recording, finishing and dropping it cost a branch each.
pub(crate) struct Outcome(Option<SpanOutcome>);

impl Outcome {
    #[inline]
    pub(crate) fn new(span: Span) -> Self {
        Outcome((!span.is_none()).then(|| SpanOutcome::new(span, telemetry::OUTCOME)))
    }

    /// The span, if there is one.
    #[inline]
    pub(crate) fn span(&self) -> Option<&Span> {
        self.0.as_ref().map(SpanOutcome::span)
    }

    #[inline]
    pub(crate) fn record(&self, field: &'static str, value: impl tracing::Value) {
        if let Some(span) = self.span() {
            span.record(field, value);
        }
    }

    #[inline]
    pub(crate) fn finish(&mut self, outcome: &'static str, failed: bool) {
        if let Some(recorder) = &mut self.0 {
            recorder.finish(outcome, failed);
        }
    }
}

/// Warns that an operation failed: inside its span when it has one, else as a root event (a
/// subscriber may take warnings and not spans).
pub(crate) fn warn_failed(span: Option<&Span>, err: &crate::Error, what: &'static str) {
    match span {
        Some(span) => tracing::warn!(parent: span, error = %err, "{what}"),
        None => tracing::warn!(parent: None, error = %err, "{what}"),
    }
}

pub(crate) fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
