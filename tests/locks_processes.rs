//! Mutual exclusion across operating-system processes: several copies of this test binary, two
//! tasks each, increment one counter row under one lock with a read and then a separate write.
//! Any overlap of two critical sections loses an update, so the final value equals the number of
//! critical sections only if the lock excluded every pair.

mod common;

use std::time::Duration;

use common::child::ChildOutput;
use pglock::PostgresLockManager;
use sqlx::PgPool;

const PROCESSES: usize = 4;
const TASKS_PER_PROCESS: usize = 2;
const INCREMENTS_PER_TASK: i64 = 40;
const ROUNDS: usize = 3;

/// A worker's role, passed on its command line (libtest takes it for a filter that matches no
/// test): an argument, unlike an environment variable, cannot leak into the test run that
/// spawns the workers and turn it into a worker.
const ROLE: &str = "pglock-test-counter-worker=";

/// One critical section: read, then write the value read plus one.
async fn increment(locks: &PostgresLockManager, counters: &PgPool, key: &str, row: uuid::Uuid) {
    let guard = locks
        .acquire(key, Some(Duration::from_secs(60)))
        .await
        .expect("acquire");
    let value: i64 = sqlx::query_scalar("SELECT value FROM pglock_test_counter WHERE id = $1")
        .bind(row)
        .fetch_one(counters)
        .await
        .expect("read");
    sqlx::query("UPDATE pglock_test_counter SET value = $2 WHERE id = $1")
        .bind(row)
        .bind(value + 1)
        .execute(counters)
        .await
        .expect("write");
    guard.release().await.expect("release confirmed");
}

/// A worker process: its tasks run their increments, then it reports how many it did.
async fn act_as_worker(spec: &str) -> ! {
    let (key, row) = spec.split_once('|').expect("key|row");
    let row: uuid::Uuid = row.parse().expect("row id");
    let locks = PostgresLockManager::builder(common::pool(TASKS_PER_PROCESS as u32 + 1).await)
        .holder_id(format!("worker-{}", std::process::id()))
        .build();
    let counters = common::pool(TASKS_PER_PROCESS as u32).await;
    let mut tasks = Vec::new();
    for _ in 0..TASKS_PER_PROCESS {
        let (locks, counters, key) = (locks.clone(), counters.clone(), key.to_owned());
        tasks.push(tokio::spawn(async move {
            for _ in 0..INCREMENTS_PER_TASK {
                increment(&locks, &counters, &key, row).await;
            }
            INCREMENTS_PER_TASK
        }));
    }
    let mut done = 0;
    for task in tasks {
        done += task.await.expect("worker task");
    }
    println!("\nDONE {done}");
    std::process::exit(0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_never_overlap_in_the_critical_section() {
    if let Some(spec) = common::child::role(ROLE) {
        act_as_worker(&spec).await;
    }
    let setup = common::pool(2).await;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pglock_test_counter (id uuid PRIMARY KEY, value bigint NOT NULL)",
    )
    .execute(&setup)
    .await
    .expect("create the counter table");

    for round in 0..ROUNDS {
        let row = uuid::Uuid::new_v4();
        let key = common::key("multiprocess");
        sqlx::query("INSERT INTO pglock_test_counter (id, value) VALUES ($1, 0)")
            .bind(row)
            .execute(&setup)
            .await
            .expect("insert");
        let workers: Vec<_> = (0..PROCESSES)
            .map(|_| {
                common::child::spawn_self(
                    "processes_never_overlap_in_the_critical_section",
                    ROLE,
                    &format!("{key}|{row}"),
                )
            })
            .collect();
        let mut sections = 0;
        for mut worker in workers {
            let output = ChildOutput::read(worker.stdout.take().expect("stdout"));
            let line = output.until("DONE ");
            let reported: i64 = line
                .rsplit("DONE ")
                .next()
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or_else(|| panic!("a count in {line:?}"));
            assert!(worker.wait().expect("wait").success());
            sections += reported;
        }
        let value: i64 = sqlx::query_scalar("SELECT value FROM pglock_test_counter WHERE id = $1")
            .bind(row)
            .fetch_one(&setup)
            .await
            .expect("read the counter");
        let expected = (PROCESSES * TASKS_PER_PROCESS) as i64 * INCREMENTS_PER_TASK;
        println!("round {round}: {sections} critical sections, counter {value}");
        assert_eq!(sections, expected, "every worker finished every increment");
        assert_eq!(
            value, sections,
            "an update was lost: two critical sections overlapped"
        );
    }
}
