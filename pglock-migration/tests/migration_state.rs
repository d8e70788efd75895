//! The repositories, on PostgreSQL and in memory: idempotent schema setup, one active migration
//! per tenant, compare-and-set phase and routing changes with typed errors, all-or-nothing
//! transitions, progress, pause.

mod common;

use common::{Backend, Harness, SOURCE, TARGET, dual_writing};
use pglock_migration::Error;
use pglock_migration::{
    AuditEvent, MigrationConfig, MigrationPhase, NewMigration, PostgresMigrationStore,
    RoutingChange, RoutingState, Transition,
};
use uuid::Uuid;

fn to_bulk_copy(migration: &pglock_migration::Migration) -> Transition {
    Transition::new(
        migration,
        MigrationPhase::BulkCopy,
        AuditEvent::PhaseChanged,
    )
    .routing(
        RoutingChange::new(RoutingState::Normal, RoutingState::BulkCopy, SOURCE)
            .target(Some(TARGET.to_owned()))
            .owner(Some(migration.id)),
    )
}

async fn a_new_migration_is_pending_and_owns_its_tenants_routing(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let new = NewMigration::new(tenant, SOURCE, TARGET)
        .config(MigrationConfig::default().batch_size(7).max_lag_events(3))
        .created_by("operator");
    let created = h.store.create_migration(&new).await.unwrap();

    assert_eq!(created.id, new.id);
    assert_eq!(created.phase, MigrationPhase::Pending);
    assert_eq!(created.config, new.config);
    assert_eq!(created.created_by.as_deref(), Some("operator"));
    assert_eq!((created.events_copied, created.events_total), (0, None));
    assert_eq!(
        h.store.get_migration(new.id).await.unwrap(),
        Some(created.clone())
    );
    assert_eq!(
        h.store.active_migration_for_tenant(tenant).await.unwrap(),
        Some(created.clone())
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (
            routing.state,
            routing.store_id.as_str(),
            routing.target_store_id.as_deref(),
            routing.active_migration_id,
            routing.fence
        ),
        (
            RoutingState::Normal,
            SOURCE,
            Some(TARGET),
            Some(created.id),
            0
        )
    );
    let log = h.store.audit_log(created.id).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(log[0].event, AuditEvent::MigrationStarted);
    assert_eq!(log[0].to_phase, Some(MigrationPhase::Pending));
    assert_eq!(log[0].tenant_id, tenant);
    assert!(
        h.store
            .get_migration(Uuid::new_v4())
            .await
            .unwrap()
            .is_none()
    );
}

async fn a_tenant_has_at_most_one_active_migration(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let first = h
        .store
        .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap();
    let second = NewMigration::new(tenant, SOURCE, "elsewhere");
    let err = h.store.create_migration(&second).await.unwrap_err();
    match &err {
        Error::ActiveMigrationExists {
            tenant_id,
            migration_id,
        } => assert_eq!((*tenant_id, *migration_id), (tenant, Some(first.id))),
        other => panic!("expected ActiveMigrationExists, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "Tenant {tenant} already has an active migration: {}",
            first.id
        )
    );
    assert!(h.store.get_migration(second.id).await.unwrap().is_none());

    // Once the first one is over, the tenant may migrate again.
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    h.store
        .apply_transition(
            &Transition::new(
                &first,
                MigrationPhase::Aborted,
                AuditEvent::MigrationAborted,
            )
            .routing(RoutingChange::new(
                routing.state,
                RoutingState::Normal,
                SOURCE,
            )),
        )
        .await
        .unwrap();
    let again = h.store.create_migration(&second).await.unwrap();
    assert_eq!(h.store.list_active_migrations().await.unwrap(), [again]);
}

async fn phase_changes_are_compare_and_set_with_typed_errors(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let created = h
        .store
        .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap();
    let copying = h
        .store
        .apply_transition(&to_bulk_copy(&created))
        .await
        .unwrap();
    assert_eq!(copying.phase, MigrationPhase::BulkCopy);
    assert!(copying.bulk_copy_started_at.is_some());

    // Someone else already moved it: the change from `pending` is refused, naming both phases.
    let err = h
        .store
        .apply_transition(&to_bulk_copy(&created))
        .await
        .unwrap_err();
    match &err {
        Error::PhaseChanged {
            migration_id,
            expected,
            actual,
            to,
        } => assert_eq!(
            (*migration_id, *expected, *actual, *to),
            (
                created.id,
                MigrationPhase::Pending,
                MigrationPhase::BulkCopy,
                MigrationPhase::BulkCopy
            )
        ),
        other => panic!("expected PhaseChanged, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!(
            "Migration {} is in bulk_copy phase, not pending: pending -> bulk_copy was not applied",
            created.id
        )
    );

    // A migration that does not exist is not "changed".
    let mut missing = created.clone();
    missing.id = Uuid::new_v4();
    let err = h
        .store
        .apply_transition(&to_bulk_copy(&missing))
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::MigrationNotFound { migration_id } if migration_id == missing.id),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!("Migration not found: {}", missing.id)
    );

    // A transition the state machine forbids is refused before anything is read.
    let err = h
        .store
        .apply_transition(&Transition::new(
            &copying,
            MigrationPhase::Completed,
            AuditEvent::CutoverCompleted,
        ))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidPhaseTransition {
                from: MigrationPhase::BulkCopy,
                to: MigrationPhase::Completed,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Invalid phase transition: bulk_copy -> completed"
    );
    let err = h
        .store
        .apply_transition(
            &Transition::new(
                &copying,
                MigrationPhase::DualWrite,
                AuditEvent::PhaseChanged,
            )
            .routing(RoutingChange::new(
                RoutingState::BulkCopy,
                RoutingState::Migrated,
                TARGET,
            )),
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Invalid routing transition: bulk_copy -> migrated"
    );

    assert_eq!(
        h.audit(created.id).await,
        [AuditEvent::MigrationStarted, AuditEvent::PhaseChanged],
        "refused changes leave no trace"
    );
    assert_eq!(
        h.store
            .get_migration(created.id)
            .await
            .unwrap()
            .unwrap()
            .phase,
        MigrationPhase::BulkCopy
    );
}

async fn a_transition_is_all_or_nothing(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let created = h
        .store
        .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap();
    // The routing is not where the change expects it: neither phase nor audit change.
    let wrong_routing =
        Transition::new(&created, MigrationPhase::BulkCopy, AuditEvent::PhaseChanged)
            .routing(RoutingChange::new(
                RoutingState::BulkCopy,
                RoutingState::DualWrite,
                SOURCE,
            ))
            .error("must not be recorded");
    let err = h.store.apply_transition(&wrong_routing).await.unwrap_err();
    match &err {
        Error::RoutingStateChanged {
            tenant_id,
            expected,
            actual,
        } => assert_eq!(
            (*tenant_id, *expected, *actual),
            (tenant, RoutingState::BulkCopy, RoutingState::Normal)
        ),
        other => panic!("expected RoutingStateChanged, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!("Routing of tenant {tenant} is normal, not bulk_copy")
    );
    let stored = h.store.get_migration(created.id).await.unwrap().unwrap();
    assert_eq!(stored, created, "the migration row is untouched");
    assert_eq!(h.audit(created.id).await, [AuditEvent::MigrationStarted]);

    // A stale cutover attempt cannot finish or roll back another attempt's cutover.
    let tenant = Uuid::new_v4();
    let m = dual_writing(&*h.store, tenant, MigrationConfig::default()).await;
    let (mine, theirs) = (Uuid::new_v4(), Uuid::new_v4());
    let cut = h
        .store
        .apply_transition(
            &Transition::new(&m, MigrationPhase::Cutover, AuditEvent::CutoverInitiated)
                .attempt(None, Some(theirs))
                .routing(
                    RoutingChange::new(
                        RoutingState::DualWrite,
                        RoutingState::CutoverPaused,
                        SOURCE,
                    )
                    .target(Some(TARGET.to_owned()))
                    .owner(Some(m.id)),
                ),
        )
        .await
        .unwrap();
    assert_eq!(cut.cutover_attempt, Some(theirs));
    let err = h
        .store
        .apply_transition(
            &Transition::new(
                &cut,
                MigrationPhase::Completed,
                AuditEvent::CutoverCompleted,
            )
            .attempt(Some(mine), None)
            .routing(RoutingChange::new(
                RoutingState::CutoverPaused,
                RoutingState::Migrated,
                TARGET,
            )),
        )
        .await
        .unwrap_err();
    match &err {
        Error::StaleCutoverAttempt {
            expected, actual, ..
        } => assert_eq!((*expected, *actual), (mine, Some(theirs))),
        other => panic!("expected StaleCutoverAttempt, got {other:?}"),
    }
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(routing.state, RoutingState::CutoverPaused);
    assert_eq!(routing.store_id, SOURCE);
}

async fn progress_is_recorded_only_while_copying(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let created = h
        .store
        .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap();
    let err = h
        .store
        .record_progress(created.id, 5, Some(5), None)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::WrongPhase {
                phase: MigrationPhase::Pending,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "Cannot record copy progress: migration is in pending phase"
    );
    h.store
        .apply_transition(&to_bulk_copy(&created))
        .await
        .unwrap();
    h.store
        .record_progress(created.id, 0, None, Some(20))
        .await
        .unwrap();
    h.store
        .record_progress(created.id, 5, Some(105), None)
        .await
        .unwrap();
    let progressed = h
        .store
        .record_progress(created.id, 5, Some(110), None)
        .await
        .unwrap();
    assert_eq!(
        (
            progressed.events_copied,
            progressed.last_source_position,
            progressed.events_total
        ),
        (10, Some(110), Some(20))
    );
    assert_eq!(progressed.progress_percent(), Some(50.0));
    let err = h
        .store
        .record_progress(Uuid::new_v4(), 1, None, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MigrationNotFound { .. }), "{err:?}");
}

async fn pause_and_resume_are_logged(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let m = dual_writing(&*h.store, tenant, MigrationConfig::default()).await;
    let paused = h
        .store
        .set_paused(m.id, true, Some("maintenance window"))
        .await
        .unwrap();
    assert!(paused.is_paused && paused.paused_at.is_some());
    assert_eq!(paused.pause_reason.as_deref(), Some("maintenance window"));
    assert_eq!(paused.phase, MigrationPhase::DualWrite);
    let resumed = h.store.set_paused(m.id, false, None).await.unwrap();
    assert!(!resumed.is_paused);
    assert_eq!((resumed.paused_at, resumed.pause_reason), (None, None));
    let log = h.store.audit_log(m.id).await.unwrap();
    let tail: Vec<_> = log[3..]
        .iter()
        .map(|e| (e.event, e.message.clone()))
        .collect();
    assert_eq!(
        tail,
        [
            (
                AuditEvent::MigrationPaused,
                Some("maintenance window".to_owned())
            ),
            (AuditEvent::MigrationResumed, None)
        ]
    );
    let err = h
        .store
        .set_paused(Uuid::new_v4(), true, None)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::MigrationNotFound { .. }), "{err:?}");
}

async fn a_migration_starts_only_from_the_tenants_store(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    h.store.ensure_routing(tenant, "elsewhere").await.unwrap();
    // ensure_routing never changes an existing row.
    let routing = h.store.ensure_routing(tenant, SOURCE).await.unwrap();
    assert_eq!(
        (
            routing.store_id.as_str(),
            routing.state,
            routing.active_migration_id
        ),
        ("elsewhere", RoutingState::Normal, None)
    );
    let err = h
        .store
        .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("Tenant {tenant} is served by store 'elsewhere', not '{SOURCE}'")
    );
    assert!(h.store.list_active_migrations().await.unwrap().is_empty());
}

common::on_both_backends!(
    a_new_migration_is_pending_and_owns_its_tenants_routing,
    a_tenant_has_at_most_one_active_migration,
    phase_changes_are_compare_and_set_with_typed_errors,
    a_transition_is_all_or_nothing,
    progress_is_recorded_only_while_copying,
    pause_and_resume_are_logged,
    a_migration_starts_only_from_the_tenants_store,
);

#[tokio::test]
async fn postgres_schema_setup_is_idempotent_and_concurrent() {
    let schema = format!(
        "pglock_setup_{}",
        &Uuid::new_v4().simple().to_string()[..12]
    );
    let pool = common::pool_named(8, &common::app_name("schema-setup")).await;
    let store = PostgresMigrationStore::with_schema(pool, &schema).unwrap();
    let setups: Vec<_> = (0..4)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move { store.ensure_schema().await })
        })
        .collect();
    for setup in setups {
        setup.await.unwrap().expect("concurrent setups all succeed");
    }
    store.ensure_schema().await.expect("and again");
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 \
         ORDER BY table_name",
    )
    .bind(&schema)
    .fetch_all(store.pool())
    .await
    .unwrap();
    assert_eq!(
        tables,
        [
            "pglock_migration_audit_log",
            "pglock_tenant_migrations",
            "pglock_tenant_routing"
        ]
    );
}

/// The database itself, not the code, refuses a second active migration: two processes
/// creating one at once cannot both succeed.
#[tokio::test]
async fn postgres_concurrent_creations_for_one_tenant_exactly_one_succeeds() {
    let h = Harness::postgres().await;
    let tenant = Uuid::new_v4();
    let mut creations = Vec::new();
    for n in 0..4 {
        let process = h.process(&format!("creator-{n}")).await;
        creations.push(tokio::spawn(async move {
            process
                .store
                .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
                .await
        }));
    }
    let mut created = Vec::new();
    let mut refused = 0;
    for creation in creations {
        match creation.await.unwrap() {
            Ok(migration) => created.push(migration),
            Err(Error::ActiveMigrationExists { .. }) => refused += 1,
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    assert_eq!((created.len(), refused), (1, 3));
    assert_eq!(h.store.list_active_migrations().await.unwrap(), created);
}

/// Two processes racing the same phase change: exactly one wins, the other is told.
#[tokio::test]
async fn postgres_concurrent_phase_changes_exactly_one_succeeds() {
    let h = Harness::postgres().await;
    let tenant = Uuid::new_v4();
    let created = h
        .store
        .create_migration(&NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap();
    let mut changes = Vec::new();
    for n in 0..4 {
        let process = h.process(&format!("changer-{n}")).await;
        let transition = to_bulk_copy(&created);
        changes.push(tokio::spawn(async move {
            process.store.apply_transition(&transition).await
        }));
    }
    let mut won = 0;
    for change in changes {
        match change.await.unwrap() {
            Ok(_) => won += 1,
            Err(Error::PhaseChanged { actual, .. }) => {
                assert_eq!(actual, MigrationPhase::BulkCopy)
            }
            Err(other) => panic!("unexpected error {other:?}"),
        }
    }
    assert_eq!(won, 1);
    assert_eq!(
        h.audit(created.id).await,
        [AuditEvent::MigrationStarted, AuditEvent::PhaseChanged]
    );
}

#[tokio::test]
async fn postgres_schema_names_are_quoted_identifiers() {
    let pool = common::pool_named(2, &common::app_name("quoted")).await;
    let odd = format!(
        "Odd \"schema\"; DROP TABLE x; -- {}",
        &Uuid::new_v4().simple().to_string()[..6]
    );
    let store = PostgresMigrationStore::with_schema(pool.clone(), &odd).unwrap();
    store.ensure_schema().await.unwrap();
    let tenant = Uuid::new_v4();
    let created = pglock_migration::MigrationStore::create_migration(
        &store,
        &NewMigration::new(tenant, SOURCE, TARGET),
    )
    .await
    .unwrap();
    let schemas: Vec<String> =
        sqlx::query_scalar("SELECT nspname::text FROM pg_namespace WHERE nspname = $1")
            .bind(&odd)
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(schemas, [odd.as_str()], "the schema was created verbatim");
    assert_eq!(store.schema(), Some(odd.as_str()));
    assert_eq!(
        pglock_migration::MigrationRepository::get_migration(&store, created.id)
            .await
            .unwrap()
            .map(|m| m.tenant_id),
        Some(tenant)
    );

    for (name, reason) in [
        ("", "it is empty"),
        ("a\0b", "it contains a NUL character"),
        (&"x".repeat(64), "it is longer than PostgreSQL's 63 bytes"),
    ] {
        let err = PostgresMigrationStore::with_schema(pool.clone(), name).unwrap_err();
        match err {
            Error::InvalidIdentifier {
                name: got,
                reason: why,
            } => assert_eq!((got.as_str(), why), (name, reason)),
            other => panic!("expected InvalidIdentifier, got {other:?}"),
        }
    }
}
