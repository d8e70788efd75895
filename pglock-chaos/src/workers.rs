//! The parent's worker processes: spawned, killed and restarted, stopped and continued, each
//! behind a proxy of its own (so a partition can cut off one worker), and finished at the end.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinHandle;

use crate::collect::Collector;
use crate::spec::WorkerSpec;
use pglock_testing::Proxy;

/// Every wait on a worker (its start, its exit) is bounded by this.
pub const WORKER_DEADLINE: Duration = Duration::from_secs(30);

/// The worker processes of a run.
#[derive(Debug)]
pub struct Workers {
    /// One per worker, in name order.
    pub slots: Vec<Arc<Slot>>,
    exe: PathBuf,
    collector: Arc<Collector>,
}

/// One worker: its proxy, its current process, and the lock the nemesis holds while it acts
/// on it (so a kill and a pause never interleave).
#[derive(Debug)]
pub struct Slot {
    /// Its spec (the seed changes with each restart).
    spec: std::sync::Mutex<WorkerSpec>,
    /// The worker's name.
    pub name: String,
    /// The worker's road to the lock server.
    pub proxy: Proxy,
    /// Held by the nemesis while it acts on this worker.
    pub busy: Arc<Mutex<()>>,
    running: Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Running {
    child: Child,
    pid: Pid,
    stdin: Option<ChildStdin>,
    reader: JoinHandle<()>,
}

impl Workers {
    /// Worker slots for `specs`, each behind its own `proxy`; nothing is spawned yet.
    pub fn new(
        exe: PathBuf,
        specs: Vec<(WorkerSpec, Proxy)>,
        collector: Arc<Collector>,
    ) -> Workers {
        let slots = specs
            .into_iter()
            .map(|(spec, proxy)| {
                Arc::new(Slot {
                    name: spec.name.clone(),
                    spec: std::sync::Mutex::new(spec),
                    proxy,
                    busy: Arc::default(),
                    running: Mutex::new(None),
                })
            })
            .collect();
        Workers {
            slots,
            exe,
            collector,
        }
    }

    /// Starts every worker and waits until each is ready.
    ///
    /// # Errors
    ///
    /// When one does not start, or is not ready in time.
    pub async fn start_all(&self) -> Result<(), String> {
        for slot in &self.slots {
            self.start(slot).await?;
        }
        Ok(())
    }

    /// Starts the worker of `slot` and waits until it is ready.
    ///
    /// # Errors
    ///
    /// When it does not start, or is not ready in time.
    pub async fn start(&self, slot: &Slot) -> Result<(), String> {
        let spec = slot.spec.lock().expect("spec").clone();
        let mut child = Command::new(&self.exe)
            .args(spec.to_args())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|err| format!("spawn {}: {err}", spec.name))?;
        let pid = child
            .id()
            .and_then(|id| Pid::from_raw(id as i32))
            .ok_or("no pid")?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (ready, is_ready) = oneshot::channel();
        let reader = tokio::spawn(read(stdout, ready, self.collector.clone()));
        *slot.running.lock().await = Some(Running {
            stdin: child.stdin.take(),
            child,
            pid,
            reader,
        });
        match tokio::time::timeout(WORKER_DEADLINE, is_ready).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(format!("worker {} was not ready in time", spec.name)),
        }
    }

    /// Kills the worker with SIGKILL and waits until it is gone (its reports read).
    pub async fn kill(&self, slot: &Slot) {
        let running = slot.running.lock().await.take();
        if let Some(mut running) = running {
            let _ = kill_process(running.pid, Signal::KILL);
            let _ = tokio::time::timeout(WORKER_DEADLINE, &mut running.reader).await;
            let _ = tokio::time::timeout(WORKER_DEADLINE, running.child.wait()).await;
            self.collector.orphan(&slot.name, "killed (kill -9)");
        }
    }

    /// Restarts a killed worker with a new seed.
    ///
    /// # Errors
    ///
    /// As for [`start`](Self::start).
    pub async fn restart(&self, slot: &Slot) -> Result<(), String> {
        {
            let mut spec = slot.spec.lock().expect("spec");
            spec.seed = crate::rng::Rng::new(spec.seed).next_u64();
        }
        self.start(slot).await
    }

    /// Sends `signal` to the worker (SIGSTOP, SIGCONT).
    pub async fn signal(&self, slot: &Slot, signal: Signal) {
        if let Some(running) = &*slot.running.lock().await {
            let _ = kill_process(running.pid, signal);
        }
    }

    /// Asks every worker to finish (closes its stdin), waits for each within the deadline,
    /// and kills the ones that do not end. Returns the names of those that did not end.
    pub async fn finish(&self) -> Vec<String> {
        let mut running = Vec::new();
        for slot in &self.slots {
            if let Some(mut r) = slot.running.lock().await.take() {
                let _ = kill_process(r.pid, Signal::CONT);
                drop(r.stdin.take());
                running.push((slot.name.clone(), r));
            }
        }
        let mut stuck = Vec::new();
        for (name, mut r) in running {
            if tokio::time::timeout(WORKER_DEADLINE, &mut r.reader)
                .await
                .is_err()
            {
                stuck.push(name.clone());
                let _ = kill_process(r.pid, Signal::KILL);
            }
            match tokio::time::timeout(WORKER_DEADLINE, r.child.wait()).await {
                Ok(Ok(status)) if status.success() => {}
                Ok(Ok(status)) => self
                    .collector
                    .problem(format!("worker {name} ended with {status}")),
                _ => {}
            }
            self.collector
                .orphan(&name, "worker ended with it in flight");
        }
        stuck
    }
}

/// Follows a worker's stdout: its readiness, then its reports, until it closes.
async fn read(
    stdout: tokio::process::ChildStdout,
    ready: oneshot::Sender<()>,
    collector: Arc<Collector>,
) {
    let mut ready = Some(ready);
    let mut lines = BufReader::new(stdout).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if line == "READY" {
            if let Some(ready) = ready.take() {
                let _ = ready.send(());
            }
        } else if line != "DONE" {
            collector.report(&line);
        }
    }
}
