//! A real PostgreSQL for tests and examples: `DATABASE_URL`, or a throwaway server shared by the
//! whole test run, or one private to a process.

mod cluster;
mod host;
mod run;
mod temp;

use std::env;
use std::io;
use std::sync::OnceLock;

pub(crate) use host::running_as_root;
pub use temp::TempPostgres;

/// How to get a server when neither `DATABASE_URL` nor the server binaries are available.
const HOW_TO_GET_ONE: &str = "PostgreSQL tests need a server. Either set DATABASE_URL \
    (e.g. DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres, or run \
    `docker compose up -d` in this repository), or install the PostgreSQL server binaries \
    (initdb, pg_ctl, postgres; e.g. `apt-get install postgresql`) so the tests can start a \
    throwaway server. Set PGLOCK_PG_BIN to their directory if they are not found on their own.";

/// The URL of the database the tests use: `DATABASE_URL` when set, otherwise the test run's
/// throwaway server.
///
/// The throwaway server is shared by every process of one run: the first test binary (or doc
/// test, or example) of a `cargo test` (or `cargo nextest run`) that needs it starts it, the
/// others find it, and it is stopped and deleted when the `cargo` process ends, however it
/// ends (a failure, a panic, Ctrl-C, a crash). A process with no `cargo` above it shares the
/// server with nothing, and it is removed when that process exits. Where `/proc` is missing,
/// each process starts its own, as [`shared_server`] does.
///
/// # Panics
///
/// When `DATABASE_URL` is unset and no server can be started; the message says how to get
/// one. Tests that need PostgreSQL fail rather than skip.
pub fn database_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => match run::Owner::of_this_run() {
            Some(owner) => run::url_for(&owner).unwrap_or_else(|err| cannot_start(err)),
            None => shared_server().url(),
        },
    })
}

/// A throwaway server private to this process, started on first use and shared by its tests
/// (benchmarks use it: a run-wide server would be measured alongside other processes' tests).
///
/// # Panics
///
/// When it cannot be started; the message says why and how to get a server otherwise.
pub fn shared_server() -> &'static TempPostgres {
    static SERVER: OnceLock<TempPostgres> = OnceLock::new();
    SERVER.get_or_init(|| TempPostgres::start().unwrap_or_else(|err| cannot_start(err)))
}

fn cannot_start(err: io::Error) -> ! {
    panic!("could not start a throwaway PostgreSQL: {err}\n{HOW_TO_GET_ONE}")
}
