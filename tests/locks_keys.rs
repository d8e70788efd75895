//! Keys: names of any shape (empty, with NUL bytes, any Unicode, SQL, a megabyte) lock exactly
//! the lock id the specified derivation gives them; and keys beyond names (raw ids, id pairs and
//! sqlx-derived names) reach the same PostgreSQL locks as the code that already uses them
//! (sqlx's `PgAdvisoryLock`, hand-written SQL), so services can move to pglock one replica at a
//! time.

mod common;

use std::time::Duration;

use common::{app_name, eventually, key, lock_rows, manager_named, observer, pool_named};
use pglock::{FencingTable, LockKey, LockTarget, PostgresLockManager, lock_id};
use sqlx::postgres::{PgAdvisoryLock, PgAdvisoryLockKey};
use sqlx::{Connection, PgConnection};

const BOUND: Duration = Duration::from_secs(10);

async fn connection() -> PgConnection {
    PgConnection::connect_with(&common::options(&app_name("raw")))
        .await
        .expect("connect")
}

fn random_i32() -> i32 {
    (uuid::Uuid::new_v4().as_u128() as u32 >> 1) as i32
}

#[tokio::test]
async fn sqlx_advisory_locks_and_pglock_exclude_each_other() {
    let locks = PostgresLockManager::new(pool_named(3, &app_name("from-sqlx")).await);
    let name = key("moving-from-sqlx");
    let (a, b) = (random_i32(), random_i32());
    let cases = [
        (PgAdvisoryLock::new(&name), LockKey::sqlx(&name)),
        (
            PgAdvisoryLock::with_key(PgAdvisoryLockKey::BigInt(i64::from(a) << 3)),
            LockKey::id(i64::from(a) << 3),
        ),
        (
            PgAdvisoryLock::with_key(PgAdvisoryLockKey::IntPair(a, b)),
            LockKey::pair(a, b),
        ),
    ];
    for (sqlx_lock, key) in cases {
        // A replica still on sqlx holds the lock: pglock is refused, then served once it ends.
        let mut conn = connection().await;
        let held = sqlx_lock.acquire(&mut conn).await.expect("sqlx acquire");
        assert!(
            locks
                .try_acquire(key.clone())
                .await
                .expect("try")
                .into_handle()
                .is_none(),
            "{key}"
        );
        let waiting = tokio::spawn({
            let (locks, key) = (locks.clone(), key.clone());
            async move { locks.acquire(key, Some(BOUND)).await }
        });
        let conn = held.release_now().await.expect("sqlx release");
        let guard = waiting
            .await
            .expect("join")
            .expect("served after sqlx released");
        // And the other way round.
        let mut conn = conn;
        let refused = matches!(
            sqlx_lock.try_acquire(&mut conn).await.expect("sqlx try"),
            sqlx::Either::Right(_)
        );
        assert!(refused, "{key}: pglock holds it");
        guard.release().await.expect("release");
        let granted = sqlx_lock.try_acquire(&mut conn).await.expect("sqlx try");
        let sqlx::Either::Left(granted) = granted else {
            panic!("{key}: free again for sqlx");
        };
        granted.release_now().await.expect("sqlx release");
    }
}

#[tokio::test]
async fn the_default_derivation_is_not_sqlxs() {
    // A service moving from sqlx must opt in with `LockKey::sqlx`: the same name with the
    // default derivation is another lock, which the old replicas would not exclude.
    let name = "orders:rebuild";
    let sqlx_id = match PgAdvisoryLock::new(name).key() {
        PgAdvisoryLockKey::BigInt(id) => *id,
        other => panic!("sqlx derives a bigint, got {other:?}"),
    };
    assert_eq!(LockKey::sqlx(name).target(), LockTarget::BigInt(sqlx_id));
    assert_ne!(LockKey::from(name).target(), LockTarget::BigInt(sqlx_id));
}

#[tokio::test]
async fn raw_ids_and_pairs_contend_with_hand_written_sql() {
    let locks = PostgresLockManager::builder(pool_named(3, &app_name("raw-ids")).await)
        .fencing(FencingTable::new(&format!("fence_keys_{}", random_i32())).expect("name"))
        .build();
    let (a, b) = (random_i32(), random_i32());
    let mut conn = connection().await;
    for (sql, key) in [
        (
            format!("SELECT pg_advisory_lock({a})"),
            LockKey::id(i64::from(a)),
        ),
        (
            format!("SELECT pg_advisory_lock({a}, {b})"),
            LockKey::pair(a, b),
        ),
    ] {
        sqlx::query(sqlx::AssertSqlSafe(sql))
            .execute(&mut conn)
            .await
            .expect("hand-written lock");
        assert!(
            locks
                .try_acquire(key.clone())
                .await
                .expect("try")
                .into_handle()
                .is_none(),
            "{key}"
        );
        // A waiter on the server, minting its token when granted.
        let waiting = tokio::spawn({
            let (locks, key) = (locks.clone(), key.clone());
            async move { locks.acquire(key, Some(BOUND)).await }
        });
        eventually("the waiter queues on the server", || async {
            waiting_on(&observer().await, key.target()).await
        })
        .await;
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut conn)
            .await
            .expect("unlock");
        let guard = waiting.await.expect("join").expect("granted");
        assert!(guard.info().fencing_token.is_some());
        guard.release().await.expect("release");
    }
}

/// True once a session waits for `target` in `pg_locks`.
async fn waiting_on(observer: &sqlx::PgPool, target: LockTarget) -> bool {
    let (classid, objid) = pglock::split_lock_id(target.packed());
    sqlx::query_scalar(
        "SELECT count(*) > 0 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted \
         AND classid = $1::int8::oid AND objid = $2::int8::oid AND objsubid = $3",
    )
    .bind(i64::from(classid))
    .bind(i64::from(objid))
    .bind(target.objsubid())
    .fetch_one(observer)
    .await
    .expect("query pg_locks")
}

#[tokio::test]
async fn a_lost_pair_key_is_reported_like_any_other() {
    let observer = observer().await;
    let locks = PostgresLockManager::builder(pool_named(3, &app_name("lost-pair")).await)
        .probe_interval(Duration::from_millis(100))
        .build();
    let (a, b) = (random_i32(), random_i32());
    let guard = locks.acquire((a, b), None).await.expect("acquire");
    // Two probes pass with the pair held: the monitor finds it where pg_locks shows pairs.
    let monitored = locks
        .acquire(key("beside-the-pair"), None)
        .await
        .expect("acquire");
    let pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 \
         AND classid = $1::int8::oid AND objid = $2::int8::oid",
    )
    .bind(i64::from(a as u32))
    .bind(i64::from(b as u32))
    .fetch_one(&observer)
    .await
    .expect("the pair is in pg_locks");
    let cause = tokio::time::timeout(Duration::from_millis(600), guard.loss_signal().lost()).await;
    assert!(cause.is_err(), "a held pair is not declared lost");
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    tokio::time::timeout(BOUND, guard.loss_signal().lost())
        .await
        .expect("the pair's loss is reported");
    drop(monitored);
}

#[tokio::test]
async fn keys_of_any_shape_work_and_hash_as_specified() {
    let observer = observer().await;
    let locks = manager_named(&app_name("keys"), 2).await;
    let suffix = uuid::Uuid::new_v4().to_string();
    let keys = [
        String::new() + &suffix,
        format!("{suffix}\0nul\0bytes"),
        format!("ключ-🔒-{suffix}-\u{FEFF}"),
        format!("{suffix}'; SELECT pg_advisory_unlock_all(); --"),
        format!("{suffix}{}", "x".repeat(1 << 20)),
    ];
    for key in &keys {
        let guard = locks
            .acquire(key, Some(Duration::from_secs(10)))
            .await
            .expect("acquire");
        assert_eq!(guard.info().key, *key);
        let rows = lock_rows(&observer, lock_id(key)).await;
        assert_eq!(rows.len(), 1, "exactly the derived lock is held");
        guard.release().await.expect("release");
    }
    // The empty key is a key too.
    let empty_guard = locks
        .acquire("", Some(Duration::from_secs(10)))
        .await
        .expect("acquire");
    assert_eq!(empty_guard.info().lock_id, 7183457195969485844);
    assert_eq!(lock_rows(&observer, 7183457195969485844).await.len(), 1);
    empty_guard.release().await.expect("release");
}
