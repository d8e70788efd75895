//! Many locks per session: what a manager's lock sessions promise.
//!
//! * thousands of held keys cost a handful of connections, on a stock server and sqlx's
//!   default pool (with the manager's lock budget raised on purpose to hold them);
//! * a statement on a shared session is never abandoned half-way by a cancelled caller: a try
//!   or a release dropped while its statement is in flight completes on the session's task,
//!   and the other locks on the session are never touched;
//! * when a lock session closes, exactly its locks are declared lost;
//! * a lock session that holds nothing goes back to the pool, clean, after its idle timeout,
//!   heartbeats or not; one whose unlock failed is not pooled.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use common::proxy::Proxy;
use common::{
    app_name, eventually, key, lock_rows, manager_named, observer, pool_named, sessions_of,
};
use pglock::{Error, FencingTable, LockGuard, PostgresLockManager, lock_id};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const BOUND: Duration = Duration::from_secs(10);

/// The advisory locks held by sessions tagged for holder `app`, as (pid, lock id).
async fn locks_by_pid(observer: &PgPool, app: &str) -> Vec<(i32, i64)> {
    sqlx::query_as(
        "SELECT l.pid, ((l.classid::int8 << 32) | l.objid::int8) FROM pg_locks l \
         JOIN pg_stat_activity a USING (pid) WHERE l.locktype = 'advisory' AND l.granted \
         AND a.application_name = left('pglock:' || $1, 63)",
    )
    .bind(app)
    .fetch_all(observer)
    .await
    .expect("query pg_locks")
}

/// How many server sessions carry holder `app`'s tag.
async fn tagged_sessions(observer: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name = left('pglock:' || $1, 63)",
    )
    .bind(app)
    .fetch_one(observer)
    .await
    .expect("query pg_stat_activity")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_keys_are_held_at_once_on_the_default_pool_of_a_stock_server() {
    const KEYS: usize = 10_000;
    const TASKS: usize = 16;
    let server = common::stock_server().await;
    let observer = PgPoolOptions::new()
        .max_connections(1)
        .connect(&server.url())
        .await
        .expect("connect");
    let max_connections: String = sqlx::query_scalar("SHOW max_connections")
        .fetch_one(&observer)
        .await
        .expect("show");
    assert_eq!(max_connections, "100");
    let app = app_name("ten-thousand");
    let options: PgConnectOptions = server.url().parse().expect("url");
    // sqlx's defaults: at most 10 connections.
    let pool = PgPoolOptions::new()
        .connect_with(options.application_name(&app))
        .await
        .expect("connect");
    // The default budget (max_locks_per_transaction x the pool's connections: 640 here) keeps
    // a manager within its share of the server's lock table; holding 10,000 keys takes a
    // budget raised on purpose. The connections they cost are what this test is about.
    // Pinged four times a second (the default grace of 2 s): the held sessions are checked
    // while the server is saturated below.
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id(&app)
        .lock_budget(KEYS)
        .probe_interval(Duration::from_millis(250))
        .build();

    let mut tasks = Vec::new();
    for task in 0..TASKS {
        let locks = locks.clone();
        tasks.push(tokio::spawn(async move {
            let mut guards = Vec::new();
            for i in (task..KEYS).step_by(TASKS) {
                let guard = locks
                    .acquire(&format!("ten-thousand:{i}"), Some(BOUND))
                    .await
                    .expect("acquire");
                guards.push(guard);
            }
            guards
        }));
    }
    let mut guards: Vec<LockGuard> = Vec::new();
    for task in tasks {
        guards.extend(task.await.expect("join"));
    }

    assert_eq!(guards.len(), KEYS);
    assert_eq!(locks.held_lock_count(), KEYS);
    assert_eq!(
        locks.lock_budget(),
        Some(KEYS),
        "the budget asked for is in force"
    );
    let held = locks_by_pid(&observer, &app).await;
    assert_eq!(held.len(), KEYS, "every key is held on the server");
    let pids: HashSet<i32> = held.iter().map(|(pid, _)| *pid).collect();
    assert!(pids.len() <= 2, "on at most two lock sessions: {pids:?}");
    assert!(tagged_sessions(&observer, &app).await <= 2);
    assert!(
        pool.size() <= 2,
        "the pool opened {} connections",
        pool.size()
    );

    // A server with both cores busy for 5 s: no healthy lock may be declared lost.
    saturate_the_server(&server.url(), Duration::from_secs(5)).await;
    let lost: Vec<_> = guards
        .iter()
        .filter_map(|guard| guard.loss_signal().cause())
        .collect();
    assert!(
        lost.is_empty(),
        "{} false losses: {:?}",
        lost.len(),
        &lost[..lost.len().min(3)]
    );

    let mut releases = Vec::new();
    for chunk in chunked(guards, TASKS) {
        releases.push(tokio::spawn(async move {
            for guard in chunk {
                guard.release().await.expect("release");
            }
        }));
    }
    for release in releases {
        release.await.expect("join");
    }
    assert_eq!(locks.held_lock_count(), 0);
    assert!(locks_by_pid(&observer, &app).await.is_empty());
}

/// Keeps the server's CPUs busy for `period`: three backends counting until their
/// `statement_timeout` ends them.
async fn saturate_the_server(url: &str, period: Duration) {
    let options: PgConnectOptions = url.parse().expect("url");
    let timeout_ms = period.as_millis();
    let busy = PgPoolOptions::new()
        .max_connections(3)
        .connect_with(options.options([("statement_timeout", format!("{timeout_ms}ms"))]))
        .await
        .expect("connect");
    let burners = (0..3).map(|_| {
        let busy = busy.clone();
        tokio::spawn(async move {
            sqlx::query("SELECT count(*) FROM generate_series(1, 10000000000::int8)")
                .execute(&busy)
                .await
        })
    });
    for burner in burners.collect::<Vec<_>>() {
        let ended = burner.await.expect("join");
        assert!(ended.is_err(), "the statement timeout ends the busy loop");
    }
}

fn chunked<T>(items: Vec<T>, parts: usize) -> Vec<Vec<T>> {
    let mut chunks: Vec<Vec<T>> = (0..parts).map(|_| Vec::new()).collect();
    for (i, item) in items.into_iter().enumerate() {
        chunks[i % parts].push(item);
    }
    chunks
}

/// Acquires keys from many tasks at once until the manager's locks sit on two lock sessions.
async fn locks_on_two_sessions(
    locks: &PostgresLockManager,
    observer: &PgPool,
    app: &str,
) -> HashMap<String, LockGuard> {
    let mut guards = HashMap::new();
    for round in 0..50 {
        let mut tasks = Vec::new();
        for i in 0..16 {
            let (locks, key) = (locks.clone(), key(&format!("two-sessions-{round}-{i}")));
            tasks.push(tokio::spawn(async move {
                let guard = locks.acquire(&key, Some(BOUND)).await.expect("acquire");
                (key, guard)
            }));
        }
        for task in tasks {
            let (key, guard) = task.await.expect("join");
            guards.insert(key, guard);
        }
        let pids: HashSet<i32> = locks_by_pid(observer, app)
            .await
            .iter()
            .map(|(pid, _)| *pid)
            .collect();
        assert!(pids.len() <= 2, "never more than the cap: {pids:?}");
        if pids.len() == 2 {
            return guards;
        }
    }
    panic!("the manager never used its second lock session");
}

#[tokio::test]
async fn a_closed_lock_session_loses_exactly_its_locks() {
    let observer = observer().await;
    let app = app_name("per-session-loss");
    let locks = common::manager_for(pool_named(6, &app).await, &app)
        .lock_sessions(2)
        .probe_interval(Duration::from_millis(100))
        .probe_grace(Duration::from_millis(300))
        .build();
    let mut guards = locks_on_two_sessions(&locks, &observer, &app).await;
    let by_id: HashMap<i64, String> = guards.keys().map(|k| (lock_id(k), k.clone())).collect();
    let placed = locks_by_pid(&observer, &app).await;
    let victim = placed[0].0;
    let doomed: HashSet<String> = placed
        .iter()
        .filter(|(pid, _)| *pid == victim)
        .map(|(_, id)| by_id[id].clone())
        .collect();
    assert!(!doomed.is_empty() && doomed.len() < guards.len());

    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(victim)
        .fetch_one(&observer)
        .await
        .expect("terminate");
    assert!(terminated);
    for key in &doomed {
        let cause = tokio::time::timeout(BOUND, guards[key].loss_signal().lost())
            .await
            .unwrap_or_else(|_| panic!("the loss of {key} was never reported"));
        assert_eq!(cause, pglock::LossCause::NotOnServer);
    }
    // The probe that found them gone confirmed the others at the same moment; they are still
    // held, by the other session, and release cleanly.
    assert_eq!(locks.held_lock_count(), guards.len() - doomed.len());
    let survivors = locks_by_pid(&observer, &app).await;
    assert_eq!(survivors.len(), guards.len() - doomed.len());
    assert!(survivors.iter().all(|(pid, _)| *pid != victim));
    for (key, guard) in guards.drain() {
        let released = guard.release().await;
        if doomed.contains(&key) {
            assert!(
                matches!(released, Err(pglock::Error::LockLost { .. })),
                "{released:?}"
            );
        } else {
            released.unwrap_or_else(|err| panic!("release {key}: {err:?}"));
        }
    }
    // The closed session leaves the manager's sessions and the surviving one stays in
    // service: a quiet acquisition goes to it, and no session is opened in the other's place.
    eventually("the closed session is let go", || async {
        locks.lock_session_count() == 1
    })
    .await;
    let survivor = survivors[0].0;
    let after = key("after");
    let again = locks.acquire(&after, Some(BOUND)).await.expect("acquire");
    assert_eq!(
        locks_by_pid(&observer, &app).await,
        [(survivor, lock_id(&after))],
        "taken on the surviving session"
    );
    again.release().await.expect("release");
}

/// A manager whose connections go through `proxy`, with detection slow enough that a short
/// blackhole never trips it.
/// A pool of four connections through `proxy`, tagged `app`.
async fn pool_through(proxy: &Proxy, app: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(4)
        .connect_with(proxy.options(app))
        .await
        .expect("connect through the proxy")
}

async fn behind(proxy: &Proxy, app: &str, fencing: &FencingTable) -> PostgresLockManager {
    let pool = pool_through(proxy, app).await;
    common::manager_for(pool, app)
        .lock_sessions(1)
        .fencing(fencing.clone())
        .probe_interval(Duration::from_secs(30))
        .build()
}

/// A fencing table of this test's own: a token minted for a key proves that a try of it was
/// granted on the server.
fn fencing_table(label: &str) -> FencingTable {
    FencingTable::new(&format!(
        "fence_{label}_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ))
    .expect("valid name")
}

async fn minted(observer: &PgPool, table: &FencingTable, key: &str) -> Option<i64> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT token FROM {table} WHERE lock_id = $1"
    )))
    .bind(lock_id(key))
    .fetch_optional(observer)
    .await
    .expect("query the fencing table")
}

#[tokio::test]
async fn a_try_dropped_with_its_statement_in_flight_touches_no_other_lock() {
    let observer = observer().await;
    let proxy = Proxy::start().await;
    let app = app_name("try-in-flight");
    let table = fencing_table("try_in_flight");
    let locks = behind(&proxy, &app, &table).await;
    let kept: Vec<String> = (0..3).map(|i| key(&format!("kept-{i}"))).collect();
    let mut guards = Vec::new();
    for key in &kept {
        guards.push(locks.acquire(key, Some(BOUND)).await.expect("acquire"));
    }
    let session = locks_by_pid(&observer, &app).await[0].0;

    let (tried, bounded) = (key("tried"), key("bounded"));
    proxy.blackhole();
    let try_in_flight = locks.try_acquire(&tried);
    let acquire_in_flight = locks.acquire(&bounded, Some(Duration::from_millis(300)));
    let (dropped, timed_out) = tokio::join!(
        tokio::time::timeout(Duration::from_millis(200), try_in_flight),
        acquire_in_flight,
    );
    assert!(dropped.is_err(), "the try was still waiting for its answer");
    assert!(timed_out.expect_err("answered too late").is_timeout());
    proxy.restore();

    // Both statements complete on the session's task (each minted a token, so each was
    // granted), and the task takes the grants back.
    eventually("both tries were granted", || async {
        minted(&observer, &table, &tried).await.is_some()
            && minted(&observer, &table, &bounded).await.is_some()
    })
    .await;
    eventually("the dropped grants are undone", || async {
        lock_rows(&observer, lock_id(&tried)).await.is_empty()
            && lock_rows(&observer, lock_id(&bounded)).await.is_empty()
    })
    .await;
    let held = locks_by_pid(&observer, &app).await;
    assert_eq!(
        held.len(),
        kept.len(),
        "the other locks are untouched: {held:?}"
    );
    assert!(
        held.iter().all(|(pid, _)| *pid == session),
        "on the same session"
    );
    assert_eq!(locks.held_lock_count(), kept.len());
    assert_eq!(locks.lock_session_count(), 1);
    for guard in guards {
        assert!(!guard.loss_signal().is_lost());
        guard.release().await.expect("release");
    }
    common::hold(&locks, &tried).await;
    locks.release(&tried).await.expect("release");
}

#[tokio::test]
async fn a_release_dropped_with_its_statement_in_flight_still_releases() {
    let observer = observer().await;
    let proxy = Proxy::start().await;
    let app = app_name("release-in-flight");
    let locks = behind(&proxy, &app, &fencing_table("release_in_flight")).await;
    let (kept, released) = (key("kept"), key("released"));
    let kept_guard = locks.acquire(&kept, Some(BOUND)).await.expect("acquire");
    let guard = locks
        .acquire(&released, Some(BOUND))
        .await
        .expect("acquire");

    proxy.blackhole();
    let dropped = tokio::time::timeout(Duration::from_millis(200), guard.release()).await;
    assert!(
        dropped.is_err(),
        "the release was still waiting for its answer"
    );
    proxy.restore();

    eventually("the dropped release completes", || async {
        lock_rows(&observer, lock_id(&released)).await.is_empty()
    })
    .await;
    assert_eq!(lock_rows(&observer, lock_id(&kept)).await.len(), 1);
    assert!(!kept_guard.loss_signal().is_lost());
    kept_guard.release().await.expect("release");
    assert_eq!(locks.held_lock_count(), 0);
    assert_eq!(
        locks.lock_session_count(),
        1,
        "the session was never closed"
    );
}

#[tokio::test]
async fn many_tasks_share_the_capped_sessions() {
    let observer = observer().await;
    let app = app_name("capped");
    let locks = Arc::new(
        common::manager_for(pool_named(10, &app).await, &app)
            .lock_sessions(3)
            .build(),
    );
    let mut tasks = Vec::new();
    for task in 0..32 {
        let locks = Arc::clone(&locks);
        tasks.push(tokio::spawn(async move {
            for i in 0..20 {
                let key = key(&format!("capped-{task}-{i}"));
                let guard = locks.acquire(&key, Some(BOUND)).await.expect("acquire");
                guard.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        task.await.expect("join");
    }
    let opened = locks.lock_session_count();
    assert!(
        (2..=3).contains(&opened),
        "busy sessions grow up to the cap: {opened}"
    );
    assert!(tagged_sessions(&observer, &app).await <= 3);
    assert_eq!(locks.held_lock_count(), 0);
    assert!(locks_by_pid(&observer, &app).await.is_empty());
}

#[tokio::test]
async fn many_locks_held_by_one_task_spread_over_the_sessions() {
    // No concurrency at all: the spread comes from the number of locks a session carries.
    let observer = observer().await;
    let app = app_name("spread");
    // 600 locks, more than the default budget of a pool of 4 (max_locks_per_transaction x 4):
    // raised on purpose, since the spread is what this test is about.
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .lock_sessions(2)
        .lock_budget(600)
        .build();
    let mut guards = Vec::new();
    for i in 0..600 {
        let key = key(&format!("spread-{i}"));
        guards.push(locks.acquire(&key, Some(BOUND)).await.expect("acquire"));
    }
    let mut per_session: HashMap<i32, usize> = HashMap::new();
    for (pid, _) in locks_by_pid(&observer, &app).await {
        *per_session.entry(pid).or_default() += 1;
    }
    assert_eq!(per_session.len(), 2, "{per_session:?}");
    assert!(
        per_session.values().all(|&n| n < 450),
        "no session carries most of them: {per_session:?}"
    );
    for guard in guards {
        guard.release().await.expect("release");
    }
}

#[tokio::test]
async fn a_lock_session_whose_backend_died_while_idle_is_replaced_on_the_next_try() {
    let observer = observer().await;
    let app = app_name("died-idle");
    let locks = common::manager_for(pool_named(4, &app).await, &app).build();
    let warm = key("died-idle-warm");
    locks
        .acquire(&warm, Some(BOUND))
        .await
        .expect("acquire")
        .release()
        .await
        .expect("release");
    let pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = left('pglock:' || $1, 63)",
    )
    .bind(&app)
    .fetch_one(&observer)
    .await
    .expect("the lock session");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    eventually("the backend is gone", || async {
        tagged_sessions(&observer, &app).await == 0
    })
    .await;
    // The manager learns of it from the try itself, and answers from a new session.
    let key = key("died-idle");
    let info = locks
        .try_acquire(&key)
        .await
        .expect("a new session answers")
        .leak();
    assert!(info.is_some());
    assert_eq!(lock_rows(&observer, lock_id(&key)).await.len(), 1);
    locks.release(&key).await.expect("release");
}

#[tokio::test]
async fn a_lock_session_that_sees_its_connection_break_reports_its_locks_at_once() {
    // A slow probe: the loss must come from the session's own report, not from a probe.
    let observer = observer().await;
    let app = app_name("report-at-once");
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .lock_sessions(1)
        .probe_interval(Duration::from_secs(30))
        .build();
    let held = locks
        .acquire(&key("report-held"), Some(BOUND))
        .await
        .expect("acquire");
    let pid = locks_by_pid(&observer, &app).await[0].0;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    eventually("the backend is gone", || async {
        locks_by_pid(&observer, &app).await.is_empty()
    })
    .await;
    // The next statement on the session finds the connection broken.
    let _ = locks.try_acquire(&key("report-next")).await;
    let cause = tokio::time::timeout(Duration::from_secs(5), held.loss_signal().lost())
        .await
        .expect("reported well before the 30 s probe");
    assert_eq!(cause, pglock::LossCause::SessionClosed);
}

#[tokio::test]
async fn a_fenced_try_whose_mint_fails_takes_nothing_and_keeps_the_session() {
    // The mint's INSERT breaks a constraint after the try's lock was granted in the same
    // statement: the session lock survives the failed statement, so the session's task must
    // take it back before it reports the error, and the session, with its other locks, goes on.
    let observer = observer().await;
    let app = app_name("mint-fails");
    let table_name = format!("pglock_test_fence_{}", uuid::Uuid::new_v4().simple());
    let table = FencingTable::new(&table_name).expect("valid name");
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .fencing(table.clone())
        .lock_sessions(1)
        .build();
    let kept_key = key("mint-fails-kept");
    let kept = locks
        .acquire(&kept_key, Some(BOUND))
        .await
        .expect("acquire");
    let session = locks_by_pid(&observer, &app).await[0].0;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "ALTER TABLE {table_name} ADD CONSTRAINT pglock_test_no_new_tokens CHECK (token < 0) NOT VALID"
    )))
    .execute(&observer)
    .await
    .expect("refuse new tokens");

    let refused = key("mint-fails-refused");
    let err = locks
        .try_acquire(&refused)
        .await
        .expect_err("the mint fails");
    assert!(matches!(err, pglock::Error::Database { .. }), "{err:?}");
    assert!(
        lock_rows(&observer, lock_id(&refused)).await.is_empty(),
        "the lock granted before the failed mint was taken back"
    );
    assert!(!locks.is_held(&refused).await);
    assert!(!kept.loss_signal().is_lost());
    assert_eq!(
        locks_by_pid(&observer, &app).await,
        [(session, lock_id(&kept_key))],
        "the session and its other lock go on"
    );
    kept.release().await.expect("release");
}

#[tokio::test]
async fn a_lock_session_the_manager_closes_loses_its_locks_even_while_the_server_keeps_them() {
    // A statement on the lock session goes unanswered (its token's mint waits for a table
    // lock that another transaction holds), so the manager closes the session. The server's
    // backend, stuck in that wait, does not notice and keeps the session's locks; the manager
    // can no longer release them, so their holders are told now, not when the server lets go.
    let observer = observer().await;
    let app = app_name("abandoned");
    let table_name = format!("pglock_test_fence_{}", uuid::Uuid::new_v4().simple());
    let table = FencingTable::new(&table_name).expect("valid name");
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .fencing(table.clone())
        .lock_sessions(1)
        .release_timeout(Duration::from_millis(300))
        .probe_interval(Duration::from_millis(100))
        .probe_grace(Duration::from_secs(30))
        .build();
    let held_key = key("abandoned-held");
    let held = locks
        .acquire(&held_key, Some(BOUND))
        .await
        .expect("acquire");
    let session = locks_by_pid(&observer, &app).await[0].0;

    let mut blocker = observer.begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "LOCK TABLE {table_name} IN ACCESS EXCLUSIVE MODE"
    )))
    .execute(&mut *blocker)
    .await
    .expect("lock the fencing table");
    let err = locks
        .try_acquire(&key("abandoned-next"))
        .await
        .expect_err("the mint waits past the statement bound");
    println!("the unanswered try: {err}");
    let cause = tokio::time::timeout(Duration::from_secs(5), held.loss_signal().lost())
        .await
        .expect("told at once, not after the 30 s grace");
    assert_eq!(cause, pglock::LossCause::SessionClosed);
    assert!(!locks.is_held(&held_key).await);
    assert!(
        locks_by_pid(&observer, &app)
            .await
            .iter()
            .any(|&(pid, id)| pid == session && id == lock_id(&held_key)),
        "the server still holds the abandoned lock"
    );
    let released = held.release().await.expect_err("a lost lock's release");
    assert!(
        matches!(
            released,
            pglock::Error::LockLost {
                cause: pglock::LossCause::SessionClosed,
                ..
            }
        ),
        "{released:?}"
    );

    blocker.rollback().await.expect("rollback");
    eventually("the server lets the abandoned session go", || async {
        lock_rows(&observer, lock_id(&held_key)).await.is_empty()
    })
    .await;
    let again = locks
        .acquire(&held_key, Some(BOUND))
        .await
        .expect("acquire again");
    again.release().await.expect("release");
}

#[tokio::test]
async fn an_unanswered_unlock_closes_its_lock_session_and_reports_its_locks_lost() {
    let observer = observer().await;
    let proxy = Proxy::start().await;
    let app = app_name("unanswered-unlock");
    let pool = pool_through(&proxy, &app).await;
    let locks = common::manager_for(pool, &app)
        .lock_sessions(1)
        .release_timeout(Duration::from_millis(200))
        .probe_interval(Duration::from_millis(100))
        .probe_grace(Duration::from_secs(30))
        .build();
    let (released, neighbour) = (key("released"), key("neighbour"));
    let guard = locks
        .acquire(&released, Some(BOUND))
        .await
        .expect("acquire");
    let other = locks
        .acquire(&neighbour, Some(BOUND))
        .await
        .expect("acquire");
    let session = locks_by_pid(&observer, &app).await[0].0;

    proxy.blackhole();
    let err = guard
        .release()
        .await
        .expect_err("no answer within the release timeout");
    assert!(
        matches!(
            &err,
            pglock::Error::ReleaseFailed { reason: pglock::ReleaseFailure::Timeout(t), .. }
                if *t == Duration::from_millis(200)
        ),
        "{err:?}"
    );
    proxy.restore();
    // The session it ran on is closed, not kept: its other lock is reported lost at once (as
    // closed by the manager, or as gone from the server if the server was quicker to end the
    // backend; the 30 s grace rules out the unverifiable path), and the server ends the
    // backend, which frees both locks.
    let cause = tokio::time::timeout(BOUND, other.loss_signal().lost())
        .await
        .expect("the neighbour's loss is reported");
    assert!(
        matches!(
            cause,
            pglock::LossCause::SessionClosed | pglock::LossCause::NotOnServer
        ),
        "{cause:?}"
    );
    eventually("the closed session leaves the server", || async {
        !locks_by_pid(&observer, &app)
            .await
            .iter()
            .any(|(pid, _)| *pid == session)
            && tagged_sessions_with_pid(&observer, session).await == 0
    })
    .await;
    assert!(lock_rows(&observer, lock_id(&released)).await.is_empty());
    assert!(lock_rows(&observer, lock_id(&neighbour)).await.is_empty());
    // The manager goes on with a new session.
    let again = locks
        .acquire(&released, Some(BOUND))
        .await
        .expect("acquire");
    again.release().await.expect("release");
}

async fn tagged_sessions_with_pid(observer: &PgPool, pid: i32) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity WHERE pid = $1")
        .bind(pid)
        .fetch_one(observer)
        .await
        .expect("query pg_stat_activity")
}

#[tokio::test]
async fn a_try_left_unpolled_mid_statement_holds_up_no_other_lock() {
    // A try polled until its statement is on its way and then never polled again (a `select!`
    // branch left pending while another runs) must not stall the session's other locks: the
    // statement is not run on the caller's task while the session carries another lock, so
    // the other lock's release goes through at once, and nothing is given up.
    let app = app_name("unpolled");
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .lock_sessions(1)
        .release_timeout(Duration::from_millis(300))
        .build();
    let kept = locks
        .acquire(&key("unpolled-kept"), Some(BOUND))
        .await
        .expect("acquire");
    let left_key = key("unpolled-left");
    let mut left = Box::pin(locks.try_acquire(&left_key));
    assert!(futures::poll!(left.as_mut()).is_pending());
    let released = tokio::time::timeout(Duration::from_secs(5), kept.release())
        .await
        .expect("the release was not held up");
    released.expect("the other lock's release went through");
    assert_eq!(
        locks.lock_session_count(),
        1,
        "the session was never given up"
    );
    drop(left);
    let observer = observer().await;
    eventually("the left try's grant is undone", || async {
        lock_rows(&observer, lock_id(&left_key)).await.is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_try_left_unpolled_on_an_idle_session_holds_up_other_callers_only_for_a_bound() {
    // A try that borrowed an idle session's connection and is then never polled again keeps
    // that connection; a caller that needs the session meanwhile waits at most twice the
    // statement bound, after which the session is given up and the caller served on a new one.
    let proxy = Proxy::start().await;
    let app = app_name("unpolled-idle");
    let pool = pool_through(&proxy, &app).await;
    let locks = common::manager_for(pool, &app)
        .lock_sessions(1)
        .release_timeout(Duration::from_millis(300))
        .build();
    let warm = locks
        .acquire(&key("unpolled-idle-warm"), Some(BOUND))
        .await
        .expect("acquire");
    warm.release().await.expect("release");
    let left_key = key("unpolled-idle-left");
    let mut left = Box::pin(locks.try_acquire(&left_key));
    // Its statement is sent and cannot be answered before the poll ends; the answer may come
    // once the proxy lets it through, but the future is not polled to read it.
    proxy.blackhole();
    let polled = futures::poll!(left.as_mut());
    assert!(polled.is_pending(), "{polled:?}");
    proxy.restore();
    let other = tokio::time::timeout(
        Duration::from_secs(5),
        locks.acquire(&key("unpolled-idle-other"), Some(BOUND)),
    )
    .await
    .expect("the other caller was held up past the bound")
    .expect("acquire on a new session");
    other.release().await.expect("release");
    drop(left);
    let observer = observer().await;
    eventually("nothing of the left try stays held", || async {
        lock_rows(&observer, lock_id(&left_key)).await.is_empty()
    })
    .await;
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
async fn a_failed_unlock_is_reported_and_its_connection_is_not_pooled() {
    let observer = observer().await;
    let app = app_name("dead-session");
    let locks = manager_named(&app, 2).await;
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
