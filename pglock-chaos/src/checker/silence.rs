//! Whether locks held by frozen workers went to someone else within the silent-holder bound.
//!
//! A worker frozen past the bound (`pause-long`) while it holds a lock has its session ended by
//! the server about one bound after its last statement, and the key goes to the first session
//! in the server's queue. If that session belongs to a worker frozen at the time, the server
//! grants it the key all the same; that worker cannot use it, and its session, silent too, is
//! ended one bound after the grant. So each frozen waiter in line adds a bound before a worker
//! that runs can take the key: the deadline below allows for them, and says how many it
//! allowed for. The history does not show the order of the server's queue, so every worker
//! frozen while waiting for the key when it is freed counts as in line.
//!
//! Everything here is on the workers' and the nemesis's shared monotonic clock: a hold is an
//! exclusive acquisition and its release ([`Hold`]), a leader's term runs from the moment its
//! worker was told it led, and the key is taken when another worker's acquisition returns (or
//! its term begins) under a newer token.

use std::time::Duration;

use super::holds::{Hold, holds};
use crate::history::{Op, Outcome, Record};
use crate::nemesis::FaultKind;

/// What [`frozen_holders`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrozenHolders {
    /// Locks held across a long freeze of their worker: its holds of exclusive locks, and its
    /// leader terms.
    pub cases: usize,
    /// How many times a frozen waiter was in line when a key was freed (each adds a bound).
    pub frozen_waiters: usize,
    /// The records (acquisitions or terms) of those of `cases` whose key no one took under a
    /// newer token by the deadline.
    pub late: Vec<Record>,
}

/// For every lock held by a worker when it was frozen past the silent-holder `bound` (told it
/// had the lock before the freeze, and not letting it go before the freeze ended): another
/// worker took the key under a newer token while the holder was still frozen, within the bound
/// and `margin` of the freeze, plus a bound and a margin for each frozen waiter in line (see
/// the module docs).
pub fn frozen_holders(records: &[Record], bound: Duration, margin: Duration) -> FrozenHolders {
    let (bound, margin) = (micros(bound), micros(margin));
    let holds = holds(records);
    let mut found = FrozenHolders::default();
    let pauses = records
        .iter()
        .filter(|r| r.op == Op::Fault && r.detail.as_deref() == Some(FaultKind::PauseLong.name()));
    for pause in pauses {
        for held in held_across(records, &holds, pause) {
            found.cases += 1;
            let (deadline, waiters) = deadline(records, held, pause.start_us, bound, margin);
            found.frozen_waiters += waiters;
            if !taken(records, &holds, held, (pause.start_us, deadline)) {
                found.late.push(held.clone());
            }
        }
    }
    found
}

/// The locks `pause`'s worker held across it: exclusive holds told before the freeze and not
/// let go before its end, and terms begun before it that did not complete.
fn held_across<'h>(records: &'h [Record], holds: &[Hold<'h>], pause: &Record) -> Vec<&'h Record> {
    let by_worker = |r: &Record| r.process == pause.key;
    let mut held: Vec<&'h Record> = holds
        .iter()
        .filter(|h| by_worker(h.acquire) && !h.is_shared())
        .filter(|h| h.acquire.end_us < pause.start_us)
        .filter(|h| h.release.is_none_or(|r| r.start_us > pause.end_us))
        .map(|h| h.acquire)
        .collect();
    held.extend(
        records
            .iter()
            .filter(|r| by_worker(r) && r.op == Op::Term && r.outcome == Outcome::Info)
            .filter(|r| r.token.is_some() && r.start_us < pause.start_us)
            .filter(|r| r.end_us > pause.end_us),
    );
    held
}

/// Whether another worker took `held`'s key under a newer token within `(from, to]`: its
/// exclusive acquisition returned, or its term began, then.
fn taken(records: &[Record], holds: &[Hold<'_>], held: &Record, (from, to): (u64, u64)) -> bool {
    let newer = |r: &Record| r.key == held.key && r.token > held.token && r.process != held.process;
    let within = |at: u64| at > from && at <= to;
    holds
        .iter()
        .any(|h| !h.is_shared() && newer(h.acquire) && within(h.acquire.end_us))
        || records
            .iter()
            .any(|r| r.op == Op::Term && newer(r) && within(r.start_us))
}

/// The latest time a running worker should have `held`'s key by, its holder frozen from
/// `frozen_at`, and how many frozen waiters that allows for.
fn deadline(
    records: &[Record],
    held: &Record,
    frozen_at: u64,
    bound: u64,
    margin: u64,
) -> (u64, usize) {
    // When the server ends the silent session holding the key, give or take the margin.
    let mut freed = frozen_at + bound;
    let mut passed: Vec<&str> = vec![&held.process];
    while let Some(waiter) = records.iter().find(|w| {
        matches!(w.op, Op::Section | Op::Read | Op::Increment | Op::Term)
            && w.key == held.key
            && !passed.contains(&w.process.as_str())
            && w.start_us < freed + margin
            && w.end_us > freed
            && is_frozen_during(records, &w.process, (freed, freed + margin))
    }) {
        passed.push(&waiter.process);
        freed += bound + margin;
    }
    (freed + margin, passed.len() - 1)
}

/// Whether `process` was frozen (a pause of either length) at some moment of `window`.
fn is_frozen_during(records: &[Record], process: &str, window: (u64, u64)) -> bool {
    let paused = [FaultKind::PauseLong.name(), FaultKind::PauseShort.name()];
    records.iter().any(|r| {
        r.op == Op::Fault
            && r.key == process
            && r.detail
                .as_deref()
                .is_some_and(|kind| paused.contains(&kind))
            && r.start_us <= window.1
            && r.end_us >= window.0
    })
}

fn micros(duration: Duration) -> u64 {
    u64::try_from(duration.as_micros()).unwrap_or(u64::MAX)
}
