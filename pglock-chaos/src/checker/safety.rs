//! The safety rules of the resource's view and the workers' writes: each reads the records it
//! needs and adds the anomalies it finds. The resource's records are compared in the
//! resource's own order (`seq`), never by the server's clock.

use std::collections::{BTreeMap, HashMap};

use super::{Anomaly, AnomalyKind, at_s};
use crate::history::{Op, Outcome, Record};

/// The anomalies of the resource's view and of the workers' writes: sections interleaved at
/// the resource, stale writes, counters and job windows.
pub(super) fn anomalies(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    interleaved_sections(history, origin_us, found);
    stale_writes(history, origin_us, found);
    stale_increments(history, origin_us, found);
    counter_mismatches(history, found);
    jobs_run_twice(history, origin_us, found);
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

/// In the resource's own order (`seq`, which its fence's row lock imposes), the records of a
/// key's accepted writes.
fn in_resource_order(events: &mut [(usize, &Record)]) {
    events.sort_by_key(|&(i, r)| (r.seq, r.start_us, i));
}

/// A start accepted between another section's accepted start and its accepted end, in the
/// resource's order: the fence let a second holder in while the first went on writing.
///
/// A section whose end was never accepted lost its lock: a start after it is the next holder,
/// not an overlap. Only once that end shows up were both sections really running at once.
fn interleaved_sections(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    let accepted = |r: &Record| {
        r.outcome == Outcome::Ok && matches!(r.op, Op::ResourceStart | Op::ResourceEnd)
    };
    for (key, mut events) in by_key(history, accepted) {
        in_resource_order(&mut events);
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
                    "the resource accepted the start of token {} ({}) after the start of token \
                     {} ({}) and before its end ({})",
                    token(intruder),
                    place(intruder, origin_us),
                    token(first),
                    place(first, origin_us),
                    place(record, origin_us),
                );
                found.push(Anomaly {
                    kind: AnomalyKind::InterleavedSections,
                    key: key.to_owned(),
                    records: vec![first.clone(), intruder.clone(), record.clone()],
                    message,
                });
            }
        }
    }
}

/// Where a resource record stands: its `seq`, and the server's time (for reading only).
fn place(record: &Record, origin_us: u64) -> String {
    match record.seq {
        Some(seq) => format!("seq {seq}, about {}", at_s(record.start_us, origin_us)),
        None => at_s(record.start_us, origin_us),
    }
}

/// A fenced write accepted by the resource under a token lower than one it accepted before,
/// in its own order.
fn stale_writes(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    let fenced = |r: &Record| {
        r.outcome == Outcome::Ok
            && r.token.is_some()
            && matches!(
                r.op,
                Op::ResourceStart | Op::ResourceEnd | Op::ResourceAppend
            )
    };
    for (key, mut writes) in by_key(history, fenced) {
        in_resource_order(&mut writes);
        let mut newest: Option<&Record> = None;
        for &(_, write) in &writes {
            match newest {
                Some(newer) if newer.token > write.token => {
                    found.push(stale(key, newer, write, origin_us));
                }
                _ => newest = Some(write),
            }
        }
    }
}

/// A fenced increment accepted under a token lower than one accepted surely before it.
///
/// An increment was accepted somewhere between its start and its end, on the workers' shared
/// monotonic clock, so it surely came after another one only if it started after that one
/// ended.
fn stale_increments(history: &[Record], origin_us: u64, found: &mut Vec<Anomaly>) {
    let accepted =
        |r: &Record| r.op == Op::Increment && r.outcome == Outcome::Ok && r.token.is_some();
    for (key, writes) in by_key(history, accepted) {
        let mut by_start = writes.clone();
        by_start.sort_by_key(|&(i, r)| (r.start_us, i));
        let mut by_end = writes;
        by_end.sort_by_key(|&(i, r)| (r.end_us, i));
        // The increment with the highest token among those surely accepted so far.
        let mut newest: Option<&Record> = None;
        let mut done = 0;
        for &(_, write) in &by_start {
            for &(_, before) in by_end[done..]
                .iter()
                .take_while(|&&(_, r)| r.end_us < write.start_us)
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
    let when = |r: &Record| {
        if r.op == Op::Increment {
            format!(
                "between {} and {}",
                at_s(r.start_us, origin_us),
                at_s(r.end_us, origin_us)
            )
        } else {
            format!("at {}", place(r, origin_us))
        }
    };
    let message = format!(
        "{} of token {} was accepted {} after {} of token {} was accepted {}",
        write.op.name(),
        token(write),
        when(write),
        newer.op.name(),
        token(newer),
        when(newer),
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
