//! `pglock`: lock ids of keys, and who holds and who waits for advisory locks.
//!
//! ```text
//! pglock id <KEY> [--json]
//! DATABASE_URL=postgres://... pglock holders [KEY | --id LOCK_ID] [--known-key KEY]... [--json]
//! ```
//!
//! Exit status: 0 on success, 1 on a runtime failure (the database is unreachable or refused
//! the query), 2 on a usage error (bad arguments, `DATABASE_URL` unset or not a URL).
#![forbid(unsafe_code)]

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{Parser, Subcommand};
use pglock::inspect::{Inspector, LockReport, Session};
use serde_json::{Value, json};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

const EXIT_RUNTIME: u8 = 1;
const EXIT_USAGE: u8 = 2;

/// PostgreSQL advisory locks as pglock takes them: key to lock id, and who holds what.
#[derive(Debug, Parser)]
#[command(
    name = "pglock",
    version,
    after_help = "Exit status: 0 success, 1 runtime failure (database unreachable, query \
                  refused), 2 usage error (bad arguments, DATABASE_URL unset or invalid)."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the advisory lock id of KEY, and the classid/objid pair pg_locks shows for it.
    ///
    /// Needs no database: the id is derived from the key alone (SHA-256, as pglock::lock_id).
    Id {
        /// The lock key, exactly as the application passes it.
        key: String,
        /// Print one JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Show who holds and who waits for advisory locks in the database at DATABASE_URL.
    ///
    /// Lists every single-bigint advisory lock of the database (or only KEY's), its holders
    /// and, under them, its waiters in queue order. "for" is how long a waiter has waited
    /// (exact), or how long a holder has been idle since its last statement (a lower bound on
    /// the hold, exact for pglock's own sessions); "-" when unknown.
    Holders {
        /// Only the lock of this key.
        key: Option<String>,
        /// Only the lock with this id (as pg_locks or a log line shows it).
        #[arg(
            long = "id",
            value_name = "LOCK_ID",
            conflicts_with = "key",
            allow_negative_numbers = true
        )]
        lock_id: Option<i64>,
        /// A key to name when its lock shows up; repeat for more.
        #[arg(long = "known-key", value_name = "KEY")]
        known_keys: Vec<String>,
        /// The application_name prefix of pglock sessions, followed by their holder id.
        #[arg(long, value_name = "PREFIX", default_value = pglock::inspect::DEFAULT_APPLICATION_NAME_PREFIX)]
        prefix: String,
        /// Print JSON instead of a table: one object for KEY or --id, an array otherwise.
        #[arg(long)]
        json: bool,
        /// How long to keep trying to connect before giving up.
        #[arg(long, value_name = "SECONDS", default_value_t = 5.0)]
        connect_timeout: f64,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Id { key, json } => Ok(id(&key, json)),
        Command::Holders {
            key,
            lock_id,
            known_keys,
            prefix,
            json,
            connect_timeout,
        } => Duration::try_from_secs_f64(connect_timeout)
            .map_err(|_| {
                Failure(
                    EXIT_USAGE,
                    "--connect-timeout must be a number of seconds".into(),
                )
            })
            .and_then(|timeout| holders(key, lock_id, known_keys, &prefix, json, timeout)),
    };
    match result.and_then(|output| {
        std::io::stdout()
            .write_all(output.as_bytes())
            .map_err(|err| Failure(EXIT_RUNTIME, format!("cannot write the output: {err}")))
    }) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure(code, message)) => {
            eprintln!("pglock: error: {message}");
            ExitCode::from(code)
        }
    }
}

/// An exit code and what to tell the user.
struct Failure(u8, String);

fn id(key: &str, json: bool) -> String {
    let lock_id = pglock::lock_id(key);
    let (classid, objid) = pglock::split_lock_id(lock_id);
    if json {
        let value = json!({ "key": key, "lock_id": lock_id, "classid": classid, "objid": objid });
        return format!("{value}\n");
    }
    format!(
        "key      {key:?}\nlock id  {lock_id}\nclassid  {classid}\nobjid    {objid}\n\
         pg_locks WHERE locktype = 'advisory' AND classid = {classid} AND objid = {objid} \
         AND objsubid = 1\n"
    )
}

fn holders(
    key: Option<String>,
    lock_id: Option<i64>,
    known_keys: Vec<String>,
    prefix: &str,
    json: bool,
    connect_timeout: Duration,
) -> Result<String, Failure> {
    let url = std::env::var("DATABASE_URL")
        .ok()
        .filter(|url| !url.trim().is_empty())
        .ok_or_else(|| {
            Failure(
                EXIT_USAGE,
                "DATABASE_URL is not set: set it to the database whose locks to show, \
                 e.g. DATABASE_URL=postgres://user@host:5432/app pglock holders"
                    .to_owned(),
            )
        })?;
    let mut options = PgConnectOptions::from_str(&url).map_err(|err| {
        // The URL may carry a password: say what is wrong, not what it is.
        Failure(
            EXIT_USAGE,
            format!("DATABASE_URL is not a valid URL: {err}"),
        )
    })?;
    if options.get_application_name().is_none() {
        options = options.application_name("pglock-cli");
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Failure(EXIT_RUNTIME, format!("cannot start a runtime: {err}")))?;
    let reports = runtime.block_on(async {
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(connect_timeout)
            .connect_with(options)
            .await
            .map_err(|err| {
                Failure(
                    EXIT_RUNTIME,
                    format!("cannot connect to DATABASE_URL: {err}"),
                )
            })?;
        let inspector = Inspector::new(pool.clone())
            .known_keys(key.iter().cloned().chain(known_keys))
            .application_name_prefix(Some(prefix));
        let reports = match (&key, lock_id) {
            (Some(key), _) => inspector.key(key).await.map(|report| vec![report]),
            (None, Some(lock_id)) => inspector.by_lock_id(lock_id).await.map(|r| vec![r]),
            (None, None) => inspector.all().await,
        };
        pool.close().await;
        reports.map_err(|err| Failure(EXIT_RUNTIME, err.to_string()))
    })?;
    let one = key.is_some() || lock_id.is_some();
    Ok(match (json, one) {
        (true, true) => format!("{}\n", report_json(&reports[0])),
        (true, false) => format!(
            "{}\n",
            Value::Array(reports.iter().map(report_json).collect())
        ),
        (false, _) => table(&reports),
    })
}

fn report_json(report: &LockReport) -> Value {
    json!({
        "lock_id": report.lock_id,
        "classid": report.classid,
        "objid": report.objid,
        "key": report.key,
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
fn table(reports: &[LockReport]) -> String {
    if reports.is_empty() {
        return "no advisory locks are held or awaited in this database\n".to_owned();
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
        let key = report
            .key
            .as_ref()
            .map_or_else(|| "unknown".to_owned(), |key| format!("{key:?}"));
        let _ = writeln!(
            out,
            "lock {} (classid {}, objid {}), key {key}",
            report.lock_id, report.classid, report.objid
        );
        if rows.is_empty() {
            out.push_str("  free: no holders, no waiters\n");
            continue;
        }
        out.push_str(&line(&COLUMNS));
        for row in rows {
            out.push_str(&line(&row.each_ref().map(String::as_str)));
        }
    }
    out
}

fn row(role: String, session: &Session) -> [String; 9] {
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
        or_dash(session.held_or_waited_for.map(human)),
        or_dash(session.holder_id.clone()),
        or_dash(session.application_name.clone()),
        or_dash(client),
        or_dash(session.state.clone()),
        or_dash(session.backend_start.map(timestamp)),
    ]
}

/// A duration as a person reads it: `850ms`, `12.3s`, `4m05s`, `3h04m`, `2d03h`.
fn human(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        1..60 => format!("{secs}.{}s", duration.subsec_millis() / 100),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{:02}h", secs / 86400, secs % 86400 / 3600),
    }
}

fn timestamp(at: DateTime<Utc>) -> String {
    at.format("%Y-%m-%d %H:%M:%S UTC").to_string()
}
