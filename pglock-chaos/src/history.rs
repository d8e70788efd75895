//! The history of a chaos run: one [`Record`] per line of JSON.
//!
//! Times are microseconds of `CLOCK_MONOTONIC`, which every process on one machine shares, so
//! the records of all workers and of the nemesis can be compared directly ([`now_us`]).

use serde::{Deserialize, Serialize};

/// Microseconds of the machine's monotonic clock, comparable across its processes.
pub fn now_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000
}

/// One operation of a worker, or one fault of the nemesis, from its start to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Who did it: `"w1"`, `"w2"`, ... for worker processes, `"nemesis"` for faults, `"resource"`
    /// for what the fenced resource itself saw (read back after the run).
    pub process: String,
    /// The task within the process (0 for the nemesis and the resource).
    pub task: u32,
    /// What was done.
    pub op: Op,
    /// The lock key (or, for a fault, what it was aimed at: a worker, a backend, `"server"`).
    pub key: String,
    /// When the operation was invoked.
    pub start_us: u64,
    /// When its outcome was known (for a fault: when it healed).
    pub end_us: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The fencing token the operation ran under, if it got one.
    pub token: Option<i64>,
    /// An operation's value: the counter read back, the value written, the scheduled window.
    pub value: Option<i64>,
    /// Free text: an error, the kind of fault.
    pub detail: Option<String>,
}

/// The kinds of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A critical section under `with_lock`, whose start and end were written through a fenced
    /// resource.
    Section,
    /// A fenced read-modify-write increment of a counter (`value`: the value written).
    Increment,
    /// A leader's term, appending to a fenced log.
    Term,
    /// One run of a scheduled job (`value`: its window's start, in the job's own units).
    Job,
    /// A fault injected by the nemesis (`detail`: its kind).
    Fault,
    /// The resource's own view of a section start (`token`, `start_us` = when it accepted it).
    ResourceStart,
    /// The resource's own view of a section end.
    ResourceEnd,
    /// The resource's own view of a fenced log append.
    ResourceAppend,
    /// The final value of a counter, read after the run (`value`).
    CounterFinal,
}

/// How an operation ended, as Jepsen records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It happened (for a write: the resource accepted it).
    Ok,
    /// It certainly did not happen (for a write: the resource refused it).
    Fail,
    /// Unknown: the worker cannot tell (a broken connection mid-write, a killed process).
    Info,
}
