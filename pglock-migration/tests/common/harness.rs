//! The harness: one scenario against the in-memory store and lock managers, or against
//! PostgreSQL, with "processes" that each have their own store handle and lock manager.

use std::sync::Arc;

use pglock::{InMemoryLockManager, InMemoryLockServer, LockManager, PostgresLockManager};
use pglock_migration::{
    AuditEvent, InMemoryMigrationStore, Migration, MigrationConfig, MigrationCoordinator,
    MigrationPhase, MigrationStore, NewMigration, PostgresMigrationStore, RoutingChange,
    RoutingState, Transition,
};
use uuid::Uuid;

use super::{TestLag, TestStores, app_name, pool_named};

pub const SOURCE: &str = "shared";
pub const TARGET: &str = "dedicated";

/// Which backend a scenario runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Memory,
    Postgres,
}

/// One "process" of a scenario: its own store handle and lock manager (its own pool on
/// PostgreSQL, its own holder on the in-memory lock server).
#[derive(Debug, Clone)]
pub struct Process {
    pub store: Arc<dyn MigrationStore>,
    pub locks: Arc<dyn LockManager>,
}

/// The shared ground of a scenario: one migration store (a fresh schema on PostgreSQL) and
/// one lock server.
pub struct Harness {
    pub backend: Backend,
    pub store: Arc<dyn MigrationStore>,
    memory_store: Option<InMemoryMigrationStore>,
    memory_locks: InMemoryLockServer,
    schema: Option<String>,
}

impl Harness {
    pub async fn new(backend: Backend) -> Harness {
        match backend {
            Backend::Memory => Harness::memory(),
            Backend::Postgres => Harness::postgres().await,
        }
    }

    pub fn memory() -> Harness {
        let store = InMemoryMigrationStore::new();
        Harness {
            backend: Backend::Memory,
            store: Arc::new(store.clone()),
            memory_store: Some(store),
            memory_locks: InMemoryLockServer::new(),
            schema: None,
        }
    }

    /// A store in a schema of its own, so listings and audits see only this test's rows.
    pub async fn postgres() -> Harness {
        let schema = format!("pglock_test_{}", &Uuid::new_v4().simple().to_string()[..12]);
        let store = PostgresMigrationStore::with_schema(
            pool_named(4, &app_name("mig-store")).await,
            &schema,
        )
        .expect("valid schema name");
        store.ensure_schema().await.expect("create the tables");
        Harness {
            backend: Backend::Postgres,
            store: Arc::new(store),
            memory_store: None,
            memory_locks: InMemoryLockServer::new(),
            schema: Some(schema),
        }
    }

    pub fn schema(&self) -> Option<&str> {
        self.schema.as_deref()
    }

    /// A new process: a store handle of its own (own pool on PostgreSQL) on the same data,
    /// and a lock manager of its own on the same lock server.
    pub async fn process(&self, name: &str) -> Process {
        match self.backend {
            Backend::Memory => Process {
                store: Arc::new(self.memory_store.clone().expect("memory store")),
                locks: Arc::new(
                    InMemoryLockManager::builder()
                        .server(&self.memory_locks)
                        .holder_id(name)
                        .build(),
                ),
            },
            Backend::Postgres => {
                let app = app_name(name);
                let store = PostgresMigrationStore::with_schema(
                    pool_named(4, &app).await,
                    self.schema.as_deref().expect("schema"),
                )
                .expect("valid schema name");
                let locks = PostgresLockManager::builder(pool_named(4, &app).await)
                    .holder_id(name)
                    .build();
                Process {
                    store: Arc::new(store),
                    locks: Arc::new(locks),
                }
            }
        }
    }

    /// A migration of `tenant` from SOURCE to TARGET, moved to `dual_write` directly.
    pub async fn dual_writing(&self, tenant: Uuid, config: MigrationConfig) -> Migration {
        dual_writing(&*self.store, tenant, config).await
    }

    pub async fn audit(&self, migration_id: Uuid) -> Vec<AuditEvent> {
        audit_events(&*self.store, migration_id).await
    }
}

/// Creates a migration of `tenant` from SOURCE to TARGET and moves it to `dual_write`.
pub async fn dual_writing(
    store: &dyn MigrationStore,
    tenant: Uuid,
    config: MigrationConfig,
) -> Migration {
    let new = NewMigration::new(tenant, SOURCE, TARGET).config(config);
    let migration = store.create_migration(&new).await.expect("create");
    let route = |from, to| {
        RoutingChange::new(from, to, SOURCE)
            .target(Some(TARGET.to_owned()))
            .owner(Some(migration.id))
    };
    let copying = store
        .apply_transition(
            &Transition::new(
                &migration,
                MigrationPhase::BulkCopy,
                AuditEvent::PhaseChanged,
            )
            .routing(route(RoutingState::Normal, RoutingState::BulkCopy)),
        )
        .await
        .expect("to bulk_copy");
    store
        .apply_transition(
            &Transition::new(
                &copying,
                MigrationPhase::DualWrite,
                AuditEvent::PhaseChanged,
            )
            .routing(route(RoutingState::BulkCopy, RoutingState::DualWrite)),
        )
        .await
        .expect("to dual_write")
}

pub async fn audit_events(store: &dyn MigrationStore, migration_id: Uuid) -> Vec<AuditEvent> {
    store
        .audit_log(migration_id)
        .await
        .expect("audit log")
        .into_iter()
        .map(|entry| entry.event)
        .collect()
}

/// A coordinator of `process` with every plug-in.
pub fn coordinator(
    process: &Process,
    stores: Arc<TestStores>,
    lag: Arc<TestLag>,
) -> MigrationCoordinator {
    MigrationCoordinator::builder(Arc::clone(&process.store), stores)
        .source_store_id(SOURCE)
        .sync_lag(lag)
        .lock_manager(Arc::clone(&process.locks))
        .build()
}
