//! The cutover's rollback guard: from just before a cutover enters `cutover`, its lock and
//! write gate belong to a guard that rolls back unless disarmed. These scenarios make the
//! store fail at the moments where the outcome of a write is unknown.

mod common;

use std::time::Duration;

use common::{Backend, Fault, FlakyStore, Harness, SOURCE, TestLag, TestStores};
use pglock::LockManagerExt;
use pglock_migration::{
    AuditEvent, CutoverFailure, CutoverManager, MigrationConfig, MigrationPhase, RoutingState,
    WriteGate,
};
use uuid::Uuid;

const EVENTUALLY: Option<Duration> = Some(Duration::from_secs(15));

/// The last audit events of the migration, after the three of its setup.
async fn cutover_events(h: &Harness, migration: Uuid) -> Vec<AuditEvent> {
    h.audit(migration).await[3..].to_vec()
}

/// The rollback write fails with an unknown outcome: the guard stays armed, keeps the lock and
/// the gate, and a spawned retry writes the rollback before anyone else gets in.
async fn a_rollback_with_an_unknown_outcome_is_retried_before_the_locks_go(backend: Backend) {
    let h = Harness::new(backend).await;
    let (p, next) = (h.process("unknown").await, h.process("next").await);
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let store = FlakyStore::new(p.store.clone());
    store.fail_next(
        MigrationPhase::Cutover,
        MigrationPhase::DualWrite,
        Fault::Before,
    );
    let cutover = CutoverManager::new(p.locks.clone(), store, TestStores::new());

    let failed = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(5)))
        .await
        .expect_err("the lag is too high");

    assert_eq!(failed.failure, CutoverFailure::LagTooHigh);
    assert!(!failed.rolled_back, "the rollback's outcome was unknown");
    // The lock is the signal: the retry releases it only once the rollback is written.
    let lock = next
        .locks
        .acquire(&CutoverManager::lock_key(tenant), EVENTUALLY)
        .await
        .expect("the retry releases the lock");
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.phase, stored.cutover_attempt),
        (MigrationPhase::DualWrite, None),
        "rolled back before the lock was released"
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str()),
        (RoutingState::DualWrite, SOURCE)
    );
    let log = h.store.audit_log(m.id).await.unwrap();
    assert_eq!(
        log.last().map(|e| (e.event, e.message.as_deref())),
        Some((
            AuditEvent::CutoverRolledBack,
            Some("Sync lag too high for cutover: 5 events (max: 0)")
        )),
        "the retry records the failure that caused it"
    );
    let gate = next
        .locks
        .acquire(&WriteGate::key(tenant), EVENTUALLY)
        .await
        .expect("the gate is open again");
    gate.release().await.unwrap();
    lock.release().await.unwrap();
}

/// The transition into `cutover` commits but its answer is lost: the attempt may be in
/// `cutover`, so it rolls back, and reports that it did.
async fn an_entry_with_a_lost_answer_is_rolled_back(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("lost-entry").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let store = FlakyStore::new(p.store.clone());
    store.fail_next(
        MigrationPhase::DualWrite,
        MigrationPhase::Cutover,
        Fault::After,
    );
    let cutover = CutoverManager::new(p.locks.clone(), store, TestStores::new());

    let failed = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(0)))
        .await
        .expect_err("the entry failed");

    assert_eq!(failed.failure, CutoverFailure::Storage);
    assert!(failed.rolled_back, "{failed:?}");
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stored.phase, MigrationPhase::DualWrite);
    assert_eq!(
        cutover_events(&h, m.id).await,
        [AuditEvent::CutoverInitiated, AuditEvent::CutoverRolledBack]
    );
    assert_eq!(p.locks.held_lock_count(), 0);
}

/// The transition into `cutover` fails before it is applied: the rollback finds nothing of the
/// attempt's to undo, and nothing is written.
async fn an_entry_that_failed_before_applying_leaves_no_trace(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("failed-entry").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let store = FlakyStore::new(p.store.clone());
    store.fail_next(
        MigrationPhase::DualWrite,
        MigrationPhase::Cutover,
        Fault::Before,
    );
    let cutover = CutoverManager::new(p.locks.clone(), store, TestStores::new());

    let failed = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(0)))
        .await
        .expect_err("the entry failed");

    assert_eq!(failed.failure, CutoverFailure::Storage);
    assert!(!failed.rolled_back, "{failed:?}");
    assert!(cutover_events(&h, m.id).await.is_empty());
    assert_eq!(p.locks.held_lock_count(), 0);
}

/// The completion commits but its answer is lost: under the lock only this attempt can have
/// completed the migration, so finding it completed is success.
async fn a_completion_with_a_lost_answer_is_found_completed(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("lost-completion").await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let store = FlakyStore::new(p.store.clone());
    store.fail_next(
        MigrationPhase::Cutover,
        MigrationPhase::Completed,
        Fault::After,
    );
    let cutover = CutoverManager::new(p.locks.clone(), store, TestStores::new());

    let done = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(0)))
        .await
        .expect("the completion was written");

    assert_eq!(done.migration_id, m.id);
    assert_eq!(
        cutover_events(&h, m.id).await,
        [AuditEvent::CutoverInitiated, AuditEvent::CutoverCompleted]
    );
    assert_eq!(p.locks.held_lock_count(), 0);
}

common::on_both_backends!(
    a_rollback_with_an_unknown_outcome_is_retried_before_the_locks_go,
    an_entry_with_a_lost_answer_is_rolled_back,
    an_entry_that_failed_before_applying_leaves_no_trace,
    a_completion_with_a_lost_answer_is_found_completed,
);
