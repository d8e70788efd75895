//! A child process's output, read with every wait bounded: a child that hangs or dies fails
//! the test instead of hanging it.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The part this process plays when a test spawned it with [`spawn_self`] and `prefix`.
///
/// Children learn their part from a command-line argument (a test-name filter that matches no
/// test), never from the environment: a variable left in the parent's environment cannot turn
/// the parent into a child.
pub fn role(prefix: &str) -> Option<String> {
    std::env::args().find_map(|arg| arg.strip_prefix(prefix).map(str::to_owned))
}

/// Spawns a copy of this test binary that runs only `test`, with `{prefix}{spec}` on its
/// command line, the test database in `DATABASE_URL`, and its output piped.
pub fn spawn_self(test: &str, prefix: &str, spec: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .arg(format!("{prefix}{spec}"))
        .env("DATABASE_URL", super::url())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a copy of the test binary")
}

/// A child process that is killed (if still running) and reaped when this is dropped, so a
/// failing test leaves no process behind.
pub struct Reaped(pub Child);

impl Reaped {
    /// Spawns this binary running only `test` as `role` with `spec` (see [`spawn_self`]), and
    /// starts reading its output.
    pub fn spawn(test: &str, role: &str, spec: &str) -> (Reaped, ChildOutput) {
        let mut child = Reaped(spawn_self(test, role, spec));
        let output = ChildOutput::read(child.0.stdout.take().expect("stdout"));
        (child, output)
    }

    /// Writes `line` to the child's standard input.
    pub fn tell(&mut self, line: &str) {
        use std::io::Write;
        let stdin = self.0.stdin.as_mut().expect("stdin");
        writeln!(stdin, "{line}")
            .and_then(|()| stdin.flush())
            .expect("write to the child");
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The next line of this process's standard input (a child's instruction from its test).
pub fn instruction() -> String {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("read stdin");
    line.trim().to_owned()
}

/// How long a test waits for the next line from a child.
pub const CHILD_BOUND: Duration = Duration::from_secs(120);

/// The lines a child writes, read on a thread of their own.
pub struct ChildOutput(mpsc::Receiver<String>);

impl ChildOutput {
    /// Starts reading `stdout`, line by line.
    pub fn read(stdout: ChildStdout) -> ChildOutput {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        ChildOutput(rx)
    }

    /// The next line that contains `marker` (the test harness may have printed
    /// "test name ... " before it on the same line); panics if the child closes its output
    /// first or stays silent for [`CHILD_BOUND`].
    pub fn until(&self, marker: &str) -> String {
        loop {
            match self.0.recv_timeout(CHILD_BOUND) {
                Ok(line) if line.contains(marker) => return line,
                Ok(_) => {}
                Err(err) => panic!("no {marker:?} from the child: {err}"),
            }
        }
    }

    /// The lines the child has written so far that were not read yet, without waiting.
    pub fn so_far(&self) -> Vec<String> {
        self.0.try_iter().collect()
    }

    /// Every line until the child closes its output; panics if it stays silent for
    /// [`CHILD_BOUND`] without closing it.
    pub fn all(&self) -> Vec<String> {
        let mut lines = Vec::new();
        loop {
            match self.0.recv_timeout(CHILD_BOUND) {
                Ok(line) => lines.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return lines,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the child went silent for {CHILD_BOUND:?}: {lines:?}")
                }
            }
        }
    }
}
