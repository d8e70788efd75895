//! The parent's side of the history: the workers' reports, turned into records as they arrive
//! and written to the history file at once (a run that dies still leaves its history).

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::sync::Mutex;

use crate::history::{HistoryWriter, Op, Outcome, Record, now_us};

/// Collects the records of a run.
#[derive(Debug)]
pub struct Collector {
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    records: Vec<Record>,
    /// Each worker task's operations in flight, by (process, task, op): a task has at most
    /// one of each kind at a time (a section, and the acquisition inside it).
    in_flight: HashMap<(String, u32, Op), Record>,
    writer: HistoryWriter,
    problems: Vec<String>,
}

impl Collector {
    /// Collects into a new history file at `path`.
    ///
    /// # Errors
    ///
    /// When the file cannot be created.
    pub fn create(path: &Path) -> io::Result<Collector> {
        let _ = std::fs::remove_file(path);
        Ok(Collector {
            state: Mutex::new(State {
                records: Vec::new(),
                in_flight: HashMap::new(),
                writer: HistoryWriter::append(path)?,
                problems: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A worker's report line: `I task json` (invoked) or `E task json` (over). Other lines
    /// are not reports.
    pub fn report(&self, line: &str) {
        // `I task json` or `E task json`; the task is in the record too.
        let mut parts = line.splitn(3, ' ');
        let (Some(kind), Some(_task), Some(json)) = (parts.next(), parts.next(), parts.next())
        else {
            return;
        };
        let record: Record = match serde_json::from_str(json) {
            Ok(record) => record,
            Err(err) => return self.problem(format!("unreadable report {line:?}: {err}")),
        };
        let slot = (record.process.clone(), record.task, record.op);
        let mut state = self.lock();
        match kind {
            "I" => {
                state.in_flight.insert(slot, record);
            }
            "E" => {
                state.in_flight.remove(&slot);
                state.push(record);
            }
            _ => {}
        }
    }

    /// A worker's process ended: what it had in flight may or may not have happened.
    pub fn orphan(&self, process: &str, detail: &str) {
        let now = now_us();
        let mut state = self.lock();
        let slots: Vec<_> = state
            .in_flight
            .keys()
            .filter(|(p, _, _)| p == process)
            .cloned()
            .collect();
        for slot in slots {
            if let Some(mut record) = state.in_flight.remove(&slot) {
                record.end_us = now;
                record.outcome = Outcome::Info;
                record.detail = Some(detail.to_owned());
                state.push(record);
            }
        }
    }

    /// Adds a record of the parent's own (a fault, the resource's view).
    pub fn add(&self, record: Record) {
        self.lock().push(record);
    }

    /// Notes something wrong with the run itself (not with the system under test).
    pub fn problem(&self, text: String) {
        eprintln!("pglock-chaos: {text}");
        self.lock().problems.push(text);
    }

    /// The records so far, and the problems.
    pub fn snapshot(&self) -> (Vec<Record>, Vec<String>) {
        let state = self.lock();
        (state.records.clone(), state.problems.clone())
    }
}

impl State {
    fn push(&mut self, record: Record) {
        if let Err(err) = self.writer.write(&record) {
            self.problems.push(format!("history write: {err}"));
        }
        self.records.push(record);
    }
}
