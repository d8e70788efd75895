//! Lock-order cycles: callers inside critical sections waiting for each other's keys. A cycle
//! among one manager's callers fails at once, for exactly one of them, and the others go on;
//! waits that form no cycle never fail as deadlocks.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::child::{Reaped, instruction, role};
use futures::StreamExt;
use pglock::{Error, InMemoryLockManager, LockKey, LockManager, LockManagerExt};
use tokio::sync::Barrier;
use tokio::time::Instant;

const ROLE: &str = "pglock-cycle-peer=";

type Manager = Arc<dyn LockManager>;

async fn postgres() -> Manager {
    let app = common::app_name("cycles");
    Arc::new(common::manager_for(common::pool_named(4, &app).await, &app).build())
}

/// A manager that probes for cycles through other managers after `probe_after`, checking
/// every 10 ms.
async fn probing(probe_after: Duration) -> Manager {
    let app = common::app_name("cycles");
    let pool = common::pool_named(4, &app).await;
    Arc::new(
        common::manager_for(pool, &app)
            .deadlock_timeout(probe_after)
            .wait_poll_interval(Duration::from_millis(10))
            .build(),
    )
}

/// The server's `deadlock_timeout`, which the managers probe after by default.
async fn server_deadlock_timeout() -> Duration {
    let ms: i64 = sqlx::query_scalar(
        "SELECT (extract(epoch FROM current_setting('deadlock_timeout')::interval) * 1000)::int8",
    )
    .fetch_one(&common::observer().await)
    .await
    .expect("deadlock_timeout");
    Duration::from_millis(ms as u64)
}

fn memory() -> Manager {
    Arc::new(InMemoryLockManager::new())
}

/// Inside a section on `first`, once the other caller holds its own first key, waits for
/// `second` with no deadline. Returns what the section returned.
async fn transfer(
    locks: Manager,
    first: String,
    second: String,
    both_hold: Arc<Barrier>,
) -> pglock::Result<()> {
    let inner = Arc::clone(&locks);
    locks
        .with_lock(first.as_str(), None, |_| async move {
            both_hold.wait().await;
            inner.with_lock(second.as_str(), None, |_| async {}).await
        })
        .await?
}

/// Exactly one of two outcomes is the deadlock, naming both keys; the other completed.
fn one_victim(outcomes: [pglock::Result<()>; 2], a: &str, b: &str) {
    let victims: Vec<&Error> = outcomes.iter().filter_map(|o| o.as_ref().err()).collect();
    assert_eq!(victims.len(), 1, "exactly one caller fails: {outcomes:?}");
    match victims[0] {
        Error::Deadlock { key, cycle } => {
            let mut keys: Vec<String> = cycle.iter().map(LockKey::to_string).collect();
            keys.sort();
            let mut expected = vec![a.to_owned(), b.to_owned()];
            expected.sort();
            assert_eq!(keys, expected, "the cycle names both keys");
            assert_eq!(cycle.first(), Some(key), "starting with the key asked for");
        }
        other => panic!("expected a deadlock, got {other:?}"),
    }
}

/// Two tasks of one manager, each inside a section on one key, ask for the other's key.
async fn two_tasks(locks: Manager) {
    let (a, b) = (common::key("cycle-a"), common::key("cycle-b"));
    let both_hold = Arc::new(Barrier::new(2));
    let first = tokio::spawn(transfer(
        Arc::clone(&locks),
        a.clone(),
        b.clone(),
        Arc::clone(&both_hold),
    ));
    let second = tokio::spawn(transfer(
        Arc::clone(&locks),
        b.clone(),
        a.clone(),
        both_hold,
    ));
    let (first, second) =
        common::within("the cycle is broken", async { tokio::join!(first, second) }).await;
    one_victim([first.expect("task"), second.expect("task")], &a, &b);
    assert_eq!(locks.held_lock_count(), 0);
}

/// The same between two sibling futures of one task.
async fn two_siblings(locks: Manager) {
    let (a, b) = (common::key("cycle-a"), common::key("cycle-b"));
    let both_hold = Arc::new(Barrier::new(2));
    let outcomes = common::within("the cycle is broken", async {
        tokio::join!(
            transfer(
                Arc::clone(&locks),
                a.clone(),
                b.clone(),
                Arc::clone(&both_hold)
            ),
            transfer(Arc::clone(&locks), b.clone(), a.clone(), both_hold),
        )
    })
    .await;
    one_victim([outcomes.0, outcomes.1], &a, &b);
    assert_eq!(locks.held_lock_count(), 0);
}

/// Three tasks in a ring, a -> b -> c -> a: one fails, two finish.
async fn three_in_a_ring(locks: Manager) {
    let keys: Vec<String> = (0..3).map(|i| common::key(&format!("ring-{i}"))).collect();
    let all_hold = Arc::new(Barrier::new(3));
    let tasks: Vec<_> = (0..3)
        .map(|i| {
            tokio::spawn(transfer(
                Arc::clone(&locks),
                keys[i].clone(),
                keys[(i + 1) % 3].clone(),
                Arc::clone(&all_hold),
            ))
        })
        .collect();
    let outcomes = common::within("the ring is broken", futures::future::join_all(tasks)).await;
    let failed = outcomes
        .into_iter()
        .map(|o| o.expect("task"))
        .filter(|o| matches!(o, Err(Error::Deadlock { cycle, .. }) if cycle.len() == 3))
        .count();
    assert_eq!(failed, 1, "exactly one member of the ring fails");
    assert_eq!(locks.held_lock_count(), 0);
}

/// 200 sections over 8 keys, each taking a second key greater than its first (one order for
/// everyone, so no cycle can form) while others wait: no wait is ever called a deadlock.
async fn ordered_storm(locks: Manager) {
    ordered_storm_on(vec![locks]).await;
}

/// The same, the sections spread over `managers` in turn, each holding its second key for
/// `hold`.
async fn ordered_storm_on(managers: Vec<Manager>) {
    ordered_storm_holding(managers, Duration::ZERO).await;
}

async fn ordered_storm_holding(managers: Vec<Manager>, hold: Duration) {
    let timeouts = ordered_storm_racing(managers, hold, Duration::from_secs(60)).await;
    assert_eq!(timeouts, 0, "no deadline is near");
}

/// The ordered storm with `deadline` on the inner waits: returns how many timed out. Every
/// other outcome but success fails the storm.
async fn ordered_storm_racing(managers: Vec<Manager>, hold: Duration, deadline: Duration) -> usize {
    let keys: Vec<String> = (0..8).map(|i| common::key(&format!("storm-{i}"))).collect();
    let (done, timeouts) = (AtomicUsize::new(0), AtomicUsize::new(0));
    futures::stream::iter(0..200usize)
        .for_each_concurrent(24, |n| {
            let (locks, keys) = (Arc::clone(&managers[n % managers.len()]), &keys);
            let (done, timeouts) = (&done, &timeouts);
            async move {
                let first = n % 7;
                let second = first + 1 + (n / 7) % (7 - first);
                let inner = Arc::clone(&locks);
                let outcome = locks
                    .with_lock(keys[first].as_str(), Some(Duration::from_secs(60)), |_| {
                        let second = keys[second].clone();
                        async move {
                            tokio::task::yield_now().await;
                            inner
                                .with_lock(second.as_str(), Some(deadline), |_| {
                                    tokio::time::sleep(hold)
                                })
                                .await
                        }
                    })
                    .await;
                match outcome.and_then(|inner| inner) {
                    Ok(()) => {}
                    Err(err) if err.is_timeout() => {
                        timeouts.fetch_add(1, Ordering::SeqCst);
                    }
                    Err(err) => panic!("section {n} failed: {err:?}"),
                }
                done.fetch_add(1, Ordering::SeqCst);
            }
        })
        .await;
    assert_eq!(done.load(Ordering::SeqCst), 200);
    timeouts.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_between_two_tasks_fails_one_at_once_on_postgres() {
    two_tasks(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_between_two_tasks_fails_one_at_once_in_memory() {
    two_tasks(memory()).await;
}

#[tokio::test]
async fn a_cycle_between_sibling_futures_fails_one_at_once_on_postgres() {
    two_siblings(postgres().await).await;
}

#[tokio::test]
async fn a_cycle_between_sibling_futures_fails_one_at_once_in_memory() {
    two_siblings(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_of_three_loses_exactly_one_on_postgres() {
    three_in_a_ring(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_of_three_loses_exactly_one_in_memory() {
    three_in_a_ring(memory()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_waits_are_never_called_deadlocks_on_postgres() {
    ordered_storm(postgres().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_waits_are_never_called_deadlocks_in_memory() {
    ordered_storm(memory()).await;
}

/// Two managers of one process, each inside a section on one key, ask for the other's key
/// with no deadline: one fails within twice the server's `deadlock_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_between_two_managers_fails_one_within_two_deadlock_timeouts() {
    let bound = 2 * server_deadlock_timeout().await;
    let (first, second) = (postgres().await, postgres().await);
    let (a, b) = (common::key("cycle-a"), common::key("cycle-b"));
    let both_hold = Arc::new(Barrier::new(3));
    let one = tokio::spawn(transfer(
        first,
        a.clone(),
        b.clone(),
        Arc::clone(&both_hold),
    ));
    let other = tokio::spawn(transfer(
        second,
        b.clone(),
        a.clone(),
        Arc::clone(&both_hold),
    ));
    both_hold.wait().await;
    let closed = Instant::now();
    let mut one = std::pin::pin!(one);
    let mut other = std::pin::pin!(other);
    let first_out = common::within("the cycle is broken", async {
        tokio::select! {
            out = &mut one => (out.expect("task"), true),
            out = &mut other => (out.expect("task"), false),
        }
    })
    .await;
    let broken_after = closed.elapsed();
    let rest = common::within("the survivor finishes", async {
        if first_out.1 { other.await } else { one.await }
    })
    .await
    .expect("task");
    println!("two managers: the cycle was broken {broken_after:?} after it closed");
    assert!(
        first_out.0.is_err(),
        "the first to end is the victim: {:?}",
        first_out.0
    );
    one_victim([first_out.0, rest], &a, &b);
    assert!(
        broken_after <= bound,
        "broken after {broken_after:?}, over {bound:?}"
    );
}

/// The same between two processes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_between_two_processes_fails_one_within_two_deadlock_timeouts() {
    const TEST: &str = "a_cycle_between_two_processes_fails_one_within_two_deadlock_timeouts";
    if let Some(spec) = role(ROLE) {
        // The peer: inside a section on b, once told, it asks for a.
        let (b, a) = spec.split_once('|').expect("b|a");
        let locks = postgres().await;
        let inner = Arc::clone(&locks);
        let outcome = locks
            .with_lock(b, None, |_| async move {
                println!("\nHOLDS b");
                tokio::task::spawn_blocking(instruction)
                    .await
                    .expect("stdin");
                inner.with_lock(a, None, |_| async {}).await
            })
            .await
            .and_then(|inner| inner);
        match outcome {
            Ok(()) => println!("\nOUTCOME completed"),
            Err(Error::Deadlock { .. }) => println!("\nOUTCOME deadlock"),
            Err(err) => println!("\nOUTCOME {err:?}"),
        }
        return;
    }
    let bound = 2 * server_deadlock_timeout().await;
    let (a, b) = (common::key("cycle-a"), common::key("cycle-b"));
    let (mut peer, output) = Reaped::spawn(TEST, ROLE, &format!("{b}|{a}"));
    output.until("HOLDS b");
    let locks = postgres().await;
    let inner = Arc::clone(&locks);
    let (closed, mine) = common::within("the cycle is broken", async {
        locks
            .with_lock(a.as_str(), None, |_| async {
                peer.tell("go");
                let closed = Instant::now();
                (
                    closed,
                    inner.with_lock(b.as_str(), None, |_| async {}).await,
                )
            })
            .await
            .expect("a section on a")
    })
    .await;
    let theirs = output.until("OUTCOME");
    let broken_after = closed.elapsed();
    println!(
        "two processes: {mine:?} here, {theirs} there, {broken_after:?} after the cycle closed"
    );
    let deadlocks = usize::from(matches!(mine, Err(Error::Deadlock { .. })))
        + usize::from(theirs.contains("OUTCOME deadlock"));
    assert_eq!(deadlocks, 1, "exactly one side fails as a deadlock");
    assert!(
        mine.is_ok() || theirs.contains("OUTCOME completed"),
        "the other completes: {mine:?}, {theirs}"
    );
    assert!(
        broken_after <= bound + Duration::from_millis(500),
        "took {broken_after:?}"
    );
}

/// The ordered storm over two managers probing after 5 ms, every section holding its second
/// key for 5 ms: probes run all the time between waits that form chains but no cycle, and
/// none of them is ever called a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ordered_waits_across_managers_are_never_called_deadlocks() {
    let managers = vec![
        probing(Duration::from_millis(5)).await,
        probing(Duration::from_millis(5)).await,
    ];
    ordered_storm_holding(managers, Duration::from_millis(5)).await;
}

/// The same storm with inner deadlines as short as the holds, so waits time out while probes
/// about them are on their way: timeouts, and never a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_timing_out_while_probed_are_never_called_deadlocks() {
    let managers = vec![
        probing(Duration::from_millis(2)).await,
        probing(Duration::from_millis(2)).await,
    ];
    let timeouts = ordered_storm_racing(
        managers,
        Duration::from_millis(10),
        Duration::from_millis(8),
    )
    .await;
    println!("{timeouts} of 200 inner waits timed out");
    assert!(timeouts > 0, "the deadlines race the holds");
}

/// Two in-memory managers on one server, each inside a section on one key, ask for the other's
/// key with no deadline: one fails within twice PostgreSQL's default `deadlock_timeout`, as
/// between replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cycle_between_two_in_memory_managers_fails_one_within_two_seconds() {
    let server = pglock::InMemoryLockServer::new();
    let on_server =
        || -> Manager { Arc::new(InMemoryLockManager::builder().server(&server).build()) };
    let (a, b) = (common::key("cycle-a"), common::key("cycle-b"));
    let both_hold = Arc::new(Barrier::new(3));
    let one = tokio::spawn(transfer(
        on_server(),
        a.clone(),
        b.clone(),
        Arc::clone(&both_hold),
    ));
    let other = tokio::spawn(transfer(
        on_server(),
        b.clone(),
        a.clone(),
        Arc::clone(&both_hold),
    ));
    both_hold.wait().await;
    let closed = Instant::now();
    let (one, other) =
        common::within("the cycle is broken", async { tokio::join!(one, other) }).await;
    let broken_after = closed.elapsed();
    one_victim([one.expect("task"), other.expect("task")], &a, &b);
    assert!(
        broken_after <= Duration::from_secs(2),
        "took {broken_after:?}"
    );
}

/// Sections that only nest locks nobody else holds cost no listener: the manager's only
/// connection is its lock session.
#[tokio::test]
async fn uncontended_nested_sections_open_no_listener() {
    let app = common::app_name("cycles-quiet");
    let locks = common::manager_for(common::pool_named(4, &app).await, &app).build();
    let (a, b) = (common::key("quiet-a"), common::key("quiet-b"));
    let observer = common::observer().await;
    let inner = locks.clone();
    let connections = locks
        .with_lock(a.as_str(), None, |_| async {
            inner
                .with_lock(b.as_str(), None, |_| async {
                    sqlx::query_scalar::<_, i64>(
                        "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
                    )
                    .bind(format!("pglock:{app}"))
                    .fetch_one(&observer)
                    .await
                    .expect("pg_stat_activity")
                })
                .await
        })
        .await
        .expect("outer")
        .expect("inner");
    assert_eq!(connections, 1, "the lock session only");
}

/// Inside a section on `first`, once `go` says so, waits for `second` with no deadline.
async fn transfer_when_told(
    locks: Manager,
    first: String,
    second: String,
    holds: tokio::sync::oneshot::Sender<()>,
    go: tokio::sync::oneshot::Receiver<()>,
) -> pglock::Result<()> {
    let inner = Arc::clone(&locks);
    locks
        .with_lock(first.as_str(), None, |_| async move {
            let _ = holds.send(());
            go.await.expect("told to ask");
            inner.with_lock(second.as_str(), None, |_| async {}).await
        })
        .await?
}

/// A ring of three managers, member `i` holding key `i` and asking for key `i + 1`, the asks
/// made one at a time in `order` (each once the previous one waits on the server): the last
/// to ask, the youngest wait, is the victim, and the other two complete. Probes run every
/// 50 ms, so the other waits have probed round the ring many times before it closes.
async fn youngest_fails(order: [usize; 3]) {
    let observer = common::observer().await;
    let mut managers = Vec::new();
    for _ in 0..3 {
        managers.push(probing(Duration::from_millis(50)).await);
    }
    let keys: Vec<String> = (0..3).map(|i| common::key(&format!("ring-{i}"))).collect();
    let (mut tasks, mut gos) = (Vec::new(), Vec::new());
    for i in 0..3 {
        let (holds, held) = tokio::sync::oneshot::channel();
        let (go, told) = tokio::sync::oneshot::channel();
        tasks.push(tokio::spawn(transfer_when_told(
            Arc::clone(&managers[i]),
            keys[i].clone(),
            keys[(i + 1) % 3].clone(),
            holds,
            told,
        )));
        held.await.expect("the member holds its key");
        gos.push(Some(go));
    }
    for &i in &order[..2] {
        gos[i].take().expect("once").send(()).expect("told");
        common::eventually_waiting("the ask waits on the server", &observer, &keys[(i + 1) % 3])
            .await;
    }
    let youngest = order[2];
    gos[youngest].take().expect("once").send(()).expect("told");
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(
            common::within("the ring is broken", task)
                .await
                .expect("task"),
        );
    }
    for (i, outcome) in outcomes.iter().enumerate() {
        if i == youngest {
            assert!(
                matches!(outcome, Err(Error::Deadlock { .. })),
                "member {i}, the youngest wait of {order:?}, fails: {outcomes:?}"
            );
        } else {
            assert!(
                outcome.is_ok(),
                "member {i} of {order:?} completes: {outcomes:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_youngest_wait_of_a_cycle_through_managers_is_its_victim() {
    // Each member in turn closes the ring, so no fixed manager or key order can pass.
    for order in [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]] {
        youngest_fails(order).await;
    }
}
