//! The linearizability search on hand-made lock histories: valid ones, invalid ones, and
//! operations of unknown outcome that the search must place (or leave out) by itself.

use pglock::LockMode::{Exclusive, Shared};
use pglock_chaos::linearize::models::{Action, LockCall, Mutex, RwLock, Semaphore};
use pglock_chaos::linearize::{Model, Operation, Verdict, check, check_by_key};
use pglock_chaos::rng::Rng;

const STEPS: u64 = 1_000_000;

fn op(holder: u32, action: Action, call: u64, ret: Option<u64>) -> Operation<LockCall> {
    Operation {
        input: LockCall { holder, action },
        call,
        ret,
    }
}

fn acquire(holder: u32, call: u64, ret: u64) -> Operation<LockCall> {
    op(holder, Action::Acquire(Exclusive), call, Some(ret))
}

fn release(holder: u32, call: u64, ret: u64) -> Operation<LockCall> {
    op(holder, Action::Release, call, Some(ret))
}

/// An operation whose outcome is unknown: it may take effect any time after `call`, or never.
fn unknown(holder: u32, action: Action, call: u64) -> Operation<LockCall> {
    op(holder, action, call, None)
}

fn verdict<M: Model<Input = LockCall>>(model: &M, history: &[Operation<LockCall>]) -> Verdict {
    check(model, history, STEPS).verdict
}

fn fits<M: Model<Input = LockCall>>(model: &M, history: &[Operation<LockCall>]) -> bool {
    match verdict(model, history) {
        Verdict::Linearizable => true,
        Verdict::NotLinearizable(_) => false,
        Verdict::Undecided => panic!("undecided in {STEPS} steps"),
    }
}

#[test]
fn holds_one_after_another_fit_a_mutex() {
    let history = [
        acquire(1, 0, 10),
        release(1, 20, 30),
        acquire(2, 25, 40), // called while 1 released: 1's release may come first
        release(2, 50, 60),
        acquire(1, 55, 70),
        release(1, 80, 90),
    ];
    assert!(fits(&Mutex, &history));
}

#[test]
fn two_overlapping_exclusive_holds_do_not_fit() {
    // 2 was told it had the lock at 15, while 1 held it from 10 until at least 20.
    let history = [
        acquire(1, 0, 10),
        acquire(2, 5, 15),
        release(1, 20, 30),
        release(2, 40, 50),
    ];
    let Verdict::NotLinearizable(stuck) = verdict(&Mutex, &history) else {
        panic!("overlapping holds fitted a mutex");
    };
    // The search placed one acquisition, then the other's return came first.
    assert_eq!(stuck.longest.len(), 1, "{stuck:?}");
    assert!([0, 1].contains(&stuck.blocked), "{stuck:?}");
    // The same holds fit a lock that shares, and a semaphore of two.
    let shared: Vec<_> = history
        .iter()
        .map(|o| match o.input.action {
            Action::Acquire(_) => Operation {
                input: LockCall {
                    action: Action::Acquire(Shared),
                    ..o.input
                },
                ..*o
            },
            _ => *o,
        })
        .collect();
    assert!(fits(&RwLock, &shared));
    assert!(fits(&Semaphore { permits: 2 }, &history));
    assert!(!fits(&Semaphore { permits: 1 }, &history));
}

#[test]
fn a_release_by_someone_who_does_not_hold_the_lock_does_not_fit() {
    assert!(!fits(&Mutex, &[acquire(1, 0, 10), release(2, 20, 30)]));
    assert!(!fits(&Mutex, &[release(1, 0, 10)]));
    // Nor does taking the lock twice.
    assert!(!fits(&Mutex, &[acquire(1, 0, 10), acquire(1, 20, 30)]));
}

/// Holder 2's acquisition reported a timeout, yet the lock was granted: holder 2 released it
/// later, which only fits if the search lets the unknown acquisition take effect first.
#[test]
fn a_granted_acquisition_reported_as_a_timeout_is_placed_by_the_search() {
    let history = [
        acquire(1, 0, 10),
        unknown(2, Action::Acquire(Exclusive), 5),
        release(1, 20, 30),
        release(2, 40, 50),
    ];
    assert!(fits(&Mutex, &history));
    // Had the acquisition failed for sure (left out), the release would not fit.
    let without: Vec<_> = [0, 2, 3].map(|i| history[i]).to_vec();
    assert!(!fits(&Mutex, &without));
    // An unknown acquisition cannot take effect before its call: called after the release,
    // it cannot explain it.
    let late = [
        acquire(1, 0, 10),
        release(1, 20, 30),
        release(2, 40, 50),
        unknown(2, Action::Acquire(Exclusive), 60),
    ];
    assert!(!fits(&Mutex, &late));
}

/// The same acquisition, shown by another holder's acquisition being refused.
#[test]
fn an_unknown_acquisition_can_explain_another_holders_refusal() {
    let refused = |holder, call, ret| op(holder, Action::Refused(Exclusive), call, Some(ret));
    let history = [
        unknown(1, Action::Acquire(Exclusive), 0),
        refused(2, 10, 20),
    ];
    assert!(fits(&Mutex, &history));
    // Refused while no one can hold the lock: no order fits.
    assert!(!fits(&Mutex, &[refused(2, 10, 20)]));
    let before = [
        refused(2, 10, 20),
        unknown(1, Action::Acquire(Exclusive), 30),
    ];
    assert!(!fits(&Mutex, &before));
}

/// An unknown acquisition may also never have taken effect: here it must not have, since
/// others took the lock after it and it was never released.
#[test]
fn an_unknown_acquisition_may_not_have_happened() {
    let history = [
        unknown(3, Action::Acquire(Exclusive), 0),
        acquire(1, 5, 10),
        release(1, 20, 30),
        acquire(2, 40, 50),
        release(2, 60, 70),
    ];
    assert!(fits(&Mutex, &history));
}

/// A lock lost at an unknown moment: its release may take effect any time after the grant,
/// so a later holder fits; had its release been confirmed late, it would not.
#[test]
fn a_lost_lock_lets_go_at_some_unknown_moment() {
    let lost = [
        acquire(1, 0, 10),
        unknown(1, Action::Release, 0),
        acquire(2, 20, 30),
        release(2, 40, 50),
    ];
    assert!(fits(&Mutex, &lost));
    let confirmed_late = [
        acquire(1, 0, 10),
        release(1, 60, 70),
        acquire(2, 20, 30),
        release(2, 40, 50),
    ];
    assert!(!fits(&Mutex, &confirmed_late));
}

#[test]
fn readers_share_and_writers_exclude() {
    let shared = |holder, call, ret| op(holder, Action::Acquire(Shared), call, Some(ret));
    let readers = [
        shared(1, 0, 10),
        shared(2, 5, 15),
        release(1, 20, 30),
        release(2, 25, 35),
        acquire(3, 30, 40),
        release(3, 50, 60),
    ];
    assert!(fits(&RwLock, &readers));
    // A writer told it had the lock while a reader surely held it.
    let mut writer_inside = readers.to_vec();
    writer_inside[4] = acquire(3, 12, 18);
    assert!(!fits(&RwLock, &writer_inside));
    // A mutex takes no shared acquisition.
    assert!(!fits(&Mutex, &readers));
}

#[test]
fn a_semaphore_admits_as_many_holders_as_it_has_permits() {
    let three_at_once = [
        acquire(1, 0, 10),
        acquire(2, 0, 10),
        acquire(3, 0, 10),
        release(1, 20, 30),
        release(2, 20, 30),
        release(3, 20, 30),
    ];
    assert!(fits(&Semaphore { permits: 3 }, &three_at_once));
    assert!(!fits(&Semaphore { permits: 2 }, &three_at_once));
    // With one acquisition unknown, two permits fit: it never took effect.
    let mut maybe = three_at_once.to_vec();
    maybe[2] = unknown(3, Action::Acquire(Exclusive), 0);
    maybe.remove(5);
    assert!(fits(&Semaphore { permits: 2 }, &maybe));
}

#[test]
fn keys_are_checked_apart() {
    // On each key alone the holds are fine; together they would overlap.
    let history = [
        ("a", acquire(1, 0, 10)),
        ("b", acquire(2, 5, 15)),
        ("a", release(1, 20, 30)),
        ("b", release(2, 40, 50)),
    ];
    let verdicts = check_by_key(&Mutex, &history, STEPS);
    assert_eq!(verdicts.len(), 2);
    for (key, search) in &verdicts {
        assert_eq!(search.verdict, Verdict::Linearizable, "{key}");
    }
    let together: Vec<_> = history.iter().map(|(_, o)| *o).collect();
    assert!(!fits(&Mutex, &together));
}

#[test]
fn a_search_out_of_steps_is_undecided() {
    let history = [acquire(1, 0, 10), release(1, 20, 30)];
    assert_eq!(check(&Mutex, &history, 1).verdict, Verdict::Undecided);
    assert_eq!(check(&Mutex, &history, 10).verdict, Verdict::Linearizable);
}

/// A long history of three holders sharing one lock, with calls and returns wide around the
/// real moments: `lost` in a hundred holds end with a release of unknown outcome, and
/// `orphans` in a hundred are followed by another holder's acquisition of unknown outcome that
/// never took effect. Returns the history and the time after its last operation.
fn long_history(holds: usize, lost: u64, orphans: u64) -> (Vec<Operation<LockCall>>, u64) {
    history_of(7, holds, lost, orphans)
}

/// As [`long_history`], from `seed`.
fn history_of(seed: u64, holds: usize, lost: u64, orphans: u64) -> (Vec<Operation<LockCall>>, u64) {
    let mut rng = Rng::new(seed);
    let mut history = Vec::new();
    let mut now = 0;
    for _ in 0..holds {
        let holder = rng.between(1, 3) as u32;
        // The real grant at `now`, the real release at `held`; the calls and returns around
        // them, wide enough to overlap the neighbours'.
        let held = now + rng.between(5, 50);
        let called = now.saturating_sub(rng.between(0, 40));
        history.push(acquire(holder, called, now + rng.between(0, 3)));
        let dice = rng.between(0, 99);
        if dice < lost {
            history.push(unknown(holder, Action::Release, called));
        } else {
            let release_call = held - rng.between(0, 3);
            history.push(release(holder, release_call, held + rng.between(1, 30)));
            if dice < lost + orphans {
                let other = holder % 3 + 1;
                history.push(unknown(other, Action::Acquire(Exclusive), held));
            }
        }
        now = held + rng.between(1, 10);
    }
    (history, now)
}

/// Moves the `nth` confirmed release (from the start, or from the end if negative) 10 s later.
fn release_late(history: &mut [Operation<LockCall>], nth: isize) {
    let confirmed: Vec<usize> = (0..history.len())
        .filter(|&i| history[i].input.action == Action::Release && history[i].ret.is_some())
        .collect();
    let at = if nth < 0 {
        confirmed[confirmed.len() - nth.unsigned_abs()]
    } else {
        confirmed[nth as usize]
    };
    history[at].call += 10_000;
    history[at].ret = history[at].ret.map(|r| r + 10_000);
}

/// A long, busy history fits in a number of steps that grows with its length and its pending
/// unknown operations (a tenth of the holds each here, far more than a chaos run has), not with
/// its possible orders; a release moved past the next grant is found.
#[test]
fn a_long_concurrent_history_is_checked_quickly() {
    let (mut history, _) = long_history(3_000, 10, 10);
    let search = check(&Mutex, &history, 10_000_000);
    assert_eq!(search.verdict, Verdict::Linearizable);
    assert!(
        search.steps < 400 * history.len() as u64,
        "{} steps for {} operations",
        search.steps,
        history.len()
    );
    release_late(&mut history, 20);
    let broken = check(&Mutex, &history, 10_000_000);
    assert!(
        matches!(broken.verdict, Verdict::NotLinearizable(_)),
        "{:?} in {} steps",
        broken.verdict,
        broken.steps
    );
}

/// Proving that no order fits takes trying every alternative before the violation; without
/// operations of unknown outcome, that stays linear even when the violation comes last.
#[test]
fn a_violation_at_the_end_of_a_long_history_is_found() {
    let (mut history, end) = long_history(3_000, 0, 0);
    release_late(&mut history, -1);
    history.push(acquire(9, end + 100, end + 200));
    let broken = check(&Mutex, &history, 10_000_000);
    let Verdict::NotLinearizable(stuck) = &broken.verdict else {
        panic!("{:?} in {} steps", broken.verdict, broken.steps);
    };
    assert!(stuck.longest.len() > 5_000, "{}", stuck.longest.len());
    assert!(
        broken.steps < 20 * history.len() as u64,
        "{} steps",
        broken.steps
    );
}

/// The chaos checker leaves out acquisitions of unknown outcome that no release of their
/// holder follows without a grant of its own (`checker::model`): such an operation could only
/// take the lock for good. Here, on many small histories, with and without a release moved
/// past the next grant, the search's verdict is the same with them and without them.
#[test]
fn leaving_out_unknown_acquisitions_that_no_release_needs_changes_no_verdict() {
    let is_orphan = |o: &Operation<LockCall>| o.ret.is_none() && o.input.action != Action::Release;
    let mut broken_seen = 0;
    for seed in 0..200 {
        let (mut history, _) = history_of(seed, 30, 15, 30);
        if seed % 2 == 1 {
            release_late(&mut history, (seed % 7) as isize);
        }
        let without: Vec<_> = history.iter().copied().filter(|o| !is_orphan(o)).collect();
        assert!(without.len() < history.len(), "seed {seed}: no orphan");
        let with_them = verdict(&Mutex, &history);
        let fitted = matches!(with_them, Verdict::Linearizable);
        assert_eq!(fitted, fits(&Mutex, &without), "seed {seed}: {with_them:?}");
        broken_seen += usize::from(!fitted);
    }
    assert!(broken_seen > 50, "only {broken_seen} broken histories");
}
