//! One chaos run, from the parent's side: the servers, the proxies, the workers, the
//! nemesis, and the history at the end (the workers' records, the faults, and the resource's
//! own view).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pglock::schedule::{JobTable, PostgresJobStore, ScheduledJob};
use pglock::{FencingTable, LockManager};
use sqlx::postgres::PgPoolOptions;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::collect::Collector;
use crate::history::Record;
use crate::nemesis::{FaultKind, Nemesis, Pace};
use crate::resource::Resource;
use crate::rng::Rng;
use crate::spec::{Mode, Timing, WorkerSpec, names};
use crate::workers::Workers;
use pglock_testing::Proxy;

/// What a run does.
#[derive(Debug, Clone)]
pub struct Config {
    /// The seed of everything random in the run.
    pub seed: u64,
    /// How long faults are injected.
    pub duration: Duration,
    /// A quiet time after the last fault healed, before the workers finish: the workload
    /// must make progress again in it.
    pub tail: Duration,
    /// Worker processes.
    pub workers: u32,
    /// Tasks per worker (a multiple of four runs every kind of operation).
    pub tasks: u32,
    /// How the work is protected.
    pub mode: Mode,
    /// The kinds of fault to inject.
    pub faults: Vec<FaultKind>,
    /// How often and how long.
    pub pace: Pace,
    /// The managers' settings.
    pub timing: Timing,
    /// Where the history goes (`history.jsonl`).
    pub out_dir: PathBuf,
    /// The `pglock-chaos` binary, run as the workers.
    pub worker_exe: PathBuf,
    /// The database of the fenced resource (left alone by the nemesis).
    pub resource_url: String,
}

impl Config {
    /// A run's usual settings: three workers of four tasks, every kind of fault.
    pub fn new(seed: u64, duration: Duration, out_dir: PathBuf, worker_exe: PathBuf) -> Config {
        let timing = Timing::default();
        Config {
            seed,
            duration,
            tail: Duration::from_secs(3),
            workers: 3,
            tasks: 4,
            mode: Mode::Safe,
            faults: FaultKind::ALL.to_vec(),
            pace: Pace {
                gap_ms: (300, 1200),
                overlap: 2,
                short_pause_ms: (100, 400),
                long_pause: long_pause(timing),
                partition_ms: (500, 2500),
                down_ms: (200, 1000),
            },
            timing,
            out_dir,
            worker_exe,
            resource_url: pglock_testing::database_url().to_owned(),
        }
    }
}

/// A long pause outlasts the silent-holder bound, when there is one; without it, a holder
/// frozen that long would keep its locks, so the pause stays as short as a short one's
/// longest.
pub fn long_pause(timing: Timing) -> Duration {
    match timing.silence {
        Some(bound) => bound + Duration::from_secs(1),
        None => Duration::from_millis(800),
    }
}

/// What a run came to.
#[derive(Debug)]
pub struct Outcome {
    /// Every record: the workers', the nemesis's, and the resource's view.
    pub records: Vec<Record>,
    /// The history file.
    pub history_path: PathBuf,
    /// Faults injected, by kind.
    pub faults: BTreeMap<FaultKind, u32>,
    /// What went wrong with the run itself (a worker that would not start or end, say).
    pub problems: Vec<String>,
}

/// Runs the workload under the nemesis and returns the history.
///
/// # Errors
///
/// When the servers, the tables or the workers cannot be set up.
pub async fn run(config: &Config) -> Result<Outcome, String> {
    std::fs::create_dir_all(&config.out_dir).map_err(|e| e.to_string())?;
    let history_path = config.out_dir.join("history.jsonl");
    let collector = Arc::new(Collector::create(&history_path).map_err(|e| e.to_string())?);
    let standby = config.faults.contains(&FaultKind::Failover);
    let cluster = Arc::new(
        tokio::task::spawn_blocking(move || Cluster::start_with(standby))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("lock server: {e}"))?,
    );
    static RUNS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let prefix = format!(
        "chaos_{}_{}_{}",
        config.seed,
        std::process::id(),
        RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    );
    let resource = prepare(config, &cluster, &prefix).await?;
    let workers = Arc::new(spawn_slots(config, &cluster, &prefix, collector.clone()).await?);
    workers.start_all().await?;
    let nemesis = Arc::new(Nemesis {
        cluster: cluster.clone(),
        workers: workers.clone(),
        collector: collector.clone(),
        kinds: config.faults.clone(),
        pace: config.pace,
        server: Arc::default(),
    });
    let faults = nemesis
        .run(config.seed, Instant::now() + config.duration)
        .await;
    tokio::time::sleep(config.tail).await;
    for name in workers.finish().await {
        collector.problem(format!("worker {name} did not finish in time"));
    }
    match resource.view().await {
        Ok(view) => view.into_iter().for_each(|record| collector.add(record)),
        Err(err) => collector.problem(format!("the resource's view: {err}")),
    }
    let (records, problems) = collector.snapshot();
    Ok(Outcome {
        records,
        history_path,
        faults,
        problems,
    })
}

/// Creates the resource's tables, the fencing table and the job table.
async fn prepare(config: &Config, cluster: &Cluster, prefix: &str) -> Result<Resource, String> {
    let resource_pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&config.resource_url)
        .await
        .map_err(|e| format!("resource: {e}"))?;
    let resource = Resource::new(resource_pool, prefix);
    let counters: Vec<String> = names::COUNTERS.iter().map(|c| (*c).to_owned()).collect();
    resource
        .create(&counters)
        .await
        .map_err(|e| e.to_string())?;
    let lock_pool = PgPoolOptions::new()
        .max_connections(2)
        .connect(&cluster.primary().url())
        .await
        .map_err(|e| format!("lock server: {e}"))?;
    let fencing = FencingTable::new(&names::fencing_table(prefix)).map_err(|e| e.to_string())?;
    let locks = crate::worker::manager(lock_pool.clone(), fencing, "setup", config.timing);
    locks
        .ensure_fencing_table()
        .await
        .map_err(|e| e.to_string())?;
    let table = JobTable::new(&names::job_table(prefix)).map_err(|e| e.to_string())?;
    let locks: Arc<dyn LockManager> = Arc::new(locks);
    let store = Arc::new(PostgresJobStore::with_table(lock_pool.clone(), table));
    let job = ScheduledJob::builder(locks, store, names::JOB, names::JOB_PERIOD)
        .build()
        .map_err(|e| e.to_string())?;
    job.prepare().await.map_err(|e| e.to_string())?;
    lock_pool.close().await;
    Ok(resource)
}

/// The workers' slots, each with its proxy.
async fn spawn_slots(
    config: &Config,
    cluster: &Cluster,
    prefix: &str,
    collector: Arc<Collector>,
) -> Result<Workers, String> {
    let mut rng = Rng::new(config.seed ^ 0x5EED);
    let mut specs = Vec::new();
    for n in 1..=config.workers {
        let proxy = Proxy::start("127.0.0.1", cluster.primary().port())
            .await
            .map_err(|e| e.to_string())?;
        let spec = WorkerSpec {
            name: format!("w{n}"),
            parent: std::process::id(),
            lock_port: proxy.port(),
            resource_url: config.resource_url.clone(),
            prefix: prefix.to_owned(),
            tasks: config.tasks,
            seed: rng.next_u64(),
            mode: config.mode,
            timing: config.timing,
        };
        specs.push((spec, proxy));
    }
    Ok(Workers::new(config.worker_exe.clone(), specs, collector))
}

/// How soon the workload must make progress after each kind of fault heals: the worker a
/// fault was aimed at, or any worker after the server's faults (see [`crate::checker`]).
///
/// A lost session is noticed within the probe interval plus its grace and the lock is then
/// taken again, which takes well under a second here (the longest seen in a ten-minute run
/// was 1.4 s). But faults overlap: a pause that heals while a failover is under way waits for
/// the failover too, which took 6 s on a busy two-core machine. So the bound is that, plus
/// room, and a little more for the server's own faults.
pub fn bounds(timing: Timing) -> crate::checker::Bounds {
    let noticed = (timing.probe + timing.grace).as_micros() as u64;
    crate::checker::Bounds::new(8_000_000 + 2 * noticed)
        .with_kind(FaultKind::Failover.name(), 12_000_000)
        .with_kind(FaultKind::Restart.name(), 12_000_000)
}

/// Checks a run's history and writes the reports next to it: `report.txt` (the checker's
/// report), `report.md` (markdown) and `timeline.svg`. Returns the report.
///
/// # Errors
///
/// When a file cannot be written.
pub fn check_and_write(
    config: &Config,
    outcome: &Outcome,
) -> std::io::Result<crate::checker::Report> {
    let report = crate::checker::check(&outcome.records, &bounds(config.timing));
    let dir = &config.out_dir;
    std::fs::write(dir.join("report.txt"), report.to_string())?;
    std::fs::write(
        dir.join("report.md"),
        crate::report::markdown(&report, &outcome.records),
    )?;
    std::fs::write(
        dir.join("timeline.svg"),
        crate::svg::timeline(&outcome.records),
    )?;
    Ok(report)
}

/// Checks the history a run left in `dir` (`history.jsonl`) again, with the default timing's
/// bounds, and writes its reports and timeline there anew: for a history kept from an earlier
/// run, or a report whose drawing has changed since.
pub fn recheck(dir: &std::path::Path) -> std::io::Result<crate::checker::Report> {
    let records = crate::history::read_jsonl(dir.join("history.jsonl"))?;
    let report = crate::checker::check(&records, &bounds(Timing::default()));
    std::fs::write(dir.join("report.txt"), report.to_string())?;
    std::fs::write(
        dir.join("report.md"),
        crate::report::markdown(&report, &records),
    )?;
    std::fs::write(dir.join("timeline.svg"), crate::svg::timeline(&records))?;
    Ok(report)
}
