//! The cutover scenarios of the Python original (reference §7, C1 to C11), each with the
//! corrected outcome, against the in-memory store and lock managers and against PostgreSQL.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Backend, Harness, SOURCE, TARGET, TestLag, TestStores, coordinator, within};
use pglock::{LockManager, LockManagerExt};
use pglock_migration::{
    AuditEvent, CutoverError, CutoverFailure, CutoverManager, CutoverResult, MigrationConfig,
    MigrationPhase, NotReady, Readiness, RoutingChange, RoutingState, WriteGate,
};
use tokio::time::Instant;
use uuid::Uuid;

const SETUP: [AuditEvent; 3] = [
    AuditEvent::MigrationStarted,
    AuditEvent::PhaseChanged,
    AuditEvent::PhaseChanged,
];

fn with_setup(rest: &[AuditEvent]) -> Vec<AuditEvent> {
    SETUP.iter().chain(rest).copied().collect()
}

/// Asserts that neither the cutover lock nor the write gate is held by anyone.
async fn assert_locks_free(locks: &dyn LockManager, tenant: Uuid) {
    for key in [CutoverManager::lock_key(tenant), WriteGate::key(tenant)] {
        // Free, or this panics.
        common::hold(locks, &key).await;
        locks.release(&key).await.expect("release the probe");
    }
}

/// Asserts the tenant is in `dual_write` on its source, owned by `migration`.
async fn assert_dual_writing_on_source(h: &Harness, tenant: Uuid, migration: Uuid) {
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (
            routing.state,
            routing.store_id.as_str(),
            routing.target_store_id.as_deref(),
            routing.active_migration_id
        ),
        (
            RoutingState::DualWrite,
            SOURCE,
            Some(TARGET),
            Some(migration)
        )
    );
    let migration = h.store.get_migration(migration).await.unwrap().unwrap();
    assert_eq!(migration.phase, MigrationPhase::DualWrite);
    assert_eq!(migration.cutover_attempt, None);
}

/// Asserts the cutover failed as described, and returns its error.
fn assert_failed(
    result: &CutoverResult,
    failure: CutoverFailure,
    message: &str,
    rolled_back: bool,
) -> CutoverError {
    let failed = result.clone().expect_err("the cutover fails");
    assert_eq!(failed.failure, failure, "{failed:?}");
    assert_eq!(failed.message, message, "{failed:?}");
    assert_eq!(failed.to_string(), message, "displays as the message");
    assert_eq!(failed.rolled_back, rolled_back, "{failed:?}");
    failed
}

/// Checks a failed cutover that got as far as `cutover` and was rolled back.
async fn assert_rolled_back(h: &Harness, tenant: Uuid, migration: Uuid, message: &str) {
    assert_dual_writing_on_source(h, tenant, migration).await;
    let stored = h.store.get_migration(migration).await.unwrap().unwrap();
    assert_eq!(stored.error_count, 1);
    assert_eq!(
        stored.last_error.as_deref(),
        Some(format!("Cutover failed: {message}").as_str())
    );
    let log = h.store.audit_log(migration).await.unwrap();
    let events: Vec<AuditEvent> = log.iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        with_setup(&[AuditEvent::CutoverInitiated, AuditEvent::CutoverRolledBack])
    );
    let (initiated, rolled_back) = (&log[3], &log[4]);
    assert_eq!(
        (initiated.from_phase, initiated.to_phase),
        (
            Some(MigrationPhase::DualWrite),
            Some(MigrationPhase::Cutover)
        )
    );
    assert_eq!(
        (rolled_back.from_phase, rolled_back.to_phase),
        (
            Some(MigrationPhase::Cutover),
            Some(MigrationPhase::DualWrite)
        )
    );
    assert_eq!(rolled_back.message.as_deref(), Some(message));
    assert!(initiated.cutover_attempt.is_some());
    assert_eq!(rolled_back.cutover_attempt, initiated.cutover_attempt);
}

/// Checks a failed cutover that changed nothing at all.
async fn assert_unchanged(h: &Harness, tenant: Uuid, migration: Uuid) {
    assert_dual_writing_on_source(h, tenant, migration).await;
    let stored = h.store.get_migration(migration).await.unwrap().unwrap();
    assert_eq!((stored.error_count, stored.last_error), (0, None));
    assert_eq!(h.audit(migration).await, SETUP);
}

/// C1: the happy path switches the tenant to the target, completes the migration, logs it,
/// and leaves the lock and the write gate free.
async fn c1_happy_path(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c1").await;
    let tenant = Uuid::new_v4();
    let m = h
        .dual_writing(tenant, MigrationConfig::default().max_lag_events(5))
        .await;
    let lag = TestLag::fixed(Some(0));
    lag.script(&[Some(5), Some(2)]);
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    let result = cutover.execute_cutover(m.id, &*lag).await;

    let done = result.expect("the cutover switches");
    assert_eq!(done.migration_id, m.id);
    assert_eq!(done.events_synced, 3, "the lag fell from 5 to 2 meanwhile");
    assert_eq!(lag.calls(), 2);
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (
            routing.state,
            routing.store_id.as_str(),
            routing.target_store_id,
            routing.active_migration_id,
            routing.fence
        ),
        (
            RoutingState::Migrated,
            TARGET,
            None,
            None,
            // The routing row carries the cutover lock's fencing token: the in-memory manager
            // mints them (the first acquisition of this tenant's cutover key gets 1); the
            // PostgreSQL manager of this harness runs without fencing.
            match backend {
                Backend::Memory => 1,
                Backend::Postgres => 0,
            }
        )
    );
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, MigrationPhase::Completed);
    assert_eq!((stored.cutover_attempt, stored.error_count), (None, 0));
    assert!(stored.cutover_started_at.is_some() && stored.finished_at.is_some());
    let log = h.store.audit_log(m.id).await.unwrap();
    let events: Vec<AuditEvent> = log.iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        with_setup(&[AuditEvent::CutoverInitiated, AuditEvent::CutoverCompleted])
    );
    let completed = &log[4];
    assert_eq!(
        (completed.from_phase, completed.to_phase),
        (
            Some(MigrationPhase::Cutover),
            Some(MigrationPhase::Completed)
        )
    );
    assert_eq!(completed.events_synced, Some(3));
    assert!(completed.duration_ms.is_some_and(|ms| ms > 0.0));
    assert_eq!(completed.cutover_attempt, log[3].cutover_attempt);
    assert_eq!(completed.cutover_attempt, Some(done.attempt_id));
    assert_eq!(
        completed.fencing_token,
        match backend {
            Backend::Memory => Some(1),
            Backend::Postgres => None,
        },
        "the audit entry records the cutover lock's token, when the manager mints one"
    );
    assert_locks_free(&*p.locks, tenant).await;
}

/// C2: with the cutover lock held by another process, readiness says so and the cutover
/// returns the original's lock failure, with the real time it waited, changing nothing.
async fn c2_lock_held_elsewhere(backend: Backend) {
    let h = Harness::new(backend).await;
    let (p, other) = (h.process("c2").await, h.process("c2-holder").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());
    let held = other
        .locks
        .acquire(&CutoverManager::lock_key(tenant), None)
        .await
        .expect("the other process takes the lock");

    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(readiness, Readiness::NotReady(NotReady::LockHeld));
    assert_eq!(
        readiness.to_string(),
        "Cutover lock is already held by another process"
    );
    let started = Instant::now();
    let result = cutover.execute_cutover(m.id, &*lag).await;
    let waited = started.elapsed();

    let failed = assert_failed(
        &result,
        CutoverFailure::LockUnavailable,
        &format!(
            "Failed to acquire cutover lock: Failed to acquire lock 'cutover:{tenant}': \
             Timeout after 0.5s"
        ),
        false,
    );
    assert!(
        failed.duration >= Duration::from_millis(500) && failed.duration <= waited,
        "duration {:?} reports the real wait ({waited:?})",
        failed.duration
    );
    assert_eq!(failed.events_synced, 0);
    assert_eq!(lag.calls(), 1, "only the readiness check measured the lag");
    assert_unchanged(&h, tenant, m.id).await;

    held.release().await.unwrap();
    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(readiness, Readiness::Ready);
    assert_locks_free(&*p.locks, tenant).await;
}

/// C3: a lag above the maximum rolls the cutover back to `dual_write` on the source.
async fn c3_lag_too_high(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c3").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(5));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    let result = cutover.execute_cutover(m.id, &*lag).await;

    let message = "Sync lag too high for cutover: 5 events (max: 0)";
    assert_failed(&result, CutoverFailure::LagTooHigh, message, true);
    assert_eq!(lag.calls(), 1);
    assert_rolled_back(&h, tenant, m.id, message).await;
    assert_locks_free(&*p.locks, tenant).await;
    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(
        readiness,
        Readiness::NotReady(NotReady::LagTooHigh { events: 5, max: 0 })
    );
    assert_eq!(readiness.to_string(), "Sync lag too high: 5 events (max 0)");
}

/// C4: a lag that cannot be calculated rolls the cutover back.
async fn c4_lag_unavailable(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c4").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(None);
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    let result = cutover.execute_cutover(m.id, &*lag).await;

    let message = "Unable to calculate sync lag";
    assert_failed(&result, CutoverFailure::LagUnavailable, message, true);
    assert_rolled_back(&h, tenant, m.id, message).await;
    assert_locks_free(&*p.locks, tenant).await;
    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(readiness, Readiness::NotReady(NotReady::LagUnavailable));
    assert_eq!(readiness.to_string(), message);
}

/// C5: a lag source slower than the cutover's budget times the cutover out, rolled back.
async fn c5_slow_lag_times_out(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c5").await;
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_millis(100));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    lag.slow(Duration::from_millis(150));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    let result = cutover.execute_cutover(m.id, &*lag).await;

    let failed = result.expect_err("the budget runs out");
    assert!(failed.rolled_back, "{failed:?}");
    assert_eq!(failed.failure, CutoverFailure::Timeout);
    let message = failed.message.clone();
    let elapsed: f64 = message
        .strip_prefix("Cutover timeout exceeded: ")
        .and_then(|rest| rest.strip_suffix("ms (limit: 100.00ms)"))
        .unwrap_or_else(|| panic!("unexpected message {message:?}"))
        .parse()
        .expect("elapsed milliseconds");
    assert!(elapsed >= 150.0, "{message}");
    assert_eq!(
        lag.calls(),
        1,
        "the budget was checked right after the slow answer"
    );
    assert_rolled_back(&h, tenant, m.id, &message).await;
    assert_locks_free(&*p.locks, tenant).await;
}

/// C6b: a cutover of a tenant that is not dual-writing is refused under the lock, changing
/// nothing (the original succeeded from `bulk_copy`).
async fn c6b_wrong_state_is_refused_under_the_lock(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c6b").await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    // The migration is still copying.
    let tenant = Uuid::new_v4();
    let created = h
        .store
        .create_migration(&pglock_migration::NewMigration::new(tenant, SOURCE, TARGET))
        .await
        .unwrap();
    let copying = h
        .store
        .apply_transition(
            &pglock_migration::Transition::new(
                &created,
                MigrationPhase::BulkCopy,
                AuditEvent::PhaseChanged,
            )
            .routing(
                RoutingChange::new(RoutingState::Normal, RoutingState::BulkCopy, SOURCE)
                    .target(Some(TARGET.to_owned()))
                    .owner(Some(created.id)),
            ),
        )
        .await
        .unwrap();
    let result = cutover.execute_cutover(copying.id, &*lag).await;
    assert_failed(
        &result,
        CutoverFailure::WrongPhase,
        "Cannot perform cutover: migration is in bulk_copy phase (expected dual_write)",
        false,
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::BulkCopy, SOURCE)
    );
    assert_eq!(
        h.audit(copying.id).await,
        [AuditEvent::MigrationStarted, AuditEvent::PhaseChanged]
    );

    // The migration is dual-writing but its routing was moved back meanwhile.
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    h.store
        .switch_routing(
            tenant,
            &RoutingChange::new(RoutingState::DualWrite, RoutingState::Normal, SOURCE)
                .owner(Some(m.id)),
        )
        .await
        .unwrap();
    let result = cutover.execute_cutover(m.id, &*lag).await;
    assert_failed(
        &result,
        CutoverFailure::WrongRoutingState,
        "Invalid migration state: normal (expected DUAL_WRITE)",
        false,
    );
    assert_eq!(
        h.store.get_migration(m.id).await.unwrap().unwrap().phase,
        MigrationPhase::DualWrite
    );
    assert_eq!(h.audit(m.id).await, SETUP);
    assert_eq!(lag.calls(), 0, "refused before the lag was measured");
    assert_locks_free(&*p.locks, tenant).await;
}

/// C7: a target that fails its health check rolls the cutover back.
async fn c7_target_unhealthy(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c7").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let stores = TestStores::new();
    stores.set_unhealthy(TARGET, "connection refused");
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), stores);

    let result = cutover.execute_cutover(m.id, &*lag).await;

    let message = "Target store health check failed: connection refused";
    assert_failed(&result, CutoverFailure::TargetUnhealthy, message, true);
    assert_rolled_back(&h, tenant, m.id, message).await;
    assert_locks_free(&*p.locks, tenant).await;
}

/// C7b: an unregistered target is refused before anything is switched (the original routed
/// the tenant to it).
async fn c7b_unknown_target_is_refused(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("c7b").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::new(
        p.locks.clone(),
        p.store.clone(),
        TestStores::with(&[SOURCE]),
    );

    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(
        readiness,
        Readiness::NotReady(NotReady::UnknownTargetStore(TARGET.to_owned()))
    );
    assert_eq!(
        readiness.to_string(),
        format!("Target store '{TARGET}' is not registered")
    );
    let result = cutover.execute_cutover(m.id, &*lag).await;

    assert_failed(
        &result,
        CutoverFailure::UnknownTargetStore,
        &format!("Target store '{TARGET}' is not registered"),
        false,
    );
    assert_eq!(lag.calls(), 1, "only the readiness check measured the lag");
    assert_unchanged(&h, tenant, m.id).await;
    assert_locks_free(&*p.locks, tenant).await;
}

/// C9: through the coordinator, a lock held elsewhere leaves the migration exactly as it was
/// (the original moved it to `cutover` and back outside the lock and counted an error).
async fn c9_coordinator_with_the_lock_held_elsewhere(backend: Backend) {
    let h = Harness::new(backend).await;
    let (p, other) = (h.process("c9").await, h.process("c9-holder").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let coordinator = coordinator(&p, TestStores::new(), lag.clone());
    let held = other
        .locks
        .acquire(&CutoverManager::lock_key(tenant), None)
        .await
        .unwrap();

    let err = coordinator.trigger_cutover(m.id).await.unwrap_err();
    let result = Err(err.cutover_error().expect("the checks pass").clone());
    assert!(!err.is_refused() && err.lock_error().is_none(), "{err:?}");

    assert_failed(
        &result,
        CutoverFailure::LockUnavailable,
        &format!(
            "Failed to acquire cutover lock: Failed to acquire lock 'cutover:{tenant}': \
             Timeout after 0.5s"
        ),
        false,
    );
    assert_unchanged(&h, tenant, m.id).await;
    held.release().await.unwrap();
    coordinator
        .trigger_cutover(m.id)
        .await
        .expect("the lock is free now");
}

/// C11: two processes cut the same tenant over at once. The lock serialises them; the second
/// re-validates under the lock, finds the tenant migrated, and changes nothing (the original
/// ran the whole sequence again and reported success twice).
async fn c11_concurrent_cutovers_exactly_one_succeeds(backend: Backend) {
    let h = Harness::new(backend).await;
    let (a, b) = (h.process("c11-a").await, h.process("c11-b").await);
    let tenant = Uuid::new_v4();
    // A stays parked in its locked section while B starts and waits: a budget that outlasts
    // the test's own waits, however loaded the machine.
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let (lag_a, lag_b) = (TestLag::fixed(Some(0)), TestLag::fixed(Some(0)));
    let manager = |p: &common::Process| {
        Arc::new(
            CutoverManager::builder(p.locks.clone(), p.store.clone(), TestStores::new())
                .lock_timeout(Duration::from_secs(30))
                .build(),
        )
    };
    let (cutover_a, cutover_b) = (manager(&a), manager(&b));
    let parked = lag_a.hold_next();

    let first = tokio::spawn({
        let (cutover, lag) = (cutover_a.clone(), lag_a.clone());
        async move { cutover.execute_cutover(m.id, &*lag).await }
    });
    parked.reached().await; // A is inside the locked section, in `cutover`
    let second = tokio::spawn({
        let (cutover, lag) = (cutover_b.clone(), lag_b.clone());
        async move { cutover.execute_cutover(m.id, &*lag).await }
    });
    if backend == Backend::Postgres {
        let observer = common::observer().await;
        let lock_id = pglock::lock_id(&CutoverManager::lock_key(tenant));
        common::eventually("B waits for the cutover lock on the server", || async {
            common::lock_rows(&observer, lock_id)
                .await
                .iter()
                .any(|row| !row.granted)
        })
        .await;
    }
    parked.release();
    let first = within("the first cutover", first).await.unwrap();
    let second = within("the second cutover", second).await.unwrap();

    assert!(first.is_ok(), "{first:?}");
    assert_failed(
        &second,
        CutoverFailure::AlreadyMigrated,
        &format!(
            "Tenant {tenant} is already migrated to store '{TARGET}' (migration {} is completed)",
            m.id
        ),
        false,
    );
    assert_eq!(lag_b.calls(), 0, "B stopped at the re-validation");
    assert_eq!(
        h.audit(m.id).await,
        with_setup(&[AuditEvent::CutoverInitiated, AuditEvent::CutoverCompleted]),
        "one cutover, logged once"
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::Migrated, TARGET)
    );
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.phase, stored.error_count),
        (MigrationPhase::Completed, 0)
    );
    assert_locks_free(&*a.locks, tenant).await;
}

/// C11, with the loser's lock wait shorter than the winner's cutover: it gives up on the lock
/// and changes nothing either.
async fn c11_loser_times_out_on_the_lock(backend: Backend) {
    let h = Harness::new(backend).await;
    let (a, b) = (h.process("c11t-a").await, h.process("c11t-b").await);
    let tenant = Uuid::new_v4();
    // A stays parked in its locked section while B starts and waits: a budget that outlasts
    // the test's own waits, however loaded the machine.
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    let cutover_a = Arc::new(CutoverManager::new(
        a.locks.clone(),
        a.store.clone(),
        TestStores::new(),
    ));
    let cutover_b = CutoverManager::builder(b.locks.clone(), b.store.clone(), TestStores::new())
        .lock_timeout(Duration::from_millis(100))
        .build();
    let parked = lag.hold_next();
    let first = tokio::spawn({
        let (cutover, lag) = (cutover_a.clone(), lag.clone());
        async move { cutover.execute_cutover(m.id, &*lag).await }
    });
    parked.reached().await;

    let second = cutover_b.execute_cutover(m.id, &*lag).await;
    let failed = assert_failed(
        &second,
        CutoverFailure::LockUnavailable,
        &format!(
            "Failed to acquire cutover lock: Failed to acquire lock 'cutover:{tenant}': \
             Timeout after 0.1s"
        ),
        false,
    );
    assert!(failed.duration >= Duration::from_millis(100), "{failed:?}");
    parked.release();
    let first = within("the first cutover", first).await.unwrap();
    assert!(first.is_ok(), "{first:?}");
    assert_eq!(
        h.audit(m.id).await,
        with_setup(&[AuditEvent::CutoverInitiated, AuditEvent::CutoverCompleted])
    );
}

/// `duration_ms` is the whole call, lock wait included (the original reported 0.0 on a lock
/// failure and left the wait out of a success).
async fn duration_includes_the_lock_wait(backend: Backend) {
    let h = Harness::new(backend).await;
    let (p, other) = (h.process("wait").await, h.process("wait-holder").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::builder(p.locks.clone(), p.store.clone(), TestStores::new())
        .lock_timeout(Duration::from_secs(30))
        .build();
    let held = other
        .locks
        .acquire(&CutoverManager::lock_key(tenant), None)
        .await
        .unwrap();
    let hold_for = Duration::from_millis(300);
    let releaser = tokio::spawn(async move {
        // The other process works for 300 ms, then lets go: a duration, not a synchronisation.
        tokio::time::sleep(hold_for).await;
        held.release().await
    });
    let result = cutover.execute_cutover(m.id, &*lag).await;
    within("the release", releaser).await.unwrap().unwrap();
    let done = result.expect("the lock came free in time");
    assert!(done.duration_ms() >= 300.0, "{done:?}");
    assert!(!done.within_timeout());
}

common::on_both_backends!(
    c1_happy_path,
    c2_lock_held_elsewhere,
    c3_lag_too_high,
    c4_lag_unavailable,
    c5_slow_lag_times_out,
    c6b_wrong_state_is_refused_under_the_lock,
    c7_target_unhealthy,
    c7b_unknown_target_is_refused,
    c9_coordinator_with_the_lock_held_elsewhere,
    c11_concurrent_cutovers_exactly_one_succeeds,
    c11_loser_times_out_on_the_lock,
    duration_includes_the_lock_wait,
);

/// Readiness says the cutover lock is held when this process holds it too: through a guard it
/// keeps, and from inside its own critical section on the lock, where pglock refuses the
/// nested `try_acquire` instead of answering `None`.
#[tokio::test]
async fn readiness_sees_the_lock_held_by_this_process() {
    let h = Harness::memory();
    let p = h.process("self").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    let held = p
        .locks
        .acquire(CutoverManager::lock_key(tenant), None)
        .await
        .unwrap();
    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(readiness, Readiness::NotReady(NotReady::LockHeld));
    held.release().await.unwrap();

    let inside = p
        .locks
        .with_lock(CutoverManager::lock_key(tenant), None, |_| {
            cutover.validate_cutover_readiness(m.id, &*lag)
        })
        .await
        .expect("the lock is free")
        .expect("the checks run");
    assert_eq!(inside, Readiness::NotReady(NotReady::LockHeld));
    assert_eq!(
        cutover
            .validate_cutover_readiness(m.id, &*lag)
            .await
            .unwrap(),
        Readiness::Ready
    );
    assert_locks_free(&*p.locks, tenant).await;
}
