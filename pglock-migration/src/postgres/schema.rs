//! The tables: their names (in an optional schema), their DDL, their columns.

use sqlx::{AssertSqlSafe, SqlSafeStr, SqlStr};

use crate::{Error, Result};

/// The qualified, quoted table names, substituted into the statement templates.
#[derive(Debug)]
pub(super) struct Tables {
    pub(super) schema: Option<String>,
    pub(super) quoted_schema: Option<String>,
    migrations: String,
    routing: String,
    audit: String,
}

impl Tables {
    pub(super) fn new(schema: Option<&str>) -> Result<Self> {
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

    /// Each table (and the audit log's id sequence) with the privileges the store needs on it:
    /// `(kind, quoted name, privileges)`.
    pub(super) fn needs(&self) -> [(&'static str, String, &'static [&'static str]); 4] {
        const ROWS: &[&str] = &["SELECT", "INSERT", "UPDATE"];
        let sequence = match &self.quoted_schema {
            Some(schema) => format!("{schema}.pglock_migration_audit_log_id_seq"),
            None => "pglock_migration_audit_log_id_seq".to_owned(),
        };
        [
            ("table", self.migrations.clone(), ROWS),
            ("table", self.routing.clone(), ROWS),
            ("table", self.audit.clone(), &["SELECT", "INSERT"]),
            ("sequence", sequence, &["USAGE"]),
        ]
    }

    /// A statement template with its table placeholders filled in. The only text substituted
    /// is the validated, quoted identifiers above: values are always bound parameters.
    pub(super) fn sql(&self, template: &str) -> SqlStr {
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

pub(super) const DDL: &str = r#"
CREATE TABLE IF NOT EXISTS {migrations} (
    id pg_catalog.uuid PRIMARY KEY,
    tenant_id pg_catalog.uuid NOT NULL,
    source_store_id pg_catalog.text NOT NULL,
    target_store_id pg_catalog.text NOT NULL,
    phase pg_catalog.text NOT NULL CHECK (phase OPERATOR(pg_catalog.=) ANY (ARRAY[
        'pending', 'bulk_copy', 'dual_write', 'cutover', 'completed', 'aborted', 'failed'
        ]::pg_catalog.text[])),
    cutover_timeout_ms integer NOT NULL CHECK (cutover_timeout_ms OPERATOR(pg_catalog.>) 0),
    max_lag_events bigint NOT NULL CHECK (max_lag_events OPERATOR(pg_catalog.>=) 0),
    batch_size integer NOT NULL CHECK (batch_size OPERATOR(pg_catalog.>) 0),
    events_total bigint,
    events_copied bigint NOT NULL DEFAULT 0,
    last_source_position bigint,
    cutover_attempt pg_catalog.uuid,
    is_paused boolean NOT NULL DEFAULT false,
    paused_at timestamp with time zone,
    pause_reason pg_catalog.text,
    error_count integer NOT NULL DEFAULT 0,
    last_error pg_catalog.text,
    last_error_at timestamp with time zone,
    created_by pg_catalog.text,
    created_at timestamp with time zone NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    updated_at timestamp with time zone NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    bulk_copy_started_at timestamp with time zone,
    dual_write_started_at timestamp with time zone,
    cutover_started_at timestamp with time zone,
    finished_at timestamp with time zone,
    CHECK ((phase OPERATOR(pg_catalog.=) 'cutover') OPERATOR(pg_catalog.=) (cutover_attempt IS NOT NULL))
);
CREATE UNIQUE INDEX IF NOT EXISTS pglock_tenant_migrations_one_active
    ON {migrations} (tenant_id)
    WHERE NOT (phase OPERATOR(pg_catalog.=) ANY (ARRAY['completed', 'aborted', 'failed']::pg_catalog.text[]));
CREATE TABLE IF NOT EXISTS {routing} (
    tenant_id pg_catalog.uuid PRIMARY KEY,
    store_id pg_catalog.text NOT NULL,
    target_store_id pg_catalog.text,
    migration_state pg_catalog.text NOT NULL CHECK (migration_state OPERATOR(pg_catalog.=) ANY (ARRAY[
        'normal', 'bulk_copy', 'dual_write', 'cutover_paused', 'migrated'
        ]::pg_catalog.text[])),
    active_migration_id pg_catalog.uuid REFERENCES {migrations} (id) ON DELETE SET NULL,
    fence bigint NOT NULL DEFAULT 0,
    created_at timestamp with time zone NOT NULL DEFAULT pg_catalog.clock_timestamp(),
    updated_at timestamp with time zone NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
CREATE TABLE IF NOT EXISTS {audit} (
    id bigserial PRIMARY KEY,
    migration_id pg_catalog.uuid NOT NULL REFERENCES {migrations} (id) ON DELETE CASCADE,
    tenant_id pg_catalog.uuid NOT NULL,
    event_type pg_catalog.text NOT NULL CHECK (event_type OPERATOR(pg_catalog.=) ANY (ARRAY[
        'migration_started', 'phase_changed', 'migration_paused', 'migration_resumed',
        'migration_aborted', 'migration_failed', 'cutover_initiated', 'cutover_completed',
        'cutover_rolled_back']::pg_catalog.text[])),
    from_phase pg_catalog.text,
    to_phase pg_catalog.text,
    message pg_catalog.text,
    cutover_attempt pg_catalog.uuid,
    fencing_token bigint,
    events_synced bigint,
    duration_ms double precision,
    occurred_at timestamp with time zone NOT NULL DEFAULT pg_catalog.clock_timestamp()
);
CREATE INDEX IF NOT EXISTS pglock_migration_audit_log_by_migration
    ON {audit} (migration_id, id);
"#;

/// For each object (`$1` kinds, `$2` quoted names, `$3` privileges, one row per privilege):
/// does it exist, and does the role hold the privilege; then, whether the role may create
/// what is missing: tables in the schema (`$4`, or the first of its `search_path`), or the
/// schema itself in the database when it does not exist yet. One round trip.
pub(super) const ACCESS: &str = "SELECT n.kind, n.name, n.privilege, \
     pg_catalog.to_regclass(n.name) IS NOT NULL, \
     coalesce(CASE WHEN n.kind OPERATOR(pg_catalog.=) 'sequence' \
       THEN pg_catalog.has_sequence_privilege(pg_catalog.to_regclass(n.name), n.privilege) \
       ELSE pg_catalog.has_table_privilege(pg_catalog.to_regclass(n.name), n.privilege) END, \
       false), \
     CASE WHEN EXISTS (SELECT FROM pg_catalog.pg_namespace \
         WHERE nspname OPERATOR(pg_catalog.=) s.name) \
       THEN pg_catalog.has_schema_privilege(s.name, 'CREATE') \
       ELSE pg_catalog.has_database_privilege(pg_catalog.current_database(), 'CREATE') END, \
     coalesce(s.name, '') \
     FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.text[]), \
       pg_catalog.unnest($2::pg_catalog.text[]), pg_catalog.unnest($3::pg_catalog.text[])) \
       AS n(kind, name, privilege), \
       (SELECT coalesce($4::pg_catalog.text, pg_catalog.current_schema()::pg_catalog.text) AS name) AS s";

/// The key of the advisory lock that serialises schema setup across processes: concurrent
/// `CREATE ... IF NOT EXISTS` of one table can otherwise fail on the catalog's unique indexes.
pub(super) const SCHEMA_LOCK_KEY: &str = "pglock:migration-schema";

/// The name of the partial unique index; a violation of it means "already has an active one".
pub(super) const ONE_ACTIVE_INDEX: &str = "pglock_tenant_migrations_one_active";

pub(super) const MIGRATION_COLUMNS: &str = "id, tenant_id, source_store_id, target_store_id, phase, \
    cutover_timeout_ms, max_lag_events, batch_size, events_total, events_copied, \
    last_source_position, cutover_attempt, is_paused, paused_at, pause_reason, error_count, \
    last_error, last_error_at, created_by, created_at, updated_at, bulk_copy_started_at, \
    dual_write_started_at, cutover_started_at, finished_at";

pub(super) const ROUTING_COLUMNS: &str = "tenant_id, store_id, target_store_id, migration_state, \
    active_migration_id, fence, updated_at";

/// `phase` is one of the terminal phases (an SQL condition, named so a `search_path` cannot
/// redirect it).
pub(super) const TERMINAL: &str = "phase OPERATOR(pg_catalog.=) \
    ANY (ARRAY['completed', 'aborted', 'failed']::pg_catalog.text[])";
