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

use std::time::Duration;

use crate::history::{Op, Outcome, Record};
use crate::nemesis::FaultKind;

/// What [`frozen_holders`] found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FrozenHolders {
    /// Operations that held a lock across a long freeze of their worker.
    pub cases: usize,
    /// How many times a frozen waiter was in line when a key was freed (each adds a bound).
    pub frozen_waiters: usize,
    /// Those of `cases` whose key no one used under a newer token by the deadline.
    pub late: Vec<Record>,
}

/// For every operation that held a lock (it had a token) when its worker was frozen past the
/// silent-holder `bound`, and did not complete: the resource accepted work on the key under a
/// newer token while the holder was still frozen, within the bound and `margin` of the freeze,
/// plus a bound and a margin for each frozen waiter in line (see the module docs).
pub fn frozen_holders(records: &[Record], bound: Duration, margin: Duration) -> FrozenHolders {
    let (bound, margin) = (micros(bound), micros(margin));
    let mut found = FrozenHolders::default();
    let pauses = records
        .iter()
        .filter(|r| r.op == Op::Fault && r.detail.as_deref() == Some(FaultKind::PauseLong.name()));
    for pause in pauses {
        let held_across = records.iter().filter(|r| {
            r.process == pause.key
                && matches!(r.op, Op::Section | Op::Term)
                && r.outcome == Outcome::Info
                && r.token.is_some()
                && r.start_us < pause.start_us
                && r.end_us > pause.end_us
        });
        for held in held_across {
            found.cases += 1;
            let (deadline, waiters) = deadline(records, held, pause.start_us, bound, margin);
            found.frozen_waiters += waiters;
            // The resource's view: a start or append on the key under a newer token.
            let taken = records.iter().any(|r| {
                matches!(r.op, Op::ResourceStart | Op::ResourceAppend)
                    && r.key == held.key
                    && r.token > held.token
                    && r.start_us > pause.start_us
                    && r.start_us <= deadline
            });
            if !taken {
                found.late.push(held.clone());
            }
        }
    }
    found
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
        matches!(w.op, Op::Section | Op::Term)
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
