//! Running the `pglock` binary as a user would, and reading what it says.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Output};
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::Duration;

/// The `pglock` binary with `args`, and no `DATABASE_URL` of the caller's.
pub fn pglock(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_pglock"));
    command.args(args).env_remove("DATABASE_URL");
    command
}

/// The binary with `args`, pointed at the test database through `DATABASE_URL`.
pub fn pglock_on_db(args: &[&str]) -> Command {
    let mut command = pglock(args);
    command.env("DATABASE_URL", super::url());
    command
}

/// Runs the binary to completion on a blocking thread.
pub async fn output(mut command: Command) -> Output {
    tokio::task::spawn_blocking(move || command.output().expect("run pglock"))
        .await
        .expect("join")
}

pub fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).expect("UTF-8 output")
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).expect("UTF-8 output")
}

/// The lines a child writes to a pipe, read on a thread of their own so that every wait for
/// one is bounded.
pub struct Lines {
    lines: Receiver<String>,
}

impl Lines {
    pub fn of(pipe: impl Read + Send + 'static) -> Lines {
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Lines { lines }
    }

    pub fn stdout(child: &mut Child) -> Lines {
        Lines::of(child.stdout.take().expect("piped stdout"))
    }

    pub fn stderr(child: &mut Child) -> Lines {
        Lines::of(child.stderr.take().expect("piped stderr"))
    }

    /// The next line, within 15 s; `None` at the end of the output.
    pub fn next(&self) -> Option<String> {
        match self.lines.recv_timeout(Duration::from_secs(15)) {
            Ok(line) => Some(line),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("no line from the child within 15 s"),
        }
    }

    /// Reads lines until one satisfies `wanted`, and returns it.
    pub fn until(&self, what: &str, wanted: impl Fn(&str) -> bool) -> String {
        loop {
            match self.next() {
                Some(line) if wanted(&line) => return line,
                Some(_) => {}
                None => panic!("the output ended before {what}"),
            }
        }
    }

    /// Everything left, until the child closes the pipe.
    pub fn rest(&self) -> Vec<String> {
        std::iter::from_fn(|| self.next()).collect()
    }
}

/// Waits for `child` to exit, within 15 s, on a blocking thread.
pub async fn exit_code(mut child: Child) -> Option<i32> {
    tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status.code();
            }
            if std::time::Instant::now() >= deadline {
                let _ = child.kill();
                panic!("pglock did not exit within 15 s");
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    })
    .await
    .expect("join")
}

/// Sends `signal` to `child`.
pub fn signal(child: &Child, signal: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_child(child), signal)
        .expect("signal the child");
}
