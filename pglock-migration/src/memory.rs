//! The in-memory migration store, for unit tests of migration wiring.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::Utc;
use uuid::Uuid;

use crate::model::{
    AuditEntry, AuditEvent, Migration, MigrationPhase, NewMigration, RoutingState, TenantRouting,
};
use crate::store::{
    AuditLog, MigrationRepository, MigrationStore, RECORD_PROGRESS, RoutingChange,
    RoutingRepository, Transition, check_routable,
};
use crate::{Error, Result};

/// A [`MigrationStore`] in memory, with the same rules as
/// [`PostgresMigrationStore`](crate::PostgresMigrationStore): compare-and-set phase and routing
/// changes, fencing, one active migration per tenant, all-or-nothing transitions.
///
/// Clones share the same data, so several coordinators (playing several processes, each with
/// its own [`InMemoryLockManager`](pglock::InMemoryLockManager) on one
/// [`InMemoryLockServer`](pglock::InMemoryLockServer)) can work on one store. Nothing survives
/// the process: use it in tests.
///
/// ```
/// use pglock_migration::{InMemoryMigrationStore, MigrationStore, NewMigration, MigrationPhase};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock_migration::Result<()> {
/// let store = InMemoryMigrationStore::new();
/// let tenant = uuid::Uuid::new_v4();
/// let migration = store.create_migration(&NewMigration::new(tenant, "shared", "dedicated")).await?;
/// assert_eq!(migration.phase, MigrationPhase::Pending);
/// // A second active migration of the tenant is refused.
/// let again = store.create_migration(&NewMigration::new(tenant, "shared", "other")).await;
/// assert!(matches!(again, Err(pglock_migration::Error::ActiveMigrationExists { .. })));
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct InMemoryMigrationStore {
    data: Arc<Mutex<Data>>,
}

#[derive(Default)]
struct Data {
    migrations: HashMap<Uuid, Migration>,
    /// Creation order, for listing.
    order: Vec<Uuid>,
    routing: HashMap<Uuid, TenantRouting>,
    audit: Vec<AuditEntry>,
}

impl InMemoryMigrationStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn data(&self) -> MutexGuard<'_, Data> {
        // A panic while holding the lock cannot leave a half-applied change: every change is
        // validated on copies before it is written.
        self.data
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl fmt::Debug for InMemoryMigrationStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = self.data();
        f.debug_struct("InMemoryMigrationStore")
            .field("migrations", &data.migrations.len())
            .field("tenants", &data.routing.len())
            .finish_non_exhaustive()
    }
}

impl Data {
    fn active_for(&self, tenant_id: Uuid) -> Option<&Migration> {
        self.order
            .iter()
            .filter_map(|id| self.migrations.get(id))
            .find(|m| m.tenant_id == tenant_id && !m.phase.is_terminal())
    }

    /// The routing row as `change` would leave it, or why it cannot.
    fn changed_routing(&self, tenant_id: Uuid, change: &RoutingChange) -> Result<TenantRouting> {
        change.validate(tenant_id)?;
        let current = self
            .routing
            .get(&tenant_id)
            .ok_or(Error::RoutingNotFound { tenant_id })?;
        if current.state != change.expected {
            return Err(Error::RoutingStateChanged {
                tenant_id,
                expected: change.expected,
                actual: current.state,
            });
        }
        let mut next = current.clone();
        if let Some(token) = change.fencing_token {
            if current.fence > token {
                return Err(Error::FenceRejected {
                    tenant_id,
                    token,
                    fence: current.fence,
                });
            }
            next.fence = token;
        }
        next.state = change.state;
        next.store_id = change.store_id.clone();
        next.target_store_id = change.target_store_id.clone();
        next.active_migration_id = change.active_migration_id;
        next.updated_at = Utc::now();
        Ok(next)
    }

    fn audit(&mut self, migration: &Migration, transition: AuditDraft<'_>) {
        let id = self.audit.len() as i64 + 1;
        self.audit.push(AuditEntry {
            id,
            migration_id: migration.id,
            tenant_id: migration.tenant_id,
            event: transition.event,
            from_phase: transition.from,
            to_phase: transition.to,
            message: transition.message.map(str::to_owned),
            cutover_attempt: transition.attempt,
            fencing_token: transition.fencing_token,
            events_synced: transition.events_synced,
            duration_ms: transition.duration_ms,
            occurred_at: Utc::now(),
        });
    }
}

/// The parts of an audit entry that vary.
struct AuditDraft<'a> {
    event: AuditEvent,
    from: Option<MigrationPhase>,
    to: Option<MigrationPhase>,
    message: Option<&'a str>,
    attempt: Option<Uuid>,
    fencing_token: Option<i64>,
    events_synced: Option<u64>,
    duration_ms: Option<f64>,
}

impl<'a> AuditDraft<'a> {
    fn event(event: AuditEvent, message: Option<&'a str>) -> Self {
        AuditDraft {
            event,
            from: None,
            to: None,
            message,
            attempt: None,
            fencing_token: None,
            events_synced: None,
            duration_ms: None,
        }
    }
}

#[async_trait]
impl MigrationRepository for InMemoryMigrationStore {
    async fn get_migration(&self, id: Uuid) -> Result<Option<Migration>> {
        Ok(self.data().migrations.get(&id).cloned())
    }

    async fn active_migration_for_tenant(&self, tenant_id: Uuid) -> Result<Option<Migration>> {
        Ok(self.data().active_for(tenant_id).cloned())
    }

    async fn list_active_migrations(&self) -> Result<Vec<Migration>> {
        let data = self.data();
        Ok(data
            .order
            .iter()
            .filter_map(|id| data.migrations.get(id))
            .filter(|m| !m.phase.is_terminal())
            .cloned()
            .collect())
    }

    async fn record_progress(
        &self,
        id: Uuid,
        copied: u64,
        last_position: Option<i64>,
        total: Option<u64>,
    ) -> Result<Migration> {
        let mut data = self.data();
        let migration = data
            .migrations
            .get_mut(&id)
            .ok_or(Error::MigrationNotFound { migration_id: id })?;
        if migration.phase != MigrationPhase::BulkCopy {
            return Err(Error::WrongPhase {
                migration_id: id,
                operation: RECORD_PROGRESS,
                phase: migration.phase,
            });
        }
        migration.events_copied += copied;
        migration.last_source_position = last_position;
        if total.is_some() {
            migration.events_total = total;
        }
        migration.updated_at = Utc::now();
        Ok(migration.clone())
    }
}

#[async_trait]
impl RoutingRepository for InMemoryMigrationStore {
    async fn get_routing(&self, tenant_id: Uuid) -> Result<Option<TenantRouting>> {
        Ok(self.data().routing.get(&tenant_id).cloned())
    }

    async fn ensure_routing(&self, tenant_id: Uuid, store_id: &str) -> Result<TenantRouting> {
        let mut data = self.data();
        let routing = data
            .routing
            .entry(tenant_id)
            .or_insert_with(|| new_routing(tenant_id, store_id));
        Ok(routing.clone())
    }

    async fn switch_routing(
        &self,
        tenant_id: Uuid,
        change: &RoutingChange,
    ) -> Result<TenantRouting> {
        let mut data = self.data();
        let next = data.changed_routing(tenant_id, change)?;
        data.routing.insert(tenant_id, next.clone());
        Ok(next)
    }
}

#[async_trait]
impl AuditLog for InMemoryMigrationStore {
    async fn audit_log(&self, migration_id: Uuid) -> Result<Vec<AuditEntry>> {
        Ok(self
            .data()
            .audit
            .iter()
            .filter(|entry| entry.migration_id == migration_id)
            .cloned()
            .collect())
    }
}

#[async_trait]
impl MigrationStore for InMemoryMigrationStore {
    async fn create_migration(&self, new: &NewMigration) -> Result<Migration> {
        let mut data = self.data();
        if let Some(active) = data.active_for(new.tenant_id) {
            return Err(Error::ActiveMigrationExists {
                tenant_id: new.tenant_id,
                migration_id: Some(active.id),
            });
        }
        let mut routing = match data.routing.get(&new.tenant_id) {
            None => new_routing(new.tenant_id, &new.source_store_id),
            Some(current) => {
                check_routable(current, new)?;
                current.clone()
            }
        };
        routing.state = RoutingState::Normal;
        routing.target_store_id = Some(new.target_store_id.clone());
        routing.active_migration_id = Some(new.id);
        routing.updated_at = Utc::now();

        let now = Utc::now();
        let migration = Migration {
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
        };
        data.routing.insert(new.tenant_id, routing);
        data.migrations.insert(new.id, migration.clone());
        data.order.push(new.id);
        let mut draft = AuditDraft::event(AuditEvent::MigrationStarted, None);
        draft.to = Some(MigrationPhase::Pending);
        data.audit(&migration, draft);
        Ok(migration)
    }

    async fn apply_transition(&self, transition: &Transition) -> Result<Migration> {
        transition.validate()?;
        let mut data = self.data();
        let id = transition.migration_id;
        let current = data
            .migrations
            .get(&id)
            .ok_or(Error::MigrationNotFound { migration_id: id })?;
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
        // Everything is checked before anything is written: all or nothing.
        let routing = match &transition.routing {
            Some(change) => Some(data.changed_routing(transition.tenant_id, change)?),
            None => None,
        };
        let now = Utc::now();
        let mut migration = current.clone();
        migration.phase = transition.to;
        migration.cutover_attempt = transition.new_attempt;
        migration.updated_at = now;
        match transition.to {
            MigrationPhase::BulkCopy => migration.bulk_copy_started_at = Some(now),
            MigrationPhase::DualWrite if transition.from == MigrationPhase::BulkCopy => {
                migration.dual_write_started_at = Some(now)
            }
            MigrationPhase::Cutover => migration.cutover_started_at = Some(now),
            phase if phase.is_terminal() => migration.finished_at = Some(now),
            _ => {}
        }
        if let Some(error) = &transition.error {
            migration.error_count += 1;
            migration.last_error = Some(error.clone());
            migration.last_error_at = Some(now);
        }
        if let Some(routing) = routing {
            data.routing.insert(transition.tenant_id, routing);
        }
        data.migrations.insert(id, migration.clone());
        data.audit(
            &migration,
            AuditDraft {
                event: transition.event,
                from: Some(transition.from),
                to: Some(transition.to),
                message: transition.message.as_deref(),
                attempt: transition.new_attempt.or(transition.expected_attempt),
                fencing_token: transition.routing.as_ref().and_then(|r| r.fencing_token),
                events_synced: transition.events_synced,
                duration_ms: transition.duration_ms,
            },
        );
        Ok(migration)
    }

    async fn set_paused(&self, id: Uuid, paused: bool, reason: Option<&str>) -> Result<Migration> {
        let mut data = self.data();
        let migration = data
            .migrations
            .get_mut(&id)
            .ok_or(Error::MigrationNotFound { migration_id: id })?;
        if migration.phase.is_terminal() {
            return Err(Error::WrongPhase {
                migration_id: id,
                operation: if paused {
                    "pause migration"
                } else {
                    "resume migration"
                },
                phase: migration.phase,
            });
        }
        let now = Utc::now();
        migration.is_paused = paused;
        migration.paused_at = paused.then_some(now);
        migration.pause_reason = if paused {
            reason.map(str::to_owned)
        } else {
            None
        };
        migration.updated_at = now;
        let migration = migration.clone();
        let event = if paused {
            AuditEvent::MigrationPaused
        } else {
            AuditEvent::MigrationResumed
        };
        data.audit(&migration, AuditDraft::event(event, reason));
        Ok(migration)
    }
}

fn new_routing(tenant_id: Uuid, store_id: &str) -> TenantRouting {
    TenantRouting {
        tenant_id,
        store_id: store_id.to_owned(),
        target_store_id: None,
        state: RoutingState::Normal,
        active_migration_id: None,
        fence: 0,
        updated_at: Utc::now(),
    }
}
