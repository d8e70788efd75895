//! Where a contended acquisition waits. Behind a holder elsewhere, in the server's queue: one
//! statement waits the whole time (no polling), and waiters are served in arrival order. Behind
//! another task of the same manager, in the manager's own queue, with nothing on the server.
//! On a pool of one connection, which leaves no connection to wait on, a wait polls on the lock
//! session. (What becomes of the connections waits run on: `tests/waits_sessions.rs`.)

mod common;

use common::hooked::BuildHooked;

use std::time::Duration;

use common::stages::StageCounts;
use common::{
    app_name, assert_pool_clean, eventually, eventually_waiting, key, lock_rows, manager_named,
    observer, pool_named, sessions_of,
};
use pglock::{PostgresLockManager, lock_id};
use pglock_testing::Stage;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio::time::Instant;

#[tokio::test]
async fn a_blocking_acquire_waits_on_the_server_without_polling() {
    let observer = observer().await;
    let holder = manager_named(&app_name("holder"), 2).await;
    let waiter_app = app_name("waiter");
    let waiter = manager_named(&waiter_app, 2).await;
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
    let holder = manager_named(&app_name("fifo-holder"), 2).await;
    let guard = holder.acquire(&key, None).await.expect("acquire");
    let (tx, mut rx) = mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for (n, name) in ["first", "second", "third"].into_iter().enumerate() {
        let waiter = manager_named(&app_name(name), 2).await;
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
    let elsewhere = manager_named(&app_name("elsewhere"), 2).await;
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

/// The doorbell's race, produced on purpose: a release that lands after a waiter's failed try
/// and before its waiters' flag is up sends no notification (nobody holds the flag), so the
/// waiter must be woken by the flag going up. The waiter's poll interval is far longer than
/// its deadline, so only that wake-up can grant it in time.
///
/// The listener's server process is stopped (`SIGSTOP`) to hold the flag back while the
/// waiter tries and the holder releases; hence a private server, whose processes the test may
/// signal.
#[tokio::test]
async fn a_release_between_a_failed_try_and_the_flag_is_heard_when_the_flag_goes_up() {
    use rustix::process::{Pid, Signal, kill_process};

    let server = pglock_testing::TempPostgres::start().unwrap_or_else(|err| {
        panic!(
            "this test stops a server process, so it needs a private server started from the \
             PostgreSQL server binaries (install them, or point PGLOCK_PG_BIN at them): {err}"
        )
    });
    let connect = |app: String| {
        let url = server.url();
        async move {
            let options: sqlx::postgres::PgConnectOptions = url.parse().expect("url");
            PgPoolOptions::new()
                .max_connections(4)
                .connect_with(options.application_name(&app))
                .await
                .expect("connect to the private server")
        }
    };
    let observer = connect("observer".into()).await;
    let holder = PostgresLockManager::builder(connect("holder".into()).await).build();
    // One lock session, one wait session, the listener; no poll before the deadline.
    let waiter = PostgresLockManager::builder(connect("waiter".into()).await)
        .application_name_prefix(Some("race"))
        .max_connections(3)
        .lock_sessions(1)
        .wait_poll_interval(Duration::from_secs(600))
        .detect_lost_locks(false)
        // The listener's statements wait for as long as the test keeps it stopped.
        .release_timeout(Duration::from_secs(120))
        .build();
    let (in_queue, flagged, raced) = ("race:in-queue", "race:flagged", "race:raced");
    let mut guards =
        futures::future::try_join_all([in_queue, flagged, raced].map(|k| holder.acquire(k, None)))
            .await
            .expect("the holder takes the three keys");

    // The waiter's wait session waits for one key, so the next wait rings the doorbell and
    // brings the listener up, with that key's flag raised.
    let spawn_wait = |key: &'static str, secs: u64| {
        let waiter = waiter.clone();
        tokio::spawn(async move { waiter.acquire(key, Some(Duration::from_secs(secs))).await })
    };
    let _queued = spawn_wait(in_queue, 120);
    eventually_waiting("a wait fills the wait session", &observer, in_queue).await;
    let _flagged = spawn_wait(flagged, 120);
    let listener: i32 = {
        let flag_holder = || async {
            sqlx::query_scalar::<_, i32>(
                "SELECT l.pid FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
                 WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ShareLock' \
                 AND a.application_name LIKE 'race%'",
            )
            .fetch_optional(&observer)
            .await
            .expect("pg_locks")
        };
        eventually("the listener holds a flag", || async {
            flag_holder().await.is_some()
        })
        .await;
        flag_holder().await.expect("the listener")
    };

    // Freeze the listener's server process, then wait: the waiter's flag cannot go up.
    let stopped = Pid::from_raw(listener).expect("a pid");
    kill_process(stopped, Signal::STOP).expect("SIGSTOP the listener's server process");
    let since: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT pg_catalog.now()")
        .fetch_one(&observer)
        .await
        .expect("now");
    let racing = spawn_wait(raced, 20);
    eventually("the waiter's try has failed", || async {
        sqlx::query_scalar::<_, bool>(
            "SELECT pg_catalog.count(*) > 0 FROM pg_stat_activity WHERE application_name \
             LIKE 'race%' AND pid <> $1 AND state = 'idle' AND query_start > $2 \
             AND query LIKE '%pg_try_advisory_lock%'",
        )
        .bind(listener)
        .bind(since)
        .fetch_one(&observer)
        .await
        .expect("pg_stat_activity")
    })
    .await;
    // Released with nobody's flag up: no notification.
    guards
        .pop()
        .expect("raced")
        .release()
        .await
        .expect("release");
    kill_process(stopped, Signal::CONT).expect("SIGCONT the listener's server process");

    let granted = racing.await.expect("the waiting task");
    let guard = granted.expect("woken by the flag going up, long before its poll");
    assert!(waiter.is_held(raced).await);
    guard.release().await.expect("release");
}
