//! The history of a chaos run: one [`Record`] per line of JSON.
//!
//! Times are microseconds of `CLOCK_MONOTONIC`, which every process on one machine shares, so
//! the records of all workers and of the nemesis can be compared directly ([`now_us`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use serde::{Deserialize, Serialize};

/// Microseconds of the machine's monotonic clock, comparable across its processes.
pub fn now_us() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000
}

/// One operation of a worker, or one fault of the nemesis, from its start to its end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Who did it: `"w1"`, `"w2"`, ... for worker processes, `"nemesis"` for faults, `"resource"`
    /// for what the fenced resource itself saw (read back after the run).
    pub process: String,
    /// The task within the process (0 for the nemesis and the resource).
    pub task: u32,
    /// What was done.
    pub op: Op,
    /// The lock key (or, for a fault, what it was aimed at: a worker, a backend, `"server"`).
    pub key: String,
    /// When the operation was invoked.
    pub start_us: u64,
    /// When its outcome was known (for a fault: when it healed).
    pub end_us: u64,
    /// How it ended.
    pub outcome: Outcome,
    /// The fencing token the operation ran under, if it got one.
    pub token: Option<i64>,
    /// An operation's value: the counter read back, the value written, the scheduled window.
    pub value: Option<i64>,
    /// Free text: an error, the kind of fault.
    pub detail: Option<String>,
    /// The lock holder the operation belongs to: a worker's task (`"w1-4242/0"`: worker, pid,
    /// task). On the resource's records, the holder that made the write.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// The resource's own order of its writes (the `resource_*` records), per run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
}

/// The kinds of operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// A critical section: the exclusive lock taken, its start and end written through a
    /// fenced resource, the lock released.
    Section,
    /// A reader's section: the lock taken in shared mode, held a while, released.
    Read,
    /// A fenced read-modify-write increment of a counter (`value`: the value written).
    Increment,
    /// A leader's term, appending to a fenced log.
    Term,
    /// One run of a scheduled job (`value`: its window's start, in the job's own units).
    Job,
    /// A fault injected by the nemesis (`detail`: its kind).
    Fault,
    /// The resource's own view of a section start (`token`, `start_us` = when it accepted it).
    ResourceStart,
    /// The resource's own view of a section end.
    ResourceEnd,
    /// The resource's own view of a fenced log append.
    ResourceAppend,
    /// The final value of a counter, read after the run (`value`).
    CounterFinal,
    /// A task's exclusive acquisition of a lock, from the call to its return (`ok`: granted,
    /// with its `token`; `info`: an error or a timeout, so it may have been granted).
    Acquire,
    /// A task's shared acquisition, as for [`Op::Acquire`].
    AcquireShared,
    /// The end of a granted acquisition (same `holder`, `key` and `token`), from the release's
    /// call to its return: `ok` when pglock confirmed the release (the lock was held until
    /// then), `fail` when it said the lock had been lost, `info` when the release could not be
    /// confirmed.
    Release,
}

/// How an operation ended, as Jepsen records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// It happened (for a write: the resource accepted it).
    Ok,
    /// It certainly did not happen (for a write: the resource refused it).
    Fail,
    /// Unknown: the worker cannot tell (a broken connection mid-write, a killed process).
    Info,
}

impl Op {
    /// Every kind of operation, in the order reports list them.
    pub const ALL: [Op; 13] = [
        Op::Section,
        Op::Read,
        Op::Increment,
        Op::Term,
        Op::Job,
        Op::Fault,
        Op::ResourceStart,
        Op::ResourceEnd,
        Op::ResourceAppend,
        Op::CounterFinal,
        Op::Acquire,
        Op::AcquireShared,
        Op::Release,
    ];

    /// The name the history spells it with (`"resource_start"`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Section => "section",
            Op::Read => "read",
            Op::Increment => "increment",
            Op::Term => "term",
            Op::Job => "job",
            Op::Fault => "fault",
            Op::ResourceStart => "resource_start",
            Op::ResourceEnd => "resource_end",
            Op::ResourceAppend => "resource_append",
            Op::CounterFinal => "counter_final",
            Op::Acquire => "acquire",
            Op::AcquireShared => "acquire_shared",
            Op::Release => "release",
        }
    }

    /// Whether it is a worker's unit of progress: what liveness waits for after a fault.
    pub fn is_progress(self) -> bool {
        matches!(
            self,
            Op::Section | Op::Read | Op::Increment | Op::Term | Op::Job
        )
    }

    /// Whether it is a lock's acquisition or release, which the model checker reads.
    pub fn is_lock(self) -> bool {
        matches!(self, Op::Acquire | Op::AcquireShared | Op::Release)
    }
}

impl Outcome {
    /// Every outcome, in the order reports list them.
    pub const ALL: [Outcome; 3] = [Outcome::Ok, Outcome::Fail, Outcome::Info];

    /// The name the history spells it with (`"ok"`).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Fail => "fail",
            Outcome::Info => "info",
        }
    }
}

/// Reads a history file of JSON lines (see [`parse_jsonl`] for what it tolerates).
pub fn read_jsonl(path: impl AsRef<Path>) -> io::Result<Vec<Record>> {
    let path = path.as_ref();
    // Bytes, not a string: a torn line may end inside a character.
    let bytes = std::fs::read(path)?;
    parse_lines(&bytes).map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// Reads every `*.jsonl` file of a directory, in name order, as one history (a run writes a
/// file per worker process, one for the nemesis and one for the resource's read-back).
pub fn read_jsonl_dir(dir: impl AsRef<Path>) -> io::Result<Vec<Record>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "jsonl") && path.is_file() {
            paths.push(path);
        }
    }
    paths.sort();
    let mut records = Vec::new();
    for path in paths {
        records.extend(read_jsonl(path)?);
    }
    Ok(records)
}

/// Parses a history of JSON lines, one [`Record`] per line.
///
/// Blank lines are skipped, and so are torn lines: the start of a JSON object cut short, which
/// is what a process killed in the middle of writing a line leaves (see [`HistoryWriter`]).
/// The operation such a line described stays unknown, as if the line had never been begun.
/// Any other line that does not parse is an error ([`io::ErrorKind::InvalidData`]) naming its
/// line number.
pub fn parse_jsonl(text: &str) -> io::Result<Vec<Record>> {
    parse_lines(text.as_bytes())
}

fn parse_lines(bytes: &[u8]) -> io::Result<Vec<Record>> {
    let mut records = Vec::new();
    for (i, line) in bytes.split(|&b| b == b'\n').enumerate() {
        if line.trim_ascii().is_empty() {
            continue;
        }
        match serde_json::from_slice(line) {
            Ok(record) => records.push(record),
            // Only a line cut short ends before its object does; garbage is an error.
            Err(e) if e.is_eof() => {}
            Err(e) => {
                let message = format!("line {}: {e}", i + 1);
                return Err(io::Error::new(io::ErrorKind::InvalidData, message));
            }
        }
    }
    Ok(records)
}

/// Writes a whole history as JSON lines, replacing the file (for the resource's read-back).
pub fn write_jsonl(path: impl AsRef<Path>, records: &[Record]) -> io::Result<()> {
    let mut text = Vec::new();
    for record in records {
        serde_json::to_writer(&mut text, record)?;
        text.push(b'\n');
    }
    std::fs::write(path, text)
}

/// Appends records to a history file, one JSON line per record, as they happen.
///
/// Each line goes to the kernel in one `write` as soon as it is recorded (no user-space
/// buffer), so a process killed with `SIGKILL` loses at most the operation it was doing (to
/// keep even that one, record it as [`Outcome::Info`] when invoking it: the checker lets a
/// later record of the same operation settle it). The file is opened for appending: several
/// processes may share one file, as `O_APPEND` writes of a line do not interleave, and a
/// process restarted after a kill may append to the file it had. `&self` methods with an internal mutex let the tasks of one
/// process share a writer (in an `Arc`); the lock is held only for the write itself, a short
/// blocking call that async tasks may make directly.
///
/// ```no_run
/// use std::sync::Arc;
///
/// use pglock_chaos::history::{HistoryWriter, Op, Outcome, Record, now_us};
///
/// # fn main() -> std::io::Result<()> {
/// let history = Arc::new(HistoryWriter::append("target/chaos/run-1/w1.jsonl")?);
/// let start_us = now_us();
/// // ... a fenced increment under token 7, which wrote 42 ...
/// history.write(&Record {
///     process: "w1".to_owned(),
///     task: 0,
///     op: Op::Increment,
///     key: "counter".to_owned(),
///     start_us,
///     end_us: now_us(),
///     outcome: Outcome::Ok,
///     token: Some(7),
///     value: Some(42),
///     detail: None,
///     holder: Some("w1-4242/0".to_owned()),
///     seq: None,
/// })?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct HistoryWriter {
    path: PathBuf,
    file: Mutex<File>,
}

impl HistoryWriter {
    /// Opens `path` for appending, creating it if needed.
    ///
    /// If the file ends in a line cut short (its writer was killed mid-line), a newline
    /// closes that line first, so that the torn line stays on its own and is skipped when read
    /// ([`parse_jsonl`]) instead of running into the next record.
    pub fn append(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref().to_path_buf();
        let mut file = OpenOptions::new()
            .create(true)
            .read(true)
            .append(true)
            .open(&path)?;
        if file.metadata()?.len() > 0 {
            let mut last = [0u8];
            file.seek(SeekFrom::End(-1))?;
            file.read_exact(&mut last)?;
            if last != *b"\n" {
                file.write_all(b"\n")?;
            }
        }
        Ok(Self {
            path,
            file: Mutex::new(file),
        })
    }

    /// Appends one record as a line.
    pub fn write(&self, record: &Record) -> io::Result<()> {
        // Serialised before taking the lock, and written whole, so lines never mix.
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        self.file().write_all(&line)
    }

    /// Forces the lines written so far to disk (only needed to survive a machine crash; a
    /// killed process loses nothing the kernel already has).
    pub fn sync(&self) -> io::Result<()> {
        self.file().sync_data()
    }

    /// The file it appends to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self) -> MutexGuard<'_, File> {
        // A task that panicked while holding the lock left whole lines or none: the file is
        // still fine to write to.
        self.file.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
