//! The workload of one worker process: tasks doing critical sections, readers' sections,
//! fenced increments, leader terms and scheduled-job runs, each operation reported to the
//! parent as it is invoked and as it ends (see [`Emit`]). The acquisitions and releases of the
//! locks that sections, reads and increments take are reported as operations of their own
//! (`workload/held.rs`), for the checker's model.

mod held;
mod sections;

use std::io::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pglock::schedule::{RunOutcome, ScheduledJob};
use pglock::{LeaderElection, LockManager};

use crate::history::{Op, Outcome, Record, now_us};
use crate::resource::{Resource, Write};
use crate::rng::Rng;
use crate::spec::{Mode, names};

/// How long an acquisition may wait: short, so a partition shows as failures, not a hang.
const ACQUIRE: Duration = Duration::from_secs(3);
/// How long a candidate waits to be elected before it records a failed term.
const ELECTION: Duration = Duration::from_secs(5);

/// Reports operations to the parent on stdout, one line each: `I task json` when invoked and
/// `E task json` when over. A task has at most one operation of each kind in flight at a time
/// (a section and the acquisition inside it, say), so the parent can turn what a killed worker
/// had in flight into `info` records.
#[derive(Debug, Clone)]
pub struct Emit {
    process: String,
    holder: String,
}

impl Emit {
    /// Reports for the worker `process`, whose lock manager's holder id is `holder`.
    pub fn new(process: &str, holder: &str) -> Emit {
        Emit {
            process: process.to_owned(),
            holder: holder.to_owned(),
        }
    }

    /// The holder a task's records name: the manager's holder id and the task.
    pub fn holder(&self, task: u32) -> String {
        format!("{}/{task}", self.holder)
    }

    /// An operation's record, not reported yet.
    pub fn record(&self, task: u32, op: Op, key: &str) -> Record {
        Record {
            process: self.process.clone(),
            task,
            op,
            key: key.to_owned(),
            start_us: 0,
            end_us: 0,
            outcome: Outcome::Info,
            token: None,
            value: None,
            detail: None,
            holder: Some(self.holder(task)),
            seq: None,
        }
    }

    /// Reports an operation's invocation, now, and returns its record, to be completed.
    pub fn invoke(&self, task: u32, op: Op, key: &str) -> Record {
        self.start(self.record(task, op, key))
    }

    /// Reports the invocation of `record`, now, and returns it, to be completed.
    pub fn start(&self, mut record: Record) -> Record {
        record.start_us = now_us();
        record.outcome = Outcome::Info;
        line('I', &record);
        record
    }

    /// Reports an operation's end.
    pub fn complete(&self, mut record: Record, outcome: Outcome) {
        record.end_us = now_us();
        record.outcome = outcome;
        line('E', &record);
    }
}

fn line(kind: char, record: &Record) {
    let json = serde_json::to_string(record).expect("a record serialises");
    let mut out = std::io::stdout().lock();
    // The parent reads these lines; if it is gone, so is the run.
    let _ = writeln!(out, "{kind} {} {json}", record.task);
    let _ = out.flush();
}

/// What every task of a worker shares.
#[derive(Clone)]
pub struct Ctx {
    /// The worker's lock manager, through its proxy (broken on purpose in
    /// [`Mode::BrokenLock`]).
    pub locks: Arc<dyn LockManager>,
    /// The fenced resource.
    pub resource: Resource,
    /// The scheduled job, on the lock server.
    pub job: ScheduledJob,
    /// How the work is protected.
    pub mode: Mode,
    /// Where operations are reported.
    pub emit: Emit,
    /// Set when the parent asks the worker to finish.
    pub stop: Stop,
}

/// One task's loop until the worker is told to stop: tasks 0 and 1 of every four run
/// sections (40%), readers' sections (20%) and increments (40%), task 2 campaigns for
/// leadership, task 3 ticks the scheduled job.
pub async fn run_task(ctx: Ctx, task: u32, mut rng: Rng) {
    while !ctx.stop.is_stopped() {
        match task % 4 {
            0 | 1 => match rng.between(0, 99) {
                0..40 => sections::section(&ctx, task, &mut rng).await,
                40..60 => sections::read(&ctx, task, &mut rng).await,
                _ => sections::increment(&ctx, task, &mut rng).await,
            },
            2 => term(&ctx, task, &mut rng).await,
            _ => job_tick(&ctx, task, &mut rng).await,
        }
        think(&mut rng, 5, 40).await;
    }
}

/// The workload's think time between operations (not synchronisation).
async fn think(rng: &mut Rng, low_ms: u64, high_ms: u64) {
    tokio::time::sleep(Duration::from_millis(rng.between(low_ms, high_ms))).await;
}

/// How far a section (or a term) got, kept outside the body, which a loss may cancel.
#[derive(Debug, Default, Clone, Copy)]
struct Progress {
    token: Option<i64>,
    /// Writes that may have landed (accepted, or unknown).
    touched: u32,
    accepted: u32,
    refused: bool,
    began_us: Option<u64>,
}

type Shared = Arc<Mutex<Progress>>;

fn note(progress: &Shared, write: Write) {
    let mut p = progress.lock().expect("progress");
    match write {
        Write::Accepted => {
            p.accepted += 1;
            p.touched += 1;
        }
        Write::Unknown => p.touched += 1,
        Write::Refused => p.refused = true,
    }
}

/// Completes `record` with what the operation came to.
fn finish(
    ctx: &Ctx,
    mut record: Record,
    outcome: Outcome,
    token: Option<i64>,
    value: Option<i64>,
    detail: Option<String>,
) {
    record.token = token;
    record.value = value.or(record.value);
    record.detail = detail;
    ctx.emit.complete(record, outcome);
}

/// One leader term: campaign, append a few entries to the fenced log, resign.
async fn term(ctx: &Ctx, task: u32, rng: &mut Rng) {
    let mut record = ctx.emit.invoke(task, Op::Term, names::LOG);
    let election = LeaderElection::builder(ctx.locks.clone(), names::LEADER)
        .retry_interval(Duration::from_millis(100))
        .build()
        .expect("within the runtime");
    let entries = rng.between(3, 10);
    let gap = Duration::from_millis(rng.between(20, 80));
    let progress = Shared::default();
    let holder = ctx.emit.holder(task);
    let result = match ctx.mode {
        Mode::Unsafe => unsafe_term(ctx, &election, entries, gap, &progress, &holder).await,
        _ => safe_term(ctx, &election, entries, gap, &progress, &holder).await,
    };
    let _ = tokio::time::timeout(ACQUIRE, election.resign()).await;
    let p = *progress.lock().expect("progress");
    let outcome = match result {
        Ok(()) if p.accepted as u64 == entries => Outcome::Ok,
        _ if p.touched == 0 => Outcome::Fail,
        _ => Outcome::Info,
    };
    if let Some(began) = p.began_us {
        record.start_us = began;
    }
    finish(
        ctx,
        record,
        outcome,
        p.token,
        Some(i64::from(p.accepted)),
        result.err(),
    );
}

async fn safe_term(
    ctx: &Ctx,
    election: &LeaderElection,
    entries: u64,
    gap: Duration,
    progress: &Shared,
    holder: &str,
) -> Result<(), String> {
    let work = |info: pglock::LockInfo| async move {
        let token = info.fencing_token.expect("fencing is on");
        {
            let mut p = progress.lock().expect("progress");
            p.token = Some(token);
            p.began_us = Some(now_us());
        }
        for _ in 0..entries {
            let write = ctx
                .resource
                .fenced_event(names::LOG, token, "append", holder)
                .await;
            note(progress, write);
            if write != Write::Accepted {
                return;
            }
            tokio::time::sleep(gap).await;
        }
    };
    match tokio::time::timeout(ELECTION, election.run_as_leader(None, work)).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(err)) => Err(err.to_string()),
        Err(_) => Err("not elected in time".to_owned()),
    }
}

/// The negative control's term: it appends unfenced for its whole length, lost or not.
async fn unsafe_term(
    ctx: &Ctx,
    election: &LeaderElection,
    entries: u64,
    gap: Duration,
    progress: &Shared,
    holder: &str,
) -> Result<(), String> {
    let info = match tokio::time::timeout(ELECTION, election.wait_for_leadership(None)).await {
        Ok(Ok(info)) => info,
        Ok(Err(err)) => return Err(err.to_string()),
        Err(_) => return Err("not elected in time".to_owned()),
    };
    let token = info.fencing_token.expect("fencing is on");
    {
        let mut p = progress.lock().expect("progress");
        p.token = Some(token);
        p.began_us = Some(now_us());
    }
    for _ in 0..entries {
        note(
            progress,
            ctx.resource
                .unfenced_event(names::LOG, token, "append", holder)
                .await,
        );
        tokio::time::sleep(gap).await;
    }
    Ok(())
}

/// One tick of the scheduled job, on the next window's boundary.
async fn job_tick(ctx: &Ctx, task: u32, rng: &mut Rng) {
    if let Ok(Ok(wait)) = tokio::time::timeout(ACQUIRE, ctx.job.until_next_window()).await {
        let jitter = Duration::from_millis(rng.between(0, 30));
        tokio::select! {
            () = tokio::time::sleep(wait.min(names::JOB_PERIOD) + jitter) => {}
            () = ctx.stop.stopped() => return,
        }
    }
    let mut record = ctx.emit.invoke(task, Op::Job, names::JOB);
    let work = Duration::from_millis(rng.between(10, 60));
    let period_ms = names::JOB_PERIOD.as_millis() as i64;
    let run = ctx.job.run(|_run| tokio::time::sleep(work));
    let (outcome, detail) = match tokio::time::timeout(names::JOB_PERIOD * 4, run).await {
        Ok(Ok(RunOutcome::Ran { run, .. })) => {
            record.token = Some(run.run);
            record.value = Some(run.window_start.timestamp_millis() / period_ms);
            (Outcome::Ok, None)
        }
        Ok(Ok(RunOutcome::Skipped {
            window_start,
            reason,
        })) => {
            record.value = Some(window_start.timestamp_millis() / period_ms);
            (Outcome::Fail, Some(format!("skipped: {reason:?}")))
        }
        Ok(Ok(other)) => (Outcome::Info, Some(format!("{other:?}"))),
        // The body may have run part way: cut off, lost, or not heard of.
        Ok(Err(err)) if is_in_doubt(&err) => (Outcome::Info, Some(err.to_string())),
        Ok(Err(err)) => (Outcome::Fail, Some(err.to_string())),
        Err(_) => (Outcome::Info, Some("no answer in time".to_owned())),
    };
    record.detail = detail;
    ctx.emit.complete(record, outcome);
}

fn is_in_doubt(err: &pglock::schedule::Error) -> bool {
    matches!(err, pglock::schedule::Error::Overran { .. })
        || matches!(err, pglock::schedule::Error::Lock(lock) if lock.is_lost())
}

/// A worker's stop request, shared by its tasks.
#[derive(Debug, Clone, Default)]
pub struct Stop {
    flag: Arc<std::sync::atomic::AtomicBool>,
    notify: Arc<tokio::sync::Notify>,
}

impl Stop {
    /// Asks every task to finish its operation and end.
    pub fn stop(&self) {
        self.flag.store(true, std::sync::atomic::Ordering::SeqCst);
        self.notify.notify_waiters();
    }

    /// Whether a stop was asked for.
    pub fn is_stopped(&self) -> bool {
        self.flag.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Waits until a stop is asked for.
    pub async fn stopped(&self) {
        loop {
            let notified = self.notify.notified();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}
