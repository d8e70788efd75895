//! `TransactionLock` futures dropped at their await points. A call is one message; once sent,
//! the server runs it to its end and sqlx finishes it before the connection's next statement.
//! So a dropped call leaves the transaction without the lock or holding it (until the
//! transaction ends), and never with a changed setting, a savepoint, or aborted.

mod common;

use std::future::{Future, ready};
use std::pin::pin;
use std::time::Duration;

use common::pgbouncer::{backend_pid, holders, waiters};
use common::{eventually, observer, pool};
use pglock::{LockKey, TransactionLock};
use sqlx::{PgConnection, PgPool, Postgres, Row, Transaction};
use tokio::time::{Instant, timeout};

const SIGNAL: Duration = Duration::from_secs(30);

fn key(label: &str) -> LockKey {
    LockKey::from(common::key(label))
}

async fn show_lock_timeout(tx: &mut PgConnection) -> String {
    sqlx::raw_sql("SHOW lock_timeout")
        .fetch_one(tx)
        .await
        .expect("the transaction is usable")
        .get(0)
}

/// A transaction with a local `lock_timeout` of 7s, to see that nothing changes it.
async fn transaction(pool: &PgPool) -> Transaction<'static, Postgres> {
    let mut tx = pool.begin().await.expect("begin");
    sqlx::raw_sql("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .expect("set");
    tx
}

/// Polls `call` once and drops it: its message is sent, its answer (usually) not read. On a
/// busy machine the server can answer before the client reads, and the call completes in that
/// one poll; the state it leaves is the same either way, which is what the tests check.
async fn drop_after_one_poll<T>(call: impl Future<Output = T>) {
    let mut call = pin!(call);
    tokio::select! {
        biased;
        _ = &mut call => {}
        () = ready(()) => {}
    }
}

/// Drops `call` once the server shows it waiting for `key`.
async fn drop_while_queued<T: std::fmt::Debug>(
    observer: &PgPool,
    key: &LockKey,
    call: impl Future<Output = T>,
) {
    tokio::select! {
        outcome = call => panic!("the key is held, yet the call ended: {outcome:?}"),
        () = eventually("the call queues on the server", || async {
            waiters(observer, key).await == 1
        }) => {}
    }
}

#[tokio::test]
async fn a_call_dropped_before_it_is_polled_sends_nothing() {
    let pool = pool(2).await;
    let observer = observer().await;
    let key = key("unpolled");
    let lock = TransactionLock::exclusive(key.clone());
    let mut tx = transaction(&pool).await;
    drop(lock.acquire(&mut tx, None));
    drop(lock.try_acquire(&mut tx));
    assert_eq!(show_lock_timeout(&mut tx).await, "7s");
    assert!(holders(&observer, &key).await.is_empty());
    tx.commit().await.expect("commit");
}

/// Dropped in the server's queue while the holder keeps the key: the wait goes on until its
/// deadline, the transaction's next statement runs after it, and finds the transaction as it
/// was, without the lock.
#[tokio::test]
async fn a_wait_dropped_in_the_queue_ends_at_its_deadline_and_leaves_nothing() {
    let pool = pool(3).await;
    let observer = observer().await;
    let key = key("queued-timeout");
    let lock = TransactionLock::exclusive(key.clone());
    let mut holder = pool.begin().await.expect("begin");
    lock.acquire(&mut holder, None).await.expect("free");
    let mut tx = transaction(&pool).await;
    let deadline = Duration::from_millis(500);
    let started = Instant::now();
    drop_while_queued(&observer, &key, lock.acquire(&mut tx, Some(deadline))).await;

    assert_eq!(show_lock_timeout(&mut tx).await, "7s");
    let waited = started.elapsed();
    assert!(
        waited >= deadline,
        "the next statement ran after the wait: {waited:?}"
    );
    assert!(waited < deadline + Duration::from_secs(5), "{waited:?}");
    let pid = backend_pid(&mut tx).await;
    assert!(
        holders(&observer, &key)
            .await
            .iter()
            .all(|(holder, _, _)| *holder != pid),
        "the dropped wait timed out: nothing held"
    );
    tx.commit().await.expect("the transaction commits");
    holder.commit().await.expect("commit");
}

/// Dropped in the queue, then the holder lets go: the server grants the wait, and the
/// transaction holds the key until it ends. With or without a deadline.
#[tokio::test]
async fn a_wait_dropped_in_the_queue_may_still_be_granted_to_the_transaction() {
    let pool = pool(3).await;
    let observer = observer().await;
    for deadline in [Some(SIGNAL), None] {
        let key = key("queued-granted");
        let lock = TransactionLock::exclusive(key.clone());
        let mut holder = pool.begin().await.expect("begin");
        lock.acquire(&mut holder, None).await.expect("free");
        let mut tx = transaction(&pool).await;
        drop_while_queued(&observer, &key, lock.acquire(&mut tx, deadline)).await;
        holder.commit().await.expect("commit");

        let next = timeout(SIGNAL, show_lock_timeout(&mut tx)).await;
        assert_eq!(next.expect("the next statement runs"), "7s", "{deadline:?}");
        let pid = backend_pid(&mut tx).await;
        assert_eq!(
            holders(&observer, &key).await,
            vec![(pid, "ExclusiveLock".to_owned(), true)],
            "{deadline:?}"
        );
        tx.rollback().await.expect("rollback");
        assert!(holders(&observer, &key).await.is_empty(), "{deadline:?}");
    }
}

/// A try or a wait dropped after its message went out still runs on the server: on a free
/// key, the transaction holds it afterwards; on a held one, nothing changes.
#[tokio::test]
async fn a_call_dropped_after_its_message_went_out_still_runs() {
    let pool = pool(3).await;
    let observer = observer().await;
    for bounded in [false, true] {
        let key = key("sent");
        let lock = TransactionLock::exclusive(key.clone());
        let mut tx = transaction(&pool).await;
        if bounded {
            drop_after_one_poll(lock.acquire(&mut tx, Some(SIGNAL))).await;
        } else {
            drop_after_one_poll(lock.try_acquire(&mut tx)).await;
        }
        assert_eq!(show_lock_timeout(&mut tx).await, "7s");
        let pid = backend_pid(&mut tx).await;
        assert_eq!(
            holders(&observer, &key).await,
            vec![(pid, "ExclusiveLock".to_owned(), true)],
            "bounded: {bounded}"
        );

        let mut other = transaction(&pool).await;
        drop_after_one_poll(lock.acquire(&mut other, Some(Duration::from_millis(50)))).await;
        drop_after_one_poll(lock.try_acquire(&mut other)).await;
        assert_eq!(show_lock_timeout(&mut other).await, "7s");
        other
            .commit()
            .await
            .expect("neither aborted the transaction");
        tx.commit().await.expect("commit");
    }
}
