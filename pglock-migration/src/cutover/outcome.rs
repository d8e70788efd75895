//! What a cutover returns: the switch it made, or why it made none.

use std::fmt;
use std::time::Duration;

use uuid::Uuid;

use crate::Error;

/// What [`CutoverManager::execute_cutover`](crate::CutoverManager::execute_cutover) returns:
/// the switch it made, or why it made none.
///
/// ```
/// use pglock_migration::{CutoverFailure, CutoverResult};
///
/// fn log(result: &CutoverResult) {
///     match result {
///         Ok(done) => println!("switched in {:?}, {} events synced", done.duration, done.events_synced),
///         Err(failed) if failed.failure == CutoverFailure::LockUnavailable => {
///             println!("another process is cutting over: {failed}");
///         }
///         Err(failed) => println!("not switched (rolled back: {}): {failed}", failed.rolled_back),
///     }
/// }
/// ```
pub type CutoverResult = std::result::Result<Cutover, CutoverError>;

/// A cutover that switched its tenant to the target store and completed the migration.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cutover {
    /// The migration.
    pub migration_id: Uuid,
    /// The cutover attempt, as recorded in the audit log.
    pub attempt_id: Uuid,
    /// The whole call, the wait for the lock included.
    pub duration: Duration,
    /// How far the sync lag fell between the cutover's two measurements.
    pub events_synced: u64,
}

impl Cutover {
    /// [`duration`](Self::duration) in milliseconds, as the Python original's `duration_ms`.
    pub fn duration_ms(&self) -> f64 {
        duration_ms(self.duration)
    }

    /// True when the cutover took less than 100 ms, the original's target.
    pub fn within_timeout(&self) -> bool {
        self.duration_ms() < 100.0
    }
}

/// A cutover that did not switch its tenant.
///
/// Displays as the Python original's `error_message` where it had one, such as
/// `Failed to acquire cutover lock: Failed to acquire lock 'cutover:<tenant>': Timeout after 0.5s`
/// or `Sync lag too high for cutover: 5 events (max: 0)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct CutoverError {
    /// The migration.
    pub migration_id: Uuid,
    /// Why, in a form code can match on.
    pub failure: CutoverFailure,
    /// Why, in words.
    pub message: String,
    /// True when the cutover had moved the tenant into `cutover` and put it back into
    /// `dual_write` on the source. False when it failed before changing anything.
    pub rolled_back: bool,
    /// The whole call, the wait for the lock included.
    pub duration: Duration,
    /// How far the sync lag fell between the cutover's two measurements, if it got that far.
    pub events_synced: u64,
}

impl CutoverError {
    /// [`duration`](Self::duration) in milliseconds, as the Python original's `duration_ms`.
    pub fn duration_ms(&self) -> f64 {
        duration_ms(self.duration)
    }
}

/// Why a cutover did not switch the tenant.
///
/// [`LockUnavailable`](Self::LockUnavailable), [`MigrationNotFound`](Self::MigrationNotFound),
/// [`AlreadyMigrated`](Self::AlreadyMigrated), [`WrongPhase`](Self::WrongPhase),
/// [`RoutingMissing`](Self::RoutingMissing), [`WrongRoutingState`](Self::WrongRoutingState),
/// [`UnknownTargetStore`](Self::UnknownTargetStore), and a [`Timeout`](Self::Timeout) while
/// draining writes, are found before anything is written. The others happen once the
/// migration is in `cutover`, which is then rolled back ([`CutoverError::rolled_back`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CutoverFailure {
    /// The cutover lock (or the write gate) could not be taken in time: another process is
    /// cutting the tenant over, or the lock manager failed.
    LockUnavailable,
    /// There is no such migration.
    MigrationNotFound,
    /// The migration is already completed: another cutover switched the tenant.
    AlreadyMigrated,
    /// The migration is not in `dual_write`.
    WrongPhase,
    /// The tenant has no routing row.
    RoutingMissing,
    /// The tenant's routing is not in `dual_write`.
    WrongRoutingState,
    /// The target store is not in the application's registry.
    UnknownTargetStore,
    /// The cutover ran out of its time budget.
    Timeout,
    /// The sync lag could not be calculated.
    LagUnavailable,
    /// The sync lag is above the migration's maximum.
    LagTooHigh,
    /// The target store failed its health check.
    TargetUnhealthy,
    /// The migration or routing was changed by someone else while the cutover held the lock
    /// (an abort, or a lock that was lost).
    StateChanged,
    /// The routing row was written under a newer fencing token: this cutover's lock was lost.
    FenceRejected,
    /// The lock manager declared the cutover lock lost while the cutover ran, or it was
    /// released through the manager (`release`, `release_all`); the cutover was stopped and
    /// rolled back.
    LockLost,
    /// The migration store failed.
    Storage,
}

impl CutoverFailure {
    /// A snake_case name, as recorded in the [`FAILURE`](crate::telemetry::FAILURE) span field.
    pub fn as_str(self) -> &'static str {
        match self {
            CutoverFailure::LockUnavailable => "lock_unavailable",
            CutoverFailure::MigrationNotFound => "migration_not_found",
            CutoverFailure::AlreadyMigrated => "already_migrated",
            CutoverFailure::WrongPhase => "wrong_phase",
            CutoverFailure::RoutingMissing => "routing_missing",
            CutoverFailure::WrongRoutingState => "wrong_routing_state",
            CutoverFailure::UnknownTargetStore => "unknown_target_store",
            CutoverFailure::Timeout => "timeout",
            CutoverFailure::LagUnavailable => "lag_unavailable",
            CutoverFailure::LagTooHigh => "lag_too_high",
            CutoverFailure::TargetUnhealthy => "target_unhealthy",
            CutoverFailure::StateChanged => "state_changed",
            CutoverFailure::LockLost => "lock_lost",
            CutoverFailure::FenceRejected => "fence_rejected",
            CutoverFailure::Storage => "storage",
        }
    }

    /// The failure that a store error stands for.
    pub(crate) fn of(err: &Error) -> Self {
        match err {
            Error::FenceRejected { .. } => CutoverFailure::FenceRejected,
            err if err.is_refused() => CutoverFailure::StateChanged,
            _ => CutoverFailure::Storage,
        }
    }
}

impl fmt::Display for CutoverFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failure and its message, before the cutover knows its duration.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub(crate) kind: CutoverFailure,
    pub(crate) message: String,
}

impl Failure {
    pub(crate) fn new(kind: CutoverFailure, message: impl Into<String>) -> Self {
        Failure {
            kind,
            message: message.into(),
        }
    }

    /// The failure a store error stands for, its message prefixed with `context` if any.
    pub(crate) fn store(err: &Error, context: &str) -> Self {
        Failure::new(CutoverFailure::of(err), format!("{context}{err}"))
    }
}

/// How an attempt ended, before its duration is known.
#[derive(Debug)]
pub(crate) struct Ended {
    pub(crate) attempt_id: Option<Uuid>,
    pub(crate) failure: Option<(Failure, bool)>,
    pub(crate) events_synced: u64,
}

impl Ended {
    /// Failed before anything was written.
    pub(crate) fn early(failure: Failure) -> Self {
        Ended {
            attempt_id: None,
            failure: Some((failure, false)),
            events_synced: 0,
        }
    }

    pub(crate) fn result(self, migration_id: Uuid, duration: Duration) -> CutoverResult {
        match self.failure {
            None => Ok(Cutover {
                migration_id,
                attempt_id: self.attempt_id.unwrap_or_default(),
                duration,
                events_synced: self.events_synced,
            }),
            Some((failure, rolled_back)) => Err(CutoverError {
                migration_id,
                failure: failure.kind,
                message: failure.message,
                rolled_back,
                duration,
                events_synced: self.events_synced,
            }),
        }
    }
}

pub(crate) fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}
