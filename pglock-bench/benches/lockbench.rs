//! `cargo bench -p pglock-bench --bench lockbench -- [flags]`: pglock next to its floors (one JSON line per
//! workload and library on stdout, logs on stderr, exit 1 when any correctness check failed).
//! `pglock-bench/benches/report.py` runs it several times and tabulates the results. See
//! `docs/benchmarks.md`.

#[path = "lockbench/cli.rs"]
mod cli;
#[path = "lockbench/harness.rs"]
mod harness;
#[path = "lockbench/libs.rs"]
mod libs;
#[path = "lockbench/stats.rs"]
mod stats;
#[path = "lockbench/workloads.rs"]
mod workloads;

use std::io::Write as _;
use std::process::ExitCode;

use crate::cli::Args;
use crate::libs::{LibKind, Res, err};

fn resolve_dsn(args: &Args) -> String {
    if let Some(dsn) = &args.dsn {
        return dsn.clone();
    }
    for var in ["BENCH_DSN", "DATABASE_URL"] {
        if let Ok(v) = std::env::var(var)
            && !v.trim().is_empty()
        {
            return v;
        }
    }
    eprintln!("lockbench: no --dsn, BENCH_DSN or DATABASE_URL; starting a throwaway server");
    pglock_testing::shared_server().url()
}

fn runtime() -> tokio::runtime::Runtime {
    // One single-threaded runtime per process, like one asyncio loop per Python process.
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

async fn run_one(
    args: &Args,
    dsn: &str,
    kind: LibKind,
    wl: &str,
    tasks: usize,
    run: &str,
) -> Res<serde_json::Value> {
    match wl {
        "W1_same" => workloads::w1(args, dsn, kind, run, true).await,
        "W1_distinct" => workloads::w1(args, dsn, kind, run, false).await,
        "W2_try_held" => workloads::w2(args, dsn, kind, run).await,
        "W3_1proc" => workloads::w3(args, dsn, kind, run, 1, args.concurrency).await,
        "W3_multiproc" => {
            workloads::w3(args, dsn, kind, run, args.procs, args.tasks_per_proc).await
        }
        "W4_many_keys" => workloads::w4(args, dsn, kind, run).await,
        "W5_concurrent" => workloads::w5(args, dsn, kind, run, tasks).await,
        other => Err(format!("unknown workload {other}")),
    }
}

async fn run_all(args: &Args, dsn: &str) -> Res<bool> {
    let mut conn = harness::connect(dsn, "lockbench-harness-setup", &[]).await?;
    sqlx::query(harness::COUNTER_TABLE_DDL)
        .execute(&mut conn)
        .await
        .map_err(err)?;
    sqlx::Connection::close(conn).await.map_err(err)?;

    let base = format!(
        "{}{}",
        std::process::id(),
        &uuid::Uuid::new_v4().simple().to_string()[..6]
    );
    let kinds: Vec<LibKind> = args.libs.iter().filter_map(|l| LibKind::parse(l)).collect();
    // Libraries alternate workload by workload, starting at a random one, so that no library
    // always runs first on a machine whose speed drifts.
    let offset = (uuid::Uuid::new_v4().as_u128() % kinds.len().max(1) as u128) as usize;
    // W5 runs once per `--tasks` count (one line each); the other workloads once.
    let cases: Vec<(&str, Option<usize>)> = args
        .workloads
        .iter()
        .flat_map(|wl| -> Vec<(&str, Option<usize>)> {
            if wl == "W5_concurrent" {
                args.w5_tasks
                    .iter()
                    .map(|&n| (wl.as_str(), Some(n)))
                    .collect()
            } else {
                vec![(wl.as_str(), None)]
            }
        })
        .collect();
    let mut all_ok = true;
    let mut n = 0;
    for (wl, tasks) in cases {
        for j in 0..kinds.len() {
            let kind = kinds[(offset + j) % kinds.len()];
            n += 1;
            let run = format!("{base}-{n}");
            let line = match run_one(args, dsn, kind, wl, tasks.unwrap_or(0), &run).await {
                Ok(v) => v,
                Err(e) => {
                    let label = kind.label(args);
                    eprintln!("{label} {wl}: FAIL (crashed: {e})");
                    let mut line = stats::result(
                        &label,
                        wl,
                        0.0,
                        None,
                        None,
                        false,
                        0,
                        serde_json::json!({"crash": e}),
                    );
                    if let Some(t) = tasks {
                        line["tasks"] = serde_json::json!(t);
                    }
                    line
                }
            };
            all_ok &= line["correct"].as_bool().unwrap_or(false);
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{line}");
            let _ = out.flush();
        }
    }
    Ok(all_ok)
}

fn main() -> ExitCode {
    let args = match cli::parse(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(msg) => {
            if msg.is_empty() {
                print!("{}", cli::USAGE);
                return ExitCode::SUCCESS;
            }
            eprintln!("lockbench: {msg}\n\n{}", cli::USAGE);
            return ExitCode::from(2);
        }
    };
    let dsn = resolve_dsn(&args);
    let rt = runtime();
    if args.w3_worker {
        return match rt.block_on(workloads::w3_worker(&args, &dsn)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("lockbench worker: {e}");
                ExitCode::FAILURE
            }
        };
    }
    match rt.block_on(run_all(&args, &dsn)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("lockbench: {e}");
            ExitCode::FAILURE
        }
    }
}
