//! Command-line flags: the harness contract's flags plus this binary's own knobs.

use std::fmt::Write as _;

pub const ALL_WORKLOADS: [&str; 7] = [
    "W1_same",
    "W1_distinct",
    "W2_try_held",
    "W3_1proc",
    "W3_multiproc",
    "W4_many_keys",
    "W5_concurrent",
];

/// The libraries printed when `--lib` is not given (the negative control is opt-in).
pub const DEFAULT_LIBS: [&str; 4] = ["pglock", "pglock_defaultpool", "sqlx_raw", "sqlx_advisory"];

pub const USAGE: &str = "\
lockbench: advisory-lock benchmark for pglock next to its floors (docs/benchmarks.md).

    cargo bench -p pglock-bench --bench lockbench -- [flags]
    target/release/deps/lockbench-<hash> [flags]

Workload flags:
  --workloads LIST        comma list of W1_same,W1_distinct,W2_try_held,W3_1proc,W3_multiproc,
                          W4_many_keys,W5_concurrent (default: all)
  --duration S            timed seconds per workload (default 1.5)
  --warmup S              untimed warm-up seconds before W1/W2/W4 (default 0.3)
  --concurrency N         W3_1proc tasks (default 8)
  --procs N               W3_multiproc processes (default 4)
  --tasks-per-proc N      W3_multiproc tasks per process (default 2)
  --keys N                W4 keys held at once (default 50)
  --tasks LIST            W5 task counts, comma list: one result line per count and library
                          (default 8,64,256)
  --ring N                W1_distinct ring of distinct keys (default 1024)
  --dsn URL               server; default $BENCH_DSN, then $DATABASE_URL, then a throwaway
                          server started with pglock_testing::shared_server()
  --sample-interval S     pg_stat_activity sampling period (default 0.1)
  --counter-sync-commit X synchronous_commit of the W3 counter connections (default off)

This binary's knobs:
  --lib LIST              comma list of pglock, pglock_defaultpool, sqlx_raw, sqlx_advisory, noop,
                          sqlx_raw_x (the raw floor with the --raw-* knobs below; default: the
                          first four). Several libs run workload by workload,
                          interleaved, in one process.
  --pool-max N            max_connections of pglock's pools (default: sqlx's, 10); adds `_pool<N>`
  --pglock-tracing on|off the manager's tracing spans (default on; off adds `_notrace` to the label)
  --acquire-timeout S     pglock: acquire(key, Some(S seconds)) instead of acquire(key, None), the
                          deadline path (server-side lock_timeout); adds `_timeout<S>s` to the label
  --cycles N              fixed-count mode for W1/W2 (for callgrind): exactly N timed ops after
                          --warmup-cycles untimed ones, no background sampler
  --warmup-cycles N       untimed ops before the timed ones in --cycles mode (default 200)
  --log-statements        set log_statement=all on the lock connections (superuser DSN), to
                          read what each op sends in the server log
  --raw-spin N            sqlx_raw_x: N rounds of arithmetic (no memory but its own stack slot)
                          before each statement, a known client-only cost for calibrating the
                          CPU columns; adds `_spin<N>` to the label
  --raw-try-sql SQL       sqlx_raw_x: this try statement instead of `SELECT pg_try_advisory_lock($1)`
                          ($1 the key's id, a boolean first column), to price another statement
                          shape; adds `_trysql` to the label
";

#[derive(Debug, Clone)]
pub struct Args {
    pub libs: Vec<String>,
    pub workloads: Vec<String>,
    pub dsn: Option<String>,
    pub duration: f64,
    pub warmup: f64,
    pub concurrency: usize,
    pub procs: usize,
    pub tasks_per_proc: usize,
    pub keys: usize,
    /// W5: the numbers of concurrent tasks, one run (and one result line) per number.
    pub w5_tasks: Vec<usize>,
    pub ring: usize,
    pub sample_interval: f64,
    pub counter_sync_commit: String,
    pub pool_max: Option<u32>,
    pub pglock_tracing: bool,
    pub acquire_timeout: Option<f64>,
    pub cycles: Option<u64>,
    pub warmup_cycles: u64,
    pub log_statements: bool,
    pub raw_spin: u64,
    pub raw_try_sql: Option<String>,
    // W3 worker mode (spawned by the W3 parent; not for humans).
    pub w3_worker: bool,
    pub run_id: Option<String>,
    pub worker_tasks: usize,
    pub counter_id: i64,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            libs: DEFAULT_LIBS.iter().map(|s| s.to_string()).collect(),
            workloads: ALL_WORKLOADS.iter().map(|s| s.to_string()).collect(),
            dsn: None,
            duration: 1.5,
            warmup: 0.3,
            concurrency: 8,
            procs: 4,
            tasks_per_proc: 2,
            keys: 50,
            w5_tasks: vec![8, 64, 256],
            ring: 1024,
            sample_interval: 0.1,
            counter_sync_commit: "off".to_owned(),
            pool_max: None,
            pglock_tracing: true,
            acquire_timeout: None,
            cycles: None,
            warmup_cycles: 200,
            log_statements: false,
            raw_spin: 0,
            raw_try_sql: None,
            w3_worker: false,
            run_id: None,
            worker_tasks: 1,
            counter_id: 0,
        }
    }
}

impl Args {
    /// The flags a W3 worker needs to rebuild the same library configuration.
    pub fn lib_knobs(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(max) = self.pool_max {
            out.extend(["--pool-max".to_owned(), max.to_string()]);
        }
        out.extend([
            "--pglock-tracing".to_owned(),
            if self.pglock_tracing { "on" } else { "off" }.to_owned(),
            "--counter-sync-commit".to_owned(),
            self.counter_sync_commit.clone(),
        ]);
        if self.log_statements {
            out.push("--log-statements".to_owned());
        }
        if let Some(t) = self.acquire_timeout {
            out.push("--acquire-timeout".to_owned());
            out.push(t.to_string());
        }
        if self.raw_spin > 0 {
            out.extend(["--raw-spin".to_owned(), self.raw_spin.to_string()]);
        }
        if let Some(sql) = &self.raw_try_sql {
            out.extend(["--raw-try-sql".to_owned(), sql.clone()]);
        }
        out
    }
}

fn split_list(v: &str) -> Vec<String> {
    v.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn num<T: std::str::FromStr>(flag: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{flag}: cannot parse {v:?} as a number"))
}

pub fn parse(argv: impl IntoIterator<Item = String>) -> Result<Args, String> {
    let mut a = Args::default();
    let mut it = argv.into_iter();
    while let Some(arg) = it.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.clone(), None),
        };
        // Flags without a value.
        match flag.as_str() {
            // `cargo bench` passes `--bench` to harness-less benches.
            "--bench" => continue,
            "--log-statements" => {
                a.log_statements = true;
                continue;
            }
            "--_w3-worker" => {
                a.w3_worker = true;
                continue;
            }
            "-h" | "--help" => return Err(String::new()),
            _ => {}
        }
        let mut value = || -> Result<String, String> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => it.next().ok_or_else(|| format!("{flag} needs a value")),
            }
        };
        match flag.as_str() {
            "--lib" | "--libs" => a.libs = split_list(&value()?),
            "--workloads" => a.workloads = split_list(&value()?),
            "--dsn" => a.dsn = Some(value()?).filter(|s| !s.trim().is_empty()),
            "--duration" => a.duration = num(&flag, &value()?)?,
            "--warmup" => a.warmup = num(&flag, &value()?)?,
            "--concurrency" => a.concurrency = num(&flag, &value()?)?,
            "--procs" => a.procs = num(&flag, &value()?)?,
            "--tasks-per-proc" => a.tasks_per_proc = num(&flag, &value()?)?,
            "--keys" => a.keys = num(&flag, &value()?)?,
            "--tasks" => {
                a.w5_tasks = split_list(&value()?)
                    .iter()
                    .map(|v| num(&flag, v))
                    .collect::<Result<_, _>>()?
            }
            "--ring" => a.ring = num(&flag, &value()?)?,
            "--sample-interval" => a.sample_interval = num(&flag, &value()?)?,
            "--counter-sync-commit" => a.counter_sync_commit = value()?,
            "--pool-max" => a.pool_max = Some(num(&flag, &value()?)?),
            "--pglock-tracing" => {
                a.pglock_tracing = match value()?.as_str() {
                    "on" | "true" | "1" => true,
                    "off" | "false" | "0" => false,
                    other => return Err(format!("--pglock-tracing on|off, got {other:?}")),
                }
            }
            "--acquire-timeout" => a.acquire_timeout = Some(num(&flag, &value()?)?),
            "--cycles" => a.cycles = Some(num(&flag, &value()?)?),
            "--warmup-cycles" => a.warmup_cycles = num(&flag, &value()?)?,
            "--raw-spin" => a.raw_spin = num(&flag, &value()?)?,
            "--raw-try-sql" => a.raw_try_sql = Some(value()?),
            "--run-id" => a.run_id = Some(value()?),
            "--_w3-tasks" => a.worker_tasks = num(&flag, &value()?)?,
            "--counter-id" => a.counter_id = num(&flag, &value()?)?,
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    let bad: Vec<_> = a
        .workloads
        .iter()
        .filter(|w| !ALL_WORKLOADS.contains(&w.as_str()))
        .collect();
    if !bad.is_empty() {
        return Err(format!("unknown workload(s): {bad:?}"));
    }
    if !["on", "off", "local"].contains(&a.counter_sync_commit.as_str()) {
        return Err("--counter-sync-commit on|off|local".to_owned());
    }
    if a.keys == 0 || a.ring == 0 || a.concurrency == 0 || a.procs == 0 || a.tasks_per_proc == 0 {
        return Err(
            "--keys, --ring, --concurrency, --procs and --tasks-per-proc must be > 0".into(),
        );
    }
    if a.w5_tasks.is_empty() || a.w5_tasks.contains(&0) {
        return Err("--tasks needs one or more task counts, each > 0".to_owned());
    }
    if a.acquire_timeout
        .is_some_and(|t| !(t > 0.0 && t.is_finite()))
    {
        return Err("--acquire-timeout must be a positive number of seconds".to_owned());
    }
    if a.cycles == Some(0) {
        return Err("--cycles must be > 0".to_owned());
    }
    let mut unknown = String::new();
    for lib in &a.libs {
        if crate::libs::LibKind::parse(lib).is_none() {
            let _ = write!(unknown, " {lib}");
        }
    }
    if !unknown.is_empty() {
        return Err(format!("unknown lib(s):{unknown}"));
    }
    Ok(a)
}
