//! The PostgreSQL migration store: `schema` names and creates the tables, `rows` reads, locks
//! and writes whole rows; the rules they follow are the crate's `rules`.

mod rows;
mod schema;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use pglock::TransactionLock;
use sqlx::{AssertSqlSafe, PgConnection, PgPool};
use uuid::Uuid;

use self::rows::{
    audit_from_row, fetch_routing, insert_audit, insert_migration, lock_migration, lock_routing,
    migration_from_row, server_now, storage, update_migration, upsert_routing,
};
use self::schema::{
    ACCESS, DDL, MIGRATION_COLUMNS, ONE_ACTIVE_INDEX, SCHEMA_LOCK_KEY, TERMINAL, Tables,
};
use crate::model::{AuditEntry, Migration, NewMigration, TenantRouting};
use crate::rules;
use crate::store::{
    AuditLog, MigrationRepository, MigrationStore, RoutingChange, RoutingRepository, Transition,
};
use crate::{Error, Result};

/// A [`MigrationStore`] on PostgreSQL, with sqlx.
///
/// Three tables, made by [`ensure_schema`](Self::ensure_schema) where they are missing and the
/// role may create them, or by your own migrations with [`ddl`](Self::ddl):
///
/// | table | holds |
/// | --- | --- |
/// | `pglock_tenant_migrations` | one row per migration: phase, progress, settings, errors, pause, the current cutover attempt; a partial unique index allows one migration in a non-terminal phase per tenant |
/// | `pglock_tenant_routing` | one row per tenant: serving store, target, routing state, owning migration, fence |
/// | `pglock_migration_audit_log` | what happened to each migration, in order |
///
/// Every write is one transaction: it locks the rows it changes (`SELECT ... FOR UPDATE`),
/// applies the same rules as the in-memory store to them, and writes the result, so a
/// compare-and-set from another process waits for it and then sees its outcome. A
/// [transition](MigrationStore::apply_transition) (phase, routing, audit entry) commits or
/// rolls back as a whole. Timestamps are the server's clock. The tables live in the
/// connection's `search_path` (usually `public`) unless a schema is given with
/// [`with_schema`](Self::with_schema).
///
/// # A role that owns nothing
///
/// An application role needs no `CREATE` privilege when the tables exist: create them in your
/// migrations with [`ddl`](Self::ddl) and grant
///
/// ```sql
/// GRANT SELECT, INSERT, UPDATE ON pglock_tenant_migrations, pglock_tenant_routing TO app;
/// GRANT SELECT, INSERT ON pglock_migration_audit_log TO app;
/// GRANT USAGE ON SEQUENCE pglock_migration_audit_log_id_seq TO app;
/// ```
///
/// [`ensure_schema`](Self::ensure_schema) then checks them and creates nothing; a missing grant
/// is [`Error::PermissionDenied`] naming the object and the privilege.
///
/// ```no_run
/// use pglock_migration::PostgresMigrationStore;
///
/// # async fn run(pool: sqlx::PgPool) -> pglock_migration::Result<()> {
/// let store = PostgresMigrationStore::with_schema(pool, "ops")?;
/// store.ensure_schema().await?; // idempotent; safe to run from every replica at start-up
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct PostgresMigrationStore {
    pool: PgPool,
    tables: Arc<Tables>,
}

impl PostgresMigrationStore {
    /// A store on `pool` whose tables live in the connections' `search_path`.
    pub fn new(pool: PgPool) -> Self {
        PostgresMigrationStore {
            pool,
            tables: Arc::new(Tables::new(None).expect("no schema to validate")),
        }
    }

    /// A store on `pool` whose tables live in `schema`, created by
    /// [`ensure_schema`](Self::ensure_schema) if needed.
    ///
    /// Any schema name PostgreSQL accepts works, quoted as an identifier (so it is
    /// case-sensitive and may contain any character but NUL).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidIdentifier`] when the name is empty, longer than 63 bytes, or contains
    /// NUL.
    pub fn with_schema(pool: PgPool, schema: &str) -> Result<Self> {
        Ok(PostgresMigrationStore {
            pool,
            tables: Arc::new(Tables::new(Some(schema))?),
        })
    }

    /// The pool the store runs its statements on.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// The schema of the tables, when one was given.
    pub fn schema(&self) -> Option<&str> {
        self.tables.schema.as_deref()
    }

    /// The statements that create the tables and their indexes (and the schema, when one was
    /// given) if they do not exist, for your own migrations.
    pub fn ddl(&self) -> String {
        let mut ddl = String::new();
        if let Some(schema) = &self.tables.quoted_schema {
            ddl.push_str(&format!("CREATE SCHEMA IF NOT EXISTS {schema};"));
        }
        ddl.push_str(self.tables.sql(DDL).as_str());
        ddl
    }

    /// Makes sure the role can use the tables: checks that they exist and that the role holds
    /// every privilege the store needs (one round trip), and creates them, with their indexes
    /// (and the schema, when one was given), when they are missing and the role may. A role
    /// that owns nothing needs no `CREATE` once your migrations made and granted them (see the
    /// type's documentation).
    ///
    /// Idempotent, and safe to run concurrently from several processes: setups are serialised
    /// by a transaction-scoped advisory lock.
    ///
    /// # Errors
    ///
    /// [`Error::PermissionDenied`] naming the object and the privilege the role lacks;
    /// [`Error::Storage`] when a statement fails; [`Error::Lock`] when the setup's
    /// [`TransactionLock`] could not be taken (a standby, for one).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the setup is one transaction, committed or rolled back.
    pub async fn ensure_schema(&self) -> Result<()> {
        if !self.check_access().await? {
            return Ok(());
        }
        let failed = storage("create the migration tables");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        // Concurrent setups of the same tables take turns for the length of the transaction.
        TransactionLock::exclusive(SCHEMA_LOCK_KEY)
            .acquire(&mut tx, None)
            .await?;
        sqlx::raw_sql(AssertSqlSafe(self.ddl()))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)
    }

    /// Whether the tables must be created: `Ok(false)` when they all exist and are usable,
    /// `Ok(true)` when some are missing and the role may create them, and the missing
    /// privilege otherwise.
    async fn check_access(&self) -> Result<bool> {
        let (mut kinds, mut names, mut privileges) = (Vec::new(), Vec::new(), Vec::new());
        for (kind, name, needed) in self.tables.needs() {
            for privilege in needed {
                kinds.push(kind);
                names.push(name.clone());
                privileges.push(*privilege);
            }
        }
        let rows: Vec<(String, String, String, bool, bool, bool, String)> = sqlx::query_as(ACCESS)
            .bind(kinds)
            .bind(names)
            .bind(privileges)
            .bind(self.tables.schema.as_deref())
            .fetch_all(&self.pool)
            .await
            .map_err(storage("check the migration tables"))?;
        let missing = rows.iter().find(|(_, _, _, exists, ..)| !exists);
        if let Some((_, name, _, _, _, may_create, schema)) = missing {
            if *may_create {
                return Ok(true);
            }
            return Err(Error::PermissionDenied {
                object: format!("schema \"{schema}\", to create the missing {name}"),
                privilege: "CREATE".to_owned(),
            });
        }
        let mut denied: Vec<(String, Vec<String>)> = Vec::new();
        for (kind, name, privilege, _, granted, ..) in rows {
            if granted {
                continue;
            }
            let object = format!("{kind} {name}");
            match denied.iter_mut().find(|(seen, _)| *seen == object) {
                Some((_, privileges)) => privileges.push(privilege),
                None => denied.push((object, vec![privilege])),
            }
        }
        match denied.into_iter().next() {
            None => Ok(false),
            Some((object, privileges)) => Err(Error::PermissionDenied {
                object,
                privilege: privileges.join(", "),
            }),
        }
    }

    /// Reads the tenant's routing on `conn`, for example inside a writer's transaction right
    /// after [`WriteGate::enter`](crate::WriteGate::enter).
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when the statement fails.
    ///
    /// # Cancel safety
    ///
    /// Read-only; as cancel safe as any statement on `conn`.
    pub async fn get_routing_in(
        &self,
        conn: &mut PgConnection,
        tenant_id: Uuid,
    ) -> Result<Option<TenantRouting>> {
        fetch_routing(&self.tables, conn, tenant_id).await
    }
}

impl fmt::Debug for PostgresMigrationStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresMigrationStore")
            .field("schema", &self.tables.schema)
            .finish_non_exhaustive()
    }
}

#[async_trait]
impl MigrationRepository for PostgresMigrationStore {
    async fn get_migration(&self, id: Uuid) -> Result<Option<Migration>> {
        let sql = format!(
            "SELECT {MIGRATION_COLUMNS} FROM {{migrations}} WHERE id OPERATOR(pg_catalog.=) $1"
        );
        sqlx::query(self.tables.sql(&sql))
            .bind(id)
            .fetch_optional(&self.pool)
            .await
            .map_err(storage("read a migration"))?
            .as_ref()
            .map(migration_from_row)
            .transpose()
    }

    async fn active_migration_for_tenant(&self, tenant_id: Uuid) -> Result<Option<Migration>> {
        let sql = format!(
            "SELECT {MIGRATION_COLUMNS} FROM {{migrations}} \
             WHERE tenant_id OPERATOR(pg_catalog.=) $1 AND NOT ({TERMINAL})"
        );
        sqlx::query(self.tables.sql(&sql))
            .bind(tenant_id)
            .fetch_optional(&self.pool)
            .await
            .map_err(storage("read a tenant's active migration"))?
            .as_ref()
            .map(migration_from_row)
            .transpose()
    }

    async fn list_active_migrations(&self) -> Result<Vec<Migration>> {
        let sql = format!(
            "SELECT {MIGRATION_COLUMNS} FROM {{migrations}} \
             WHERE NOT ({TERMINAL}) ORDER BY created_at, id"
        );
        sqlx::query(self.tables.sql(&sql))
            .fetch_all(&self.pool)
            .await
            .map_err(storage("list active migrations"))?
            .iter()
            .map(migration_from_row)
            .collect()
    }

    async fn record_progress(
        &self,
        id: Uuid,
        copied: u64,
        last_position: Option<i64>,
        total: Option<u64>,
    ) -> Result<Migration> {
        let failed = storage("record copy progress");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let (current, now) = lock_migration(&self.tables, &mut tx, id).await?;
        let migration = rules::record_progress(&current, copied, last_position, total, now)?;
        update_migration(&self.tables, &mut tx, &migration).await?;
        tx.commit().await.map_err(failed)?;
        Ok(migration)
    }
}

#[async_trait]
impl RoutingRepository for PostgresMigrationStore {
    async fn get_routing(&self, tenant_id: Uuid) -> Result<Option<TenantRouting>> {
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(storage("read a tenant's routing"))?;
        fetch_routing(&self.tables, &mut conn, tenant_id).await
    }

    async fn ensure_routing(&self, tenant_id: Uuid, store_id: &str) -> Result<TenantRouting> {
        let failed = storage("create a tenant's routing");
        let mut conn = self.pool.acquire().await.map_err(failed)?;
        let now = server_now(&mut conn).await?;
        let routing = rules::new_routing(tenant_id, store_id, now);
        upsert_routing(&self.tables, &mut conn, &routing, false).await?;
        fetch_routing(&self.tables, &mut conn, tenant_id)
            .await?
            .ok_or(Error::RoutingNotFound { tenant_id })
    }

    async fn switch_routing(
        &self,
        tenant_id: Uuid,
        change: &RoutingChange,
    ) -> Result<TenantRouting> {
        change.validate(tenant_id)?;
        let failed = storage("switch a tenant's routing");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let (current, now) = lock_routing(&self.tables, &mut tx, tenant_id)
            .await?
            .ok_or(Error::RoutingNotFound { tenant_id })?;
        let next = rules::switch_routing(&current, change, now)?;
        upsert_routing(&self.tables, &mut tx, &next, true).await?;
        tx.commit().await.map_err(failed)?;
        Ok(next)
    }
}

#[async_trait]
impl AuditLog for PostgresMigrationStore {
    async fn audit_log(&self, migration_id: Uuid) -> Result<Vec<AuditEntry>> {
        sqlx::query(self.tables.sql(
            "SELECT id, migration_id, tenant_id, event_type, from_phase, to_phase, message, \
             cutover_attempt, fencing_token, events_synced, duration_ms, occurred_at \
             FROM {audit} WHERE migration_id OPERATOR(pg_catalog.=) $1 ORDER BY id",
        ))
        .bind(migration_id)
        .fetch_all(&self.pool)
        .await
        .map_err(storage("read the audit log"))?
        .iter()
        .map(audit_from_row)
        .collect()
    }
}

#[async_trait]
impl MigrationStore for PostgresMigrationStore {
    async fn create_migration(&self, new: &NewMigration) -> Result<Migration> {
        let failed = storage("create a migration");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let now = server_now(&mut tx).await?;
        let migration = rules::new_migration(new, now);
        // Checked first, as in memory: a second active migration is refused whatever the
        // routing says. The database enforces it, so concurrent creations cannot both pass.
        if let Err(err) = insert_migration(&self.tables, &mut tx, &migration).await {
            drop(tx);
            if !violates(&err, ONE_ACTIVE_INDEX) {
                return Err(failed(err));
            }
            let active = self.active_migration_for_tenant(new.tenant_id).await?;
            return Err(Error::ActiveMigrationExists {
                tenant_id: new.tenant_id,
                migration_id: active.map(|m| m.id),
            });
        }
        // Make sure the tenant has a row, then check and claim it under its row lock.
        let fresh = rules::new_routing(new.tenant_id, &new.source_store_id, now);
        upsert_routing(&self.tables, &mut tx, &fresh, false).await?;
        let (current, _) = lock_routing(&self.tables, &mut tx, new.tenant_id)
            .await?
            .ok_or(Error::RoutingNotFound {
                tenant_id: new.tenant_id,
            })?;
        let (routing, audit) = rules::claim_routing(&migration, &current, now)?;
        upsert_routing(&self.tables, &mut tx, &routing, true).await?;
        insert_audit(&self.tables, &mut tx, &audit).await?;
        tx.commit().await.map_err(failed)?;
        Ok(migration)
    }

    async fn apply_transition(&self, transition: &Transition) -> Result<Migration> {
        transition.validate()?;
        let failed = storage("apply a phase transition");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let (current, now) = lock_migration(&self.tables, &mut tx, transition.migration_id).await?;
        let routing = match &transition.routing {
            Some(_) => lock_routing(&self.tables, &mut tx, transition.tenant_id)
                .await?
                .map(|(routing, _)| routing),
            None => None,
        };
        let applied = rules::apply_transition(&current, routing.as_ref(), transition, now)?;
        update_migration(&self.tables, &mut tx, &applied.migration).await?;
        if let Some(routing) = &applied.routing {
            upsert_routing(&self.tables, &mut tx, routing, true).await?;
        }
        insert_audit(&self.tables, &mut tx, &applied.audit).await?;
        tx.commit().await.map_err(failed)?;
        Ok(applied.migration)
    }

    async fn set_paused(&self, id: Uuid, paused: bool, reason: Option<&str>) -> Result<Migration> {
        let failed = storage("pause or resume a migration");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let (current, now) = lock_migration(&self.tables, &mut tx, id).await?;
        let (migration, audit) = rules::set_paused(&current, paused, reason, now)?;
        update_migration(&self.tables, &mut tx, &migration).await?;
        insert_audit(&self.tables, &mut tx, &audit).await?;
        tx.commit().await.map_err(failed)?;
        Ok(migration)
    }
}

fn violates(err: &sqlx::Error, constraint: &str) -> bool {
    err.as_database_error()
        .and_then(|db| db.constraint())
        .is_some_and(|name| name == constraint)
}
