//! The migration store names `pg_catalog` in every statement: behind a `search_path` whose
//! first schema shadows every `pg_catalog` name it might use with one that fails, it creates
//! its tables, records and moves a migration, routes a tenant, pauses, and the write gate takes
//! its transaction lock.

mod common;

use common::{SOURCE, TARGET, app_name, url};
use pglock_migration::{
    AuditEvent, AuditLog, MigrationPhase, MigrationRepository, MigrationStore, NewMigration,
    PostgresMigrationStore, RoutingChange, RoutingRepository, RoutingState, Transition, WriteGate,
};
use pglock_testing::search_path;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use uuid::Uuid;

#[tokio::test]
async fn the_store_and_the_gate_name_pg_catalog() {
    let admin = PgPool::connect(url()).await.expect("connect");
    let schema = search_path::shadowing(&admin).await.expect("shadows");
    let options: PgConnectOptions = url().parse().expect("a valid DATABASE_URL");
    let options =
        search_path::ahead_of_pg_catalog(options.application_name(&app_name("hostile")), &schema);
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options)
        .await
        .expect("connect");
    let tables = format!(
        "pglock_hostile_{}",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let store = PostgresMigrationStore::with_schema(pool.clone(), &tables).expect("valid");
    store.ensure_schema().await.expect("create the tables");

    let tenant = Uuid::new_v4();
    let new = NewMigration::new(tenant, SOURCE, TARGET);
    let created = store.create_migration(&new).await.expect("create");
    assert_eq!(
        store.get_migration(created.id).await.expect("get"),
        Some(created.clone())
    );
    assert_eq!(
        store
            .active_migration_for_tenant(tenant)
            .await
            .expect("active"),
        Some(created.clone())
    );
    let transition = Transition::new(&created, MigrationPhase::BulkCopy, AuditEvent::PhaseChanged)
        .routing(
            RoutingChange::new(RoutingState::Normal, RoutingState::BulkCopy, SOURCE)
                .target(Some(TARGET.to_owned()))
                .owner(Some(created.id)),
        );
    let copying = store
        .apply_transition(&transition)
        .await
        .expect("transition");
    assert_eq!(copying.phase, MigrationPhase::BulkCopy);
    let paused = store
        .set_paused(created.id, true, Some("hostile"))
        .await
        .expect("pause");
    assert!(paused.is_paused);
    assert_eq!(store.list_active_migrations().await.expect("list").len(), 1);
    assert_eq!(store.audit_log(created.id).await.expect("audit").len(), 3);
    let routing = store
        .get_routing(tenant)
        .await
        .expect("routing")
        .expect("routed");
    assert_eq!(routing.state, RoutingState::BulkCopy);
    store
        .ensure_routing(Uuid::new_v4(), SOURCE)
        .await
        .expect("route a new tenant");

    let mut tx = pool.begin().await.expect("begin");
    WriteGate::enter(&mut tx, tenant)
        .await
        .expect("through the gate");
    tx.commit().await.expect("commit");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA \"{tables}\" CASCADE"
    )))
    .execute(&admin)
    .await
    .expect("drop the tables");
    search_path::drop(&admin, &schema).await.expect("drop");
}
