//! The safety rules: each reads the records it needs and adds the anomalies it finds.

use std::collections::{BTreeMap, HashMap};

use super::{Anomaly, AnomalyKind, at_s};
use crate::history::{Op, Outcome, Record};

/// Every safety anomaly of a history, by kind then time.
pub(super) fn anomalies(history: &[Record], origin_us: u64) -> Vec<Anomaly> {
    let mut found = Vec::new();
    overlapping_sections(history, origin_us, &mut found);
    stale_writes(history, origin_us, &mut found);
    counter_mismatches(history, &mut found);
    jobs_run_twice(history, origin_us, &mut found);
    found.sort_by_key(|a| (a.kind, a.records.first().map(|r| r.start_us)));
    found
}

/// The records that pass `keep`, with their index in the history, by key.
fn by_key(
    history: &[Record],
    keep: impl Fn(&Record) -> bool,
) -> BTreeMap<&str, Vec<(usize, &Record)>> {
    let mut keys: BTreeMap<&str, Vec<(usize, &Record)>> = BTreeMap::new();
    for (i, record) in history.iter().enumerate().filter(|(_, r)| keep(r)) {
        keys.entry(record.key.as_str())
            .or_default()
            .push((i, record));
    }
    keys
}

/// A start accepted between another section's accepted start and its accepted end.
///
/// A section whose end was never accepted lost its lock: a start after it is the next holder,
/// not an overlap. Only once that end shows up were both sections really running at once.
fn overlapping_sections(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    let accepted = |r: &Record| {
        r.outcome == Outcome::Ok && matches!(r.op, Op::ResourceStart | Op::ResourceEnd)
    };
    for (key, mut events) in by_key(history, accepted) {
        // Stable: at equal times the resource's read-back order stands.
        events.sort_by_key(|(_, r)| r.start_us);
        let mut open: HashMap<Option<i64>, Vec<usize>> = HashMap::new();
        for (at, &(_, record)) in events.iter().enumerate() {
            if record.op == Op::ResourceStart {
                open.entry(record.token).or_default().push(at);
                continue;
            }
            let Some(began) = open.get_mut(&record.token).and_then(Vec::pop) else {
                continue;
            };
            let first = events[began].1;
            let intruders = events[began + 1..at]
                .iter()
                .map(|&(_, r)| r)
                .filter(|r| r.op == Op::ResourceStart && r.token != record.token);
            for intruder in intruders {
                let message = format!(
                    "the section of token {} was accepted at {} while the section of token {}, \
                     accepted at {}, was still running (its end was accepted at {})",
                    token(intruder),
                    at_s(intruder.start_us, origin_us),
                    token(first),
                    at_s(first.start_us, origin_us),
                    at_s(record.start_us, origin_us),
                );
                found.push(Anomaly {
                    kind: AnomalyKind::OverlappingSections,
                    key: key.to_owned(),
                    records: vec![first.clone(), intruder.clone(), record.clone()],
                    message,
                });
            }
        }
    }
}

/// When a fenced write was surely accepted, as a pair that orders all of them on one key.
///
/// The resource's records are points (the time it accepted them, then their place in its
/// read-back for ties). A worker's increment was accepted somewhere between its start and its
/// end, so it surely came after another write only if it started after that one surely ended.
fn earliest(index: usize, record: &Record) -> (u64, usize) {
    if record.op == Op::Increment {
        (record.start_us, 0)
    } else {
        (record.start_us, index + 1)
    }
}

fn latest(index: usize, record: &Record) -> (u64, usize) {
    if record.op == Op::Increment {
        (record.end_us, usize::MAX)
    } else {
        (record.start_us, index + 1)
    }
}

/// A fenced write accepted under a token lower than one accepted surely before it.
fn stale_writes(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    let fenced = |r: &Record| {
        r.outcome == Outcome::Ok
            && r.token.is_some()
            && matches!(
                r.op,
                Op::ResourceStart | Op::ResourceEnd | Op::ResourceAppend | Op::Increment
            )
    };
    for (key, writes) in by_key(history, fenced) {
        let mut by_earliest = writes.clone();
        by_earliest.sort_by_key(|&(i, r)| earliest(i, r));
        let mut by_latest = writes;
        by_latest.sort_by_key(|&(i, r)| latest(i, r));
        // The write with the highest token among those surely accepted so far.
        let mut newest: Option<&Record> = None;
        let mut done = 0;
        for &(i, write) in &by_earliest {
            for &(_, before) in by_latest[done..]
                .iter()
                .take_while(|&&(j, r)| latest(j, r) < earliest(i, write))
            {
                if newest.is_none_or(|n| before.token > n.token) {
                    newest = Some(before);
                }
                done += 1;
            }
            if let Some(newer) = newest.filter(|n| n.token > write.token) {
                found.push(stale(key, newer, write, origin_us));
            }
        }
    }
}

fn stale(key: &str, newer: &Record, write: &Record, origin_us: u64) -> Anomaly {
    let kind = if write.op == Op::ResourceAppend {
        AnomalyKind::TermOverlap
    } else {
        AnomalyKind::StaleWrite
    };
    let message = format!(
        "{} of token {} was accepted at {} after {} of token {} was accepted at {}",
        write.op.name(),
        token(write),
        at_s(write.start_us, origin_us),
        newer.op.name(),
        token(newer),
        at_s(newer.start_us, origin_us),
    );
    Anomaly {
        kind,
        key: key.to_owned(),
        records: vec![newer.clone(), write.clone()],
        message,
    }
}

/// A counter whose final value is outside `[ok, ok + info]` increments.
///
/// An increment whose outcome is unknown may or may not have landed, so each one widens the
/// range by one; a failed one surely did not land.
fn counter_mismatches(history: &[Record], found: &mut Vec<Anomaly>) {
    let mut increments: HashMap<&str, (i64, i64)> = HashMap::new();
    for record in history.iter().filter(|r| r.op == Op::Increment) {
        let (ok, info) = increments.entry(record.key.as_str()).or_default();
        match record.outcome {
            Outcome::Ok => *ok += 1,
            Outcome::Info => *info += 1,
            Outcome::Fail => {}
        }
    }
    let finals = history
        .iter()
        .filter(|r| r.op == Op::CounterFinal && r.outcome == Outcome::Ok);
    for last in finals {
        let (ok, info) = increments
            .get(last.key.as_str())
            .copied()
            .unwrap_or_default();
        if last.value.is_some_and(|v| (ok..=ok + info).contains(&v)) {
            continue;
        }
        let value = last.value.map_or("nothing".to_owned(), |v| v.to_string());
        let message = format!(
            "the counter read {value} after the run, but {ok} increments succeeded and {info} \
             may have: it should be within [{ok}, {}]",
            ok + info
        );
        found.push(Anomaly {
            kind: AnomalyKind::CounterMismatch,
            key: last.key.clone(),
            records: vec![last.clone()],
            message,
        });
    }
}

/// Two successful runs of one job's window.
fn jobs_run_twice(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    let mut windows: BTreeMap<(&str, i64), Vec<&Record>> = BTreeMap::new();
    let runs = history
        .iter()
        .filter(|r| r.op == Op::Job && r.outcome == Outcome::Ok);
    for run in runs {
        if let Some(window) = run.value {
            windows
                .entry((run.key.as_str(), window))
                .or_default()
                .push(run);
        }
    }
    for ((key, window), mut runs) in windows.into_iter().filter(|(_, runs)| runs.len() > 1) {
        runs.sort_by_key(|r| r.start_us);
        let who: Vec<String> = runs
            .iter()
            .map(|r| {
                format!(
                    "{}/{} at {}",
                    r.process,
                    r.task,
                    at_s(r.start_us, origin_us)
                )
            })
            .collect();
        let message = format!(
            "window {window} ran {} times: {}",
            runs.len(),
            who.join(", ")
        );
        found.push(Anomaly {
            kind: AnomalyKind::JobRunTwice,
            key: key.to_owned(),
            records: runs.into_iter().cloned().collect(),
            message,
        });
    }
}

fn token(record: &Record) -> String {
    record.token.map_or("none".to_owned(), |t| t.to_string())
}
