//! Transaction locks through a real PgBouncer in transaction pooling mode, started by the
//! tests: clients of the pooler exclude each other, a lock ends with its transaction (commit or
//! rollback), deadlines leave the transaction usable, tries do not wait, shared holders share.
//!
//! Everything sent through the pooler is unprepared (PgBouncer 1.18 cannot pool prepared
//! statements in transaction mode); `pg_locks` is read from the server directly.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::pgbouncer::{self, backend_pid, holders, waiters};
use common::{eventually, observer};
use pglock::{LockKey, TransactionLock};
use pglock_testing::{PoolMode, TempPgBouncer};
use sqlx::{PgPool, Postgres, Row, Transaction};
use tokio::time::{Instant, timeout};

/// Bounds every wait for a signal from another task.
const SIGNAL: Duration = Duration::from_secs(30);

fn key(label: &str) -> LockKey {
    LockKey::from(common::key(label))
}

async fn setup(label: &str, server_connections: u32) -> (TempPgBouncer, PgPool) {
    let bouncer = pgbouncer::start(PoolMode::Transaction, server_connections);
    let pool = pgbouncer::pool(&bouncer, 16, &common::app_name(label)).await;
    (bouncer, pool)
}

async fn scalar_text(tx: &mut Transaction<'static, Postgres>, sql: &'static str) -> String {
    sqlx::raw_sql(sql)
        .fetch_one(&mut **tx)
        .await
        .unwrap_or_else(|err| panic!("{sql}: {err}"))
        .get(0)
}

/// Read-modify-write of one counter row by many clients through the pooler, each increment in
/// a transaction that holds the key: no increment is lost, and the transactions ran on several
/// server connections (so the lock, not the pooler, kept them apart).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_the_pooler_exclude_each_other() {
    const CLIENTS: usize = 8;
    const ROUNDS: usize = 12;
    let (_bouncer, pool) = setup("xact-rmw", 4).await;
    let observer = observer().await;
    let table = format!("pglock_xact_counter_{}", uuid::Uuid::new_v4().simple());
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (n int NOT NULL); INSERT INTO {table} VALUES (0)"
    )))
    .execute(&observer)
    .await
    .expect("create the counter");
    let key = key("rmw");
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let (pool, key, table) = (pool.clone(), key.clone(), table.clone());
        clients.push(tokio::spawn(async move {
            let mut pids = BTreeSet::new();
            for _ in 0..ROUNDS {
                let mut tx = pool.begin().await.expect("begin");
                TransactionLock::exclusive(key.clone())
                    .acquire(&mut tx, Some(SIGNAL))
                    .await
                    .expect("acquire");
                let row = sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "SELECT n, pg_backend_pid() FROM {table}"
                )))
                .fetch_one(&mut *tx)
                .await
                .expect("read");
                let (n, pid): (i32, i32) = (row.get(0), row.get(1));
                pids.insert(pid);
                // A second round trip between the read and the write, so that unlocked
                // transactions would interleave here.
                backend_pid(&mut tx).await;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "UPDATE {table} SET n = {}",
                    n + 1
                )))
                .execute(&mut *tx)
                .await
                .expect("write");
                tx.commit().await.expect("commit");
            }
            pids
        }));
    }
    let mut pids = BTreeSet::new();
    for client in clients {
        let client_pids = timeout(Duration::from_secs(120), client)
            .await
            .expect("the clients finish")
            .expect("a client panicked");
        pids.extend(client_pids);
    }
    let n: i32 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT n FROM {table}")))
        .fetch_one(&observer)
        .await
        .expect("read the counter");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&observer)
        .await
        .expect("drop the counter");
    assert_eq!(n as usize, CLIENTS * ROUNDS, "increments were lost");
    assert!(
        pids.len() >= 2,
        "the transactions all ran on one server connection ({pids:?}), which proves nothing"
    );
    assert!(
        holders(&observer, &key).await.is_empty(),
        "nothing is held after the commits"
    );
}

/// How a holder's transaction ends.
#[derive(Debug, Clone, Copy)]
enum End {
    Commit,
    Rollback,
}

/// A waiter queues on the server behind the holder and is granted when the holder's
/// transaction ends, however it ends.
async fn a_waiter_is_granted_when_the_holder_ends(end: End) {
    let (_bouncer, pool) = setup("xact-end", 4).await;
    let observer = observer().await;
    let key = key("end");
    let mut holder = pool.begin().await.expect("begin");
    TransactionLock::exclusive(key.clone())
        .acquire(&mut holder, None)
        .await
        .expect("the key is free");
    let holder_pid = backend_pid(&mut holder).await;
    let waiter = tokio::spawn({
        let (pool, key) = (pool.clone(), key.clone());
        async move {
            let mut tx = pool.begin().await.expect("begin");
            TransactionLock::exclusive(key)
                .acquire(&mut tx, Some(SIGNAL))
                .await
                .expect("granted once the holder ends");
            let pid = backend_pid(&mut tx).await;
            (tx, pid)
        }
    });
    eventually("the waiter queues on the server", || async {
        waiters(&observer, &key).await == 1
    })
    .await;
    assert_eq!(
        holders(&observer, &key).await[0],
        (holder_pid, "ExclusiveLock".to_owned(), true)
    );
    match end {
        End::Commit => holder.commit().await.expect("commit"),
        End::Rollback => holder.rollback().await.expect("rollback"),
    }
    let (waiter_tx, waiter_pid) = timeout(SIGNAL, waiter)
        .await
        .expect("the waiter is granted")
        .expect("the waiter panicked");
    assert_ne!(waiter_pid, holder_pid);
    assert_eq!(
        holders(&observer, &key).await,
        vec![(waiter_pid, "ExclusiveLock".to_owned(), true)],
        "after the {end:?}, only the waiter holds the key"
    );
    waiter_tx.rollback().await.expect("rollback");
    assert!(holders(&observer, &key).await.is_empty());
}

#[tokio::test]
async fn a_commit_releases_the_lock() {
    a_waiter_is_granted_when_the_holder_ends(End::Commit).await;
}

#[tokio::test]
async fn a_rollback_releases_the_lock() {
    a_waiter_is_granted_when_the_holder_ends(End::Rollback).await;
}

/// The server ends the wait at the deadline; the waiter's transaction goes on, on the same
/// server connection, with its own `lock_timeout` as it was, and commits.
#[tokio::test]
async fn a_deadline_ends_the_wait_and_leaves_the_transaction_usable() {
    let (_bouncer, pool) = setup("xact-deadline", 4).await;
    let observer = observer().await;
    let key = key("deadline");
    let mut holder = pool.begin().await.expect("begin");
    TransactionLock::exclusive(key.clone())
        .acquire(&mut holder, None)
        .await
        .expect("the key is free");

    let mut tx = pool.begin().await.expect("begin");
    sqlx::raw_sql("SET LOCAL lock_timeout = '7s'")
        .execute(&mut *tx)
        .await
        .expect("set");
    let pid = backend_pid(&mut tx).await;
    let deadline = Duration::from_millis(300);
    let started = Instant::now();
    let lock = TransactionLock::exclusive(key.clone());
    let err = timeout(SIGNAL, lock.acquire(&mut tx, Some(deadline)))
        .await
        .expect("the server ends the wait")
        .expect_err("the key is held");
    let waited = started.elapsed();
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(err.key(), &key);
    assert!(waited >= deadline, "gave up after {waited:?}");
    assert!(
        waited < deadline + Duration::from_secs(2),
        "gave up after {waited:?}"
    );

    assert_eq!(scalar_text(&mut tx, "SHOW lock_timeout").await, "7s");
    assert_eq!(
        backend_pid(&mut tx).await,
        pid,
        "still the same transaction"
    );
    assert_eq!(holders(&observer, &key).await.len(), 1, "only the holder");
    tx.commit().await.expect("the transaction commits");
    holder.commit().await.expect("commit");
}

/// A try does not wait: refused while another client holds the key, with the transaction going
/// on, and granted once it is free.
#[tokio::test]
async fn a_try_does_not_wait() {
    let (_bouncer, pool) = setup("xact-try", 4).await;
    let observer = observer().await;
    let key = key("try");
    let lock = TransactionLock::exclusive(key.clone());
    let mut holder = pool.begin().await.expect("begin");
    assert!(lock.try_acquire(&mut holder).await.expect("try"));

    let mut tx = pool.begin().await.expect("begin");
    let started = Instant::now();
    let tried = timeout(SIGNAL, lock.try_acquire(&mut tx)).await;
    assert!(
        !tried.expect("a try answers").expect("try"),
        "held elsewhere"
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(waiters(&observer, &key).await, 0, "a try never queues");
    holder.commit().await.expect("commit");
    assert!(lock.try_acquire(&mut tx).await.expect("try"), "free now");
    let pid = backend_pid(&mut tx).await;
    assert_eq!(
        holders(&observer, &key).await,
        vec![(pid, "ExclusiveLock".to_owned(), true)]
    );
    tx.commit().await.expect("commit");
}

/// Shared holders hold the key together; an exclusive request waits for the last of them.
#[tokio::test]
async fn shared_holders_share_and_exclude_an_exclusive_one() {
    let (_bouncer, pool) = setup("xact-shared", 4).await;
    let observer = observer().await;
    let key = key("shared");
    let shared = TransactionLock::shared(key.clone());
    let exclusive = TransactionLock::exclusive(key.clone());
    let mut first = pool.begin().await.expect("begin");
    let mut second = pool.begin().await.expect("begin");
    shared
        .acquire(&mut first, Some(SIGNAL))
        .await
        .expect("shared");
    assert!(shared.try_acquire(&mut second).await.expect("try shared"));
    let granted = holders(&observer, &key).await;
    assert_eq!(granted.len(), 2, "{granted:?}");
    assert!(
        granted
            .iter()
            .all(|(_, mode, granted)| mode == "ShareLock" && *granted)
    );

    let mut third = pool.begin().await.expect("begin");
    assert!(!exclusive.try_acquire(&mut third).await.expect("try"));
    let waiting = tokio::spawn(async move {
        exclusive
            .acquire(&mut third, Some(SIGNAL))
            .await
            .expect("granted after the shared holders");
        third
    });
    eventually("the exclusive request queues", || async {
        waiters(&observer, &key).await == 1
    })
    .await;
    first.commit().await.expect("commit");
    // Still one shared holder: the exclusive request waits on.
    assert_eq!(waiters(&observer, &key).await, 1);
    assert!(!waiting.is_finished());
    second.commit().await.expect("commit");
    let third = timeout(SIGNAL, waiting)
        .await
        .expect("granted")
        .expect("panicked");
    assert_eq!(holders(&observer, &key).await[0].1, "ExclusiveLock");
    third.rollback().await.expect("rollback");
}

/// Every kind of key excludes across clients of the pooler, in its own key space.
#[tokio::test]
async fn every_kind_of_key_excludes_through_the_pooler() {
    let (_bouncer, pool) = setup("xact-keys", 4).await;
    let id = i64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap());
    let keys = [
        key("name"),
        LockKey::id(id),
        LockKey::pair((id >> 32) as i32, id as i32),
        LockKey::sqlx(common::key("sqlx")),
    ];
    for key in keys {
        let lock = TransactionLock::exclusive(key.clone());
        let mut holder = pool.begin().await.expect("begin");
        lock.acquire(&mut holder, None).await.expect("free");
        let mut other = pool.begin().await.expect("begin");
        assert!(!lock.try_acquire(&mut other).await.expect("try"), "{key}");
        holder.commit().await.expect("commit");
        assert!(lock.try_acquire(&mut other).await.expect("try"), "{key}");
        other.commit().await.expect("commit");
    }
}
