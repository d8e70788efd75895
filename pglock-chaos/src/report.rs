//! A [`Report`] as markdown, for the docs: what was injected, what ran, what went wrong, and
//! how fast the workload recovered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use crate::checker::{ModelOutcome, Report, at_s, count_of, fault_kind, human_us, settled};
use crate::history::{Op, Outcome, Record};

/// How many anomalies or violations the tables list before they only count the rest.
const ROWS: usize = 100;

/// The report of a run as markdown: a summary, then tables of the faults injected by kind,
/// operations by outcome, anomalies, and recovery per kind of fault.
pub fn markdown(report: &Report, history: &[Record]) -> String {
    let history = &*settled(history);
    let mut md = String::new();
    summary(&mut md, report, history);
    faults(&mut md, history);
    operations(&mut md, report);
    model(&mut md, report);
    anomalies(&mut md, report);
    liveness(&mut md, report);
    md
}

fn summary(md: &mut String, report: &Report, history: &[Record]) {
    let workers: BTreeSet<&str> = history
        .iter()
        .filter(|r| r.op.is_progress())
        .map(|r| r.process.as_str())
        .collect();
    let injected: usize = report.faults.values().sum();
    let safety = if report.is_valid() {
        "**valid**: no anomaly".to_owned()
    } else if report.anomalies.is_empty() {
        "**undecided**: the model search gave up on a key".to_owned()
    } else {
        format!(
            "**invalid**: {}",
            count_of(report.anomalies.len(), "anomaly", "anomalies")
        )
    };
    let late = report.violations().count();
    let liveness = if late == 0 {
        "**ok**: every fault recovered from within its bound".to_owned()
    } else {
        format!(
            "**violated**: {} recovered from too late or never",
            count_of(late, "fault", "faults")
        )
    };
    let _ = writeln!(md, "## Chaos run\n");
    let _ = writeln!(
        md,
        "- {} records over {}, from {}; {} injected.",
        report.records,
        human_us(report.duration_us()),
        count_of(workers.len(), "worker process", "worker processes"),
        count_of(injected, "fault", "faults"),
    );
    let _ = writeln!(md, "- Safety: {safety}.");
    let _ = writeln!(md, "- Liveness: {liveness}.\n");
}

fn faults(md: &mut String, history: &[Record]) {
    let _ = writeln!(md, "### Faults injected\n");
    // Per kind: how many, how long in all, and at what they were aimed.
    let mut kinds: BTreeMap<&str, (usize, u64, BTreeSet<&str>)> = BTreeMap::new();
    for fault in history.iter().filter(|r| r.op == Op::Fault) {
        let (count, total, targets) = kinds.entry(fault_kind(fault)).or_default();
        *count += 1;
        *total += fault.end_us.saturating_sub(fault.start_us);
        targets.insert(fault.key.as_str());
    }
    if kinds.is_empty() {
        let _ = writeln!(md, "None.\n");
        return;
    }
    let _ = writeln!(
        md,
        "| fault | injected | total time | mean time | targets |"
    );
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | --- |");
    for (kind, (count, total, targets)) in kinds {
        let mut targets: Vec<String> = targets.into_iter().map(str::to_owned).collect();
        if targets.len() > 6 {
            // Backends are many and each is hit once: a count says more than their pids.
            let all = targets.len();
            targets.truncate(3);
            targets.push(format!("... ({all} in all)"));
        }
        let _ = writeln!(
            md,
            "| {} | {count} | {} | {} | {} |",
            cell(kind),
            human_us(total),
            human_us(total / count as u64),
            cell(&targets.join(", "))
        );
    }
    md.push('\n');
}

fn operations(md: &mut String, report: &Report) {
    let _ = writeln!(md, "### Operations\n");
    let _ = writeln!(md, "| operation | ok | fail | info | total |");
    let _ = writeln!(md, "| --- | ---: | ---: | ---: | ---: |");
    for op in Op::ALL.into_iter().filter(|&op| op != Op::Fault) {
        let [ok, fail, info] = Outcome::ALL.map(|outcome| report.count(op, outcome));
        if ok + fail + info > 0 {
            let total = ok + fail + info;
            let _ = writeln!(md, "| {} | {ok} | {fail} | {info} | {total} |", op.name());
        }
    }
    md.push('\n');
}

fn model(md: &mut String, report: &Report) {
    let _ = writeln!(
        md,
        "### Locks against the model
"
    );
    let h = &report.holds;
    let _ = writeln!(
        md,
        "{} acquisitions granted: {} released with confirmation, {} lost, {} unknown; {} \
         acquisitions of unknown outcome.\n",
        h.granted, h.confirmed, h.lost, h.unknown, h.unknown_acquisitions
    );
    if report.model.is_empty() {
        let _ = writeln!(md, "No lock operation was recorded.\n");
        return;
    }
    let _ = writeln!(
        md,
        "| key | model | operations | unknown outcome | unknown acquisitions left out | steps \
         | verdict |"
    );
    let _ = writeln!(md, "| --- | --- | ---: | ---: | ---: | ---: | --- |");
    for key in &report.model {
        let verdict = match key.outcome {
            ModelOutcome::Linearizable => "linearizable",
            ModelOutcome::NotLinearizable => "**not linearizable**",
            ModelOutcome::Undecided => "**undecided**",
        };
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {verdict} |",
            cell(&key.key),
            key.model,
            key.operations,
            key.unknown,
            key.left_out,
            key.steps
        );
    }
    md.push('\n');
}

fn anomalies(md: &mut String, report: &Report) {
    let _ = writeln!(md, "### Anomalies\n");
    if report.anomalies.is_empty() {
        let _ = writeln!(md, "None found.\n");
        return;
    }
    let _ = writeln!(md, "| anomaly | key | records | what happened |");
    let _ = writeln!(md, "| --- | --- | --- | --- |");
    for anomaly in report.anomalies.iter().take(ROWS) {
        let records: Vec<String> = anomaly
            .records
            .iter()
            .map(|r| describe(r, report.first_us))
            .collect();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} |",
            anomaly.kind,
            cell(&anomaly.key),
            cell(&records.join("; ")),
            cell(&anomaly.message)
        );
    }
    more(md, report.anomalies.len());
}

fn liveness(md: &mut String, report: &Report) {
    let _ = writeln!(md, "### Recovery after faults\n");
    if report.liveness.is_empty() {
        let _ = writeln!(md, "No fault was injected.\n");
        return;
    }
    let _ = writeln!(
        md,
        "From a fault's heal to the next successful operation of the worker it was aimed at (of \
         any worker after the server's faults).\n"
    );
    let _ = writeln!(
        md,
        "| fault | faults | unrecovered | p50 | p90 | p99 | max | bound | over bound |"
    );
    let _ = writeln!(
        md,
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    );
    for kind in &report.liveness {
        let spread = kind.percentiles.map_or(
            ["–".to_owned(), "–".into(), "–".into(), "–".into()],
            |p| [p.p50, p.p90, p.p99, p.max].map(human_us),
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            cell(&kind.kind),
            kind.faults,
            kind.unrecovered,
            spread[0],
            spread[1],
            spread[2],
            spread[3],
            human_us(kind.bound_us),
            kind.violations
        );
    }
    md.push('\n');
    late(md, report);
}

fn late(md: &mut String, report: &Report) {
    let late: Vec<_> = report.violations().collect();
    if late.is_empty() {
        return;
    }
    let _ = writeln!(md, "#### Over their bound\n");
    let _ = writeln!(md, "| fault | target | healed at | recovery | bound |");
    let _ = writeln!(md, "| --- | --- | ---: | ---: | ---: |");
    for recovery in late.iter().take(ROWS) {
        let took = recovery.recovery_us.map_or_else(
            || format!("none in {}", human_us(recovery.observed_us)),
            human_us,
        );
        let _ = writeln!(
            md,
            "| {} | {} | {} | {took} | {} |",
            cell(&recovery.kind),
            cell(&recovery.fault.key),
            at_s(recovery.fault.end_us, report.first_us),
            human_us(recovery.bound_us)
        );
    }
    more(md, late.len());
}

/// One record in a few words: `w1/2 increment ok, token 5, at 1.234 s`.
fn describe(record: &Record, origin_us: u64) -> String {
    let token = record
        .token
        .map_or(String::new(), |t| format!(", token {t}"));
    let value = record
        .value
        .map_or(String::new(), |v| format!(", value {v}"));
    format!(
        "{}/{} {} {}{token}{value}, at {}",
        record.process,
        record.task,
        record.op.name(),
        record.outcome.name(),
        at_s(record.start_us, origin_us)
    )
}

fn more(md: &mut String, total: usize) {
    if total > ROWS {
        let _ = writeln!(md, "\n…and {} more.", total - ROWS);
    }
    md.push('\n');
}

/// Text made safe for a table cell: no column break, no line break, no HTML.
fn cell(text: &str) -> String {
    text.replace('|', "\\|")
        .replace(['\n', '\r'], " ")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
