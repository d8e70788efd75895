//! The rules both migration stores apply, stated once.
//!
//! Each function takes the rows a change finds and the time it happens, and returns the rows to
//! write, or why the change is refused. The stores only find the rows (locked, on PostgreSQL),
//! and write what these return in one atomic step; so the in-memory store cannot drift from
//! the PostgreSQL one.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use crate::model::{
    AuditEntry, AuditEvent, Migration, MigrationPhase, NewMigration, RoutingState, TenantRouting,
};
use crate::store::{RoutingChange, Transition};
use crate::{Error, Result};

/// An audit entry to append; the store numbers it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AuditRecord {
    pub(crate) migration_id: Uuid,
    pub(crate) tenant_id: Uuid,
    pub(crate) event: AuditEvent,
    pub(crate) from_phase: Option<MigrationPhase>,
    pub(crate) to_phase: Option<MigrationPhase>,
    pub(crate) message: Option<String>,
    pub(crate) cutover_attempt: Option<Uuid>,
    pub(crate) fencing_token: Option<i64>,
    pub(crate) events_synced: Option<u64>,
    pub(crate) duration_ms: Option<f64>,
    pub(crate) occurred_at: DateTime<Utc>,
}

impl AuditRecord {
    /// An entry about `migration` with no phase change and no cutover details.
    fn event(migration: &Migration, event: AuditEvent, message: Option<&str>) -> Self {
        AuditRecord {
            migration_id: migration.id,
            tenant_id: migration.tenant_id,
            event,
            from_phase: None,
            to_phase: None,
            message: message.map(str::to_owned),
            cutover_attempt: None,
            fencing_token: None,
            events_synced: None,
            duration_ms: None,
            occurred_at: migration.updated_at,
        }
    }

    /// The entry as stored at position `id`.
    pub(crate) fn into_entry(self, id: i64) -> AuditEntry {
        AuditEntry {
            id,
            migration_id: self.migration_id,
            tenant_id: self.tenant_id,
            event: self.event,
            from_phase: self.from_phase,
            to_phase: self.to_phase,
            message: self.message,
            cutover_attempt: self.cutover_attempt,
            fencing_token: self.fencing_token,
            events_synced: self.events_synced,
            duration_ms: self.duration_ms,
            occurred_at: self.occurred_at,
        }
    }
}

/// The rows a [`Transition`] writes.
#[derive(Debug, Clone)]
pub(crate) struct Applied {
    pub(crate) migration: Migration,
    pub(crate) routing: Option<TenantRouting>,
    pub(crate) audit: AuditRecord,
}

/// The routing row of a tenant seen for the first time: `normal` on `store_id`, fence 0.
pub(crate) fn new_routing(tenant_id: Uuid, store_id: &str, now: DateTime<Utc>) -> TenantRouting {
    TenantRouting {
        tenant_id,
        store_id: store_id.to_owned(),
        target_store_id: None,
        state: RoutingState::Normal,
        active_migration_id: None,
        fence: 0,
        updated_at: now,
    }
}

/// A new migration, in `pending`.
pub(crate) fn new_migration(new: &NewMigration, now: DateTime<Utc>) -> Migration {
    Migration {
        id: new.id,
        tenant_id: new.tenant_id,
        source_store_id: new.source_store_id.clone(),
        target_store_id: new.target_store_id.clone(),
        phase: MigrationPhase::Pending,
        config: new.config,
        events_total: None,
        events_copied: 0,
        last_source_position: None,
        cutover_attempt: None,
        is_paused: false,
        paused_at: None,
        pause_reason: None,
        error_count: 0,
        last_error: None,
        last_error_at: None,
        created_by: new.created_by.clone(),
        created_at: now,
        updated_at: now,
        bulk_copy_started_at: None,
        dual_write_started_at: None,
        cutover_started_at: None,
        finished_at: None,
    }
}

/// The tenant's routing pointed at a new migration, and its `migration_started` entry.
///
/// `routing` is the tenant's row (see [`new_routing`] for a tenant without one). The tenant
/// must be served by the migration's source, in `normal` or `migrated` (a finished earlier
/// migration). That the tenant has no other active migration is the store's to enforce: only
/// the database can, across processes.
pub(crate) fn claim_routing(
    migration: &Migration,
    routing: &TenantRouting,
    now: DateTime<Utc>,
) -> Result<(TenantRouting, AuditRecord)> {
    let tenant_id = migration.tenant_id;
    if !matches!(routing.state, RoutingState::Normal | RoutingState::Migrated) {
        return Err(Error::RoutingStateChanged {
            tenant_id,
            expected: RoutingState::Normal,
            actual: routing.state,
        });
    }
    if routing.store_id != migration.source_store_id {
        return Err(Error::StoreMismatch {
            tenant_id,
            expected: migration.source_store_id.clone(),
            actual: routing.store_id.clone(),
        });
    }
    let claimed = TenantRouting {
        state: RoutingState::Normal,
        target_store_id: Some(migration.target_store_id.clone()),
        active_migration_id: Some(migration.id),
        updated_at: now,
        ..routing.clone()
    };
    let mut audit = AuditRecord::event(migration, AuditEvent::MigrationStarted, None);
    audit.to_phase = Some(MigrationPhase::Pending);
    Ok((claimed, audit))
}

/// The routing row as `change` leaves it: compare-and-set on its state, and on its fence when
/// the change carries a fencing token (a token equal to the fence is the same acquisition
/// writing again; the fence becomes the token).
pub(crate) fn switch_routing(
    current: &TenantRouting,
    change: &RoutingChange,
    now: DateTime<Utc>,
) -> Result<TenantRouting> {
    let tenant_id = current.tenant_id;
    change.validate(tenant_id)?;
    if current.state != change.expected {
        return Err(Error::RoutingStateChanged {
            tenant_id,
            expected: change.expected,
            actual: current.state,
        });
    }
    let mut fence = current.fence;
    if let Some(token) = change.fencing_token {
        if current.fence > token {
            return Err(Error::FenceRejected {
                tenant_id,
                token,
                fence: current.fence,
            });
        }
        fence = token;
    }
    Ok(TenantRouting {
        tenant_id,
        store_id: change.store_id.clone(),
        target_store_id: change.target_store_id.clone(),
        state: change.state,
        active_migration_id: change.active_migration_id,
        fence,
        updated_at: now,
    })
}

/// The rows `transition` writes: compare-and-set on the phase (and the cutover attempt when
/// it expects one), the phase's timestamp, the error it records, the routing change, and one
/// audit entry. `routing` is the tenant's row, needed only when the transition changes it.
pub(crate) fn apply_transition(
    current: &Migration,
    routing: Option<&TenantRouting>,
    transition: &Transition,
    now: DateTime<Utc>,
) -> Result<Applied> {
    transition.validate()?;
    let id = transition.migration_id;
    if current.phase != transition.from {
        return Err(Error::PhaseChanged {
            migration_id: id,
            expected: transition.from,
            actual: current.phase,
            to: transition.to,
        });
    }
    if let Some(expected) = transition.expected_attempt
        && current.cutover_attempt != Some(expected)
    {
        return Err(Error::StaleCutoverAttempt {
            migration_id: id,
            expected,
            actual: current.cutover_attempt,
        });
    }
    let routing = match &transition.routing {
        Some(change) => {
            let tenant_id = transition.tenant_id;
            let row = routing.ok_or(Error::RoutingNotFound { tenant_id })?;
            Some(switch_routing(row, change, now)?)
        }
        None => None,
    };
    let mut migration = current.clone();
    migration.phase = transition.to;
    migration.cutover_attempt = transition.new_attempt;
    migration.updated_at = now;
    stamp_phase(&mut migration, transition.from, transition.to, now);
    if let Some(error) = &transition.error {
        record_error(&mut migration, error, now);
    }
    let audit = AuditRecord {
        from_phase: Some(transition.from),
        to_phase: Some(transition.to),
        cutover_attempt: transition.new_attempt.or(transition.expected_attempt),
        fencing_token: transition.routing.as_ref().and_then(|r| r.fencing_token),
        events_synced: transition.events_synced,
        duration_ms: transition.duration_ms,
        ..AuditRecord::event(&migration, transition.event, transition.message.as_deref())
    };
    Ok(Applied {
        migration,
        routing,
        audit,
    })
}

/// When each phase began: the bulk copy, the dual writes (entered from the bulk copy, not from
/// a rolled-back cutover), the last cutover attempt, the end.
fn stamp_phase(
    migration: &mut Migration,
    from: MigrationPhase,
    to: MigrationPhase,
    now: DateTime<Utc>,
) {
    match to {
        MigrationPhase::BulkCopy => migration.bulk_copy_started_at = Some(now),
        MigrationPhase::DualWrite if from == MigrationPhase::BulkCopy => {
            migration.dual_write_started_at = Some(now)
        }
        MigrationPhase::Cutover => migration.cutover_started_at = Some(now),
        phase if phase.is_terminal() => migration.finished_at = Some(now),
        _ => {}
    }
}

fn record_error(migration: &mut Migration, error: &str, now: DateTime<Utc>) {
    migration.error_count += 1;
    migration.last_error = Some(error.to_owned());
    migration.last_error_at = Some(now);
}

/// The operation named by [`Error::WrongPhase`] when progress is recorded outside `bulk_copy`.
const RECORD_PROGRESS: &str = "record copy progress";

/// A copied batch added to the migration's progress, while it is in `bulk_copy`.
pub(crate) fn record_progress(
    current: &Migration,
    copied: u64,
    last_position: Option<i64>,
    total: Option<u64>,
    now: DateTime<Utc>,
) -> Result<Migration> {
    if current.phase != MigrationPhase::BulkCopy {
        return Err(Error::WrongPhase {
            migration_id: current.id,
            operation: RECORD_PROGRESS,
            phase: current.phase,
        });
    }
    let mut migration = current.clone();
    migration.events_copied += copied;
    migration.last_source_position = last_position;
    if total.is_some() {
        migration.events_total = total;
    }
    migration.updated_at = now;
    Ok(migration)
}

/// The bulk copy paused (with its reason) or resumed, and logged, while the migration is not
/// over.
pub(crate) fn set_paused(
    current: &Migration,
    paused: bool,
    reason: Option<&str>,
    now: DateTime<Utc>,
) -> Result<(Migration, AuditRecord)> {
    if current.phase.is_terminal() {
        return Err(Error::WrongPhase {
            migration_id: current.id,
            operation: if paused {
                "pause migration"
            } else {
                "resume migration"
            },
            phase: current.phase,
        });
    }
    let mut migration = current.clone();
    migration.is_paused = paused;
    migration.paused_at = paused.then_some(now);
    migration.pause_reason = reason.filter(|_| paused).map(str::to_owned);
    migration.updated_at = now;
    let event = if paused {
        AuditEvent::MigrationPaused
    } else {
        AuditEvent::MigrationResumed
    };
    let audit = AuditRecord::event(&migration, event, reason);
    Ok((migration, audit))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dual_writing(now: DateTime<Utc>) -> (Migration, TenantRouting) {
        let new = NewMigration::new(Uuid::new_v4(), "shared", "dedicated");
        let mut migration = new_migration(&new, now);
        let routing = new_routing(new.tenant_id, "shared", now);
        let (mut routing, _) = claim_routing(&migration, &routing, now).unwrap();
        migration.phase = MigrationPhase::DualWrite;
        routing.state = RoutingState::DualWrite;
        (migration, routing)
    }

    #[test]
    fn entering_cutover_stamps_the_phase_the_attempt_and_the_audit_entry() {
        let (before, after) = (Utc::now(), Utc::now() + chrono::TimeDelta::seconds(1));
        let (migration, routing) = dual_writing(before);
        let attempt = Uuid::new_v4();
        let enter = Transition::new(
            &migration,
            MigrationPhase::Cutover,
            AuditEvent::CutoverInitiated,
        )
        .attempt(None, Some(attempt))
        .routing(
            RoutingChange::new(
                RoutingState::DualWrite,
                RoutingState::CutoverPaused,
                "shared",
            )
            .fencing_token(Some(7)),
        );

        let applied = apply_transition(&migration, Some(&routing), &enter, after).unwrap();

        assert_eq!(applied.migration.phase, MigrationPhase::Cutover);
        assert_eq!(applied.migration.cutover_attempt, Some(attempt));
        assert_eq!(applied.migration.cutover_started_at, Some(after));
        assert_eq!(
            applied.migration.dual_write_started_at, None,
            "not from bulk_copy"
        );
        assert_eq!(applied.migration.updated_at, after);
        let routing = applied.routing.unwrap();
        assert_eq!(
            (routing.state, routing.fence),
            (RoutingState::CutoverPaused, 7)
        );
        let audit = applied.audit;
        assert_eq!(
            (
                audit.event,
                audit.from_phase,
                audit.to_phase,
                audit.cutover_attempt
            ),
            (
                AuditEvent::CutoverInitiated,
                Some(MigrationPhase::DualWrite),
                Some(MigrationPhase::Cutover),
                Some(attempt)
            )
        );
        assert_eq!((audit.fencing_token, audit.occurred_at), (Some(7), after));
    }

    #[test]
    fn a_stale_token_or_state_refuses_the_routing_change() {
        let now = Utc::now();
        let (_, mut routing) = dual_writing(now);
        routing.fence = 5;
        let change = |token| {
            RoutingChange::new(
                RoutingState::DualWrite,
                RoutingState::CutoverPaused,
                "shared",
            )
            .fencing_token(token)
        };
        assert!(matches!(
            switch_routing(&routing, &change(Some(4)), now),
            Err(Error::FenceRejected {
                token: 4,
                fence: 5,
                ..
            })
        ));
        assert_eq!(
            switch_routing(&routing, &change(Some(5)), now)
                .unwrap()
                .fence,
            5
        );
        assert_eq!(
            switch_routing(&routing, &change(None), now).unwrap().fence,
            5
        );
        routing.state = RoutingState::Normal;
        assert!(matches!(
            switch_routing(&routing, &change(Some(6)), now),
            Err(Error::RoutingStateChanged { .. })
        ));
    }
}
