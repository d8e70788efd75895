//! How far a waiter can be overtaken on a hot key. A wait in the server's queue is never
//! overtaken by a later arrival; a wait without a wait session can be, but only until one of
//! its manager's wait sessions is free: then it moves into the server's queue at once.

mod common;

use common::turnover::{Grants, Turnover};
use std::time::Duration;

use pglock::{PostgresLockManager, lock_id};

const BOUND: Duration = Duration::from_secs(60);

/// Ahead of a wait that has joined the server's queue: at most one wait of each of the three
/// other managers, each a grant and up to 16 in-process handoffs (the default handoff
/// limit), and the holder of the moment.
const QUEUED_BOUND: usize = 3 * 17 + 2;

/// Six callers on three managers (sqlx pools of 4: one wait session each) taking and giving
/// back `key` as fast as they can, counting their grants.
async fn turnover(key: &str) -> Turnover {
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let app = common::app_name("fair-turnover");
        let locks = common::manager_for(common::pool_named(4, &app).await, &app).build();
        for _ in 0..2 {
            let (locks, key) = (locks.clone(), key.to_owned());
            rounds.push(move |grants: Grants| {
                let (locks, key) = (locks.clone(), key.clone());
                async move {
                    let guard = locks.acquire(&key, Some(BOUND)).await.expect("acquire");
                    grants.granted();
                    tokio::task::yield_now().await;
                    guard.release().await.expect("release");
                }
            });
        }
    }
    Turnover::start(rounds).await
}

/// Whether a backend of `app` waits in the server's queue for `id`.
async fn queued_for(observer: &sqlx::PgPool, app: &str, id: i64) -> bool {
    let (classid, objid) = pglock::split_lock_id(id);
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND NOT l.granted AND l.classid::int8 = $1 \
         AND l.objid::int8 = $2 AND l.objsubid = 1 AND a.application_name = $3)",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(format!("pglock:{app}"))
    .fetch_one(observer)
    .await
    .expect("pg_locks")
}

/// Whether `app`'s listener has flagged a wait (a wait without a connection of its own).
async fn flagged(observer: &sqlx::PgPool, app: &str) -> bool {
    sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ShareLock' \
         AND a.application_name = $1)",
    )
    .bind(format!("pglock:{app}"))
    .fetch_one(observer)
    .await
    .expect("pg_locks")
}

/// A newcomer whose only wait session is taken waits for the hot key without one, and may be
/// overtaken meanwhile; once the wait session is free it joins the server's queue, and from
/// there at most [`QUEUED_BOUND`] grants go to others before its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_without_a_session_joins_the_queue_once_one_is_free() {
    let observer = common::observer().await;
    let hot = common::key("fair-hot");
    let turnover = turnover(&hot).await;
    // The newcomer: a pool of 3, so its cap of 3 leaves it one lock session, one wait
    // session and its listener.
    let app = common::app_name("fair-newcomer");
    let newcomer: PostgresLockManager =
        common::manager_for(common::pool_named(3, &app).await, &app).build();
    // Its wait session is taken by a wait for another key, held elsewhere.
    let other = common::key("fair-other");
    let holder_app = common::app_name("fair-holder");
    let holder = common::manager_for(common::pool_named(2, &holder_app).await, &holder_app).build();
    let held = holder.acquire(&other, None).await.expect("acquire");
    let first = tokio::spawn({
        let (locks, key) = (newcomer.clone(), other.clone());
        async move { locks.acquire(&key, Some(BOUND)).await }
    });
    common::eventually("the newcomer's first wait is in the server's queue", || {
        queued_for(&observer, &app, lock_id(&other))
    })
    .await;
    // The hot key's wait has no session: it is flagged, and polls.
    let arrived = turnover.grants();
    let mut second = tokio::spawn({
        let (locks, key) = (newcomer.clone(), hot.clone());
        async move { locks.acquire(&key, Some(BOUND)).await }
    });
    // (Or it was granted at once, in a gap between two of the others' holds.)
    common::eventually("the newcomer's second wait is flagged", || async {
        flagged(&observer, &app).await || second.is_finished()
    })
    .await;
    // Free the wait session: the first wait is granted, and lets go at once.
    held.release().await.expect("release");
    let granted = common::within("the first wait", first)
        .await
        .expect("task")
        .expect("granted");
    granted.release().await.expect("release");
    let freed = turnover.grants();
    // It joins the queue when the server queues its wait (or grants it without one): count
    // from there, as `semaphore_permits.rs` counts its newcomer.
    let joined = loop {
        let queued = queued_for(&observer, &app, lock_id(&hot)).await;
        let now = turnover.grants();
        if queued || second.is_finished() {
            break now;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let guard = common::within("the second wait", &mut second)
        .await
        .expect("task")
        .expect("granted");
    let passed = turnover.grants() - joined;
    guard.release().await.expect("release");
    turnover.stop().await;
    println!(
        "fairness: {} grants to others while the wait had no session, {} while it moved into \
         the server's queue, {passed} once there",
        freed - arrived,
        joined - freed
    );
    assert!(
        passed <= QUEUED_BOUND,
        "{passed} grants to others after the wait joined the server's queue"
    );
    // Moving in takes a wake-up and a statement: no more than one more round of the others.
    let after_free = joined - freed + passed;
    assert!(
        after_free <= 2 * QUEUED_BOUND,
        "{after_free} grants to others after the wait session was free"
    );
}
