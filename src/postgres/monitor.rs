//! Telling holders that their locks went with a session.
//!
//! Every session that holds locks keeps itself heard and learns of its own end (see
//! `lock_session/mod.rs`): its heartbeat fails, goes unanswered, or the session went unheard for
//! longer than the server allows. The monitor turns such an end into the loss of exactly the
//! locks that were on that session, through [`LockTable`] (what is held, and a way to declare a
//! lock lost). It has no connection of its own: the sessions' heartbeats are the probe.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::core::{LockTable, Watched};
use tokio::sync::Notify;

/// How often an idle monitor checks that its manager still exists.
const TICK: Duration = Duration::from_secs(1);

pub(crate) struct Monitor {
    /// False when the manager was built without loss detection: nothing is reported.
    enabled: bool,
    running: AtomicBool,
    /// Asks for the held locks to be looked over now: a session has ended.
    wake: Notify,
}

impl Monitor {
    /// A monitor; `enabled: false` turns it off.
    pub(crate) fn new(enabled: bool) -> Arc<Self> {
        Arc::new(Monitor {
            enabled,
            running: AtomicBool::new(false),
            wake: Notify::new(),
        })
    }

    /// Starts watching `table` unless already watching (or detection is off).
    pub(crate) fn ensure_running<T: LockTable>(self: &Arc<Self>, table: Weak<T>) {
        if !self.enabled || self.running.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(run(Arc::downgrade(self), table))),
            Err(_) => self.running.store(false, Ordering::SeqCst),
        }
    }

    /// A session has ended: the locks on it are reported lost now. Called by the session after
    /// it has recorded its end, and by a registration that finds its session already ended, so
    /// a lock registered while its session ends is not missed.
    pub(crate) fn session_ended(&self) {
        self.wake.notify_one();
    }
}

async fn run<T: LockTable>(monitor: Weak<Monitor>, table: Weak<T>) {
    // However the loop ends (the manager gone, or its runtime shutting down), a later
    // registration may start it again, on a runtime that runs.
    let _running = Running(monitor.clone());
    while let Some(this) = monitor.upgrade() {
        let woken = tokio::select! {
            () = tokio::time::sleep(TICK) => false,
            () = this.wake.notified() => true,
        };
        let Some(table) = table.upgrade() else { break };
        if woken {
            declare_ended(&*table, table.watched().await).await;
        }
    }
}

/// Declares lost the locks whose sessions ended. The server may still hold some of them for a
/// while (it has not noticed the session is gone), but the manager can neither release nor
/// confirm them, so their holders are told now.
async fn declare_ended<T: LockTable>(table: &T, watched: Vec<Watched>) {
    for lock in watched {
        table
            .declare_lost(&lock.key, lock.generation, lock.ended)
            .await;
    }
}

/// Clears the monitor's `running` flag when its loop ends.
struct Running(Weak<Monitor>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(monitor) = self.0.upgrade() {
            monitor.running.store(false, Ordering::SeqCst);
        }
    }
}
