//! What `PostgresLockManager`'s session locks do through a PgBouncer in transaction pooling
//! mode, recorded as a user sees it, next to the transaction locks that work there
//! (`tests/pooler_xact_locks.rs`).
//!
//! In transaction mode PgBouncer hands a server connection to a client for one transaction
//! only; a statement in autocommit is a transaction of its own. A session lock is taken by one
//! statement and outlives it, so it stays on whichever server connection ran that statement,
//! and that connection then serves the pooler's other clients:
//!
//! Every statement the manager sends on a session runs its lock function only on the server
//! session it set up (`CASE WHEN pg_backend_pid() = ...`), so:
//!
//! 1. A try that the pooler runs on another server connection takes nothing and fails with
//!    `Error::TransactionPooling`.
//! 2. An unlock that lands on another server connection fails with
//!    `ReleaseFailed { reason: TransactionPooling }`; the key stays locked on the pooled
//!    connection until PgBouncer closes it (by default after an hour).
//! 3. What the manager cannot see: a pooler that keeps giving it the server connection it set
//!    up (a pool of one, or a quiet one) grants the lock, and every other client of the pooler
//!    whose statement runs on that connection "holds" the key too (advisory locks are
//!    re-entrant per server session).
//! 4. A second manager through the same pooler finds the first one's prepared statements on
//!    the shared server connection (sqlx names them per client connection) and fails with
//!    `Error::TransactionPooling` too.
//!
//! Hence the rule in the guide: never point session locks at a transaction pooler.

mod common;

use std::time::Duration;

use common::pgbouncer::{self, backend_pid, holders};
use common::{eventually, observer};
use pglock::{Error, LockGuard, LockKey, PostgresLockManager, ReleaseFailure};
use pglock_testing::{PoolMode, TempPgBouncer};
use sqlx::{PgPool, Row};
use tokio::time::timeout;

const SIGNAL: Duration = Duration::from_secs(30);

async fn manager(bouncer: &TempPgBouncer, label: &str) -> PostgresLockManager {
    PostgresLockManager::new(pgbouncer::pool(bouncer, 4, &common::app_name(label)).await)
}

/// A session-lock acquisition that the pooler ran on the server connection the manager set up:
/// granted, although the lock sits on a pooled server connection (case 3 of the module's
/// documentation).
fn granted_on_the_set_up_connection(outcome: pglock::Result<LockGuard>) -> LockGuard {
    outcome.expect("on the server connection it set up, the manager cannot see the pooler")
}

/// A statement of another client of the pooler: which server process ran it, and whether it
/// got the advisory lock `id`.
async fn try_lock_as_another_client(pool: &PgPool, id: i64) -> (i32, bool) {
    let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_backend_pid(), pg_try_advisory_lock({id})"
    )))
    .fetch_one(pool)
    .await
    .expect("try as another client");
    (row.get(0), row.get(1))
}

/// One server connection behind the pooler: the lock lands on it, and another client whose
/// statement runs there gets the same key at the same time. A client connected to PostgreSQL
/// directly is refused, as it should be; the clients of the pooler are not.
#[tokio::test]
async fn the_lock_is_shared_with_every_client_of_its_server_connection() {
    let bouncer = pgbouncer::start(PoolMode::Transaction, 1);
    let observer = observer().await;
    let locks = manager(&bouncer, "session-shared").await;
    let name = common::key("session-shared");
    let key = LockKey::from(name.as_str());
    let guard = granted_on_the_set_up_connection(locks.acquire(&name, Some(SIGNAL)).await);

    let held = holders(&observer, &key).await;
    assert_eq!(held.len(), 1, "{held:?}");
    let server_connection = held[0].0;

    let other_client = pgbouncer::pool(&bouncer, 1, "another-client").await;
    let (ran_on, granted) = try_lock_as_another_client(&other_client, guard.info().lock_id).await;
    assert_eq!(
        ran_on, server_connection,
        "one server connection serves both"
    );
    assert!(
        granted,
        "another client of the pooler got the key the manager holds"
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "SELECT pg_advisory_unlock({})",
        guard.info().lock_id
    )))
    .execute(&other_client)
    .await
    .expect("the other client lets go of its share");

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
    guard
        .release()
        .await
        .expect("the unlock ran on the same server connection");
    assert!(holders(&observer, &key).await.is_empty());
}

/// Two server connections: the unlock runs on the one that does not hold the lock. `release`
/// reports it, and the key stays locked on the pooled connection after the call, excluding
/// every client not on it, until PgBouncer closes that connection.
#[tokio::test]
async fn the_unlock_can_land_on_another_server_connection_and_the_lock_stays() {
    let bouncer = pgbouncer::start(PoolMode::Transaction, 2);
    let observer = observer().await;
    let locks = manager(&bouncer, "session-unlock").await;
    let name = common::key("session-unlock");
    let key = LockKey::from(name.as_str());
    let guard = granted_on_the_set_up_connection(locks.acquire(&name, Some(SIGNAL)).await);
    let holding = holders(&observer, &key).await[0].0;

    // Two transactions of another client occupy both server connections; ending the one that
    // is not on the holding connection leaves the manager only the other to unlock on.
    let pins = pgbouncer::pool(&bouncer, 2, "pins").await;
    let mut first = pins.begin().await.expect("begin");
    let mut second = pins.begin().await.expect("begin");
    let first_pid = backend_pid(&mut first).await;
    let second_pid = backend_pid(&mut second).await;
    assert!(
        [first_pid, second_pid].contains(&holding),
        "the pins occupy both server connections"
    );
    let (pin, other) = if first_pid == holding {
        (first, second)
    } else {
        (second, first)
    };
    other.commit().await.expect("commit");

    let released = timeout(SIGNAL, guard.release())
        .await
        .expect("release answers");
    assert!(
        matches!(
            released,
            Err(Error::ReleaseFailed {
                reason: ReleaseFailure::TransactionPooling,
                ..
            })
        ),
        "{released:?}"
    );
    pin.commit().await.expect("commit");
    assert_eq!(
        holders(&observer, &key).await,
        vec![(holding, "ExclusiveLock".to_owned(), true)],
        "after the failed release, the lock is still held by the pooled server connection"
    );
    let direct = PostgresLockManager::new(common::pool(2).await);
    assert!(
        direct
            .try_acquire(&name)
            .await
            .expect("try")
            .into_handle()
            .is_none(),
        "and it excludes everyone else"
    );

    drop(bouncer);
    eventually(
        "the lock goes with PgBouncer's server connection",
        || async { holders(&observer, &key).await.is_empty() },
    )
    .await;
}

/// A try that the pooler runs on another server connection than the one the manager set up
/// takes nothing, and says why.
#[tokio::test]
async fn a_try_on_another_server_connection_takes_nothing_and_names_the_pooler() {
    let bouncer = pgbouncer::start(PoolMode::Transaction, 2);
    let observer = observer().await;
    let locks = manager(&bouncer, "session-detect").await;
    // Open the manager's lock session, and learn which server connection it set up on.
    let warm = common::key("session-detect-warm");
    let guard = granted_on_the_set_up_connection(locks.acquire(&warm, Some(SIGNAL)).await);
    let set_up = holders(&observer, &LockKey::from(warm.as_str())).await[0].0;
    guard
        .release()
        .await
        .expect("the unlock ran where the lock was");
    // Another client keeps that server connection busy, so the next try runs on the other.
    let pins = pgbouncer::pool(&bouncer, 2, "pins").await;
    let mut first = pins.begin().await.expect("begin");
    let mut second = pins.begin().await.expect("begin");
    let (first_pid, second_pid) = (
        backend_pid(&mut first).await,
        backend_pid(&mut second).await,
    );
    assert!(
        [first_pid, second_pid].contains(&set_up),
        "the pins occupy both server connections"
    );
    let (pin, other) = if first_pid == set_up {
        (first, second)
    } else {
        (second, first)
    };
    other.commit().await.expect("commit");

    let name = common::key("session-detect");
    let err = timeout(SIGNAL, locks.try_acquire(&name))
        .await
        .expect("the try answers")
        .expect_err("the pooler ran the try elsewhere");
    assert!(
        matches!(&err, Error::TransactionPooling { key } if key == &name),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("transaction-pooling proxy"),
        "{err}"
    );
    pin.commit().await.expect("commit");
    assert!(
        holders(&observer, &LockKey::from(name.as_str()))
            .await
            .is_empty(),
        "nothing was taken anywhere"
    );
}

/// A second manager through the same pooler, once the first holds a lock: its statements run
/// on the server connection the first one prepared its statements on, and are refused.
#[tokio::test]
async fn a_second_manager_through_the_pooler_fails_on_prepared_statements() {
    let bouncer = pgbouncer::start(PoolMode::Transaction, 1);
    let first = manager(&bouncer, "session-first").await;
    let second = manager(&bouncer, "session-second").await;
    let name = common::key("session-managers");
    let guard = granted_on_the_set_up_connection(first.acquire(&name, Some(SIGNAL)).await);

    let other = common::key("session-managers-other");
    let err = second
        .try_acquire(&other)
        .await
        .expect_err("the second manager's statements collide with the first's");
    assert!(
        matches!(&err, Error::TransactionPooling { key } if key == &other),
        "{err:?}"
    );
    drop(guard);
}
