//! Wait sessions: the pooled connections contended acquisitions wait on in the server's queue.
//! A wait that times out, or is granted and released, gives its connection back to the pool
//! with every setting restored; one whose unlock goes unconfirmed is closed instead of pooled;
//! one handed a pooled connection that died goes on on another; and a connection kept for the
//! next wait goes back to the pool after its ttl.

mod common;

use std::time::Duration;

use common::{
    advisory_locks_of, app_name, eventually, eventually_waiting, key, lock_rows, manager_named,
    observer, pool_named, sessions_of,
};
use pglock::{Error, PostgresLockManager, lock_id};
use sqlx::postgres::PgPoolOptions;

#[tokio::test]
async fn a_timed_out_wait_leaves_its_connection_clean_and_pooled() {
    let observer = observer().await;
    let holder = manager_named(&app_name("holder"), 2).await;
    let app = app_name("timeout-clean");
    // Two connections: the lock session's, and the one the contended acquisition waits on.
    let pool = pool_named(2, &app).await;
    // Keep no released wait session in the manager, so it goes straight back to the pool.
    let waiter = common::manager_for(pool.clone(), &app)
        .idle_sessions(0, Duration::ZERO)
        .build();
    let key = key("timeout-clean");
    let guard = holder.acquire(&key, None).await.expect("acquire");

    let err = waiter
        .acquire(&key, Some(Duration::from_millis(150)))
        .await
        .expect_err("held elsewhere");
    assert!(err.is_timeout(), "{err:?}");
    // The server reports the timeout before its view shows the session idle again.
    eventually("no transaction is left open", || async {
        sessions_of(&observer, &app)
            .await
            .iter()
            .all(|s| s.state.as_deref() == Some("idle"))
    })
    .await;
    let sessions = sessions_of(&observer, &app).await;
    assert_eq!(
        sessions.len(),
        2,
        "both connections are still open: {sessions:?}"
    );

    // The wait's connection went back to the pool (the lock session is still the manager's),
    // with every setting at its default. PostgreSQL 13 and older have no
    // `client_connection_check_interval` (NULL here): the manager sets it only where it exists.
    let check_default = common::pg14_or_later(&observer)
        .await
        .then(|| "0".to_owned());
    let mut conn = tokio::time::timeout(Duration::from_secs(5), pool.acquire())
        .await
        .expect("the wait's connection was returned")
        .expect("checkout");
    let (pid, lock_timeout, check_interval, name): (i32, String, Option<String>, String) =
        sqlx::query_as(
            "SELECT pg_backend_pid(), current_setting('lock_timeout'), \
             current_setting('client_connection_check_interval', true), \
             current_setting('application_name')",
        )
        .fetch_one(&mut *conn)
        .await
        .expect("query");
    assert!(sessions.iter().any(|s| s.pid == pid), "{pid} {sessions:?}");
    assert_eq!(lock_timeout, "0");
    assert_eq!(check_interval, check_default);
    assert_eq!(name, app, "the manager's tag was taken off");
    drop(conn);
    assert!(advisory_locks_of(&observer, &app).await.is_empty());

    // A wait that is granted (its message's implicit transaction commits, unlike a timed-out
    // one) and then released: its connection goes back with every setting at its default too.
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.acquire(&key, Some(Duration::from_secs(10))).await }
    });
    eventually_waiting("the waiter queues on the server", &observer, &key).await;
    guard.release().await.expect("release");
    let granted = tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("granted within its deadline")
        .expect("join")
        .expect("granted once released");
    granted.release().await.expect("release");
    let mut conn = tokio::time::timeout(Duration::from_secs(5), pool.acquire())
        .await
        .expect("the wait's connection was returned")
        .expect("checkout");
    let (lock_timeout, check_interval, name): (String, Option<String>, String) = sqlx::query_as(
        "SELECT current_setting('lock_timeout'), \
             current_setting('client_connection_check_interval', true), \
             current_setting('application_name')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("query");
    assert_eq!(
        lock_timeout, "0",
        "the granted wait's lock_timeout outlived it"
    );
    assert_eq!(check_interval, check_default);
    assert_eq!(name, app, "the manager's tag was taken off");
}

#[tokio::test]
async fn an_unconfirmed_unlock_closes_its_wait_session_instead_of_pooling_it() {
    let observer = observer().await;
    let proxy = common::proxy::Proxy::start().await;
    let app = app_name("unconfirmed-wait");
    let pool = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(proxy.options(&app))
        .await
        .expect("connect through the proxy");
    let locks = common::manager_for(pool.clone(), &app)
        .release_timeout(Duration::from_millis(200))
        .idle_sessions(0, Duration::ZERO)
        .detect_lost_locks(false)
        .build();
    // Held elsewhere first, so this manager waits for it, and holds it, on a session of its own.
    let key = key("unconfirmed-wait");
    let holder = manager_named(&app_name("holder"), 2).await;
    let held = holder.acquire(&key, None).await.expect("acquire");
    let waiting = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { locks.acquire(&key, Some(Duration::from_secs(10))).await }
    });
    eventually("the waiter queues on the server", || async {
        lock_rows(&observer, lock_id(&key)).await.len() == 2
    })
    .await;
    held.release().await.expect("release");
    let guard = waiting.await.expect("join").expect("granted");
    let pid = lock_rows(&observer, lock_id(&key)).await[0].pid;

    proxy.blackhole();
    let err = guard
        .release()
        .await
        .expect_err("no answer within the release timeout");
    assert!(
        matches!(
            &err,
            Error::ReleaseFailed {
                reason: pglock::ReleaseFailure::Timeout(_),
                ..
            }
        ),
        "{err:?}"
    );
    proxy.restore();
    // Closed, not pooled: its backend goes away, and no pooled connection is that backend.
    eventually("the wait session's backend ends", || async {
        sessions_of(&observer, &app)
            .await
            .iter()
            .all(|s| s.pid != pid)
    })
    .await;
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
    let mut conn = pool.acquire().await.expect("checkout");
    let pooled: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut *conn)
        .await
        .expect("query");
    assert_ne!(
        pooled, pid,
        "the connection of the unconfirmed unlock went back to the pool"
    );
}

#[tokio::test]
async fn a_wait_handed_a_pooled_connection_that_died_goes_on_another() {
    let observer = observer().await;
    let app = app_name("dead-pooled-wait");
    // No health check on checkout: the pool hands out a dead connection as it is, as it does
    // whenever a connection dies between its check and its use.
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .test_before_acquire(false)
        .connect_with(common::options(&app))
        .await
        .expect("connect");
    let locks = common::manager_for(pool.clone(), &app).build();
    // The lock session is open before the pooled connection dies, so only the wait meets it.
    let warm = locks
        .acquire(&key("dead-pooled-warm"), Some(Duration::from_secs(10)))
        .await
        .expect("acquire");
    warm.release().await.expect("release");
    let pid: i32 = {
        let mut conn = pool.acquire().await.expect("a pooled connection");
        sqlx::query_scalar("SELECT pg_backend_pid()")
            .fetch_one(&mut *conn)
            .await
            .expect("pid")
    };
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(&observer)
        .await
        .expect("terminate");
    assert!(terminated);
    eventually("the pooled connection's backend is gone", || async {
        sessions_of(&observer, &app)
            .await
            .iter()
            .all(|session| session.pid != pid)
    })
    .await;

    let guard = won_by_waiting(&locks, &observer, &key("dead-pooled-wait"))
        .await
        .expect("the wait that met a dead connection went on on another one");
    guard.release().await.expect("release");
}

/// Has `locks` take `key` the contended way: another manager holds it until `locks` waits for
/// it on the server, then lets it go.
async fn won_by_waiting(
    locks: &PostgresLockManager,
    observer: &sqlx::PgPool,
    key: &str,
) -> pglock::Result<pglock::LockGuard> {
    let holder = PostgresLockManager::new(pool_named(2, &app_name("contending-holder")).await);
    let held = holder
        .acquire(key, Some(Duration::from_secs(10)))
        .await
        .expect("acquire elsewhere");
    let waiting = tokio::spawn({
        let (locks, key) = (locks.clone(), key.to_owned());
        async move { locks.acquire(&key, Some(Duration::from_secs(20))).await }
    });
    eventually_waiting("the manager waits on the server", observer, key).await;
    held.release().await.expect("release");
    tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the wait ends")
        .expect("join")
}

#[tokio::test]
async fn a_kept_wait_connection_goes_back_to_the_pool_after_its_ttl() {
    // A wait's connection is kept for a moment after its release (the next contended wait
    // saves a checkout), then given back to the pool: never kept for good.
    let observer = observer().await;
    let app = app_name("kept-wait");
    let pool = pool_named(4, &app).await;
    let locks = common::manager_for(pool.clone(), &app)
        .idle_sessions(2, Duration::from_millis(100))
        .session_idle_timeout(Duration::from_secs(60))
        .build();
    let guard = won_by_waiting(&locks, &observer, &key("kept-wait"))
        .await
        .expect("granted");
    guard.release().await.expect("release");
    // Only the lock session stays checked out; the wait's connection is back in the pool.
    eventually("the kept wait connection is given back", || async {
        locks.lock_session_count() == 1 && pool.size() as usize - pool.num_idle() == 1
    })
    .await;
}
