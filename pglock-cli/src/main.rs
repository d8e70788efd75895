//! `pglock`: lock ids of keys, who holds and who waits for advisory locks, commands run under a
//! lock, and stuck holders ended.
//!
//! ```text
//! pglock id <KEY> [--json]
//! pglock holders [KEY | --id LOCK_ID] [--older-than DURATION] [--holder PATTERN] [--fencing-table NAME] [--watch[=INTERVAL]] [--json]
//! pglock run <KEY> [--timeout DURATION | --no-wait] [--shared] -- <COMMAND> [ARGS]...
//! pglock terminate <KEY | --id LOCK_ID> [--pid PID] [--holder PATTERN] [--older-than DURATION] [--fencing-table NAME] [--yes]
//! ```
//!
//! Every command that needs a database takes `--database-url`, or `DATABASE_URL`. The exit
//! statuses are listed in [`EXIT_STATUS`], printed by `--help`, and in the guide.
#![forbid(unsafe_code)]

mod holders;
mod run;
mod terminate;
mod text;

use std::process::ExitCode;
use std::str::FromStr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use pglock::inspect::{DEFAULT_APPLICATION_NAME_PREFIX, Inspector, LockReport};
use pglock::{FencingTable, LockKey};
use serde_json::json;
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::text::parse_duration;

const EXIT_RUNTIME: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_FREE: u8 = 3;
const EXIT_DECLINED: u8 = 4;
const EXIT_CONFLICT: u8 = 75;
const EXIT_LOST: u8 = 76;

const EXIT_STATUS: &str = "\
Exit status:
  0      success: holders found a held lock; run's command exited 0; terminate ended the holders
  1      runtime failure: database unreachable, query refused, termination not confirmed
  2      usage error: bad arguments; no database URL; terminate without --yes off a terminal
  3      holders: no matching lock is held (free); terminate: no matching holder
  4      terminate: declined at the prompt
  75     run: the lock is held elsewhere (--no-wait, or --timeout passed); see --conflict-exit-code
  76     run: the lock was lost while the command ran, and the command was terminated
  126    run: the command could not be executed
  127    run: the command was not found
  other  run: the command's exit status, or 128+N when signal N ended it";

/// PostgreSQL advisory locks as pglock takes them: key to lock id, who holds what, commands
/// run under a lock, and stuck holders ended.
#[derive(Debug, Parser)]
#[command(name = "pglock", version, after_help = EXIT_STATUS)]
struct Cli {
    /// The database, as a postgres:// URL. Default: the DATABASE_URL environment variable.
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// How long to keep trying to connect (500ms, 5s, ...; a bare number is seconds).
    #[arg(long, global = true, value_name = "DURATION", default_value = "5s", value_parser = parse_duration)]
    connect_timeout: Duration,
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
    /// Show who holds and who waits for advisory locks.
    ///
    /// Lists every advisory lock of the database, bigint and two-integer alike (or only the one
    /// named by KEY, --id or --pair), its holders
    /// and, under them, its waiters in the server's queue order. "for" is how long a waiter
    /// has waited, or a holder has held the lock: exact for an exclusive holder fenced with
    /// --fencing-table (the grant time its manager wrote there); otherwise how long the holder
    /// has been idle since its last statement, a lower bound shown as ">=5.0s" (a pglock lock
    /// session runs a statement for every lock it takes and releases); "-" when unknown. Exits
    /// 0 when a listed lock is held, 3 when none is.
    #[command(after_help = EXIT_STATUS)]
    Holders(HoldersCommand),
    /// Run COMMAND while holding the lock on KEY, like flock(1).
    ///
    /// Waits for the lock (as long as it takes, unless --timeout or --no-wait), runs the
    /// command with PGLOCK_KEY, PGLOCK_LOCK_ID and PGLOCK_HOLDER_ID in its environment, releases
    /// the lock when it exits, and exits with its status. If the lock is lost while the command
    /// runs (its session ended: terminated, timed out, the server restarted), the command is
    /// sent SIGTERM, then SIGKILL after --kill-after, and pglock exits with 76. SIGTERM and
    /// SIGHUP sent to pglock are passed on to the command; pglock keeps the lock until the
    /// command is gone. Ctrl-C reaches the command directly.
    #[command(after_help = EXIT_STATUS)]
    Run(run::RunArgs),
    /// End the sessions holding a lock (pg_terminate_backend), after confirmation.
    ///
    /// Lists the holders of KEY's lock that pass the filters, asks on the terminal, and
    /// terminates them; their locks are freed at once, and pglock managers among them report
    /// the lock lost. Waiters are never terminated. Without a terminal on stdin it refuses
    /// unless --yes is given. Needs superuser, pg_signal_backend, or the holders' own role.
    #[command(after_help = EXIT_STATUS)]
    Terminate(TerminateCommand),
}

/// The options of `holders`.
#[derive(Debug, Args)]
struct HoldersCommand {
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    filters: Filters,
    /// Print JSON instead of a table: one object for KEY or --id, an array otherwise; with
    /// --watch, one line of JSON per look.
    #[arg(long)]
    json: bool,
    /// Look again every INTERVAL (default 2s) until interrupted (Ctrl-C, SIGTERM); the exit
    /// status is the last look's. Write KEY before it, or --watch=INTERVAL.
    #[arg(long, value_name = "INTERVAL", num_args = 0..=1, default_missing_value = "2s", value_parser = parse_duration)]
    watch: Option<Duration>,
}

/// The options of `terminate`.
#[derive(Debug, Args)]
struct TerminateCommand {
    #[command(flatten)]
    lock: LockArgs,
    #[command(flatten)]
    filters: Filters,
    /// Only this holder's server process.
    #[arg(long, value_name = "PID")]
    pid: Option<i32>,
    /// Terminate without asking.
    #[arg(long, short = 'y')]
    yes: bool,
}

/// Which lock, or locks, and how to name them.
#[derive(Debug, Args)]
struct LockArgs {
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
    /// Only the two-integer lock A,B (pg_advisory_lock(int4, int4); objsubid 2 in pg_locks).
    #[arg(
        long = "pair",
        value_name = "A,B",
        conflicts_with_all = ["key", "lock_id"],
        // "-2,5" is no number, so `allow_negative_numbers` would read it as a flag.
        allow_hyphen_values = true,
        value_parser = parse_pair
    )]
    pair: Option<(i32, i32)>,
    /// A key to name when its lock shows up; repeat for more.
    #[arg(long = "known-key", value_name = "KEY")]
    known_keys: Vec<String>,
    /// The application_name prefix of pglock sessions, followed by their holder id.
    #[arg(long, value_name = "PREFIX", default_value = DEFAULT_APPLICATION_NAME_PREFIX)]
    prefix: String,
    /// The fencing table of the managers holding the locks (table or schema.table): the grant
    /// times of exclusive holders are read from it, for exact ages. When it is missing or not
    /// readable, ages are lower bounds (">="). holders reads pglock_fencing_tokens unless told
    /// otherwise; terminate reads a table only when given one, since a holder that never
    /// writes to it (an unfenced manager) can be shown older than it is.
    #[arg(long, value_name = "NAME", value_parser = parse_fencing_table)]
    fencing_table: Option<FencingTable>,
}

/// Which sessions to keep.
#[derive(Debug, Clone, Args)]
struct Filters {
    /// Only sessions that have held (or waited) for at least DURATION: 30s, 5m, 2h, 1d. Where
    /// the age is a lower bound (">="), the bound is compared: a session that held longer than
    /// its bound shows may be left out, one that held less never passes.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    older_than: Option<Duration>,
    /// Only sessions whose holder id (or, without one, application name) matches PATTERN;
    /// `*` matches any run of characters, `?` one.
    #[arg(long, value_name = "PATTERN")]
    holder: Option<String>,
}

impl Filters {
    fn any(&self) -> bool {
        self.older_than.is_some() || self.holder.is_some()
    }
}

/// What a report is about.
#[derive(Debug, Clone)]
enum Target {
    Key(LockKey),
    Id(i64),
    All,
}

impl Target {
    fn is_one(&self) -> bool {
        !matches!(self, Target::All)
    }

    async fn reports(&self, inspector: &Inspector) -> Result<Vec<LockReport>, Failure> {
        match self {
            Target::Key(key) => inspector.key(key).await.map(|report| vec![report]),
            Target::Id(id) => inspector.by_lock_id(*id).await.map(|report| vec![report]),
            Target::All => inspector.all().await,
        }
        .map_err(|err| Failure(EXIT_RUNTIME, err.to_string()))
    }
}

impl LockArgs {
    fn target(&self) -> Target {
        match (&self.key, self.lock_id, self.pair) {
            (Some(key), _, _) => Target::Key(LockKey::name(key.as_str())),
            (None, Some(id), _) => Target::Id(id),
            (None, None, Some((a, b))) => Target::Key(LockKey::pair(a, b)),
            (None, None, None) => Target::All,
        }
    }

    /// An inspector of the lock(s), reading the fencing table given, or `default_table` when
    /// none was.
    fn inspector(&self, pool: PgPool, default_table: Option<FencingTable>) -> Inspector {
        let inspector = Inspector::new(pool)
            .known_keys(self.key.iter().chain(&self.known_keys).cloned())
            .application_name_prefix(Some(&self.prefix));
        match self.fencing_table.clone().or(default_table) {
            Some(table) => inspector.fencing_table(table),
            None => inspector,
        }
    }
}

/// `A,B`: two 32-bit integers, the key of `pg_advisory_lock(int4, int4)`.
fn parse_pair(text: &str) -> Result<(i32, i32), String> {
    let (a, b) = text
        .split_once(',')
        .ok_or_else(|| format!("{text:?} is not a pair A,B"))?;
    let half = |part: &str| {
        part.trim()
            .parse::<i32>()
            .map_err(|err| format!("{part:?} in {text:?} is not a 32-bit integer: {err}"))
    };
    Ok((half(a)?, half(b)?))
}

fn parse_fencing_table(name: &str) -> Result<FencingTable, String> {
    FencingTable::new(name).map_err(|err| err.to_string())
}

/// An exit code and what to tell the user.
#[derive(Debug)]
struct Failure(u8, String);

fn main() -> ExitCode {
    let cli = Cli::parse();
    match execute(cli) {
        Ok(code) => ExitCode::from(code),
        Err(Failure(code, message)) => {
            eprintln!("pglock: error: {message}");
            ExitCode::from(code)
        }
    }
}

fn execute(cli: Cli) -> Result<u8, Failure> {
    let database = || Database::new(cli.database_url.clone(), cli.connect_timeout);
    match cli.command {
        Command::Id { key, json } => {
            print!("{}", id(&key, json));
            Ok(0)
        }
        Command::Holders(command) => {
            let database = database()?;
            let show = holders::Show {
                target: command.lock.target(),
                filters: command.filters,
                json: command.json,
                watch: command.watch,
            };
            runtime()?.block_on(async {
                let pool = database.connect(1).await?;
                let inspector =
                    (command.lock).inspector(pool.clone(), Some(FencingTable::default()));
                let code = holders::holders(&inspector, &show).await;
                pool.close().await;
                code
            })
        }
        Command::Run(args) => {
            let database = database()?;
            runtime()?.block_on(async { run::run(database.connect(2).await?, &args).await })
        }
        Command::Terminate(command) => {
            let target = command.lock.target();
            if !target.is_one() {
                return Err(Failure(
                    EXIT_USAGE,
                    "terminate needs the lock: KEY, --id LOCK_ID or --pair A,B".to_owned(),
                ));
            }
            terminate::check_confirmable(command.yes)?;
            let database = database()?;
            let runtime = runtime()?;
            let pool = runtime.block_on(database.connect(1))?;
            let inspector = command.lock.inspector(pool.clone(), None);
            let args = terminate::TerminateArgs {
                target,
                filters: command.filters,
                pid: command.pid,
                yes: command.yes,
            };
            let code = terminate::terminate(&runtime, &pool, &inspector, &args);
            runtime.block_on(pool.close());
            code
        }
    }
}

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

/// Where to connect, from `--database-url` or `DATABASE_URL`.
struct Database {
    options: PgConnectOptions,
    connect_timeout: Duration,
}

impl Database {
    fn new(url: Option<String>, connect_timeout: Duration) -> Result<Self, Failure> {
        let nonblank = |url: &String| !url.trim().is_empty();
        let (url, source) = match url.filter(nonblank) {
            Some(url) => (url, "--database-url"),
            None => (
                std::env::var("DATABASE_URL")
                    .ok()
                    .filter(nonblank)
                    .ok_or_else(|| {
                        Failure(
                            EXIT_USAGE,
                            "DATABASE_URL is not set and no --database-url was given: name the \
                             database whose locks to use, e.g. \
                             --database-url postgres://user@host:5432/app"
                                .to_owned(),
                        )
                    })?,
                "DATABASE_URL",
            ),
        };
        // The URL may carry a password: say what is wrong, not what it is.
        let mut options = PgConnectOptions::from_str(&url)
            .map_err(|err| Failure(EXIT_USAGE, format!("{source} is not a valid URL: {err}")))?;
        if options.get_application_name().is_none() {
            options = options.application_name("pglock-cli");
        }
        Ok(Database {
            options,
            connect_timeout,
        })
    }

    async fn connect(&self, max_connections: u32) -> Result<PgPool, Failure> {
        PgPoolOptions::new()
            .max_connections(max_connections)
            .acquire_timeout(self.connect_timeout)
            .connect_with(self.options.clone())
            .await
            .map_err(|err| {
                Failure(
                    EXIT_RUNTIME,
                    format!("cannot connect to the database: {err}"),
                )
            })
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, Failure> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|err| Failure(EXIT_RUNTIME, format!("cannot start a runtime: {err}")))
}

/// Completes on SIGINT or SIGTERM. The handlers are installed when this is called, not when
/// it is first polled, so a signal that arrives in between is not lost (nor fatal).
fn interrupted() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let streams = signal(SignalKind::interrupt())
            .and_then(|int| signal(SignalKind::terminate()).map(|term| (int, term)));
        async move {
            match streams {
                Ok((mut int, mut term)) => {
                    tokio::select! {
                        _ = int.recv() => {}
                        _ = term.recv() => {}
                    }
                }
                Err(_) => std::future::pending().await,
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}
