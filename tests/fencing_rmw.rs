//! Fencing for read-modify-write.
//!
//! Several copies of this test binary, two tasks each, increment two counter rows under fenced
//! pglock locks (one key per counter), each increment a read and then a separate write, while
//! the parent terminates a random lock-holding backend every 80 to 250 ms. Each killed holder
//! carries on for up to a probe interval before it hears of the loss, overlapping the next
//! holder.
//!
//! * With the fence raised before the read (`RowFence::raise`, then a write that requires the
//!   very token), every increment a writer counted as accepted is in the counter, and stale
//!   holders are refused.
//! * With the check on the write alone (`... WHERE fence <= token`), accepted increments go
//!   missing: the reason the guide teaches the first pattern.
//!
//! The workers are this binary run again with a worker spec in `ROLE`. The spec names the
//! parent's process id, and a process whose parent is not that one refuses to act as a worker,
//! so a stray `ROLE` in the environment cannot turn the real test into a silent worker.

mod common;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use pglock::fence::Error as FenceError;
use pglock::{FencingTable, PostgresLockManager, RowFence, lock_id};
use sqlx::{AssertSqlSafe, PgPool};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

const PROCESSES: usize = 3;
const TASKS_PER_PROCESS: usize = 2;
const COUNTERS: usize = 2;
const PROBE_INTERVAL: Duration = Duration::from_millis(100);
/// The killer's random pause between two kills.
const KILL_EVERY_MS: (u64, u64) = (80, 250);
/// The "modify" of a read-modify-write: the time a real computation would take between the
/// read and the write (a stand-in for work, not for synchronisation). It widens the window in
/// which a killed holder's write races its successor's read, as real work does.
const COMPUTE: Duration = Duration::from_millis(1);
/// Every wait on a worker (its start, its report, its exit) is bounded by this.
const WORKER_DEADLINE: Duration = Duration::from_secs(60);

const ROLE: &str = "PGLOCK_TEST_FENCED_INCREMENTER";

/// How a worker protects its read-modify-write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pattern {
    /// The documented pattern: raise the fence to the token before reading, write only while
    /// the fence holds that token.
    RaiseBeforeRead,
    /// The write-side check alone: a plain read, then `... WHERE fence <= token`.
    WriteCheckOnly,
}

impl Pattern {
    fn as_str(self) -> &'static str {
        match self {
            Pattern::RaiseBeforeRead => "raise-before-read",
            Pattern::WriteCheckOnly => "write-check-only",
        }
    }

    fn parse(text: &str) -> Pattern {
        match text {
            "raise-before-read" => Pattern::RaiseBeforeRead,
            "write-check-only" => Pattern::WriteCheckOnly,
            other => panic!("unknown pattern {other:?}"),
        }
    }
}

/// What a worker process is told: who spawned it, how to increment, and what.
#[derive(Debug, Clone)]
struct Spec {
    parent: u32,
    pattern: Pattern,
    table: String,
    fencing_table: String,
    keys: Vec<String>,
    rows: Vec<Uuid>,
}

impl Spec {
    fn encode(&self) -> String {
        let rows: Vec<String> = self.rows.iter().map(Uuid::to_string).collect();
        [
            self.parent.to_string(),
            self.pattern.as_str().to_owned(),
            self.table.clone(),
            self.fencing_table.clone(),
            self.keys.join(","),
            rows.join(","),
        ]
        .join("|")
    }

    fn decode(text: &str) -> Spec {
        let parts: Vec<&str> = text.split('|').collect();
        assert_eq!(parts.len(), 6, "malformed {ROLE}: {text:?}");
        Spec {
            parent: parts[0].parse().expect("parent pid"),
            pattern: Pattern::parse(parts[1]),
            table: parts[2].to_owned(),
            fencing_table: parts[3].to_owned(),
            keys: parts[4].split(',').map(str::to_owned).collect(),
            rows: parts[5]
                .split(',')
                .map(|row| row.parse().expect("row id"))
                .collect(),
        }
    }
}

/// The worker spec, when this process was spawned as a worker by a parent test. Panics when
/// `ROLE` is set but this process's parent is not the one it names: the real test must never
/// quietly turn into a worker.
fn worker_spec() -> Option<Spec> {
    let text = std::env::var(ROLE).ok()?;
    let spec = Spec::decode(&text);
    let parent = std::os::unix::process::parent_id();
    assert_eq!(
        spec.parent, parent,
        "{ROLE} is set, but this process was not spawned by the test that set it (its parent \
         is {parent}); unset {ROLE} to run the test"
    );
    Some(spec)
}

/// One worker's counts for one counter.
#[derive(Debug, Default, Clone, Copy)]
struct Tally {
    accepted: u64,
    refused: u64,
    failed: u64,
}

enum Outcome {
    Accepted,
    Refused,
    /// The lock could not be acquired (its session was killed mid-acquisition, say).
    Failed,
}

/// A worker process: its tasks increment until the parent closes its stdin, then it reports.
async fn act_as_worker(spec: Spec) -> ! {
    let spec = Arc::new(spec);
    let pid = std::process::id();
    let lock_pool = common::pool_named(TASKS_PER_PROCESS as u32 + 2, &format!("rmw-{pid}")).await;
    let locks = PostgresLockManager::builder(lock_pool)
        .holder_id(format!("rmw-{pid}"))
        .fencing(FencingTable::new(&spec.fencing_table).expect("fencing table name"))
        .probe_interval(PROBE_INTERVAL)
        .build();
    locks.ensure_fencing_table().await.expect("fencing table");
    let resource = common::pool(TASKS_PER_PROCESS as u32 + 1).await;
    let stop = CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rest = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut rest).await;
            stop.cancel();
        }
    });
    println!("\nREADY");
    let tasks: Vec<_> = (0..TASKS_PER_PROCESS)
        .map(|task| {
            let (locks, resource, spec, stop) =
                (locks.clone(), resource.clone(), spec.clone(), stop.clone());
            tokio::spawn(
                async move { increment_until(task, &locks, &resource, &spec, &stop).await },
            )
        })
        .collect();
    let mut totals = [Tally::default(); COUNTERS];
    for task in tasks {
        for (total, tally) in totals.iter_mut().zip(task.await.expect("worker task")) {
            total.accepted += tally.accepted;
            total.refused += tally.refused;
            total.failed += tally.failed;
        }
    }
    for (counter, t) in totals.iter().enumerate() {
        println!(
            "\nTALLY {counter} {} {} {}",
            t.accepted, t.refused, t.failed
        );
    }
    println!("\nDONE");
    std::process::exit(0);
}

/// One task's loop, alternating between the counters.
async fn increment_until(
    task: usize,
    locks: &PostgresLockManager,
    resource: &PgPool,
    spec: &Spec,
    stop: &CancellationToken,
) -> [Tally; COUNTERS] {
    let mut tallies = [Tally::default(); COUNTERS];
    let mut counter = task % COUNTERS;
    while !stop.is_cancelled() {
        let tally = &mut tallies[counter];
        match increment(locks, resource, spec, counter).await {
            Outcome::Accepted => tally.accepted += 1,
            Outcome::Refused => {
                tally.refused += 1;
                println!("\nREFUSED");
            }
            Outcome::Failed => tally.failed += 1,
        }
        counter = (counter + 1) % COUNTERS;
    }
    tallies
}

/// One read-modify-write under the counter's lock.
async fn increment(
    locks: &PostgresLockManager,
    resource: &PgPool,
    spec: &Spec,
    counter: usize,
) -> Outcome {
    // An acquisition can fail when the killer ends a session under it (an in-process handoff
    // on a killed session, say); it is counted, and the task tries again.
    let Ok(guard) = locks
        .acquire(&spec.keys[counter], Some(Duration::from_secs(10)))
        .await
    else {
        return Outcome::Failed;
    };
    let token = guard.info().fencing_token.expect("fencing is on");
    let row = spec.rows[counter];
    let outcome = match spec.pattern {
        Pattern::RaiseBeforeRead => raise_before_read(resource, &spec.table, row, token).await,
        Pattern::WriteCheckOnly => write_check_only(resource, &spec.table, row, token).await,
    };
    // A killed holder's release reports the loss; there is nothing to undo either way.
    let _ = guard.release().await;
    outcome
}

async fn raise_before_read(resource: &PgPool, table: &str, row: Uuid, token: i64) -> Outcome {
    let fence = counter_fence(table);
    let (value,): (i64,) = match fence.raise(resource, row, token).await {
        Ok(read) => read,
        Err(FenceError::StaleToken { .. }) => return Outcome::Refused,
        Err(err) => panic!("raise: {err}"),
    };
    tokio::time::sleep(COMPUTE).await;
    match fence.write(resource, row, token, "value", value + 1).await {
        Ok(()) => Outcome::Accepted,
        Err(FenceError::StaleToken { .. }) => Outcome::Refused,
        Err(err) => panic!("write: {err}"),
    }
}

async fn write_check_only(resource: &PgPool, table: &str, row: Uuid, token: i64) -> Outcome {
    let value: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
        "SELECT value FROM \"{table}\" WHERE id = $1"
    )))
    .bind(row)
    .fetch_one(resource)
    .await
    .expect("read");
    tokio::time::sleep(COMPUTE).await;
    let written = sqlx::query(AssertSqlSafe(format!(
        "UPDATE \"{table}\" SET value = $3, fence = $2 \
         WHERE id = $1 AND (fence IS NULL OR fence <= $2)"
    )))
    .bind(row)
    .bind(token)
    .bind(value + 1)
    .execute(resource)
    .await
    .expect("write");
    if written.rows_affected() == 1 {
        Outcome::Accepted
    } else {
        Outcome::Refused
    }
}

fn counter_fence(table: &str) -> RowFence {
    RowFence::new(table, "id", "fence")
        .and_then(|fence| fence.returning(&["value"]))
        .expect("valid names")
}

/// xorshift64*: the killer's random schedule; the seed is printed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.next() % (high - low + 1)
    }
}

/// What one run of the workers and the killer came to.
#[derive(Debug, Default)]
struct Run {
    kills: u64,
    refused: u64,
    failed: u64,
    /// Per counter: increments the writers counted as accepted, and the counter's final value.
    accepted: Vec<u64>,
    finals: Vec<u64>,
    elapsed: Duration,
    /// Whether the run's goal was met before its time bound.
    reached: bool,
}

impl Run {
    fn accepted_total(&self) -> u64 {
        self.accepted.iter().sum()
    }

    fn lost(&self) -> u64 {
        self.accepted
            .iter()
            .zip(&self.finals)
            .map(|(accepted, value)| accepted.saturating_sub(*value))
            .sum()
    }
}

/// When a run may stop: after `min` and once the killer made `kills` kills and the workers
/// reported `refused` refusals; and at `max` at the latest.
struct Goal {
    min: Duration,
    max: Duration,
    kills: u64,
    refused: u64,
}

/// A worker process as the parent sees it.
struct Worker {
    child: Child,
    stdin: Option<ChildStdin>,
    report: JoinHandle<Vec<Tally>>,
}

/// Spawns one worker and a task reading its stdout (see `read_reports`).
fn spawn_worker(
    test: &str,
    spec: &Spec,
    ready: &tokio::sync::mpsc::Sender<()>,
    refused: &Arc<AtomicU64>,
) -> Worker {
    let mut child = Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(ROLE, spec.encode())
        .env("DATABASE_URL", common::url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn a worker process");
    let stdin = child.stdin.take();
    let stdout = child.stdout.take().expect("stdout");
    let report = tokio::spawn(read_reports(stdout, ready.clone(), refused.clone()));
    Worker {
        child,
        stdin,
        report,
    }
}

/// Follows a worker's output: signals `ready` when it starts, counts its refusals into
/// `refused` as they happen, and returns its final tallies. (The test harness may have
/// written "test name ... " at the start of a line, hence the markers' own lines.)
async fn read_reports(
    stdout: tokio::process::ChildStdout,
    ready: tokio::sync::mpsc::Sender<()>,
    refused: Arc<AtomicU64>,
) -> Vec<Tally> {
    let mut lines = BufReader::new(stdout).lines();
    let mut tallies = vec![Tally::default(); COUNTERS];
    let mut done = false;
    while let Ok(Some(line)) = lines.next_line().await {
        let line = line.trim();
        if line == "READY" {
            let _ = ready.send(()).await;
        } else if line == "REFUSED" {
            refused.fetch_add(1, Ordering::SeqCst);
        } else if let Some(counts) = line.strip_prefix("TALLY ") {
            let n: Vec<u64> = counts
                .split(' ')
                .map(|n| n.parse().expect("count"))
                .collect();
            tallies[n[0] as usize] = Tally {
                accepted: n[1],
                refused: n[2],
                failed: n[3],
            };
        } else if line == "DONE" {
            done = true;
        }
    }
    assert!(done, "the worker did not report (see its stderr)");
    tallies
}

/// Sets up two counters, runs `PROCESSES` workers with `pattern` while killing lock holders
/// until `goal`, stops the workers and reads the counters.
async fn run(test: &str, pattern: Pattern, goal: &Goal) -> Run {
    let db = common::pool(2).await;
    let spec = create_counters(&db, pattern).await;
    let refused = Arc::new(AtomicU64::new(0));
    let (ready_tx, mut ready) = tokio::sync::mpsc::channel(PROCESSES);
    let workers: Vec<Worker> = (0..PROCESSES)
        .map(|_| spawn_worker(test, &spec, &ready_tx, &refused))
        .collect();
    for _ in 0..PROCESSES {
        tokio::time::timeout(WORKER_DEADLINE, ready.recv())
            .await
            .expect("the workers start in time")
            .expect("a worker is ready");
    }
    let mut run = kill_holders(&db, &spec.keys, goal, &refused).await;
    (run.accepted, run.refused, run.failed) = stop_workers(workers).await;
    assert_eq!(
        run.refused,
        refused.load(Ordering::SeqCst),
        "the refusals reported at the end are those seen live"
    );
    run.finals = read_counters(&db, &spec.table, &spec.rows).await;
    clean_up(&db, &spec).await;
    run
}

/// A counters table with `COUNTERS` rows at zero, never fenced, and a spec for the workers.
async fn create_counters(db: &PgPool, pattern: Pattern) -> Spec {
    let suffix = Uuid::new_v4().simple().to_string();
    let spec = Spec {
        parent: std::process::id(),
        pattern,
        table: format!("pglock_test_rmw_{suffix}"),
        fencing_table: format!("pglock_test_rmw_tokens_{suffix}"),
        keys: (0..COUNTERS)
            .map(|c| common::key(&format!("rmw-{c}")))
            .collect(),
        rows: (0..COUNTERS).map(|_| Uuid::new_v4()).collect(),
    };
    sqlx::query(AssertSqlSafe(format!(
        "CREATE TABLE \"{}\" (id uuid PRIMARY KEY, value bigint NOT NULL DEFAULT 0, \
         fence bigint)",
        spec.table
    )))
    .execute(db)
    .await
    .expect("create the counters");
    for row in &spec.rows {
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO \"{}\" (id) VALUES ($1)",
            spec.table
        )))
        .bind(row)
        .execute(db)
        .await
        .expect("insert a counter");
    }
    spec
}

/// Closes the workers' stdin, which tells them to finish the increment at hand and report;
/// returns the increments they counted as accepted per counter, their refusals and their failed
/// acquisitions.
async fn stop_workers(mut workers: Vec<Worker>) -> (Vec<u64>, u64, u64) {
    for worker in &mut workers {
        worker.stdin.take();
    }
    let (mut accepted, mut refused, mut failed) = (vec![0; COUNTERS], 0, 0);
    for mut worker in workers {
        let tallies = tokio::time::timeout(WORKER_DEADLINE, &mut worker.report)
            .await
            .expect("the worker reports in time")
            .expect("the worker's report");
        let status = tokio::time::timeout(WORKER_DEADLINE, worker.child.wait())
            .await
            .expect("the worker exits in time")
            .expect("wait");
        assert!(status.success(), "a worker failed: {status}");
        for (counter, tally) in tallies.iter().enumerate() {
            accepted[counter] += tally.accepted;
            refused += tally.refused;
            failed += tally.failed;
        }
    }
    (accepted, refused, failed)
}

/// The workers are gone, so their locks must be too; then the run's tables go.
async fn clean_up(db: &PgPool, spec: &Spec) {
    for key in &spec.keys {
        common::eventually("the workers' locks are gone", || async {
            common::lock_rows(db, lock_id(key)).await.is_empty()
        })
        .await;
    }
    for name in [&spec.table, &spec.fencing_table] {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE \"{name}\"")))
            .execute(db)
            .await
            .expect("drop a test table");
    }
}

/// The killer: every 80 to 250 ms, terminates a random backend holding one of `keys`, until
/// the goal is reached or its time is up.
async fn kill_holders(db: &PgPool, keys: &[String], goal: &Goal, refused: &AtomicU64) -> Run {
    let seed = u64::from_le_bytes(Uuid::new_v4().as_bytes()[..8].try_into().expect("8 bytes"));
    println!("killer seed {seed:#x}");
    let mut rng = Rng(seed | 1);
    let started = tokio::time::Instant::now();
    let mut run = Run::default();
    loop {
        let elapsed = started.elapsed();
        run.reached = elapsed >= goal.min
            && run.kills >= goal.kills
            && refused.load(Ordering::SeqCst) >= goal.refused;
        if run.reached || elapsed >= goal.max {
            run.elapsed = elapsed;
            return run;
        }
        let pause = rng.between(KILL_EVERY_MS.0, KILL_EVERY_MS.1);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        let mut holders = Vec::new();
        for key in keys {
            let rows = common::lock_rows(db, lock_id(key)).await;
            holders.extend(rows.iter().filter(|row| row.granted).map(|row| row.pid));
        }
        if holders.is_empty() {
            continue;
        }
        let victim = holders[rng.between(0, holders.len() as u64 - 1) as usize];
        let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
            .bind(victim)
            .fetch_one(db)
            .await
            .expect("terminate a holder");
        run.kills += u64::from(killed);
    }
}

async fn read_counters(db: &PgPool, table: &str, rows: &[Uuid]) -> Vec<u64> {
    let mut values = Vec::new();
    for row in rows {
        let value: i64 = sqlx::query_scalar(AssertSqlSafe(format!(
            "SELECT value FROM \"{table}\" WHERE id = $1"
        )))
        .bind(row)
        .fetch_one(db)
        .await
        .expect("read a counter");
        values.push(u64::try_from(value).expect("a counter never goes below zero"));
    }
    values
}

fn describe(label: &str, run: &Run) -> String {
    format!(
        "{label}: {:.1} s, {} kills, {} accepted increments, {} in the counters ({} lost), \
         {} stale holders refused, {} failed acquisitions",
        run.elapsed.as_secs_f64(),
        run.kills,
        run.accepted_total(),
        run.finals.iter().sum::<u64>(),
        run.lost(),
        run.refused,
        run.failed,
    )
}

/// How long a run lasts at least: `default`, or `PGLOCK_FENCING_RMW_SECONDS` for longer runs
/// (the 20 s figures in `docs/failure-model.md`).
fn run_length(default: Duration) -> Duration {
    std::env::var("PGLOCK_FENCING_RMW_SECONDS").map_or(default, |seconds| {
        Duration::from_secs(
            seconds
                .parse()
                .expect("PGLOCK_FENCING_RMW_SECONDS must be a whole number of seconds"),
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raising_the_fence_before_the_read_loses_no_update() {
    if let Some(spec) = worker_spec() {
        act_as_worker(spec).await;
    }
    let goal = Goal {
        min: run_length(Duration::from_secs(4)),
        max: run_length(Duration::from_secs(4)) * 10,
        kills: 20,
        refused: 3,
    };
    let run = run(
        "raising_the_fence_before_the_read_loses_no_update",
        Pattern::RaiseBeforeRead,
        &goal,
    )
    .await;
    println!("{}", describe("fence raised before the read", &run));
    assert_eq!(
        run.finals, run.accepted,
        "every accepted increment, and nothing else, is in the counters"
    );
    // Not vacuous: holders were killed, and stale ones did try and were refused.
    assert!(
        run.reached,
        "within {:?}: at least {} kills and {} stale holders refused",
        goal.max, goal.kills, goal.refused
    );
    assert!(run.accepted_total() >= 100, "the workers made progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_write_side_check_alone_loses_updates() {
    if let Some(spec) = worker_spec() {
        act_as_worker(spec).await;
    }
    const ROUNDS: usize = 4;
    let goal = Goal {
        min: run_length(Duration::from_secs(3)),
        max: run_length(Duration::from_secs(3)) * 10,
        kills: 15,
        refused: 0,
    };
    let mut lost = 0;
    for round in 1..=ROUNDS {
        let run = run(
            "the_write_side_check_alone_loses_updates",
            Pattern::WriteCheckOnly,
            &goal,
        )
        .await;
        println!(
            "{}",
            describe(&format!("write check only, round {round}"), &run)
        );
        assert!(
            run.reached,
            "at least {} kills within {:?}",
            goal.kills, goal.max
        );
        assert!(
            run.finals.iter().zip(&run.accepted).all(|(v, a)| v <= a),
            "a counter holds more than was accepted: a refused write landed"
        );
        lost = run.lost();
        if lost > 0 {
            break;
        }
    }
    assert!(
        lost > 0,
        "in {ROUNDS} rounds, no accepted increment went missing with the write-side check alone"
    );
}

/// A table of two counter rows at 10, never fenced, under a name that would break out of an
/// unquoted statement, with its `RowFence` and three tokens in minting order.
struct Fixture {
    db: PgPool,
    quoted: String,
    fence: RowFence,
    row: Uuid,
    fresh: Uuid,
    tokens: [i64; 3],
}

impl Fixture {
    async fn new() -> Fixture {
        let db = common::pool(3).await;
        let table = format!(
            "rmw \"t\"; DROP TABLE x {}",
            &Uuid::new_v4().simple().to_string()[..12]
        );
        let quoted = format!("\"{}\"", table.replace('"', "\"\""));
        sqlx::query(AssertSqlSafe(format!(
            "CREATE TABLE {quoted} (id uuid PRIMARY KEY, value bigint NOT NULL, fence bigint)"
        )))
        .execute(&db)
        .await
        .expect("create");
        let (row, fresh) = (Uuid::new_v4(), Uuid::new_v4());
        for id in [row, fresh] {
            sqlx::query(AssertSqlSafe(format!(
                "INSERT INTO {quoted} (id, value) VALUES ($1, 10)"
            )))
            .bind(id)
            .execute(&db)
            .await
            .expect("insert");
        }
        let fence = counter_fence(&table);
        assert_eq!(
            fence.table(),
            quoted,
            "the name is quoted, whatever it holds"
        );
        let tokens = three_tokens().await;
        Fixture {
            db,
            quoted,
            fence,
            row,
            fresh,
            tokens,
        }
    }

    async fn raise(&self, row: Uuid, token: i64) -> pglock::fence::Result<i64> {
        let (value,): (i64,) = self.fence.raise(&self.db, row, token).await?;
        Ok(value)
    }

    async fn write(&self, row: Uuid, token: i64, value: i64) -> pglock::fence::Result<()> {
        self.fence.write(&self.db, row, token, "value", value).await
    }

    /// The row's value and fence as stored.
    async fn stored(&self, row: Uuid) -> (i64, Option<i64>) {
        sqlx::query_as(AssertSqlSafe(format!(
            "SELECT value, fence FROM {} WHERE id = $1",
            self.quoted
        )))
        .bind(row)
        .fetch_one(&self.db)
        .await
        .expect("read")
    }

    async fn drop_table(self) {
        sqlx::query(AssertSqlSafe(format!("DROP TABLE {}", self.quoted)))
            .execute(&self.db)
            .await
            .expect("drop");
    }
}

#[tokio::test]
async fn a_raised_fence_refuses_lower_tokens() {
    let f = Fixture::new().await;
    let [old, new, _] = f.tokens;
    // The first holder raises, reads and writes.
    assert_eq!(f.raise(f.row, old).await.unwrap(), 10);
    f.write(f.row, old, 11).await.unwrap();
    // A newer holder raises; the old one can neither write nor read any more.
    assert_eq!(f.raise(f.row, new).await.unwrap(), 11);
    let stale = f.write(f.row, old, 99).await.unwrap_err();
    assert!(
        matches!(&stale, FenceError::StaleToken { token, fence, .. } if (*token, *fence) == (old, new)),
        "{stale:?}"
    );
    assert_eq!(
        stale.to_string(),
        format!(
            "Stale fencing token {old} for row {} of {}: its fence is at {new}",
            f.row, f.quoted
        )
    );
    let stale = f.raise(f.row, old).await.unwrap_err();
    assert!(matches!(stale, FenceError::StaleToken { .. }), "{stale:?}");
    // The same token raises again (a retry, the same holder's next update), and writes.
    assert_eq!(f.raise(f.row, new).await.unwrap(), 11);
    f.write(f.row, new, 12).await.unwrap();
    assert_eq!(f.stored(f.row).await, (12, Some(new)));
    f.drop_table().await;
}

#[tokio::test]
async fn a_write_needs_a_raise_with_its_own_token() {
    let f = Fixture::new().await;
    let [_, new, newer] = f.tokens;
    assert_eq!(f.raise(f.row, new).await.unwrap(), 10);
    // Refused whether the token is higher than the fence or the row was never fenced.
    let err = f.write(f.row, newer, 0).await.unwrap_err();
    assert!(
        matches!(err, FenceError::NotRaised { fence: Some(fence), .. } if fence == new),
        "{err:?}"
    );
    let err = f.write(f.fresh, new, 0).await.unwrap_err();
    assert!(
        matches!(err, FenceError::NotRaised { fence: None, .. }),
        "{err:?}"
    );
    assert_eq!(f.stored(f.row).await, (10, Some(new)));
    assert_eq!(f.stored(f.fresh).await, (10, None));

    // Raise, compute and write in one transaction: rolled back, nothing changed.
    let mut tx = f.db.begin().await.expect("begin");
    let (value,): (i64,) = f.fence.raise(&mut tx, f.row, newer).await.unwrap();
    f.fence
        .write(&mut tx, f.row, newer, "value", value + 1)
        .await
        .unwrap();
    tx.rollback().await.expect("rollback");
    assert_eq!(f.stored(f.row).await, (10, Some(new)));
    f.drop_table().await;
}

#[tokio::test]
async fn missing_rows_bad_columns_and_bad_types_are_typed_errors() {
    let f = Fixture::new().await;
    let token = f.tokens[0];
    let missing = Uuid::new_v4();
    let err = f.raise(missing, token).await.unwrap_err();
    assert!(matches!(err, FenceError::RowNotFound { .. }), "{err:?}");
    let err = f.write(missing, token, 1).await.unwrap_err();
    assert!(matches!(err, FenceError::RowNotFound { .. }), "{err:?}");
    let err = f
        .fence
        .write(&f.db, f.row, token, "no_such_column", 1_i64)
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Failed { .. }), "{err:?}");
    let err = f
        .fence
        .write(&f.db, f.row, token, "", 1_i64)
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::InvalidIdentifier(_)), "{err:?}");
    let err = f
        .fence
        .raise::<_, _, (String,)>(&f.db, f.row, token)
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Failed { .. }), "{err:?}");
    f.drop_table().await;
}

/// Three tokens of successive acquisitions of one key, in the order they were minted.
async fn three_tokens() -> [i64; 3] {
    let fencing_table = format!("pglock_test_rmw_tokens_{}", Uuid::new_v4().simple());
    let locks = PostgresLockManager::builder(common::pool(2).await)
        .fencing(FencingTable::new(&fencing_table).expect("valid"))
        .build();
    let key = common::key("rmw-tokens");
    let mut tokens = [0; 3];
    for token in &mut tokens {
        let guard = locks.acquire(&key, None).await.expect("acquire");
        *token = guard.info().fencing_token.expect("fencing is on");
        guard.release().await.expect("release");
    }
    assert!(tokens[0] < tokens[1] && tokens[1] < tokens[2], "{tokens:?}");
    sqlx::query(AssertSqlSafe(format!("DROP TABLE \"{fencing_table}\"")))
        .execute(locks.pool())
        .await
        .expect("drop");
    tokens
}
