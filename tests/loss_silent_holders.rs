//! Holders that go silent: a process frozen with `SIGSTOP`, a network that drops every packet,
//! a runtime too busy to run the manager's tasks. The server ends a session unheard for the
//! manager's silence timeout, so another process gets the lock within that bound; the silent
//! holder, once it runs again, is told before its work goes on, and its fenced write is
//! refused. A waiter frozen in the server's queue is a silent holder from its grant on. A
//! healthy process, however busy or however long it holds, keeps its locks.
//!
//! PostgreSQL 13 and older have no `idle_session_timeout`: there the frozen holder and the
//! frozen waiter keep their locks past the bound, until they run again, and the tests assert
//! that instead (the holder still learns on resuming that it may not count on them).

mod common;

use std::time::Duration;

use common::child::{Reaped, role};
use common::clock::now_us;
use common::proxy::Proxy;
use common::{key, lock_rows, observer, pool_named};
use pglock::fence::Error as FenceError;
use pglock::{Error, FencingTable, LossCause, PostgresLockManager, RowFence, lock_id};
use rustix::process::{Pid, Signal, kill_process};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::time::Instant;

/// The bound under test, short so the tests are.
const SILENCE: Duration = Duration::from_secs(2);
const PROBE: Duration = Duration::from_millis(200);
const GRACE: Duration = Duration::from_millis(400);
/// Room on top of the bound for the server's own timer, a round trip and a busy machine.
const SLACK: Duration = Duration::from_millis(500);
const ROLE: &str = "pglock-frozen-holder=";

/// A fencing table of the test's own, so no other test's tokens are in it.
fn fencing_table() -> String {
    format!("silent_fencing_{}", uuid::Uuid::new_v4().simple())
}

fn silent_manager(pool: PgPool, fencing: &str) -> PostgresLockManager {
    PostgresLockManager::builder(pool)
        .probe_interval(PROBE)
        .probe_grace(GRACE)
        .silence_timeout(SILENCE)
        .fencing(FencingTable::new(fencing).expect("valid"))
        .build()
}

/// A resource fenced per key: one row per key, with its fence.
async fn resource(pool: &PgPool, keys: &[&str]) -> (String, RowFence) {
    let table = format!("silent_resource_{}", uuid::Uuid::new_v4().simple());
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, fence bigint)"
    )))
    .execute(pool)
    .await
    .expect("create the resource");
    for key in keys {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {table} VALUES ($1, NULL)"
        )))
        .bind(key)
        .execute(pool)
        .await
        .expect("insert");
    }
    let fence = RowFence::new(&table, "id", "fence")
        .and_then(|fence| fence.returning(&["id"]))
        .expect("valid names");
    (table, fence)
}

/// Takes `key`, which a silent holder has, as another process would: the server must free it
/// within the silence bound of `silent_at`.
async fn taken_within_the_bound(
    rival: &PostgresLockManager,
    key: &str,
    silent_at: Instant,
    holder: &str,
) -> pglock::LockGuard {
    let guard = rival
        .acquire(key, Some(SILENCE * 10))
        .await
        .expect("the server frees the lock of a session it no longer hears");
    let freed_after = silent_at.elapsed();
    println!("{holder}: {key} taken by another process {freed_after:?} after it went silent");
    assert!(
        freed_after <= SILENCE + SLACK,
        "taken {freed_after:?} after the holder went silent, more than {SILENCE:?} + {SLACK:?}"
    );
    guard
}

#[tokio::test]
async fn a_frozen_holder_loses_its_locks_within_the_bound_and_learns_it_when_it_runs_again() {
    if let Some(spec) = role(ROLE) {
        return frozen_holder(&spec).await;
    }
    let observer = observer().await;
    let pool = pool_named(4, &common::app_name("frozen-rival")).await;
    let fencing = fencing_table();
    let (own, contended) = (key("frozen-own"), key("frozen-contended"));
    let (table, fence) = resource(&pool, &[&own, &contended]).await;
    let rival = silent_manager(pool.clone(), &fencing);
    // The child waits for `contended`, so it holds it on a session of its own: both kinds of
    // session are frozen.
    let blocker = rival.acquire(&contended, None).await.expect("acquire");
    let (child, output) = Reaped::spawn(
        "a_frozen_holder_loses_its_locks_within_the_bound_and_learns_it_when_it_runs_again",
        ROLE,
        &format!("{own}|{contended}|{table}|{fencing}"),
    );
    output.until("holds own");
    common::eventually("the child waits on the server", || async {
        lock_rows(&observer, lock_id(&contended)).await.len() == 2
    })
    .await;
    blocker.release().await.expect("release");
    // Frozen between two steps of its work, as a process mostly is: a freeze that lands in
    // the middle of a step lets that step finish when the process runs again (nothing can stop
    // a step half-way), so the test freezes it right after a step, well before the next.
    output.until("ticking");
    output.until("tick ");
    // PostgreSQL 13 and older have no `idle_session_timeout`: the server keeps a frozen
    // holder's locks until it runs again, and the holder still learns then that it may not
    // count on them.
    let bounded = common::pg14_or_later(&pool).await;

    let pid = Pid::from_child(&child.0);
    kill_process(pid, Signal::STOP).expect("SIGSTOP the holder");
    let stopped_at = Instant::now();
    if bounded {
        for key in [&own, &contended] {
            let guard = taken_within_the_bound(&rival, key, stopped_at, "frozen holder").await;
            // The new holder claims the resource with its newer token.
            let token = guard.info().fencing_token.expect("fenced");
            let _: (String,) = fence
                .raise(&pool, key.as_str(), token)
                .await
                .expect("raise");
            guard.leak();
        }
    } else {
        kept_past_the_bound(&rival, &[&own, &contended]).await;
    }

    let resumed_us = now_us();
    kill_process(pid, Signal::CONT).expect("SIGCONT the holder");
    let lines = output.all();
    let ticks_after: Vec<&String> = lines
        .iter()
        .filter_map(|line| {
            Some((
                line,
                line.split("tick ")
                    .nth(1)?
                    .split_whitespace()
                    .next()?
                    .parse::<u64>()
                    .ok()?,
            ))
        })
        .filter(|(_, at)| *at >= resumed_us)
        .map(|(line, _)| line)
        .collect();
    assert!(
        ticks_after.is_empty(),
        "work went on after the resume at {resumed_us}: {ticks_after:?} in {:?}",
        &lines[lines.len().saturating_sub(8)..]
    );
    let said = |marker: &str| lines.iter().any(|line| line.contains(marker));
    assert!(said("run ended: lost expired"), "{lines:?}");
    assert!(said("contended: lost expired"), "{lines:?}");
    if bounded {
        assert!(said("own: write refused"), "{lines:?}");
        assert!(said("contended: write refused"), "{lines:?}");
    } else {
        // Nobody could take the keys meanwhile, so no newer token fences its writes out.
        assert!(said("own: write Ok("), "{lines:?}");
        assert!(said("contended: write Ok("), "{lines:?}");
    }
    rival.release_all().await.expect("release");
}

/// On a server without `idle_session_timeout` (PostgreSQL 13 and older): a silent holder's
/// `keys` stay held past the bound; another process waiting for them times out.
async fn kept_past_the_bound(rival: &PostgresLockManager, keys: &[&str]) {
    let attempts = keys
        .iter()
        .map(|key| rival.acquire(*key, Some(SILENCE + SLACK)));
    for (key, attempt) in keys.iter().zip(futures::future::join_all(attempts).await) {
        let err = attempt.expect_err("a server without idle_session_timeout keeps the locks");
        assert!(err.is_timeout(), "{key}: {err:?}");
    }
}

/// The child: holds two keys, ticks under the first until told its lock is gone, then tries
/// the fenced writes a holder that did not check would make.
async fn frozen_holder(spec: &str) {
    let [own, contended, table, fencing]: [&str; 4] = spec
        .split('|')
        .collect::<Vec<_>>()
        .try_into()
        .expect("spec");
    let pool = pool_named(4, &common::app_name("frozen-holder")).await;
    let locks = silent_manager(pool.clone(), fencing);
    let own_guard = locks.acquire(own, None).await.expect("acquire");
    println!("holds own");
    let contended_guard = locks.acquire(contended, None).await.expect("acquire");
    let ticking = own_guard.run(async {
        println!("ticking");
        loop {
            println!("tick {}", now_us());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let ticked = ticking.await;
    println!("run returned at {}", now_us());
    match ticked {
        Err(Error::LockLost { cause, .. }) => println!("run ended: lost {}", cause.as_str()),
        other => println!("run ended: {other:?}"),
    }
    match contended_guard.loss_signal().cause() {
        Some(cause) => println!("contended: lost {}", cause.as_str()),
        None => println!("contended: not lost"),
    }
    let fence = RowFence::new(table, "id", "fence")
        .and_then(|fence| fence.returning(&["id"]))
        .expect("valid names");
    for (name, guard) in [("own", &own_guard), ("contended", &contended_guard)] {
        let token = guard.info().fencing_token.expect("fenced");
        let written: Result<(String,), _> = fence
            .raise(&pool, name_key(name, own, contended), token)
            .await;
        match written {
            Err(FenceError::StaleToken { .. }) => println!("{name}: write refused"),
            other => println!("{name}: write {other:?}"),
        }
    }
}

fn name_key<'a>(name: &str, own: &'a str, contended: &'a str) -> &'a str {
    if name == "own" { own } else { contended }
}

const WAITER_ROLE: &str = "pglock-frozen-waiter=";

#[tokio::test]
async fn a_waiter_frozen_in_the_queue_holds_the_lock_granted_meanwhile_no_longer_than_the_bound() {
    if let Some(spec) = role(WAITER_ROLE) {
        return frozen_waiter(&spec).await;
    }
    // The server grants a lock to the first session in its queue whether or not that
    // session's process runs: a waiter frozen there holds the key, unknowingly, from the
    // grant. The server then hears nothing from it, so it ends the session within the bound of
    // the grant, and the next in line gets the key; the waiter, running again, does not take a
    // grant made to a session that has since ended, and waits again.
    let observer = observer().await;
    let pool = pool_named(4, &common::app_name("frozen-waiter-rival")).await;
    let fencing = fencing_table();
    let rival = silent_manager(pool, &fencing);
    let key = key("frozen-waiter");
    let first = rival.acquire(&key, None).await.expect("acquire");
    let first_token = first.info().fencing_token.expect("fenced");
    // PostgreSQL 13 and older have no `idle_session_timeout`: the frozen waiter's session
    // keeps the lock granted to it until the waiter runs again, and then takes that grant.
    let bounded = common::pg14_or_later(&observer).await;
    let (child, output) = Reaped::spawn(
        "a_waiter_frozen_in_the_queue_holds_the_lock_granted_meanwhile_no_longer_than_the_bound",
        WAITER_ROLE,
        &format!("{key}|{fencing}"),
    );
    output.until("waiting");
    let waiter = waiting_backend(&observer, &key).await;

    let pid = Pid::from_child(&child.0);
    kill_process(pid, Signal::STOP).expect("SIGSTOP the waiter");
    common::eventually("the waiter is stopped", || async { is_stopped(pid) }).await;
    first.release().await.expect("release");
    let granted_at = Instant::now();
    common::eventually(
        "the frozen waiter's session is granted the lock",
        || async {
            let rows = lock_rows(&observer, lock_id(&key)).await;
            rows.iter().any(|row| row.pid == waiter && row.granted)
        },
    )
    .await;
    if !bounded {
        kept_past_the_bound(&rival, &[&key]).await;
        kill_process(pid, Signal::CONT).expect("SIGCONT the waiter");
        let later = granted_token(&output.until("granted"));
        assert!(
            later > first_token,
            "the waiter's token {later} is not newer than {first_token}, the holder's before it"
        );
        return;
    }
    let taken = taken_within_the_bound(&rival, &key, granted_at, "frozen waiter").await;
    let token = taken.info().fencing_token.expect("fenced");

    kill_process(pid, Signal::CONT).expect("SIGCONT the waiter");
    // Running again, it finds its session gone and queues anew, behind the lock taken since.
    common::eventually("the waiter waits again, on another session", || async {
        let rows = lock_rows(&observer, lock_id(&key)).await;
        rows.iter().any(|row| !row.granted && row.pid != waiter)
    })
    .await;
    let so_far = output.so_far();
    assert!(
        so_far.iter().all(|line| !line.contains("granted")),
        "the waiter took a grant its session no longer held: {so_far:?}"
    );
    taken.release().await.expect("release");
    let later = granted_token(&output.until("granted"));
    assert!(
        later > token,
        "the waiter's token {later} is not newer than {token}, taken while it was frozen"
    );
}

/// The token in the child's `granted {token}` line.
fn granted_token(line: &str) -> i64 {
    line.split_whitespace()
        .nth(1)
        .and_then(|token| token.parse().ok())
        .unwrap_or_else(|| panic!("a token in {line:?}"))
}

/// The child: waits for the key without a deadline, then says which token it got.
async fn frozen_waiter(spec: &str) {
    let (key, fencing) = spec.split_once('|').expect("spec");
    let pool = pool_named(4, &common::app_name("frozen-waiter")).await;
    let locks = silent_manager(pool, fencing);
    println!("waiting");
    let guard = locks.acquire(key, None).await.expect("acquire");
    let token = guard.info().fencing_token.expect("fenced");
    println!("granted {token}");
    guard.release().await.expect("release");
}

/// The backend of the one session waiting for `key`, once there is one.
async fn waiting_backend(observer: &PgPool, key: &str) -> i32 {
    common::eventually("the child waits on the server", || async {
        lock_rows(observer, lock_id(key))
            .await
            .iter()
            .any(|row| !row.granted)
    })
    .await;
    let rows = lock_rows(observer, lock_id(key)).await;
    let waiting: Vec<i32> = rows.iter().filter(|r| !r.granted).map(|r| r.pid).collect();
    assert_eq!(waiting.len(), 1, "{rows:?}");
    waiting[0]
}

/// Whether the process is stopped by a signal (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: Pid) -> bool {
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default();
    // The state follows the command name, which is in parentheses and may hold spaces.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        == Some("T")
}

#[tokio::test]
async fn a_holder_behind_a_dead_network_loses_its_locks_within_the_bound() {
    let observer = observer().await;
    let proxy = Proxy::start().await;
    let fencing = fencing_table();
    let held_through = sqlx::postgres::PgPoolOptions::new()
        .max_connections(3)
        .connect_with(proxy.options(&common::app_name("blackholed")))
        .await
        .expect("connect through the proxy");
    let holder = silent_manager(held_through, &fencing);
    let direct = pool_named(3, &common::app_name("blackhole-rival")).await;
    let rival = silent_manager(direct.clone(), &fencing);
    let key = key("blackholed");
    let (_table, fence) = resource(&direct, &[&key]).await;
    let guard = holder.acquire(&key, None).await.expect("acquire");
    let old_token = guard.info().fencing_token.expect("fenced");

    proxy.blackhole();
    let silent_at = Instant::now();
    let taken = taken_within_the_bound(&rival, &key, silent_at, "blackholed holder").await;
    let new_token = taken.info().fencing_token.expect("fenced");
    assert!(new_token > old_token);
    let _: (String,) = fence
        .raise(&direct, key.as_str(), new_token)
        .await
        .expect("raise");
    // The holder was told long before (it could not confirm its session), and says why.
    assert_eq!(guard.loss_signal().cause(), Some(LossCause::Unverifiable));
    let stale: Result<(String,), _> = fence.raise(&direct, key.as_str(), old_token).await;
    assert!(
        matches!(stale, Err(FenceError::StaleToken { .. })),
        "{stale:?}"
    );
    assert_eq!(lock_rows(&observer, lock_id(&key)).await.len(), 1);
    taken.release().await.expect("release");
}

#[tokio::test(flavor = "current_thread")]
async fn a_runtime_busy_for_seconds_keeps_its_locks() {
    // A 4 s bound, and the runtime that runs the manager's tasks blocked for 3 s: the pings
    // due meanwhile go out late, but before the server would end the session, which keeps it.
    let bound = Duration::from_secs(4);
    let observer = observer().await;
    let locks = PostgresLockManager::builder(pool_named(3, &common::app_name("busy")).await)
        .probe_interval(PROBE)
        .silence_timeout(bound)
        .build();
    let key = key("busy-runtime");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let before = lock_rows(&observer, lock_id(&key)).await;
    std::thread::sleep(Duration::from_secs(3));
    // Past the bound since the block began: the session lives only if it was heard again.
    tokio::time::sleep(bound - Duration::from_secs(2)).await;
    still_held_by(&observer, &guard, &key, before[0].pid).await;
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_lock_held_for_many_bounds_keeps_its_session() {
    // A 2 s bound, held for five of them: the heartbeat (every 500 ms, a quarter of the
    // bound) keeps the session.
    let observer = observer().await;
    let locks = PostgresLockManager::builder(pool_named(3, &common::app_name("long")).await)
        .silence_timeout(Duration::from_secs(2))
        .build();
    let key = key("held-long");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let before = lock_rows(&observer, lock_id(&key)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    still_held_by(&observer, &guard, &key, before[0].pid).await;
    guard.release().await.expect("release");
}

/// The guard has not been told of a loss, and the server session `pid` still holds `key`.
async fn still_held_by(observer: &PgPool, guard: &pglock::LockGuard, key: &str, pid: i32) {
    assert_eq!(guard.loss_signal().cause(), None);
    let after = lock_rows(observer, lock_id(key)).await;
    assert_eq!(after.len(), 1);
    assert_eq!(after[0].pid, pid, "the same session holds it");
}

#[tokio::test]
async fn the_manager_leaves_no_session_setting_behind_in_the_pool() {
    // The silence timeouts and the tag are the manager's while it uses a session; the pool's
    // connections get their own values back, both the lock session's and the one that waited
    // for a contended key (kept for reuse a while, then returned).
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect_with(common::options("settings-restored"))
        .await
        .expect("connect");
    let before = settings_of_every_connection(&pool).await;
    assert_eq!(before.len(), 2);
    let has_idle_session_timeout = common::pg14_or_later(&pool).await;
    assert!(
        before
            .iter()
            .all(|settings| settings.0.is_some() == has_idle_session_timeout),
        "{before:?}"
    );
    let locks = PostgresLockManager::builder(pool.clone())
        .lock_sessions(1)
        .session_idle_timeout(Duration::from_millis(50))
        .build();
    let rival = PostgresLockManager::new(pool_named(2, &common::app_name("settings-rival")).await);
    let (plain, contended) = (key("settings"), key("settings-contended"));
    let guard = locks.acquire(&plain, None).await.expect("acquire");
    let blocker = rival.acquire(&contended, None).await.expect("acquire");
    let waiting = tokio::spawn({
        let (locks, contended) = (locks.clone(), contended.clone());
        async move { locks.acquire(&contended, None).await }
    });
    let observer = observer().await;
    common::eventually("the contended key is waited for", || async {
        lock_rows(&observer, lock_id(&contended)).await.len() == 2
    })
    .await;
    blocker.release().await.expect("release");
    let waited = waiting.await.expect("join").expect("acquire");
    waited.release().await.expect("release");
    guard.release().await.expect("release");
    common::eventually("both sessions go back to the pool", || async {
        locks.lock_session_count() == 0 && pool.num_idle() == 2
    })
    .await;
    let mut after = settings_of_every_connection(&pool).await;
    let mut before = before;
    before.sort();
    after.sort();
    assert_eq!(after, before);
}

/// `idle_session_timeout` is NULL on PostgreSQL 13 and older, which lack it (the manager sets
/// it only where the server has it).
type Settings = (Option<String>, String, String, String);

const SETTINGS: &str = "SELECT current_setting('idle_session_timeout', true), \
    current_setting('tcp_user_timeout'), current_setting('tcp_keepalives_idle'), \
    current_setting('application_name')";

/// The settings of every connection of `pool`, all checked out at once.
async fn settings_of_every_connection(pool: &PgPool) -> Vec<Settings> {
    let mut conns = Vec::new();
    for _ in 0..pool.options().get_max_connections() {
        conns.push(pool.acquire().await.expect("acquire"));
    }
    let mut settings = Vec::new();
    for conn in &mut conns {
        settings.push(
            sqlx::query_as(SETTINGS)
                .fetch_one(&mut **conn)
                .await
                .expect("settings"),
        );
    }
    settings
}

#[tokio::test]
async fn a_released_lock_is_never_reported_expired() {
    // Released by its guard, the lock's signal stays quiet, however long its session (which
    // retires and is no longer pinged) goes unheard afterwards.
    let locks = PostgresLockManager::builder(pool_named(2, &common::app_name("released")).await)
        .silence_timeout(Duration::from_secs(1))
        .session_idle_timeout(Duration::from_millis(10))
        .build();
    let guard = locks.acquire(key("released"), None).await.expect("acquire");
    let signal = guard.loss_signal().clone();
    guard.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(signal.cause(), None);
    assert!(!signal.is_lost());
}

const SET_ROLE: &str = "pglock-frozen-set=";

#[tokio::test]
async fn a_frozen_set_holder_runs_no_body_once_its_silence_ran_out() {
    if let Some(spec) = role(SET_ROLE) {
        return frozen_set_holder(&spec).await;
    }
    // The set's body runs under two sessions (one key taken at once, one waited for): once
    // either's silence has run out, no step of the body runs again, through `LockSet::run`
    // or `with_locks` alike.
    for way in ["run", "with_locks"] {
        frozen_set(way).await;
    }
}

async fn frozen_set(way: &str) {
    let observer = observer().await;
    let pool = pool_named(4, &common::app_name("frozen-set-rival")).await;
    let fencing = fencing_table();
    let (own, contended) = (key("frozen-set-own"), key("frozen-set-contended"));
    let rival = silent_manager(pool.clone(), &fencing);
    let blocker = rival.acquire(&contended, None).await.expect("acquire");
    let (child, output) = Reaped::spawn(
        "a_frozen_set_holder_runs_no_body_once_its_silence_ran_out",
        SET_ROLE,
        &format!("{way}|{own}|{contended}|{fencing}"),
    );
    common::eventually("the child waits on the server", || async {
        lock_rows(&observer, lock_id(&contended)).await.len() == 2
    })
    .await;
    blocker.release().await.expect("release");
    output.until("ticking");
    output.until("tick ");
    let bounded = common::pg14_or_later(&pool).await;

    let pid = Pid::from_child(&child.0);
    kill_process(pid, Signal::STOP).expect("SIGSTOP the holder");
    let stopped_at = Instant::now();
    let taken = if bounded {
        Some(taken_within_the_bound(&rival, &contended, stopped_at, "frozen set").await)
    } else {
        kept_past_the_bound(&rival, &[&own, &contended]).await;
        None
    };
    let resumed_us = now_us();
    kill_process(pid, Signal::CONT).expect("SIGCONT the holder");
    let lines = output.all();
    let ticks_after: Vec<&String> = lines
        .iter()
        .filter(|line| tick_time(line).is_some_and(|at| at >= resumed_us))
        .collect();
    assert!(
        ticks_after.is_empty(),
        "{way}: the set's body went on after the resume at {resumed_us}: {ticks_after:?}"
    );
    assert!(
        lines
            .iter()
            .any(|line| line.contains("set ended: lost expired")),
        "{way}: {lines:?}"
    );
    if let Some(taken) = taken {
        taken.release().await.expect("release");
    }
}

/// The time in a child's `tick {us}` line.
fn tick_time(line: &str) -> Option<u64> {
    line.split("tick ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The child: holds `own` and `contended` as one set and ticks in its body, through
/// `LockSet::run` or `with_locks`, until told its locks are gone.
async fn frozen_set_holder(spec: &str) {
    let [way, own, contended, fencing]: [&str; 4] = spec
        .split('|')
        .collect::<Vec<_>>()
        .try_into()
        .expect("spec");
    let pool = pool_named(4, &common::app_name("frozen-set")).await;
    let locks = silent_manager(pool, fencing);
    let ticking = || async {
        println!("ticking");
        loop {
            println!("tick {}", now_us());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    };
    let ended = if way == "run" {
        let set = locks
            .acquire_all([own, contended], None)
            .await
            .expect("acquire_all");
        let ended = set.run(ticking()).await;
        drop(set);
        ended
    } else {
        locks
            .with_locks([own, contended], None, |_| ticking())
            .await
    };
    match ended {
        Err(Error::LockLost { cause, .. }) => println!("set ended: lost {}", cause.as_str()),
        other => println!("set ended: {other:?}"),
    }
}
