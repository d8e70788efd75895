//! A manager never starves the database of its shared lock table.
//!
//! PostgreSQL keeps advisory locks in the one shared lock table every other lock needs. A
//! manager asked for ever more keys stops at its budget (by default the share of the table its
//! pool's connections are entitled to) with a typed error, before the server is touched, so
//! other clients still take their locks and still connect. Without a budget, the table fills
//! and the server's refusal is a typed error of its own.

mod common;

use std::time::Duration;

use common::{app_name, key, observer, pool_named};
use pglock::{Error, InMemoryLockManager, LockGuard, PostgresLockManager};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

const BOUND: Duration = Duration::from_secs(30);

/// A pool with sqlx's defaults (at most 10 connections) on `url`, tagged `app`.
async fn default_pool(url: &str, app: &str) -> PgPool {
    let options: PgConnectOptions = url.parse().expect("url");
    PgPoolOptions::new()
        .connect_with(options.application_name(app))
        .await
        .expect("connect")
}

/// How many advisory locks the sessions tagged for holder `app` hold.
async fn advisory_locks(observer: &PgPool, app: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid) \
         WHERE l.locktype = 'advisory' AND a.application_name = left('pglock:' || $1, 63)",
    )
    .bind(app)
    .fetch_one(observer)
    .await
    .expect("count advisory locks")
}

/// Another client's transaction that takes `n` locks at once, as a migration or a query over
/// many partitions does.
async fn many_locks_in_one_transaction(url: &str, n: i64) -> Result<(), sqlx::Error> {
    let mut conn = PgConnection::connect(url).await?;
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT count(pg_advisory_xact_lock(-i)) FROM generate_series(1, $1) AS i")
        .bind(n)
        .execute(&mut *tx)
        .await?;
    tx.rollback().await?;
    conn.close().await
}

/// Asks `locks` for `keys` keys, keeping every one granted; returns the guards and the first
/// error.
async fn take_keys(
    locks: &PostgresLockManager,
    label: &str,
    keys: usize,
) -> (Vec<LockGuard>, Option<Error>) {
    let mut guards = Vec::new();
    for i in 0..keys {
        match locks.try_acquire(format!("{label}:{i}")).await {
            Ok(pglock::Attempt::Acquired(guard)) => guards.push(guard),
            Ok(_busy) => panic!("{label}:{i} is held by no one else"),
            Err(err) => return (guards, Some(err)),
        }
    }
    (guards, None)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manager_asked_for_thirty_thousand_keys_stops_at_its_budget_and_the_database_goes_on() {
    let server = common::stock_server().await;
    let url = server.url();
    let observer = PgPoolOptions::new()
        .max_connections(1)
        .connect(&url)
        .await
        .expect("connect");
    let app = app_name("budget");
    let pool = default_pool(&url, &app).await;
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id(&app)
        .build();
    assert_eq!(
        locks.lock_budget(),
        None,
        "unknown before the first session"
    );

    let (guards, refused) = take_keys(&locks, "budget", 30_000).await;
    // 64 (stock max_locks_per_transaction) × 10 (sqlx's default pool).
    assert_eq!(locks.lock_budget(), Some(640));
    assert_eq!(guards.len(), 640, "exactly the budget is held");
    match refused {
        Some(Error::BudgetExhausted { key, held, budget }) => {
            assert_eq!(key, "budget:640");
            assert_eq!((held, budget), (640, 640));
        }
        other => panic!("expected BudgetExhausted, got {other:?}"),
    }
    // Refused before the server is touched: the server shows exactly the budget.
    assert_eq!(advisory_locks(&observer, &app).await, 640);
    // The rest of the 30,000 are refused as well, each at once, and none reaches the server.
    for i in 641..30_000 {
        let err = locks
            .try_acquire(format!("budget:{i}"))
            .await
            .expect_err("over budget");
        assert!(matches!(err, Error::BudgetExhausted { .. }), "{err:?}");
    }
    let waited = locks
        .acquire("budget:waiting", Some(BOUND))
        .await
        .expect_err("a waiting acquisition is refused too");
    assert!(
        matches!(waited, Error::BudgetExhausted { .. }),
        "{waited:?}"
    );
    assert_eq!(advisory_locks(&observer, &app).await, 640);

    // Everyone else still has the lock table: a 3,000-lock transaction and a new connection.
    many_locks_in_one_transaction(&url, 3_000)
        .await
        .expect("another client's 3,000-lock transaction");
    PgConnection::connect(&url)
        .await
        .expect("a new connection")
        .close()
        .await
        .expect("close");

    // A released lock gives its place back.
    let mut guards = guards;
    guards
        .pop()
        .expect("held")
        .release()
        .await
        .expect("release");
    let again = locks
        .acquire("budget:again", Some(BOUND))
        .await
        .expect("a place came back");
    drop(again);
    for guard in guards {
        guard.release().await.expect("release");
    }
    assert_eq!(locks.held_lock_count(), 0);
    pool.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_budget_a_full_lock_table_is_a_typed_error() {
    let server = common::stock_server().await;
    let url = server.url();
    let app = app_name("no-budget");
    let pool = default_pool(&url, &app).await;
    let locks = PostgresLockManager::builder(pool.clone())
        .holder_id(&app)
        .lock_budget(usize::MAX)
        .detect_lost_locks(false)
        .build();
    let (guards, refused) = take_keys(&locks, "unbudgeted", 30_000).await;
    match refused {
        Some(Error::LockTableFull { key, source }) => {
            assert_eq!(key, format!("unbudgeted:{}", guards.len()));
            assert!(
                source.to_string().contains("out of shared memory"),
                "{source}"
            );
        }
        other => panic!("expected LockTableFull, got {other:?}"),
    }
    // The table holds about twice its nominal 6,400 slots, borrowing spare shared memory; far
    // beyond what the default budget allows.
    assert!(guards.len() > 6_400, "{} locks", guards.len());
    println!(
        "without a budget: {} locks held when the server refused",
        guards.len()
    );
    // This is what the budget prevents: now another client cannot take its locks, nor even
    // connect (a new session needs a few locks of its own to start).
    let starved = many_locks_in_one_transaction(&url, 3_000).await;
    assert!(starved.is_err(), "the lock table is full for everyone");
    let refused = PgConnection::connect(&url)
        .await
        .expect_err("a new connection is refused too");
    println!("a new connection: {refused}");
    for guard in guards {
        guard.release().await.expect("release");
    }
    many_locks_in_one_transaction(&url, 3_000)
        .await
        .expect("the table has room again once the locks are released");
    pool.close().await;
}

#[tokio::test]
async fn an_explicit_budget_is_kept_whatever_the_server_says() {
    let app = app_name("explicit-budget");
    let pool = pool_named(4, &app).await;
    let observer = observer().await;
    let locks = PostgresLockManager::builder(pool)
        .holder_id(&app)
        .lock_budget(3)
        .build();
    assert_eq!(locks.lock_budget(), Some(3));
    let keys: Vec<String> = (0..4).map(|_| key("explicit-budget")).collect();
    let mut held = Vec::new();
    for key in &keys[..3] {
        held.push(
            locks
                .acquire(key, Some(BOUND))
                .await
                .expect("within budget"),
        );
    }
    assert_eq!(
        locks.lock_budget(),
        Some(3),
        "the server's settings do not replace it"
    );
    let err = locks
        .acquire(&keys[3], Some(BOUND))
        .await
        .expect_err("over budget");
    assert!(
        matches!(
            &err,
            Error::BudgetExhausted {
                held: 3,
                budget: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "Failed to acquire lock '{}': this manager holds 3 locks, its budget; release some, \
             or raise the budget on purpose",
            keys[3]
        )
    );
    assert_eq!(advisory_locks(&observer, &app).await, 3);
    // A lock taken away through the manager gives its place back too.
    locks
        .release(keys[0].as_str())
        .await
        .expect("release by key");
    let fourth = locks
        .acquire(&keys[3], Some(BOUND))
        .await
        .expect("a place came back");
    fourth.release().await.expect("release");
    assert_eq!(locks.release_all().await.expect("release_all"), 2);
    drop(held);
}

#[tokio::test]
async fn the_in_memory_manager_keeps_a_budget_for_unit_tests() {
    let locks = InMemoryLockManager::builder().lock_budget(2).build();
    assert_eq!(locks.lock_budget(), Some(2));
    let a = locks.acquire("a", None).await.expect("a");
    let b = locks
        .try_acquire("b")
        .await
        .expect("b")
        .into_handle()
        .expect("free");
    let err = locks.try_acquire("c").await.expect_err("over budget");
    assert!(
        matches!(
            err,
            Error::BudgetExhausted {
                held: 2,
                budget: 2,
                ..
            }
        ),
        "{err:?}"
    );
    // A lock handed from one caller to the next keeps its one place.
    let (next, released) = tokio::join!(locks.acquire("a", Some(BOUND)), async {
        tokio::task::yield_now().await;
        a.release().await
    });
    released.expect("release");
    let next = next.expect("handed over within the budget");
    drop((next, b));
    assert!(
        InMemoryLockManager::new().lock_budget().is_none(),
        "no limit by default"
    );
}
