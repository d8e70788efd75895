//! Locks across operating-system processes.
//!
//! * Mutual exclusion: several copies of this test binary, two tasks each, increment one
//!   counter row under one lock with a read and then a separate write. Any overlap of two
//!   critical sections loses an update, so the final value equals the number of critical
//!   sections only if the lock excluded every pair.
//! * A holder process that exits without releasing, or is killed, frees its lock: the server
//!   ends its session, and nothing of the manager outlives the process.
//!
//! Workers and holders are copies of this test binary, told their part by a command-line
//! argument (a test-name filter that matches no test), never by the environment.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::child::ChildOutput;
use common::{app_name, key, manager_named};
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

/// The holder process's role, passed on its command line (libtest takes it for a filter that
/// matches no test): an argument, unlike an environment variable, cannot leak into the test
/// run that spawns the holder and turn it into one.
const HOLDER_ROLE: &str = "pglock-test-holder-key=";

/// The key to hold, when this process is a holder process spawned by a test.
fn holder_role() -> Option<String> {
    std::env::args().find_map(|arg| arg.strip_prefix(HOLDER_ROLE).map(str::to_owned))
}

/// Runs this test binary again as a separate process holding `key`, and returns it once it
/// reports that it holds the lock.
fn spawn_holder_process(test_name: &str, key: &str) -> std::process::Child {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([test_name, "--exact", "--nocapture", "--test-threads=1"])
        .arg(format!("{HOLDER_ROLE}{key}"))
        .env("DATABASE_URL", common::url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder process");
    ChildOutput::read(child.stdout.take().expect("stdout")).until("HELD");
    child
}

/// The holder process's side: take the lock, say so, then exit or wait to be killed, never
/// releasing.
async fn act_as_holder_process(key: &str) -> ! {
    let locks = PostgresLockManager::new(common::pool(2).await);
    // Bounded, so a holder that cannot get the lock exits (and its parent fails) instead of
    // leaving the parent waiting for ever.
    let guard = locks
        .acquire(key, Some(Duration::from_secs(10)))
        .await
        .expect("the holder process takes the lock");
    // The test harness may have printed "test name ... " on this line already.
    println!("HELD");
    std::io::stdout().flush().expect("flush");
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .expect("read the parent's order");
    drop(std::hint::black_box(guard.leak()));
    // Exit without releasing: no destructor runs, the lock is left to the server.
    std::process::exit(0);
}

#[tokio::test]
async fn a_holder_process_that_exits_without_releasing_frees_the_lock() {
    if let Some(key) = holder_role() {
        act_as_holder_process(&key).await;
    }
    let key = key("holder-process-exit");
    let next = manager_named(&app_name("next"), 2).await;
    let mut child = spawn_holder_process(
        "a_holder_process_that_exits_without_releasing_frees_the_lock",
        &key,
    );
    assert!(
        next.try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none(),
        "the child holds it"
    );
    writeln!(child.stdin.take().expect("stdin"), "exit").expect("tell the child to exit");
    assert!(child.wait().expect("wait").success());
    let guard = next
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("the exited holder's lock was freed by the server");
    guard.release().await.expect("release");
}

#[tokio::test]
async fn a_killed_holder_process_frees_the_lock() {
    if let Some(key) = holder_role() {
        act_as_holder_process(&key).await;
    }
    let key = key("holder-process-kill");
    let next = manager_named(&app_name("next"), 2).await;
    let mut child = spawn_holder_process("a_killed_holder_process_frees_the_lock", &key);
    assert!(
        next.try_acquire(&key)
            .await
            .expect("try")
            .into_handle()
            .is_none(),
        "the child holds it"
    );
    child.kill().expect("SIGKILL the holder");
    child.wait().expect("wait");
    let guard = next
        .acquire(&key, Some(Duration::from_secs(10)))
        .await
        .expect("the killed holder's lock was freed by the server");
    guard.release().await.expect("release");
}
