//! In-process handoff: a lock released while another task of the same manager waits goes
//! straight to that task without an unlock and a new lock on the server, and a bound (count and
//! time) sends it back to the server queue so other processes are not starved.

mod common;

use common::hooked::BuildHooked;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::stages::StageCounts;
use common::{app_name, key, lock_rows, observer, pool_named};
use pglock::{PostgresLockManager, lock_id};
use pglock_testing::Stage;
use sqlx::PgPool;
use tokio::time::Instant;

/// How long a test waits for a signal before it fails instead of hanging.
const BOUND: Duration = Duration::from_secs(30);

/// The backend holding `key`'s lock, when it last started a statement, and that statement.
type Statement = (i32, chrono::DateTime<chrono::Utc>, String);

/// The backend holding `key`'s lock, and the last statement it ran.
async fn holder_statement(observer: &PgPool, key: &str) -> Statement {
    let rows = lock_rows(observer, lock_id(key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    sqlx::query_as("SELECT pid, query_start, query FROM pg_stat_activity WHERE pid = $1")
        .bind(rows[0].pid)
        .fetch_one(observer)
        .await
        .expect("pg_stat_activity")
}

/// Three tasks of one manager take the lock in turn, queued behind each other; each records
/// which session held it on the server and when that session last sent a statement. `stages`
/// counts the manager's operations at each await point.
async fn relay(
    locks: &PostgresLockManager,
    stages: &StageCounts,
    observer: &PgPool,
    key: &str,
) -> Vec<Statement> {
    let first = locks.acquire(key, None).await.expect("acquire");
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (locks, observer, key) = (locks.clone(), observer.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            let guard = locks.acquire(&key, Some(BOUND)).await.expect("acquire");
            let seen = holder_statement(&observer, &key).await;
            guard.release().await.expect("release");
            seen
        }));
    }
    // Both tasks are queued behind the first holder before it lets go: on this one thread, a
    // task seen at the turn queue's door has walked in before this test runs again.
    stages.wait_for(Stage::Turn, key, 3).await;
    assert_eq!(
        stages.count(Stage::Server, key),
        1,
        "only the first went to the server"
    );
    let mut seen = vec![holder_statement(observer, key).await];
    first.release().await.expect("release");
    for task in tasks {
        seen.push(
            tokio::time::timeout(BOUND, task)
                .await
                .expect("each task is served within its deadline")
                .expect("join"),
        );
    }
    seen
}

// On one thread, so that waiting for the tasks to reach the turn queue is exact (see `relay`).
#[tokio::test(flavor = "current_thread")]
async fn queued_local_tasks_inherit_the_session_with_one_statement() {
    let observer = observer().await;
    let stages = StageCounts::default();
    // A generous time bound: the first holder waits for the others to queue before it lets go.
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("handoff")).await)
        .handoff_limits(16, Duration::from_secs(10))
        .build_with_stage_hook(stages.hook());
    let key = key("handoff");
    let seen = relay(&locks, &stages, &observer, &key).await;
    // The same session held the lock for all three. Between two holders it ran one
    // statement, which only asked for its backend's pid (the handoff hearing from the
    // session): no unlock, no new lock. The two later holders never went to the server.
    assert!(seen.iter().all(|s| s.0 == seen[0].0), "{seen:?}");
    assert!(seen[0].2.contains("advisory"), "{seen:?}");
    for (before, after) in seen.iter().zip(&seen[1..]) {
        assert!(after.1 > before.1, "{seen:?}");
        assert_eq!(after.2, "SELECT pg_catalog.pg_backend_pid()", "{seen:?}");
    }
    assert_eq!(stages.count(Stage::Server, &key), 1);
    assert_eq!(stages.count(Stage::Register, &key), 3);
    assert_eq!(locks.held_lock_count(), 0);
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

#[tokio::test(flavor = "current_thread")]
async fn without_handoff_every_task_goes_to_the_server() {
    let observer = observer().await;
    let stages = StageCounts::default();
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("no-handoff")).await)
        .handoff_limits(0, Duration::ZERO)
        .build_with_stage_hook(stages.hook());
    let key = key("no-handoff");
    let seen = relay(&locks, &stages, &observer, &key).await;
    // Each holder took the lock with a statement of its own.
    assert_ne!(seen[0], seen[1], "{seen:?}");
    assert_ne!(seen[1], seen[2], "{seen:?}");
    assert_eq!(stages.count(Stage::Server, &key), 3);
}

/// A holder whose session the server has ended, unknown to the manager yet, is not told its
/// release was confirmed by handing the lock to the next task, and that task is not granted a
/// lock the server has given to someone else: the handoff first hears from the session.
// On one thread, so that waiting for the waiter to reach the turn queue is exact.
#[tokio::test(flavor = "current_thread")]
async fn a_handoff_from_a_session_the_server_ended_confirms_nothing() {
    let observer = observer().await;
    let stages = StageCounts::default();
    let app = app_name("handoff-ended");
    // No probe and no silence bound within the test: the manager cannot learn of the end
    // before the release asks the server.
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .handoff_limits(16, Duration::from_secs(10))
        .probe_interval(Duration::from_secs(600))
        .silence_timeout(Duration::ZERO)
        .build_with_stage_hook(stages.hook());
    let other = PostgresLockManager::new(pool_named(2, &app_name("handoff-other")).await);
    let key = key("handoff-ended");
    let first = locks.acquire(&key, None).await.expect("acquire");
    let waiter = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move { locks.acquire(&key, Some(BOUND)).await }
    });
    stages.wait_for(Stage::Turn, &key, 2).await;
    let rows = lock_rows(&observer, lock_id(&key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(rows[0].pid)
        .fetch_one(&observer)
        .await
        .expect("terminate");
    assert!(terminated, "the holder's backend was ended");
    common::eventually("the ended backend's lock is gone", || async {
        lock_rows(&observer, lock_id(&key)).await.is_empty()
    })
    .await;
    // The server let the lock go with the session: another manager takes it.
    let theirs = other
        .try_acquire(&key)
        .await
        .expect("try")
        .into_handle()
        .expect("the server freed the lock with its session");

    let released = first.release().await;
    assert!(
        matches!(released, Err(pglock::Error::ReleaseFailed { .. })),
        "a release confirmed after its session ended: {released:?}"
    );
    // The waiter goes to the server, where the other manager holds the key.
    let mut waiter = waiter;
    tokio::select! {
        granted = &mut waiter => panic!(
            "granted while another manager holds the key: {:?}",
            granted.expect("join").map(|guard| guard.info().clone())
        ),
        () = stages.wait_for(Stage::Server, &key, 2) => {}
    }
    theirs.release().await.expect("release");
    let guard = tokio::time::timeout(BOUND, waiter)
        .await
        .expect("the waiter is served once the key is free")
        .expect("join")
        .expect("acquire");
    guard.release().await.expect("release");
    assert_eq!(locks.held_lock_count(), 0);
    assert!(lock_rows(&observer, lock_id(&key)).await.is_empty());
}

/// What process B saw of A's relays.
#[derive(Debug, Clone, Copy)]
struct Wait {
    /// From B's asking to its grant: its try, its joining the server's queue, and its time
    /// there.
    asked: Duration,
    /// B's time in the server's queue, from the moment it was seen there; `None` when it was
    /// granted before it was seen (its wait was shorter than a look at `pg_locks`).
    queued: Option<Duration>,
    /// A's sections that began after B was seen in the server's queue, before its grant.
    ahead_once_queued: usize,
}

/// Four tasks of manager A hammer one key; process B asks for it once. `limits: None` keeps
/// the builder's defaults.
///
/// How long B waits from its asking depends on how fast it gets into the server's queue: its
/// try, then a wait session's set-up and its wait statement, round trips that a busy machine
/// can stretch to hundreds of milliseconds, while relays of a few milliseconds each come and
/// go. What the bounds promise starts once B is in that queue: the relay in progress then ends
/// within its bound, and its unlock grants B the lock before A can take it again. So B watches
/// `pg_locks` until its wait shows there, and counts A's sections from that moment.
async fn starvation(limits: Option<(u32, Duration)>) -> Wait {
    let key = key("starvation");
    let builder = PostgresLockManager::builder(pool_named(4, &app_name("hammer")).await);
    let a = match limits {
        Some((max_handoffs, max_hold)) => builder.handoff_limits(max_handoffs, max_hold),
        None => builder,
    }
    .build();
    let b_options = common::options(&app_name("starved"));
    let looker_options = common::options(&app_name("starved-looks"));
    let (b_pool, b, looker) = std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(async move {
                let options = sqlx::postgres::PgPoolOptions::new;
                let pool = options().max_connections(2).connect_lazy_with(b_options);
                let looker = options()
                    .max_connections(1)
                    .connect_lazy_with(looker_options);
                (pool.clone(), PostgresLockManager::new(pool), looker)
            })
    })
    .join()
    .expect("B's manager");
    let stop = Arc::new(AtomicBool::new(false));
    // A's sections, counted as each begins. While B holds the key none can begin, so the count
    // read when B is granted is final for its wait.
    let sections = Arc::new(AtomicUsize::new(0));
    let mut hammers = Vec::new();
    for _ in 0..4 {
        let (a, key, stop, sections) = (a.clone(), key.clone(), stop.clone(), sections.clone());
        hammers.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let guard = a.acquire(&key, None).await.expect("acquire");
                sections.fetch_add(1, Ordering::SeqCst);
                // A short critical section, as if it did a little I/O.
                tokio::time::sleep(Duration::from_millis(1)).await;
                guard.release().await.expect("release");
            }
        }));
    }
    // Make sure A is running its relay before B arrives.
    let warm = a.acquire(&key, None).await.expect("acquire");
    warm.release().await.expect("release");
    // B is another process: give it a thread and a runtime of its own, so A's busy tasks
    // cannot starve it of CPU, only (if the bound failed) of the lock.
    let counted = sections.clone();
    let waited = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            // B has been running for a while, as a process asking for a lock usually has: both
            // connections of its pool are open, and its lock session is set up.
            let (first, second) = tokio::join!(b_pool.acquire(), b_pool.acquire());
            let (mut first, mut second) = (first.expect("connect"), second.expect("connect"));
            let mut b_pids: Vec<i32> = Vec::new();
            for conn in [&mut *first, &mut *second] {
                let pid = sqlx::query_scalar("SELECT pg_backend_pid()")
                    .fetch_one(conn)
                    .await
                    .expect("pid");
                b_pids.push(pid);
            }
            drop((first, second));
            b.acquire(&common::key("warm-up"), None)
                .await
                .expect("an uncontended key")
                .release()
                .await
                .expect("release");
            let asked = Instant::now();
            let acquire = b.acquire(&key, Some(Duration::from_secs(30)));
            tokio::pin!(acquire);
            // B's wait, seen waiting in the server's queue on one of B's connections.
            let seen_queued = async {
                loop {
                    let rows = lock_rows(&looker, lock_id(&key)).await;
                    if rows.iter().any(|r| !r.granted && b_pids.contains(&r.pid)) {
                        return (Instant::now(), counted.load(Ordering::SeqCst));
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            };
            let (guard, queued) = tokio::select! {
                biased;
                guard = &mut acquire => (guard, None),
                queued = seen_queued => (acquire.await, Some(queued)),
            };
            let guard = guard.expect("B is served once A's relay reaches its bound");
            let wait = Wait {
                asked: asked.elapsed(),
                queued: queued.map(|(at, _)| at.elapsed()),
                ahead_once_queued: queued
                    .map_or(0, |(_, seen)| counted.load(Ordering::SeqCst) - seen),
            };
            guard.release().await.expect("release");
            wait
        })
    });
    let waited = tokio::task::spawn_blocking(move || waited.join().expect("B's thread"))
        .await
        .expect("join");

    stop.store(true, Ordering::Relaxed);
    for hammer in hammers {
        tokio::time::timeout(BOUND, hammer)
            .await
            .expect("a hammering task stops once told to")
            .expect("join");
    }
    waited
}

/// Waits of B behind A's relays under `limits`, printed: five at least, and more until three
/// were seen in the server's queue (up to twenty), since a wait shorter than a look at
/// `pg_locks` is not seen there, and the bounds below are asserted on those seen.
async fn waits(what: &str, limits: Option<(u32, Duration)>) -> Vec<Wait> {
    let mut waits = Vec::new();
    let seen = |waits: &[Wait]| waits.iter().filter(|w| w.queued.is_some()).count();
    while waits.len() < 5 || (seen(&waits) < 3 && waits.len() < 20) {
        waits.push(starvation(limits).await);
    }
    let from_asking = waits.iter().map(|w| w.asked).max().expect("waits");
    println!(
        "{what}: another process waited {waits:?} (at most {from_asking:?} from asking; \
         {} of {} seen in the server's queue)",
        seen(&waits),
        waits.len()
    );
    assert!(seen(&waits) > 0, "B was never seen in the server's queue");
    waits
}

/// Room on top of `max_hold` for B's time in the server's queue: the last section of the relay
/// (started just before `max_hold` ran out), the unlock that grants B, B's answer and its
/// wake-up, on a two-core machine running A's four tasks, B and the server, and busy with other
/// work besides. Larger than the bounds themselves: an unbounded relay leaves B waiting out its
/// 30 s deadline.
const ROOM: Duration = Duration::from_millis(250);

// One test for all three bounds, run one after the other: two hammering managers at once on
// a two-core machine would measure CPU contention, not the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bounds_limit_how_long_another_process_waits() {
    // The time bound alone: once B is in the server's queue, the relay in progress ends within
    // `max_hold` of its grant, however many sections it ran.
    let max_hold = Duration::from_millis(50);
    let waited = waits("time bound 50 ms", Some((u32::MAX, max_hold))).await;
    let longest = waited.iter().filter_map(|w| w.queued).max().expect("seen");
    assert!(
        longest < max_hold + ROOM,
        "B waited {longest:?} in the server's queue, more than {max_hold:?} + {ROOM:?}: \
         {waited:?}"
    );

    // The count bound alone: once B is in the server's queue, at most the rest of the relay in
    // progress, which has five sections at most (its grant and four handoffs), whatever the
    // machine's speed.
    let waited = waits("count bound 4", Some((4, Duration::from_secs(3600)))).await;
    let most = waited
        .iter()
        .map(|w| w.ahead_once_queued)
        .max()
        .expect("waits");
    assert!(
        most <= 4 + 1,
        "{most} of A's sections began after B was seen in the server's queue: {waited:?}"
    );

    // The defaults the guide documents: 16 handoffs or 10 ms, whichever comes first. Counted,
    // at most a relay of 17 sections; timed, as a bounded relay against an unbounded one.
    let waited = waits("default bounds", None).await;
    let most = waited
        .iter()
        .map(|w| w.ahead_once_queued)
        .max()
        .expect("waits");
    assert!(
        most <= 16 + 1,
        "{most} of A's sections began after B was seen in the server's queue: {waited:?}"
    );
    let longest = waited.iter().filter_map(|w| w.queued).max().expect("seen");
    let default_hold = Duration::from_millis(10);
    assert!(
        longest < default_hold + ROOM,
        "B waited {longest:?} in the server's queue, more than {default_hold:?} + {ROOM:?}: \
         {waited:?}"
    );
}
