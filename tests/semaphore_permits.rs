//! Semaphores on PostgreSQL, as users write code around them: a newcomer is not starved while
//! permits keep turning over (measured), permits carry their slot's fencing token, and sibling
//! futures, nested permits and a shutdown through `select!` take what they should and leak
//! nothing. The contract itself runs on both managers in the conformance suite; several
//! processes in `tests/semaphore_processes.rs`.

mod common;

use common::turnover::{Grants, Turnover};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::StreamExt;
use pglock::semaphore::{Permit, Semaphore};
use pglock::{FencingTable, LockManager, PostgresLockManager};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

const BOUND: Duration = Duration::from_secs(30);

async fn manager(label: &str, connections: u32) -> PostgresLockManager {
    let app = common::app_name(label);
    common::manager_for(common::pool_named(connections, &app).await, &app).build()
}

fn semaphore(locks: PostgresLockManager, name: &str, permits: usize) -> Semaphore {
    let locks: Arc<dyn LockManager> = Arc::new(locks);
    Semaphore::builder(locks, name, permits)
        .build()
        .expect("a valid semaphore")
}

/// Six callers on three managers take and give back two permits as fast as they can; a
/// seventh, on a manager of its own, arrives while they do. It must get a permit after a
/// bounded number of grants to the others: it waits in the turnstile's queue, and the callers
/// that keep coming back queue behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_is_not_starved_while_permits_turn_over() {
    let name = common::key("semaphore-fair");
    let turnover = turnover(&name).await;
    let app = common::app_name("semaphore-fair-new");
    let newcomer = common::manager_for(common::pool_named(2, &app).await, &app).build();
    warm_up(&newcomer).await;
    let newcomer = semaphore(newcomer, &name, 2);
    let called = turnover.grants();
    let mut waiting = tokio::spawn(async move { newcomer.acquire(Some(BOUND)).await });
    // It arrives when the server queues its wait for the turnstile (or when it is granted
    // the turnstile without waiting): count from there, not from the call.
    let observer = common::observer().await;
    let arrived = loop {
        let queued = queued_behind(&observer, &format!("pglock:{app}")).await;
        let now = turnover.grants();
        if queued {
            break now;
        }
        if waiting.is_finished() {
            break called;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let permit = (&mut waiting)
        .await
        .expect("the newcomer")
        .expect("the newcomer gets a permit while the others keep coming back");
    let passed = turnover.grants() - arrived;
    permit.release().await.expect("release");
    turnover.stop().await;
    eprintln!(
        "semaphore fairness: {passed} grants to others between the newcomer's arrival and its permit"
    );
    // Ahead of it in the server's queue: at most one turn at the turnstile of each of the
    // three other managers, each a grant and up to 16 in-process handoffs (the managers'
    // default handoff limit), then one of the two permits out.
    assert!(
        passed <= 3 * 17 + 2,
        "the newcomer waited through {passed} grants to others"
    );
}

/// Six callers on three managers taking and giving back the two permits of semaphore `name`
/// as fast as they can, counting the permits they get.
async fn turnover(name: &str) -> Turnover {
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let semaphore = semaphore(manager("semaphore-fair", 4).await, name, 2);
        for _ in 0..2 {
            let semaphore = semaphore.clone();
            rounds.push(move |grants: Grants| {
                let semaphore = semaphore.clone();
                async move {
                    let permit = semaphore.acquire(Some(BOUND)).await.expect("a permit");
                    grants.granted();
                    tokio::task::yield_now().await;
                    permit.release().await.expect("release");
                }
            });
        }
    }
    Turnover::start(rounds).await
}

/// Permits go in arrival order: four callers on managers of their own (as four processes)
/// arrive one after the other while the only permit is out; each gives its permit back as soon
/// as it has it, and they get it in the order they came. (Callers that merely polled the slots
/// would get it in whatever order their polls fell, the latest comer polling most often.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_go_in_arrival_order() {
    let name = common::key("semaphore-order");
    let holder = semaphore(manager("semaphore-order", 2).await, &name, 1);
    let permit = holder.acquire(Some(BOUND)).await.expect("free");
    let observer = common::observer().await;
    let (order_tx, mut order) = tokio::sync::mpsc::unbounded_channel();
    let mut callers = tokio::task::JoinSet::new();
    for caller in 0..4 {
        let app = common::app_name("semaphore-order");
        let locks = common::manager_for(common::pool_named(2, &app).await, &app).build();
        warm_up(&locks).await;
        let semaphore = semaphore(locks.clone(), &name, 1);
        let order_tx = order_tx.clone();
        callers.spawn(async move {
            let permit = semaphore.acquire(Some(BOUND)).await.expect("a permit");
            order_tx.send(caller).expect("the test listens");
            permit.release().await.expect("release");
        });
        // In line: the first at the turnstile, the others queued behind it at the server.
        let tag = format!("pglock:{app}");
        let turnstile = pglock::LockKey::name(Semaphore::turnstile_key(&name));
        common::eventually("the caller is in line", || async {
            if caller == 0 {
                locks.is_held(&turnstile).await
            } else {
                queued_behind(&observer, &tag).await
            }
        })
        .await;
    }
    permit.release().await.expect("release");
    let mut seen = Vec::new();
    for _ in 0..4 {
        seen.push(
            common::within("the next caller's permit", order.recv())
                .await
                .expect("sent"),
        );
    }
    while let Some(caller) = callers.join_next().await {
        caller.expect("a caller");
    }
    assert_eq!(seen, [0, 1, 2, 3]);
}

/// Whether a session tagged `application_name` waits for an advisory lock.
async fn queued_behind(observer: &sqlx::PgPool, application_name: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND NOT l.granted AND a.application_name = $1)",
    )
    .bind(application_name)
    .fetch_one(observer)
    .await
    .expect("read pg_locks")
}

/// Opens the sessions a manager waits with (its lock session, a wait session), so that its
/// first wait in the measurement starts at once rather than after connecting.
async fn warm_up(locks: &PostgresLockManager) {
    let key = common::key("semaphore-warm-up");
    let other = manager("semaphore-warm-up", 2).await;
    let held = other.acquire(&key, None).await.expect("free");
    let waited = locks.acquire(&key, Some(Duration::from_millis(50))).await;
    assert!(waited.expect_err("held elsewhere").is_timeout());
    held.release().await.expect("release");
}

/// A permit carries its slot's fencing token: each slot's tokens increase with every permit on
/// it, and a permit's token is the slot lock's.
#[tokio::test]
async fn permits_carry_their_slots_fencing_tokens() {
    let app = common::app_name("semaphore-fenced");
    let locks = common::manager_for(common::pool_named(4, &app).await, &app)
        .fencing(FencingTable::default())
        .build();
    let semaphore = semaphore(locks, &common::key("semaphore-fenced"), 2);
    let mut last = [0_i64; 2];
    for _ in 0..4 {
        let first = semaphore.acquire(Some(BOUND)).await.expect("a permit");
        let second = semaphore.acquire(Some(BOUND)).await.expect("a permit");
        for permit in [&first, &second] {
            let token = permit
                .info()
                .fencing_token
                .expect("a fenced manager mints tokens");
            assert!(
                token > last[permit.slot()],
                "slot {} token {token} after {}",
                permit.slot(),
                last[permit.slot()]
            );
            last[permit.slot()] = token;
        }
        first.release().await.expect("release");
        second.release().await.expect("release");
    }
}

/// `for_each_concurrent` in one task: sibling futures share three permits, never more than
/// three inside at once, and all three are used.
#[tokio::test]
async fn sibling_futures_share_the_permits() {
    let semaphore = semaphore(
        manager("semaphore-siblings", 6).await,
        &common::key("sib"),
        3,
    );
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    let (all_in_tx, all_in) = watch::channel(false);
    futures::stream::iter(0..40)
        .for_each_concurrent(12, |_| async {
            let permit = semaphore.acquire(Some(BOUND)).await.expect("a permit");
            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            if now == 3 {
                all_in_tx.send_replace(true);
            }
            // The first ones in wait until all three permits are out, so the test shows they
            // can be; a semaphore that let only one in would never get there.
            let mut all_in = all_in.clone();
            tokio::time::timeout(BOUND, all_in.wait_for(|all| *all))
                .await
                .expect("three inside at once")
                .expect("the sender lives");
            inside.fetch_sub(1, Ordering::SeqCst);
            permit.release().await.expect("release");
        })
        .await;
    assert_eq!(most.load(Ordering::SeqCst), 3);
}

/// A permit holder that asks for a second permit of the same semaphore inside its permit's
/// work gets another slot, not an error; with no other slot free, it waits until its deadline.
#[tokio::test]
async fn a_permit_holder_may_take_a_second_permit() {
    let semaphore = semaphore(
        manager("semaphore-nested", 4).await,
        &common::key("nest"),
        2,
    );
    let first = semaphore.acquire(Some(BOUND)).await.expect("a permit");
    let slots = first
        .run(async {
            let second = semaphore
                .acquire(Some(BOUND))
                .await
                .expect("the other slot");
            let none = semaphore.acquire(Some(Duration::from_millis(100))).await;
            assert!(none.is_err(), "both permits are out");
            let slot = second.slot();
            second.release().await.expect("release");
            slot
        })
        .await
        .expect("the first permit is held throughout");
    assert_ne!(slots, first.slot());
    first.release().await.expect("release");
}

/// Waiting callers stopped by a shutdown signal through `select!`, as a service's tasks are,
/// leave no permit and no place in line behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_through_select_leaves_nothing_behind() {
    let locks = manager("semaphore-shutdown", 6).await;
    let semaphore = semaphore(locks.clone(), &common::key("shutdown"), 2);
    let held: Vec<Permit> = vec![
        semaphore.acquire(Some(BOUND)).await.expect("a permit"),
        semaphore.acquire(Some(BOUND)).await.expect("a permit"),
    ];
    let shutdown = CancellationToken::new();
    let mut waiting = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let (semaphore, shutdown) = (semaphore.clone(), shutdown.clone());
        waiting.spawn(async move {
            tokio::select! {
                permit = semaphore.acquire(None) => Some(permit),
                () = shutdown.cancelled() => None,
            }
        });
    }
    let turnstile = pglock::LockKey::name(Semaphore::turnstile_key(semaphore.name()));
    common::eventually("a waiter stands at the turnstile", || {
        locks.is_held(&turnstile)
    })
    .await;
    shutdown.cancel();
    while let Some(stopped) = waiting.join_next().await {
        assert!(stopped.expect("a waiter").is_none(), "no permit was free");
    }
    drop(held);
    let again = [
        semaphore
            .acquire(Some(BOUND))
            .await
            .expect("a permit given back"),
        semaphore
            .acquire(Some(BOUND))
            .await
            .expect("a permit given back"),
    ];
    assert_eq!(
        locks.held_lock_count(),
        2,
        "only the two new permits are held"
    );
    drop(again);
}
