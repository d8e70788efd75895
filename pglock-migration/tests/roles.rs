//! The migration store runs as the application's own role: one that owns nothing and may not
//! create in schema `public`, once an admin made the tables with the store's DDL and granted
//! what its documentation lists. Each missing grant is `Error::PermissionDenied` naming the
//! object and the privilege.

mod common;

use common::roles::Sandbox;
use pglock_migration::{AuditLog, Error, MigrationStore, NewMigration, PostgresMigrationStore};
use uuid::Uuid;

/// What the store's documentation tells an admin to grant, one statement per object.
const GRANTS: [&str; 3] = [
    "GRANT SELECT, INSERT, UPDATE ON pglock_tenant_migrations, pglock_tenant_routing TO {role}",
    "GRANT SELECT, INSERT ON pglock_migration_audit_log TO {role}",
    "GRANT USAGE ON SEQUENCE pglock_migration_audit_log_id_seq TO {role}",
];

fn denied(err: Error) -> (String, String) {
    match err {
        Error::PermissionDenied { object, privilege } => (object, privilege),
        other => panic!("expected PermissionDenied, got {other:?}"),
    }
}

#[tokio::test]
async fn the_store_runs_as_a_role_that_owns_nothing_once_its_tables_are_made_and_granted() {
    let sandbox = Sandbox::new("migration").await;
    let pool = sandbox.role_pool().await;
    let store = PostgresMigrationStore::new(pool.clone());

    // Nothing made yet, and no right to make it in public.
    let (object, privilege) = denied(store.ensure_schema().await.expect_err("no tables"));
    assert!(object.contains("schema \"public\""), "{object}");
    assert_eq!(privilege, "CREATE");

    // The admin runs the store's DDL, and grants one statement at a time: each missing grant
    // is named until every one is given.
    sandbox.admin(&store.ddl()).await;
    let expected = [
        ("table pglock_tenant_migrations", "SELECT, INSERT, UPDATE"),
        ("table pglock_migration_audit_log", "SELECT, INSERT"),
        ("sequence pglock_migration_audit_log_id_seq", "USAGE"),
    ];
    for (grant, (object, privilege)) in GRANTS.iter().zip(expected) {
        let (named, named_privilege) =
            denied(store.ensure_schema().await.expect_err("a grant is missing"));
        assert_eq!(
            (named.as_str(), named_privilege.as_str()),
            (object, privilege)
        );
        sandbox.admin(&grant.replace("{role}", &sandbox.role)).await;
    }
    store
        .ensure_schema()
        .await
        .expect("every grant given: the check passes and nothing is created");

    // The role can create a migration and its routing, and write its audit log.
    let tenant = Uuid::new_v4();
    let created = store
        .create_migration(&NewMigration::new(tenant, "source", "target"))
        .await
        .expect("create a migration as the role");
    let audit = store
        .audit_log(created.id)
        .await
        .expect("read the audit log as the role");
    assert!(!audit.is_empty(), "the creation is audited");
    pool.close().await;
    sandbox.remove().await;
}
