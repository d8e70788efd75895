//! Names of the `tracing` spans and fields the migration module emits.
//!
//! The conventions are those of [`pglock::telemetry`]: every field is declared when the span
//! opens, [`OUTCOME`] is recorded when it closes (including [`outcome::CANCELLED`] when the
//! caller dropped the future), and failures set `otel.status_code` to `ERROR`. Spans are emitted
//! at `INFO` level and can be switched off with the builders' `tracing(false)`. The lock
//! manager's own spans (`pglock.acquire`, `pglock.release`, ...) nest inside them.
//!
//! | span | covers | fields |
//! | --- | --- | --- |
//! | [`TRIGGER_SPAN`] | one [`MigrationCoordinator::trigger_cutover`](crate::MigrationCoordinator::trigger_cutover) | [`MIGRATION_ID`], [`TENANT_ID`], [`OUTCOME`], [`FAILURE`] |
//! | [`EXECUTE_SPAN`] | one [`CutoverManager::execute_cutover`](crate::CutoverManager::execute_cutover), lock wait included | [`MIGRATION_ID`], [`TENANT_ID`], [`TARGET_STORE_ID`], [`TIMEOUT_MS`], [`LOCK_TIMEOUT_MS`], [`ATTEMPT_ID`], [`FENCING_TOKEN`], [`OUTCOME`], [`FAILURE`], [`EVENTS_SYNCED`], [`ROLLED_BACK`], [`DURATION_MS`] |
//! | [`ROLLBACK_SPAN`] | one rollback of a cutover attempt: after a failure, after a cancellation (on a spawned task), or the repair of an interrupted attempt | [`MIGRATION_ID`], [`TENANT_ID`], [`ATTEMPT_ID`], [`REASON`], [`OUTCOME`] |
//! | [`READINESS_SPAN`] | one [`CutoverManager::validate_cutover_readiness`](crate::CutoverManager::validate_cutover_readiness) | [`MIGRATION_ID`], [`TENANT_ID`], [`READY`], [`REASON`], [`OUTCOME`] |

/// Span around one cutover, from the first read to the release of the lock.
pub const EXECUTE_SPAN: &str = "pglock.migration.cutover.execute";
/// Span around one rollback of a cutover attempt.
pub const ROLLBACK_SPAN: &str = "pglock.migration.cutover.rollback";
/// Span around one readiness check.
pub const READINESS_SPAN: &str = "pglock.migration.cutover.readiness";
/// Span around one coordinator-triggered cutover, pre-checks included.
pub const TRIGGER_SPAN: &str = "pglock.migration.trigger_cutover";

/// Field: the migration id.
pub const MIGRATION_ID: &str = "pglock.migration.id";
/// Field: the tenant id.
pub const TENANT_ID: &str = "pglock.migration.tenant_id";
/// Field: the store the tenant moves to.
pub const TARGET_STORE_ID: &str = "pglock.migration.target_store_id";
/// Field: the cutover budget in milliseconds.
pub const TIMEOUT_MS: &str = "pglock.migration.timeout_ms";
/// Field: how long the cutover waits for its lock, in milliseconds.
pub const LOCK_TIMEOUT_MS: &str = "pglock.migration.lock_timeout_ms";
/// Field: the id of the cutover attempt, once it holds the lock.
pub const ATTEMPT_ID: &str = "pglock.migration.attempt_id";
/// Field: the cutover lock's fencing token, when the lock manager mints them.
pub const FENCING_TOKEN: &str = "pglock.migration.fencing_token";
/// Field: how the operation ended; one of the [`outcome`] values.
pub const OUTCOME: &str = "pglock.migration.outcome";
/// Field: why a cutover failed ([`CutoverFailure::as_str`](crate::CutoverFailure::as_str)).
pub const FAILURE: &str = "pglock.migration.failure";
/// Field: events synced during the cutover.
pub const EVENTS_SYNCED: &str = "pglock.migration.events_synced";
/// Field: whether a failed cutover was rolled back.
pub const ROLLED_BACK: &str = "pglock.migration.rolled_back";
/// Field: the cutover's duration in milliseconds, lock wait included.
pub const DURATION_MS: &str = "pglock.migration.duration_ms";
/// Field: whether the tenant is ready for cutover.
pub const READY: &str = "pglock.migration.ready";
/// Field: why a check said no, or why a rollback ran.
pub const REASON: &str = "pglock.migration.reason";

/// Values of the [`OUTCOME`] field.
pub mod outcome {
    /// The cutover switched the tenant.
    pub const SUCCEEDED: &str = "succeeded";
    /// The cutover did not switch the tenant; [`FAILURE`](crate::telemetry::FAILURE) says why.
    pub const FAILED: &str = "failed";
    /// A rollback put the tenant back into `dual_write`.
    pub const ROLLED_BACK: &str = "rolled_back";
    /// The readiness check said yes.
    pub const READY: &str = "ready";
    /// The readiness check said no; [`REASON`](crate::telemetry::REASON) says why.
    pub const NOT_READY: &str = "not_ready";
    /// The operation failed with an error.
    pub const ERROR: &str = "error";
    /// The caller dropped the future before it finished.
    pub const CANCELLED: &str = "cancelled";
}

/// Records `span`'s [`OUTCOME`] when an operation ends, and `cancelled` if it never does (the
/// caller dropped the future).
pub(crate) fn recorder(span: tracing::Span) -> pglock::telemetry::SpanOutcome {
    pglock::telemetry::SpanOutcome::new(span, OUTCOME)
}
