//! What the PostgreSQL manager does on a real server, seen from the server's own views.

mod common;

use common::hooked::BuildHooked;

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::child::ChildOutput;
use common::stages::StageCounts;
use common::{
    advisory_locks_of, app_name, assert_pool_clean, eventually, eventually_waiting, key, lock_rows,
    observer, pool_named, sessions_of,
};
use pglock::{Error, LockManager, PostgresLockManager, lock_id, split_lock_id};
use pglock_testing::Stage;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio::time::Instant;

async fn manager(app: &str, max: u32) -> PostgresLockManager {
    PostgresLockManager::builder(pool_named(max, app).await)
        .holder_id(app)
        .build()
}

#[tokio::test]
async fn two_managers_exclude_each_other() {
    let (a, b) = (
        manager(&app_name("a"), 2).await,
        manager(&app_name("b"), 2).await,
    );
    let key = key("exclusion");
    let guard = a.acquire(&key, None).await.expect("a takes the free key");
    assert!(
        b.try_acquire(&key)
            .await
            .expect("try")
            .into_guard()
            .is_none()
    );
    let err = b
        .acquire(&key, Some(Duration::from_millis(100)))
        .await
        .expect_err("a holds it");
    assert!(err.is_timeout(), "{err:?}");
    guard.release().await.expect("release");
    let guard = b
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("b takes it once a let go");
    assert_eq!(&*guard.info().holder_id, b.holder_id());
    guard.release().await.expect("release");
}

#[tokio::test]
async fn pg_locks_shows_one_exclusive_advisory_lock_on_an_idle_session() {
    let observer = observer().await;
    let app = app_name("pg-locks");
    let locks = manager(&app, 2).await;
    let key = key("pg-locks");
    let guard = locks.acquire(&key, None).await.expect("acquire");

    let rows = lock_rows(&observer, guard.info().lock_id).await;
    let (classid, objid) = split_lock_id(lock_id(&key));
    assert_eq!(rows.len(), 1, "{rows:?}");
    let row = &rows[0];
    assert_eq!(
        (row.classid, row.objid),
        (i64::from(classid), i64::from(objid))
    );
    assert_eq!(
        row.objsubid, 1,
        "single-bigint advisory locks have objsubid 1"
    );
    assert_eq!(row.mode, "ExclusiveLock");
    assert!(row.granted);

    // The holding session belongs to the manager's pool and sits idle in autocommit: not
    // `idle in transaction`, no snapshot holding back VACUUM.
    let sessions = sessions_of(&observer, &app).await;
    let holder = sessions
        .iter()
        .find(|s| s.pid == row.pid)
        .expect("the holder is a session of the manager's pool");
    assert_eq!(holder.state.as_deref(), Some("idle"), "{holder:?}");
    assert!(!holder.has_xmin, "a held lock must not pin backend_xmin");

    guard.release().await.expect("release");
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

#[tokio::test]
async fn a_blocking_acquire_waits_on_the_server_without_polling() {
    let observer = observer().await;
    let holder = manager(&app_name("holder"), 2).await;
    let waiter_app = app_name("waiter");
    let waiter = manager(&waiter_app, 2).await;
    let key = key("server-wait");
    let guard = holder.acquire(&key, None).await.expect("acquire");

    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.acquire(&key, Some(Duration::from_secs(30))).await }
    });
    eventually_waiting("the waiter is queued on the server", &observer, &key).await;
    let waiting_session = |sessions: Vec<common::SessionRow>| {
        sessions
            .into_iter()
            .find(|s| s.wait_event_type.as_deref() == Some("Lock"))
            .expect("the waiter's session is in a lock wait")
    };
    let first = waiting_session(sessions_of(&observer, &waiter_app).await);
    assert_eq!(first.wait_event.as_deref(), Some("advisory"));
    assert!(
        first
            .query
            .as_deref()
            .unwrap_or("")
            .contains("pg_advisory_lock")
    );
    // One statement waits the whole time: no retry loop re-issues it. Watch it until the
    // server says it has been running for half a second, several times any polling interval
    // a client would use (the Python original polls every 100 ms).
    let started = first.query_start.expect("the wait's statement has a start");
    let watched_for = chrono::TimeDelta::milliseconds(500);
    let mut samples = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let again = waiting_session(sessions_of(&observer, &waiter_app).await);
        assert_eq!(
            (again.pid, again.query_start),
            (first.pid, first.query_start),
            "the wait was re-issued"
        );
        samples += 1;
        let now: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&observer)
            .await
            .expect("the server's clock");
        if now - started >= watched_for {
            break;
        }
        assert!(Instant::now() < deadline, "the server's clock stood still");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(samples > 1, "watched more than once");

    guard.release().await.expect("release");
    let granted = waiting
        .await
        .expect("join")
        .expect("granted after the release");
    granted.release().await.expect("release");
}

#[tokio::test]
async fn waiters_are_served_in_arrival_order() {
    let observer = observer().await;
    let key = key("fifo");
    let holder = manager(&app_name("fifo-holder"), 2).await;
    let guard = holder.acquire(&key, None).await.expect("acquire");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (n, name) in ["first", "second", "third"].into_iter().enumerate() {
        let waiter = manager(&app_name(name), 2).await;
        let (task_key, tx) = (key.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            let guard = waiter.acquire(&task_key, None).await.expect("acquire");
            tx.send(name).expect("send");
            guard.release().await.expect("release");
        }));
        // Let each waiter queue on the server before the next one arrives.
        eventually(&format!("{} waiters queued", n + 1), || async {
            lock_rows(&observer, lock_id(&key))
                .await
                .iter()
                .filter(|r| !r.granted)
                .count()
                == n + 1
        })
        .await;
    }
    drop(tx);
    guard.release().await.expect("release");
    let mut order = Vec::new();
    let served = async {
        while let Some(name) = rx.recv().await {
            order.push(name);
        }
    };
    tokio::time::timeout(Duration::from_secs(30), served)
        .await
        .expect("every waiter is served once the holder lets go");
    assert_eq!(order, ["first", "second", "third"]);
    for task in tasks {
        task.await.expect("join");
    }
}

#[tokio::test]
async fn a_timed_out_wait_leaves_its_connection_clean_and_pooled() {
    let observer = observer().await;
    let holder = manager(&app_name("holder"), 2).await;
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
    // with every setting at its default.
    let mut conn = tokio::time::timeout(Duration::from_secs(5), pool.acquire())
        .await
        .expect("the wait's connection was returned")
        .expect("checkout");
    let (pid, lock_timeout, check_interval, name): (i32, String, String, String) = sqlx::query_as(
        "SELECT pg_backend_pid(), current_setting('lock_timeout'), \
             current_setting('client_connection_check_interval'), \
             current_setting('application_name')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("query");
    assert!(sessions.iter().any(|s| s.pid == pid), "{pid} {sessions:?}");
    assert_eq!(lock_timeout, "0");
    assert_eq!(check_interval, "0");
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
    let (lock_timeout, check_interval, name): (String, String, String) = sqlx::query_as(
        "SELECT current_setting('lock_timeout'), \
             current_setting('client_connection_check_interval'), \
             current_setting('application_name')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("query");
    assert_eq!(
        lock_timeout, "0",
        "the granted wait's lock_timeout outlived it"
    );
    assert_eq!(check_interval, "0");
    assert_eq!(name, app, "the manager's tag was taken off");
}

#[tokio::test]
async fn pool_exhaustion_is_a_typed_error_within_the_deadline() {
    // Two connections: the lock session's, and one the application keeps busy. A key held
    // elsewhere is waited for in the server's queue on a connection of its own (the manager's
    // cap of 2 leaves it one wait session), which the pool cannot give. The pool's own acquire
    // timeout bounds a checkout without a deadline of the caller's.
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(common::options(&app_name("exhausted")))
        .await
        .expect("connect");
    let locks = PostgresLockManager::new(pool.clone());
    // The lock session takes one connection; the lock on it costs nothing more.
    let first = locks
        .acquire(&key("on-the-lock-session"), None)
        .await
        .expect("acquire");
    let busy = pool.acquire().await.expect("the application's connection");
    let elsewhere = manager(&app_name("elsewhere"), 2).await;
    let other = key("needs-a-connection");
    let held = elsewhere.acquire(&other, None).await.expect("acquire");

    // With a deadline, the deadline is the only bound, and its passing while no connection
    // is free is a timeout like any other.
    let started = Instant::now();
    let err = locks
        .acquire(&other, Some(Duration::from_millis(200)))
        .await
        .expect_err("no connection is free");
    let elapsed = started.elapsed();
    match &err {
        Error::Timeout { key, timeout } => {
            assert_eq!(key, &other);
            assert_eq!(*timeout, Duration::from_millis(200));
        }
        other => panic!("expected Timeout, got {other:?}"),
    }
    assert!(
        elapsed >= Duration::from_millis(200) && elapsed < Duration::from_secs(2),
        "took {elapsed:?}"
    );

    // Without one, the pool's acquire timeout (300 ms) bounds the checkout: a typed error.
    let started = Instant::now();
    let err = locks
        .acquire(&other, None)
        .await
        .expect_err("no connection is free");
    let elapsed = started.elapsed();
    match &err {
        Error::PoolExhausted {
            key,
            max_connections,
            waited,
        } => {
            assert_eq!(key, &other);
            assert_eq!(*max_connections, 2);
            assert!(*waited >= Duration::from_millis(250), "{waited:?}");
        }
        other => panic!("expected PoolExhausted, got {other:?}"),
    }
    assert!(
        err.to_string().contains("connection pool exhausted"),
        "{err}"
    );
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");

    // try_acquire runs on the lock session: it never waits for the pool.
    assert!(
        locks
            .try_acquire(&other)
            .await
            .expect("try")
            .into_guard()
            .is_none()
    );
    drop(busy);
    held.release().await.expect("release");
    common::hold(&locks, &other).await;
    locks.release(&other).await.expect("release");
    first.release().await.expect("release");
}

/// With a pool of one connection (a cap of 1: no wait session, no listener), a wait needs no
/// connection of its own: it polls on the lock session, until its deadline or, with none,
/// until the holder lets go.
#[tokio::test]
async fn on_a_pool_of_one_a_wait_polls_on_the_lock_session() {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(common::options(&app_name("one-connection")))
        .await
        .expect("connect");
    let locks = PostgresLockManager::new(pool);
    let first = locks
        .acquire(&key("on-the-lock-session"), None)
        .await
        .expect("acquire");
    let elsewhere = manager(&app_name("elsewhere"), 2).await;
    let other = key("polled");
    let held = elsewhere.acquire(&other, None).await.expect("acquire");
    let err = locks
        .acquire(&other, Some(Duration::from_millis(200)))
        .await
        .expect_err("held elsewhere");
    assert!(err.is_timeout(), "{err:?}");
    let waiting = tokio::spawn({
        let (locks, other) = (locks.clone(), other.clone());
        async move { locks.acquire(&other, None).await }
    });
    common::eventually("the waiter has tried at least once", || async {
        locks.lock_session_count() == 1
    })
    .await;
    held.release().await.expect("release");
    let guard = common::within("the polled grant", waiting)
        .await
        .expect("task")
        .expect("granted once the holder let go");
    assert_eq!(
        locks.lock_session_count(),
        1,
        "no connection but the lock session"
    );
    guard.release().await.expect("release");
    first.release().await.expect("release");
}

#[tokio::test]
async fn without_a_lock_session_a_try_fails_typed_within_the_pools_acquire_timeout() {
    let app = app_name("no-session");
    // Without a deadline of the caller's, the pool's own acquire timeout bounds the checkout.
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_millis(300))
        .connect_with(common::options(&app))
        .await
        .expect("connect");
    let locks = common::manager_for(pool.clone(), &app).build();
    // The application holds the pool's only connection, so no lock session can be opened.
    let taken = pool.acquire().await.expect("checkout");
    for attempt in [None, Some(Duration::ZERO)] {
        let started = Instant::now();
        let err = match attempt {
            None => locks.try_acquire(&key("cold")).await.map(|_| ()),
            Some(zero) => locks.acquire(&key("cold"), Some(zero)).await.map(|_| ()),
        }
        .expect_err("no lock session can be had");
        assert!(matches!(err, Error::PoolExhausted { .. }), "{err:?}");
        let elapsed = started.elapsed();
        println!("no lock session: {attempt:?} failed after {elapsed:?}");
        assert!(
            elapsed < Duration::from_millis(300 + 150),
            "bounded by the pool's acquire timeout (300 ms): {elapsed:?}"
        );
    }
    // With a deadline, the deadline alone bounds it, and its passing is a timeout.
    let started = Instant::now();
    let err = locks
        .acquire(&key("cold"), Some(Duration::from_millis(500)))
        .await
        .expect_err("no lock session can be had");
    let elapsed = started.elapsed();
    println!("no lock session: a 500 ms deadline failed after {elapsed:?}");
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        elapsed >= Duration::from_millis(500) && elapsed < Duration::from_millis(500 + 150),
        "bounded by the deadline, not the pool's acquire timeout: {elapsed:?}"
    );
    drop(taken);
    common::hold(&locks, &key("warm")).await;
    assert_eq!(locks.release_all().await.expect("release all"), 1);
}

#[tokio::test]
async fn an_unreachable_server_is_a_typed_error_within_the_deadline() {
    // Nothing listens on a port we just freed.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_millis(400))
        .connect_lazy(&format!("postgres://postgres@127.0.0.1:{port}/postgres"))
        .expect("lazy pool");
    let locks = PostgresLockManager::new(pool);
    let key = key("unreachable");

    let started = Instant::now();
    let err = locks
        .acquire(&key, Some(Duration::from_millis(300)))
        .await
        .expect_err("nothing to connect to");
    let elapsed = started.elapsed();
    println!("unreachable server: failed after {elapsed:?}");
    // With a deadline, a connection that cannot be had yet is tried again until then: the
    // caller gets its timeout.
    assert!(err.is_timeout(), "{err:?}");
    assert!(
        elapsed < Duration::from_millis(300 + 150),
        "beyond its 300 ms deadline: {elapsed:?}"
    );

    let err = locks
        .try_acquire(&key)
        .await
        .expect_err("nothing to connect to");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert_eq!(err.key(), &key);
    let err = locks
        .acquire(&key, None)
        .await
        .expect_err("nothing to connect to");
    assert!(matches!(err, Error::Connection { .. }), "{err:?}");
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn a_refusing_server_is_a_typed_error_with_its_reason() {
    let options = common::options(&app_name("refused")).database("no_such_database_for_pglock");
    let pool = PgPoolOptions::new()
        .acquire_timeout(Duration::from_secs(5))
        .connect_lazy_with(options);
    let locks = PostgresLockManager::new(pool);
    let err = locks
        .acquire(&key("refused"), Some(Duration::from_secs(5)))
        .await
        .expect_err("the database does not exist");
    match &err {
        Error::Connection { reason, .. } => assert!(reason.contains("does not exist"), "{reason}"),
        other => panic!("expected Connection, got {other:?}"),
    }
}

#[tokio::test]
async fn keys_of_any_shape_work_and_hash_as_specified() {
    let observer = observer().await;
    let locks = manager(&app_name("keys"), 2).await;
    let suffix = uuid::Uuid::new_v4().to_string();
    let keys = [
        String::new() + &suffix,
        format!("{suffix}\0nul\0bytes"),
        format!("ключ-🔒-{suffix}-\u{FEFF}"),
        format!("{suffix}'; SELECT pg_advisory_unlock_all(); --"),
        format!("{suffix}{}", "x".repeat(1 << 20)),
    ];
    for key in &keys {
        let guard = locks
            .acquire(key, Some(Duration::from_secs(10)))
            .await
            .expect("acquire");
        assert_eq!(guard.info().key, *key);
        let rows = lock_rows(&observer, lock_id(key)).await;
        assert_eq!(rows.len(), 1, "exactly the derived lock is held");
        guard.release().await.expect("release");
    }
    // The empty key is a key too.
    let empty_guard = locks
        .acquire("", Some(Duration::from_secs(10)))
        .await
        .expect("acquire");
    assert_eq!(empty_guard.info().lock_id, 7183457195969485844);
    assert_eq!(lock_rows(&observer, 7183457195969485844).await.len(), 1);
    empty_guard.release().await.expect("release");
}

#[tokio::test]
async fn a_holder_id_of_any_content_is_kept_verbatim() {
    let holder_id = "worker'); DROP TABLE pg_class; --\n\u{1F512}";
    let locks = PostgresLockManager::builder(pool_named(2, &app_name("holder-id")).await)
        .holder_id(holder_id)
        .build();
    let key = key("holder-id");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    assert_eq!(&*guard.info().holder_id, holder_id);
    guard.release().await.expect("release");
}

// On one thread, so that a task seen at the turn queue's door has finished walking in (the
// turn is taken, or waited for, in the same poll) before this test runs again.
#[tokio::test(flavor = "current_thread")]
async fn in_process_contenders_share_one_session() {
    let observer = observer().await;
    let app = app_name("contenders");
    let stages = StageCounts::default();
    let locks =
        common::manager_for(pool_named(8, &app).await, &app).build_with_stage_hook(stages.hook());
    let key = key("contenders");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let mut waiters = Vec::new();
    for _ in 0..4 {
        let (locks, key) = (locks.clone(), key.clone());
        waiters.push(tokio::spawn(async move {
            let guard = locks.acquire(&key, Some(Duration::from_secs(30))).await?;
            guard.release().await
        }));
    }
    // The holder and the four waiters reached the turn queue; only the holder went on to the
    // server.
    stages.wait_for(Stage::Turn, &key, 5).await;
    assert_eq!(
        stages.count(Stage::Server, &key),
        1,
        "a waiter went to the server"
    );
    // The four local waiters queue in-process: one session holds, none waits on the server.
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert!(rows[0].granted);
    assert!(
        sessions_of(&observer, &app)
            .await
            .iter()
            .all(|s| s.wait_event_type.as_deref() != Some("Lock")),
        "no session of the manager waits on the server"
    );
    guard.release().await.expect("release");
    for waiter in waiters {
        tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("each waiter is served within its deadline")
            .expect("join")
            .expect("each waiter got its turn");
    }
    assert_pool_clean(&observer, &app).await;
}

#[tokio::test]
async fn a_failed_unlock_is_reported_and_its_connection_is_not_pooled() {
    let observer = observer().await;
    let app = app_name("dead-session");
    let locks = manager(&app, 2).await;
    let key = key("dead-session");
    common::hold(&locks, &key).await;
    let holder_pid = lock_rows(&observer, lock_id(&key)).await[0].pid;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(holder_pid)
        .fetch_one(&observer)
        .await
        .expect("terminate");
    assert!(terminated);

    let err = locks.release(&key).await.expect_err("the session is gone");
    assert!(matches!(err, Error::ReleaseFailed { .. }), "{err:?}");
    assert_eq!(
        locks.held_lock_count(),
        0,
        "the registry forgot the lock anyway"
    );
    // The dead connection did not go back to the pool: the next acquisition works.
    let guard = locks
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("a fresh session");
    guard.release().await.expect("release");
    assert!(
        sessions_of(&observer, &app)
            .await
            .iter()
            .all(|s| s.pid != holder_pid),
        "the terminated backend is not among the pool's sessions"
    );
}

#[tokio::test]
async fn dropping_the_manager_frees_its_locks() {
    let observer = observer().await;
    let app = app_name("dropped-manager");
    // The application keeps its pool: a connection that went back to it holding the lock would
    // keep the lock for as long as the pool lives.
    let pool = pool_named(2, &app).await;
    let locks = common::manager_for(pool.clone(), &app).build();
    let key = key("dropped-manager");
    common::hold(&locks, &key).await;
    drop(locks);
    assert_pool_clean(&observer, &app).await;
    let next = manager(&app_name("next"), 2).await;
    let guard = next
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("the dropped manager's lock was freed");
    guard.release().await.expect("release");
}

/// The holder process's role, passed on its command line (libtest takes it for a filter that
/// matches no test): an argument, unlike an environment variable, cannot leak into the test
/// run that spawns the holder and turn it into one.
const HOLDER_ROLE: &str = "pglock-test-holder-key=";

/// The key to hold, when this process is a holder process spawned by a test.
fn holder_role() -> Option<String> {
    std::env::args().find_map(|arg| arg.strip_prefix(HOLDER_ROLE).map(str::to_owned))
}

/// Runs this test binary again as a separate process holding `key`, and returns it once it
/// reports that it holds the lock.
fn spawn_holder_process(test_name: &str, key: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .arg(format!("{HOLDER_ROLE}{key}"))
        .env("DATABASE_URL", common::url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder process");
    ChildOutput::read(child.stdout.take().expect("stdout")).until("HELD");
    child
}

/// The holder process's side: take the lock, say so, then exit or wait to be killed, never
/// releasing.
async fn act_as_holder_process(key: &str) -> ! {
    let locks = PostgresLockManager::new(common::pool(2).await);
    // Bounded, so a holder that cannot get the lock exits (and its parent fails) instead of
    // leaving the parent waiting for ever.
    let guard = locks
        .acquire(key, Some(Duration::from_secs(10)))
        .await
        .expect("the holder process takes the lock");
    // The test harness may have printed "test name ... " on this line already.
    println!("HELD");
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read the parent's order");
    drop(std::hint::black_box(guard.leak()));
    // Exit without releasing: no destructor runs, the lock is left to the server.
    std::process::exit(0);
}

#[tokio::test]
async fn a_holder_process_that_exits_without_releasing_frees_the_lock() {
    if let Some(key) = holder_role() {
        act_as_holder_process(&key).await;
    }
    let key = key("holder-process-exit");
    let next = manager(&app_name("next"), 2).await;
    let mut child = spawn_holder_process(
        "a_holder_process_that_exits_without_releasing_frees_the_lock",
        &key,
    );
    assert!(
        next.try_acquire(&key)
            .await
            .expect("try")
            .into_guard()
            .is_none(),
        "the child holds it"
    );
    writeln!(child.stdin.take().expect("stdin"), "exit").expect("tell the child to exit");
    assert!(child.wait().expect("wait").success());
    let guard = next
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("the exited holder's lock was freed by the server");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_killed_holder_process_frees_the_lock() {
    if let Some(key) = holder_role() {
        act_as_holder_process(&key).await;
    }
    let key = key("holder-process-kill");
    let next = manager(&app_name("next"), 2).await;
    let mut child = spawn_holder_process("a_killed_holder_process_frees_the_lock", &key);
    assert!(
        next.try_acquire(&key)
            .await
            .expect("try")
            .into_guard()
            .is_none(),
        "the child holds it"
    );
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("wait");
    let guard = next
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("the killed holder's lock was freed by the server");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn clones_are_one_holder_and_separate_managers_are_two() {
    let pool = pool_named(4, &app_name("clones")).await;
    let one = Arc::new(PostgresLockManager::new(pool.clone()));
    let same = one.clone();
    let other = PostgresLockManager::new(pool);
    let key = key("clones");
    assert!(one.try_acquire(&key).await.expect("try").leak().is_some());
    assert!(same.is_held(&key).await, "a clone sees the same registry");
    assert!(
        !other.is_held(&key).await,
        "another manager is another holder"
    );
    assert!(
        other
            .try_acquire(&key)
            .await
            .expect("try")
            .into_guard()
            .is_none()
    );
    same.release(&key).await.expect("a clone may release it");
    assert_eq!(one.held_lock_count(), 0);
}

#[tokio::test]
async fn an_idle_lock_session_retires_though_its_heartbeats_keep_it_heard() {
    // Pings every 20 ms keep the idle session heard; they are not use, so it still goes back
    // to the pool after the idle timeout.
    let app = app_name("idle-heard");
    let pool = pool_named(1, &app).await;
    let locks = common::manager_for(pool.clone(), &app)
        .probe_interval(Duration::from_millis(20))
        .session_idle_timeout(Duration::from_millis(300))
        .build();
    let guard = locks
        .acquire(&key("idle-heard"), None)
        .await
        .expect("acquire");
    guard.release().await.expect("release");
    assert_eq!(locks.lock_session_count(), 1);
    let conn = tokio::time::timeout(Duration::from_secs(10), pool.acquire())
        .await
        .expect("the idle lock session was returned to the pool, heartbeats or not")
        .expect("checkout");
    drop(conn);
    assert_eq!(locks.lock_session_count(), 0);
}

#[tokio::test]
async fn an_idle_lock_session_goes_back_to_the_pool_clean() {
    let observer = observer().await;
    let app = app_name("idle-sessions");
    let pool = pool_named(1, &app).await;
    let locks = common::manager_for(pool.clone(), &app)
        .session_idle_timeout(Duration::from_millis(200))
        .build();
    // A lock loop runs on one lock session, whatever the number of keys.
    for i in 0..20 {
        let guard = locks
            .acquire(&key(&format!("idle-{i}")), None)
            .await
            .expect("acquire");
        guard.release().await.expect("release");
    }
    let sessions = sessions_of(&observer, &app).await;
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(locks.lock_session_count(), 1);
    // Once it has held nothing for the idle timeout, the session goes back to the pool, clean.
    let mut conn = tokio::time::timeout(Duration::from_secs(10), pool.acquire())
        .await
        .expect("the idle lock session was returned to the pool")
        .expect("checkout");
    let (pid, held, name): (i32, i64, String) = sqlx::query_as(
        "SELECT pg_backend_pid(), (SELECT count(*) FROM pg_locks \
         WHERE locktype = 'advisory' AND pid = pg_backend_pid()), \
         current_setting('application_name')",
    )
    .fetch_one(&mut *conn)
    .await
    .expect("query");
    assert_eq!(pid, sessions[0].pid, "the same connection");
    assert_eq!(held, 0, "it holds no advisory lock");
    assert_eq!(name, app, "the manager's tag was taken off");
    assert_eq!(locks.lock_session_count(), 0);
    drop(conn);
    // The manager opens a new one when it needs it.
    let guard = locks.acquire(&key("again"), None).await.expect("acquire");
    guard.release().await.expect("release");
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
    let holder = manager(&app_name("holder"), 2).await;
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
