//! A server private to this process: for tests that stop, restart or reconfigure it.

use std::env;
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
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let root = env::temp_dir().join(format!(
            "pglock-pg-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mut server = TempPostgres {
            cluster: Cluster::prepare(root)?,
            watchdog: Mutex::new(None),
        };
        server.spawn_watchdog()?;
        server.cluster.init_and_start()?;
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
        *self.watchdog.lock().unwrap_or_else(|p| p.into_inner()) = Some(child);
        Ok(())
    }
}

impl Drop for TempPostgres {
    fn drop(&mut self) {
        self.cluster.stop_now();
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
        let _ = std::fs::remove_dir_all(&self.cluster.root);
    }
}
