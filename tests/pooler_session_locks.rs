//! What `PostgresLockManager`'s session locks do through a real PgBouncer, recorded as a user
//! sees it, next to the transaction locks that work in transaction mode
//! (`tests/pooler_xact_locks.rs`).
//!
//! In transaction mode PgBouncer hands a server connection to a client for one transaction
//! only; a statement in autocommit is a transaction of its own. A session lock is taken by one
//! statement and outlives it, so it would stay on whichever server connection ran that
//! statement, and that connection then serves the pooler's other clients. The manager's first
//! lock session proves, on a second connection of its own, that another session of the server
//! is refused a lock the first holds: through a transaction pooler the second connection's
//! statement runs on the very server connection the first one's did, and the manager refuses
//! with `Error::TransactionPooling` before it takes anything. (Should a statement move later
//! all the same, it takes nothing there: `tests/pooler_backend_check.rs`.)
//!
//! In session mode a client keeps its server connection, and everything works: locks, waits
//! woken by release notifications, the server check.

mod common;

use std::time::Duration;

use common::observer;
use common::pgbouncer::{self, backend_pid, holders};
use pglock::{Error, LockKey, PostgresLockManager};
use pglock_testing::PoolMode;

const SIGNAL: Duration = Duration::from_secs(30);

fn refused_as_pooling<T: std::fmt::Debug>(outcome: pglock::Result<T>, name: &str) {
    match outcome {
        Err(Error::TransactionPooling { key }) => assert_eq!(key, LockKey::from(name)),
        other => panic!("expected TransactionPooling for {name}, got {other:?}"),
    }
}

/// One server connection behind the pooler: the first lock of a manager, its try, its check
/// and a second manager's are all refused, and nothing is held anywhere; a client connected
/// to PostgreSQL directly takes the key.
#[tokio::test]
async fn session_locks_through_a_transaction_pooler_are_refused_before_anything_is_taken() {
    let bouncer = pgbouncer::start(PoolMode::Transaction, 1);
    let observer = observer().await;
    let pool = pgbouncer::pool(&bouncer, 4, &common::app_name("session-refused")).await;
    let locks = PostgresLockManager::new(pool);
    let name = common::key("session-refused");
    refused_as_pooling(locks.acquire(&name, Some(SIGNAL)).await, &name);
    refused_as_pooling(locks.try_acquire(&name).await, &name);
    let second = PostgresLockManager::new(
        pgbouncer::pool(&bouncer, 4, &common::app_name("session-second")).await,
    );
    refused_as_pooling(second.acquire(&name, Some(SIGNAL)).await, &name);
    assert!(matches!(
        second.check_server().await,
        Err(Error::TransactionPooling { .. })
    ));
    assert!(
        holders(&observer, &LockKey::from(name.as_str()))
            .await
            .is_empty(),
        "nothing was taken anywhere"
    );
    let direct = PostgresLockManager::new(common::pool(2).await);
    let guard = direct
        .try_acquire(&name)
        .await
        .expect("try")
        .into_handle()
        .expect("a direct client takes the key");
    guard.release().await.expect("release");
}

/// Two server connections, one of them busy with another client's transaction: the proof's
/// second session runs on the one left, where the first's ran, and is refused the same way.
#[tokio::test]
async fn a_server_connection_to_spare_does_not_hide_the_pooler() {
    let bouncer = pgbouncer::start(PoolMode::Transaction, 2);
    let pins = pgbouncer::pool(&bouncer, 1, "pins").await;
    let mut pin = pins.begin().await.expect("begin");
    let pinned = backend_pid(&mut pin).await;
    assert!(pinned > 0);
    let locks = PostgresLockManager::new(
        pgbouncer::pool(&bouncer, 4, &common::app_name("session-spare")).await,
    );
    let name = common::key("session-spare");
    refused_as_pooling(locks.acquire(&name, Some(SIGNAL)).await, &name);
    pin.commit().await.expect("commit");
}

/// In session mode the check passes (notifications included), a lock through the pooler
/// excludes a direct client, and a waiter through the pooler is woken by the release.
#[tokio::test]
async fn session_locks_through_a_session_pooler_work() {
    let bouncer = pgbouncer::start(PoolMode::Session, 8);
    let observer = observer().await;
    let through = |label: &str| {
        let app = common::app_name(label);
        let bouncer = &bouncer;
        async move { PostgresLockManager::new(pgbouncer::pool(bouncer, 3, &app).await) }
    };
    let locks = through("session-mode").await;
    let check = locks.check_server().await.expect("a session pooler passes");
    assert!(check.notifications, "{check:?}");

    let name = common::key("session-mode");
    let guard = locks.acquire(&name, Some(SIGNAL)).await.expect("acquire");
    assert_eq!(
        holders(&observer, &LockKey::from(name.as_str()))
            .await
            .len(),
        1
    );
    let direct = PostgresLockManager::new(common::pool(2).await);
    assert!(
        direct
            .try_acquire(&name)
            .await
            .expect("try")
            .into_handle()
            .is_none(),
        "a direct client is refused"
    );
    let waiter = through("session-waiter").await;
    let waiting = tokio::spawn({
        let name = name.clone();
        async move { waiter.acquire(&name, Some(SIGNAL)).await }
    });
    guard.release().await.expect("release");
    let granted = waiting.await.expect("join").expect("the waiter is granted");
    granted.release().await.expect("release");
}
