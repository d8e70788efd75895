//! A lock whose session dies is noticed, announced to its holder, and forgotten cleanly.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{app_name, eventually, key, lock_rows, observer, pool_named};
use pglock::{Error, InMemoryLockManager, LossCause, PostgresLockManager, lock_id};
use sqlx::PgPool;
use tokio::time::Instant;

const PROBE: Duration = Duration::from_millis(100);
/// How long a test waits for a signal before it fails instead of hanging.
const BOUND: Duration = Duration::from_secs(10);

/// The probe interval of the detection-latency test: long enough that a loss reported one
/// probe late (two intervals, 400 ms) stays far from one reported in time with room for a busy
/// two-core machine (the interval + 150 ms), which 100 ms could not keep apart.
const DETECTION_PROBE: Duration = Duration::from_millis(200);
/// Room on top of one detection interval for the slowest of the test's trials: the failed
/// ping's round trip, the monitor's and the test's wake-ups on a machine whose two cores are
/// busy with other work (seen up to 74 ms over the interval with the whole suite running).
/// Three quarters of the interval a missed probe would add: 50 ms short of it.
const DETECTION_ROOM: Duration = Duration::from_millis(150);

async fn watched_manager(label: &str) -> PostgresLockManager {
    watched_manager_probing(label, PROBE).await
}

async fn watched_manager_probing(label: &str, interval: Duration) -> PostgresLockManager {
    PostgresLockManager::builder(pool_named(4, &app_name(label)).await)
        .holder_id(label)
        .probe_interval(interval)
        .probe_grace(Duration::from_millis(300))
        .build()
}

/// Terminates the session holding `key` (without waiting for it to exit, so the caller can time
/// what follows from the moment the signal is sent).
async fn kill_holder(observer: &PgPool, key: &str) -> i32 {
    let pid = holder_pid(observer, key).await;
    terminate(observer, pid).await;
    pid
}

/// The backend holding `key`.
async fn holder_pid(observer: &PgPool, key: &str) -> i32 {
    let rows = lock_rows(observer, lock_id(key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    rows[0].pid
}

/// Terminates backend `pid`, without waiting for it to exit. Returns when the server sent it
/// the signal, by the server's clock (the machine's wall clock, which the test reads too).
async fn terminate(observer: &PgPool, pid: i32) -> chrono::DateTime<chrono::Utc> {
    let (terminated, at): (bool, chrono::DateTime<chrono::Utc>) =
        sqlx::query_as("SELECT pg_terminate_backend($1), clock_timestamp()")
            .bind(pid)
            .fetch_one(observer)
            .await
            .expect("terminate");
    assert!(terminated, "backend {pid} terminated");
    at
}

#[tokio::test]
async fn a_terminated_holder_is_reported_within_an_interval_every_time() {
    let observer = observer().await;
    let locks = watched_manager_probing("detect", DETECTION_PROBE).await;
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let trials = 100;
    let mut latencies = Vec::with_capacity(trials);
    for _ in 0..trials {
        let key = key("detect");
        let guard = locks.acquire(&key, None).await.expect("acquire");
        // The clock starts as the server signals the holder's backend, by the server's clock:
        // on a machine busy enough to hold the test's lookup or its kill statement up past the
        // first heartbeat, a clock started by the test would time the test's own delay, and see
        // the loss two intervals "after the kill".
        let pid = holder_pid(&observer, &key).await;
        let killed_at = terminate(&observer, pid).await;
        let cause = tokio::time::timeout(BOUND, guard.loss_signal().lost())
            .await
            .expect("the loss is signalled");
        let reported_at = chrono::Utc::now();
        latencies.push((reported_at - killed_at).to_std().unwrap_or_default());
        assert_eq!(cause, LossCause::NotOnServer);
        assert!(guard.loss_signal().is_lost());
        assert!(guard.loss_signal().token().is_cancelled());
        assert!(
            !locks.is_held(&key).await,
            "the registry forgot the lost lock"
        );

        // Someone else takes the lock; the lost guard's release must not touch it.
        let next = rival
            .acquire(&key, Some(Duration::from_secs(5)))
            .await
            .expect("rival");
        match guard.release().await {
            Err(Error::LockLost { key: named, cause }) => {
                assert_eq!(named, key);
                assert_eq!(cause, LossCause::NotOnServer);
            }
            other => panic!("expected LockLost, got {other:?}"),
        }
        let rows = lock_rows(&observer, lock_id(&key)).await;
        assert_eq!(rows.len(), 1, "the rival still holds it: {rows:?}");
        next.release().await.expect("rival release");
    }
    latencies.sort();
    let p50 = latencies[trials / 2];
    let max = latencies[trials - 1];
    println!(
        "detection latency over {trials} trials (probe interval {DETECTION_PROBE:?}): \
         min={:?} p50={p50:?} p90={:?} max={max:?}",
        latencies[0],
        latencies[trials * 9 / 10]
    );
    // Killed just after its grant, the holder's session is pinged one interval after it was
    // last heard: the loss comes one interval plus a round trip after the kill. A missed probe
    // (the loss reported by the next one) would show up as two intervals, 400 ms, in every
    // trial it happens in. Nine trials in ten within 50 ms of room; every one within
    // `DETECTION_ROOM`, still 50 ms short of a missed probe.
    let p90 = latencies[trials * 9 / 10];
    let typical = DETECTION_PROBE + Duration::from_millis(50);
    assert!(p90 <= typical, "p90 detection {p90:?} exceeds {typical:?}");
    let bound = DETECTION_PROBE + DETECTION_ROOM;
    assert!(max <= bound, "slowest detection {max:?} exceeds {bound:?}");
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn a_lost_lock_taken_with_try_acquire_leaves_the_registry() {
    let observer = observer().await;
    let locks = watched_manager("detect-try").await;
    let key = key("detect-try");
    common::hold(&locks, &key).await;
    kill_holder(&observer, &key).await;
    common::eventually("the lost lock leaves the registry", || async {
        !locks.is_held(&key).await
    })
    .await;
    assert_eq!(locks.held_lock_count(), 0);
    assert!(matches!(
        locks.release(&key).await,
        Err(Error::NotHeld { .. })
    ));
    // The manager is usable at once.
    common::hold(&locks, &key).await;
    locks.release(&key).await.expect("release");
}

#[tokio::test]
async fn a_lost_lock_on_a_session_of_its_own_leaves_the_lock_sessions_alone() {
    let observer = observer().await;
    let app = app_name("detect-one");
    let locks = common::manager_for(pool_named(4, &app).await, &app)
        .probe_interval(PROBE)
        .probe_grace(Duration::from_millis(300))
        .build();
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let (doomed, healthy) = (key("doomed"), key("healthy"));
    // `doomed` is contended, so it is waited for, and then held, on a session of its own.
    let rival_guard = rival.acquire(&doomed, None).await.expect("acquire");
    let waiting = tokio::spawn({
        let (locks, doomed) = (locks.clone(), doomed.clone());
        async move { locks.acquire(&doomed, None).await }
    });
    eventually("the waiter queues on the server", || async {
        lock_rows(&observer, lock_id(&doomed)).await.len() == 2
    })
    .await;
    rival_guard.release().await.expect("release");
    let doomed_guard = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("granted once the rival let go")
        .expect("join")
        .expect("acquire");
    let healthy_guard = locks.acquire(&healthy, None).await.expect("acquire");
    let (own, shared) = (
        lock_rows(&observer, lock_id(&doomed)).await[0].pid,
        lock_rows(&observer, lock_id(&healthy)).await[0].pid,
    );
    assert_ne!(own, shared, "two sessions");

    kill_holder(&observer, &doomed).await;
    tokio::time::timeout(BOUND, doomed_guard.loss_signal().lost())
        .await
        .expect("lost");
    // Three heartbeats later, the healthy lock, on a session of its own kind, is still held:
    // the time passing is what is tested.
    tokio::time::sleep(PROBE * 3).await;
    assert!(!healthy_guard.loss_signal().is_lost());
    assert!(locks.is_held(&healthy).await);
    healthy_guard.release().await.expect("release");
}

#[tokio::test]
async fn with_lock_cancels_its_body_when_the_lock_is_lost() {
    let observer = observer().await;
    let locks = watched_manager("with-lock").await;
    let key = key("with-lock");
    let progress = Arc::new(Mutex::new(Vec::new()));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let run = tokio::spawn({
        let (locks, key, progress) = (locks.clone(), key.clone(), progress.clone());
        async move {
            locks
                .with_lock(&key, None, |info| async move {
                    progress.lock().unwrap().push("started");
                    started_tx.send(info).expect("report the start");
                    std::future::pending::<()>().await;
                    progress.lock().unwrap().push("finished");
                })
                .await
        }
    });
    let info = tokio::time::timeout(BOUND, started_rx)
        .await
        .expect("the body starts")
        .expect("the body started");
    assert_eq!(info.key, key);
    kill_holder(&observer, &key).await;
    let result = tokio::time::timeout(BOUND, run)
        .await
        .expect("with_lock returns once the loss is seen")
        .expect("join");
    match result {
        Err(Error::LockLost { key: named, cause }) => {
            assert_eq!(named, key);
            assert_eq!(cause, LossCause::NotOnServer);
        }
        other => panic!("expected LockLost, got {other:?}"),
    }
    assert_eq!(
        *progress.lock().unwrap(),
        ["started"],
        "the body was cut short"
    );
    assert_eq!(locks.held_lock_count(), 0);
}

#[tokio::test]
async fn with_lock_releases_on_every_path() {
    let locks = watched_manager("with-lock-paths").await;
    let key = key("with-lock-paths");
    let value = locks
        .with_lock(&key, None, |info| async move { info.lock_id })
        .await
        .expect("with_lock");
    assert_eq!(value, lock_id(&key));
    assert_eq!(locks.held_lock_count(), 0);

    let failed: Result<(), &str> = locks
        .with_lock(&key, None, |_| async { Err("the body failed") })
        .await
        .expect("with_lock");
    assert_eq!(failed, Err("the body failed"));
    let again = locks
        .acquire(&key, Some(Duration::from_secs(5)))
        .await
        .expect("released");
    again.release().await.expect("release");

    // Cancelled from outside.
    let outcome = tokio::time::timeout(
        Duration::from_millis(50),
        locks.with_lock(&key, None, |_| std::future::pending::<()>()),
    )
    .await;
    assert!(outcome.is_err());
    let again = locks
        .acquire(&key, Some(Duration::from_secs(5)))
        .await
        .expect("released after cancellation");
    again.release().await.expect("release");

    // Not acquired (another task holds the key): the body never runs.
    let blocker = locks.acquire(&key, None).await.expect("acquire");
    let err = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            locks
                .with_lock(&key, Some(Duration::from_millis(20)), |_| async {
                    panic!("the body must not run without the lock")
                })
                .await
        }
    })
    .await
    .expect("join")
    .expect_err("held");
    assert!(err.is_timeout());
    blocker.release().await.expect("release");
}

#[tokio::test]
async fn the_in_memory_manager_can_simulate_a_loss() {
    let locks = InMemoryLockManager::new();
    let key = key("simulated");
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let run = tokio::spawn({
        let (locks, key) = (locks.clone(), key.clone());
        async move {
            locks
                .with_lock(&key, None, |_| async move {
                    started_tx.send(()).expect("report");
                    std::future::pending::<()>().await
                })
                .await
        }
    });
    tokio::time::timeout(BOUND, started_rx)
        .await
        .expect("the body starts")
        .expect("started");
    assert!(locks.simulate_loss(&key).await);
    let result = tokio::time::timeout(BOUND, run)
        .await
        .expect("with_lock returns once the loss is simulated")
        .expect("join");
    assert!(
        matches!(
            result,
            Err(Error::LockLost {
                cause: LossCause::Simulated,
                ..
            })
        ),
        "{result:?}"
    );
    assert!(!locks.simulate_loss(&key).await, "nothing left to lose");
    assert!(
        locks
            .try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_some(),
        "the lock was freed"
    );
}

/// How long `detection_can_be_switched_off` watches for a monitor that should not exist: fifty
/// of its probe intervals. A monitor left running connects and reports the loss within about
/// one.
const SWITCHED_OFF_WATCH: Duration = Duration::from_millis(500);

#[tokio::test]
async fn detection_can_be_switched_off() {
    let observer = observer().await;
    let app = app_name("no-detect");
    // A probe interval this short would connect and report the loss within milliseconds, so
    // the watch below would see it if switching detection off left any monitor running.
    let locks = PostgresLockManager::builder(pool_named(2, &app).await)
        .probe_interval(Duration::from_millis(10))
        .probe_grace(Duration::from_millis(10))
        .detect_lost_locks(false)
        .build();
    let key = key("no-detect");
    let guard = locks.acquire(&key, None).await.expect("acquire");
    let monitor = format!("{app}:pglock-monitor");
    kill_holder(&observer, &key).await;
    eventually("the terminated holder leaves the server", || async {
        lock_rows(&observer, lock_id(&key)).await.is_empty()
    })
    .await;
    // Nothing watches, so nothing notices: no monitor connects, the loss is never reported,
    // the registry still lists the lock.
    let watched_until = Instant::now() + SWITCHED_OFF_WATCH;
    while Instant::now() < watched_until {
        let sessions = common::sessions_of(&observer, &monitor).await;
        assert!(sessions.is_empty(), "a monitor connected: {sessions:?}");
        assert!(!guard.loss_signal().is_lost(), "the loss was reported");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(locks.is_held(&key).await);
    // The loss surfaces only at release.
    let err = guard.release().await.expect_err("the session is gone");
    assert!(matches!(err, Error::ReleaseFailed { .. }), "{err:?}");
}

#[tokio::test]
async fn held_locks_are_watched_through_their_own_sessions_with_no_connection_of_their_own() {
    // Each session holding locks is pinged when unheard for an interval; the pings are the
    // probe, so a process holding locks uses its lock sessions and one session per contended
    // lock it holds, and nothing else.
    let observer = observer().await;
    let app = app_name("connections");
    let locks = common::manager_for(pool_named(6, &app).await, &app)
        .probe_interval(Duration::from_millis(50))
        .build();
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let contended = key("connections-contended");
    let rival_guard = rival.acquire(&contended, None).await.expect("acquire");
    let waiting = tokio::spawn({
        let (locks, contended) = (locks.clone(), contended.clone());
        async move { locks.acquire(&contended, None).await }
    });
    eventually("the waiter queues on the server", || async {
        lock_rows(&observer, lock_id(&contended)).await.len() == 2
    })
    .await;
    rival_guard.release().await.expect("release");
    let waited = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("granted")
        .expect("join")
        .expect("acquire");
    let mut guards = vec![waited];
    for n in 0..100 {
        let guard = locks.acquire(&key(&format!("connections-{n}")), None).await;
        guards.push(guard.expect("acquire"));
    }
    // Several heartbeats.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let sessions = common::sessions_of(&observer, &app).await;
    println!(
        "101 locks held (one contended): {} server connections, {} of them lock sessions",
        sessions.len(),
        locks.lock_session_count()
    );
    assert_eq!(
        sessions.len(),
        locks.lock_session_count() + 1,
        "{sessions:?}"
    );
    assert!(guards.iter().all(|guard| !guard.loss_signal().is_lost()));
    for guard in guards {
        guard.release().await.expect("release");
    }
}

/// A lock whose session ends between the grant and its registration (the holder's backend is
/// terminated while the acquisition is parked just before registering) is reported lost once
/// it is registered: its session has ended already and will not end again, so nothing would
/// report it later.
#[tokio::test]
async fn a_session_that_ends_before_its_lock_is_registered_is_reported() {
    use common::hooked::BuildHooked as _;
    use pglock_testing::{Stage, pause_at};

    let observer = observer().await;
    let (hook, pause) = pause_at(Stage::Register);
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("unregistered")).await)
        .holder_id("unregistered")
        .probe_interval(PROBE)
        .probe_grace(Duration::from_millis(300))
        .build_with_stage_hook(hook);
    // A lock taken and let go first starts the loss monitor, which then waits for sessions'
    // ends: one that ends while the lock is parked unregistered finds nothing to report.
    let warm_up = async {
        pause.reached().await;
        pause.resume();
    };
    let (held, ()) = tokio::join!(locks.acquire(key("unregistered-first"), None), warm_up);
    held.expect("acquire").release().await.expect("release");
    pause.rearm();
    let key = key("unregistered");
    let steer = async {
        pause.reached().await;
        kill_holder(&observer, &key).await;
        // The session's end is known to the manager once it stops counting the session.
        eventually("the ended session is dropped", || async {
            locks.lock_session_count() == 0
        })
        .await;
        pause.resume();
    };
    let (acquired, ()) = tokio::join!(locks.acquire(&key, None), steer);
    let guard = acquired.expect("granted before its session ended");
    let cause = tokio::time::timeout(BOUND, guard.loss_signal().lost())
        .await
        .expect("the loss is signalled");
    assert!(
        matches!(cause, LossCause::NotOnServer | LossCause::SessionClosed),
        "{cause:?}"
    );
    assert!(!locks.is_held(&key).await, "the registry forgot it");
    assert!(
        guard.release().await.is_err(),
        "a lost lock's release says so"
    );
}
