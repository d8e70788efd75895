//! A child process's output, read with every wait bounded: a child that hangs or dies fails
//! the test instead of hanging it.

use std::io::{BufRead, BufReader};
use std::process::ChildStdout;
use std::sync::mpsc;
use std::time::Duration;

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
