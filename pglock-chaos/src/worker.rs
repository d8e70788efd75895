//! A worker process: checks who spawned it, connects through its proxy, runs its tasks until
//! its stdin closes (the parent's "finish", or the parent's death), then exits.

use std::sync::Arc;
use std::time::Duration;

use pglock::schedule::{JobTable, PostgresJobStore, ScheduledJob};
use pglock::{FencingTable, LockManager, PostgresLockManager};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use tokio::io::AsyncReadExt;

use crate::broken::ExclusiveAsShared;
use crate::resource::Resource;
use crate::rng::Rng;
use crate::spec::{Mode, Timing, WorkerSpec, names};
use crate::workload::{Ctx, Emit, Stop, run_task};

/// Runs a worker to its end and returns its exit code.
///
/// Refuses (code 2) when this process's parent is not the one the spec names, so stray
/// arguments cannot turn some other process into a silent worker. Dies with its parent.
pub async fn main(spec: WorkerSpec) -> i32 {
    // Asked first, so a parent that dies from here on takes the worker with it; a parent that
    // died before shows as a different parent pid below.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let parent = rustix::process::getppid().map_or(0, |pid| pid.as_raw_nonzero().get() as u32);
    if parent != spec.parent {
        eprintln!(
            "pglock-chaos: --parent {} is not this process's parent ({parent}); not a worker",
            spec.parent
        );
        return 2;
    }
    let stop = Stop::default();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            let mut rest = Vec::new();
            let _ = tokio::io::stdin().read_to_end(&mut rest).await;
            stop.stop();
        }
    });
    let ctx = match context(&spec, stop).await {
        Ok(ctx) => ctx,
        Err(err) => {
            eprintln!("pglock-chaos worker {}: {err}", spec.name);
            return 1;
        }
    };
    println!("READY");
    let mut rng = Rng::new(spec.seed);
    let tasks: Vec<_> = (0..spec.tasks)
        .map(|task| tokio::spawn(run_task(ctx.clone(), task, rng.fork(u64::from(task)))))
        .collect();
    for task in tasks {
        let _ = task.await;
    }
    println!("DONE");
    0
}

/// The worker's managers and pools.
async fn context(spec: &WorkerSpec, stop: Stop) -> Result<Ctx, String> {
    let options = PgConnectOptions::new()
        .host("127.0.0.1")
        .port(spec.lock_port)
        .username("postgres")
        .database("postgres");
    // Short timeouts, so a partition shows as failed operations rather than a hang.
    let lock_pool = PgPoolOptions::new()
        .max_connections(spec.tasks * 2 + 4)
        .acquire_timeout(Duration::from_secs(2))
        .connect_lazy_with(options);
    let resource_pool = PgPoolOptions::new()
        .max_connections(spec.tasks + 2)
        .acquire_timeout(Duration::from_secs(10))
        .connect(&spec.resource_url)
        .await
        .map_err(|err| format!("resource: {err}"))?;
    let fencing =
        FencingTable::new(&names::fencing_table(&spec.prefix)).map_err(|e| e.to_string())?;
    let holder = format!("{}-{}", spec.name, std::process::id());
    let manager = manager(lock_pool.clone(), fencing, &holder, spec.timing);
    let locks: Arc<dyn LockManager> = match spec.mode {
        Mode::BrokenLock => Arc::new(ExclusiveAsShared(manager)),
        Mode::Safe | Mode::Unsafe => Arc::new(manager),
    };
    let table = JobTable::new(&names::job_table(&spec.prefix)).map_err(|e| e.to_string())?;
    let store = Arc::new(PostgresJobStore::with_table(lock_pool, table));
    let job = ScheduledJob::builder(locks.clone(), store, names::JOB, names::JOB_PERIOD)
        // Held past the window's end: a run whose end went unrecorded (the server was down)
        // frees the job only once its window is over, so the window cannot run twice.
        .max_hold(names::JOB_PERIOD + Duration::from_millis(100))
        .skew_tolerance(Duration::from_millis(1))
        .build()
        .map_err(|err| err.to_string())?;
    Ok(Ctx {
        locks,
        resource: Resource::new(resource_pool, &spec.prefix),
        job,
        mode: spec.mode,
        emit: Emit::new(&spec.name, &holder),
        stop,
    })
}

/// A lock manager with the run's settings.
pub fn manager(
    pool: sqlx::PgPool,
    fencing: FencingTable,
    holder: &str,
    timing: Timing,
) -> PostgresLockManager {
    let builder = PostgresLockManager::builder(pool)
        .holder_id(holder)
        .fencing(fencing)
        .probe_interval(timing.probe)
        .probe_grace(timing.grace);
    match timing.silence {
        Some(bound) => builder.silence_timeout(bound),
        None => builder.silence_timeout(Duration::ZERO),
    }
    .build()
}
