//! Records for the checker's tests: what workers, the resource and the nemesis record.

#![allow(dead_code)]

use pglock_chaos::checker::{AnomalyKind, Report};
use pglock_chaos::history::{Op, Outcome, Record};

pub const MS: u64 = 1_000;
pub const S: u64 = 1_000_000;

pub fn record(process: &str, op: Op, key: &str, span: (u64, u64), outcome: Outcome) -> Record {
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
        holder: None,
        seq: None,
    }
}

/// What the resource accepted, at `at` (its place in the resource's order too).
pub fn accepted(op: Op, key: &str, at: u64, token: i64) -> Record {
    Record {
        token: Some(token),
        seq: Some(at),
        ..record("resource", op, key, (at, at), Outcome::Ok)
    }
}

pub fn increment(key: &str, span: (u64, u64), outcome: Outcome, token: i64) -> Record {
    Record {
        token: Some(token),
        ..record("w1", Op::Increment, key, span, outcome)
    }
}

pub fn counter_final(key: &str, value: i64) -> Record {
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

pub fn job(process: &str, key: &str, window: i64, at: u64, outcome: Outcome) -> Record {
    Record {
        value: Some(window),
        ..record(process, Op::Job, key, (at, at + 10 * MS), outcome)
    }
}

pub fn fault(kind: &str, span: (u64, u64)) -> Record {
    Record {
        detail: Some(kind.to_owned()),
        ..record("nemesis", Op::Fault, "server", span, Outcome::Ok)
    }
}

pub fn section(span: (u64, u64), outcome: Outcome) -> Record {
    record("w2", Op::Section, "k", span, outcome)
}

pub fn kinds(report: &Report) -> Vec<AnomalyKind> {
    report.anomalies.iter().map(|a| a.kind).collect()
}
