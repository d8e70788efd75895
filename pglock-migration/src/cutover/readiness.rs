//! Whether a migration could be cut over now, and if not, why.

use std::fmt;

use pglock::LockManagerExt;
use tracing::Span;
use uuid::Uuid;

use crate::model::{MigrationPhase, RoutingState};
use crate::plugins::SyncLag;
use crate::telemetry;
use crate::{Error, Result};

/// The answer of
/// [`CutoverManager::validate_cutover_readiness`](crate::CutoverManager::validate_cutover_readiness).
///
/// ```
/// use pglock_migration::{NotReady, Readiness};
///
/// let answer = Readiness::NotReady(NotReady::LagTooHigh { events: 5, max: 0 });
/// assert!(!answer.is_ready());
/// // The Python original's text, for logs and mixed fleets.
/// assert_eq!(answer.to_string(), "Sync lag too high: 5 events (max 0)");
/// assert_eq!(Readiness::Ready.to_string(), "ready");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Every check passed, and the cutover lock was free a moment ago.
    Ready,
    /// A check failed.
    NotReady(NotReady),
}

impl Readiness {
    /// True for [`Ready`](Readiness::Ready).
    pub fn is_ready(&self) -> bool {
        matches!(self, Readiness::Ready)
    }

    /// Why not, when not ready.
    pub fn reason(&self) -> Option<&NotReady> {
        match self {
            Readiness::Ready => None,
            Readiness::NotReady(reason) => Some(reason),
        }
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Readiness::Ready => f.write_str("ready"),
            Readiness::NotReady(reason) => reason.fmt(f),
        }
    }
}

/// Why a migration is not ready for cutover, in the order the checks run.
///
/// Each displays as the Python original's reason, where it had one.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum NotReady {
    /// `Unable to calculate sync lag`: the lag source had no answer, or failed.
    LagUnavailable,
    /// `Sync lag too high: {events} events (max {max})`.
    LagTooHigh {
        /// The lag measured.
        events: u64,
        /// The migration's `max_lag_events`.
        max: u64,
    },
    /// `No routing configuration found for tenant`.
    RoutingMissing,
    /// `Invalid migration state: {state} (expected DUAL_WRITE)`: the routing state.
    WrongRoutingState(RoutingState),
    /// `Migration is in {phase} phase, expected DUAL_WRITE`.
    WrongPhase(MigrationPhase),
    /// `Target store '{id}' is not registered`.
    UnknownTargetStore(String),
    /// `Cutover lock is already held by another process` (also when this process holds it).
    LockHeld,
}

impl fmt::Display for NotReady {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NotReady::LagUnavailable => f.write_str("Unable to calculate sync lag"),
            NotReady::LagTooHigh { events, max } => {
                write!(f, "Sync lag too high: {events} events (max {max})")
            }
            NotReady::RoutingMissing => f.write_str("No routing configuration found for tenant"),
            NotReady::WrongRoutingState(state) => {
                write!(f, "Invalid migration state: {state} (expected DUAL_WRITE)")
            }
            NotReady::WrongPhase(phase) => {
                write!(f, "Migration is in {phase} phase, expected DUAL_WRITE")
            }
            NotReady::UnknownTargetStore(id) => write!(f, "Target store '{id}' is not registered"),
            NotReady::LockHeld => f.write_str("Cutover lock is already held by another process"),
        }
    }
}

impl super::CutoverManager {
    /// The checks of
    /// [`validate_cutover_readiness`](super::CutoverManager::validate_cutover_readiness), in
    /// order.
    pub(super) async fn readiness(
        &self,
        migration_id: Uuid,
        lag: &dyn SyncLag,
        span: &Span,
    ) -> Result<Readiness> {
        let not_ready = |reason| Ok(Readiness::NotReady(reason));
        let migration = self
            .store
            .get_migration(migration_id)
            .await?
            .ok_or(Error::MigrationNotFound { migration_id })?;
        let tenant_id = migration.tenant_id;
        span.record(telemetry::TENANT_ID, tracing::field::display(tenant_id));
        let max = migration.config.max_lag_events;
        let measured = lag
            .lag(
                tenant_id,
                &migration.source_store_id,
                &migration.target_store_id,
            )
            .await;
        match measured {
            Ok(Some(events)) if events > max => {
                return not_ready(NotReady::LagTooHigh { events, max });
            }
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return not_ready(NotReady::LagUnavailable),
        }
        let Some(routing) = self.store.get_routing(tenant_id).await? else {
            return not_ready(NotReady::RoutingMissing);
        };
        if routing.state != RoutingState::DualWrite {
            return not_ready(NotReady::WrongRoutingState(routing.state));
        }
        if migration.phase != MigrationPhase::DualWrite {
            return not_ready(NotReady::WrongPhase(migration.phase));
        }
        if !self.stores.is_registered(&migration.target_store_id) {
            return not_ready(NotReady::UnknownTargetStore(migration.target_store_id));
        }
        // The probe's guard releases the lock as it drops, should this future be dropped
        // before the release below.
        match self.locks.try_acquire(Self::lock_key(tenant_id)).await {
            Ok(pglock::Attempt::Acquired(probe)) => probe.release().await?,
            Ok(_busy) => return not_ready(NotReady::LockHeld),
            // Asked from inside this process's own critical section on the cutover lock: held,
            // by this process, as for any other holder.
            Err(pglock::Error::Reentrant { .. }) => return not_ready(NotReady::LockHeld),
            Err(err) => return Err(err.into()),
        }
        Ok(Readiness::Ready)
    }
}
