//! `pglock holders`: who holds and who waits, once or over and over, filtered, as a table or JSON.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::time::Duration;

use chrono::{DateTime, Utc};
use pglock::LockTarget;
use pglock::inspect::{Age, Inspector, LockReport, Session};
use serde_json::{Value, json};

use crate::text::{glob_match, human};
use crate::{EXIT_FREE, EXIT_RUNTIME, Failure, Filters, Target};

/// What to show, and how.
#[derive(Debug)]
pub(crate) struct Show {
    pub(crate) target: Target,
    pub(crate) filters: Filters,
    pub(crate) json: bool,
    pub(crate) watch: Option<Duration>,
}

/// Shows the reports once, or every `watch` interval until SIGINT or SIGTERM; the exit code
/// says whether a matching lock was held, in the last report shown.
pub(crate) async fn holders(inspector: &Inspector, show: &Show) -> Result<u8, Failure> {
    let Some(interval) = show.watch else {
        let reports = show.target.reports(inspector).await?;
        let reports = select(reports, &show.filters, show.target.is_one());
        write_out(&render(&reports, show))?;
        return Ok(code(&reports));
    };
    let clear = !show.json && std::io::stdout().is_terminal();
    let mut last;
    let mut stop = std::pin::pin!(crate::interrupted());
    loop {
        match show.target.reports(inspector).await {
            Ok(reports) => {
                let reports = select(reports, &show.filters, show.target.is_one());
                last = code(&reports);
                let mut out = String::new();
                if clear {
                    out.push_str("\x1b[2J\x1b[H");
                }
                if !show.json {
                    let at = Utc::now().format("%Y-%m-%d %H:%M:%S UTC");
                    let _ = writeln!(out, "-- {at}, every {}; Ctrl-C to stop", human(interval));
                }
                out.push_str(&render(&reports, show));
                write_out(&out)?;
            }
            // A watch outlives a database hiccup: say so, and look again.
            Err(Failure(_, message)) => {
                eprintln!("pglock: error: {message}");
                last = EXIT_RUNTIME;
            }
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            () = &mut stop => return Ok(last),
        }
    }
}

fn write_out(text: &str) -> Result<(), Failure> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
        .map_err(|err| Failure(EXIT_RUNTIME, format!("cannot write the output: {err}")))
}

/// 0 when a listed lock has a holder, [`EXIT_FREE`] otherwise.
pub(crate) fn code(reports: &[LockReport]) -> u8 {
    if reports.iter().any(|r| !r.holders.is_empty()) {
        0
    } else {
        EXIT_FREE
    }
}

/// Keeps the sessions that pass the filters. For a listing of every lock, locks left with no
/// session are dropped; the report of one named lock is kept, if only to say it is free.
pub(crate) fn select(reports: Vec<LockReport>, filters: &Filters, one: bool) -> Vec<LockReport> {
    reports
        .into_iter()
        .map(|mut report| {
            report.holders.retain(|s| filters.admit(s));
            report.waiters.retain(|s| filters.admit(s));
            report
        })
        .filter(|report| one || !report.is_free())
        .collect()
}

impl Filters {
    /// Whether `session` passes every filter given. `--older-than` compares the age shown,
    /// which for [`Age::AtLeast`] is a lower bound: it may leave out a session that held
    /// longer, never admit one that held less.
    pub(crate) fn admit(&self, session: &Session) -> bool {
        let old_enough = self.older_than.is_none_or(|at_least| {
            session
                .held_or_waited_for
                .is_some_and(|held| held >= at_least)
        });
        let named = self.holder.as_deref().is_none_or(|pattern| {
            let name = session
                .holder_id
                .as_deref()
                .or(session.application_name.as_deref());
            name.is_some_and(|name| glob_match(pattern, name))
        });
        old_enough && named
    }
}

fn render(reports: &[LockReport], show: &Show) -> String {
    match (show.json, show.target.is_one()) {
        (true, true) => format!("{}\n", report_json(&reports[0])),
        (true, false) => format!(
            "{}\n",
            Value::Array(reports.iter().map(report_json).collect())
        ),
        (false, _) => table(reports, show.filters.any()),
    }
}

fn report_json(report: &LockReport) -> Value {
    let pair = match report.target {
        LockTarget::IntPair(a, b) => Some([a, b]),
        _ => None,
    };
    json!({
        "lock_id": report.lock_id,
        "classid": report.classid,
        "objid": report.objid,
        "objsubid": report.target.objsubid(),
        "pair": pair,
        "key": report.key.as_ref().map(ToString::to_string),
        "holders": report.holders.iter().map(session_json).collect::<Vec<_>>(),
        "waiters": report.waiters.iter().map(session_json).collect::<Vec<_>>(),
    })
}

fn session_json(session: &Session) -> Value {
    json!({
        "pid": session.pid,
        "mode": session.mode.as_str(),
        "holder_id": session.holder_id,
        "application_name": session.application_name,
        "client_addr": session.client_addr.map(|addr| addr.to_string()),
        "client_port": session.client_port,
        "backend_start": session.backend_start.map(|at| at.to_rfc3339()),
        "state": session.state,
        "since": session.since.map(|at| at.to_rfc3339()),
        "held_or_waited_for_secs": session.held_or_waited_for.map(|d| d.as_secs_f64()),
        "age": session.age.map(Age::as_str),
    })
}

const COLUMNS: [&str; 9] = [
    "ROLE",
    "PID",
    "MODE",
    "FOR",
    "HOLDER ID",
    "APPLICATION",
    "CLIENT",
    "STATE",
    "BACKEND START",
];

/// The reports as text: a heading per lock, then its holders and waiters as rows of one table
/// whose columns line up across all locks.
pub(crate) fn table(reports: &[LockReport], filtered: bool) -> String {
    if reports.is_empty() {
        return if filtered {
            "no advisory lock held or awaited by a matching session\n".to_owned()
        } else {
            "no advisory locks are held or awaited in this database\n".to_owned()
        };
    }
    let rows: Vec<Vec<[String; 9]>> = reports
        .iter()
        .map(|report| {
            let holders = report.holders.iter().map(|s| row("holder".to_owned(), s));
            let waiters = (report.waiters.iter().enumerate())
                .map(|(i, s)| row(format!("waiter {}", i + 1), s));
            holders.chain(waiters).collect()
        })
        .collect();
    let mut widths = COLUMNS.map(str::len);
    for row in rows.iter().flatten() {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut line = String::from("  ");
        for (cell, width) in cells.iter().zip(widths) {
            let _ = write!(line, "{cell:<width$}  ");
        }
        format!("{}\n", line.trim_end())
    };
    let mut out = String::new();
    for (i, (report, rows)) in reports.iter().zip(&rows).enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let _ = writeln!(out, "{}", heading(report));
        if rows.is_empty() {
            out.push_str(if filtered {
                "  free of matching sessions\n"
            } else {
                "  free: no holders, no waiters\n"
            });
            continue;
        }
        out.push_str(&line(&COLUMNS));
        for row in rows {
            out.push_str(&line(&row.each_ref().map(String::as_str)));
        }
    }
    out
}

pub(crate) fn heading(report: &LockReport) -> String {
    let key = report.key.as_ref().map_or_else(
        || "unknown".to_owned(),
        |key| format!("{:?}", key.to_string()),
    );
    match report.target {
        LockTarget::IntPair(a, b) => format!("lock pair ({a}, {b}) (objsubid 2), key {key}"),
        _ => format!(
            "lock {} (classid {}, objid {}), key {key}",
            report.lock_id, report.classid, report.objid
        ),
    }
}

pub(crate) fn row(role: String, session: &Session) -> [String; 9] {
    let or_dash = |value: Option<String>| value.unwrap_or_else(|| "-".to_owned());
    let client = match (session.client_addr, session.client_port) {
        (Some(addr), Some(port)) => Some(std::net::SocketAddr::new(addr, port).to_string()),
        (Some(addr), None) => Some(addr.to_string()),
        (None, _) => None,
    };
    [
        role,
        or_dash(session.pid.map(|pid| pid.to_string())),
        session.mode.as_str().to_owned(),
        or_dash(
            session
                .held_or_waited_for
                .map(|age| for_how_long(age, session.age)),
        ),
        or_dash(session.holder_id.clone()),
        or_dash(session.application_name.clone()),
        or_dash(client),
        or_dash(session.state.clone()),
        or_dash(session.backend_start.map(timestamp)),
    ]
}

/// A duration as the FOR column shows it: `>=` before a lower bound. (ASCII, like the rest of
/// the table, so it survives any terminal, `grep` and `cut`.)
pub(crate) fn for_how_long(duration: Duration, age: Option<Age>) -> String {
    match age {
        Some(Age::AtLeast) => format!(">={}", human(duration)),
        _ => human(duration),
    }
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
