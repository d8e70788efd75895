//! The PostgreSQL migration store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::PgRow;
use sqlx::{AssertSqlSafe, PgConnection, PgPool, Row, SqlSafeStr, SqlStr};
use uuid::Uuid;

use crate::model::{
    AuditEntry, AuditEvent, Migration, MigrationConfig, MigrationPhase, NewMigration, TenantRouting,
};
use crate::store::{
    AuditLog, MigrationRepository, MigrationStore, RECORD_PROGRESS, RoutingChange,
    RoutingRepository, Transition, check_routable,
};
use crate::{Error, Result};
use pglock::lock_id;

/// A [`MigrationStore`] on PostgreSQL, with sqlx.
///
/// Three tables, created by [`ensure_schema`](Self::ensure_schema):
///
/// | table | holds |
/// | --- | --- |
/// | `pglock_tenant_migrations` | one row per migration: phase, progress, settings, errors, pause, the current cutover attempt; a partial unique index allows one migration in a non-terminal phase per tenant |
/// | `pglock_tenant_routing` | one row per tenant: serving store, target, routing state, owning migration, fence |
/// | `pglock_migration_audit_log` | what happened to each migration, in order |
///
/// Phase and routing changes are compare-and-set in a single `UPDATE ... WHERE` each, and a
/// [transition](MigrationStore::apply_transition) (phase, routing, audit entry) is one
/// transaction. The tables live in the connection's `search_path` (usually `public`) unless a
/// schema is given with [`with_schema`](Self::with_schema).
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

/// The qualified, quoted table names, substituted into the statement templates.
#[derive(Debug)]
struct Tables {
    schema: Option<String>,
    quoted_schema: Option<String>,
    migrations: String,
    routing: String,
    audit: String,
}

impl Tables {
    fn new(schema: Option<&str>) -> Result<Self> {
        let quoted_schema = schema.map(quote_identifier).transpose()?;
        let qualify = |table: &str| match &quoted_schema {
            Some(schema) => format!("{schema}.{table}"),
            None => table.to_owned(),
        };
        Ok(Tables {
            schema: schema.map(str::to_owned),
            migrations: qualify("pglock_tenant_migrations"),
            routing: qualify("pglock_tenant_routing"),
            audit: qualify("pglock_migration_audit_log"),
            quoted_schema,
        })
    }

    /// A statement template with its table placeholders filled in. The only text substituted
    /// is the validated, quoted identifiers above: values are always bound parameters.
    fn sql(&self, template: &str) -> SqlStr {
        AssertSqlSafe(
            template
                .replace("{migrations}", &self.migrations)
                .replace("{routing}", &self.routing)
                .replace("{audit}", &self.audit),
        )
        .into_sql_str()
    }
}

/// Quotes a configured identifier for PostgreSQL, refusing what it cannot be.
fn quote_identifier(name: &str) -> Result<String> {
    let invalid = |reason| Error::InvalidIdentifier {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("it is empty"));
    }
    if name.len() > 63 {
        return Err(invalid("it is longer than PostgreSQL's 63 bytes"));
    }
    if name.contains('\0') {
        return Err(invalid("it contains a NUL character"));
    }
    Ok(format!("\"{}\"", name.replace('"', "\"\"")))
}

const DDL: &str = r#"
CREATE TABLE IF NOT EXISTS {migrations} (
    id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    source_store_id text NOT NULL,
    target_store_id text NOT NULL,
    phase text NOT NULL CHECK (phase IN
        ('pending', 'bulk_copy', 'dual_write', 'cutover', 'completed', 'aborted', 'failed')),
    cutover_timeout_ms integer NOT NULL CHECK (cutover_timeout_ms > 0),
    max_lag_events bigint NOT NULL CHECK (max_lag_events >= 0),
    batch_size integer NOT NULL CHECK (batch_size > 0),
    events_total bigint,
    events_copied bigint NOT NULL DEFAULT 0,
    last_source_position bigint,
    cutover_attempt uuid,
    is_paused boolean NOT NULL DEFAULT false,
    paused_at timestamptz,
    pause_reason text,
    error_count integer NOT NULL DEFAULT 0,
    last_error text,
    last_error_at timestamptz,
    created_by text,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    bulk_copy_started_at timestamptz,
    dual_write_started_at timestamptz,
    cutover_started_at timestamptz,
    finished_at timestamptz,
    CHECK ((phase = 'cutover') = (cutover_attempt IS NOT NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS pglock_tenant_migrations_one_active
    ON {migrations} (tenant_id)
    WHERE phase NOT IN ('completed', 'aborted', 'failed');
CREATE TABLE IF NOT EXISTS {routing} (
    tenant_id uuid PRIMARY KEY,
    store_id text NOT NULL,
    target_store_id text,
    migration_state text NOT NULL CHECK (migration_state IN
        ('normal', 'bulk_copy', 'dual_write', 'cutover_paused', 'migrated')),
    active_migration_id uuid REFERENCES {migrations} (id) ON DELETE SET NULL,
    fence bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {audit} (
    id bigserial PRIMARY KEY,
    migration_id uuid NOT NULL REFERENCES {migrations} (id) ON DELETE CASCADE,
    tenant_id uuid NOT NULL,
    event_type text NOT NULL CHECK (event_type IN
        ('migration_started', 'phase_changed', 'migration_paused', 'migration_resumed',
         'migration_aborted', 'migration_failed', 'cutover_initiated', 'cutover_completed',
         'cutover_rolled_back')),
    from_phase text,
    to_phase text,
    message text,
    cutover_attempt uuid,
    fencing_token bigint,
    events_synced bigint,
    duration_ms double precision,
    occurred_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS pglock_migration_audit_log_by_migration
    ON {audit} (migration_id, id);
"#;

/// The key of the advisory lock that serialises schema setup across processes: concurrent
/// `CREATE ... IF NOT EXISTS` of one table can otherwise fail on the catalog's unique indexes.
const SCHEMA_LOCK_KEY: &str = "pglock:migration-schema";

/// The name of the partial unique index; a violation of it means "already has an active one".
const ONE_ACTIVE_INDEX: &str = "pglock_tenant_migrations_one_active";

const MIGRATION_COLUMNS: &str = "id, tenant_id, source_store_id, target_store_id, phase, \
    cutover_timeout_ms, max_lag_events, batch_size, events_total, events_copied, \
    last_source_position, cutover_attempt, is_paused, paused_at, pause_reason, error_count, \
    last_error, last_error_at, created_by, created_at, updated_at, bulk_copy_started_at, \
    dual_write_started_at, cutover_started_at, finished_at";

const ROUTING_COLUMNS: &str = "tenant_id, store_id, target_store_id, migration_state, \
    active_migration_id, fence, updated_at";

const TERMINAL: &str = "('completed', 'aborted', 'failed')";

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

    /// Creates the schema (when one was given), the tables and their indexes, if they do not
    /// exist yet.
    ///
    /// Idempotent, and safe to run concurrently from several processes: setups are serialised
    /// by a transaction-scoped advisory lock.
    ///
    /// # Errors
    ///
    /// [`Error::Storage`] when a statement fails (for example for lack of the
    /// `CREATE` privilege).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the setup is one transaction, committed or rolled back.
    pub async fn ensure_schema(&self) -> Result<()> {
        let failed = storage("create the migration tables");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(lock_id(SCHEMA_LOCK_KEY))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        let mut ddl = String::new();
        if let Some(schema) = &self.tables.quoted_schema {
            ddl.push_str(&format!("CREATE SCHEMA IF NOT EXISTS {schema};"));
        }
        ddl.push_str(self.tables.sql(DDL).as_str());
        sqlx::raw_sql(AssertSqlSafe(ddl))
            .execute(&mut *tx)
            .await
            .map_err(failed)?;
        tx.commit().await.map_err(failed)
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

    async fn migration_phase(
        &self,
        conn: &mut PgConnection,
        id: Uuid,
    ) -> Result<Option<(MigrationPhase, Option<Uuid>)>> {
        let row: Option<(String, Option<Uuid>)> = sqlx::query_as(
            self.tables
                .sql("SELECT phase, cutover_attempt FROM {migrations} WHERE id = $1"),
        )
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(storage("read a migration"))?;
        row.map(|(phase, attempt)| Ok((decode_name(&phase)?, attempt)))
            .transpose()
    }
}

impl fmt::Debug for PostgresMigrationStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresMigrationStore")
            .field("schema", &self.tables.schema)
            .finish_non_exhaustive()
    }
}

fn storage(operation: &'static str) -> impl Fn(sqlx::Error) -> Error + Copy {
    move |source| Error::Storage { operation, source }
}

fn decode_name<T>(name: &str) -> Result<T>
where
    T: std::str::FromStr<Err = crate::model::UnknownName>,
{
    name.parse().map_err(|err| Error::Storage {
        operation: "decode a stored name",
        source: sqlx::Error::Decode(Box::new(err)),
    })
}

fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

fn migration_from_row(row: &PgRow) -> Result<Migration> {
    let read = || -> std::result::Result<Migration, sqlx::Error> {
        let phase: String = row.try_get("phase")?;
        let timeout_ms: i32 = row.try_get("cutover_timeout_ms")?;
        let batch_size: i32 = row.try_get("batch_size")?;
        let error_count: i32 = row.try_get("error_count")?;
        Ok(Migration {
            id: row.try_get("id")?,
            tenant_id: row.try_get("tenant_id")?,
            source_store_id: row.try_get("source_store_id")?,
            target_store_id: row.try_get("target_store_id")?,
            phase: phase
                .parse()
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))?,
            config: MigrationConfig {
                cutover_timeout: Duration::from_millis(u64::try_from(timeout_ms).unwrap_or(0)),
                max_lag_events: to_u64(row.try_get("max_lag_events")?),
                batch_size: u32::try_from(batch_size).unwrap_or(1),
            },
            events_total: row.try_get::<Option<i64>, _>("events_total")?.map(to_u64),
            events_copied: to_u64(row.try_get("events_copied")?),
            last_source_position: row.try_get("last_source_position")?,
            cutover_attempt: row.try_get("cutover_attempt")?,
            is_paused: row.try_get("is_paused")?,
            paused_at: row.try_get("paused_at")?,
            pause_reason: row.try_get("pause_reason")?,
            error_count: u32::try_from(error_count).unwrap_or(0),
            last_error: row.try_get("last_error")?,
            last_error_at: row.try_get("last_error_at")?,
            created_by: row.try_get("created_by")?,
            created_at: row.try_get("created_at")?,
            updated_at: row.try_get("updated_at")?,
            bulk_copy_started_at: row.try_get("bulk_copy_started_at")?,
            dual_write_started_at: row.try_get("dual_write_started_at")?,
            cutover_started_at: row.try_get("cutover_started_at")?,
            finished_at: row.try_get("finished_at")?,
        })
    };
    read().map_err(storage("decode a migration"))
}

fn routing_from_row(row: &PgRow) -> Result<TenantRouting> {
    let read = || -> std::result::Result<TenantRouting, sqlx::Error> {
        let state: String = row.try_get("migration_state")?;
        Ok(TenantRouting {
            tenant_id: row.try_get("tenant_id")?,
            store_id: row.try_get("store_id")?,
            target_store_id: row.try_get("target_store_id")?,
            state: state
                .parse()
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))?,
            active_migration_id: row.try_get("active_migration_id")?,
            fence: row.try_get("fence")?,
            updated_at: row.try_get("updated_at")?,
        })
    };
    read().map_err(storage("decode a routing row"))
}

fn audit_from_row(row: &PgRow) -> Result<AuditEntry> {
    let read = || -> std::result::Result<AuditEntry, sqlx::Error> {
        let event: String = row.try_get("event_type")?;
        let phase = |column: &str| -> std::result::Result<Option<MigrationPhase>, sqlx::Error> {
            row.try_get::<Option<String>, _>(column)?
                .map(|name| name.parse())
                .transpose()
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))
        };
        Ok(AuditEntry {
            id: row.try_get("id")?,
            migration_id: row.try_get("migration_id")?,
            tenant_id: row.try_get("tenant_id")?,
            event: event
                .parse()
                .map_err(|err| sqlx::Error::Decode(Box::new(err)))?,
            from_phase: phase("from_phase")?,
            to_phase: phase("to_phase")?,
            message: row.try_get("message")?,
            cutover_attempt: row.try_get("cutover_attempt")?,
            fencing_token: row.try_get("fencing_token")?,
            events_synced: row.try_get::<Option<i64>, _>("events_synced")?.map(to_u64),
            duration_ms: row.try_get("duration_ms")?,
            occurred_at: row.try_get("occurred_at")?,
        })
    };
    read().map_err(storage("decode an audit entry"))
}

async fn fetch_routing(
    tables: &Tables,
    conn: &mut PgConnection,
    tenant_id: Uuid,
) -> Result<Option<TenantRouting>> {
    let sql = format!("SELECT {ROUTING_COLUMNS} FROM {{routing}} WHERE tenant_id = $1");
    sqlx::query(tables.sql(&sql))
        .bind(tenant_id)
        .fetch_optional(conn)
        .await
        .map_err(storage("read a tenant's routing"))?
        .as_ref()
        .map(routing_from_row)
        .transpose()
}

/// One audit entry, inserted on `conn` (inside the transaction of the change it records).
struct AuditInsert<'a> {
    migration_id: Uuid,
    tenant_id: Uuid,
    event: AuditEvent,
    from: Option<MigrationPhase>,
    to: Option<MigrationPhase>,
    message: Option<&'a str>,
    attempt: Option<Uuid>,
    fencing_token: Option<i64>,
    events_synced: Option<u64>,
    duration_ms: Option<f64>,
}

impl<'a> AuditInsert<'a> {
    fn event(migration: &Migration, event: AuditEvent, message: Option<&'a str>) -> Self {
        AuditInsert {
            migration_id: migration.id,
            tenant_id: migration.tenant_id,
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

    async fn run(self, tables: &Tables, conn: &mut PgConnection) -> Result<()> {
        sqlx::query(tables.sql(
            "INSERT INTO {audit} (migration_id, tenant_id, event_type, from_phase, to_phase, \
             message, cutover_attempt, fencing_token, events_synced, duration_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        ))
        .bind(self.migration_id)
        .bind(self.tenant_id)
        .bind(self.event.as_str())
        .bind(self.from.map(MigrationPhase::as_str))
        .bind(self.to.map(MigrationPhase::as_str))
        .bind(self.message)
        .bind(self.attempt)
        .bind(self.fencing_token)
        .bind(self.events_synced.map(to_i64))
        .bind(self.duration_ms)
        .execute(conn)
        .await
        .map_err(storage("append to the audit log"))?;
        Ok(())
    }
}

/// The compare-and-set routing update, on `conn`.
async fn update_routing(
    tables: &Tables,
    conn: &mut PgConnection,
    tenant_id: Uuid,
    change: &RoutingChange,
) -> Result<TenantRouting> {
    change.validate(tenant_id)?;
    let sql = format!(
        "UPDATE {{routing}} SET migration_state = $3, store_id = $4, target_store_id = $5, \
         active_migration_id = $6, fence = COALESCE($7, fence), updated_at = clock_timestamp() \
         WHERE tenant_id = $1 AND migration_state = $2 AND ($7::bigint IS NULL OR fence <= $7) \
         RETURNING {ROUTING_COLUMNS}"
    );
    let updated = sqlx::query(tables.sql(&sql))
        .bind(tenant_id)
        .bind(change.expected.as_str())
        .bind(change.state.as_str())
        .bind(&change.store_id)
        .bind(&change.target_store_id)
        .bind(change.active_migration_id)
        .bind(change.fencing_token)
        .fetch_optional(&mut *conn)
        .await
        .map_err(storage("switch a tenant's routing"))?;
    if let Some(row) = updated {
        return routing_from_row(&row);
    }
    // Nothing matched: say which condition failed.
    let current = fetch_routing(tables, conn, tenant_id)
        .await?
        .ok_or(Error::RoutingNotFound { tenant_id })?;
    if current.state != change.expected {
        return Err(Error::RoutingStateChanged {
            tenant_id,
            expected: change.expected,
            actual: current.state,
        });
    }
    match change.fencing_token {
        Some(token) if current.fence > token => Err(Error::FenceRejected {
            tenant_id,
            token,
            fence: current.fence,
        }),
        // The row matched again when re-read: it changed twice meanwhile. Report the state we
        // expected as changed; the caller re-reads anyway.
        _ => Err(Error::RoutingStateChanged {
            tenant_id,
            expected: change.expected,
            actual: current.state,
        }),
    }
}

#[async_trait]
impl MigrationRepository for PostgresMigrationStore {
    async fn get_migration(&self, id: Uuid) -> Result<Option<Migration>> {
        let sql = format!("SELECT {MIGRATION_COLUMNS} FROM {{migrations}} WHERE id = $1");
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
             WHERE tenant_id = $1 AND phase NOT IN {TERMINAL}"
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
             WHERE phase NOT IN {TERMINAL} ORDER BY created_at, id"
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
        let sql = format!(
            "UPDATE {{migrations}} SET events_copied = events_copied + $2, \
             last_source_position = $3, events_total = COALESCE($4, events_total), \
             updated_at = clock_timestamp() \
             WHERE id = $1 AND phase = 'bulk_copy' RETURNING {MIGRATION_COLUMNS}"
        );
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(storage("record copy progress"))?;
        let updated = sqlx::query(self.tables.sql(&sql))
            .bind(id)
            .bind(to_i64(copied))
            .bind(last_position)
            .bind(total.map(to_i64))
            .fetch_optional(&mut *conn)
            .await
            .map_err(storage("record copy progress"))?;
        if let Some(row) = updated {
            return migration_from_row(&row);
        }
        match self.migration_phase(&mut conn, id).await? {
            None => Err(Error::MigrationNotFound { migration_id: id }),
            Some((phase, _)) => Err(Error::WrongPhase {
                migration_id: id,
                operation: RECORD_PROGRESS,
                phase,
            }),
        }
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
        sqlx::query(self.tables.sql(
            "INSERT INTO {routing} (tenant_id, store_id, migration_state) \
             VALUES ($1, $2, 'normal') ON CONFLICT (tenant_id) DO NOTHING",
        ))
        .bind(tenant_id)
        .bind(store_id)
        .execute(&mut *conn)
        .await
        .map_err(failed)?;
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
        let mut conn = self
            .pool
            .acquire()
            .await
            .map_err(storage("switch a tenant's routing"))?;
        update_routing(&self.tables, &mut conn, tenant_id, change).await
    }
}

#[async_trait]
impl AuditLog for PostgresMigrationStore {
    async fn audit_log(&self, migration_id: Uuid) -> Result<Vec<AuditEntry>> {
        sqlx::query(self.tables.sql(
            "SELECT id, migration_id, tenant_id, event_type, from_phase, to_phase, message, \
             cutover_attempt, fencing_token, events_synced, duration_ms, occurred_at \
             FROM {audit} WHERE migration_id = $1 ORDER BY id",
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
        let sql = format!(
            "INSERT INTO {{migrations}} (id, tenant_id, source_store_id, target_store_id, phase, \
             cutover_timeout_ms, max_lag_events, batch_size, created_by) \
             VALUES ($1, $2, $3, $4, 'pending', $5, $6, $7, $8) RETURNING {MIGRATION_COLUMNS}"
        );
        let inserted = sqlx::query(self.tables.sql(&sql))
            .bind(new.id)
            .bind(new.tenant_id)
            .bind(&new.source_store_id)
            .bind(&new.target_store_id)
            .bind(i32::try_from(new.config.cutover_timeout.as_millis()).unwrap_or(i32::MAX))
            .bind(to_i64(new.config.max_lag_events))
            .bind(i32::try_from(new.config.batch_size).unwrap_or(i32::MAX))
            .bind(&new.created_by)
            .fetch_one(&mut *tx)
            .await;
        let row = match inserted {
            Ok(row) => row,
            Err(err) if violates(&err, ONE_ACTIVE_INDEX) => {
                drop(tx);
                let active = self.active_migration_for_tenant(new.tenant_id).await?;
                return Err(Error::ActiveMigrationExists {
                    tenant_id: new.tenant_id,
                    migration_id: active.map(|m| m.id),
                });
            }
            Err(err) => return Err(failed(err)),
        };
        let migration = migration_from_row(&row)?;

        // Make sure the tenant has a row, then check and claim it under its row lock.
        sqlx::query(self.tables.sql(
            "INSERT INTO {routing} (tenant_id, store_id, migration_state) \
             VALUES ($1, $2, 'normal') ON CONFLICT (tenant_id) DO NOTHING",
        ))
        .bind(new.tenant_id)
        .bind(&new.source_store_id)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
        let sql =
            format!("SELECT {ROUTING_COLUMNS} FROM {{routing}} WHERE tenant_id = $1 FOR UPDATE");
        let current = sqlx::query(self.tables.sql(&sql))
            .bind(new.tenant_id)
            .fetch_one(&mut *tx)
            .await
            .map_err(failed)?;
        check_routable(&routing_from_row(&current)?, new)?;
        sqlx::query(self.tables.sql(
            "UPDATE {routing} SET migration_state = 'normal', target_store_id = $2, \
             active_migration_id = $3, updated_at = clock_timestamp() WHERE tenant_id = $1",
        ))
        .bind(new.tenant_id)
        .bind(&new.target_store_id)
        .bind(new.id)
        .execute(&mut *tx)
        .await
        .map_err(failed)?;
        let mut audit = AuditInsert::event(&migration, AuditEvent::MigrationStarted, None);
        audit.to = Some(MigrationPhase::Pending);
        audit.run(&self.tables, &mut tx).await?;
        tx.commit().await.map_err(failed)?;
        Ok(migration)
    }

    async fn apply_transition(&self, transition: &Transition) -> Result<Migration> {
        transition.validate()?;
        let failed = storage("apply a phase transition");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let sql = format!(
            "UPDATE {{migrations}} SET phase = $3, cutover_attempt = $5, \
             updated_at = clock_timestamp(), \
             bulk_copy_started_at = CASE WHEN $3 = 'bulk_copy' THEN clock_timestamp() \
                 ELSE bulk_copy_started_at END, \
             dual_write_started_at = CASE WHEN $3 = 'dual_write' AND $2 = 'bulk_copy' \
                 THEN clock_timestamp() ELSE dual_write_started_at END, \
             cutover_started_at = CASE WHEN $3 = 'cutover' THEN clock_timestamp() \
                 ELSE cutover_started_at END, \
             finished_at = CASE WHEN $3 IN {TERMINAL} THEN clock_timestamp() \
                 ELSE finished_at END, \
             error_count = error_count + CASE WHEN $6::text IS NULL THEN 0 ELSE 1 END, \
             last_error = COALESCE($6, last_error), \
             last_error_at = CASE WHEN $6::text IS NULL THEN last_error_at \
                 ELSE clock_timestamp() END \
             WHERE id = $1 AND phase = $2 \
               AND ($4::uuid IS NULL OR cutover_attempt = $4) \
             RETURNING {MIGRATION_COLUMNS}"
        );
        let updated = sqlx::query(self.tables.sql(&sql))
            .bind(transition.migration_id)
            .bind(transition.from.as_str())
            .bind(transition.to.as_str())
            .bind(transition.expected_attempt)
            .bind(transition.new_attempt)
            .bind(&transition.error)
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?;
        let Some(row) = updated else {
            let id = transition.migration_id;
            return Err(match self.migration_phase(&mut tx, id).await? {
                None => Error::MigrationNotFound { migration_id: id },
                Some((actual, _)) if actual != transition.from => Error::PhaseChanged {
                    migration_id: id,
                    expected: transition.from,
                    actual,
                    to: transition.to,
                },
                Some((_, actual)) => Error::StaleCutoverAttempt {
                    migration_id: id,
                    expected: transition.expected_attempt.unwrap_or_default(),
                    actual,
                },
            });
        };
        let migration = migration_from_row(&row)?;
        if let Some(change) = &transition.routing {
            update_routing(&self.tables, &mut tx, transition.tenant_id, change).await?;
        }
        AuditInsert {
            migration_id: transition.migration_id,
            tenant_id: transition.tenant_id,
            event: transition.event,
            from: Some(transition.from),
            to: Some(transition.to),
            message: transition.message.as_deref(),
            attempt: transition.new_attempt.or(transition.expected_attempt),
            fencing_token: transition.routing.as_ref().and_then(|r| r.fencing_token),
            events_synced: transition.events_synced,
            duration_ms: transition.duration_ms,
        }
        .run(&self.tables, &mut tx)
        .await?;
        tx.commit().await.map_err(failed)?;
        Ok(migration)
    }

    async fn set_paused(&self, id: Uuid, paused: bool, reason: Option<&str>) -> Result<Migration> {
        let failed = storage("pause or resume a migration");
        let mut tx = self.pool.begin().await.map_err(failed)?;
        let sql = format!(
            "UPDATE {{migrations}} SET is_paused = $2, \
             paused_at = CASE WHEN $2 THEN clock_timestamp() END, \
             pause_reason = CASE WHEN $2 THEN $3 END, updated_at = clock_timestamp() \
             WHERE id = $1 AND phase NOT IN {TERMINAL} RETURNING {MIGRATION_COLUMNS}"
        );
        let updated = sqlx::query(self.tables.sql(&sql))
            .bind(id)
            .bind(paused)
            .bind(reason)
            .fetch_optional(&mut *tx)
            .await
            .map_err(failed)?;
        let Some(row) = updated else {
            return Err(match self.migration_phase(&mut tx, id).await? {
                None => Error::MigrationNotFound { migration_id: id },
                Some((phase, _)) => Error::WrongPhase {
                    migration_id: id,
                    operation: if paused {
                        "pause migration"
                    } else {
                        "resume migration"
                    },
                    phase,
                },
            });
        };
        let migration = migration_from_row(&row)?;
        let event = if paused {
            AuditEvent::MigrationPaused
        } else {
            AuditEvent::MigrationResumed
        };
        AuditInsert::event(&migration, event, reason)
            .run(&self.tables, &mut tx)
            .await?;
        tx.commit().await.map_err(failed)?;
        Ok(migration)
    }
}

fn violates(err: &sqlx::Error, constraint: &str) -> bool {
    err.as_database_error()
        .and_then(|db| db.constraint())
        .is_some_and(|name| name == constraint)
}
