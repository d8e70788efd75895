//! The three transitions of a cutover attempt: enter, complete, roll back.

use uuid::Uuid;

use crate::model::{AuditEvent, Migration, MigrationPhase, RoutingState};
use crate::store::{RoutingChange, Transition};

/// Who a cutover attempt is and what it moves; everything owned, so a spawned rollback can
/// carry it.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    pub(crate) migration_id: Uuid,
    pub(crate) tenant_id: Uuid,
    pub(crate) attempt_id: Uuid,
    pub(crate) source_store_id: String,
    pub(crate) target_store_id: String,
    /// The cutover lock's fencing token, stamped on every routing write.
    pub(crate) fencing_token: Option<i64>,
}

impl Plan {
    pub(crate) fn new(migration: &Migration, attempt_id: Uuid, fencing_token: Option<i64>) -> Self {
        Plan {
            migration_id: migration.id,
            tenant_id: migration.tenant_id,
            attempt_id,
            source_store_id: migration.source_store_id.clone(),
            target_store_id: migration.target_store_id.clone(),
            fencing_token,
        }
    }

    /// The same migration, as another attempt (to roll back an interrupted one).
    pub(crate) fn for_attempt(&self, attempt_id: Uuid) -> Self {
        Plan {
            attempt_id,
            ..self.clone()
        }
    }

    /// `dual_write -> cutover`, routing `dual_write -> cutover_paused`, stamped with the attempt.
    pub(crate) fn enter(&self) -> Transition {
        self.transition(MigrationPhase::DualWrite, MigrationPhase::Cutover)
            .attempt(None, Some(self.attempt_id))
            .routing(self.routing(
                RoutingState::DualWrite,
                RoutingState::CutoverPaused,
                &self.source_store_id,
            ))
    }

    /// `cutover -> completed`, routing `cutover_paused -> migrated` on the target.
    pub(crate) fn complete(&self, events_synced: u64, duration_ms: f64) -> Transition {
        let routing = self
            .routing(
                RoutingState::CutoverPaused,
                RoutingState::Migrated,
                &self.target_store_id,
            )
            .target(None)
            .owner(None);
        self.transition(MigrationPhase::Cutover, MigrationPhase::Completed)
            .attempt(Some(self.attempt_id), None)
            .routing(routing)
            .cutover_stats(events_synced, duration_ms)
    }

    /// `cutover -> dual_write`, routing `cutover_paused -> dual_write` on the source, with the
    /// reason recorded as the migration's error and in the audit entry.
    pub(crate) fn roll_back(&self, reason: &str) -> Transition {
        self.transition(MigrationPhase::Cutover, MigrationPhase::DualWrite)
            .attempt(Some(self.attempt_id), None)
            .routing(self.routing(
                RoutingState::CutoverPaused,
                RoutingState::DualWrite,
                &self.source_store_id,
            ))
            .error(format!("Cutover failed: {reason}"))
            .message(reason)
    }

    fn transition(&self, from: MigrationPhase, to: MigrationPhase) -> Transition {
        let event = match to {
            MigrationPhase::Cutover => AuditEvent::CutoverInitiated,
            MigrationPhase::Completed => AuditEvent::CutoverCompleted,
            _ => AuditEvent::CutoverRolledBack,
        };
        Transition::between(self.migration_id, self.tenant_id, from, to, event)
    }

    fn routing(&self, expected: RoutingState, state: RoutingState, store: &str) -> RoutingChange {
        RoutingChange::new(expected, state, store)
            .target(Some(self.target_store_id.clone()))
            .owner(Some(self.migration_id))
            .fencing_token(self.fencing_token)
    }
}
