//! Clocks, percentiles and the result line.

use serde_json::{Value, json};

/// `CLOCK_MONOTONIC` in nanoseconds: one clock for every process on the machine, so W3
/// timestamps from several worker processes can be merged and compared.
pub fn mono_ns() -> u64 {
    clock_ns(rustix::time::ClockId::Monotonic)
}

/// A clock's reading in nanoseconds; both clocks read here start at zero and never go back.
fn clock_ns(clock: rustix::time::ClockId) -> u64 {
    let ts = rustix::time::clock_gettime(clock);
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPU time this process has used, all its threads together (`CLOCK_PROCESS_CPUTIME_ID`),
/// for the client's CPU per op: unlike throughput, it does not depend on how long the server
/// and the kernel take to answer, so it shows a library's own cost on a machine whose round
/// trips are mostly waiting for a CPU to wake.
pub struct CpuClock(u64);

impl CpuClock {
    pub fn start() -> Self {
        CpuClock(process_cpu_ns())
    }

    /// The CPU used since `start`. Everything the process did counts: the library, sqlx,
    /// tokio, the harness loop, and the `pg_stat_activity` sampler's query every
    /// `--sample-interval` (the same for every library).
    pub fn stop(self) -> CpuUsed {
        CpuUsed(process_cpu_ns().saturating_sub(self.0))
    }
}

/// CPU nanoseconds used over a timed window.
pub struct CpuUsed(u64);

impl CpuUsed {
    pub fn from_ns(ns: u64) -> Self {
        CpuUsed(ns)
    }

    /// Microseconds per op, rounded to 3 decimals (`null` without ops).
    pub fn per_op_us(&self, ops: u64) -> Value {
        if ops == 0 {
            return Value::Null;
        }
        json!(round_to(self.0 as f64 / ops as f64 / 1e3, 3))
    }
}

fn process_cpu_ns() -> u64 {
    clock_ns(rustix::time::ClockId::ProcessCPUTime)
}

/// Nearest-rank percentile of an already sorted slice (`q` in 0..=1).
pub fn pct<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q * sorted.len() as f64).ceil() as i64 - 1;
    let idx = rank.clamp(0, sorted.len() as i64 - 1) as usize;
    Some(sorted[idx])
}

fn round_to(v: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (v * f).round() / f
}

/// Nanoseconds to milliseconds, rounded to 4 decimals (`None` stays `null`).
pub fn ns_to_ms(v: Option<i64>) -> Value {
    match v {
        Some(ns) => json!(round_to(ns as f64 / 1e6, 4)),
        None => Value::Null,
    }
}

/// Jain's fairness index of per-task counts (1 = equal).
pub fn jain(counts: &[usize]) -> f64 {
    let sum: f64 = counts.iter().map(|&c| c as f64).sum();
    let sq: f64 = counts.iter().map(|&c| (c as f64) * (c as f64)).sum();
    if counts.is_empty() || sq == 0.0 {
        0.0
    } else {
        sum * sum / (counts.len() as f64 * sq)
    }
}

/// One result line (see `docs/benchmarks/notebook.md`, "Workloads": what each line carries).
#[allow(clippy::too_many_arguments)]
pub fn result(
    lib: &str,
    workload: &str,
    ops_per_s: f64,
    p50_ns: Option<i64>,
    p99_ns: Option<i64>,
    correct: bool,
    connections: i64,
    detail: Value,
) -> Value {
    let ops = if ops_per_s.is_finite() {
        round_to(ops_per_s, 2)
    } else {
        0.0
    };
    json!({
        "lib": lib,
        "workload": workload,
        "ops_per_s": ops,
        "p50_ms": ns_to_ms(p50_ns),
        "p99_ms": ns_to_ms(p99_ns),
        "correct": correct,
        "connections": connections,
        "detail": detail,
    })
}

/// Latency samples in nanoseconds, sorted, with the two percentiles of the result line.
pub struct Latencies(pub Vec<i64>);

impl Latencies {
    pub fn sorted(mut v: Vec<i64>) -> Self {
        v.sort_unstable();
        Latencies(v)
    }
    pub fn p50(&self) -> Option<i64> {
        pct(&self.0, 0.5)
    }
    pub fn p99(&self) -> Option<i64> {
        pct(&self.0, 0.99)
    }
    /// Extra tail figures for `detail`: p90, p99.9 and the maximum.
    pub fn tail(&self) -> Value {
        json!({
            "p90_ms": ns_to_ms(pct(&self.0, 0.9)),
            "p999_ms": ns_to_ms(pct(&self.0, 0.999)),
            "max_ms": ns_to_ms(self.0.last().copied()),
        })
    }
}
