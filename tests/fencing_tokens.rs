//! Fencing tokens: strictly increasing per key across acquisitions, managers, handoffs and
//! restarts; minted without extra round trips; and the resource-side check they enable.

mod common;

use common::hooked::BuildHooked;

use std::time::Duration;

use common::proxy::Proxy;
use common::stages::StageCounts;
use common::{app_name, eventually_waiting, key, lock_rows, observer, pool_named};
use pglock::{Error, FencingTable, InMemoryLockManager, LossCause, PostgresLockManager, lock_id};
use pglock_testing::{Stage, TempPostgres};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// A bound for acquisitions of keys that should be free: a regression fails instead of
/// waiting for ever.
const BOUND: Option<Duration> = Some(Duration::from_secs(10));

/// A fencing table of this test run's own, so tokens start from scratch.
fn table() -> FencingTable {
    FencingTable::new(&format!(
        "pglock_test_fence_{}",
        uuid::Uuid::new_v4().simple()
    ))
    .expect("valid name")
}

/// The base of this server's current token epoch: tokens are `(timeline << 40) + n`, and a
/// fresh table's first token of a key is `base + 1`.
async fn epoch_base(db: &PgPool) -> i64 {
    let timeline: i64 = sqlx::query_scalar(
        "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int8",
    )
    .fetch_one(db)
    .await
    .expect("timeline");
    timeline << 40
}

fn fenced(pool: PgPool, table: &FencingTable) -> PostgresLockManager {
    PostgresLockManager::builder(pool)
        .fencing(table.clone())
        .probe_interval(Duration::from_millis(100))
        .build()
}

#[tokio::test]
async fn tokens_increase_with_every_acquisition_of_a_key() {
    let table = table();
    let a = fenced(pool_named(3, &app_name("fence-a")).await, &table);
    let b = fenced(pool_named(3, &app_name("fence-b")).await, &table);
    let (key, other) = (key("fence"), key("fence-other"));
    let base = epoch_base(&observer().await).await;
    let mut tokens = Vec::new();
    for round in 0..3 {
        let guard = a.acquire(&key, BOUND).await.expect("acquire");
        tokens.push(guard.info().fencing_token.expect("fencing is on"));
        guard.release().await.expect("release");
        let info = b
            .try_acquire(&key)
            .await
            .expect("try")
            .leak()
            .expect("free");
        tokens.push(info.fencing_token.expect("fencing is on"));
        b.release(&key).await.expect("release");
        let shared = a.acquire_shared(&key, BOUND).await.expect("shared");
        tokens.push(shared.info().fencing_token.expect("fencing is on"));
        shared.release().await.expect("release");
        // Another key's tokens are its own.
        let unrelated = b.acquire(&other, None).await.expect("acquire");
        assert_eq!(unrelated.info().fencing_token, Some(base + round + 1));
        unrelated.release().await.expect("release");
    }
    assert_eq!(tokens, (base + 1..=base + 9).collect::<Vec<i64>>());
    // A manager built later (an application restart) continues where they left off.
    let restarted = fenced(pool_named(2, &app_name("fence-restart")).await, &table);
    let guard = restarted.acquire(&key, BOUND).await.expect("acquire");
    assert_eq!(guard.info().fencing_token, Some(base + 10));
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_wait_on_the_server_mints_too() {
    let table = table();
    let holder = fenced(pool_named(2, &app_name("fence-holder")).await, &table);
    let waiter = fenced(pool_named(2, &app_name("fence-waiter")).await, &table);
    let key = key("fence-wait");
    let held = holder.acquire(&key, BOUND).await.expect("acquire");
    let waiting = tokio::spawn({
        let (waiter, key) = (waiter.clone(), key.clone());
        async move { waiter.acquire(&key, Some(Duration::from_secs(10))).await }
    });
    let observer = observer().await;
    let base = epoch_base(&observer).await;
    common::eventually("the waiter is queued", || async {
        lock_rows(&observer, lock_id(&key))
            .await
            .iter()
            .any(|r| !r.granted)
    })
    .await;
    assert_eq!(held.info().fencing_token, Some(base + 1));
    held.release().await.expect("release");
    let granted = waiting.await.expect("join").expect("granted");
    assert_eq!(granted.info().fencing_token, Some(base + 2));
    granted.release().await.expect("release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_keep_increasing_across_in_process_handoffs() {
    let table = table();
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("fence-relay")).await)
        .fencing(table.clone())
        .handoff_limits(1000, Duration::from_secs(10))
        .build();
    let key = key("fence-relay");
    let base = epoch_base(locks.pool()).await;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (locks, key, tx) = (locks.clone(), key.clone(), tx.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..25 {
                let guard = locks.acquire(&key, BOUND).await.expect("acquire");
                // Sent while held, so the channel's order is the order of the holds.
                tx.send(guard.info().fencing_token.expect("fencing is on"))
                    .expect("send");
                tokio::task::yield_now().await;
                guard.release().await.expect("release");
            }
        }));
    }
    drop(tx);
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("every relay task finishes")
            .expect("join");
    }
    // Every sender is gone, so this ends at once.
    let mut tokens = Vec::new();
    while let Some(token) = rx.recv().await {
        tokens.push(token);
    }
    assert_eq!(
        tokens,
        (base + 1..=base + 100).collect::<Vec<i64>>(),
        "one new token per holder, in order"
    );
}

/// A lock won by a wait on the server sits on a session of its own; handed over in-process
/// from there to the next task, it still gets a new token, minted on that session.
#[tokio::test(flavor = "current_thread")]
async fn tokens_keep_increasing_across_handoffs_of_a_lock_won_by_a_wait() {
    let table = table();
    let stages = StageCounts::default();
    let locks = PostgresLockManager::builder(pool_named(4, &app_name("fence-wait-relay")).await)
        .fencing(table.clone())
        .handoff_limits(16, Duration::from_secs(10))
        .build_with_stage_hook(stages.hook());
    let holder = fenced(pool_named(2, &app_name("fence-wait-holder")).await, &table);
    let key = key("fence-wait-relay");
    let first = holder
        .acquire(&key, BOUND)
        .await
        .expect("acquire elsewhere");
    let held_token = first.info().fencing_token.expect("fencing is on");
    let observer = observer().await;
    let mut tasks = Vec::new();
    for _ in 0..2 {
        let (locks, key) = (locks.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            let guard = locks.acquire(&key, BOUND).await.expect("acquire");
            let token = guard.info().fencing_token.expect("fencing is on");
            guard.release().await.expect("release");
            token
        }));
    }
    // Both are in the manager's queue (a one-thread runtime: seen at its door, walked in), and
    // the first of them waits on the server.
    stages.wait_for(Stage::Turn, &key, 2).await;
    eventually_waiting("a waiter on the server", &observer, &key).await;
    first.release().await.expect("release");
    let mut tokens = Vec::new();
    for task in tasks {
        let token = tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("both tasks are served")
            .expect("join");
        tokens.push(token);
    }
    assert_eq!(
        tokens,
        [held_token + 1, held_token + 2],
        "the wait minted one token, the handoff the next"
    );
}

#[tokio::test]
async fn tokens_survive_a_server_restart() {
    let server = TempPostgres::start().unwrap_or_else(|err| {
        panic!("this test restarts its server, so it needs the PostgreSQL server binaries: {err}")
    });
    let pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&server.url())
        .await
        .expect("connect");
    let base = epoch_base(&pool).await;
    let locks = fenced(pool, &FencingTable::default());
    let key = key("fence-restart");
    for expected in 1..=3 {
        let guard = locks.acquire(&key, BOUND).await.expect("acquire");
        assert_eq!(guard.info().fencing_token, Some(base + expected));
        guard.release().await.expect("release");
    }
    server.stop().expect("stop");
    server.start_again().expect("start");
    let guard = locks
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("acquire after the restart");
    assert_eq!(
        guard.info().fencing_token,
        Some(base + 4),
        "the counter outlived the restart"
    );
    guard.release().await.expect("release");
}

/// The resource side of fencing: a write is accepted only with a token at least as high as the
/// highest accepted so far (the same holder may write again with its own token).
async fn fenced_write(db: &PgPool, row: uuid::Uuid, token: i64, data: &str) -> bool {
    sqlx::query(
        "UPDATE pglock_test_fenced_resource SET data = $3, fence = $2 \
         WHERE id = $1 AND fence <= $2",
    )
    .bind(row)
    .bind(token)
    .bind(data)
    .execute(db)
    .await
    .expect("write")
    .rows_affected()
        == 1
}

#[tokio::test]
async fn a_holder_that_lost_its_lock_cannot_overwrite_its_successor() {
    let db = pool_named(2, &app_name("fence-resource")).await;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pglock_test_fenced_resource \
         (id uuid PRIMARY KEY, data text NOT NULL, fence bigint NOT NULL DEFAULT 0)",
    )
    .execute(&db)
    .await
    .expect("create");
    let row = uuid::Uuid::new_v4();
    sqlx::query("INSERT INTO pglock_test_fenced_resource (id, data) VALUES ($1, 'initial')")
        .bind(row)
        .execute(&db)
        .await
        .expect("insert");

    let table = table();
    let a = fenced(pool_named(2, &app_name("fence-a")).await, &table);
    let b = fenced(pool_named(2, &app_name("fence-b")).await, &table);
    let key = key("fence-resource");
    let a_guard = a.acquire(&key, BOUND).await.expect("A acquires");
    let a_token = a_guard.info().fencing_token.expect("token");
    assert!(fenced_write(&db, row, a_token, "A's first write").await);

    // A's session is killed behind its back (think: a long GC pause, a partition).
    let observer = observer().await;
    let pid = lock_rows(&observer, lock_id(&key)).await[0].pid;
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&observer)
        .await
        .expect("terminate");
    let b_guard = b
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("B takes the freed lock");
    let b_token = b_guard.info().fencing_token.expect("token");
    assert!(b_token > a_token);
    assert!(fenced_write(&db, row, b_token, "B's write").await);

    // A's late write, with its old token, is rejected by the resource.
    assert!(!fenced_write(&db, row, a_token, "A's late write").await);
    let data: String =
        sqlx::query_scalar("SELECT data FROM pglock_test_fenced_resource WHERE id = $1")
            .bind(row)
            .fetch_one(&db)
            .await
            .expect("read");
    assert_eq!(data, "B's write");
    // And A is told, too.
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(5), a_guard.loss_signal().lost())
            .await
            .expect("A learns it lost the lock"),
        LossCause::NotOnServer
    );
    assert!(matches!(
        a_guard.release().await,
        Err(Error::LockLost { .. })
    ));
    b_guard.release().await.expect("release");
}

#[tokio::test]
async fn minting_adds_no_round_trip() {
    let proxy = Proxy::start().await;
    let writes = |fencing: Option<FencingTable>| {
        let proxy = &proxy;
        async move {
            let pool = PgPoolOptions::new()
                .max_connections(1)
                .test_before_acquire(false)
                .connect_with(proxy.options(&app_name("round-trips")))
                .await
                .expect("connect through the proxy");
            let mut builder = PostgresLockManager::builder(pool).detect_lost_locks(false);
            if let Some(table) = fencing {
                builder = builder.fencing(table);
            }
            let locks = builder.build();
            let key = key("round-trips");
            // Warm up: table creation, statement preparation.
            for _ in 0..3 {
                let guard = locks.acquire(&key, BOUND).await.expect("acquire");
                guard.release().await.expect("release");
            }
            let before = proxy.client_writes();
            for _ in 0..20 {
                let guard = locks.acquire(&key, BOUND).await.expect("acquire");
                guard.release().await.expect("release");
            }
            proxy.client_writes() - before
        }
    };
    let plain = writes(None).await;
    let fenced = writes(Some(table())).await;
    println!("20 acquire+release cycles: {plain} round trips without fencing, {fenced} with");
    assert_eq!(plain, 40, "one round trip to acquire, one to release");
    assert_eq!(fenced, plain, "minting rides on the acquiring statement");
}

#[tokio::test]
async fn concurrent_managers_create_one_table_without_error() {
    let table = table();
    let mut handles = Vec::new();
    for n in 0..4 {
        let table = table.clone();
        handles.push(tokio::spawn(async move {
            let locks = fenced(pool_named(2, &app_name(&format!("race-{n}"))).await, &table);
            let guard = locks.acquire(&key("race"), None).await?;
            guard.release().await
        }));
    }
    for handle in handles {
        handle
            .await
            .expect("join")
            .expect("each manager created or found the table");
    }
    let db = pool_named(1, &app_name("check")).await;
    let name = table.to_string();
    let exists: bool = sqlx::query_scalar("SELECT to_regclass($1) IS NOT NULL")
        .bind(&name)
        .fetch_one(&db)
        .await
        .expect("query");
    assert!(exists, "{name} exists");
}

#[tokio::test]
async fn the_in_memory_manager_mints_per_server() {
    let server = pglock::InMemoryLockServer::new();
    let a = InMemoryLockManager::builder().server(&server).build();
    let b = InMemoryLockManager::builder().server(&server).build();
    let key = key("memory-fence");
    let mut tokens = Vec::new();
    for _ in 0..3 {
        for locks in [&a, &b] {
            let guard = locks.acquire(&key, BOUND).await.expect("acquire");
            tokens.push(guard.info().fencing_token.expect("always minted"));
            guard.release().await.expect("release");
        }
    }
    assert_eq!(tokens, (1..=6).collect::<Vec<i64>>());
}

#[tokio::test]
async fn sessions_carry_the_holder_id_while_used_and_their_own_name_after() {
    let observer = observer().await;
    let app = app_name("tagging");
    let pool = pool_named(2, &app).await;
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id("orders-worker-7 \u{1F512}")
        .idle_sessions(0, Duration::ZERO)
        .build();
    let key = key("tagging");
    let guard = locks.acquire(&key, BOUND).await.expect("acquire");
    let pid = lock_rows(&observer, lock_id(&key)).await[0].pid;
    let name: String =
        sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&observer)
            .await
            .expect("query");
    assert_eq!(name, "pglock:orders-worker-7 ?", "printable ASCII only");
    guard.release().await.expect("release");
    // Back in the pool, the connection has its own name again.
    common::eventually("the pooled connection's name is restored", || async {
        let name: Option<String> =
            sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
                .bind(pid)
                .fetch_optional(&observer)
                .await
                .expect("query");
        name.as_deref() == Some(app.as_str())
    })
    .await;
    // Tagging can be turned off.
    let plain = PostgresLockManager::builder(pool)
        .application_name_prefix(None)
        .build();
    let guard = plain.acquire(&key, BOUND).await.expect("acquire");
    let pid = lock_rows(&observer, lock_id(&key)).await[0].pid;
    let name: String =
        sqlx::query_scalar("SELECT application_name FROM pg_stat_activity WHERE pid = $1")
            .bind(pid)
            .fetch_one(&observer)
            .await
            .expect("query");
    assert_eq!(name, app);
    guard.release().await.expect("release");
}

#[tokio::test]
async fn the_fencing_table_can_be_created_up_front() {
    let table = table();
    let db = pool_named(1, &app_name("up-front")).await;
    let exists = |db: PgPool, name: String| async move {
        sqlx::query_scalar::<_, bool>("SELECT to_regclass($1) IS NOT NULL")
            .bind(name)
            .fetch_one(&db)
            .await
            .expect("query")
    };
    assert!(!exists(db.clone(), table.to_string()).await);
    let locks = fenced(pool_named(2, &app_name("up-front")).await, &table);
    locks.ensure_fencing_table().await.expect("create");
    assert!(
        exists(db.clone(), table.to_string()).await,
        "created before any acquisition"
    );
    locks
        .ensure_fencing_table()
        .await
        .expect("a second call finds it");
    let plain = PostgresLockManager::new(pool_named(2, &app_name("unfenced")).await);
    plain
        .ensure_fencing_table()
        .await
        .expect("nothing to do without fencing");
}
