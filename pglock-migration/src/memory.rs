//! The in-memory migration store, for unit tests of migration wiring.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use chrono::Utc;
use uuid::Uuid;

use crate::model::{AuditEntry, Migration, NewMigration, TenantRouting};
use crate::rules::{self, AuditRecord};
use crate::store::{
    AuditLog, MigrationRepository, MigrationStore, RoutingChange, RoutingRepository, Transition,
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
        // A panic while holding the lock cannot leave a half-applied change: the rules compute
        // every new row before any is written.
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

    fn migration(&self, id: Uuid) -> Result<&Migration> {
        self.migrations
            .get(&id)
            .ok_or(Error::MigrationNotFound { migration_id: id })
    }

    fn routing(&self, tenant_id: Uuid) -> Result<&TenantRouting> {
        self.routing
            .get(&tenant_id)
            .ok_or(Error::RoutingNotFound { tenant_id })
    }

    fn write_migration(&mut self, migration: &Migration) {
        if !self.migrations.contains_key(&migration.id) {
            self.order.push(migration.id);
        }
        self.migrations.insert(migration.id, migration.clone());
    }

    fn write_routing(&mut self, routing: TenantRouting) {
        self.routing.insert(routing.tenant_id, routing);
    }

    fn append(&mut self, record: AuditRecord) {
        let id = self.audit.len() as i64 + 1;
        self.audit.push(record.into_entry(id));
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
        let current = data.migration(id)?;
        let migration = rules::record_progress(current, copied, last_position, total, Utc::now())?;
        data.write_migration(&migration);
        Ok(migration)
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
            .or_insert_with(|| rules::new_routing(tenant_id, store_id, Utc::now()));
        Ok(routing.clone())
    }

    async fn switch_routing(
        &self,
        tenant_id: Uuid,
        change: &RoutingChange,
    ) -> Result<TenantRouting> {
        change.validate(tenant_id)?;
        let mut data = self.data();
        let next = rules::switch_routing(data.routing(tenant_id)?, change, Utc::now())?;
        data.write_routing(next.clone());
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
        let now = Utc::now();
        let routing = match data.routing.get(&new.tenant_id) {
            Some(routing) => routing.clone(),
            None => rules::new_routing(new.tenant_id, &new.source_store_id, now),
        };
        let migration = rules::new_migration(new, now);
        let (routing, audit) = rules::claim_routing(&migration, &routing, now)?;
        data.write_migration(&migration);
        data.write_routing(routing);
        data.append(audit);
        Ok(migration)
    }

    async fn apply_transition(&self, transition: &Transition) -> Result<Migration> {
        transition.validate()?;
        let mut data = self.data();
        let current = data.migration(transition.migration_id)?;
        let routing = data.routing.get(&transition.tenant_id);
        let applied = rules::apply_transition(current, routing, transition, Utc::now())?;
        data.write_migration(&applied.migration);
        if let Some(routing) = applied.routing {
            data.write_routing(routing);
        }
        data.append(applied.audit);
        Ok(applied.migration)
    }

    async fn set_paused(&self, id: Uuid, paused: bool, reason: Option<&str>) -> Result<Migration> {
        let mut data = self.data();
        let current = data.migration(id)?;
        let (migration, audit) = rules::set_paused(current, paused, reason, Utc::now())?;
        data.write_migration(&migration);
        data.append(audit);
        Ok(migration)
    }
}
