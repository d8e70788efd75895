//! A cutover that cannot finish never leaves the tenant stuck in `cutover`: a dropped cutover
//! is rolled back by its drop guard before its locks are released, and one interrupted without
//! a chance to roll back (a crash) is repaired by the next cutover of the tenant.

mod common;

use std::time::Duration;

use common::{Backend, Harness, SOURCE, TARGET, TestLag, TestStores, within};
use pglock::LockManagerExt;
use pglock_migration::{
    AuditEvent, CutoverManager, MigrationConfig, MigrationPhase, NotReady, Readiness,
    RoutingChange, RoutingState, Transition, WriteGate,
};
use uuid::Uuid;

const EVENTUALLY: Option<Duration> = Some(Duration::from_secs(15));

/// Dropped after it entered `cutover` (parked in its lag check, holding the lock and the
/// gate): the rollback is written, then the locks are released.
async fn dropped_mid_cutover_is_rolled_back_before_the_lock_is_released(backend: Backend) {
    let h = Harness::new(backend).await;
    let (p, next) = (h.process("dropped").await, h.process("next").await);
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    let parked = lag.hold_next();
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    {
        let running = cutover.execute_cutover(m.id, &*lag);
        tokio::select! {
            biased;
            result = running => panic!("the lag check is parked, yet: {result:?}"),
            () = parked.reached() => {}
        }
    } // The cutover future is dropped here, in `cutover`, holding the lock and the gate.

    // The next process gets the lock only once the dropped cutover let it go, which it does
    // only after writing the rollback: no sleep, the lock is the signal.
    let lock = next
        .locks
        .acquire(&CutoverManager::lock_key(tenant), EVENTUALLY)
        .await
        .expect("the dropped cutover releases its lock");
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, MigrationPhase::DualWrite);
    assert_eq!(stored.cutover_attempt, None);
    assert_eq!(stored.error_count, 1);
    assert_eq!(
        stored.last_error.as_deref(),
        Some("Cutover failed: Cutover was cancelled before it finished")
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::DualWrite, SOURCE)
    );
    let log = h.store.audit_log(m.id).await.unwrap();
    let events: Vec<AuditEvent> = log.iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged,
            AuditEvent::CutoverInitiated,
            AuditEvent::CutoverRolledBack
        ]
    );
    assert_eq!(
        log[4].message.as_deref(),
        Some("Cutover was cancelled before it finished")
    );
    let gate = next
        .locks
        .acquire(&WriteGate::key(tenant), EVENTUALLY)
        .await
        .expect("the gate is open again");
    gate.release().await.unwrap();
    lock.release().await.unwrap();

    // And the tenant can be cut over.
    let result = cutover.execute_cutover(m.id, &*lag).await;
    assert!(result.is_ok(), "{result:?}");
}

/// Dropped before it entered `cutover`: there is nothing to undo, and nothing was written.
async fn dropped_before_entering_cutover_changes_nothing(backend: Backend) {
    let h = Harness::new(backend).await;
    let (p, next) = (h.process("dropped-early").await, h.process("next").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::builder(p.locks.clone(), p.store.clone(), TestStores::new())
        .lock_timeout(Duration::from_secs(30))
        .build();
    // Another process holds the cutover lock, so the cutover waits for it.
    let held = next
        .locks
        .acquire(&CutoverManager::lock_key(tenant), None)
        .await
        .unwrap();
    let outcome = tokio::time::timeout(
        Duration::from_millis(100),
        cutover.execute_cutover(m.id, &*lag),
    )
    .await;
    assert!(outcome.is_err(), "the lock is held, so the cutover waits");
    held.release().await.unwrap();

    assert_eq!(
        h.audit(m.id).await,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged
        ]
    );
    let lock = next
        .locks
        .acquire(&CutoverManager::lock_key(tenant), EVENTUALLY)
        .await
        .expect("the dropped wait left nothing held");
    lock.release().await.unwrap();
    assert_eq!(lag.calls(), 0);
}

/// A process that crashed in `cutover` could not roll back. The next cutover finds the
/// migration there while holding the lock (which proves its writer is gone), rolls the
/// interrupted attempt back, naming it, and carries on.
async fn an_interrupted_cutover_is_repaired_by_the_next_one(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("repairer").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    // What a process that crashed right after entering `cutover` leaves behind.
    let crashed = Uuid::new_v4();
    h.store
        .apply_transition(
            &Transition::new(&m, MigrationPhase::Cutover, AuditEvent::CutoverInitiated)
                .attempt(None, Some(crashed))
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
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());

    // Meanwhile writers inside the gate keep writing to both stores.
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(routing.state, RoutingState::CutoverPaused);
    assert_eq!(routing.write_stores(), [SOURCE, TARGET]);
    let readiness = cutover
        .validate_cutover_readiness(m.id, &*lag)
        .await
        .unwrap();
    assert_eq!(
        readiness,
        Readiness::NotReady(NotReady::WrongRoutingState(RoutingState::CutoverPaused))
    );
    assert_eq!(
        readiness.to_string(),
        "Invalid migration state: cutover_paused (expected DUAL_WRITE)"
    );

    let result = cutover.execute_cutover(m.id, &*lag).await;

    assert!(result.is_ok(), "{result:?}");
    let log = h.store.audit_log(m.id).await.unwrap();
    let events: Vec<AuditEvent> = log.iter().map(|e| e.event).collect();
    assert_eq!(
        events,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged,
            AuditEvent::CutoverInitiated,
            AuditEvent::CutoverRolledBack,
            AuditEvent::CutoverInitiated,
            AuditEvent::CutoverCompleted
        ]
    );
    let repairer = log[5].cutover_attempt.expect("the new attempt");
    assert_ne!(repairer, crashed);
    assert_eq!(log[4].cutover_attempt, Some(crashed));
    let reason = format!(
        "Cutover attempt {crashed} was interrupted before it finished; rolled back by attempt \
         {repairer}"
    );
    assert_eq!(log[4].message.as_deref(), Some(reason.as_str()));
    assert_eq!(log[6].cutover_attempt, Some(repairer));
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, MigrationPhase::Completed);
    assert_eq!(stored.error_count, 1);
    assert_eq!(stored.last_error, Some(format!("Cutover failed: {reason}")));
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::Migrated, TARGET)
    );
}

common::on_both_backends!(
    dropped_mid_cutover_is_rolled_back_before_the_lock_is_released,
    dropped_before_entering_cutover_changes_nothing,
    an_interrupted_cutover_is_repaired_by_the_next_one,
);

/// Dropped while it waits for in-flight writes to drain (PostgreSQL: a writer's transaction
/// holds the gate): nothing was written, the writer is unaffected, nothing is left held.
#[tokio::test]
async fn postgres_dropped_while_draining_writes_changes_nothing() {
    let h = Harness::new(Backend::Postgres).await;
    let (p, next) = (h.process("draining").await, h.process("next").await);
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    let cutover = CutoverManager::new(p.locks.clone(), p.store.clone(), TestStores::new());
    let writers = common::pool_named(2, &common::app_name("writer")).await;
    let mut write = writers.begin().await.unwrap();
    WriteGate::enter(&mut write, tenant).await.unwrap();

    let observer = common::observer().await;
    {
        let running = cutover.execute_cutover(m.id, &*lag);
        let gate_id = WriteGate::lock_id(tenant);
        let draining = common::eventually("the cutover waits for the gate", || async {
            common::lock_rows(&observer, gate_id)
                .await
                .iter()
                .any(|row| !row.granted && row.mode == "ExclusiveLock")
        });
        tokio::select! {
            biased;
            result = running => panic!("a write is in flight, yet: {result:?}"),
            () = draining => {}
        }
    } // Dropped while waiting on the server for the gate.

    common::eventually("the abandoned wait leaves the gate's queue", || async {
        common::lock_rows(&observer, WriteGate::lock_id(tenant))
            .await
            .iter()
            .all(|row| row.granted)
    })
    .await;
    write
        .commit()
        .await
        .expect("the writer commits as if nothing happened");
    assert_eq!(
        h.audit(m.id).await,
        [
            AuditEvent::MigrationStarted,
            AuditEvent::PhaseChanged,
            AuditEvent::PhaseChanged
        ]
    );
    for key in [CutoverManager::lock_key(tenant), WriteGate::key(tenant)] {
        let guard = next.locks.acquire(&key, EVENTUALLY).await.expect("free");
        guard.release().await.unwrap();
    }
    assert_eq!(lag.calls(), 0);
}

/// The lock manager declares the cutover lock lost while the cutover is inside its locked
/// section (parked in its lag check): the cutover stops there, rolls back, and reports why.
#[tokio::test]
async fn a_cutover_whose_lock_is_lost_stops_and_rolls_back() {
    use pglock_migration::CutoverFailure;
    use std::sync::Arc;

    let h = Harness::memory();
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    let parked = lag.hold_next();
    let locks = Arc::new(pglock::InMemoryLockManager::new());
    let cutover = CutoverManager::new(locks.clone(), h.store.clone(), TestStores::new());

    let running = cutover.execute_cutover(m.id, &*lag);
    tokio::pin!(running);
    tokio::select! {
        biased;
        result = &mut running => panic!("the lag check is parked, yet: {result:?}"),
        () = parked.reached() => {}
    }
    assert_eq!(
        h.store.get_migration(m.id).await.unwrap().unwrap().phase,
        MigrationPhase::Cutover,
        "the cutover is under way"
    );
    assert!(locks.simulate_loss(&CutoverManager::lock_key(tenant)).await);
    let result = within("the cutover", running).await;
    let failed = result.expect_err("the lock was lost");
    assert_eq!(failed.failure, CutoverFailure::LockLost);
    assert!(failed.rolled_back, "{failed:?}");
    assert!(failed.message.contains("lost"), "{failed:?}");
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, MigrationPhase::DualWrite);
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::DualWrite, SOURCE)
    );
    assert_eq!(
        locks.held_lock_count(),
        0,
        "the write gate was released too"
    );
}

/// The cutover lock is released through the manager (`release(key)`) while the cutover is
/// inside its locked section: the holder is told, as for a lost lock, and the cutover stops
/// there and rolls back.
#[tokio::test]
async fn a_cutover_whose_lock_is_released_through_the_manager_stops_and_rolls_back() {
    use pglock_migration::CutoverFailure;
    use std::sync::Arc;

    let h = Harness::memory();
    let tenant = Uuid::new_v4();
    let config = MigrationConfig::default().cutover_timeout(Duration::from_secs(30));
    let m = h.dual_writing(tenant, config).await;
    let lag = TestLag::fixed(Some(0));
    let parked = lag.hold_next();
    let locks = Arc::new(pglock::InMemoryLockManager::new());
    let cutover = CutoverManager::new(locks.clone(), h.store.clone(), TestStores::new());

    let running = cutover.execute_cutover(m.id, &*lag);
    tokio::pin!(running);
    tokio::select! {
        biased;
        result = &mut running => panic!("the lag check is parked, yet: {result:?}"),
        () = parked.reached() => {}
    }
    locks
        .release(CutoverManager::lock_key(tenant))
        .await
        .expect("the manager holds the cutover lock");
    let failed = within("the cutover", running)
        .await
        .expect_err("the lock was released under it");
    assert_eq!(failed.failure, CutoverFailure::LockLost);
    assert!(failed.rolled_back, "{failed:?}");
    assert_eq!(
        failed.message,
        "The cutover lock was lost: it was released through the manager by key"
    );
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, MigrationPhase::DualWrite);
    assert_eq!(
        locks.held_lock_count(),
        0,
        "the write gate was released too"
    );
}
