//! Rows in and out: decoding, and the statements that read (and lock) or write whole rows.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use uuid::Uuid;

use super::schema::{MIGRATION_COLUMNS, ROUTING_COLUMNS, Tables};
use crate::model::{AuditEntry, Migration, MigrationConfig, MigrationPhase, TenantRouting};
use crate::rules::AuditRecord;
use crate::{Error, Result};

pub(super) fn storage(operation: &'static str) -> impl Fn(sqlx::Error) -> Error + Copy {
    move |source| Error::Storage { operation, source }
}

pub(super) fn to_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

fn to_u64(value: i64) -> u64 {
    u64::try_from(value).unwrap_or(0)
}

pub(super) fn migration_from_row(row: &PgRow) -> Result<Migration> {
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

pub(super) fn routing_from_row(row: &PgRow) -> Result<TenantRouting> {
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

pub(super) fn audit_from_row(row: &PgRow) -> Result<AuditEntry> {
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

/// The server's clock, which stamps every change, so timestamps of all processes compare.
pub(super) async fn server_now(conn: &mut PgConnection) -> Result<DateTime<Utc>> {
    sqlx::query_scalar("SELECT pg_catalog.clock_timestamp()")
        .fetch_one(conn)
        .await
        .map_err(storage("read the server's clock"))
}

/// The tenant's routing row.
pub(super) async fn fetch_routing(
    tables: &Tables,
    conn: &mut PgConnection,
    tenant_id: Uuid,
) -> Result<Option<TenantRouting>> {
    let sql = format!(
        "SELECT {ROUTING_COLUMNS} FROM {{routing}} WHERE tenant_id OPERATOR(pg_catalog.=) $1"
    );
    sqlx::query(tables.sql(&sql))
        .bind(tenant_id)
        .fetch_optional(conn)
        .await
        .map_err(storage("read a tenant's routing"))?
        .as_ref()
        .map(routing_from_row)
        .transpose()
}

/// The migration row, locked until the transaction ends, and the server's clock.
pub(super) async fn lock_migration(
    tables: &Tables,
    conn: &mut PgConnection,
    id: Uuid,
) -> Result<(Migration, DateTime<Utc>)> {
    let sql = format!(
        "SELECT {MIGRATION_COLUMNS}, pg_catalog.clock_timestamp() AS now FROM {{migrations}} \
         WHERE id OPERATOR(pg_catalog.=) $1 FOR UPDATE"
    );
    let row = sqlx::query(tables.sql(&sql))
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(storage("read a migration"))?
        .ok_or(Error::MigrationNotFound { migration_id: id })?;
    let now = row
        .try_get("now")
        .map_err(storage("read the server's clock"))?;
    Ok((migration_from_row(&row)?, now))
}

/// The tenant's routing row, locked until the transaction ends, and the server's clock.
pub(super) async fn lock_routing(
    tables: &Tables,
    conn: &mut PgConnection,
    tenant_id: Uuid,
) -> Result<Option<(TenantRouting, DateTime<Utc>)>> {
    let sql = format!(
        "SELECT {ROUTING_COLUMNS}, pg_catalog.clock_timestamp() AS now FROM {{routing}} \
         WHERE tenant_id OPERATOR(pg_catalog.=) $1 FOR UPDATE"
    );
    let row = sqlx::query(tables.sql(&sql))
        .bind(tenant_id)
        .fetch_optional(conn)
        .await
        .map_err(storage("read a tenant's routing"))?;
    row.map(|row| {
        let now = row
            .try_get("now")
            .map_err(storage("read the server's clock"))?;
        Ok((routing_from_row(&row)?, now))
    })
    .transpose()
}

/// Inserts a new migration row.
pub(super) async fn insert_migration(
    tables: &Tables,
    conn: &mut PgConnection,
    m: &Migration,
) -> std::result::Result<(), sqlx::Error> {
    sqlx::query(tables.sql(
        "INSERT INTO {migrations} (id, tenant_id, source_store_id, target_store_id, phase, \
         cutover_timeout_ms, max_lag_events, batch_size, created_by, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $10)",
    ))
    .bind(m.id)
    .bind(m.tenant_id)
    .bind(&m.source_store_id)
    .bind(&m.target_store_id)
    .bind(m.phase.as_str())
    .bind(i32::try_from(m.config.cutover_timeout.as_millis()).unwrap_or(i32::MAX))
    .bind(to_i64(m.config.max_lag_events))
    .bind(i32::try_from(m.config.batch_size).unwrap_or(i32::MAX))
    .bind(&m.created_by)
    .bind(m.created_at)
    .execute(conn)
    .await?;
    Ok(())
}

/// Writes everything of a migration row that changes after its creation.
pub(super) async fn update_migration(
    tables: &Tables,
    conn: &mut PgConnection,
    m: &Migration,
) -> Result<()> {
    sqlx::query(tables.sql(
        "UPDATE {migrations} SET phase = $2, events_total = $3, events_copied = $4, \
         last_source_position = $5, cutover_attempt = $6, is_paused = $7, paused_at = $8, \
         pause_reason = $9, error_count = $10, last_error = $11, last_error_at = $12, \
         updated_at = $13, bulk_copy_started_at = $14, dual_write_started_at = $15, \
         cutover_started_at = $16, finished_at = $17 WHERE id OPERATOR(pg_catalog.=) $1",
    ))
    .bind(m.id)
    .bind(m.phase.as_str())
    .bind(m.events_total.map(to_i64))
    .bind(to_i64(m.events_copied))
    .bind(m.last_source_position)
    .bind(m.cutover_attempt)
    .bind(m.is_paused)
    .bind(m.paused_at)
    .bind(&m.pause_reason)
    .bind(i32::try_from(m.error_count).unwrap_or(i32::MAX))
    .bind(&m.last_error)
    .bind(m.last_error_at)
    .bind(m.updated_at)
    .bind(m.bulk_copy_started_at)
    .bind(m.dual_write_started_at)
    .bind(m.cutover_started_at)
    .bind(m.finished_at)
    .execute(conn)
    .await
    .map_err(storage("write a migration"))?;
    Ok(())
}

/// Inserts a routing row, or writes over the one the tenant has.
pub(super) async fn upsert_routing(
    tables: &Tables,
    conn: &mut PgConnection,
    r: &TenantRouting,
    overwrite: bool,
) -> Result<()> {
    let on_conflict = if overwrite {
        "DO UPDATE SET store_id = $2, target_store_id = $3, migration_state = $4, \
         active_migration_id = $5, fence = $6, updated_at = $7"
    } else {
        "DO NOTHING"
    };
    let sql = format!(
        "INSERT INTO {{routing}} (tenant_id, store_id, target_store_id, migration_state, \
         active_migration_id, fence, created_at, updated_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7) ON CONFLICT (tenant_id) {on_conflict}"
    );
    sqlx::query(tables.sql(&sql))
        .bind(r.tenant_id)
        .bind(&r.store_id)
        .bind(&r.target_store_id)
        .bind(r.state.as_str())
        .bind(r.active_migration_id)
        .bind(r.fence)
        .bind(r.updated_at)
        .execute(conn)
        .await
        .map_err(storage("write a tenant's routing"))?;
    Ok(())
}

/// Appends an audit entry.
pub(super) async fn insert_audit(
    tables: &Tables,
    conn: &mut PgConnection,
    a: &AuditRecord,
) -> Result<()> {
    sqlx::query(tables.sql(
        "INSERT INTO {audit} (migration_id, tenant_id, event_type, from_phase, to_phase, \
         message, cutover_attempt, fencing_token, events_synced, duration_ms, occurred_at) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    ))
    .bind(a.migration_id)
    .bind(a.tenant_id)
    .bind(a.event.as_str())
    .bind(a.from_phase.map(MigrationPhase::as_str))
    .bind(a.to_phase.map(MigrationPhase::as_str))
    .bind(&a.message)
    .bind(a.cutover_attempt)
    .bind(a.fencing_token)
    .bind(a.events_synced.map(to_i64))
    .bind(a.duration_ms)
    .bind(a.occurred_at)
    .execute(conn)
    .await
    .map_err(storage("append to the audit log"))?;
    Ok(())
}
