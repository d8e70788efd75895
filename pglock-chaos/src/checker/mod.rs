//! Checks a history: safety anomalies, the lock operations against a model, and how soon the
//! workload made progress after faults.
//!
//! [`check`] reads the whole history at once, as Jepsen's checkers do. Safety has three parts:
//!
//! * **What the holders saw** ([`AnomalyKind::OverlappingSections`]): two holds of one key that
//!   pglock let overlap, judged from each task's own view of its hold (from being told it had
//!   the lock to its confirmed release), with the writes each made meanwhile, accepted or
//!   refused.
//! * **The model** ([`AnomalyKind::NotLinearizable`]): every key's acquisitions and releases
//!   must fit a mutex (a reader-writer lock where readers took the key too), searched with
//!   [`crate::linearize`]; operations whose outcome is unknown may or may not have taken
//!   effect.
//! * **What the fenced resource accepted**, in its own order: a section start accepted inside
//!   another section, a write accepted under a token older than one already accepted, a
//!   counter outside what the increments allow, a leader's log appended to by an older term
//!   after a newer one, a job window run twice.
//!
//! Liveness is judged per fault: the time from its heal to the next successful operation of
//! the worker it was aimed at (of any worker after the server's faults). [`frozen_holders`]
//! checks the silent-holder bound: that a lock held by a frozen worker went to a running one
//! in time.
//!
//! ```no_run
//! use pglock_chaos::checker::{Bounds, check};
//! use pglock_chaos::history::read_jsonl_dir;
//! use pglock_chaos::{report, svg};
//!
//! # fn main() -> std::io::Result<()> {
//! let history = read_jsonl_dir("target/chaos/run-1")?;
//! // A failover promotes a standby: allow it longer than the other faults.
//! let bounds = Bounds::new(30_000_000).with_kind("failover", 60_000_000);
//! let report = check(&history, &bounds);
//! println!("{report}");
//! std::fs::write("target/chaos/run-1/timeline.svg", svg::timeline(&history))?;
//! std::fs::write("target/chaos/run-1/report.md", report::markdown(&report, &history))?;
//! assert!(report.is_valid() && report.liveness_ok(), "{report}");
//! # Ok(())
//! # }
//! ```

mod display;
mod holds;
mod liveness;
mod model;
mod overlap;
mod safety;
mod settle;
mod silence;

pub use holds::{Ending, Hold, HoldCounts, holds};
pub use model::{KeyModel, MAX_STEPS, ModelOutcome};
pub use settle::settled;
pub use silence::{FrozenHolders, frozen_holders};

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::history::{Op, Outcome, Record};

/// How long the workload may take to make progress again after a fault healed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bounds {
    /// The bound, in microseconds, for kinds of fault without one of their own.
    pub default_recovery_us: u64,
    /// Bounds of their own, in microseconds, by kind of fault (`"failover"`).
    pub per_kind: BTreeMap<String, u64>,
}

impl Default for Bounds {
    /// 30 s for every kind: longer than a lost session takes to be noticed and its lock
    /// taken again, with room for a slow shared machine.
    fn default() -> Self {
        Self::new(30_000_000)
    }
}

impl Bounds {
    /// The same bound for every kind of fault.
    pub fn new(default_recovery_us: u64) -> Self {
        Self {
            default_recovery_us,
            per_kind: BTreeMap::new(),
        }
    }

    /// Gives one kind of fault a bound of its own.
    pub fn with_kind(mut self, kind: &str, recovery_us: u64) -> Self {
        self.per_kind.insert(kind.to_owned(), recovery_us);
        self
    }

    /// The bound for a kind of fault, in microseconds.
    pub fn recovery_us_for(&self, kind: &str) -> u64 {
        self.per_kind
            .get(kind)
            .copied()
            .unwrap_or(self.default_recovery_us)
    }
}

/// The kinds of safety anomaly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AnomalyKind {
    /// Two holds of one key overlapped although pglock confirmed one or both of them held it:
    /// the lock did not exclude (see [`Hold::surely_held`]).
    OverlappingSections,
    /// A key's lock operations fit no order of a mutex (or reader-writer lock).
    NotLinearizable,
    /// The resource accepted a section start between another section's accepted start and
    /// accepted end: the fence let a second holder in.
    InterleavedSections,
    /// A fenced write was accepted under a token older than one accepted before it.
    StaleWrite,
    /// A fenced log took an append from an older term after one from a newer term.
    TermOverlap,
    /// A counter's final value is outside what its increments allow.
    CounterMismatch,
    /// One window of a scheduled job ran successfully more than once.
    JobRunTwice,
}

impl AnomalyKind {
    /// Every kind, in the order reports list them.
    pub const ALL: [AnomalyKind; 7] = [
        AnomalyKind::OverlappingSections,
        AnomalyKind::NotLinearizable,
        AnomalyKind::InterleavedSections,
        AnomalyKind::StaleWrite,
        AnomalyKind::TermOverlap,
        AnomalyKind::CounterMismatch,
        AnomalyKind::JobRunTwice,
    ];

    /// A short name for reports (`"stale write"`).
    pub fn name(self) -> &'static str {
        match self {
            AnomalyKind::OverlappingSections => "overlapping sections",
            AnomalyKind::NotLinearizable => "not linearizable",
            AnomalyKind::InterleavedSections => "sections interleaved at the resource",
            AnomalyKind::StaleWrite => "stale write accepted",
            AnomalyKind::TermOverlap => "overlapping leader terms",
            AnomalyKind::CounterMismatch => "counter mismatch",
            AnomalyKind::JobRunTwice => "job window run twice",
        }
    }
}

impl fmt::Display for AnomalyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One safety anomaly, with the records that show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Anomaly {
    /// What went wrong.
    pub kind: AnomalyKind,
    /// The key it went wrong on.
    pub key: String,
    /// The records involved, earliest first.
    pub records: Vec<Record>,
    /// What happened, in a sentence (times in seconds from the history's first record).
    pub message: String,
}

impl fmt::Display for Anomaly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on key {:?}: {}", self.kind, self.key, self.message)
    }
}

/// How the workload recovered from one fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The fault, as the nemesis recorded it.
    pub fault: Record,
    /// Its kind (the fault's `detail`, or `"unknown"`).
    pub kind: String,
    /// From the heal to the end of the first successful operation after it; `None` if no
    /// operation succeeded after the heal before the history ended.
    pub recovery_us: Option<u64>,
    /// How long the history went on after the heal.
    pub observed_us: u64,
    /// The bound for its kind.
    pub bound_us: u64,
}

impl Recovery {
    /// Whether it breaks its bound: it recovered too late, or it never recovered although
    /// the history went on for longer than the bound.
    pub fn is_violation(&self) -> bool {
        match self.recovery_us {
            Some(took) => took > self.bound_us,
            None => self.observed_us > self.bound_us,
        }
    }
}

/// Nearest-rank percentiles of a list of durations, in microseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Percentiles {
    /// The median.
    pub p50: u64,
    /// The 90th percentile.
    pub p90: u64,
    /// The 99th percentile.
    pub p99: u64,
    /// The largest.
    pub max: u64,
}

impl Percentiles {
    /// The percentiles of `values` (in any order); `None` if there are none.
    pub fn of(values: &[u64]) -> Option<Self> {
        let mut sorted = values.to_vec();
        sorted.sort_unstable();
        // Nearest rank: the smallest value with at least the share `permille` at or below it.
        let at = |permille: usize| sorted[(permille * sorted.len()).div_ceil(1000).max(1) - 1];
        let max = *sorted.last()?;
        Some(Self {
            p50: at(500),
            p90: at(900),
            p99: at(990),
            max,
        })
    }
}

/// The liveness of one kind of fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindLiveness {
    /// The kind of fault.
    pub kind: String,
    /// How many were injected.
    pub faults: usize,
    /// The recovery times of those that recovered, smallest first.
    pub recoveries_us: Vec<u64>,
    /// How many never saw a successful operation after their heal.
    pub unrecovered: usize,
    /// How many broke the bound.
    pub violations: usize,
    /// The percentiles of `recoveries_us`.
    pub percentiles: Option<Percentiles>,
    /// The bound for this kind.
    pub bound_us: u64,
}

/// How many records of one operation ended one way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpCount {
    /// The operation.
    pub op: Op,
    /// How it ended.
    pub outcome: Outcome,
    /// How many.
    pub count: usize,
}

/// What [`check`] found in a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// How many records the history has, one per operation ([`settled`]).
    pub records: usize,
    /// The earliest time in the history (the origin of the times in messages).
    pub first_us: u64,
    /// The latest time in the history.
    pub last_us: u64,
    /// Records by operation and outcome, in [`Op::ALL`] and [`Outcome::ALL`] order, without
    /// zeros. Faults are counted here too, and by kind in `faults`.
    pub op_counts: Vec<OpCount>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, usize>,
    /// Safety anomalies, by kind then time.
    pub anomalies: Vec<Anomaly>,
    /// How the granted acquisitions ended.
    pub holds: HoldCounts,
    /// The model's verdict, key by key.
    pub model: Vec<KeyModel>,
    /// One entry per fault, in the order they were injected.
    pub recoveries: Vec<Recovery>,
    /// Recovery per kind of fault, by kind.
    pub liveness: Vec<KindLiveness>,
}

impl Report {
    /// Whether the history is safe: no anomaly, and the model search decided every key.
    pub fn is_valid(&self) -> bool {
        self.anomalies.is_empty() && self.model_decided()
    }

    /// Whether the model search reached a verdict on every key.
    pub fn model_decided(&self) -> bool {
        self.model
            .iter()
            .all(|key| key.outcome != ModelOutcome::Undecided)
    }

    /// How many lock operations the model checked, over every key.
    pub fn model_operations(&self) -> usize {
        self.model.iter().map(|key| key.operations).sum()
    }

    /// Whether every fault was recovered from within its bound.
    pub fn liveness_ok(&self) -> bool {
        self.recoveries.iter().all(|r| !r.is_violation())
    }

    /// The faults whose recovery broke its bound.
    pub fn violations(&self) -> impl Iterator<Item = &Recovery> {
        self.recoveries.iter().filter(|r| r.is_violation())
    }

    /// The anomalies of one kind.
    pub fn anomalies_of(&self, kind: AnomalyKind) -> impl Iterator<Item = &Anomaly> {
        self.anomalies.iter().filter(move |a| a.kind == kind)
    }

    /// How many records of `op` ended with `outcome`.
    pub fn count(&self, op: Op, outcome: Outcome) -> usize {
        self.op_counts
            .iter()
            .find(|c| c.op == op && c.outcome == outcome)
            .map_or(0, |c| c.count)
    }

    /// How long the history lasted.
    pub fn duration_us(&self) -> u64 {
        self.last_us - self.first_us
    }
}

/// Checks a whole history (the records of every process, in any order) against `bounds`.
///
/// The history is [`settled`] first: an operation recorded as unknown when invoked and again
/// with its outcome counts once, with that outcome.
pub fn check(history: &[Record], bounds: &Bounds) -> Report {
    let history = &*settled(history);
    let first_us = history
        .iter()
        .map(|r| r.start_us.min(r.end_us))
        .min()
        .unwrap_or(0);
    let last_us = history
        .iter()
        .map(|r| r.start_us.max(r.end_us))
        .max()
        .unwrap_or(0);
    let mut faults = BTreeMap::new();
    for fault in history.iter().filter(|r| r.op == Op::Fault) {
        *faults.entry(fault_kind(fault).to_owned()).or_insert(0) += 1;
    }
    let recoveries = liveness::recoveries(history, bounds, last_us);
    let holds = holds::holds(history);
    let mut anomalies = Vec::new();
    overlap::overlapping_holds(history, &holds, first_us, &mut anomalies);
    let model = model::check(history, &holds, first_us, &mut anomalies);
    safety::anomalies(history, first_us, &mut anomalies);
    anomalies.sort_by_key(|a| (a.kind, a.records.first().map(|r| r.start_us)));
    Report {
        records: history.len(),
        first_us,
        last_us,
        op_counts: op_counts(history),
        faults,
        anomalies,
        holds: HoldCounts::of(history, &holds),
        model,
        liveness: liveness::by_kind(&recoveries, bounds),
        recoveries,
    }
}

/// The kind of a fault record: its `detail`.
pub(crate) fn fault_kind(fault: &Record) -> &str {
    fault.detail.as_deref().unwrap_or("unknown")
}

fn op_counts(history: &[Record]) -> Vec<OpCount> {
    let mut counts: HashMap<(Op, Outcome), usize> = HashMap::new();
    for record in history {
        *counts.entry((record.op, record.outcome)).or_insert(0) += 1;
    }
    let mut listed = Vec::new();
    for op in Op::ALL {
        for outcome in Outcome::ALL {
            if let Some(&count) = counts.get(&(op, outcome)) {
                listed.push(OpCount { op, outcome, count });
            }
        }
    }
    listed
}

/// A duration for people: `"850 ms"`, `"12.3 s"`.
pub(crate) fn human_us(us: u64) -> String {
    match us {
        0..1_000 => format!("{us} µs"),
        1_000..1_000_000 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.2} s", us as f64 / 1e6),
    }
}

/// A time in the history, in seconds from its origin: `"12.345 s"`.
pub(crate) fn at_s(us: u64, origin_us: u64) -> String {
    format!("{:.3} s", us.saturating_sub(origin_us) as f64 / 1e6)
}

/// `"1 anomaly"`, `"2 anomalies"`.
pub(crate) fn count_of(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}
