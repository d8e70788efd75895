//! A migration store that fails chosen transitions, before or after applying them: a lost
//! connection, or a commit whose answer is lost.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use pglock_migration::{
    AuditEntry, AuditLog, Error, Migration, MigrationPhase, MigrationRepository, MigrationStore,
    NewMigration, Result, RoutingChange, RoutingRepository, TenantRouting, Transition,
};
use uuid::Uuid;

/// When an injected failure strikes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The transition is not applied, and fails with a storage error.
    Before,
    /// The transition is applied, then fails with a storage error, as a lost commit answer.
    After,
}

#[derive(Debug)]
pub struct FlakyStore {
    inner: Arc<dyn MigrationStore>,
    faults: Mutex<Vec<(MigrationPhase, MigrationPhase, Fault)>>,
}

impl FlakyStore {
    pub fn new(inner: Arc<dyn MigrationStore>) -> Arc<FlakyStore> {
        Arc::new(FlakyStore {
            inner,
            faults: Mutex::default(),
        })
    }

    /// Fails the next transition from `from` to `to`, once.
    pub fn fail_next(&self, from: MigrationPhase, to: MigrationPhase, fault: Fault) {
        self.faults.lock().unwrap().push((from, to, fault));
    }

    fn fault_for(&self, transition: &Transition) -> Option<Fault> {
        let mut faults = self.faults.lock().unwrap();
        let at = faults
            .iter()
            .position(|(from, to, _)| (*from, *to) == (transition.from, transition.to))?;
        Some(faults.remove(at).2)
    }
}

fn injected() -> Error {
    Error::Storage {
        operation: "apply a phase transition",
        source: sqlx::Error::Protocol("connection reset (injected)".into()),
    }
}

#[async_trait]
impl MigrationRepository for FlakyStore {
    async fn get_migration(&self, id: Uuid) -> Result<Option<Migration>> {
        self.inner.get_migration(id).await
    }

    async fn active_migration_for_tenant(&self, tenant_id: Uuid) -> Result<Option<Migration>> {
        self.inner.active_migration_for_tenant(tenant_id).await
    }

    async fn list_active_migrations(&self) -> Result<Vec<Migration>> {
        self.inner.list_active_migrations().await
    }

    async fn record_progress(
        &self,
        id: Uuid,
        copied: u64,
        last_position: Option<i64>,
        total: Option<u64>,
    ) -> Result<Migration> {
        self.inner
            .record_progress(id, copied, last_position, total)
            .await
    }
}

#[async_trait]
impl RoutingRepository for FlakyStore {
    async fn get_routing(&self, tenant_id: Uuid) -> Result<Option<TenantRouting>> {
        self.inner.get_routing(tenant_id).await
    }

    async fn ensure_routing(&self, tenant_id: Uuid, store_id: &str) -> Result<TenantRouting> {
        self.inner.ensure_routing(tenant_id, store_id).await
    }

    async fn switch_routing(
        &self,
        tenant_id: Uuid,
        change: &RoutingChange,
    ) -> Result<TenantRouting> {
        self.inner.switch_routing(tenant_id, change).await
    }
}

#[async_trait]
impl AuditLog for FlakyStore {
    async fn audit_log(&self, migration_id: Uuid) -> Result<Vec<AuditEntry>> {
        self.inner.audit_log(migration_id).await
    }
}

#[async_trait]
impl MigrationStore for FlakyStore {
    async fn create_migration(&self, new: &NewMigration) -> Result<Migration> {
        self.inner.create_migration(new).await
    }

    async fn apply_transition(&self, transition: &Transition) -> Result<Migration> {
        match self.fault_for(transition) {
            None => self.inner.apply_transition(transition).await,
            Some(Fault::Before) => Err(injected()),
            Some(Fault::After) => {
                self.inner.apply_transition(transition).await?;
                Err(injected())
            }
        }
    }

    async fn set_paused(&self, id: Uuid, paused: bool, reason: Option<&str>) -> Result<Migration> {
        self.inner.set_paused(id, paused, reason).await
    }
}
