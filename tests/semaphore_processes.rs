//! Semaphores across operating-system processes, checked through a fenced resource.
//!
//! Holders record themselves in a table while they hold a permit: one row per slot, written
//! with the slot's fencing token, under a row lock that serialises entries. An entry removes a
//! row of its slot with a lower token (a holder that died inside) and counts the rows: more
//! rows than permits means more holders than permits. An exit deletes its own row: finding it
//! gone means someone else entered the same slot meanwhile, two holders of one permit.
//!
//! Workers are copies of this test binary, told their part by a command-line argument (a
//! test-name filter that matches no test), never by the environment.

mod common;

use std::process::Child;
use std::time::Duration;

use common::child::ChildOutput;
use pglock::semaphore::{Permit, Semaphore};
use pglock::{FencingTable, LockManager, PostgresLockManager};
use rustix::process::{Pid, Signal, kill_process};
use sqlx::PgPool;

const ROLE: &str = "pglock-test-semaphore-worker=";
const PERMITS: usize = 3;
const WORKERS: usize = 4;
const TASKS: usize = 2;
const ENTRIES: usize = 15;
const BOUND: Duration = Duration::from_secs(60);

fn spawn_worker(test: &str, spec: &str) -> Child {
    common::child::spawn_self(test, ROLE, spec)
}

async fn fenced_semaphore(name: &str, permits: usize, connections: u32) -> Semaphore {
    let locks = PostgresLockManager::builder(common::pool(connections).await)
        .holder_id(format!("semaphore-worker-{}", std::process::id()))
        .fencing(FencingTable::default())
        .build();
    let locks: std::sync::Arc<dyn LockManager> = std::sync::Arc::new(locks);
    Semaphore::builder(locks, name, permits)
        .build()
        .expect("valid")
}

async fn tables(pool: &PgPool, name: &str) {
    sqlx::raw_sql(
        // Both tests may create them at once: serialised, since concurrent `IF NOT EXISTS`
        // creations of one table can still collide.
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('pglock_test_sem_tables')); \
         CREATE TABLE IF NOT EXISTS pglock_test_sem_gate (sem text PRIMARY KEY); \
         CREATE TABLE IF NOT EXISTS pglock_test_sem_inside (sem text NOT NULL, slot int NOT NULL, \
           token bigint NOT NULL, holder text NOT NULL, PRIMARY KEY (sem, slot)); COMMIT",
    )
    .execute(pool)
    .await
    .expect("create the resource tables");
    sqlx::query("INSERT INTO pglock_test_sem_gate VALUES ($1)")
        .bind(name)
        .execute(pool)
        .await
        .expect("the semaphore's gate row");
}

/// What one entry into the resource saw.
struct Entry {
    /// Rows of holders inside, this one included.
    inside: i64,
    /// Rows of this slot left by a holder with a lower token (one that died inside).
    replaced: u64,
    /// A row of this slot with this token or a higher one: a newer holder of the same slot.
    overtaken: bool,
}

/// Records `permit`'s holder inside the resource, fenced by the slot's token.
async fn enter(pool: &PgPool, name: &str, permit: &Permit, holder: &str) -> Entry {
    let token = permit.info().fencing_token.expect("fenced");
    let slot = i32::try_from(permit.slot()).expect("small");
    let mut tx = pool.begin().await.expect("begin");
    sqlx::query("SELECT FROM pglock_test_sem_gate WHERE sem = $1 FOR UPDATE")
        .bind(name)
        .execute(&mut *tx)
        .await
        .expect("the gate");
    let replaced = sqlx::query(
        "DELETE FROM pglock_test_sem_inside WHERE sem = $1 AND slot = $2 AND token < $3",
    )
    .bind(name)
    .bind(slot)
    .bind(token)
    .execute(&mut *tx)
    .await
    .expect("replace a dead holder")
    .rows_affected();
    let overtaken: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT FROM pglock_test_sem_inside WHERE sem = $1 AND slot = $2)",
    )
    .bind(name)
    .bind(slot)
    .fetch_one(&mut *tx)
    .await
    .expect("look for a newer holder");
    if !overtaken {
        sqlx::query("INSERT INTO pglock_test_sem_inside VALUES ($1, $2, $3, $4)")
            .bind(name)
            .bind(slot)
            .bind(token)
            .bind(holder)
            .execute(&mut *tx)
            .await
            .expect("enter");
    }
    let inside: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pglock_test_sem_inside WHERE sem = $1")
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .expect("count");
    tx.commit().await.expect("commit");
    Entry {
        inside,
        replaced,
        overtaken,
    }
}

/// Removes `permit`'s holder from the resource; false if its row was gone.
async fn leave(pool: &PgPool, name: &str, permit: &Permit) -> bool {
    let slot = i32::try_from(permit.slot()).expect("small");
    sqlx::query("DELETE FROM pglock_test_sem_inside WHERE sem = $1 AND slot = $2 AND token = $3")
        .bind(name)
        .bind(slot)
        .bind(permit.info().fencing_token.expect("fenced"))
        .execute(pool)
        .await
        .expect("leave")
        .rows_affected()
        == 1
}

/// A worker: its tasks enter and leave the resource under permits, then it reports how many
/// entries it made, the most holders it saw inside, and every violation.
async fn work(name: &str) -> ! {
    let semaphore = fenced_semaphore(name, PERMITS, TASKS as u32 + 1).await;
    let pool = common::pool(TASKS as u32).await;
    let mut tasks = tokio::task::JoinSet::new();
    for task in 0..TASKS {
        let (semaphore, pool, name) = (semaphore.clone(), pool.clone(), name.to_owned());
        let holder = format!("{}-{task}", std::process::id());
        tasks.spawn(async move {
            let (mut most, mut violations) = (0, Vec::new());
            for _ in 0..ENTRIES {
                let permit = semaphore.acquire(Some(BOUND)).await.expect("a permit");
                let entry = enter(&pool, &name, &permit, &holder).await;
                most = most.max(entry.inside);
                if entry.inside > PERMITS as i64 || entry.overtaken || entry.replaced > 0 {
                    violations.push(format!(
                        "inside {} overtaken {} replaced {}",
                        entry.inside, entry.overtaken, entry.replaced
                    ));
                }
                // The work done under the permit: long enough that holders overlap and every
                // permit is out at once (a semaphore that let one more in would show it).
                sqlx::query("SELECT pg_sleep(0.02)")
                    .execute(&pool)
                    .await
                    .expect("work");
                if !leave(&pool, &name, &permit).await {
                    violations.push(format!("slot {} entered by another", permit.slot()));
                }
                permit.release().await.expect("release");
            }
            (most, violations)
        });
    }
    let (mut most, mut violations) = (0, Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (task_most, task_violations) = done.expect("a task");
        most = most.max(task_most);
        violations.extend(task_violations);
    }
    println!(
        "\nDONE {} {most} {}",
        TASKS * ENTRIES,
        violations.join("; ")
    );
    std::process::exit(0);
}

/// A worker that takes a permit, enters the resource and stays there until it is killed.
async fn hold(name: &str) -> ! {
    let semaphore = fenced_semaphore(name, 2, 2).await;
    let pool = common::pool(1).await;
    let permit = semaphore.acquire(Some(BOUND)).await.expect("a permit");
    enter(&pool, name, &permit, "held").await;
    println!(
        "\nHOLDING {} {}",
        permit.slot(),
        permit.info().fencing_token.expect("fenced")
    );
    std::future::pending::<()>().await;
    unreachable!()
}

async fn act_as_worker(spec: &str) -> ! {
    match spec.split_once('|') {
        Some(("work", name)) => work(name).await,
        Some(("hold", name)) => hold(name).await,
        _ => panic!("unknown worker spec {spec:?}"),
    }
}

/// Four processes of two tasks each enter the resource fifteen times each under a semaphore of
/// three permits: never more than three inside, never two in one slot, and all three used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_never_hold_more_permits_than_there_are() {
    if let Some(spec) = common::child::role(ROLE) {
        act_as_worker(&spec).await;
    }
    let name = common::key("semaphore-processes");
    let pool = common::pool(2).await;
    tables(&pool, &name).await;
    let workers: Vec<Child> = (0..WORKERS)
        .map(|_| {
            spawn_worker(
                "processes_never_hold_more_permits_than_there_are",
                &format!("work|{name}"),
            )
        })
        .collect();
    let (mut entries, mut most) = (0, 0);
    for mut worker in workers {
        let output = ChildOutput::read(worker.stdout.take().expect("stdout"));
        let line = output.until("DONE ");
        let report = line.rsplit("DONE ").next().expect("a report");
        let mut fields = report.splitn(3, ' ');
        entries += fields
            .next()
            .and_then(|n| n.parse::<usize>().ok())
            .expect("entries");
        most = most.max(
            fields
                .next()
                .and_then(|n| n.parse::<i64>().ok())
                .expect("most"),
        );
        let violations = fields.next().unwrap_or("").trim();
        assert!(violations.is_empty(), "violations: {violations}");
        assert!(worker.wait().expect("the worker exits").success());
    }
    assert_eq!(entries, WORKERS * TASKS * ENTRIES);
    assert_eq!(
        most, PERMITS as i64,
        "all permits were out at once, and no more"
    );
    let left: i64 =
        sqlx::query_scalar("SELECT count(*) FROM pglock_test_sem_inside WHERE sem = $1")
            .bind(&name)
            .fetch_one(&pool)
            .await
            .expect("count");
    assert_eq!(left, 0, "every holder left");
    let semaphore = fenced_semaphore(&name, PERMITS, 4).await;
    let mut all = Vec::new();
    for _ in 0..PERMITS {
        let permit = semaphore.try_acquire().await.expect("try");
        all.push(permit.into_handle().expect("no permit leaked"));
    }
}

/// A holder frozen inside (SIGSTOP) keeps its permit: the others get one fewer. Killed, its
/// permit comes back, and the next holder of its slot replaces its row with a higher token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_holder_keeps_its_permit_and_a_killed_one_gives_it_back() {
    if let Some(spec) = common::child::role(ROLE) {
        act_as_worker(&spec).await;
    }
    let name = common::key("semaphore-kill");
    let pool = common::pool(2).await;
    tables(&pool, &name).await;
    let mut holder = spawn_worker(
        "a_frozen_holder_keeps_its_permit_and_a_killed_one_gives_it_back",
        &format!("hold|{name}"),
    );
    let output = ChildOutput::read(holder.stdout.take().expect("stdout"));
    let line = output.until("HOLDING ");
    let mut fields = line.rsplit("HOLDING ").next().expect("a report").split(' ');
    let dead_slot: usize = fields.next().and_then(|n| n.parse().ok()).expect("slot");
    let dead_token: i64 = fields
        .next()
        .and_then(|n| n.trim().parse().ok())
        .expect("token");

    kill_process(Pid::from_child(&holder), Signal::STOP).expect("SIGSTOP the holder");
    let semaphore = fenced_semaphore(&name, 2, 4).await;
    let other = semaphore
        .acquire(Some(BOUND))
        .await
        .expect("the free permit");
    assert_ne!(other.slot(), dead_slot);
    let none = semaphore.acquire(Some(Duration::from_millis(300))).await;
    assert!(
        matches!(&none, Err(err) if err.is_timeout()),
        "the frozen holder still has its permit: {none:?}"
    );

    holder.kill().expect("SIGKILL the frozen holder");
    holder.wait().expect("reaped");
    let taken_over = semaphore
        .acquire(Some(BOUND))
        .await
        .expect("the killed holder's permit comes back");
    assert_eq!(taken_over.slot(), dead_slot);
    let token = taken_over.info().fencing_token.expect("fenced");
    assert!(token > dead_token, "token {token} after {dead_token}");
    let entry = enter(&pool, &name, &taken_over, "next").await;
    assert_eq!(entry.replaced, 1, "the dead holder's row is replaced");
    assert!(!entry.overtaken);
    assert!(leave(&pool, &name, &taken_over).await);
    other.release().await.expect("release");
    taken_over.release().await.expect("release");
}
