//! A server private to this process: for tests that stop, restart or reconfigure it.

use std::env;
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::cluster::Cluster;

/// A private PostgreSQL server in a temporary directory, on a free port of 127.0.0.1.
///
/// It is started from the installed server binaries (found through `PGLOCK_PG_BIN`,
/// `pg_config --bindir`, `/usr/lib/postgresql/*/bin` or `PATH`). When the process runs as
/// root, the server runs as the unprivileged `postgres` user (or `PGLOCK_PG_USER`), since
/// PostgreSQL refuses to run as root. It accepts the user `postgres` without a password, is
/// tuned for tests (no fsync), and is stopped and deleted when dropped, or when the process
/// exits, however it exits (a panic, a crash, Ctrl-C): a watchdog process, in a process group
/// of its own, removes it once the test process is gone.
///
/// # A primary and its standby
///
/// [`start_standby`](Self::start_standby) makes a streaming hot standby of a running server
/// (`pg_basebackup -R -X stream`), itself a `TempPostgres`. With
/// [`configure`](Self::configure) (the `ALTER SYSTEM` of a server, also usable on a standby
/// or a stopped server), [`stop_immediately`](Self::stop_immediately) (a crash) and
/// [`promote`](Self::promote), a test can play a failover from the installed binaries alone:
///
/// ```no_run
/// use pglock_testing::TempPostgres;
///
/// # fn main() -> std::io::Result<()> {
/// let primary = TempPostgres::start()?;
/// let standby = primary.start_standby()?;
/// // Cut replication: the standby stops receiving the primary's WAL.
/// standby.configure("primary_conninfo", "")?;
/// // ... write on the primary what the standby will never see ...
/// primary.stop_immediately()?; // the primary crashes
/// standby.promote()?; // and the standby takes over, on its own port
/// # Ok(()) }
/// ```
///
/// Replication is asynchronous and, like everything else here, tuned for tests (no fsync):
/// such a server survives the crash of its processes (`stop_immediately`), not of the machine.
///
/// Most tests should share the run's server through [`database_url`](super::database_url);
/// start a `TempPostgres` only to stop, restart or reconfigure it.
#[derive(Debug)]
pub struct TempPostgres {
    cluster: Cluster,
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
        let mut server = TempPostgres::empty()?;
        server.cluster.init_and_start()?;
        Ok(server)
    }

    /// Makes a streaming hot standby of this server: a base backup taken with `pg_basebackup
    /// -R -X stream` into a directory of its own, started on a free port of its own. It
    /// replays this server's WAL as it comes (asynchronous replication), answers read-only
    /// queries, and is stopped and deleted like any `TempPostgres`. `primary_conninfo` (written
    /// by `-R`) points it at this server.
    ///
    /// # Errors
    ///
    /// When this server is not running or `pg_basebackup` or `pg_ctl` fail; the error carries
    /// their output.
    pub fn start_standby(&self) -> io::Result<TempPostgres> {
        let mut standby = TempPostgres::empty()?;
        let data = standby.cluster.data_dir();
        let port = self.cluster.port.to_string();
        standby.cluster.run(
            "pg_basebackup",
            &[
                "-D",
                &data.to_string_lossy(),
                "-R",
                "-X",
                "stream",
                "-c",
                "fast",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
            ],
        )?;
        // The copied configuration names the primary's socket directory; use our own.
        standby.cluster.append_settings(&format!(
            "\n# pglock test standby\nunix_socket_directories = '{}'\n",
            standby.cluster.root.to_string_lossy().replace('\'', "''")
        ))?;
        standby.cluster.start_on_a_free_port()?;
        Ok(standby)
    }

    /// Starts a server that stays in recovery, as a standby does, but follows no primary: a
    /// new cluster, stopped cleanly and started again with a `standby.signal` file. It answers
    /// read-only queries (`pg_is_in_recovery()` is true) and needs no `pg_basebackup`, so it
    /// can be had from any server binaries of PostgreSQL 12 or later.
    ///
    /// # Errors
    ///
    /// When `initdb` or `pg_ctl` fail, or the signal file cannot be written.
    pub fn start_in_recovery() -> io::Result<TempPostgres> {
        let mut server = TempPostgres::start()?;
        server.cluster.stop()?;
        fs::write(server.cluster.data_dir().join("standby.signal"), "")?;
        server.cluster.start_on_a_free_port()?;
        Ok(server)
    }

    /// Promotes a standby to a primary (`pg_ctl promote`) and waits until it accepts writes.
    /// It starts a new WAL timeline, one above the highest it knows.
    ///
    /// # Errors
    ///
    /// When the server is not a running standby, or the promotion does not complete within
    /// 60 seconds.
    pub fn promote(&self) -> io::Result<()> {
        self.cluster.pg_ctl(&["promote", "-w", "-t", "60"])
    }

    /// Stops the server the way a crash would (`pg_ctl stop -m immediate`): every server
    /// process exits at once, without a checkpoint, so the next start runs crash recovery from
    /// the WAL. Sessions see their connections close. Data whose WAL was not yet written out
    /// (commits with `synchronous_commit = off`) is lost; [`start_again`](Self::start_again)
    /// restarts it.
    ///
    /// # Errors
    ///
    /// When `pg_ctl stop` fails (the server was not running, for instance).
    pub fn stop_immediately(&self) -> io::Result<()> {
        self.cluster
            .pg_ctl(&["stop", "-m", "immediate", "-w", "-t", "60"])
    }

    /// Sets a server parameter, as `ALTER SYSTEM SET name = 'value'` does: in
    /// `postgresql.auto.conf`, which overrides `postgresql.conf`. A running server reloads its
    /// configuration at once, so parameters that a reload changes take effect for its
    /// processes (sessions pick them up before their next statement); the others take effect
    /// at the next start. Works on a standby, and on a stopped server.
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// # let server = pglock_testing::TempPostgres::start()?;
    /// server.configure("wal_writer_delay", "10s")?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// When `name` is not a plain parameter name, or the file cannot be written, or the reload
    /// fails.
    pub fn configure(&self, name: &str, value: &str) -> io::Result<()> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("not a parameter name: {name:?}"),
            ));
        }
        let path = self.cluster.data_dir().join("postgresql.auto.conf");
        let current = fs::read_to_string(&path).unwrap_or_default();
        let mut text: String = current
            .lines()
            .filter(|line| {
                let key = line.split('=').next().unwrap_or_default().trim();
                !key.eq_ignore_ascii_case(name)
            })
            .map(|line| format!("{line}\n"))
            .collect();
        let quoted = value.replace('\\', "\\\\").replace('\'', "''");
        text.push_str(&format!("{name} = '{quoted}'\n"));
        // Rewritten in place, so the file keeps its owner (the server's user).
        fs::write(&path, text)?;
        if self.cluster.is_running() {
            self.cluster.pg_ctl(&["reload"])?;
        }
        Ok(())
    }

    /// An empty server directory with its watchdog, not yet initialised.
    fn empty() -> io::Result<TempPostgres> {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let root = env::temp_dir().join(format!(
            "pglock-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let server = TempPostgres {
            cluster: Cluster::prepare(root)?,
            watchdog: Mutex::new(None),
        };
        server.spawn_watchdog()?;
        Ok(server)
    }

    /// A URL for the `postgres` database as the `postgres` user.
    pub fn url(&self) -> String {
        self.cluster.url()
    }

    /// The TCP port the server listens on.
    pub fn port(&self) -> u16 {
        self.cluster.port
    }

    /// Stops the server (fast shutdown: sessions are terminated) and waits until it is down.
    ///
    /// # Errors
    ///
    /// When `pg_ctl stop` fails.
    pub fn stop(&self) -> io::Result<()> {
        self.cluster.stop()
    }

    /// Starts the server again after [`stop`](Self::stop), on the same port, and waits until
    /// it accepts connections.
    ///
    /// # Errors
    ///
    /// When `pg_ctl start` fails; the error carries the server log's tail.
    pub fn start_again(&self) -> io::Result<()> {
        self.cluster.start()
    }

    /// Starts a process that waits for our end of a pipe to close (which happens when this
    /// process exits, even on a crash) and then stops the server and deletes its directory.
    /// It ignores the terminal's signals and has a process group of its own, so a Ctrl-C that
    /// ends the tests does not end it before it has cleaned up.
    fn spawn_watchdog(&self) -> io::Result<()> {
        let script = r#"trap '' INT TERM HUP; cat >/dev/null; "$0" -D "$1" stop -m immediate >/dev/null 2>&1; rm -rf "$2""#;
        let child = self
            .cluster
            .command(Path::new("sh"))
            .arg("-c")
            .arg(script)
            .arg(self.cluster.bin("pg_ctl"))
            .arg(self.cluster.data_dir())
            .arg(&self.cluster.root)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        *crate::lock(&self.watchdog) = Some(child);
        Ok(())
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        self.cluster.stop_now();
        let watchdog = crate::lock(&self.watchdog).take();
        if let Some(mut watchdog) = watchdog {
            // Closing its stdin lets the watchdog finish the clean-up; wait so the directory is
            // gone when drop returns.
            drop(watchdog.stdin.take());
            let _ = watchdog.wait();
        }
        let _ = std::fs::remove_dir_all(&self.cluster.root);
    }
}
