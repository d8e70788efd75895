//! Figures of a run for people: operations by kind and outcome, faults by kind.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::history::{Op, Outcome, Record};

/// Operations of the workers by kind and outcome, and faults by kind (their `detail`).
pub fn figures(records: &[Record]) -> String {
    let mut ops: BTreeMap<String, [u32; 3]> = BTreeMap::new();
    let mut faults: BTreeMap<String, u32> = BTreeMap::new();
    for record in records {
        if record.op == Op::Fault {
            let kind = record.detail.as_deref().unwrap_or("?");
            let kind = kind.split(':').next().unwrap_or(kind).to_owned();
            *faults.entry(kind).or_default() += 1;
        } else if record.process != "resource" {
            let counts = ops.entry(format!("{:?}", record.op)).or_default();
            counts[match record.outcome {
                Outcome::Ok => 0,
                Outcome::Fail => 1,
                Outcome::Info => 2,
            }] += 1;
        }
    }
    let mut text = String::from("operations (ok / fail / info):\n");
    for (op, [ok, fail, info]) in &ops {
        let _ = writeln!(text, "  {op:<10} {ok:>6} {fail:>6} {info:>6}");
    }
    text.push_str("faults:\n");
    for (kind, n) in &faults {
        let _ = writeln!(text, "  {kind:<20} {n:>4}");
    }
    text
}
