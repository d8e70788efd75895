//! The run's lock operations against a lock model ([`crate::linearize`]), key by key.
//!
//! Each key's `acquire`, `acquire_shared` and `release` records become operations of a mutex
//! (a reader-writer lock when the key also saw shared acquisitions), one holder per task:
//!
//! * a granted acquisition takes effect between its call and its return;
//! * a confirmed release takes effect between its call and its return;
//! * any other end of a granted acquisition (lost, unconfirmed, never released) lets the lock
//!   go at some unknown time after the acquisition's call: a release of unknown outcome, which
//!   the search may place anywhere from then on.
//!
//! An acquisition of unknown outcome (a timeout, an error, a killed worker) is left out, and
//! counted ([`KeyModel::left_out`]). Had it taken effect, its task would hold the key to the
//! end of the history: every release of that task belongs to a later grant to the task, which
//! the model refuses while the task holds the key, and nothing in a chaos history needs a key
//! held by someone else (no refused tries). So it could only block other holders, never make
//! an order fit that does not fit without it: leaving it out changes no verdict, and spares
//! the search from trying it at every turn, which on a ten-minute history it could not afford.
//! The search itself places such operations where they matter (see `tests/linearize.rs`).
//!
//! Times are whole microseconds of the shared monotonic clock, rounded down. The search takes
//! a call and a return at the same microsecond as concurrent, which is what rounding down
//! leaves unknown; a return at an earlier microsecond than a call surely came first. A key
//! whose operations fit no order is a [`AnomalyKind::NotLinearizable`].

use std::collections::{BTreeMap, HashMap};

use pglock::LockMode;

use super::holds::Hold;
use super::{Anomaly, AnomalyKind, at_s};
use crate::history::{Op, Outcome, Record};
use crate::linearize::models::{Action, LockCall, Mutex, RwLock};
use crate::linearize::{self, Operation, Search, Verdict};

/// How many steps the search may take on one key before it gives up (undecided). A run's keys
/// take a few per operation.
pub const MAX_STEPS: u64 = 20_000_000;

/// The model's verdict on one key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyModel {
    /// The key.
    pub key: String,
    /// The model: `"mutex"` or `"reader-writer lock"`.
    pub model: &'static str,
    /// Operations checked.
    pub operations: usize,
    /// Of them, how many have an unknown outcome.
    pub unknown: usize,
    /// Acquisitions of unknown outcome left out (see the module docs).
    pub left_out: usize,
    /// The search's steps.
    pub steps: u64,
    /// What it concluded.
    pub outcome: ModelOutcome,
}

/// What the search concluded on a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelOutcome {
    /// An order fits the model.
    Linearizable,
    /// No order fits: an anomaly.
    NotLinearizable,
    /// The search ran out of steps: nothing is known.
    Undecided,
}

/// One key's operations, each with the record it came from.
#[derive(Default)]
struct KeyOps<'h> {
    ops: Vec<Operation<LockCall>>,
    sources: Vec<(&'h Record, &'static str)>,
    holders: HashMap<&'h str, u32>,
    shared: bool,
    left_out: usize,
}

impl<'h> KeyOps<'h> {
    fn push(
        &mut self,
        holder: &'h str,
        action: Action,
        span: (u64, Option<u64>),
        source: Source<'h>,
    ) {
        let next = self.holders.len() as u32;
        let holder = *self.holders.entry(holder).or_insert(next);
        self.shared |= action == Action::Acquire(LockMode::Shared);
        self.ops.push(Operation {
            input: LockCall { holder, action },
            call: span.0,
            ret: span.1,
        });
        self.sources.push(source);
    }
}

/// A record, and what the operation made of it says.
type Source<'h> = (&'h Record, &'static str);

/// Checks each key's lock operations; returns the verdicts by key and adds an anomaly for
/// each key that is not linearizable.
pub(super) fn check(
    history: &[Record],
    holds: &[Hold<'_>],
    origin_us: u64,
    found: &mut Vec<Anomaly>,
) -> Vec<KeyModel> {
    let keys = operations(history, holds);
    let mut verdicts = Vec::new();
    for (key, ops) in keys {
        let (model, search) = if ops.shared {
            let search = linearize::check(&RwLock, &ops.ops, MAX_STEPS);
            ("reader-writer lock", search)
        } else {
            ("mutex", linearize::check(&Mutex, &ops.ops, MAX_STEPS))
        };
        let outcome = match &search.verdict {
            Verdict::Linearizable => ModelOutcome::Linearizable,
            Verdict::Undecided => ModelOutcome::Undecided,
            Verdict::NotLinearizable(_) => {
                found.push(violation(key, model, &ops, &search, origin_us));
                ModelOutcome::NotLinearizable
            }
        };
        verdicts.push(KeyModel {
            key: key.to_owned(),
            model,
            operations: ops.ops.len(),
            unknown: ops.ops.iter().filter(|op| op.ret.is_none()).count(),
            left_out: ops.left_out,
            steps: search.steps,
            outcome,
        });
    }
    verdicts
}

fn operations<'h>(history: &'h [Record], holds: &[Hold<'h>]) -> BTreeMap<&'h str, KeyOps<'h>> {
    let mut keys: BTreeMap<&str, KeyOps<'_>> = BTreeMap::new();
    for hold in holds {
        let ops = keys.entry(hold.key()).or_default();
        let acquire = hold.acquire;
        let mode = mode_of(acquire);
        let called = acquire.start_us;
        ops.push(
            hold.holder(),
            Action::Acquire(mode),
            (called, Some(acquire.end_us)),
            (acquire, "granted"),
        );
        match hold.release {
            Some(release) if release.outcome == Outcome::Ok => ops.push(
                hold.holder(),
                Action::Release,
                (release.start_us, Some(release.end_us)),
                (release, "released, confirmed"),
            ),
            Some(release) => ops.push(
                hold.holder(),
                Action::Release,
                (called, None),
                (release, "lost"),
            ),
            None => ops.push(
                hold.holder(),
                Action::Release,
                (called, None),
                (acquire, "never released"),
            ),
        }
    }
    let unknown = history
        .iter()
        .filter(|r| matches!(r.op, Op::Acquire | Op::AcquireShared) && r.outcome == Outcome::Info);
    for acquire in unknown {
        keys.entry(&acquire.key).or_default().left_out += 1;
    }
    keys
}

fn mode_of(acquire: &Record) -> LockMode {
    if acquire.op == Op::AcquireShared {
        LockMode::Shared
    } else {
        LockMode::Exclusive
    }
}

fn violation(key: &str, model: &str, ops: &KeyOps<'_>, search: &Search, origin_us: u64) -> Anomaly {
    let Verdict::NotLinearizable(stuck) = &search.verdict else {
        unreachable!("only called on a violation");
    };
    let line = |op: usize| describe(&ops.ops[op], ops.sources[op], origin_us);
    let blocked = ops
        .ops
        .get(stuck.blocked)
        .map_or("the history's end".to_owned(), |_| line(stuck.blocked));
    let last: Vec<String> = stuck
        .longest
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(|&op| line(op))
        .collect();
    let message = format!(
        "no order of its {} lock operations fits a {model}: at best {} of them took effect in \
         order (the last: {}), and then {blocked} returned before it could take effect",
        ops.ops.len(),
        stuck.longest.len(),
        if last.is_empty() {
            "none".to_owned()
        } else {
            last.join("; ")
        },
    );
    let mut records: Vec<Record> = stuck
        .longest
        .iter()
        .rev()
        .take(3)
        .rev()
        .map(|&op| ops.sources[op].0.clone())
        .collect();
    if let Some(&(record, _)) = ops.sources.get(stuck.blocked) {
        records.push(record.clone());
    }
    Anomaly {
        kind: AnomalyKind::NotLinearizable,
        key: key.to_owned(),
        records,
        message,
    }
}

fn describe(op: &Operation<LockCall>, (record, what): Source<'_>, origin_us: u64) -> String {
    let holder = record.holder.as_deref().unwrap_or(&record.process);
    let action = match op.input.action {
        Action::Acquire(LockMode::Shared) => "shared acquire",
        Action::Acquire(_) => "acquire",
        Action::Refused(_) => "refused acquire",
        Action::Release => "release",
    };
    let token = record
        .token
        .map_or(String::new(), |t| format!(" of token {t}"));
    let when = match op.ret {
        Some(ret) => format!(
            "called {}, returned {}",
            at_s(op.call, origin_us),
            at_s(ret, origin_us)
        ),
        None => format!("any time from {}", at_s(op.call, origin_us)),
    };
    format!("{holder}'s {action}{token} ({what}; {when})")
}
