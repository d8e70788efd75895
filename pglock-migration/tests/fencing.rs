//! Fencing: the routing row remembers the newest fencing token that wrote it and refuses older
//! ones, so a cutover whose lock was lost cannot switch routing behind the new holder's back.
//! Lock managers do not mint tokens yet; `common::Fenced` plays that part.

mod common;

use std::sync::Arc;
use std::sync::atomic::AtomicI64;

use common::{Backend, Fenced, Harness, SOURCE, TARGET, TestLag, TestStores, within};
use pglock_migration::Error;
use pglock_migration::{
    AuditEvent, CutoverFailure, CutoverManager, MigrationConfig, MigrationPhase, RoutingChange,
    RoutingState, Transition,
};
use uuid::Uuid;

/// Repository level, explicit tokens: newer and equal tokens pass and set the fence, older ones
/// are refused and change nothing, no token means no check.
async fn the_routing_row_refuses_a_stale_token(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    assert_eq!(
        h.store.ensure_routing(tenant, SOURCE).await.unwrap().fence,
        0
    );
    let to_copy = |token| {
        RoutingChange::new(RoutingState::Normal, RoutingState::BulkCopy, SOURCE)
            .target(Some(TARGET.to_owned()))
            .fencing_token(token)
    };
    let to_normal = |token| {
        RoutingChange::new(RoutingState::BulkCopy, RoutingState::Normal, SOURCE)
            .fencing_token(token)
    };

    let routing = h
        .store
        .switch_routing(tenant, &to_copy(Some(5)))
        .await
        .unwrap();
    assert_eq!((routing.state, routing.fence), (RoutingState::BulkCopy, 5));

    let err = h
        .store
        .switch_routing(tenant, &to_normal(Some(3)))
        .await
        .unwrap_err();
    match &err {
        Error::FenceRejected {
            tenant_id,
            token,
            fence,
        } => assert_eq!((*tenant_id, *token, *fence), (tenant, 3, 5)),
        other => panic!("expected FenceRejected, got {other:?}"),
    }
    assert_eq!(
        err.to_string(),
        format!("Stale fencing token 3 for tenant {tenant}: its routing was written with token 5")
    );
    let unchanged = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (unchanged.state, unchanged.fence),
        (RoutingState::BulkCopy, 5)
    );

    // The same token is the same acquisition writing again.
    let routing = h
        .store
        .switch_routing(tenant, &to_normal(Some(5)))
        .await
        .unwrap();
    assert_eq!((routing.state, routing.fence), (RoutingState::Normal, 5));
    // No token: no check, and the fence stays.
    let routing = h
        .store
        .switch_routing(tenant, &to_copy(None))
        .await
        .unwrap();
    assert_eq!((routing.state, routing.fence), (RoutingState::BulkCopy, 5));
    let routing = h
        .store
        .switch_routing(tenant, &to_normal(Some(9)))
        .await
        .unwrap();
    assert_eq!(routing.fence, 9);

    // Unknown tenants are not "stale".
    let err = h
        .store
        .switch_routing(Uuid::new_v4(), &to_copy(Some(100)))
        .await
        .unwrap_err();
    assert!(matches!(err, Error::RoutingNotFound { .. }), "{err:?}");
}

/// A transition carrying a stale token is refused as a whole: the phase does not move either.
async fn a_stale_token_refuses_the_whole_transition(backend: Backend) {
    let h = Harness::new(backend).await;
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let enter = |token, attempt| {
        Transition::new(&m, MigrationPhase::Cutover, AuditEvent::CutoverInitiated)
            .attempt(None, Some(attempt))
            .routing(
                RoutingChange::new(RoutingState::DualWrite, RoutingState::CutoverPaused, SOURCE)
                    .target(Some(TARGET.to_owned()))
                    .owner(Some(m.id))
                    .fencing_token(token),
            )
    };
    // A newer holder wrote the routing row (and left it in dual_write).
    h.store
        .switch_routing(
            tenant,
            &RoutingChange::new(RoutingState::DualWrite, RoutingState::Normal, SOURCE)
                .fencing_token(Some(10)),
        )
        .await
        .unwrap();
    h.store
        .switch_routing(
            tenant,
            &RoutingChange::new(RoutingState::Normal, RoutingState::BulkCopy, SOURCE)
                .target(Some(TARGET.to_owned()))
                .owner(Some(m.id)),
        )
        .await
        .unwrap();
    h.store
        .switch_routing(
            tenant,
            &RoutingChange::new(RoutingState::BulkCopy, RoutingState::DualWrite, SOURCE)
                .target(Some(TARGET.to_owned()))
                .owner(Some(m.id)),
        )
        .await
        .unwrap();

    let err = h
        .store
        .apply_transition(&enter(Some(7), Uuid::new_v4()))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::FenceRejected {
                token: 7,
                fence: 10,
                ..
            }
        ),
        "{err:?}"
    );
    let stored = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(
        (stored.phase, stored.cutover_attempt),
        (MigrationPhase::DualWrite, None)
    );
    assert_eq!(
        h.audit(m.id).await.len(),
        3,
        "no audit entry for a refused change"
    );

    let entered = h
        .store
        .apply_transition(&enter(Some(11), Uuid::new_v4()))
        .await
        .unwrap();
    assert_eq!(entered.phase, MigrationPhase::Cutover);
    let log = h.store.audit_log(m.id).await.unwrap();
    assert_eq!(log.last().unwrap().fencing_token, Some(11));
}

/// With a lock manager that mints tokens, the cutover stamps its token on every routing write
/// and on its audit entries.
async fn the_cutover_carries_its_fencing_token(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("fenced").await;
    let tokens = Arc::new(AtomicI64::new(40));
    let locks = Arc::new(Fenced::new(p.locks.clone(), tokens));
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let cutover = CutoverManager::new(locks, p.store.clone(), TestStores::new());

    let result = cutover
        .execute_cutover(m.id, &*TestLag::fixed(Some(0)))
        .await;

    assert!(result.is_ok(), "{result:?}");
    // Token 41 is the cutover lock's, 42 the write gate's.
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!((routing.state, routing.fence), (RoutingState::Migrated, 41));
    let log = h.store.audit_log(m.id).await.unwrap();
    let stamped: Vec<_> = log[3..]
        .iter()
        .map(|e| (e.event, e.fencing_token))
        .collect();
    assert_eq!(
        stamped,
        [
            (AuditEvent::CutoverInitiated, Some(41)),
            (AuditEvent::CutoverCompleted, Some(41))
        ]
    );
}

/// A cutover whose lock was lost mid-way (here: a newer holder, token 100, rolled its attempt
/// back while it was parked) cannot complete: nothing it writes afterwards lands.
async fn a_cutover_that_lost_its_lock_cannot_switch(backend: Backend) {
    let h = Harness::new(backend).await;
    let p = h.process("stale").await;
    let locks = Arc::new(Fenced::new(p.locks.clone(), Arc::new(AtomicI64::new(0))));
    let tenant = Uuid::new_v4();
    let m = h.dual_writing(tenant, MigrationConfig::default()).await;
    let lag = TestLag::fixed(Some(0));
    let parked = lag.hold_next();
    let cutover = Arc::new(CutoverManager::new(
        locks,
        p.store.clone(),
        TestStores::new(),
    ));
    let running = tokio::spawn({
        let (cutover, lag) = (cutover.clone(), lag.clone());
        async move { cutover.execute_cutover(m.id, &*lag).await }
    });
    parked.reached().await;

    // What the new holder does on finding the stale attempt in `cutover`.
    let stale = h.store.get_migration(m.id).await.unwrap().unwrap();
    assert_eq!(stale.phase, MigrationPhase::Cutover);
    h.store
        .apply_transition(
            &Transition::new(
                &stale,
                MigrationPhase::DualWrite,
                AuditEvent::CutoverRolledBack,
            )
            .attempt(stale.cutover_attempt, None)
            .routing(
                RoutingChange::new(RoutingState::CutoverPaused, RoutingState::DualWrite, SOURCE)
                    .target(Some(TARGET.to_owned()))
                    .owner(Some(m.id))
                    .fencing_token(Some(100)),
            )
            .message("taken over"),
        )
        .await
        .unwrap();
    parked.release();
    let result = within("the cutover", running).await.unwrap();

    let failed = result.expect_err("its lock was taken over");
    assert_eq!(failed.failure, CutoverFailure::StateChanged);
    assert!(
        !failed.rolled_back,
        "there was nothing of its own left to roll back"
    );
    assert_eq!(
        failed.message,
        format!(
            "Failed to complete cutover: Migration {} is in dual_write phase, not cutover: \
             cutover -> completed was not applied",
            m.id
        )
    );
    let routing = h.store.get_routing(tenant).await.unwrap().unwrap();
    assert_eq!(
        (routing.state, routing.store_id.as_str(), routing.fence),
        (RoutingState::DualWrite, SOURCE, 100)
    );
    assert_eq!(
        h.audit(m.id).await[3..],
        [AuditEvent::CutoverInitiated, AuditEvent::CutoverRolledBack]
    );
}

common::on_both_backends!(
    the_routing_row_refuses_a_stale_token,
    a_stale_token_refuses_the_whole_transition,
    the_cutover_carries_its_fencing_token,
    a_cutover_that_lost_its_lock_cannot_switch,
);
