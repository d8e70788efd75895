//! Locks behind PgBouncer in transaction pooling mode: `TransactionLock` on the application's
//! own transactions.
//!
//! In transaction mode PgBouncer lends a server connection to a client from `BEGIN` to
//! `COMMIT` only, and hands it to another client afterwards. A transaction-scoped advisory
//! lock lives exactly that long, so it works there. A session lock would outlive the
//! transaction on a server connection that then serves other clients.
//!
//! Four replicas (each with its own small pool through the pooler, as four processes would
//! have) increment one counter row, each increment a transaction that takes a
//! `TransactionLock` on the same key, reads the row, works a little, and writes the new value.
//! Two transactions interleaving between the read and the write would both write the same value
//! and lose an increment. Under the lock none is lost, although the transactions ran on several
//! server connections behind the pooler. Last, a `PostgresLockManager` (session locks) is
//! pointed at a transaction pooler, and its first lock is refused with
//! `Error::TransactionPooling` before anything is taken.
//!
//! ```text
//! cargo run --example transaction_lock_pgbouncer
//! DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --example transaction_lock_pgbouncer
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do. PgBouncer is started by `pglock-testing` from
//! the installed binary (`apt-get install pgbouncer`, or point `PGLOCK_PGBOUNCER` at one).
//!
//! PgBouncer 1.18 cannot pool sqlx's prepared statements in transaction mode: statements with
//! bind parameters run inside the transaction with `.persistent(false)`. `TransactionLock`
//! itself sends only unprepared statements.

use std::collections::BTreeSet;
use std::time::Duration;

use pglock::{Error, PostgresLockManager, TransactionLock};
use pglock_testing::{PoolMode, TempPgBouncer};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::task::JoinSet;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const REPLICAS: usize = 4;
const INCREMENTS_PER_REPLICA: i64 = 25;
/// PgBouncer's server connections: fewer than the replicas' transactions, as in production.
const SERVER_CONNECTIONS: u32 = 3;
const COUNTER: &str = "orders";

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // `DATABASE_URL` if set, otherwise a throwaway server (this blocks while it starts).
    let url = pglock_testing::database_url();
    let bouncer = pgbouncer(url, SERVER_CONNECTIONS);

    // A table and a key of this run's own, so runs never see each other's data.
    let table = format!("pglock_example_xact_{}", Uuid::new_v4().simple());
    let key = format!("examples:transaction-lock-pgbouncer:{table}");
    let direct = PgPoolOptions::new().max_connections(1).connect(url).await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE {table} (name text PRIMARY KEY, n bigint NOT NULL); \
         INSERT INTO {table} VALUES ('{COUNTER}', 0)"
    )))
    .execute(&direct)
    .await?;

    let mut replicas = JoinSet::new();
    for _ in 0..REPLICAS {
        let pool = connect(&bouncer, 2).await?;
        let (table, key) = (table.clone(), key.clone());
        replicas.spawn(async move {
            let mut server_pids = BTreeSet::new();
            for _ in 0..INCREMENTS_PER_REPLICA {
                server_pids.insert(increment(&pool, &table, &key).await?);
            }
            Ok::<_, BoxError>(server_pids)
        });
    }
    let mut server_pids = BTreeSet::new();
    while let Some(replica) = replicas.join_next().await {
        server_pids.extend(replica??);
    }

    let (n,): (i64,) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT n FROM {table} WHERE name = $1"
    )))
    .bind(COUNTER)
    .fetch_one(&direct)
    .await?;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("DROP TABLE {table}")))
        .execute(&direct)
        .await?;
    let expected = REPLICAS as i64 * INCREMENTS_PER_REPLICA;
    println!(
        "{REPLICAS} replicas through PgBouncer (transaction mode, {SERVER_CONNECTIONS} server \
         connections): counter {n}, expected {expected}; the transactions ran on {} server \
         connection(s)",
        server_pids.len()
    );
    assert_eq!(n, expected, "{} increment(s) were lost", expected - n);
    assert!(
        server_pids.len() >= 2,
        "every transaction ran on one server connection ({server_pids:?}): the pooler, not \
         the lock, kept them apart"
    );
    println!("no increment was lost: the TransactionLock kept the read-modify-writes apart");

    // Session locks through a transaction pooler are refused before anything is taken: the
    // manager's check of the server, at its first lock, opens a second session of its own,
    // which the pooler hands the server connection the first one set up.
    let single = pgbouncer(url, 1);
    let locks = PostgresLockManager::new(connect(&single, 2).await?);
    match locks.acquire(&key, Some(Duration::from_secs(10))).await {
        Err(err @ Error::TransactionPooling { .. }) => {
            println!("a session lock through the pooler is refused: {err}");
        }
        other => panic!("expected Error::TransactionPooling, got {other:?}"),
    }
    assert_eq!(locks.held_lock_count(), 0, "nothing was taken");
    Ok(())
}

/// One increment: a transaction that holds the lock from its first statement to its commit.
/// Returns the server process (behind the pooler) that ran it.
async fn increment(pool: &PgPool, table: &str, key: &str) -> Result<i32, BoxError> {
    let mut tx = pool.begin().await?;
    // Wait at most 30 seconds; the lock is released when the transaction ends.
    TransactionLock::exclusive(key)
        .acquire(&mut tx, Some(Duration::from_secs(30)))
        .await?;
    let (n, server_pid): (i64, i32) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT n, pg_backend_pid() FROM {table} WHERE name = $1"
    )))
    .bind(COUNTER)
    .persistent(false)
    .fetch_one(&mut *tx)
    .await?;
    // Some work between the read and the write: without the lock, others would write meanwhile.
    tokio::time::sleep(Duration::from_millis(2)).await;
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "UPDATE {table} SET n = $1 WHERE name = $2"
    )))
    .bind(n + 1)
    .bind(COUNTER)
    .persistent(false)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(server_pid)
}

/// A PgBouncer in transaction mode in front of `url`; fails with pglock-testing's message
/// (which says how to install it) when there is no PgBouncer.
fn pgbouncer(url: &str, server_connections: u32) -> TempPgBouncer {
    TempPgBouncer::start(url, PoolMode::Transaction, server_connections)
        .unwrap_or_else(|err| panic!("could not start PgBouncer: {err}"))
}

/// A replica's small pool of client connections through the pooler.
async fn connect(bouncer: &TempPgBouncer, max: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(bouncer.options())
        .await
}
