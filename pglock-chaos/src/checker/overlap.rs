//! Overlapping sections, judged from what the holders saw: two holds of one key that pglock
//! let overlap.
//!
//! A hold whose release pglock confirmed held the lock from the moment its task was told it
//! had it to the moment it asked to let it go ([`Hold::surely_held`]): pglock claims so by
//! confirming. Two holds of one key (not both shared) overlap when
//!
//! * both were confirmed and those intervals intersect, or
//! * one was confirmed, and the other (lost, unconfirmed or cut short by a kill) was granted
//!   while the first surely held the key: its whole acquisition, call to return, lies inside
//!   the first one's interval.
//!
//! A hold that pglock said was lost is not judged on its own: its task went on believing in it
//! until told, which is what fencing is for. Times are whole microseconds of the shared
//! monotonic clock, rounded down, so the comparisons are strict.
//!
//! Each finding lists what both holders did meanwhile: their writes to the resource on the
//! key, accepted or refused, in the resource's own order (`seq`).

use std::collections::{BTreeMap, HashMap};

use super::holds::{Ending, Hold};
use super::{Anomaly, AnomalyKind, at_s};
use crate::history::{Op, Outcome, Record};

/// The resource's records of each holder's writes, by (holder, token), in `seq` order.
type Writes<'h> = HashMap<(&'h str, Option<i64>), Vec<&'h Record>>;

/// Adds an anomaly for each pair of overlapping holds.
pub(super) fn overlapping_holds(
    history: &[Record],
    holds: &[Hold<'_>],
    origin_us: u64,
    found: &mut Vec<Anomaly>,
) {
    let writes = writes_by_holder(history);
    let mut keys: BTreeMap<&str, Vec<&Hold<'_>>> = BTreeMap::new();
    for hold in holds {
        keys.entry(hold.key()).or_default().push(hold);
    }
    for (key, holds) in keys {
        let mut sure: Vec<(u64, u64, &Hold<'_>)> = holds
            .iter()
            .filter_map(|h| h.surely_held().map(|(from, to)| (from, to, *h)))
            .collect();
        sure.sort_by_key(|&(from, to, _)| (from, to));
        // The latest end among the first i + 1, to stop scanning back early.
        let reach: Vec<u64> = sure
            .iter()
            .scan(0, |latest, &(_, to, _)| {
                *latest = to.max(*latest);
                Some(*latest)
            })
            .collect();
        for (at, &(from, to, hold)) in sure.iter().enumerate() {
            for first in earlier_intersecting(&sure[..at], &reach[..at], (from, to)) {
                if first.excludes(hold) {
                    found.push(anomaly(key, first, hold, &writes, origin_us));
                }
            }
        }
        for hold in holds.iter().filter(|h| h.surely_held().is_none()) {
            for first in containing(&sure, &reach, hold.granted_within()) {
                if first.excludes(hold) {
                    found.push(anomaly(key, first, hold, &writes, origin_us));
                }
            }
        }
    }
}

/// Those of `sure` (the confirmed holds sorted before another, with `reach` their running
/// latest end) that intersect `(from, to)`.
fn earlier_intersecting<'a, 'h>(
    sure: &[(u64, u64, &'a Hold<'h>)],
    reach: &[u64],
    (from, to): (u64, u64),
) -> Vec<&'a Hold<'h>> {
    (0..sure.len())
        .rev()
        .take_while(|&i| reach[i] > from)
        .map(|i| sure[i])
        .filter(|&(f, t, _)| f < to && from < t)
        .map(|(_, _, h)| h)
        .collect()
}

/// The confirmed holds whose interval strictly contains `window`.
fn containing<'a, 'h>(
    sure: &[(u64, u64, &'a Hold<'h>)],
    reach: &[u64],
    (call, ret): (u64, u64),
) -> Vec<&'a Hold<'h>> {
    let before = sure.partition_point(|&(from, _, _)| from < call);
    (0..before)
        .rev()
        .take_while(|&i| reach[i] > ret)
        .map(|i| sure[i])
        .filter(|&(_, to, _)| ret < to)
        .map(|(_, _, h)| h)
        .collect()
}

fn writes_by_holder(history: &[Record]) -> Writes<'_> {
    let mut writes: Writes<'_> = HashMap::new();
    let asked = history.iter().filter(|r| {
        matches!(
            r.op,
            Op::ResourceStart | Op::ResourceEnd | Op::ResourceAppend
        )
    });
    for write in asked {
        if let Some(holder) = write.holder.as_deref() {
            writes.entry((holder, write.token)).or_default().push(write);
        }
    }
    for list in writes.values_mut() {
        list.sort_by_key(|r| (r.seq, r.start_us));
    }
    writes
}

fn anomaly(
    key: &str,
    first: &Hold<'_>,
    second: &Hold<'_>,
    writes: &Writes<'_>,
    origin_us: u64,
) -> Anomaly {
    let of = |hold: &Hold<'_>| -> Vec<&Record> {
        writes
            .get(&(hold.holder(), hold.token()))
            .map(|list| list.iter().copied().filter(|w| w.key == key).collect())
            .unwrap_or_default()
    };
    let mut done: Vec<&Record> = of(first).into_iter().chain(of(second)).collect();
    done.sort_by_key(|r| (r.seq, r.start_us));
    let mut message = format!(
        "{}; {}",
        describe(first, origin_us),
        describe(second, origin_us)
    );
    if !done.is_empty() {
        let listed: Vec<String> = done.iter().map(|w| write_line(w)).collect();
        message.push_str(&format!(
            "; their writes, in the resource's order: {}",
            listed.join(", ")
        ));
    }
    let mut records = vec![first.acquire, second.acquire];
    records.extend(first.release.into_iter().chain(second.release));
    records.extend(done);
    Anomaly {
        kind: AnomalyKind::OverlappingSections,
        key: key.to_owned(),
        records: records.into_iter().cloned().collect(),
        message,
    }
}

fn describe(hold: &Hold<'_>, origin_us: u64) -> String {
    let token = hold.token().map_or("none".to_owned(), |t| t.to_string());
    let mode = if hold.is_shared() { " (shared)" } else { "" };
    let who = format!("{}{mode} under token {token}", hold.holder());
    match (hold.ending(), hold.surely_held()) {
        (Ending::Confirmed, Some((from, to))) => format!(
            "{who} held it from {} to {} (its release was confirmed)",
            at_s(from, origin_us),
            at_s(to, origin_us)
        ),
        (ending, _) => {
            let (call, ret) = hold.granted_within();
            let how = if ending == Ending::Lost {
                "later told it was lost"
            } else {
                "its release unconfirmed"
            };
            format!(
                "{who} was granted it between {} and {} ({how})",
                at_s(call, origin_us),
                at_s(ret, origin_us)
            )
        }
    }
}

fn write_line(write: &Record) -> String {
    let what = match write.op {
        Op::ResourceStart => "start",
        Op::ResourceEnd => "end",
        _ => "append",
    };
    let verdict = if write.outcome == Outcome::Ok {
        "accepted"
    } else {
        "refused"
    };
    let seq = write.seq.map_or("?".to_owned(), |s| s.to_string());
    let token = write.token.map_or("none".to_owned(), |t| t.to_string());
    format!("seq {seq} {what} of token {token} {verdict}")
}
