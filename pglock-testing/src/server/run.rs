//! One server for a whole test run: started by the first process that needs it, found by the
//! others, removed when the run ends.
//!
//! A run is the nearest `cargo` (or `cargo-nextest`) process above this one, so the test
//! binaries, doc tests and examples of one `cargo test` share a server, and two `cargo test`s
//! at once each have their own. Its directory, `$TMPDIR/pglock-run-{pid}-{start time}`, holds a
//! lock file, the server's port, and the server. A watchdog process, detached from the
//! terminal and in a process group of its own, polls the run's process and, once it is gone
//! (however it ended: an exit, Ctrl-C, a crash), stops the server and deletes the directory.
//! There is no signal for the exit of a process that is not one's child, so it polls, every
//! 200 ms.

use std::fs::{self, File};
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::cluster::{self, Cluster};
use super::host::ProcessInfo;

/// Names of the processes that own a run.
const RUNNERS: [&str; 2] = ["cargo", "cargo-nextest"];

/// Stops the server and removes the run's directory once the run's process is gone.
/// Arguments: the run's pid and start time, its directory, then the command that stops the
/// server. The inner shell is left running in the background, so nobody waits for it.
const WATCHDOG: &str = r#"trap '' INT TERM HUP
pid=$1 started=$2 dir=$3
shift 3
(
  while [ "$(sed 's/.*) //' /proc/"$pid"/stat 2>/dev/null | cut -d' ' -f20)" = "$started" ]; do
    sleep 0.2
  done
  "$@"
  rm -rf "$dir"
) </dev/null >/dev/null 2>&1 &
"#;

/// The process a run belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Owner {
    pid: u32,
    started: u64,
}

impl Owner {
    /// The nearest runner above this process, or this process itself when none is (a test
    /// binary started by hand). `None` where `/proc` is missing: then each process starts its
    /// own server.
    pub(super) fn of_this_run() -> Option<Owner> {
        let me = ProcessInfo::of(std::process::id())?;
        let mut process = ProcessInfo::of(me.parent);
        while let Some(info) = process {
            if RUNNERS.contains(&info.name.as_str()) {
                return Some(Owner::from(info));
            }
            process = (info.parent > 1)
                .then(|| ProcessInfo::of(info.parent))
                .flatten();
        }
        Some(Owner::from(me))
    }

    fn dir(&self) -> PathBuf {
        std::env::temp_dir().join(format!("pglock-run-{}-{}", self.pid, self.started))
    }
}

impl From<ProcessInfo> for Owner {
    fn from(info: ProcessInfo) -> Self {
        Owner {
            pid: info.pid,
            started: info.started,
        }
    }
}

/// The URL of `owner`'s server, starting it if no process of the run has yet.
pub(super) fn url_for(owner: &Owner) -> io::Result<String> {
    let dir = owner.dir();
    fs::create_dir_all(&dir)?;
    // Held until this function returns: the others of the run wait for the port.
    let lock = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))?;
    lock.lock()?;
    let port_file = dir.join("port");
    if let Some(port) = fs::read_to_string(&port_file)
        .ok()
        .and_then(|port| port.trim().parse().ok())
        .filter(|port| answers(*port))
    {
        return Ok(cluster::url(port));
    }
    // None yet, or it died: a new one, in a directory of its own.
    let mut server = Cluster::prepare(dir.join(format!("server-{}", std::process::id())))?;
    spawn_watchdog(owner, &dir, &server)?;
    server.init_and_start()?;
    fs::write(&port_file, server.port.to_string())?;
    Ok(server.url())
}

fn answers(port: u16) -> bool {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    TcpStream::connect_timeout(&address, Duration::from_secs(2)).is_ok()
}

/// Starts the watchdog of `server`, before the server exists, so that a run interrupted while
/// the server starts is cleaned up too.
fn spawn_watchdog(owner: &Owner, dir: &Path, server: &Cluster) -> io::Result<()> {
    let status = Command::new("sh")
        .arg("-c")
        .arg(WATCHDOG)
        .arg("pglock-watchdog")
        .arg(owner.pid.to_string())
        .arg(owner.started.to_string())
        .arg(dir)
        .args(server.stop_now_command())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "the server's watchdog did not start: {status}"
        )))
    }
}
