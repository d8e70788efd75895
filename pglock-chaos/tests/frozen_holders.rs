//! The silent-holder check on hand-made histories: `w1` holds `k` under token 10 from 0 and is
//! frozen from 1 s to 5 s; the bound is 2 s, the margin 0.5 s.

mod common;

use std::time::Duration;

use common::*;
use pglock_chaos::checker::frozen_holders;
use pglock_chaos::history::{Op, Outcome, Record};

const BOUND: Duration = Duration::from_secs(2);
const MARGIN: Duration = Duration::from_millis(500);

fn pause(process: &str, kind: &str, span: (u64, u64)) -> Record {
    Record {
        key: process.to_owned(),
        ..fault(kind, span)
    }
}

/// `process`'s section on `k`: held under `token` if it has one, else a wait.
fn section_of(process: &str, span: (u64, u64), outcome: Outcome, token: Option<i64>) -> Record {
    Record {
        token,
        ..record(process, Op::Section, "k", span, outcome)
    }
}

/// `process`'s lock operation `op` on `k` under `token`.
fn lock_op(process: &str, op: Op, token: i64, span: (u64, u64), outcome: Outcome) -> Record {
    Record {
        token: Some(token),
        holder: Some(format!("{process}/0")),
        ..record(process, op, "k", span, outcome)
    }
}

/// `w1` granted `k` under token 10 at 50 ms, told it had lost it after the freeze.
fn frozen_holder() -> Vec<Record> {
    vec![
        section_of("w1", (0, 5 * S + MS), Outcome::Info, Some(10)),
        lock_op("w1", Op::Acquire, 10, (0, 50 * MS), Outcome::Ok),
        lock_op(
            "w1",
            Op::Release,
            10,
            (5 * S + MS, 5 * S + 2 * MS),
            Outcome::Fail,
        ),
        pause("w1", "pause-long", (S, 5 * S)),
    ]
}

/// `w2`'s acquisition of `k` under token 11, returning at `at`.
fn taken_at(at: u64) -> Record {
    lock_op("w2", Op::Acquire, 11, (at - 10 * MS, at), Outcome::Ok)
}

#[test]
fn a_key_taken_within_the_bound_of_the_freeze_passes_and_one_taken_later_does_not() {
    for (at, late) in [
        (3 * S, false),
        (3 * S + 400 * MS, false),
        (3 * S + 600 * MS, true),
    ] {
        let mut history = frozen_holder();
        history.push(taken_at(at));
        let found = frozen_holders(&history, BOUND, MARGIN);
        assert_eq!((found.cases, found.frozen_waiters), (1, 0));
        assert_eq!(found.late.len(), usize::from(late), "taken at {at}");
    }
    let found = frozen_holders(&frozen_holder(), BOUND, MARGIN);
    assert_eq!(found.late.len(), 1, "never taken");
    // Neither an acquisition under an older token nor a shared one is the key taken.
    let mut history = frozen_holder();
    history.push(lock_op("w3", Op::Acquire, 9, (S, 2 * S), Outcome::Ok));
    history.push(lock_op(
        "w3",
        Op::AcquireShared,
        12,
        (S, 2 * S),
        Outcome::Ok,
    ));
    assert_eq!(frozen_holders(&history, BOUND, MARGIN).late.len(), 1);
}

#[test]
fn only_locks_held_across_the_whole_freeze_are_cases() {
    // Released with confirmation before the freeze, or granted only after it began.
    let history = vec![
        lock_op("w1", Op::Acquire, 10, (0, 50 * MS), Outcome::Ok),
        lock_op("w1", Op::Release, 10, (900 * MS, 910 * MS), Outcome::Ok),
        lock_op("w1", Op::Acquire, 11, (800 * MS, S + MS), Outcome::Ok),
        pause("w1", "pause-long", (S, 5 * S)),
    ];
    assert_eq!(frozen_holders(&history, BOUND, MARGIN).cases, 0);
    // Never released (its worker killed later): a case.
    let mut killed = frozen_holder();
    killed.remove(2);
    killed.push(taken_at(3 * S));
    let found = frozen_holders(&killed, BOUND, MARGIN);
    assert_eq!((found.cases, found.late.len()), (1, 0));
}

#[test]
fn a_leaders_term_held_across_a_freeze_must_pass_to_a_newer_term() {
    let term = |process: &str, token, span, outcome| Record {
        token: Some(token),
        ..record(process, Op::Term, "k", span, outcome)
    };
    let mut history = vec![
        term("w1", 10, (100 * MS, 5 * S + MS), Outcome::Info),
        pause("w1", "pause-long", (S, 5 * S)),
    ];
    assert_eq!(frozen_holders(&history, BOUND, MARGIN).late.len(), 1);
    history.push(term("w2", 11, (3 * S, 3 * S + 500 * MS), Outcome::Ok));
    let found = frozen_holders(&history, BOUND, MARGIN);
    assert_eq!((found.cases, found.late.len()), (1, 0));
}

#[test]
fn each_frozen_waiter_in_line_when_the_key_is_freed_adds_a_bound() {
    // `w3` waits from 0.5 s and is frozen from 2.5 s to 6 s: at 3 s the server grants it
    // the key, and ends its session at 5 s; `w2` takes the key then.
    let waiting = |process: &str, span| section_of(process, span, Outcome::Fail, None);
    let mut history = frozen_holder();
    history.extend([
        waiting("w3", (500 * MS, 6 * S + MS)),
        pause("w3", "pause-short", (2 * S + 500 * MS, 6 * S)),
        taken_at(5 * S + 200 * MS),
    ]);
    let found = frozen_holders(&history, BOUND, MARGIN);
    assert_eq!(
        (found.frozen_waiters, found.late.len()),
        (1, 0),
        "{found:?}"
    );
    // Later than a bound and two margins after that: late even so.
    history.pop();
    history.push(taken_at(6 * S + 600 * MS));
    assert_eq!(frozen_holders(&history, BOUND, MARGIN).late.len(), 1);

    // A second frozen waiter, in line behind the first, adds another bound.
    history.extend([
        waiting("w2", (S, 8 * S)),
        pause("w2", "pause-long", (4 * S, 7 * S)),
    ]);
    let found = frozen_holders(&history, BOUND, MARGIN);
    assert_eq!(
        (found.frozen_waiters, found.late.len()),
        (2, 0),
        "{found:?}"
    );
}

#[test]
fn a_waiter_not_frozen_when_the_key_is_freed_adds_nothing() {
    let mut history = frozen_holder();
    history.extend([
        section_of("w3", (500 * MS, 6 * S + MS), Outcome::Fail, None),
        // Running again before the key was freed: it would have taken it.
        pause("w3", "pause-long", (0, 2 * S)),
        // Frozen when the key was freed, but not waiting for it.
        section_of("w2", (3 * S + 600 * MS, 4 * S), Outcome::Fail, None),
        pause("w2", "pause-long", (2 * S, 5 * S)),
        taken_at(5 * S),
    ]);
    let found = frozen_holders(&history, BOUND, MARGIN);
    assert_eq!(
        (found.frozen_waiters, found.late.len()),
        (0, 1),
        "{found:?}"
    );
}
