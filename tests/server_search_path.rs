//! A `search_path` cannot redirect a lock: every function, operator and type pglock names in
//! its SQL is `pg_catalog`'s, on the sessions it owns and on the caller's own connections, so
//! a schema listed ahead of `pg_catalog` (one another role may write, in a schema-per-tenant
//! application) changes nothing. Two hostile schemas: one whose advisory-lock functions
//! exclude nothing (they answer `true`, as CockroachDB's stubs do), and one in which every
//! function, operator and type name pglock uses is shadowed by one that fails when called, so
//! a single unqualified name anywhere fails the test.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{app_name, key};
use pglock::schedule::{PostgresJobStore, ScheduledJob};
use pglock::semaphore::Semaphore;
use pglock::{
    Attempt, FencingTable, LeaderElection, LockKey, PostgresLockManager, RowFence, TransactionLock,
};
use pglock_testing::search_path;
use sqlx::postgres::PgPoolOptions;
use sqlx::{AssertSqlSafe, PgPool};

/// A pool whose connections put `schema` ahead of `pg_catalog` in their `search_path`.
async fn pool_behind(schema: &str, max: u32) -> PgPool {
    let options =
        search_path::ahead_of_pg_catalog(common::options(&app_name("hostile-path")), schema);
    PgPoolOptions::new()
        .max_connections(max)
        .connect_with(options)
        .await
        .expect("connect")
}

async fn admin() -> PgPool {
    common::pool(1).await
}

/// Whether `b` takes `key` while `a` holds it.
async fn both_hold(a: &PostgresLockManager, b: &PostgresLockManager, key: &str) -> bool {
    let held = a
        .acquire(key, Some(Duration::from_secs(5)))
        .await
        .expect("a acquires");
    let both = matches!(b.try_acquire(key).await.expect("try"), Attempt::Acquired(_));
    held.release().await.expect("release");
    both
}

#[tokio::test]
async fn lock_functions_that_exclude_nothing_ahead_of_pg_catalog_are_not_called() {
    let schema = search_path::lock_stubs(&admin().await)
        .await
        .expect("stubs");
    let a = PostgresLockManager::new(pool_behind(&schema, 3).await);
    let b = PostgresLockManager::new(pool_behind(&schema, 3).await);
    let key = key("stubbed");
    assert!(
        !both_hold(&a, &b, &key).await,
        "a stub lock function was called"
    );
    let lock = TransactionLock::exclusive(key.as_str());
    let pool = pool_behind(&schema, 2).await;
    let mut first = pool.begin().await.expect("begin");
    lock.acquire(&mut first, Some(Duration::from_secs(5)))
        .await
        .expect("acquire");
    let mut second = pool.begin().await.expect("begin");
    assert!(
        !lock.try_acquire(&mut second).await.expect("try"),
        "a stub xact lock was called"
    );
    drop((first, second));
    search_path::drop(&admin().await, &schema)
        .await
        .expect("drop");
}

#[tokio::test]
async fn every_statement_names_pg_catalog() {
    let schema = search_path::shadowing(&admin().await)
        .await
        .expect("shadows");
    let pool = pool_behind(&schema, 6).await;
    let fencing = FencingTable::new(&format!("public.fencing_{}", uuid::Uuid::new_v4().simple()))
        .expect("valid");
    let a = PostgresLockManager::builder(pool.clone())
        .fencing(fencing.clone())
        .build();
    let b = PostgresLockManager::builder(pool_behind(&schema, 6).await)
        .fencing(fencing.clone())
        .build();
    let (k, l) = (key("hostile"), key("hostile-set"));

    // Lock sessions: tries, releases, shared, pairs, sets, a handoff, release_all.
    let guard = a
        .acquire(&k, Some(Duration::from_secs(10)))
        .await
        .expect("acquire");
    assert!(matches!(
        b.try_acquire(&k).await.expect("try"),
        Attempt::Busy
    ));
    // A wait on the server (b's wait session), granted by a's release (its notification).
    let waiting = tokio::spawn({
        let (b, k) = (b.clone(), k.clone());
        async move { b.acquire(&k, Some(Duration::from_secs(30))).await }
    });
    let observer = common::observer().await;
    common::eventually("b waits on the server", || async {
        common::lock_rows(&observer, pglock::lock_id(&k))
            .await
            .len()
            == 2
    })
    .await;
    guard.release().await.expect("release");
    waiting
        .await
        .expect("join")
        .expect("b's wait is granted")
        .release()
        .await
        .expect("release");
    let shared = a
        .acquire_shared(LockKey::pair(7, 42), None)
        .await
        .expect("shared pair");
    let set = a
        .acquire_all([l.as_str(), k.as_str()], None)
        .await
        .expect("set");
    set.release().await.expect("release the set");
    shared.release().await.expect("release");
    a.try_acquire(&k).await.expect("try").leak();
    assert_eq!(a.release_all().await.expect("release_all"), 1);

    // Waits without a connection of their own: the listener's flags and notifications. With
    // room for one wait session, all but one of four contended keys wait through the doorbell.
    let narrow = PostgresLockManager::builder(pool_behind(&schema, 3).await)
        .max_connections(3)
        .build();
    let contended: Vec<String> = (0..4).map(|i| key(&format!("hostile-wait-{i}"))).collect();
    let held = a
        .acquire_all(&contended, None)
        .await
        .expect("a holds them all");
    let waiters: Vec<_> = contended
        .iter()
        .map(|k| {
            let (narrow, k) = (narrow.clone(), k.clone());
            tokio::spawn(async move {
                let guard = narrow.acquire(&k, Some(Duration::from_secs(30))).await?;
                guard.release().await
            })
        })
        .collect();
    let flags = format!(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid \
         WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.mode = 'ShareLock' \
         AND a.application_name = 'pglock:{}'",
        narrow.holder_id()
    );
    common::eventually(
        "a waiter waits through the doorbell (its flag raised)",
        || async {
            let raised: i64 = sqlx::query_scalar(AssertSqlSafe(flags.clone()))
                .fetch_one(&observer)
                .await
                .expect("pg_locks");
            raised > 0
        },
    )
    .await;
    held.release().await.expect("release");
    for waiter in waiters {
        waiter
            .await
            .expect("join")
            .expect("every waiter is granted in turn");
    }

    // A lock-order cycle through both managers, found by their probes (sent and heard on the
    // listener): exactly one of the two callers fails with `Deadlock`.
    let outcomes =
        common::within("the cycle is broken", common::cycle::between(&a, &b, None)).await;
    assert_eq!(common::cycle::deadlocks(&outcomes), 1, "{outcomes:?}");

    // The recipes, and what runs on the caller's own connections.
    let locks: Arc<dyn pglock::LockManager> = Arc::new(a.clone());
    let semaphore = Semaphore::builder(Arc::clone(&locks), key("hostile-sem"), 2)
        .build()
        .expect("valid");
    semaphore
        .with_permit(None, |_| async {})
        .await
        .expect("permit");
    let election = LeaderElection::builder(Arc::clone(&locks), key("hostile-leader"))
        .build()
        .expect("runtime");
    election
        .wait_for_leadership(Some(Duration::from_secs(10)))
        .await
        .expect("leads");
    assert!(election.resign().await.expect("resign"));
    let jobs = PostgresJobStore::with_table(
        pool.clone(),
        pglock::schedule::JobTable::new(&format!("public.jobs_{}", uuid::Uuid::new_v4().simple()))
            .expect("valid"),
    );
    let job = ScheduledJob::builder(
        Arc::clone(&locks),
        Arc::new(jobs),
        key("job"),
        Duration::from_secs(3600),
    )
    .build()
    .expect("valid");
    assert!(job.run(|_| async {}).await.expect("run").ran());
    let mut tx = pool.begin().await.expect("begin");
    TransactionLock::shared(k.as_str())
        .acquire(&mut tx, Some(Duration::from_millis(200)))
        .await
        .expect("xact lock");
    tx.commit().await.expect("commit");
    let reports = pglock::inspect::Inspector::new(pool.clone())
        .fencing_table(fencing)
        .all()
        .await
        .expect("inspect");
    drop(reports);
    let table = format!("public.fenced_{}", uuid::Uuid::new_v4().simple());
    let owner = common::pool(1).await;
    sqlx::raw_sql(AssertSqlSafe(format!(
        "CREATE TABLE {table} (id text PRIMARY KEY, fence bigint, v int); \
         INSERT INTO {table} VALUES ('r', NULL, 0)"
    )))
    .execute(&owner)
    .await
    .expect("resource");
    let fence = RowFence::new(&table, "id", "fence")
        .and_then(|fence| fence.returning(&["v"]))
        .expect("valid");
    let guard = a.acquire(&k, None).await.expect("acquire");
    let token = guard.info().fencing_token.expect("fenced");
    let (v,): (i32,) = fence
        .raise(&pool, "r", token)
        .await
        .expect("raise the fence");
    fence
        .write(&pool, "r", token, "v", v + 1)
        .await
        .expect("fenced write");
    let stale = fence.write(&pool, "r", token - 1, "v", 0).await;
    assert!(
        matches!(stale, Err(pglock::fence::Error::StaleToken { .. })),
        "{stale:?}"
    );
    guard.release().await.expect("release");
    search_path::drop(&admin().await, &schema)
        .await
        .expect("drop");
}
