//! A lock whose session dies is noticed, announced to its holder, and forgotten cleanly.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{app_name, eventually, key, lock_rows, observer, pool_named};
use pglock::{
    Error, InMemoryLockManager, LockManager, LockManagerExt, LossCause, PostgresLockManager,
    lock_id,
};
use sqlx::PgPool;
use tokio::time::Instant;

const PROBE: Duration = Duration::from_millis(100);
/// How long a test waits for a signal before it fails instead of hanging.
const BOUND: Duration = Duration::from_secs(10);

async fn watched_manager(label: &str) -> PostgresLockManager {
    PostgresLockManager::builder(pool_named(4, &app_name(label)).await)
        .holder_id(label)
        .probe_interval(PROBE)
        .probe_grace(Duration::from_millis(300))
        .build()
}

/// Terminates the session holding `key` (without waiting for it to exit, so the caller can time
/// what follows from the moment the signal is sent).
async fn kill_holder(observer: &PgPool, key: &str) -> i32 {
    let rows = lock_rows(observer, lock_id(key)).await;
    assert_eq!(rows.len(), 1, "{rows:?}");
    let pid = rows[0].pid;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .fetch_one(observer)
        .await
        .expect("terminate");
    assert!(terminated, "backend {pid} terminated");
    pid
}

#[tokio::test]
async fn a_terminated_holder_is_reported_within_an_interval_every_time() {
    let observer = observer().await;
    let locks = watched_manager("detect").await;
    let rival = PostgresLockManager::new(pool_named(2, &app_name("rival")).await);
    let trials = 100;
    let mut latencies = Vec::with_capacity(trials);
    for _ in 0..trials {
        let key = key("detect");
        let guard = locks.acquire(&key, None).await.expect("acquire");
        let killed_at = Instant::now();
        kill_holder(&observer, &key).await;
        let cause = tokio::time::timeout(BOUND, guard.loss_signal().lost())
            .await
            .expect("the loss is signalled");
        latencies.push(killed_at.elapsed());
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
        "detection latency over {trials} trials (probe interval {PROBE:?}): min={:?} p50={p50:?} max={max:?}",
        latencies[0]
    );
    // One interval plus a round trip, with room for a noisy CI machine; a missed probe would
    // show up as about two intervals.
    let bound = PROBE + Duration::from_millis(50);
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
    // Wait for a probe that started after the loss was declared: the healthy lock passed it.
    let declared: chrono::DateTime<chrono::Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
        .fetch_one(&observer)
        .await
        .expect("clock");
    let monitor = format!("{app}:pglock-monitor");
    eventually("the monitor probes again", || async {
        let last: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
            "SELECT max(query_start) FROM pg_stat_activity WHERE application_name = $1",
        )
        .bind(&monitor)
        .fetch_one(&observer)
        .await
        .expect("query");
        last.is_some_and(|last| last > declared)
    })
    .await;
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
        locks.try_acquire(&key).await.expect("try").is_some(),
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

/// Waits (bounded) until the monitor of the pool named `app` has one connection, and returns
/// its server pid.
async fn monitor_pid(observer: &sqlx::PgPool, app: &str) -> i32 {
    let monitor = format!("{app}:pglock-monitor");
    common::eventually("the monitor connects", || async {
        common::sessions_of(observer, &monitor).await.len() == 1
    })
    .await;
    common::sessions_of(observer, &monitor).await[0].pid
}

#[tokio::test]
async fn the_monitor_has_its_own_named_connection_only_while_locks_are_held() {
    let observer = observer().await;
    let app = app_name("monitor-name");
    let locks = PostgresLockManager::builder(pool_named(2, &app).await)
        .probe_interval(Duration::from_millis(20))
        .build();
    let monitor = format!("{app}:pglock-monitor");
    let guard = locks
        .acquire(&key("monitor-name"), None)
        .await
        .expect("acquire");
    monitor_pid(&observer, &app).await;
    guard.release().await.expect("release");
    common::eventually("the monitor disconnects once nothing is held", || async {
        common::sessions_of(&observer, &monitor).await.is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_probe_that_fails_once_loses_nothing() {
    // A failed probe (here: its connection ended) leaves the locks unknown, not lost: only
    // locks unconfirmed for interval + grace are declared lost, and the next probe, on a new
    // connection, confirms these.
    let observer = observer().await;
    let app = app_name("probe-fails-once");
    let locks = PostgresLockManager::builder(pool_named(2, &app).await)
        .probe_interval(Duration::from_millis(100))
        .probe_grace(Duration::from_secs(5))
        .build();
    let monitor = format!("{app}:pglock-monitor");
    let guard = locks
        .acquire(&key("probe-fails-once"), None)
        .await
        .expect("acquire");
    let first = monitor_pid(&observer, &app).await;
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&observer)
        .await
        .expect("end the monitor's connection");
    assert!(terminated);
    common::eventually("the monitor reconnects after its failed probe", || async {
        common::sessions_of(&observer, &monitor)
            .await
            .iter()
            .any(|session| session.pid != first)
    })
    .await;
    assert!(
        !guard.loss_signal().is_lost(),
        "declared lost on one failed probe"
    );
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_lock_taken_again_and_again_keeps_one_monitor_connection() {
    // The monitor stays for five idle probe intervals: a workload that takes and releases a
    // lock over and over, with gaps shorter than that, keeps one monitor connection instead of
    // a new one (a whole authentication handshake) every time it holds a lock again.
    let observer = observer().await;
    let app = app_name("monitor-kept");
    let interval = Duration::from_millis(50);
    let locks = PostgresLockManager::builder(pool_named(2, &app).await)
        .probe_interval(interval)
        .build();
    let mut pids = std::collections::HashSet::new();
    for round in 0..12 {
        let guard = locks
            .acquire(&key(&format!("monitor-kept-{round}")), None)
            .await
            .expect("acquire");
        pids.insert(monitor_pid(&observer, &app).await);
        guard.release().await.expect("release");
        // Idle for two intervals: the monitor sees nothing held at a tick or two.
        tokio::time::sleep(interval * 2).await;
    }
    assert_eq!(pids.len(), 1, "one monitor connection throughout: {pids:?}");
}

#[tokio::test]
async fn the_monitor_connects_before_its_first_probe_is_due() {
    // The first probe must cost one round trip, like the others, for a loss to be reported
    // within an interval plus a round trip: so the monitor opens its connection as it starts,
    // not when the first probe is due.
    let observer = observer().await;
    let app = app_name("monitor-early");
    let interval = Duration::from_secs(5);
    let locks = PostgresLockManager::builder(pool_named(2, &app).await)
        .probe_interval(interval)
        .build();
    let monitor = format!("{app}:pglock-monitor");
    let guard = locks
        .acquire(&key("monitor-early"), None)
        .await
        .expect("acquire");
    let acquired = Instant::now();
    loop {
        if common::sessions_of(&observer, &monitor).await.len() == 1 {
            break;
        }
        assert!(
            acquired.elapsed() < interval / 2,
            "no monitor connection half an interval after the first lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    guard.release().await.expect("release");
}
