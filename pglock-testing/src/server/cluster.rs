//! One PostgreSQL cluster in a directory of its own: create, start, stop. Who removes it is
//! decided by its owner ([`TempPostgres`](super::TempPostgres) or the run's shared server).

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::host::{chown_to, find_bin_dir, free_port, server_user};

#[derive(Debug)]
pub(super) struct Cluster {
    pub(super) root: PathBuf,
    bin: PathBuf,
    pub(super) port: u16,
    run_as: Option<String>,
}

impl Cluster {
    /// An empty directory `root` for a cluster, owned by the user the server will run as.
    pub(super) fn prepare(root: PathBuf) -> io::Result<Cluster> {
        let bin = find_bin_dir().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no PostgreSQL server binaries found",
            )
        })?;
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root)?;
        let cluster = Cluster {
            root,
            bin,
            port: 0,
            run_as: server_user(),
        };
        if let Some(user) = &cluster.run_as {
            chown_to(&cluster.root, user)?;
        }
        Ok(cluster)
    }

    /// Creates the cluster and starts it on a free port.
    pub(super) fn init_and_start(&mut self) -> io::Result<()> {
        self.init()?;
        self.start_on_a_free_port()
    }

    pub(super) fn start_on_a_free_port(&mut self) -> io::Result<()> {
        let mut last_error = None;
        for _ in 0..5 {
            self.port = free_port()?;
            match self.start() {
                Ok(()) => return Ok(()),
                // Someone may have taken the port between our probe and the server's bind.
                Err(err) => last_error = Some(err),
            }
        }
        Err(last_error.expect("at least one attempt was made"))
    }

    pub(super) fn url(&self) -> String {
        url(self.port)
    }

    pub(super) fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    /// The command that stops the server at once, as the user it runs as.
    pub(super) fn stop_now_command(&self) -> Vec<String> {
        let mut command: Vec<String> = match &self.run_as {
            Some(user) => vec!["runuser".into(), "-u".into(), user.clone(), "--".into()],
            None => Vec::new(),
        };
        command.push(self.bin.join("pg_ctl").to_string_lossy().into_owned());
        let data = self.data_dir().to_string_lossy().into_owned();
        command.extend([
            "-D".into(),
            data,
            "stop".into(),
            "-m".into(),
            "immediate".into(),
        ]);
        command
    }

    pub(super) fn stop(&self) -> io::Result<()> {
        self.pg_ctl(&["stop", "-m", "fast", "-w", "-t", "60"])
    }

    pub(super) fn stop_now(&self) {
        let _ = self.pg_ctl(&["stop", "-m", "immediate", "-w"]);
    }

    pub(super) fn start(&self) -> io::Result<()> {
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

    pub(super) fn is_running(&self) -> bool {
        self.command(&self.bin.join("pg_ctl"))
            .args(["status", "-D"])
            .arg(self.data_dir())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
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
        self.append_settings(&settings)
    }

    pub(super) fn append_settings(&self, settings: &str) -> io::Result<()> {
        fs::OpenOptions::new()
            .append(true)
            .open(self.data_dir().join("postgresql.conf"))?
            .write_all(settings.as_bytes())
    }

    pub(super) fn pg_ctl(&self, args: &[&str]) -> io::Result<()> {
        let data = self.data_dir();
        let mut all = vec!["-D", data.to_str().unwrap_or_default()];
        all.extend_from_slice(args);
        self.run("pg_ctl", &all)
    }

    pub(super) fn command(&self, program: &Path) -> Command {
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.args(["-u", user, "--"]).arg(program);
                command
            }
            None => Command::new(program),
        }
    }

    pub(super) fn bin(&self, program: &str) -> PathBuf {
        self.bin.join(program)
    }

    pub(super) fn run(&self, program: &str, args: &[&str]) -> io::Result<()> {
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
}

/// The URL of the `postgres` database as the `postgres` user on `port`.
pub(super) fn url(port: u16) -> String {
    format!("postgres://postgres@127.0.0.1:{port}/postgres")
}
