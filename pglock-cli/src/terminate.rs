//! `pglock terminate`: ends the sessions holding a lock, after asking.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use chrono::{DateTime, Utc};
use pglock::inspect::{Inspector, LockReport, Session};
use sqlx::PgPool;
use tokio::runtime::Runtime;

use crate::holders::{heading, table};
use crate::{EXIT_DECLINED, EXIT_FREE, EXIT_RUNTIME, EXIT_USAGE, Failure, Filters, Target};

/// How long a terminated holder may take to let go of the lock before it counts as a failure.
const GONE_WITHIN: Duration = Duration::from_secs(5);

// Terminates the chosen sessions only if each still holds this lock, and is still the same
// session (pid and backend start): a pid freed and reused since the listing is left alone.
const TERMINATE: &str = "\
SELECT DISTINCT l.pid, pg_catalog.pg_terminate_backend(l.pid) AS signalled \
FROM pg_catalog.pg_locks l \
LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid \
JOIN ROWS FROM (pg_catalog.unnest($3::integer[]), \
  pg_catalog.unnest($4::timestamp with time zone[])) AS chosen(pid, backend_start) \
  ON chosen.pid OPERATOR(pg_catalog.=) l.pid \
  AND (chosen.backend_start OPERATOR(pg_catalog.=) a.backend_start \
    OR (chosen.backend_start IS NULL AND a.backend_start IS NULL)) \
WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.objsubid OPERATOR(pg_catalog.=) $5 \
  AND l.granted \
  AND l.classid OPERATOR(pg_catalog.=) $1::bigint::pg_catalog.oid \
  AND l.objid OPERATOR(pg_catalog.=) $2::bigint::pg_catalog.oid \
  AND l.database OPERATOR(pg_catalog.=) (SELECT oid FROM pg_catalog.pg_database \
    WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())";

// How many other advisory locks (of any database) the chosen sessions hold: they all end with
// their session, which a lock manager shares between many locks.
const OTHER_LOCKS: &str = "\
SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks \
WHERE locktype OPERATOR(pg_catalog.=) 'advisory' AND granted \
  AND pid OPERATOR(pg_catalog.=) ANY($3::integer[]) \
  AND NOT (classid OPERATOR(pg_catalog.=) $1::bigint::pg_catalog.oid \
    AND objid OPERATOR(pg_catalog.=) $2::bigint::pg_catalog.oid \
    AND objsubid OPERATOR(pg_catalog.=) $4)";

/// Which holders to end.
#[derive(Debug)]
pub(crate) struct TerminateArgs {
    pub(crate) target: Target,
    pub(crate) filters: Filters,
    pub(crate) pid: Option<i32>,
    pub(crate) yes: bool,
}

/// Refuses, before anything else, to run where nobody can be asked.
pub(crate) fn check_confirmable(yes: bool) -> Result<(), Failure> {
    if yes || std::io::stdin().is_terminal() {
        return Ok(());
    }
    Err(Failure(
        EXIT_USAGE,
        "refusing to terminate sessions without confirmation: stdin is not a terminal; \
         pass --yes to confirm in advance"
            .to_owned(),
    ))
}

pub(crate) fn terminate(
    runtime: &Runtime,
    pool: &PgPool,
    inspector: &Inspector,
    args: &TerminateArgs,
) -> Result<u8, Failure> {
    let report = runtime.block_on(args.target.reports(inspector))?.remove(0);
    let chosen = choose(&report, args);
    let mut err = std::io::stderr().lock();
    if chosen.is_empty() {
        let _ = writeln!(
            err,
            "{}\n  no holder matches: nothing to terminate",
            heading(&report)
        );
        return Ok(EXIT_FREE);
    }
    let mut shown = report.clone();
    shown.holders.clone_from(&chosen);
    shown.waiters.clear();
    let _ = write!(err, "{}", table(&[shown], true));
    let others = runtime.block_on(other_locks(pool, &report, &chosen))?;
    if others > 0 {
        let _ = writeln!(
            err,
            "  these sessions also hold {others} other advisory lock(s), which end with them"
        );
    }
    if !args.yes && !ask(&mut err, chosen.len(), others)? {
        let _ = writeln!(err, "pglock: nothing terminated");
        return Ok(EXIT_DECLINED);
    }
    drop(err);
    let ended = runtime.block_on(end(pool, &report, &chosen))?;
    for session in &chosen {
        let pid = session.pid.expect("chosen sessions have a pid");
        if !ended.contains(&pid) {
            eprintln!("pglock: pid {pid} no longer holds the lock; left alone");
        }
    }
    if ended.is_empty() {
        return Ok(EXIT_FREE);
    }
    runtime.block_on(gone(inspector, &args.target, &ended))?;
    for pid in ended {
        println!("terminated pid {pid}");
    }
    Ok(0)
}

/// The holders (never the waiters) that pass the filters and `--pid`; sessions without a
/// process (prepared transactions) cannot be terminated and are never chosen.
fn choose(report: &LockReport, args: &TerminateArgs) -> Vec<Session> {
    report
        .holders
        .iter()
        .filter(|s| s.pid.is_some() && args.filters.admit(s))
        .filter(|s| args.pid.is_none_or(|pid| s.pid == Some(pid)))
        .cloned()
        .collect()
}

fn ask(err: &mut impl Write, count: usize, others: i64) -> Result<bool, Failure> {
    let _ = write!(
        err,
        "Terminate {count} session(s) above, ending everything they do, \
         {others} other advisory lock(s) included? [y/N] "
    );
    let _ = err.flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure(EXIT_RUNTIME, format!("cannot read the answer: {e}")))?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes" | "YES" | "Yes"))
}

/// How many advisory locks other than this one the chosen sessions hold.
async fn other_locks(
    pool: &PgPool,
    report: &LockReport,
    chosen: &[Session],
) -> Result<i64, Failure> {
    let pids: Vec<i32> = chosen.iter().filter_map(|s| s.pid).collect();
    sqlx::query_scalar(OTHER_LOCKS)
        .bind(i64::from(report.classid))
        .bind(i64::from(report.objid))
        .bind(pids)
        .bind(report.target.objsubid())
        .fetch_one(pool)
        .await
        .map_err(|e| Failure(EXIT_RUNTIME, format!("cannot count the other locks: {e}")))
}

/// Terminates the chosen sessions that still hold the lock; returns their pids.
async fn end(pool: &PgPool, report: &LockReport, chosen: &[Session]) -> Result<Vec<i32>, Failure> {
    let pids: Vec<i32> = chosen.iter().filter_map(|s| s.pid).collect();
    let starts: Vec<Option<DateTime<Utc>>> = chosen.iter().map(|s| s.backend_start).collect();
    let rows: Vec<(i32, bool)> = sqlx::query_as(TERMINATE)
        .bind(i64::from(report.classid))
        .bind(i64::from(report.objid))
        .bind(pids)
        .bind(starts)
        .bind(report.target.objsubid())
        .fetch_all(pool)
        .await
        .map_err(|e| Failure(EXIT_RUNTIME, format!("cannot terminate: {e}")))?;
    Ok(rows
        .into_iter()
        .filter(|&(_, signalled)| signalled)
        .map(|(pid, _)| pid)
        .collect())
}

/// Waits until none of `pids` holds the lock any more.
async fn gone(inspector: &Inspector, target: &Target, pids: &[i32]) -> Result<(), Failure> {
    let deadline = tokio::time::Instant::now() + GONE_WITHIN;
    loop {
        let report = target.reports(inspector).await?.remove(0);
        let left: Vec<i32> = (report.holders.iter())
            .filter_map(|s| s.pid)
            .filter(|pid| pids.contains(pid))
            .collect();
        if left.is_empty() {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Failure(
                EXIT_RUNTIME,
                format!("pid(s) {left:?} were signalled but still hold the lock after 5s"),
            ));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
