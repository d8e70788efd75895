//! The verbs every primitive gained with one shape for all (lock sets' tries and shared scopes,
//! a semaphore's scoped permits, leadership's deadlines and its try), each dropped after every
//! number of polls, 0, 1, 2, ... until one call completes, through a concrete manager and
//! through `Arc<dyn LockManager>`: after every drop nothing is held (the manager's registry is
//! empty, another replica takes every key), and at the end no session of the pool holds a lock
//! or runs a statement. The same operations are also parked at each stage (turn, server,
//! register, unlock) of each of their keys and dropped there. The single-key verbs' own await
//! points: `locks_cancellation.rs`.

mod common;

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use common::hooked::BuildHooked;
use common::{app_name, assert_pool_clean, eventually, key, observer, pool_named};
use pglock::leader::LeaderElection;
use pglock::semaphore::Semaphore;
use pglock::{Attempt, LockManager, LockManagerExt, PostgresLockManager};
use pglock_testing::{Stage, StageHook};
use tokio::sync::Notify;

/// More polls than any call here needs: a call still pending after them has hung.
const MOST_POLLS: usize = 5_000;

/// A replica and its rival on pools of their own; the replica's pool's `application_name`.
async fn replicas(label: &str) -> (PostgresLockManager, PostgresLockManager, String) {
    let app = app_name(label);
    let ours = common::manager_for(pool_named(4, &app).await, &app).build();
    let rival = PostgresLockManager::new(pool_named(4, &app_name("rival")).await);
    (ours, rival, app)
}

/// Polls `future` at most `polls` times, yielding to the runtime between polls so its I/O
/// moves on; its output if it completed.
async fn poll_at_most<F: Future>(future: F, polls: usize) -> Option<F::Output> {
    let mut future = pin!(future);
    for _ in 0..polls {
        let polled = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
        if let Poll::Ready(output) = polled {
            return Some(output);
        }
        tokio::task::yield_now().await;
    }
    None
}

/// Drops `call()`'s future after 0, 1, 2, ... polls until one completes; `settled` must hold
/// after every drop and after the completed call.
async fn dropped_at_every_poll<C, F, S, SF>(what: &str, call: C, settled: S)
where
    C: Fn() -> F,
    F: Future,
    S: Fn() -> SF,
    SF: Future<Output = ()>,
{
    for polls in 0..MOST_POLLS {
        let done = poll_at_most(call(), polls).await.is_some();
        settled().await;
        if done {
            println!(
                "{what}: dropped after each of 0 to {} polls",
                polls.saturating_sub(1)
            );
            return;
        }
    }
    panic!("{what}: still pending after {MOST_POLLS} polls");
}

/// Nothing of `ours` holds any of `keys`: its registry is empty (dropped handles release in
/// the background) and the rival takes them all at once.
async fn nothing_held(
    ours: &PostgresLockManager,
    rival: &PostgresLockManager,
    keys: &[impl AsRef<str>],
) {
    let keys: Vec<&str> = keys.iter().map(AsRef::as_ref).collect();
    eventually("the dropped call's locks are let go", || async {
        ours.held_lock_count() == 0
    })
    .await;
    eventually("the rival takes every key", || async {
        match rival.try_acquire_all(&keys).await.expect("try") {
            Attempt::Acquired(set) => {
                set.release().await.expect("release");
                true
            }
            _ => false,
        }
    })
    .await;
}

#[tokio::test]
async fn set_tries_and_shared_scopes_dropped_at_every_poll_leave_nothing() {
    let (ours, rival, app) = replicas("cancel-sets").await;
    let port: Arc<dyn LockManager> = Arc::new(ours.clone());
    let keys = vec![
        key("cancel-set-0"),
        key("cancel-set-1"),
        key("cancel-set-2"),
    ];
    let settled = || nothing_held(&ours, &rival, &keys);
    let body = |_| async { tokio::task::yield_now().await };
    dropped_at_every_poll("try_acquire_all", || ours.try_acquire_all(&keys), settled).await;
    dropped_at_every_poll(
        "dyn try_acquire_all_shared",
        || port.try_acquire_all_shared(&keys),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "with_locks_shared",
        || ours.with_locks_shared(&keys, None, body),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "dyn with_locks_shared",
        || port.with_locks_shared(&keys, None, body),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "try_with_locks",
        || ours.try_with_locks(&keys, body),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "dyn try_with_locks",
        || port.try_with_locks(&keys, body),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "try_with_locks_shared",
        || ours.try_with_locks_shared(&keys, body),
        settled,
    )
    .await;
    dropped_at_every_poll("with_locks", || ours.with_locks(&keys, None, body), settled).await;
    let one = |_| async { tokio::task::yield_now().await };
    dropped_at_every_poll("with_lock", || ours.with_lock(&keys[0], None, one), settled).await;
    assert_pool_clean(&observer().await, &app).await;
}

#[tokio::test]
async fn scoped_permits_dropped_at_every_poll_leave_nothing() {
    let (ours, rival, app) = replicas("cancel-permits").await;
    let name = key("cancel-permits");
    let semaphore = Semaphore::builder(Arc::new(ours.clone()), &name, 2)
        .build()
        .expect("valid");
    let keys: Vec<String> = (0..2)
        .map(|slot| Semaphore::slot_key(&name, slot))
        .chain([Semaphore::turnstile_key(&name)])
        .collect();
    let settled = || nothing_held(&ours, &rival, &keys);
    let body = |_| async { tokio::task::yield_now().await };
    dropped_at_every_poll("with_permit", || semaphore.with_permit(None, body), settled).await;
    dropped_at_every_poll(
        "try_with_permit",
        || semaphore.try_with_permit(body),
        settled,
    )
    .await;
    dropped_at_every_poll("try_acquire", || semaphore.try_acquire(), settled).await;
    assert_pool_clean(&observer().await, &app).await;
}

#[tokio::test]
async fn leader_work_dropped_at_every_poll_leaves_the_term_as_it_was() {
    let (ours, _, _) = replicas("cancel-leader").await;
    let election = LeaderElection::builder(Arc::new(ours.clone()), key("cancel-leader"))
        .build()
        .expect("within a runtime");
    let term = election
        .wait_for_leadership(Some(Duration::from_secs(10)))
        .await
        .expect("leads");
    // A dropped call leaves the leadership alone, and keeps no lease on the term: resigning
    // at the end would otherwise wait for ever for a work that is gone.
    let settled = || async {
        assert_eq!(election.leader_info(), Some(term.clone()));
    };
    let work = |_| async { tokio::task::yield_now().await };
    let deadline = Some(Duration::from_secs(10));
    dropped_at_every_poll(
        "try_run_as_leader",
        || election.try_run_as_leader(work),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "run_as_leader",
        || election.run_as_leader(deadline, work),
        settled,
    )
    .await;
    dropped_at_every_poll(
        "wait_for_leadership",
        || election.wait_for_leadership(deadline),
        settled,
    )
    .await;
    let resigned = tokio::time::timeout(Duration::from_secs(10), election.resign()).await;
    assert!(
        resigned
            .expect("no dropped work holds the term")
            .expect("resign")
    );
    assert_eq!(ours.held_lock_count(), 0);
}

/// A hook that parks the `n`-th operation (from 0) that reaches `stage`, for ever: the test drops
/// it there. `reached` is told when it parks. Once the test is done with the operation
/// ([`Parking::done`]), nothing parks any more: the releases its drop left to the background
/// pass the stages too, and must not be parked.
struct Parking {
    reached: Arc<Notify>,
    armed: Arc<AtomicBool>,
}

impl Parking {
    fn done(&self) {
        self.armed.store(false, Ordering::SeqCst);
    }
}

fn park_nth(stage: Stage, n: usize) -> (StageHook, Parking) {
    let seen = Arc::new(AtomicUsize::new(0));
    let reached = Arc::new(Notify::new());
    let armed = Arc::new(AtomicBool::new(true));
    let (told, on) = (Arc::clone(&reached), Arc::clone(&armed));
    let hook: StageHook = Arc::new(move |at, _key| {
        let parked =
            on.load(Ordering::SeqCst) && at == stage && seen.fetch_add(1, Ordering::SeqCst) == n;
        let told = Arc::clone(&told);
        Box::pin(async move {
            if parked {
                told.notify_one();
                std::future::pending::<()>().await;
            }
        })
    });
    (hook, Parking { reached, armed })
}

/// Runs `operation` until it parks at its hook (then drops it there, and answers true) or ends
/// (false: it reaches the stage fewer than `n + 1` times).
async fn dropped_when_parked<F: Future>(operation: F, parking: &Parking) -> bool {
    let parked = async {
        tokio::select! {
            biased;
            () = parking.reached.notified() => true,
            _ = operation => false,
        }
    };
    let parked = tokio::time::timeout(Duration::from_secs(30), parked).await;
    parking.done();
    parked.expect("the operation parks or ends")
}

#[tokio::test]
async fn sets_and_permits_dropped_at_each_stage_of_each_key_leave_nothing() {
    let stages = [Stage::Turn, Stage::Server, Stage::Register, Stage::Unlock];
    let app = app_name("cancel-stages");
    let pool = pool_named(4, &app).await;
    let rival = PostgresLockManager::new(pool_named(4, &app_name("rival")).await);
    let mut parked = 0;
    for stage in stages {
        for n in 0..4 {
            for busy in [false, true] {
                let (hook, reached) = park_nth(stage, n);
                let ours = common::manager_for(pool.clone(), &app).build_with_stage_hook(hook);
                let keys = vec![key("stage-0"), key("stage-1"), key("stage-2")];
                // A key held by the rival makes the try give back what it took (its unlocks).
                let blocker = match busy {
                    true => Some(rival.acquire(&keys[2], None).await.expect("rival")),
                    false => None,
                };
                if dropped_when_parked(ours.try_acquire_all(&keys), &reached).await {
                    parked += 1;
                }
                drop(blocker);
                nothing_held(&ours, &rival, &keys).await;
            }
            let (hook, reached) = park_nth(stage, n);
            let ours = common::manager_for(pool.clone(), &app).build_with_stage_hook(hook);
            let keys = vec![key("stage-0"), key("stage-1"), key("stage-2")];
            let body = |_| async { tokio::task::yield_now().await };
            if dropped_when_parked(ours.with_locks_shared(&keys, None, body), &reached).await {
                parked += 1;
            }
            nothing_held(&ours, &rival, &keys).await;

            let (hook, reached) = park_nth(stage, n);
            let ours = common::manager_for(pool.clone(), &app).build_with_stage_hook(hook);
            let name = key("stage-permits");
            let semaphore = Semaphore::builder(Arc::new(ours.clone()), &name, 2)
                .build()
                .expect("valid");
            let permit_body = |_| async { tokio::task::yield_now().await };
            if dropped_when_parked(semaphore.with_permit(None, permit_body), &reached).await {
                parked += 1;
            }
            let keys = [
                Semaphore::turnstile_key(&name),
                Semaphore::slot_key(&name, 0),
                Semaphore::slot_key(&name, 1),
            ];
            nothing_held(&ours, &rival, &keys).await;
        }
    }
    println!("{parked} operations dropped while parked");
    assert!(parked >= 30, "only {parked} operations reached their stage");
    assert_pool_clean(&observer().await, &app).await;
}
