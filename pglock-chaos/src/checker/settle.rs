//! One record per operation: an operation recorded as unknown when invoked, then settled.

use std::borrow::Cow;
use std::collections::HashMap;

use crate::history::{Op, Outcome, Record};

/// What makes two records the same operation: who, what, on which key, started when.
type Identity<'h> = (&'h str, u32, Op, &'h str, u64);

fn identity(record: &Record) -> Identity<'_> {
    (
        &record.process,
        record.task,
        record.op,
        &record.key,
        record.start_us,
    )
}

/// The history with one record per operation (borrowed when it already is).
///
/// A worker may record an operation as [`Outcome::Info`] when it invokes it and again when
/// its outcome is known, so that a `SIGKILL` in between leaves the operation unknown rather
/// than absent. Records of the same process, task, op, key and start are one operation: its
/// `ok` or `fail` records stand and its `info` ones go; if all are `info`, the last stands.
pub fn settled(history: &[Record]) -> Cow<'_, [Record]> {
    // Per operation: whether it has an outcome, and its last `info` record.
    let mut operations: HashMap<Identity<'_>, (bool, usize)> = HashMap::new();
    for (i, record) in history.iter().enumerate() {
        let (known, last_info) = operations.entry(identity(record)).or_insert((false, i));
        match record.outcome {
            Outcome::Info => *last_info = i,
            Outcome::Ok | Outcome::Fail => *known = true,
        }
    }
    let stands = |i: usize, record: &Record| {
        record.outcome != Outcome::Info || operations[&identity(record)] == (false, i)
    };
    if history.iter().enumerate().all(|(i, r)| stands(i, r)) {
        return Cow::Borrowed(history);
    }
    let kept = history.iter().enumerate().filter(|&(i, r)| stands(i, r));
    Cow::Owned(kept.map(|(_, r)| r.clone()).collect())
}
