//! The checker on synthetic histories: each anomaly found, a clean history passing, liveness.

use std::borrow::Cow;

mod common;

use common::*;
use pglock_chaos::checker::{AnomalyKind, Bounds, Percentiles, check, settled};
use pglock_chaos::history::{Op, Outcome, Record};
use pglock_chaos::report::markdown;

/// Everything the rules look at, done right: no anomaly.
fn clean_history() -> Vec<Record> {
    vec![
        // Two sections one after the other; a holder that lost its lock (7 never ended) and
        // the next one; a start the resource refused.
        accepted(Op::ResourceStart, "k", 10 * MS, 5),
        accepted(Op::ResourceEnd, "k", 20 * MS, 5),
        accepted(Op::ResourceStart, "k", 30 * MS, 6),
        accepted(Op::ResourceEnd, "k", 40 * MS, 6),
        accepted(Op::ResourceStart, "k", 50 * MS, 7),
        accepted(Op::ResourceStart, "k", 60 * MS, 8),
        accepted(Op::ResourceEnd, "k", 70 * MS, 8),
        Record {
            outcome: Outcome::Fail,
            ..accepted(Op::ResourceEnd, "k", 80 * MS, 7)
        },
        // Increments in token order, two of them at once under one token; and the counter.
        increment("c", (100 * MS, 110 * MS), Outcome::Ok, 1),
        increment("c", (105 * MS, 120 * MS), Outcome::Ok, 1),
        increment("c", (130 * MS, 140 * MS), Outcome::Ok, 2),
        counter_final("c", 3),
        // A leader's log: one term, then the next.
        accepted(Op::ResourceAppend, "log", 200 * MS, 1),
        accepted(Op::ResourceAppend, "log", 210 * MS, 1),
        accepted(Op::ResourceAppend, "log", 220 * MS, 2),
        // Job windows once each; a failed second try of one.
        job("w1", "j", 1, 300 * MS, Outcome::Ok),
        job("w2", "j", 2, 400 * MS, Outcome::Ok),
        job("w2", "j", 1, 410 * MS, Outcome::Fail),
        job("w3", "other", 1, 420 * MS, Outcome::Ok),
    ]
}

#[test]
fn a_clean_history_has_no_anomaly() {
    let report = check(&clean_history(), &Bounds::default());
    assert!(report.is_valid(), "{report}");
    assert!(report.to_string().contains("safety: valid"), "{report}");
}

#[test]
fn a_start_inside_another_section_is_interleaved_at_the_resource() {
    let history = vec![
        accepted(Op::ResourceStart, "k", 10 * MS, 5),
        accepted(Op::ResourceStart, "k", 20 * MS, 6),
        accepted(Op::ResourceEnd, "k", 25 * MS, 6),
        // Token 5's end accepted late: both ran at once. (Also a stale write.)
        accepted(Op::ResourceEnd, "k", 30 * MS, 5),
    ];
    let report = check(&history, &Bounds::default());
    let overlaps: Vec<_> = report
        .anomalies_of(AnomalyKind::InterleavedSections)
        .collect();
    assert_eq!(overlaps.len(), 1, "{report}");
    let tokens: Vec<_> = overlaps[0].records.iter().map(|r| r.token).collect();
    assert_eq!(tokens, [Some(5), Some(6), Some(5)]);
    assert_eq!(overlaps[0].key, "k");
    assert!(!report.is_valid());
}

#[test]
fn a_section_that_never_ended_overlaps_nothing() {
    let history = vec![
        accepted(Op::ResourceStart, "k", 10 * MS, 5),
        accepted(Op::ResourceStart, "k", 20 * MS, 6),
        accepted(Op::ResourceEnd, "k", 30 * MS, 6),
        // Another key's section in between is no overlap either.
        accepted(Op::ResourceStart, "other", 31 * MS, 1),
        accepted(Op::ResourceStart, "k", 32 * MS, 7),
        accepted(Op::ResourceEnd, "other", 33 * MS, 1),
    ];
    let report = check(&history, &Bounds::default());
    assert!(report.is_valid(), "{report}");
}

#[test]
fn a_write_under_an_older_token_is_stale() {
    let history = vec![
        accepted(Op::ResourceStart, "k", 10 * MS, 6),
        accepted(Op::ResourceEnd, "k", 20 * MS, 6),
        accepted(Op::ResourceStart, "k", 30 * MS, 5),
    ];
    let report = check(&history, &Bounds::default());
    assert_eq!(kinds(&report), [AnomalyKind::StaleWrite], "{report}");
    let tokens: Vec<_> = report.anomalies[0]
        .records
        .iter()
        .map(|r| r.token)
        .collect();
    assert_eq!(tokens, [Some(6), Some(5)]);
}

#[test]
fn an_increment_is_stale_only_when_surely_after_a_newer_one() {
    // Token 6 surely accepted (ended) before token 5 started: stale.
    let stale = vec![
        increment("c", (100 * MS, 110 * MS), Outcome::Ok, 6),
        increment("c", (120 * MS, 130 * MS), Outcome::Ok, 5),
    ];
    let report = check(&stale, &Bounds::default());
    assert_eq!(kinds(&report), [AnomalyKind::StaleWrite], "{report}");
    // Concurrent: token 5 may have landed first; a failed one did not land at all.
    let unsure = vec![
        increment("c", (100 * MS, 150 * MS), Outcome::Ok, 6),
        increment("c", (120 * MS, 130 * MS), Outcome::Ok, 5),
        increment("c", (200 * MS, 210 * MS), Outcome::Fail, 4),
    ];
    let report = check(&unsure, &Bounds::default());
    assert!(report.is_valid(), "{report}");
}

#[test]
fn an_append_from_an_older_term_is_a_term_overlap() {
    let history = vec![
        accepted(Op::ResourceAppend, "log", 10 * MS, 1),
        accepted(Op::ResourceAppend, "log", 20 * MS, 2),
        accepted(Op::ResourceAppend, "log", 30 * MS, 1),
    ];
    let report = check(&history, &Bounds::default());
    assert_eq!(kinds(&report), [AnomalyKind::TermOverlap], "{report}");
    // The resource's own order stands, whatever its clock said: 2 then 1 is an overlap, even
    // with 1's time earlier; 1 then 2 is not, even with 2's time earlier.
    let at = |seq: u64, time: u64, token: i64| Record {
        seq: Some(seq),
        ..accepted(Op::ResourceAppend, "log", time, token)
    };
    let report = check(&[at(1, 20 * MS, 2), at(2, 10 * MS, 1)], &Bounds::default());
    assert_eq!(kinds(&report), [AnomalyKind::TermOverlap], "{report}");
    let report = check(&[at(1, 20 * MS, 1), at(2, 10 * MS, 2)], &Bounds::default());
    assert!(report.is_valid(), "{report}");
}

#[test]
fn a_counter_may_end_anywhere_its_unknown_increments_allow() {
    let mut increments = vec![
        increment("c", (MS, 2 * MS), Outcome::Ok, 1),
        increment("c", (3 * MS, 4 * MS), Outcome::Ok, 1),
        increment("c", (5 * MS, 6 * MS), Outcome::Ok, 1),
        increment("c", (7 * MS, 8 * MS), Outcome::Info, 1),
        increment("c", (9 * MS, 10 * MS), Outcome::Info, 1),
        increment("c", (11 * MS, 12 * MS), Outcome::Fail, 1),
    ];
    increments.push(increment("d", (MS, 2 * MS), Outcome::Ok, 1));
    for (value, fine) in [(2, false), (3, true), (4, true), (5, true), (6, false)] {
        let mut history = increments.clone();
        history.push(counter_final("c", value));
        let report = check(&history, &Bounds::default());
        assert_eq!(report.is_valid(), fine, "final value {value}: {report}");
        if !fine {
            assert_eq!(kinds(&report), [AnomalyKind::CounterMismatch]);
            assert_eq!(report.anomalies[0].key, "c");
        }
    }
    // A counter read back as nothing, and one that no increment touched but is not zero.
    let mut history = increments.clone();
    history.push(Record {
        value: None,
        ..counter_final("c", 0)
    });
    history.push(counter_final("untouched", 1));
    let report = check(&history, &Bounds::default());
    assert_eq!(
        kinds(&report),
        [AnomalyKind::CounterMismatch; 2],
        "{report}"
    );
}

#[test]
fn a_window_run_twice_is_found() {
    let history = vec![
        job("w1", "j", 7, 100 * MS, Outcome::Ok),
        job("w2", "j", 8, 200 * MS, Outcome::Ok),
        job("w3", "j", 7, 300 * MS, Outcome::Ok),
    ];
    let report = check(&history, &Bounds::default());
    assert_eq!(kinds(&report), [AnomalyKind::JobRunTwice], "{report}");
    let anomaly = &report.anomalies[0];
    let who: Vec<_> = anomaly.records.iter().map(|r| r.process.as_str()).collect();
    assert_eq!(who, ["w1", "w3"]);
    assert!(
        anomaly.message.contains("window 7 ran 2 times"),
        "{}",
        anomaly.message
    );
}

#[test]
fn percentiles_are_nearest_rank() {
    let values: Vec<u64> = (1..=100).rev().collect();
    let p = Percentiles::of(&values).unwrap();
    assert_eq!((p.p50, p.p90, p.p99, p.max), (50, 90, 99, 100));
    let p = Percentiles::of(&[3, 1]).unwrap();
    assert_eq!((p.p50, p.p90, p.p99, p.max), (1, 3, 3, 3));
    assert_eq!(Percentiles::of(&[]), None);
}

#[test]
fn recovery_is_measured_to_the_first_success_after_the_heal() {
    let history = vec![
        fault("kill", (0, S)),
        section((0, 900 * MS), Outcome::Ok), // ended before the heal
        section((500 * MS, 1_200 * MS), Outcome::Fail), // not a success
        section((800 * MS, 1_500 * MS), Outcome::Ok), // invoked during the fault: counts
        section((1_100 * MS, 1_600 * MS), Outcome::Ok),
        fault("kill", (2 * S, 3 * S)),
        section((3 * S, 3 * S + 200 * MS), Outcome::Ok),
        fault("stop", (4 * S, 5 * S)),
        section((5 * S, 5 * S + 100 * MS), Outcome::Ok),
    ];
    let report = check(&history, &Bounds::new(S));
    let took: Vec<_> = report.recoveries.iter().map(|r| r.recovery_us).collect();
    assert_eq!(took, [Some(500 * MS), Some(200 * MS), Some(100 * MS)]);
    let kill = &report.liveness[0];
    assert_eq!(
        (kill.kind.as_str(), kill.faults, kill.unrecovered),
        ("kill", 2, 0)
    );
    assert_eq!(kill.recoveries_us, [200 * MS, 500 * MS]);
    assert_eq!(kill.percentiles.unwrap().p50, 200 * MS);
    assert_eq!(kill.percentiles.unwrap().max, 500 * MS);
    assert_eq!(report.liveness[1].kind, "stop");
    assert!(report.liveness_ok(), "{report}");
    assert_eq!(report.faults.get("kill"), Some(&2));
    assert_eq!(report.count(Op::Section, Outcome::Ok), 5);
    assert_eq!(report.count(Op::Section, Outcome::Fail), 1);
    assert_eq!(report.count(Op::Fault, Outcome::Ok), 3);
    assert_eq!(report.count(Op::Job, Outcome::Ok), 0);
}

#[test]
fn a_fault_aimed_at_a_worker_waits_for_that_worker() {
    let history = vec![
        Record {
            key: "w2".to_owned(),
            ..fault("kill", (0, S))
        },
        record("w1", Op::Section, "k", (S, S + 100 * MS), Outcome::Ok),
        record("w2", Op::Section, "k", (S, S + 400 * MS), Outcome::Fail),
        record("w2", Op::Section, "k", (S, S + 500 * MS), Outcome::Ok),
        // A fault on the server: any worker's success counts.
        fault("server-restart", (2 * S, 3 * S)),
        record(
            "w1",
            Op::Section,
            "k",
            (3 * S, 3 * S + 50 * MS),
            Outcome::Ok,
        ),
    ];
    let report = check(&history, &Bounds::new(S));
    let took: Vec<_> = report.recoveries.iter().map(|r| r.recovery_us).collect();
    assert_eq!(took, [Some(500 * MS), Some(50 * MS)]);
}

#[test]
fn a_slow_recovery_breaks_its_kinds_bound() {
    let history = vec![
        fault("kill", (0, S)),
        fault("failover", (2 * S, 3 * S)),
        section((0, 1_500 * MS), Outcome::Ok), // kill: 500 ms
        section((0, 4 * S), Outcome::Ok),      // failover: 1 s
    ];
    let lenient = Bounds::new(2 * S);
    assert!(check(&history, &lenient).liveness_ok());
    let strict_kill = Bounds::new(2 * S).with_kind("kill", 400 * MS);
    let report = check(&history, &strict_kill);
    assert!(!report.liveness_ok());
    assert!(report.is_valid(), "liveness is not safety");
    let late: Vec<_> = report.violations().map(|r| r.kind.as_str()).collect();
    assert_eq!(late, ["kill"]);
    assert_eq!(report.liveness[1].violations, 1);
    assert!(
        report.to_string().contains("recovered after 500.0 ms"),
        "{report}"
    );
}

#[test]
fn an_unrecovered_fault_breaks_its_bound_only_once_the_history_outlasts_it() {
    let short = vec![
        section((0, 100 * MS), Outcome::Ok),
        fault("partition", (S, 2 * S)),
        section((S, 2_500 * MS), Outcome::Fail),
    ];
    let report = check(&short, &Bounds::new(S));
    assert_eq!(report.recoveries[0].recovery_us, None);
    assert_eq!(report.liveness[0].unrecovered, 1);
    assert!(report.liveness_ok(), "observed only 500 ms: {report}");
    let mut long = short.clone();
    long.push(section((1_100 * MS, 3_500 * MS), Outcome::Info));
    let report = check(&long, &Bounds::new(S));
    assert!(!report.liveness_ok(), "{report}");
    assert!(report.to_string().contains("never recovered"), "{report}");
}

#[test]
fn the_markdown_report_has_a_table_for_each_part() {
    let mut history = vec![
        fault("kill", (0, S)),
        fault("kill", (2 * S, 3 * S)),
        fault("partition", (4 * S, 5 * S)),
        section((0, 1_500 * MS), Outcome::Ok),
        section((2 * S, 3_200 * MS), Outcome::Ok),
        section((3 * S, 3_500 * MS), Outcome::Info),
        section((3_100 * MS, 7 * S), Outcome::Fail),
        job("w1", "a|b", 1, 100 * MS, Outcome::Ok),
        job("w2", "a|b", 1, 200 * MS, Outcome::Ok),
    ];
    let report = check(&history, &Bounds::new(S));
    let md = markdown(&report, &history);
    let rows = [
        "| kill | 2 | 2.00 s | 1.00 s | server |",
        "| partition | 1 | 1.00 s | 1.00 s | server |",
        "| section | 2 | 1 | 1 | 4 |",
        "| job | 2 | 0 | 0 | 2 |",
        "| job window run twice | a\\|b |",
        "| kill | 2 | 0 | 200.0 ms | 500.0 ms | 500.0 ms | 500.0 ms | 1.00 s | 0 |",
        "| partition | 1 | 1 | – | – | – | – | 1.00 s | 1 |",
        "| partition | server | 5.000 s | none in 2.00 s | 1.00 s |",
        "**invalid**: 1 anomaly",
        "**violated**: 1 fault recovered from too late or never",
    ];
    for row in rows {
        assert!(md.contains(row), "{row} in:\n{md}");
    }
    // Without the duplicate run and with a late success, both verdicts are good.
    history.truncate(7);
    history.push(section((4 * S, 5_100 * MS), Outcome::Ok));
    let report = check(&history, &Bounds::new(S));
    let md = markdown(&report, &history);
    assert!(md.contains("None found."), "{md}");
    assert!(
        md.contains("**ok**") && !md.contains("Over their bound"),
        "{md}"
    );
}

#[test]
fn an_operation_recorded_as_unknown_when_invoked_is_settled_by_its_outcome() {
    let on = |task: u32, record: Record| Record { task, ..record };
    let invoked = |task: u32, at: u64| on(task, increment("c", (at, at), Outcome::Info, 1));
    let history = vec![
        invoked(0, MS),
        on(0, increment("c", (MS, 2 * MS), Outcome::Ok, 1)),
        invoked(1, 3 * MS),
        on(1, increment("c", (3 * MS, 4 * MS), Outcome::Fail, 1)),
        // Killed before its outcome: stays unknown.
        invoked(2, 5 * MS),
        // Its connection broke: unknown, counted once.
        invoked(3, 7 * MS),
        on(3, increment("c", (7 * MS, 9 * MS), Outcome::Info, 1)),
    ];
    let settled_history = settled(&history);
    let tasks: Vec<_> = settled_history
        .iter()
        .map(|r| (r.task, r.outcome, r.end_us))
        .collect();
    assert_eq!(
        tasks,
        [
            (0, Outcome::Ok, 2 * MS),
            (1, Outcome::Fail, 4 * MS),
            (2, Outcome::Info, 5 * MS),
            (3, Outcome::Info, 9 * MS)
        ]
    );
    for (value, fine) in [(0, false), (1, true), (3, true), (4, false)] {
        let mut with_final = history.clone();
        with_final.push(counter_final("c", value));
        let report = check(&with_final, &Bounds::default());
        assert_eq!(report.is_valid(), fine, "final value {value}: {report}");
        assert_eq!(report.count(Op::Increment, Outcome::Info), 2);
        assert_eq!(report.records, 5);
    }
    // A history of one record per operation is left as it is.
    assert!(matches!(settled(&clean_history()), Cow::Borrowed(_)));
}
