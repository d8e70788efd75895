//! The coordinator on both backends: starting, listing, pausing, aborting, a resumable bulk
//! copy that switches to dual writes, and the original's checks before a cutover.

mod common;

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use common::{Backend, Harness, Process, SOURCE, TARGET, TestLag, TestStores, coordinator};
use pglock_migration::Error;
use pglock_migration::{
    AuditEvent, BoxError, CopyBatch, CopyRequest, EventCopier, MigrationConfig,
    MigrationCoordinator, MigrationPhase, Readiness, RoutingState,
};
use uuid::Uuid;

/// An in-memory "source store" of `events` positions 1..=n, copied into a target list.
#[derive(Debug, Default)]
struct VecCopier {
    source: Mutex<Vec<i64>>,
    target: Mutex<Vec<i64>>,
    /// The `after_position` of every request, in order.
    requests: Mutex<Vec<Option<i64>>>,
    /// Fail the request with this index (0-based), once.
    fail_at: Mutex<Option<usize>>,
}

impl VecCopier {
    fn with_events(n: i64) -> Arc<VecCopier> {
        let copier = VecCopier::default();
        copier.source.lock().unwrap().extend(1..=n);
        Arc::new(copier)
    }
}

#[async_trait]
impl EventCopier for VecCopier {
    async fn copy_batch(&self, request: &CopyRequest<'_>) -> Result<CopyBatch, BoxError> {
        let call = {
            let mut requests = self.requests.lock().unwrap();
            requests.push(request.after_position);
            requests.len() - 1
        };
        if *self.fail_at.lock().unwrap() == Some(call) {
            *self.fail_at.lock().unwrap() = None;
            return Err("source store unreachable".into());
        }
        let after = request.after_position.unwrap_or(0);
        let batch: Vec<i64> = self
            .source
            .lock()
            .unwrap()
            .iter()
            .copied()
            .filter(|position| *position > after)
            .take(request.batch_size as usize)
            .collect();
        self.target.lock().unwrap().extend(&batch);
        Ok(CopyBatch::new(batch.len() as u64, batch.last().copied()))
    }

    async fn count_events(&self, _: Uuid, _: &str) -> Result<Option<u64>, BoxError> {
        Ok(Some(self.source.lock().unwrap().len() as u64))
    }
}

fn full_coordinator(p: &Process, copier: Arc<VecCopier>) -> MigrationCoordinator {
    MigrationCoordinator::builder(p.store.clone(), TestStores::new())
        .source_store_id(SOURCE)
        .copier(copier)
        .sync_lag(TestLag::fixed(Some(0)))
        .lock_manager(p.locks.clone())
        .build()
}

async fn starting_listing_and_status(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("start").await;
    let coordinator = full_coordinator(&p, VecCopier::with_events(0));
    let (first, second) = (Uuid::new_v4(), Uuid::new_v4());

    let err = coordinator
        .start_migration(first, "nope", MigrationConfig::default())
        .await
        .unwrap_err();
    assert!(matches!(&err, Error::UnknownStore { store_id } if store_id == "nope"));
    assert_eq!(err.to_string(), "Target store 'nope' is not registered");
    assert!(
        coordinator
            .migration_for_tenant(first)
            .await
            .unwrap()
            .is_none()
    );

    let a = coordinator
        .start_migration(first, TARGET, MigrationConfig::default())
        .await
        .unwrap();
    assert_eq!(
        (a.source_store_id.as_str(), a.target_store_id.as_str()),
        (SOURCE, TARGET),
        "a tenant without routing lives on the default store"
    );
    let b = coordinator
        .start_migration(second, TARGET, MigrationConfig::default())
        .await
        .unwrap();
    let err = coordinator
        .start_migration(first, TARGET, MigrationConfig::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::ActiveMigrationExists { .. }),
        "{err:?}"
    );

    let active: Vec<Uuid> = coordinator
        .list_active_migrations()
        .await
        .unwrap()
        .iter()
        .map(|m| m.id)
        .collect();
    assert_eq!(active, [a.id, b.id]);
    assert_eq!(
        coordinator
            .migration_for_tenant(first)
            .await
            .unwrap()
            .map(|m| m.id),
        Some(a.id)
    );
    let status = coordinator.status(a.id).await.unwrap();
    assert_eq!(status.migration, a);
    assert_eq!(status.progress_percent, None);
    let routing = status.routing.unwrap();
    assert_eq!(
        (routing.state, routing.active_migration_id),
        (RoutingState::Normal, Some(a.id))
    );
    let missing = Uuid::new_v4();
    let err = coordinator.status(missing).await.unwrap_err();
    assert_eq!(err.to_string(), format!("Migration not found: {missing}"));
}

async fn bulk_copy_resumes_after_a_failure_and_switches_to_dual_writes(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("copy").await;
    let copier = VecCopier::with_events(25);
    *copier.fail_at.lock().unwrap() = Some(1);
    let coordinator = full_coordinator(&p, copier.clone());
    let tenant = Uuid::new_v4();
    let m = coordinator
        .start_migration(tenant, TARGET, MigrationConfig::default().batch_size(10))
        .await
        .unwrap();

    let err = coordinator.run_bulk_copy(m.id).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "Bulk copy failed for migration {}: source store unreachable",
            m.id
        )
    );
    let stopped = coordinator.migration(m.id).await.unwrap();
    assert_eq!(stopped.phase, MigrationPhase::BulkCopy);
    assert_eq!(
        (
            stopped.events_copied,
            stopped.last_source_position,
            stopped.events_total
        ),
        (10, Some(10), Some(25))
    );
    assert_eq!(
        h.store.get_routing(tenant).await.unwrap().unwrap().state,
        RoutingState::BulkCopy
    );

    let copied = coordinator.run_bulk_copy(m.id).await.unwrap();
    assert_eq!(copied.phase, MigrationPhase::DualWrite);
    assert_eq!(
        (copied.events_copied, copied.last_source_position),
        (25, Some(25))
    );
    assert_eq!(copied.progress_percent(), Some(100.0));
    assert!(copied.dual_write_started_at.is_some());
    assert_eq!(
        *copier.requests.lock().unwrap(),
        // first run: a batch, then the failure; second run: resumes after 10, copies to the
        // short batch, then asks once more with the writers held back.
        [None, Some(10), Some(10), Some(20), Some(25)]
    );
    assert_eq!(*copier.target.lock().unwrap(), (1..=25).collect::<Vec<_>>());
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (
            routing.state,
            routing.store_id.as_str(),
            routing.target_store_id.as_deref()
        ),
        (RoutingState::DualWrite, SOURCE, Some(TARGET))
    );
    assert_eq!(
        h.audit(m.id).await,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged
        ]
    );
    let err = coordinator.run_bulk_copy(m.id).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot run bulk copy: migration is in dual_write phase"
    );
}

async fn a_paused_bulk_copy_stops_and_resumes(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("pause").await;
    let copier = VecCopier::with_events(5);
    let coordinator = full_coordinator(&p, copier.clone());
    let m = coordinator
        .start_migration(Uuid::new_v4(), TARGET, MigrationConfig::default())
        .await
        .unwrap();
    let paused = coordinator
        .pause_migration(m.id, Some("operator said so"))
        .await
        .unwrap();
    assert!(paused.is_paused);

    let stopped = coordinator.run_bulk_copy(m.id).await.unwrap();
    assert_eq!(
        (stopped.phase, stopped.is_paused),
        (MigrationPhase::BulkCopy, true)
    );
    assert!(
        copier.requests.lock().unwrap().is_empty(),
        "nothing copied while paused"
    );

    coordinator.resume_migration(m.id).await.unwrap();
    let copied = coordinator.run_bulk_copy(m.id).await.unwrap();
    assert_eq!(copied.phase, MigrationPhase::DualWrite);
    assert_eq!(copied.events_copied, 5);
    assert_eq!(
        h.audit(m.id).await,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::MigrationPaused,
            AuditEvent::PhaseChanged,
            AuditEvent::MigrationResumed,
            AuditEvent::PhaseChanged
        ]
    );
}

async fn abort_and_fail_put_the_tenant_back_on_its_source(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("abort").await;
    let coordinator = full_coordinator(&p, VecCopier::with_events(3));
    let tenant = Uuid::new_v4();
    let m = coordinator
        .start_migration(tenant, TARGET, MigrationConfig::default())
        .await
        .unwrap();
    coordinator.run_bulk_copy(m.id).await.unwrap();

    let aborted = coordinator
        .abort_migration(m.id, "wrong target")
        .await
        .unwrap();
    assert_eq!(aborted.phase, MigrationPhase::Aborted);
    assert!(aborted.finished_at.is_some());
    assert_eq!(aborted.error_count, 0);
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (
            routing.state,
            routing.store_id.as_str(),
            routing.target_store_id,
            routing.active_migration_id
        ),
        (RoutingState::Normal, SOURCE, None, None)
    );
    let log = h.store.audit_log(m.id).await.unwrap();
    let last = log.last().unwrap();
    assert_eq!(
        (
            last.event,
            last.from_phase,
            last.to_phase,
            last.message.as_deref()
        ),
        (
            AuditEvent::MigrationAborted,
            Some(MigrationPhase::DualWrite),
            Some(MigrationPhase::Aborted),
            Some("wrong target")
        )
    );
    let err = coordinator
        .abort_migration(m.id, "again")
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot abort migration: migration is in aborted phase"
    );
    assert!(
        coordinator
            .list_active_migrations()
            .await
            .unwrap()
            .is_empty()
    );

    // The tenant may migrate again; this time the migration fails.
    let again = coordinator
        .start_migration(tenant, TARGET, MigrationConfig::default())
        .await
        .unwrap();
    let failed = coordinator
        .fail_migration(again.id, "target full")
        .await
        .unwrap();
    assert_eq!(failed.phase, MigrationPhase::Failed);
    assert_eq!(
        (failed.error_count, failed.last_error.as_deref()),
        (1, Some("target full"))
    );
    assert_eq!(
        h.store.get_routing(tenant).await.unwrap().unwrap().state,
        RoutingState::Normal
    );
}

async fn trigger_cutover_checks_come_first_and_write_nothing(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("checks").await;
    let tenant = Uuid::new_v4();
    let with_everything = coordinator(&p, TestStores::new(), TestLag::fixed(Some(0)));

    let missing = Uuid::new_v4();
    let err = with_everything.trigger_cutover(missing).await.unwrap_err();
    assert!(matches!(err, Error::MigrationNotFound { migration_id } if migration_id == missing));

    let m = with_everything
        .start_migration(tenant, TARGET, MigrationConfig::default())
        .await
        .unwrap();
    let err = with_everything.trigger_cutover(m.id).await.unwrap_err();
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
        "Cannot trigger cutover: migration is in pending phase"
    );

    let m = {
        let abort = with_everything.abort_migration(m.id, "redo").await.unwrap();
        assert_eq!(abort.phase, MigrationPhase::Aborted);
        h.dual_writing(tenant, MigrationConfig::default()).await
    };
    let without_lag = MigrationCoordinator::builder(p.store.clone(), TestStores::new())
        .lock_manager(p.locks.clone())
        .build();
    let err = without_lag.trigger_cutover(m.id).await.unwrap_err();
    assert_eq!(err.to_string(), "No sync lag tracker found for migration");
    let err = without_lag.run_bulk_copy(m.id).await.unwrap_err();
    assert_eq!(err.to_string(), "No event copier found for migration");

    let without_locks = MigrationCoordinator::builder(p.store.clone(), TestStores::new())
        .sync_lag(TestLag::fixed(Some(0)))
        .build();
    let err = without_locks.trigger_cutover(m.id).await.unwrap_err();
    assert!(matches!(err, Error::LockManagerMissing));
    assert_eq!(
        err.to_string(),
        "Cannot perform cutover: lock_manager not provided to coordinator. Provide a lock \
         manager (e.g. PostgresLockManager) when creating the coordinator to enable cutover \
         operations."
    );
    assert!(matches!(
        without_locks.cutover_readiness(m.id).await,
        Err(Error::LockManagerMissing)
    ));
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.phase, stored.error_count),
        (MigrationPhase::DualWrite, 0)
    );
    assert_eq!(
        h.audit(m.id).await,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged
        ]
    );

    assert_eq!(
        with_everything.cutover_readiness(m.id).await.unwrap(),
        Readiness::Ready
    );
    let done = with_everything.trigger_cutover(m.id).await.unwrap();
    assert_eq!(done.migration_id, m.id);
    let err = with_everything.trigger_cutover(m.id).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        "Cannot trigger cutover: migration is in completed phase"
    );
}

common::on_both_backends!(
    starting_listing_and_status,
    bulk_copy_resumes_after_a_failure_and_switches_to_dual_writes,
    a_paused_bulk_copy_stops_and_resumes,
    abort_and_fail_put_the_tenant_back_on_its_source,
    trigger_cutover_checks_come_first_and_write_nothing,
);
