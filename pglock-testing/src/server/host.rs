//! What the host offers: the server binaries, the user to run them as, free ports, processes.

use std::env;
use std::fs;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;

pub(super) fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The user the server runs as when this process is root, which PostgreSQL refuses to be.
pub(super) fn server_user() -> Option<String> {
    running_as_root().then(|| env::var("PGLOCK_PG_USER").unwrap_or_else(|_| "postgres".to_owned()))
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

pub(super) fn chown_to(path: &Path, user: &str) -> io::Result<()> {
    let id = |flag: &str| -> io::Result<u32> {
        let output = Command::new("id").args([flag, user]).output()?;
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .map_err(|_| io::Error::other(format!("no user {user:?} to run PostgreSQL as")))
    };
    std::os::unix::fs::chown(path, Some(id("-u")?), Some(id("-g")?))
}

pub(super) fn find_bin_dir() -> Option<PathBuf> {
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

/// A process as `/proc/{pid}/stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ProcessInfo {
    pub(super) pid: u32,
    /// The executable's name, at most 15 bytes.
    pub(super) name: String,
    pub(super) parent: u32,
    /// Clock ticks after boot; with the pid, names the process even once the pid is reused.
    pub(super) started: u64,
}

impl ProcessInfo {
    /// The process `pid`, while it exists (and `/proc` does).
    pub(super) fn of(pid: u32) -> Option<ProcessInfo> {
        let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // `pid (name) state ppid ...`: the name may hold spaces and parentheses.
        let (head, rest) = stat.rsplit_once(") ")?;
        let name = head.split_once(" (")?.1.to_owned();
        let fields: Vec<&str> = rest.split_whitespace().collect();
        Some(ProcessInfo {
            pid,
            name,
            parent: fields.get(1)?.parse().ok()?,
            // Field 22 of the line; `rest` starts at field 3.
            started: fields.get(19)?.parse().ok()?,
        })
    }
}
