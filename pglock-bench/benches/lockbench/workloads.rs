//! The workloads, one function each (definitions and clock rules in `docs/benchmarks/notebook.md`,
//! "Workloads").

use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sqlx::{Connection, PgConnection};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::cli::Args;
use crate::harness::{Apps, Clocks, Sampler, connect, count_held, count_sessions, held_elsewhere};
use crate::libs::{Held, Holder, Key, Lib, LibKind, Res, err};
use crate::stats::{Latencies, jain, mono_ns, ns_to_ms, pct, result};

fn log(msg: &str) {
    eprintln!("{msg}");
}

fn pass(ok: bool) -> &'static str {
    if ok { "PASS" } else { "FAIL" }
}

/// How long a warm-up or a timed part lasts: seconds, or (in `--cycles` mode) an op count.
#[derive(Clone, Copy)]
enum Budget {
    Until(Instant),
    Ops(u64),
}

impl Budget {
    fn done(self, now: Instant, ops: u64) -> bool {
        match self {
            Budget::Until(deadline) => now >= deadline,
            Budget::Ops(n) => ops >= n,
        }
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s.max(0.0))
}

fn warmup_budget(args: &Args) -> Budget {
    match args.cycles {
        Some(_) => Budget::Ops(args.warmup_cycles),
        None => Budget::Until(Instant::now() + secs(args.warmup)),
    }
}

fn timed_budget(args: &Args, t0: Instant) -> Budget {
    match args.cycles {
        Some(n) => Budget::Ops(n),
        None => Budget::Until(t0 + secs(args.duration)),
    }
}

/// The background sampler in timed mode; in `--cycles` mode nothing runs beside the loop (so
/// callgrind counts only the loop), and the caller samples once at the end instead.
async fn start_sampler(args: &Args, dsn: &str, apps: &Apps) -> Res<Option<Sampler>> {
    if args.cycles.is_some() {
        return Ok(None);
    }
    let conn = connect(dsn, &apps.harness, &[]).await?;
    Ok(Some(Sampler::start(
        conn,
        apps.lib.clone(),
        secs(args.sample_interval),
    )))
}

async fn stop_sampler(sampler: Option<Sampler>, probe: &mut PgConnection, app: &str) -> Res<i64> {
    match sampler {
        Some(s) => s.stop().await,
        None => count_sessions(probe, app).await,
    }
}

// ---------------------------------------------------------------------------------------------
// W1: uncontended acquire + release
// ---------------------------------------------------------------------------------------------

pub async fn w1(args: &Args, dsn: &str, kind: LibKind, run: &str, same: bool) -> Res<Value> {
    let apps = Apps::new(run);
    let mut probe = connect(dsn, &apps.harness, &[]).await?;
    let lib = Lib::start(kind, dsn, &apps.lib, args)?;
    let out = w1_body(args, dsn, &lib, &apps, &mut probe, same).await;
    lib.close().await;
    let _ = probe.close().await;
    out
}

async fn cycle(h: &mut Holder, key: &Key) -> Res<()> {
    let held = h.acquire_uncontended(key).await?;
    h.release(held).await
}

async fn w1_body(
    args: &Args,
    dsn: &str,
    lib: &Lib,
    apps: &Apps,
    probe: &mut PgConnection,
    same: bool,
) -> Res<Value> {
    let wl = if same { "W1_same" } else { "W1_distinct" };
    let label = lib.kind.label(args);
    let mut h = lib.new_holder().await?;
    let nkeys = if same { 1 } else { args.ring };
    let keys: Vec<Key> = (0..nkeys).map(|i| lib.key(&apps.run_id, wl, i)).collect();

    // Untimed visibility probe: held while held (both detectors), free after release.
    let held = h.acquire_uncontended(&keys[0]).await?;
    let seen_held =
        held_elsewhere(probe, keys[0].id).await? && count_held(probe, &[keys[0].id]).await? == 1;
    h.release(held).await?;
    let seen_free = !held_elsewhere(probe, keys[0].id).await?;

    let mut i = 0usize;
    let warm = warmup_budget(args);
    let mut warm_ops = 0u64;
    while !warm.done(Instant::now(), warm_ops) {
        cycle(&mut h, &keys[i % nkeys]).await?;
        i += 1;
        warm_ops += 1;
    }

    let sampler = start_sampler(args, dsn, apps).await?;
    let mut lat: Vec<i64> = Vec::with_capacity(1 << 16);
    let mut errors = 0u64;
    let mut n = 0u64;
    let cpu = Clocks::start(probe, &apps.lib).await?;
    let t0 = Instant::now();
    let budget = timed_budget(args, t0);
    let mut e = t0;
    while !budget.done(e, n) {
        let k = &keys[(i + n as usize) % nkeys];
        let s = Instant::now();
        if let Err(msg) = cycle(&mut h, k).await {
            errors += 1;
            if errors == 1 {
                log(&format!("{label} {wl}: error {msg}"));
            }
        }
        e = Instant::now();
        lat.push((e - s).as_nanos() as i64);
        n += 1;
    }
    let elapsed = (e - t0).as_secs_f64();
    let cpu = cpu.stop(probe).await?;
    let conns = stop_sampler(sampler, probe, &apps.lib).await?;
    let ids: Vec<i64> = keys.iter().map(|k| k.id).collect();
    let leaked = count_held(probe, &ids).await?;
    h.close().await;

    let lat = Latencies::sorted(lat);
    let correct = seen_held && seen_free && errors == 0 && leaked == 0 && n > 0;
    log(&format!(
        "{label} {wl}: {} cycles={n} seen_held={seen_held} seen_free={seen_free} errors={errors} \
         leaked={leaked} connections={conns}",
        pass(correct)
    ));
    let mut detail = json!({"n": n, "elapsed_s": (elapsed * 1000.0).round() / 1000.0,
        "distinct_keys": nkeys, "seen_held": seen_held, "seen_free": seen_free, "errors": errors,
        "leaked": leaked, "fixed_cycles": args.cycles.is_some(), "tail": lat.tail(),
        "latency": "acquire+release per cycle"});
    cpu.record(&mut detail, n);
    Ok(result(
        &label,
        wl,
        n as f64 / elapsed.max(1e-9),
        lat.p50(),
        lat.p99(),
        correct,
        conns,
        detail,
    ))
}

// ---------------------------------------------------------------------------------------------
// W2: failed try_acquire while an independent instance holds the key
// ---------------------------------------------------------------------------------------------

pub async fn w2(args: &Args, dsn: &str, kind: LibKind, run: &str) -> Res<Value> {
    let apps = Apps::new(run);
    let mut probe = connect(dsn, &apps.harness, &[]).await?;
    // The other holder: a second, independent instance with its own pool or connection.
    let peer = Lib::start(kind, dsn, &apps.peer, args)?;
    let lib = Lib::start(kind, dsn, &apps.lib, args)?;
    let out = w2_body(args, dsn, &lib, &peer, &apps, &mut probe).await;
    lib.close().await;
    peer.close().await;
    let _ = probe.close().await;
    out
}

async fn one_try(h: &mut Holder, key: &Key) -> Res<bool> {
    let got = h.try_acquire(key).await?;
    if got {
        // A wrong answer: give it back so the run can go on.
        h.release_tried(key).await?;
    }
    Ok(got)
}

async fn w2_body(
    args: &Args,
    dsn: &str,
    lib: &Lib,
    peer: &Lib,
    apps: &Apps,
    probe: &mut PgConnection,
) -> Res<Value> {
    let wl = "W2_try_held";
    let label = lib.kind.label(args);
    let key = lib.key(&apps.run_id, wl, 0);
    let key_peer = peer.key(&apps.run_id, wl, 0);
    let mut ph = peer.new_holder().await?;
    let peer_held = ph.acquire(&key_peer).await?;
    let held_before = held_elsewhere(probe, key.id).await?;
    let mut h = lib.new_holder().await?;

    let mut wrong = 0u64;
    let warm = warmup_budget(args);
    let mut warm_ops = 0u64;
    while !warm.done(Instant::now(), warm_ops) {
        // Warm-up tries must fail too.
        wrong += u64::from(one_try(&mut h, &key).await?);
        warm_ops += 1;
    }

    let sampler = start_sampler(args, dsn, apps).await?;
    let mut lat: Vec<i64> = Vec::with_capacity(1 << 16);
    let (mut n, mut errors) = (0u64, 0u64);
    let cpu = Clocks::start(probe, &apps.lib).await?;
    let t0 = Instant::now();
    let budget = timed_budget(args, t0);
    let mut e = t0;
    while !budget.done(e, n) {
        let s = Instant::now();
        match one_try(&mut h, &key).await {
            Ok(got) => wrong += u64::from(got),
            Err(msg) => {
                errors += 1;
                if errors == 1 {
                    log(&format!("{label} {wl}: error {msg}"));
                }
            }
        }
        e = Instant::now();
        lat.push((e - s).as_nanos() as i64);
        n += 1;
    }
    let elapsed = (e - t0).as_secs_f64();
    let cpu = cpu.stop(probe).await?;
    let conns = stop_sampler(sampler, probe, &apps.lib).await?;
    let held_after = held_elsewhere(probe, key.id).await?;
    ph.release(peer_held).await?;
    h.close().await;
    ph.close().await;

    let lat = Latencies::sorted(lat);
    let correct = held_before && held_after && wrong == 0 && errors == 0 && n > 0;
    log(&format!(
        "{label} {wl}: {} tries={n} wrongly_granted={wrong} holder_seen={held_before}/{held_after} \
         errors={errors} connections={conns}",
        pass(correct)
    ));
    let mut detail = json!({"n": n, "elapsed_s": (elapsed * 1000.0).round() / 1000.0,
        "wrongly_granted": wrong, "errors": errors, "fixed_cycles": args.cycles.is_some(),
        "tail": lat.tail(), "latency": "one failed try"});
    cpu.record(&mut detail, n);
    Ok(result(
        &label,
        wl,
        n as f64 / elapsed.max(1e-9),
        lat.p50(),
        lat.p99(),
        correct,
        conns,
        detail,
    ))
}

// ---------------------------------------------------------------------------------------------
// W3: contended mutual exclusion on one key, in worker processes (1 x N or P x T)
// ---------------------------------------------------------------------------------------------

const READ_SQL: &str = "SELECT v FROM lockbench_counter WHERE id = $1";
const WRITE_SQL: &str = "UPDATE lockbench_counter SET v = $2 WHERE id = $1";

/// The critical section: read the counter, then write v+1, as two autocommit statements.
async fn bump(counter: &mut PgConnection, id: i64) -> Res<()> {
    let v: i64 = sqlx::query_scalar(READ_SQL)
        .bind(id)
        .fetch_one(&mut *counter)
        .await
        .map_err(err)?;
    sqlx::query(WRITE_SQL)
        .bind(id)
        .bind(v + 1)
        .execute(&mut *counter)
        .await
        .map_err(err)?;
    Ok(())
}

type TaskOut = (Vec<[u64; 3]>, u64, Vec<String>, Holder, PgConnection);

/// Worker body: set up, print READY, wait for `GO <t0_ns>`, run until t0 + duration, print
/// the records as one JSON line.
pub async fn w3_worker(args: &Args, dsn: &str) -> Res<()> {
    let kind = args
        .libs
        .first()
        .and_then(|l| LibKind::parse(l))
        .ok_or("worker needs --lib")?;
    let run = args.run_id.clone().ok_or("worker needs --run-id")?;
    let apps = Apps::new(&run);
    let lib = Lib::start(kind, dsn, &apps.lib, args)?;
    let mut holders = Vec::with_capacity(args.worker_tasks);
    let mut counters = Vec::with_capacity(args.worker_tasks);
    for _ in 0..args.worker_tasks {
        holders.push(lib.new_holder().await?);
        let settings = [("synchronous_commit", args.counter_sync_commit.as_str())];
        counters.push(connect(dsn, &apps.harness, &settings).await?);
    }
    let key = lib.key(&run, "W3", 0);
    let cid = args.counter_id;
    // Warm the lock path once per holder (contended with the other workers: harmless), and
    // prepare the counter statements.
    for h in holders.iter_mut() {
        let held = h.acquire(&key).await?;
        h.release(held).await?;
    }
    for c in counters.iter_mut() {
        let _: Option<i64> = sqlx::query_scalar(READ_SQL)
            .bind(cid)
            .fetch_optional(&mut *c)
            .await
            .map_err(err)?;
    }
    println!("READY");
    let line = tokio::task::spawn_blocking(|| {
        let mut s = String::new();
        std::io::stdin().read_line(&mut s).map(|_| s)
    })
    .await
    .map_err(err)?
    .map_err(err)?;
    let t0: u64 = line
        .strip_prefix("GO ")
        .and_then(|t| t.trim().parse().ok())
        .ok_or_else(|| format!("expected `GO <t0_ns>`, got {line:?}"))?;
    let deadline = t0 + secs(args.duration).as_nanos() as u64;
    let now = mono_ns();
    if t0 > now {
        tokio::time::sleep(Duration::from_nanos(t0 - now)).await;
    }

    let mut tasks = Vec::with_capacity(args.worker_tasks);
    for (mut h, mut counter) in holders.into_iter().zip(counters) {
        let key = key.clone();
        tasks.push(tokio::spawn(async move {
            let mut recs: Vec<[u64; 3]> = Vec::with_capacity(4096);
            let mut errors = Vec::new();
            while mono_ns() < deadline {
                let t_req = mono_ns();
                let held = match h.acquire(&key).await {
                    Ok(held) => held,
                    Err(e) => {
                        errors.push(e);
                        break;
                    }
                };
                let t_acq = mono_ns();
                if let Err(e) = bump(&mut counter, cid).await {
                    errors.push(e);
                }
                let t_rel = mono_ns();
                if let Err(e) = h.release(held).await {
                    errors.push(e);
                    break;
                }
                recs.push([t_req, t_acq, t_rel]);
            }
            (recs, mono_ns(), errors, h, counter) as TaskOut
        }));
    }
    let mut outs: Vec<TaskOut> = Vec::with_capacity(tasks.len());
    for t in tasks {
        outs.push(t.await.map_err(err)?);
    }
    let mut all_errors = Vec::new();
    let mut recs = Vec::new();
    let mut ends = Vec::new();
    for (r, end, errors, h, counter) in outs {
        recs.push(r);
        ends.push(end);
        all_errors.extend(errors);
        h.close().await;
        let _ = counter.close().await;
    }
    lib.close().await;
    let n_errors = all_errors.len();
    all_errors.truncate(20);
    println!(
        "{}",
        json!({"tasks": recs, "ends": ends, "errors": all_errors, "n_errors": n_errors})
    );
    Ok(())
}

struct WorkerOut {
    tasks: Vec<Vec<[u64; 3]>>,
    ends: Vec<u64>,
    n_errors: u64,
    errors: Vec<String>,
}

fn parse_worker(line: &str) -> Res<WorkerOut> {
    let v: Value = serde_json::from_str(line).map_err(err)?;
    let tasks = v["tasks"]
        .as_array()
        .ok_or("worker output has no tasks")?
        .iter()
        .map(|t| {
            t.as_array()
                .map(|rs| {
                    rs.iter()
                        .map(|r| {
                            let f = |i: usize| r[i].as_u64().unwrap_or(0);
                            [f(0), f(1), f(2)]
                        })
                        .collect()
                })
                .unwrap_or_default()
        })
        .collect();
    let ends = v["ends"]
        .as_array()
        .map(|e| e.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    let errors = v["errors"]
        .as_array()
        .map(|e| {
            e.iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok(WorkerOut {
        tasks,
        ends,
        n_errors: v["n_errors"].as_u64().unwrap_or(0),
        errors,
    })
}

fn worker_argv(
    args: &Args,
    dsn: &str,
    kind: LibKind,
    run: &str,
    tasks: usize,
    cid: i64,
) -> Vec<String> {
    let mut argv: Vec<String> = [
        "--_w3-worker",
        "--lib",
        kind.name(),
        "--dsn",
        dsn,
        "--run-id",
        run,
        "--_w3-tasks",
        &tasks.to_string(),
        "--counter-id",
        &cid.to_string(),
        "--duration",
        &args.duration.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(args.lib_knobs());
    argv
}

pub async fn w3(
    args: &Args,
    dsn: &str,
    kind: LibKind,
    run: &str,
    procs: usize,
    tasks: usize,
) -> Res<Value> {
    let wl = if procs == 1 {
        "W3_1proc"
    } else {
        "W3_multiproc"
    };
    let label = kind.label(args);
    let apps = Apps::new(run);
    let mut probe = connect(dsn, &apps.harness, &[]).await?;
    let cid = (uuid::Uuid::new_v4().as_u128() >> 66) as i64; // 62 random bits
    sqlx::query("INSERT INTO lockbench_counter(id, v) VALUES ($1, 0)")
        .bind(cid)
        .execute(&mut probe)
        .await
        .map_err(err)?;
    let exe = std::env::current_exe().map_err(err)?;
    let mut children = Vec::with_capacity(procs);
    let mut failed: Vec<String> = Vec::new();
    let mut outs: Vec<WorkerOut> = Vec::new();
    let mut conns = 0;
    let mut t0 = 0u64;

    let run_result: Res<()> = async {
        for _ in 0..procs {
            let mut child = tokio::process::Command::new(&exe)
                .args(worker_argv(args, dsn, kind, run, tasks, cid))
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .kill_on_drop(true)
                .spawn()
                .map_err(err)?;
            let stdout = BufReader::new(child.stdout.take().ok_or("no worker stdout")?).lines();
            children.push((child, stdout));
        }
        for (_, lines) in children.iter_mut() {
            let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
                .await
                .map_err(|_| "worker did not get ready within 60 s".to_owned())?
                .map_err(err)?;
            if line.as_deref().map(str::trim) != Some("READY") {
                return Err(format!("worker did not get ready: {line:?}"));
            }
        }
        let sampler_conn = connect(dsn, &apps.harness, &[]).await?;
        t0 = mono_ns() + 50_000_000; // a common start 50 ms from now
        for (child, _) in children.iter_mut() {
            let stdin = child.stdin.as_mut().ok_or("no worker stdin")?;
            stdin
                .write_all(format!("GO {t0}\n").as_bytes())
                .await
                .map_err(err)?;
            stdin.flush().await.map_err(err)?;
        }
        let sampler = Sampler::start(sampler_conn, apps.lib.clone(), secs(args.sample_interval));
        let limit = secs(args.duration) + Duration::from_secs(60);
        for (child, lines) in children.iter_mut() {
            let collected = tokio::time::timeout(limit, async {
                let mut found = None;
                while let Some(line) = lines.next_line().await.map_err(err)? {
                    if line.starts_with('{') {
                        found = Some(line);
                    }
                }
                found.ok_or_else(|| "worker printed no result".to_owned())
            })
            .await;
            match collected {
                Ok(Ok(line)) => match parse_worker(&line) {
                    Ok(o) => outs.push(o),
                    Err(e) => failed.push(e),
                },
                Ok(Err(e)) => failed.push(e),
                Err(_) => failed.push("worker timed out".to_owned()),
            }
            match tokio::time::timeout(Duration::from_secs(10), child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => failed.push(format!("worker exit {status}")),
                _ => failed.push("worker did not exit".to_owned()),
            }
        }
        conns = sampler.stop().await?;
        Ok(())
    }
    .await;
    if let Err(e) = run_result {
        failed.push(e);
    }
    for (mut child, _) in children {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
    let final_v: Option<i64> = sqlx::query_scalar("SELECT v FROM lockbench_counter WHERE id = $1")
        .bind(cid)
        .fetch_optional(&mut probe)
        .await
        .map_err(err)?;
    sqlx::query("DELETE FROM lockbench_counter WHERE id = $1")
        .bind(cid)
        .execute(&mut probe)
        .await
        .map_err(err)?;
    let _ = probe.close().await;

    // Records (t_req, t_acq, t_rel, task) with task numbers unique across processes.
    let mut recs: Vec<(u64, u64, u64, usize)> = Vec::new();
    let mut per_task = Vec::new();
    let mut tid = 0usize;
    for o in &outs {
        for t in &o.tasks {
            per_task.push(t.len());
            recs.extend(t.iter().map(|r| (r[0], r[1], r[2], tid)));
            tid += 1;
        }
    }
    let n_err: u64 = outs.iter().map(|o| o.n_errors).sum();
    let cs = recs.len();
    recs.sort_by_key(|r| r.1);
    let pairs: Vec<(i64, bool)> = recs
        .windows(2)
        .map(|w| (w[1].1 as i64 - w[0].2 as i64, w[1].3 != w[0].3))
        .collect();
    let mut handoff: Vec<i64> = pairs.iter().map(|p| p.0).collect();
    handoff.sort_unstable();
    let mut xfer: Vec<i64> = pairs.iter().filter(|p| p.1).map(|p| p.0).collect();
    xfer.sort_unstable();
    let overlaps = handoff.iter().filter(|&&d| d < 0).count();
    let mut wait: Vec<i64> = recs.iter().map(|r| r.1 as i64 - r.0 as i64).collect();
    wait.sort_unstable();
    let fairness = jain(&per_task);
    let deadline = t0 + secs(args.duration).as_nanos() as u64;
    let in_window = recs.iter().filter(|r| r.2 <= deadline).count();
    let end = outs
        .iter()
        .flat_map(|o| o.ends.iter().copied())
        .max()
        .unwrap_or(t0);
    let drain = end.saturating_sub(deadline) as f64 / 1e9;
    let counter_ok = final_v == Some(cs as i64);
    let correct = counter_ok && overlaps == 0 && n_err == 0 && failed.is_empty() && cs > 0;
    let (pt_min, pt_max) = (
        per_task.iter().copied().min().unwrap_or(0),
        per_task.iter().copied().max().unwrap_or(0),
    );
    let first_errors: Vec<&String> = outs.iter().flat_map(|o| o.errors.iter()).take(3).collect();
    log(&format!(
        "{label} {wl}: {} counter={final_v:?} critical_sections={cs} lost_updates={} overlaps={overlaps} \
         errors={n_err} {first_errors:?} worker_failures={failed:?} per_task=[{pt_min}..{pt_max}] \
         fairness={fairness:.3} connections={conns}",
        pass(correct),
        cs as i64 - final_v.unwrap_or(0),
    ));
    let round3 = |v: f64| (v * 1000.0).round() / 1000.0;
    Ok(result(
        &label,
        wl,
        in_window as f64 / args.duration,
        pct(&handoff, 0.5),
        pct(&handoff, 0.99),
        correct,
        conns,
        json!({
            "critical_sections": cs, "counter": final_v, "overlaps": overlaps,
            "errors": n_err, "first_errors": first_errors,
            "worker_failures": failed.iter().take(3).collect::<Vec<_>>(),
            "procs": procs, "tasks_per_proc": tasks, "in_window": in_window,
            "drain_s": round3(drain), "per_task_min": pt_min, "per_task_max": pt_max,
            "fairness_jain": round3(fairness),
            "switch_frac": round3(xfer.len() as f64 / pairs.len().max(1) as f64),
            "xfer_p50_ms": ns_to_ms(pct(&xfer, 0.5)), "xfer_p99_ms": ns_to_ms(pct(&xfer, 0.99)),
            "acquire_wait_p50_ms": ns_to_ms(pct(&wait, 0.5)),
            "acquire_wait_p99_ms": ns_to_ms(pct(&wait, 0.99)),
            "counter_synchronous_commit": args.counter_sync_commit,
            "clock": "CLOCK_MONOTONIC (rustix)",
            "latency": "handoff: next holder's acquire return - previous holder's release call",
        }),
    ))
}

// ---------------------------------------------------------------------------------------------
// W4: one holder acquires K distinct keys, then releases them all
// ---------------------------------------------------------------------------------------------

pub async fn w4(args: &Args, dsn: &str, kind: LibKind, run: &str) -> Res<Value> {
    let apps = Apps::new(run);
    let mut probe = connect(dsn, &apps.harness, &[]).await?;
    let lib = Lib::start(kind, dsn, &apps.lib, args)?;
    let out = w4_body(args, &lib, &apps, &mut probe).await;
    lib.close().await;
    let _ = probe.close().await;
    out
}

async fn round(h: &mut Holder, keys: &[Key], held: &mut Vec<Held>) -> Res<()> {
    for k in keys {
        held.push(h.acquire(k).await?);
    }
    while let Some(x) = held.pop() {
        h.release(x).await?;
    }
    Ok(())
}

async fn w4_body(args: &Args, lib: &Lib, apps: &Apps, probe: &mut PgConnection) -> Res<Value> {
    let wl = "W4_many_keys";
    let label = lib.kind.label(args);
    let k_count = args.keys;
    let mut h = lib.new_holder().await?;
    let keys: Vec<Key> = (0..k_count).map(|i| lib.key(&apps.run_id, wl, i)).collect();
    let ids: Vec<i64> = keys.iter().map(|k| k.id).collect();
    let before = count_sessions(probe, &apps.lib).await?;

    // Untimed probe round: connections while all K are held, and visibility.
    let mut held = Vec::with_capacity(k_count);
    for k in &keys {
        held.push(h.acquire(k).await?);
    }
    let conns_held = count_sessions(probe, &apps.lib).await?;
    let mut seen_held = 0usize;
    for k in &keys {
        seen_held += usize::from(held_elsewhere(probe, k.id).await?);
    }
    let bulk_held = count_held(probe, &ids).await?;
    while let Some(x) = held.pop() {
        h.release(x).await?;
    }
    let mut seen_free = 0usize;
    for k in &keys {
        seen_free += usize::from(!held_elsewhere(probe, k.id).await?);
    }

    let warm_end = Instant::now() + secs(args.warmup);
    while Instant::now() < warm_end {
        round(&mut h, &keys, &mut held).await?;
    }
    let mut lat: Vec<i64> = Vec::with_capacity(4096);
    let mut errors = 0u64;
    let cpu = Clocks::start(probe, &apps.lib).await?;
    let t0 = Instant::now();
    let deadline = t0 + secs(args.duration);
    let mut e = t0;
    while e < deadline {
        let s = Instant::now();
        if let Err(msg) = round(&mut h, &keys, &mut held).await {
            errors += 1;
            log(&format!("{label} {wl}: error {msg}"));
            break;
        }
        e = Instant::now();
        lat.push((e - s).as_nanos() as i64);
    }
    let elapsed = (e - t0).as_secs_f64();
    let cpu = cpu.stop(probe).await?;
    // Anything still held after an error goes back before the leak check.
    while let Some(x) = held.pop() {
        let _ = h.release(x).await;
    }
    let leaked = count_held(probe, &ids).await?;
    h.close().await;

    let rounds = lat.len();
    let lat = Latencies::sorted(lat);
    let k = k_count as i64;
    let correct = seen_held == k_count
        && bulk_held == k
        && seen_free == k_count
        && leaked == 0
        && errors == 0
        && rounds > 0;
    log(&format!(
        "{label} {wl}: {} rounds={rounds} K={k_count} connections_while_held={conns_held} \
         (before={before}) seen_held={seen_held}/{k_count} bulk_held={bulk_held}/{k_count} \
         seen_free={seen_free}/{k_count} leaked={leaked}",
        pass(correct)
    ));
    let mut detail = json!({"rounds": rounds, "K": k_count,
        "elapsed_s": (elapsed * 1000.0).round() / 1000.0, "connections_before": before,
        "seen_held": seen_held, "bulk_held": bulk_held, "seen_free": seen_free, "leaked": leaked,
        "errors": errors, "tail": lat.tail(),
        "ops": "keys per second (one acquire + one release each)",
        "latency": "one round: acquire K keys then release K"});
    cpu.record(&mut detail, (rounds * k_count) as u64);
    Ok(result(
        &label,
        wl,
        (rounds * k_count) as f64 / elapsed.max(1e-9),
        lat.p50(),
        lat.p99(),
        correct,
        conns_held,
        detail,
    ))
}

// ---------------------------------------------------------------------------------------------
// W5: N tasks in one process, each acquiring and releasing a key of its own
// ---------------------------------------------------------------------------------------------

/// W5 with `n_tasks` tasks. The pglock libraries share one manager (one per process, as its
/// docs prescribe); the sqlx floors share one default pool and take a connection per lock.
pub async fn w5(args: &Args, dsn: &str, kind: LibKind, run: &str, n_tasks: usize) -> Res<Value> {
    let apps = Apps::new(run);
    let mut probe = connect(dsn, &apps.harness, &[]).await?;
    let lib = Lib::start_pooled(kind, dsn, &apps.lib, args)?;
    let out = w5_body(args, dsn, &lib, &apps, &mut probe, n_tasks).await;
    lib.close().await;
    let _ = probe.close().await;
    out
}

/// What one W5 task hands back after a phase.
struct W5Task {
    holder: Holder,
    /// Latency of every op that started before the deadline and succeeded, in ns.
    lat: Vec<i64>,
    /// Ops that also ended by the deadline: the ones throughput counts.
    in_window: u64,
    /// The op that failed, if one did (the task stops at its first error).
    error: Option<String>,
    /// When the task's last op ended.
    end: Instant,
}

/// Runs one task per holder, each cycling its own key (acquire + release) until `deadline`,
/// on the current (single-threaded) runtime, and hands the holders back in order.
async fn w5_phase(holders: Vec<Holder>, keys: &[Key], deadline: Instant) -> Res<Vec<W5Task>> {
    let mut tasks = Vec::with_capacity(holders.len());
    for (mut holder, key) in holders.into_iter().zip(keys.iter().cloned()) {
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(1024);
            let (mut in_window, mut error) = (0, None);
            loop {
                let s = Instant::now();
                if s >= deadline {
                    break;
                }
                if let Err(e) = cycle(&mut holder, &key).await {
                    error = Some(e);
                    break;
                }
                let e = Instant::now();
                lat.push((e - s).as_nanos() as i64);
                in_window += u64::from(e <= deadline);
            }
            W5Task {
                holder,
                lat,
                in_window,
                error,
                end: Instant::now(),
            }
        }));
    }
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.map_err(err)?);
    }
    Ok(out)
}

async fn w5_body(
    args: &Args,
    dsn: &str,
    lib: &Lib,
    apps: &Apps,
    probe: &mut PgConnection,
    n_tasks: usize,
) -> Res<Value> {
    let wl = "W5_concurrent";
    let mut label = lib.kind.label(args);
    // The pooled floors' pool follows --pool-max too; say so as pglock's labels do.
    if let Some(max) = args.pool_max.filter(|_| lib.kind.is_sqlx_floor()) {
        label.push_str(&format!("_pool{max}"));
    }
    let keys: Vec<Key> = (0..n_tasks).map(|i| lib.key(&apps.run_id, wl, i)).collect();
    let ids: Vec<i64> = keys.iter().map(|k| k.id).collect();
    let mut holders = Vec::with_capacity(n_tasks);
    for _ in 0..n_tasks {
        holders.push(lib.new_holder().await?);
    }

    // Untimed visibility probe, task by task (holding all N at once would need N pooled
    // connections): every task's key seen held by another session while its task holds it,
    // and free after. This is the check `noop`, which excludes nothing, fails.
    let (mut seen_held, mut seen_free) = (0usize, 0usize);
    for (h, k) in holders.iter_mut().zip(&keys) {
        let held = h.acquire_uncontended(k).await?;
        seen_held += usize::from(held_elsewhere(probe, k.id).await?);
        h.release(held).await?;
        seen_free += usize::from(!held_elsewhere(probe, k.id).await?);
    }

    let mut errors: Vec<String> = Vec::new();
    let warm = w5_phase(holders, &keys, Instant::now() + secs(args.warmup)).await?;
    let mut holders = Vec::with_capacity(n_tasks);
    for t in warm {
        errors.extend(t.error);
        holders.push(t.holder);
    }

    let sampler = start_sampler(args, dsn, apps).await?;
    let cpu = Clocks::start(probe, &apps.lib).await?;
    let t0 = Instant::now();
    let deadline = t0 + secs(args.duration);
    let timed = w5_phase(holders, &keys, deadline).await?;
    let cpu = cpu.stop(probe).await?;
    let conns = stop_sampler(sampler, probe, &apps.lib).await?;
    // Before the library closes (pglock's manager releases everything it still holds then).
    let leaked = count_held(probe, &ids).await?;

    let mut lat = Vec::new();
    let mut per_task = Vec::with_capacity(n_tasks);
    let mut end = deadline;
    for t in timed {
        lat.extend_from_slice(&t.lat);
        per_task.push(t.in_window as usize);
        errors.extend(t.error);
        end = end.max(t.end);
        t.holder.close().await;
    }
    let ops: usize = per_task.iter().sum();
    let lat = Latencies::sorted(lat);
    let fairness = jain(&per_task);
    let (pt_min, pt_max) = (
        per_task.iter().copied().min().unwrap_or(0),
        per_task.iter().copied().max().unwrap_or(0),
    );
    let correct =
        seen_held == n_tasks && seen_free == n_tasks && errors.is_empty() && leaked == 0 && ops > 0;
    log(&format!(
        "{label} {wl}: {} tasks={n_tasks} ops={ops} seen_held={seen_held}/{n_tasks} \
         seen_free={seen_free}/{n_tasks} errors={} {:?} leaked={leaked} per_task=[{pt_min}..{pt_max}] \
         connections={conns}",
        pass(correct),
        errors.len(),
        errors.first(),
    ));
    let round3 = |v: f64| (v * 1000.0).round() / 1000.0;
    let mut line = result(
        &label,
        wl,
        ops as f64 / args.duration,
        lat.p50(),
        lat.p99(),
        correct,
        conns,
        json!({
            "n": ops, "completed": lat.0.len(), "duration_s": args.duration,
            "drain_s": round3((end - deadline).as_secs_f64()),
            "seen_held": seen_held, "seen_free": seen_free, "errors": errors.len(),
            "first_errors": errors.iter().take(3).collect::<Vec<_>>(), "leaked": leaked,
            "per_task_min": pt_min, "per_task_max": pt_max, "fairness_jain": round3(fairness),
            "tail": lat.tail(),
            "pool": match lib.kind {
                kind if kind.is_sqlx_floor() => "default pool, a connection per lock",
                LibKind::Noop => "none",
                _ => "one manager",
            },
            "ops": "acquire+release cycles of all tasks, ended by the deadline, per second",
            "latency": "acquire+release per cycle, one task's",
        }),
    );
    cpu.record(&mut line["detail"], lat.0.len() as u64);
    line["tasks"] = json!(n_tasks);
    Ok(line)
}
