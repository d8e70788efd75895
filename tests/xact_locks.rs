//! `TransactionLock` on PostgreSQL directly: each key lands in its key space, transaction and
//! session locks of the same key exclude each other, a connection outside a transaction is
//! refused with nothing locked, and nothing of the call stays in the caller's transaction.
//! (Through PgBouncer: `tests/pooler_xact_locks.rs`.)

mod common;

use std::time::Duration;

use common::pgbouncer::{backend_pid, holders, waiters};
use common::{observer, pool};
use pglock::{Error, LockKey, PostgresLockManager, TransactionLock};
use sqlx::{Acquire, PgConnection, Row};
use tokio::time::{Instant, timeout};

/// Bounds every call that must not wait.
const SIGNAL: Duration = Duration::from_secs(30);

fn key(label: &str) -> LockKey {
    LockKey::from(common::key(label))
}

/// A random 64-bit id, so concurrent test runs do not share raw ids.
fn random_id() -> i64 {
    i64::from_le_bytes(uuid::Uuid::new_v4().as_bytes()[..8].try_into().unwrap())
}

async fn show_lock_timeout(tx: &mut PgConnection) -> String {
    sqlx::raw_sql("SHOW lock_timeout")
        .fetch_one(tx)
        .await
        .expect("SHOW lock_timeout")
        .get(0)
}

async fn sqlstate_of(tx: &mut PgConnection, sql: &'static str) -> Option<String> {
    let err = sqlx::raw_sql(sql).execute(tx).await.err()?;
    err.as_database_error()
        .and_then(|db| db.code())
        .map(|code| code.into_owned())
}

#[tokio::test]
async fn each_key_lands_in_its_key_space_and_mode() {
    let pool = pool(2).await;
    let observer = observer().await;
    let id = random_id();
    let keys = [
        key("space"),
        LockKey::id(id),
        LockKey::id(i64::MIN),
        LockKey::pair(-1, (id >> 33) as i32),
        LockKey::sqlx(common::key("space-sqlx")),
    ];
    for key in keys {
        for (lock, mode) in [
            (TransactionLock::exclusive(key.clone()), "ExclusiveLock"),
            (TransactionLock::shared(key.clone()), "ShareLock"),
        ] {
            let mut tx = pool.begin().await.expect("begin");
            lock.acquire(&mut tx, Some(Duration::from_secs(10)))
                .await
                .unwrap_or_else(|err| panic!("{key}: {err}"));
            let pid = backend_pid(&mut tx).await;
            assert_eq!(
                holders(&observer, &key).await,
                vec![(pid, mode.to_owned(), true)],
                "{key} {mode}"
            );
            tx.commit().await.expect("commit");
            assert!(holders(&observer, &key).await.is_empty(), "{key}");
        }
    }
}

/// `pg_advisory_xact_lock(bigint)` and `(int, int)` are two key spaces: the same 64 bits in
/// each are two locks.
#[tokio::test]
async fn a_pair_and_an_id_with_the_same_bits_are_two_locks() {
    let pool = pool(2).await;
    let id = random_id();
    let pair = LockKey::pair((id >> 32) as i32, id as i32);
    assert_eq!(pair.target().packed(), id);
    let mut first = pool.begin().await.expect("begin");
    let mut second = pool.begin().await.expect("begin");
    TransactionLock::exclusive(id)
        .acquire(&mut first, None)
        .await
        .expect("free");
    assert!(
        TransactionLock::exclusive(pair)
            .try_acquire(&mut second)
            .await
            .expect("try")
    );
    assert!(
        !TransactionLock::exclusive(id)
            .try_acquire(&mut second)
            .await
            .expect("try")
    );
}

#[tokio::test]
async fn transaction_and_session_locks_of_a_key_exclude_each_other() {
    let pool = pool(4).await;
    let locks = PostgresLockManager::new(pool.clone());
    let name = common::key("session");
    let lock = TransactionLock::exclusive(name.as_str());

    let guard = locks.acquire(&name, None).await.expect("free");
    let mut tx = pool.begin().await.expect("begin");
    assert!(
        !lock.try_acquire(&mut tx).await.expect("try"),
        "held by the manager"
    );
    guard.release().await.expect("release");
    assert!(lock.try_acquire(&mut tx).await.expect("try"), "released");
    assert!(
        locks
            .try_acquire(&name)
            .await
            .expect("try")
            .into_handle()
            .is_none(),
        "held by the transaction"
    );
    tx.commit().await.expect("commit");
    assert!(
        locks
            .try_acquire(&name)
            .await
            .expect("try")
            .into_handle()
            .is_some()
    );
}

/// In autocommit a transaction lock would be released as soon as it was granted: every call
/// refuses, with a typed error naming the key, and locks nothing.
#[tokio::test]
async fn a_connection_outside_a_transaction_is_refused() {
    let pool = pool(2).await;
    let observer = observer().await;
    let key = key("autocommit");
    let lock = TransactionLock::exclusive(key.clone());
    let mut conn = pool.acquire().await.expect("connection");
    let outcomes = [
        lock.acquire(&mut conn, None).await.err(),
        lock.acquire(&mut conn, Some(Duration::from_secs(1)))
            .await
            .err(),
        lock.acquire(&mut conn, Some(Duration::ZERO)).await.err(),
        lock.try_acquire(&mut conn).await.err(),
    ];
    for outcome in outcomes {
        let err = outcome.expect("refused");
        assert!(matches!(err, Error::NotInTransaction { .. }), "{err:?}");
        assert_eq!(err.key(), &key);
        assert!(err.to_string().contains("not in a transaction"), "{err}");
    }
    assert!(holders(&observer, &key).await.is_empty());
}

/// The check is the server's, so a transaction begun with a hand-written `BEGIN` counts.
#[tokio::test]
async fn a_transaction_begun_by_hand_is_accepted() {
    let pool = pool(2).await;
    let observer = observer().await;
    let key = key("begin");
    let mut conn = pool.acquire().await.expect("connection");
    sqlx::raw_sql("BEGIN")
        .execute(&mut *conn)
        .await
        .expect("begin");
    TransactionLock::exclusive(key.clone())
        .acquire(&mut conn, Some(Duration::from_secs(5)))
        .await
        .expect("in a transaction");
    assert_eq!(holders(&observer, &key).await.len(), 1);
    sqlx::raw_sql("COMMIT")
        .execute(&mut *conn)
        .await
        .expect("commit");
    assert!(holders(&observer, &key).await.is_empty());
}

/// Granted, timed out or tried, the call leaves the transaction's `lock_timeout` as it was
/// (a local one inside, the session's after), and no savepoint of its own.
#[tokio::test]
async fn nothing_of_the_call_stays_in_the_transaction() {
    let pool = pool(2).await;
    let key = key("settings");
    let mut holder = pool.begin().await.expect("begin");
    let mut conn = pool.acquire().await.expect("connection");
    // Two messages: a `SET` in the message of a `BEGIN` would belong to the transaction.
    sqlx::raw_sql("SET lock_timeout = '3s'")
        .execute(&mut *conn)
        .await
        .expect("the session's setting");
    sqlx::raw_sql("BEGIN; SET LOCAL lock_timeout = '7s'")
        .execute(&mut *conn)
        .await
        .expect("the transaction's setting");
    let free = TransactionLock::exclusive(common::key("free"));
    let held = TransactionLock::exclusive(key.clone());
    held.acquire(&mut holder, None).await.expect("free");

    free.acquire(&mut conn, Some(Duration::from_secs(5)))
        .await
        .expect("granted");
    assert_eq!(show_lock_timeout(&mut conn).await, "7s", "after a grant");
    let err = held
        .acquire(&mut conn, Some(Duration::from_millis(50)))
        .await
        .expect_err("held");
    assert!(err.is_timeout(), "{err:?}");
    assert_eq!(show_lock_timeout(&mut conn).await, "7s", "after a timeout");
    assert!(!held.try_acquire(&mut conn).await.expect("try"));
    assert_eq!(show_lock_timeout(&mut conn).await, "7s", "after a try");
    assert_eq!(
        sqlstate_of(&mut conn, "RELEASE SAVEPOINT pglock_in_transaction").await,
        Some("3B001".to_owned()),
        "no savepoint of ours is left (3B001: no such savepoint)"
    );
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut *conn)
        .await
        .expect("rollback");
    assert_eq!(
        show_lock_timeout(&mut conn).await,
        "3s",
        "the session's own"
    );
    sqlx::raw_sql("RESET lock_timeout")
        .execute(&mut *conn)
        .await
        .expect("reset");
}

#[tokio::test]
async fn a_zero_deadline_is_one_try() {
    let pool = pool(2).await;
    let observer = observer().await;
    let key = key("zero");
    let lock = TransactionLock::exclusive(key.clone());
    let mut holder = pool.begin().await.expect("begin");
    lock.acquire(&mut holder, Some(Duration::ZERO))
        .await
        .expect("free: granted");
    let mut tx = pool.begin().await.expect("begin");
    let started = Instant::now();
    let err = timeout(SIGNAL, lock.acquire(&mut tx, Some(Duration::ZERO)))
        .await
        .expect("one try answers at once")
        .expect_err("held");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(
            &err,
            Error::Timeout { key: k, timeout } if timeout.is_zero() && k == &key
        ),
        "{err:?}"
    );
    assert_eq!(waiters(&observer, &key).await, 0, "it never queued");
    tx.commit().await.expect("the transaction goes on");
}

/// Without a deadline of its own the call is the hand-written statement: the session's own
/// `lock_timeout` still applies, and when it fires the transaction is aborted, as for any
/// failed statement.
#[tokio::test]
async fn a_wait_without_deadline_obeys_the_sessions_lock_timeout() {
    let pool = pool(2).await;
    let key = key("session-timeout");
    let lock = TransactionLock::exclusive(key.clone());
    let mut holder = pool.begin().await.expect("begin");
    lock.acquire(&mut holder, None).await.expect("free");
    let mut tx = pool.begin().await.expect("begin");
    sqlx::raw_sql("SET LOCAL lock_timeout = '50ms'")
        .execute(&mut *tx)
        .await
        .expect("set");
    let err = lock.acquire(&mut tx, None).await.expect_err("held");
    assert!(!err.is_timeout(), "not our deadline: {err:?}");
    assert!(
        matches!(
            &err,
            Error::Database { key: k, source } if k == &key
                && source.to_string().contains("lock timeout")
        ),
        "{err:?}"
    );
    assert_eq!(
        sqlstate_of(&mut tx, "SELECT 1").await,
        Some("25P02".to_owned()),
        "the transaction is aborted (25P02)"
    );
}

/// A transaction that already failed is reported by the server, as such.
#[tokio::test]
async fn a_failed_transaction_is_reported() {
    let pool = pool(2).await;
    let mut tx = pool.begin().await.expect("begin");
    assert!(sqlstate_of(&mut tx, "SELECT 1/0").await.is_some());
    let err = TransactionLock::exclusive(key("failed"))
        .try_acquire(&mut tx)
        .await
        .expect_err("the transaction has failed");
    assert!(
        matches!(&err, Error::Database { source, .. }
            if source.to_string().contains("current transaction is aborted")),
        "{err:?}"
    );
}

/// PostgreSQL's rules, as documented: a lock stacks within a transaction, and one taken in a
/// savepoint goes when the savepoint is rolled back and stays when it is released.
#[tokio::test]
async fn locks_stack_and_follow_savepoints() {
    let pool = pool(2).await;
    let observer = observer().await;
    let key = key("savepoint");
    let exclusive = TransactionLock::exclusive(key.clone());
    let mut tx = pool.begin().await.expect("begin");

    let mut savepoint = (&mut *tx).begin().await.expect("savepoint");
    exclusive.acquire(&mut savepoint, None).await.expect("free");
    savepoint.rollback().await.expect("rollback to savepoint");
    assert!(
        holders(&observer, &key).await.is_empty(),
        "gone with the savepoint"
    );

    let mut savepoint = (&mut *tx).begin().await.expect("savepoint");
    exclusive.acquire(&mut savepoint, None).await.expect("free");
    savepoint.commit().await.expect("release savepoint");
    exclusive.acquire(&mut tx, None).await.expect("stacks");
    assert!(
        TransactionLock::shared(key.clone())
            .try_acquire(&mut tx)
            .await
            .expect("try"),
        "the holder may take it shared too"
    );
    let modes: Vec<String> = holders(&observer, &key)
        .await
        .into_iter()
        .map(|(_, mode, _)| mode)
        .collect();
    assert_eq!(modes.len(), 2, "{modes:?}");
    tx.commit().await.expect("commit");
    assert!(holders(&observer, &key).await.is_empty());
}
