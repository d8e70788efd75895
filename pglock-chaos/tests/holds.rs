//! The lock operations of a history: the overlap rule on what the holders saw, and the model.

mod common;

use common::*;
use pglock_chaos::checker::{AnomalyKind, Bounds, ModelOutcome, check};
use pglock_chaos::history::{Op, Outcome, Record};

/// `holder`'s (worker `w1`, `w2`...) lock operation `op` on `k` under `token`.
fn lock_op(holder: &str, op: Op, token: i64, span: (u64, u64), outcome: Outcome) -> Record {
    let process = holder.split('/').next().unwrap();
    Record {
        token: Some(token),
        holder: Some(holder.to_owned()),
        ..record(process, op, "k", span, outcome)
    }
}

/// A hold: granted over `granted`, released over `released` with `ended`.
fn hold(
    holder: &str,
    token: i64,
    granted: (u64, u64),
    released: (u64, u64),
    ended: Outcome,
) -> [Record; 2] {
    [
        lock_op(holder, Op::Acquire, token, granted, Outcome::Ok),
        lock_op(holder, Op::Release, token, released, ended),
    ]
}

fn shared(mut hold: [Record; 2]) -> [Record; 2] {
    hold[0].op = Op::AcquireShared;
    hold
}

/// What the resource took of `holder` under `token`, at `seq`.
fn wrote(op: Op, holder: &str, token: i64, seq: u64, outcome: Outcome) -> Record {
    Record {
        holder: Some(holder.to_owned()),
        outcome,
        seq: Some(seq),
        ..accepted(op, "k", seq * MS, token)
    }
}

#[test]
fn two_confirmed_holds_that_intersect_overlap() {
    let mut history: Vec<Record> = [
        hold("w1/0", 5, (0, 10 * MS), (100 * MS, 110 * MS), Outcome::Ok),
        hold(
            "w2/0",
            6,
            (20 * MS, 50 * MS),
            (200 * MS, 210 * MS),
            Outcome::Ok,
        ),
    ]
    .concat();
    // The fence did its work: token 5's end came after token 6's start, and was refused.
    history.extend([
        wrote(Op::ResourceStart, "w1/0", 5, 1, Outcome::Ok),
        wrote(Op::ResourceStart, "w2/0", 6, 2, Outcome::Ok),
        wrote(Op::ResourceEnd, "w1/0", 5, 3, Outcome::Fail),
        wrote(Op::ResourceEnd, "w2/0", 6, 4, Outcome::Ok),
    ]);
    let report = check(&history, &Bounds::default());
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::OverlappingSections,
            AnomalyKind::NotLinearizable
        ],
        "{report}"
    );
    let overlap = &report.anomalies[0];
    assert!(
        overlap
            .message
            .contains("seq 2 start of token 6 accepted, seq 3 end of token 5 refused"),
        "{}",
        overlap.message
    );
    assert_eq!(overlap.records.len(), 8, "both holds and their writes");
    assert_eq!((report.holds.granted, report.holds.confirmed), (2, 2));
}

#[test]
fn a_hold_pglock_said_was_lost_overlaps_nothing_by_itself() {
    // w1 was told of its loss at 310 ms; w2 held the key from 50 ms meanwhile.
    let history: Vec<Record> = [
        hold("w1/0", 5, (0, 10 * MS), (300 * MS, 310 * MS), Outcome::Fail),
        hold(
            "w2/0",
            6,
            (20 * MS, 50 * MS),
            (100 * MS, 110 * MS),
            Outcome::Ok,
        ),
        // Unconfirmed, and never released (a killed worker): the same.
        hold(
            "w3/0",
            7,
            (120 * MS, 130 * MS),
            (400 * MS, 410 * MS),
            Outcome::Info,
        ),
        [
            lock_op("w1/0", Op::Acquire, 8, (140 * MS, 150 * MS), Outcome::Ok),
            lock_op("w2/0", Op::Acquire, 9, (140 * MS, 200 * MS), Outcome::Info),
        ],
    ]
    .concat();
    let report = check(&history, &Bounds::default());
    assert!(report.is_valid(), "{report}");
    let h = report.holds;
    assert_eq!((h.granted, h.confirmed, h.lost, h.unknown), (4, 1, 1, 2));
    assert_eq!(h.unknown_acquisitions, 1);
    // Four holds of two operations each; the unknown acquisition is counted, left out.
    assert_eq!(
        (report.model[0].operations, report.model[0].left_out),
        (8, 1)
    );
    assert_eq!(report.model[0].outcome, ModelOutcome::Linearizable);
    assert!(
        report
            .to_string()
            .contains("k                mutex: linearizable")
    );
}

#[test]
fn a_grant_inside_a_confirmed_hold_overlaps() {
    // w2 was granted the key between 20 and 50 ms, while w1 surely held it (10 to 100 ms).
    let history: Vec<Record> = [
        hold("w1/0", 5, (0, 10 * MS), (100 * MS, 110 * MS), Outcome::Ok),
        hold(
            "w2/0",
            6,
            (20 * MS, 50 * MS),
            (300 * MS, 310 * MS),
            Outcome::Fail,
        ),
    ]
    .concat();
    let report = check(&history, &Bounds::default());
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::OverlappingSections,
            AnomalyKind::NotLinearizable
        ],
        "{report}"
    );
    // Granted before w1 was told it had the key: it may have lost it at once.
    let early: Vec<Record> = [
        hold("w1/0", 5, (0, 30 * MS), (100 * MS, 110 * MS), Outcome::Ok),
        hold(
            "w2/0",
            6,
            (20 * MS, 50 * MS),
            (300 * MS, 310 * MS),
            Outcome::Fail,
        ),
    ]
    .concat();
    let report = check(&early, &Bounds::default());
    assert!(report.is_valid(), "{report}");
}

#[test]
fn readers_may_overlap_each_other_but_not_a_writer() {
    let readers: Vec<Record> = [
        shared(hold(
            "w1/0",
            5,
            (0, 10 * MS),
            (100 * MS, 110 * MS),
            Outcome::Ok,
        )),
        shared(hold(
            "w2/0",
            6,
            (20 * MS, 50 * MS),
            (200 * MS, 210 * MS),
            Outcome::Ok,
        )),
    ]
    .concat();
    let report = check(&readers, &Bounds::default());
    assert!(report.is_valid(), "{report}");
    assert_eq!(report.model[0].model, "reader-writer lock");
    let mut writer = readers.clone();
    writer[2].op = Op::Acquire;
    let report = check(&writer, &Bounds::default());
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::OverlappingSections,
            AnomalyKind::NotLinearizable
        ],
        "{report}"
    );
}

#[test]
fn a_hand_over_between_tasks_of_one_worker_is_not_an_overlap() {
    // Task 1 waited from 50 ms; the key passed to it during task 0's release (100 ms).
    let history: Vec<Record> = [
        hold("w1/0", 5, (0, 10 * MS), (100 * MS, 105 * MS), Outcome::Ok),
        hold(
            "w1/1",
            6,
            (50 * MS, 100 * MS),
            (150 * MS, 160 * MS),
            Outcome::Ok,
        ),
    ]
    .concat();
    let report = check(&history, &Bounds::default());
    assert!(report.is_valid(), "{report}");
    // Told it had the key a microsecond before task 0 asked to let it go: an overlap.
    let mut early = history.clone();
    early[2].end_us = 100 * MS - 1;
    let report = check(&early, &Bounds::default());
    assert_eq!(
        kinds(&report),
        [
            AnomalyKind::OverlappingSections,
            AnomalyKind::NotLinearizable
        ],
        "{report}"
    );
}
