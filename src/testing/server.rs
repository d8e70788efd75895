//! A throwaway PostgreSQL server for tests and examples.

use std::env;
use std::fs;
use std::io::{self, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// How to get a server when neither `DATABASE_URL` nor the server binaries are available.
const HOW_TO_GET_ONE: &str = "PostgreSQL tests need a server. Either set DATABASE_URL \
    (e.g. DATABASE_URL=postgres://postgres:postgres@127.0.0.1:5432/postgres, or run \
    `docker compose up -d` in this repository), or install the PostgreSQL server binaries \
    (initdb, pg_ctl, postgres; e.g. `apt-get install postgresql`) so the tests can start a \
    throwaway server. Set PGLOCK_PG_BIN to their directory if they are not found on their own.";

/// The URL of the database the tests use: `DATABASE_URL` when set, otherwise a throwaway
/// server started on first use and removed when the process exits.
///
/// # Panics
///
/// When `DATABASE_URL` is unset and no server can be started; the message says how to get
/// one. Tests that need PostgreSQL fail rather than skip.
pub fn database_url() -> &'static str {
    static URL: OnceLock<String> = OnceLock::new();
    URL.get_or_init(|| match env::var("DATABASE_URL") {
        Ok(url) if !url.trim().is_empty() => url,
        _ => shared_server().url(),
    })
}

/// The process-wide throwaway server (started on first use).
///
/// # Panics
///
/// When it cannot be started; the message says why and how to get a server otherwise.
pub fn shared_server() -> &'static TempPostgres {
    static SERVER: OnceLock<TempPostgres> = OnceLock::new();
    SERVER.get_or_init(|| {
        TempPostgres::start().unwrap_or_else(|err| {
            panic!("could not start a throwaway PostgreSQL: {err}\n{HOW_TO_GET_ONE}")
        })
    })
}

/// A private PostgreSQL server in a temporary directory, on a free port of 127.0.0.1.
///
/// It is started from the installed server binaries (found through `PGLOCK_PG_BIN`,
/// `pg_config --bindir`, `/usr/lib/postgresql/*/bin` or `PATH`). When the process runs as
/// root, the server runs as the unprivileged `postgres` user (or `PGLOCK_PG_USER`), since
/// PostgreSQL refuses to run as root. It accepts the user `postgres` without a password, is
/// tuned for tests (no fsync), and is stopped and deleted when dropped, or when the process
/// exits, however it exits: a watchdog process removes it once the test process is gone.
#[derive(Debug)]
pub struct TempPostgres {
    root: PathBuf,
    bin: PathBuf,
    port: u16,
    run_as: Option<String>,
    watchdog: Mutex<Option<Child>>,
}

impl TempPostgres {
    /// Creates, starts and waits for a new server.
    ///
    /// # Errors
    ///
    /// When the binaries cannot be found or `initdb` or `pg_ctl` fail; the error carries their
    /// output.
    pub fn start() -> io::Result<TempPostgres> {
        let bin = find_bin_dir().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no PostgreSQL server binaries found",
            )
        })?;
        let run_as = if running_as_root() {
            Some(env::var("PGLOCK_PG_USER").unwrap_or_else(|_| "postgres".to_owned()))
        } else {
            None
        };
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let root = env::temp_dir().join(format!(
            "pglock-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root)?;
        let mut server = TempPostgres {
            root,
            bin,
            port: 0,
            run_as,
            watchdog: Mutex::new(None),
        };
        if let Some(user) = &server.run_as {
            chown_to(&server.root, user)?;
        }
        server.spawn_watchdog()?;
        server.init()?;
        let mut last_error = None;
        for _ in 0..5 {
            server.port = free_port()?;
            match server.start_again() {
                Ok(()) => return Ok(server),
                // Someone may have taken the port between our probe and the server's bind.
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.expect("at least one attempt was made"))
    }

    /// A URL for the `postgres` database as the `postgres` user.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops the server (fast shutdown: sessions are terminated) and waits until it is down.
    ///
    /// # Errors
    ///
    /// When `pg_ctl stop` fails.
    pub fn stop(&self) -> io::Result<()> {
        self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port, and waits until
    /// it accepts connections.
    ///
    /// # Errors
    ///
    /// When `pg_ctl start` fails; the error carries the server log's tail.
    pub fn start_again(&self) -> io::Result<()> {
        let options = format!("-p {}", self.port);
        let log = self.root.join("server.log");
        let log = log.to_string_lossy();
        self.pg_ctl(&["start", "-w", "-t", "60", "-l", &log, "-o", &options])
            .map_err(|err| {
                let tail = fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
                let tail: String = tail.lines().rev().take(20).collect::<Vec<_>>().join("\n");
                io::Error::new(
                    err.kind(),
                    format!("{err}; server log (last lines, newest first):\n{tail}"),
                )
            })
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn init(&self) -> io::Result<()> {
        let data = self.data_dir();
        let data = data.to_string_lossy();
        self.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "-N",
            ],
        )?;
        let socket_dir = self.root.to_string_lossy().replace('\'', "''");
        let settings = format!(
            "\n# pglock test server\nlisten_addresses = '127.0.0.1'\n\
             unix_socket_directories = '{socket_dir}'\nmax_connections = 300\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             shared_buffers = 32MB\n"
        );
        fs::OpenOptions::new()
            .append(true)
            .open(self.data_dir().join("postgresql.conf"))?
            .write_all(settings.as_bytes())
    }

    fn pg_ctl(&self, args: &[&str]) -> io::Result<()> {
        let data = self.data_dir();
        let mut all = vec!["-D", data.to_str().unwrap_or_default()];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    fn command(&self, program: &Path) -> Command {
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    fn run(&self, program: &str, args: &[&str]) -> io::Result<()> {
        let output = self
            .command(&self.bin.join(program))
            .args(args)
            .current_dir(&self.root)
            .stdin(Stdio::null())
            .output()?;
        if output.status.success() {
            return Ok(());
        }
        Err(io::Error::other(format!(
            "{program} {} failed ({}): {}{}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )))
    }

    /// Starts a process that waits for our end of a pipe to close (which happens when this
    /// process exits, even on a crash) and then stops the server and deletes its directory.
    fn spawn_watchdog(&self) -> io::Result<()> {
        let script =
            r#"cat >/dev/null; "$0" -D "$1" stop -m immediate >/dev/null 2>&1; rm -rf "$2""#;
        let child = self
            .command(Path::new("sh"))
            .arg("-c")
            .arg(script)
            .arg(self.bin.join("pg_ctl"))
            .arg(self.data_dir())
            .arg(&self.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
        let watchdog = self
            .watchdog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(mut watchdog) = watchdog {
            // Closing its stdin lets the watchdog finish the clean-up; wait so the directory is
            // gone when drop returns.
            drop(watchdog.stdin.take());
            let _ = watchdog.wait();
        }
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub(crate) fn running_as_root() -> bool {
    // The effective uid is the second field of the `Uid:` line.
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("Uid:"))
                .and_then(|line| line.split_whitespace().nth(2).map(|uid| uid == "0"))
        })
        .unwrap_or(false)
}

fn chown_to(path: &Path, user: &str) -> io::Result<()> {
    let id = |flag: &str| -> io::Result<u32> {
        let output = Command::new("id").args([flag, user]).output()?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("no user {user:?} to run PostgreSQL as")))
    };
    std::os::unix::fs::chown(path, Some(id("-u")?), Some(id("-g")?))
}

fn find_bin_dir() -> Option<PathBuf> {
    let has_server = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(dir) = env::var_os("PGLOCK_PG_BIN") {
        return Some(PathBuf::from(dir)).filter(|dir| has_server(dir));
    }
    if let Ok(output) = Command::new("pg_config").arg("--bindir").output() {
        let dir = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
        if output.status.success() && has_server(&dir) {
            return Some(dir);
        }
    }
    // Debian and Ubuntu keep each major version's server outside PATH.
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, dir)| has_server(dir))
        .collect();
    versions.sort();
    if let Some((_, dir)) = versions.pop() {
        return Some(dir);
    }
    let path = env::var_os("PATH").unwrap_or_default();
    env::split_paths(&path)
        .chain(["/usr/local/pgsql/bin".into(), "/opt/homebrew/bin".into()])
        .find(|dir| has_server(dir))
}
