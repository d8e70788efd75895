//! Liveness: how soon after each fault healed the workload succeeded again.

use std::collections::{BTreeMap, HashMap};

use super::{Bounds, KindLiveness, Percentiles, Recovery, fault_kind};
use crate::history::{Op, Outcome, Record};

/// One [`Recovery`] per fault, in the order they were injected.
///
/// Recovery is measured to the first successful operation that *ended* after the heal: one
/// invoked during the fault and answered after it counts, since the workload then made
/// progress again. A fault aimed at a worker (its key names a worker process of the history:
/// a kill, a pause, a partition) waits for that worker's own success; the others (the server's
/// faults, a terminated backend) for any worker's. Faults that overlap are measured each from
/// its own heal.
pub(super) fn recoveries(history: &[Record], bounds: &Bounds, last_us: u64) -> Vec<Recovery> {
    let mut any: Vec<u64> = Vec::new();
    let mut by_worker: HashMap<&str, Vec<u64>> = HashMap::new();
    for record in history.iter().filter(|r| r.op.is_progress()) {
        let ends = by_worker.entry(record.process.as_str()).or_default();
        if record.outcome == Outcome::Ok {
            ends.push(record.end_us);
            any.push(record.end_us);
        }
    }
    any.sort_unstable();
    by_worker.values_mut().for_each(|ends| ends.sort_unstable());
    let mut faults: Vec<&Record> = history.iter().filter(|r| r.op == Op::Fault).collect();
    faults.sort_by_key(|f| f.start_us);
    faults
        .into_iter()
        .map(|fault| {
            let kind = fault_kind(fault).to_owned();
            let healed = fault.end_us.max(fault.start_us);
            let progress = by_worker.get(fault.key.as_str()).unwrap_or(&any);
            let next = progress.partition_point(|&end| end <= healed);
            Recovery {
                fault: fault.clone(),
                recovery_us: progress.get(next).map(|end| end - healed),
                observed_us: last_us.saturating_sub(healed),
                bound_us: bounds.recovery_us_for(&kind),
                kind,
            }
        })
        .collect()
}

/// The recoveries summed up per kind of fault, by kind.
pub(super) fn by_kind(recoveries: &[Recovery], bounds: &Bounds) -> Vec<KindLiveness> {
    let mut kinds: BTreeMap<&str, Vec<&Recovery>> = BTreeMap::new();
    for recovery in recoveries {
        kinds
            .entry(recovery.kind.as_str())
            .or_default()
            .push(recovery);
    }
    kinds
        .into_iter()
        .map(|(kind, of_kind)| {
            let mut recoveries_us: Vec<u64> =
                of_kind.iter().filter_map(|r| r.recovery_us).collect();
            recoveries_us.sort_unstable();
            KindLiveness {
                kind: kind.to_owned(),
                faults: of_kind.len(),
                unrecovered: of_kind.len() - recoveries_us.len(),
                violations: of_kind.iter().filter(|r| r.is_violation()).count(),
                percentiles: Percentiles::of(&recoveries_us),
                recoveries_us,
                bound_us: bounds.recovery_us_for(kind),
            }
        })
        .collect()
}
