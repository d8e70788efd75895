//! The checker on synthetic histories: each anomaly found, a clean history passing, liveness.

use std::borrow::Cow;

use pglock_chaos::checker::{AnomalyKind, Bounds, Percentiles, Report, check, settled};
use pglock_chaos::history::{Op, Outcome, Record};
use pglock_chaos::report::markdown;

const MS: u64 = 1_000;
const S: u64 = 1_000_000;

fn record(process: &str, op: Op, key: &str, span: (u64, u64), outcome: Outcome) -> Record {
    Record {
        process: process.to_owned(),
        task: 0,
        op,
        key: key.to_owned(),
        start_us: span.0,
        end_us: span.1,
        outcome,
        token: None,
        value: None,
        detail: None,
    }
}

/// What the resource accepted, at `at`.
fn accepted(op: Op, key: &str, at: u64, token: i64) -> Record {
    Record {
        token: Some(token),
        ..record("resource", op, key, (at, at), Outcome::Ok)
    }
}

fn increment(key: &str, span: (u64, u64), outcome: Outcome, token: i64) -> Record {
    Record {
        token: Some(token),
        ..record("w1", Op::Increment, key, span, outcome)
    }
}

fn counter_final(key: &str, value: i64) -> Record {
    Record {
        value: Some(value),
        ..record(
            "checker",
            Op::CounterFinal,
            key,
            (99 * S, 99 * S),
            Outcome::Ok,
        )
    }
}

fn job(process: &str, key: &str, window: i64, at: u64, outcome: Outcome) -> Record {
    Record {
        value: Some(window),
        ..record(process, Op::Job, key, (at, at + 10 * MS), outcome)
    }
}

fn fault(kind: &str, span: (u64, u64)) -> Record {
    Record {
        detail: Some(kind.to_owned()),
        ..record("nemesis", Op::Fault, "server", span, Outcome::Ok)
    }
}

fn section(span: (u64, u64), outcome: Outcome) -> Record {
    record("w2", Op::Section, "k", span, outcome)
}

fn kinds(report: &Report) -> Vec<AnomalyKind> {
    report.anomalies.iter().map(|a| a.kind).collect()
}

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
fn a_start_inside_another_section_is_an_overlap() {
    let history = vec![
        accepted(Op::ResourceStart, "k", 10 * MS, 5),
        accepted(Op::ResourceStart, "k", 20 * MS, 6),
        accepted(Op::ResourceEnd, "k", 25 * MS, 6),
        // Token 5's end accepted late: both ran at once. (Also a stale write.)
        accepted(Op::ResourceEnd, "k", 30 * MS, 5),
    ];
    let report = check(&history, &Bounds::default());
    let overlaps: Vec<_> = report
        .anomalies_of(AnomalyKind::OverlappingSections)
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
    // At equal times the resource's own order stands: 2 then 1 is still an overlap.
    let tied = vec![
        accepted(Op::ResourceAppend, "log", 10 * MS, 2),
        accepted(Op::ResourceAppend, "log", 10 * MS, 1),
    ];
    let report = check(&tied, &Bounds::default());
    assert_eq!(kinds(&report), [AnomalyKind::TermOverlap], "{report}");
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

/// The silent-holder check's histories: `w1` holds `k` under token 10 from 0 and is frozen
/// from 1 s to 5 s; the bound is 2 s, the margin 0.5 s.
mod frozen {
    use super::*;
    use pglock_chaos::checker::frozen_holders;
    use std::time::Duration;

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

    fn frozen_holder() -> Vec<Record> {
        vec![
            section_of("w1", (0, 5 * S + MS), Outcome::Info, Some(10)),
            accepted(Op::ResourceStart, "k", 100 * MS, 10),
            pause("w1", "pause-long", (S, 5 * S)),
        ]
    }

    fn taken_at(at: u64) -> Record {
        accepted(Op::ResourceStart, "k", at, 11)
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
        // Work under the holder's own token is not the key taken.
        let mut history = frozen_holder();
        history.push(accepted(Op::ResourceAppend, "k", 2 * S, 10));
        assert_eq!(frozen_holders(&history, BOUND, MARGIN).late.len(), 1);
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
}
