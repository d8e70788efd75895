//! Elect one leader among several replicas, lose it, and watch another take over.
//!
//! Three candidates run in this process, each with its own pool and lock manager (its own
//! holder, with the default identity `{host}:{pid}:{16 hex digits}`), as three replicas would.
//! Whoever leads runs the leader-only job: it writes "batches" to a row guarded by the term's
//! fencing token. Then an operator steps in twice:
//!
//! 1. the leader's lock session is terminated (`pg_terminate_backend`), as a crashed
//!    connection or a restarted database would end it: the leader's manager notices within its
//!    probe interval, its job is cancelled, and a follower takes over at its next attempt;
//! 2. the new leader resigns: its job is cancelled first, *then* its lock released, and the
//!    last candidate takes over.
//!
//! ```text
//! cargo run --example leader_election
//! DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres cargo run --example leader_election
//! ```
//!
//! Without `DATABASE_URL`, a throwaway PostgreSQL is started from the installed server
//! binaries, exactly as pglock's own tests do.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use pglock::leader::Error;
use pglock::{FencingTable, LeaderElection, Leadership, LockInfo, PostgresLockManager};
use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;
use tokio::sync::mpsc;
use tokio::time::Instant;
use uuid::Uuid;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const CANDIDATES: usize = 3;
/// How often a follower tries for the lock (plus up to 10 % jitter).
const RETRY: Duration = Duration::from_millis(300);
/// How often a manager checks that the server still holds its locks.
const PROBE: Duration = Duration::from_millis(100);
/// How often the leader writes a batch.
const BATCH_EVERY: Duration = Duration::from_millis(250);

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    // `DATABASE_URL` if set, otherwise a throwaway server (this blocks while it starts).
    let url = pglock_testing::database_url();
    let clock = Clock(Instant::now());

    // The resource the leader writes to: one row per run, guarded by a fence column.
    let run = Uuid::new_v4();
    let db = connect(url, 4).await?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS pglock_example_leader \
         (run_id uuid PRIMARY KEY, fence bigint NOT NULL, batches bigint NOT NULL)",
    )
    .execute(&db)
    .await?;
    sqlx::query("INSERT INTO pglock_example_leader VALUES ($1, 0, 0)")
        .bind(run)
        .execute(&db)
        .await?;

    let name = format!("examples-{run}");
    let (changes_tx, mut changes) = mpsc::unbounded_channel();
    let mut candidates = Vec::new();
    for n in 1..=CANDIDATES {
        let label = format!("replica-{n}");
        let locks = PostgresLockManager::builder(connect(url, 2).await?)
            .fencing(FencingTable::default())
            .probe_interval(PROBE)
            .build();
        let election = Arc::new(
            LeaderElection::builder(Arc::new(locks), &name)
                .retry_interval(RETRY)
                .build()?,
        );
        clock.say(&format!(
            "{label} campaigns for {} as {}",
            election.key(),
            election.holder_id()
        ));
        // Narrate every change of this candidate's leadership.
        let mut state = election.subscribe();
        let (tx, who) = (changes_tx.clone(), label.clone());
        tokio::spawn(async move {
            while state.changed().await.is_ok() {
                let now = state.borrow_and_update().clone();
                if tx.send((who.clone(), now)).is_err() {
                    break;
                }
            }
        });
        let job = tokio::spawn(lead_when_elected(
            label.clone(),
            Arc::clone(&election),
            db.clone(),
            run,
            clock,
        ));
        candidates.push((label, election, job));
    }
    drop(changes_tx);

    // Someone leads; let it work for a while.
    let (first, info) = next_leader(&mut changes, 0, clock).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 1. Its lock session dies behind its back.
    let pid: i32 = sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND classid = ($1 >> 32)::oid AND objid = ($1 & 4294967295)::oid",
    )
    .bind(info.lock_id)
    .fetch_one(&db)
    .await?;
    clock.say(&format!(
        "operator: terminating backend {pid}, the session holding {first}'s lock"
    ));
    let killed = Instant::now();
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&db)
        .await?;
    let (second, info) = next_leader(&mut changes, info.fencing_token.unwrap_or(0), clock).await?;
    clock.say(&format!(
        "failover took {:?} (probe every {PROBE:?}, retry every {RETRY:?})",
        killed.elapsed()
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;

    // 2. The new leader steps down gracefully.
    let (_, resigning, _) = candidates
        .iter()
        .find(|(label, ..)| *label == second)
        .expect("a candidate");
    clock.say(&format!("operator: asking {second} to resign"));
    let released = resigning.resign().await?;
    clock.say(&format!(
        "{second} resigned: lock released ({released}), after its job was cancelled"
    ));
    next_leader(&mut changes, info.fencing_token.unwrap_or(0), clock).await?;
    tokio::time::sleep(Duration::from_millis(700)).await;

    // Shutdown: everyone resigns, the leader last (so no follower takes over); the jobs end.
    clock.say("operator: shutting down");
    candidates.sort_by_key(|(_, election, _)| election.is_leader());
    for (label, election, _) in &candidates {
        if election.resign().await? {
            clock.say(&format!("{label} resigned and released the lock"));
        }
    }
    for (_, _, job) in candidates {
        job.await??;
    }
    let (fence, batches): (i64, i64) =
        sqlx::query_as("SELECT fence, batches FROM pglock_example_leader WHERE run_id = $1")
            .bind(run)
            .fetch_one(&db)
            .await?;
    sqlx::query("DELETE FROM pglock_example_leader WHERE run_id = $1")
        .bind(run)
        .execute(&db)
        .await?;
    clock.say(&format!(
        "{batches} batches written by three successive leaders; the last token accepted: {fence}"
    ));
    Ok(())
}

/// One replica's life: whenever it is elected, run the leader-only job until the term ends.
async fn lead_when_elected(
    label: String,
    election: Arc<LeaderElection>,
    db: PgPool,
    run: Uuid,
    clock: Clock,
) -> Result<(), Error> {
    loop {
        let job = |info| write_batches(&label, &db, run, info, clock);
        match election.run_as_leader(None, job).await {
            Ok(never) => match never {},
            Err(Error::Lock(pglock::Error::LockLost { cause, .. })) => {
                clock.say(&format!("{label}: lock lost ({cause}); job cancelled"));
            }
            Err(Error::Stopped { .. }) => return Ok(()),
            Err(other) => return Err(other),
        }
    }
}

/// The leader-only job: a batch every `BATCH_EVERY`, each a write fenced by the term's token.
async fn write_batches(
    label: &str,
    db: &PgPool,
    run: Uuid,
    info: LockInfo,
    clock: Clock,
) -> Infallible {
    let token = info.fencing_token.expect("fencing is on");
    let mut batch = 0;
    loop {
        batch += 1;
        // Accepted only if no newer leader has written: a deposed leader that has not heard
        // of its loss yet cannot overwrite its successor.
        let accepted = sqlx::query(
            "UPDATE pglock_example_leader SET fence = $2, batches = batches + 1 \
             WHERE run_id = $1 AND fence <= $2",
        )
        .bind(run)
        .bind(token)
        .execute(db)
        .await
        .map(|done| done.rows_affected() == 1);
        let verdict = match accepted {
            Ok(true) => "written",
            Ok(false) => "REJECTED by the fence",
            Err(_) => "failed",
        };
        clock.say(&format!("{label} (token {token}): batch {batch} {verdict}"));
        tokio::time::sleep(BATCH_EVERY).await;
    }
}

/// Reads leadership changes until someone leads with a token above `after`, narrating them.
async fn next_leader(
    changes: &mut mpsc::UnboundedReceiver<(String, Leadership)>,
    after: i64,
    clock: Clock,
) -> Result<(String, LockInfo), BoxError> {
    while let Some((label, state)) = changes.recv().await {
        match state {
            Leadership::Leader(info) => {
                clock.say(&format!(
                    "{label} is the leader now (token {})",
                    info.fencing_token.unwrap_or(0)
                ));
                if info.fencing_token.unwrap_or(0) > after {
                    return Ok((label, info));
                }
            }
            _ => clock.say(&format!("{label} is a follower now")),
        }
    }
    Err("every campaign ended".into())
}

/// Timestamps for the story.
#[derive(Debug, Clone, Copy)]
struct Clock(Instant);

impl Clock {
    fn say(&self, line: &str) {
        let elapsed = self.0.elapsed();
        println!(
            "[{:>2}.{:03}s] {line}",
            elapsed.as_secs(),
            elapsed.subsec_millis()
        );
    }
}

async fn connect(url: &str, max: u32) -> Result<PgPool, sqlx::Error> {
    PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(10))
        .connect(url)
        .await
}
