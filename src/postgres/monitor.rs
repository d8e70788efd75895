//! Lost-lock detection: one probe per interval, for all held locks at once.
//!
//! The monitor sees a manager only through [`LockTable`] (what is held, and a way to declare a
//! lock lost), and the server only through its own connection, opened with the pool's options
//! while locks are held and closed once none have been for five probe intervals.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use sqlx::postgres::PgConnectOptions;
use sqlx::{Connection, PgConnection};
use tokio::sync::Notify;
use tokio::time::{Instant, timeout};

use crate::core::{LockTable, Watched};
use crate::{LockMode, LossCause};

// Which of the given (pid, lock id, mode) triples does the server NOT show as granted? One
// round trip whatever the number of locks; the answer is the 1-based positions of the missing.
// Unless `$5` (the manager allows standbys), a server in recovery holds nothing that counts (a
// demoted primary came back as a standby): every lock is missing there.
const PROBE: &str = "SELECT h.i FROM unnest($1::int4[], $2::int8[], $3::bool[], $4::int2[]) \
     WITH ORDINALITY AS h(pid, id, shared, sub, i) \
     WHERE (pg_is_in_recovery() AND NOT $5) OR NOT EXISTS (SELECT 1 FROM pg_locks l \
        WHERE l.locktype = 'advisory' AND l.granted AND l.pid = h.pid \
        AND l.classid = (h.id >> 32)::oid AND l.objid = (h.id & 4294967295)::oid \
        AND l.objsubid = h.sub \
        AND l.mode = CASE WHEN h.shared THEN 'ShareLock' ELSE 'ExclusiveLock' END)";

/// How many probe intervals with nothing held the monitor waits before it stops and closes its
/// connection.
const IDLE_TICKS: u32 = 5;

/// How often to probe, and how long past a failed probe locks stay "unknown" before they are
/// declared lost.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Probe {
    pub(crate) interval: Duration,
    pub(crate) grace: Duration,
    /// Whether locks held on a standby count (the manager was built to allow standbys).
    pub(crate) allow_standby: bool,
}

pub(crate) struct Monitor {
    probe: Option<Probe>,
    options: PgConnectOptions,
    running: AtomicBool,
    /// Set at every registration: a lock was taken since the last probe tick, even if it was
    /// released again before the tick saw it.
    used: AtomicBool,
    /// Asks for a probe now (a session closed, so its locks may be gone).
    wake: Notify,
    /// Server sessions the manager closed, and when: the locks registered on them before then
    /// are lost even where the server still shows them.
    closed: Mutex<Vec<(i32, Instant)>>,
}

impl Monitor {
    /// A monitor connecting with `options` (renamed `name`); `probe: None` turns it off.
    pub(crate) fn new(probe: Option<Probe>, options: &PgConnectOptions, name: &str) -> Arc<Self> {
        Arc::new(Monitor {
            probe,
            options: options.clone().application_name(name),
            running: AtomicBool::new(false),
            used: AtomicBool::new(false),
            wake: Notify::new(),
            closed: Mutex::new(Vec::new()),
        })
    }

    /// Starts watching `table` unless already watching (or detection is off).
    pub(crate) fn ensure_running<T: LockTable>(self: &Arc<Self>, table: Weak<T>) {
        let Some(probe) = self.probe else { return };
        self.used.store(true, Ordering::SeqCst);
        if self.running.swap(true, Ordering::SeqCst) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn(run(Arc::downgrade(self), table, probe))),
            Err(_) => self.running.store(false, Ordering::SeqCst),
        }
    }

    /// The manager closed the server session `pid`: its locks are reported lost at the next
    /// probe, which is made now.
    pub(crate) fn session_closed(&self, pid: i32) {
        if self.probe.is_none() {
            // Detection is off: no loss is ever reported, so nothing needs remembering.
            return;
        }
        let mut closed = crate::sync::lock(&self.closed);
        closed.push((pid, Instant::now()));
        drop(closed);
        self.wake.notify_one();
    }

    fn take_closed(&self) -> Vec<(i32, Instant)> {
        let mut closed = crate::sync::lock(&self.closed);
        std::mem::take(&mut *closed)
    }
}

/// What one monitor keeps between probes.
struct Prober {
    conn: Option<PgConnection>,
    /// The last moment at which every lock probed was confirmed held.
    confirmed_at: Option<Instant>,
    probe: Probe,
}

async fn run<T: LockTable>(monitor: Weak<Monitor>, table: Weak<T>, probe: Probe) {
    // The first probe is due one interval from now. Connecting in the meantime makes it cost
    // one round trip like every later one, instead of a connection set-up on top of the
    // interval for the first lock taken while nothing else was held.
    let mut due = Instant::now() + probe.interval;
    let conn: Option<PgConnection> = match monitor.upgrade() {
        Some(this) => timeout(probe.interval, PgConnection::connect_with(&this.options))
            .await
            .ok()
            .and_then(Result::ok),
        None => return,
    };
    let mut prober = Prober {
        conn,
        confirmed_at: None,
        probe,
    };
    // Probe ticks in a row with nothing held: the monitor (and its connection) stays for a
    // few, so a workload that takes and releases a lock over and over does not reconnect (a
    // whole authentication handshake) every time it holds one again.
    let mut idle_ticks = 0;
    while let Some(this) = monitor.upgrade() {
        tokio::select! {
            () = tokio::time::sleep_until(due) => {}
            () = this.wake.notified() => {}
        }
        let Some(table) = table.upgrade() else { break };
        let watched = table.watched().await;
        let closed = this.take_closed();
        if this.used.swap(false, Ordering::SeqCst) {
            // Locks came (and maybe went) since the last tick: not idle.
            idle_ticks = 0;
        }
        if watched.is_empty() && idle_ticks < IDLE_TICKS {
            idle_ticks += 1;
            due = Instant::now() + probe.interval;
            continue;
        }
        if watched.is_empty() {
            // Stop while nothing is held; a registration racing with this restarts us (it
            // either sees the flag still set, or finds it cleared and spawns a new monitor).
            this.running.store(false, Ordering::SeqCst);
            if table.held_lock_count() > 0 && !this.running.swap(true, Ordering::SeqCst) {
                due = Instant::now() + probe.interval;
                continue;
            }
            break;
        }
        idle_ticks = 0;
        let watched = declare_abandoned(&*table, watched, &closed).await;
        if !watched.is_empty() {
            prober.probe(&*table, &this.options, &watched).await;
        }
        due = Instant::now() + probe.interval;
    }
    if let Some(conn) = prober.conn {
        let _ = timeout(Duration::from_secs(1), conn.close()).await;
    }
}

impl Prober {
    /// One probe of `watched`: what the server no longer holds is lost; when the server cannot
    /// be asked, what has gone unconfirmed for too long is.
    async fn probe<T: LockTable>(
        &mut self,
        table: &T,
        options: &PgConnectOptions,
        watched: &[Watched],
    ) {
        let started = Instant::now();
        let asked = missing(&mut self.conn, options, watched, self.probe.allow_standby);
        match timeout(self.probe.grace, asked).await {
            Ok(Ok(missing)) => {
                self.confirmed_at = Some(started);
                for lost in missing {
                    table
                        .declare_lost(&lost.key, lost.generation, LossCause::NotOnServer)
                        .await;
                }
            }
            failed => {
                if let Ok(Err(err)) = &failed {
                    tracing::debug!(error = %err, "lost-lock probe failed");
                }
                // The connection's state is unknown (or it is broken): start over next time.
                self.conn = None;
                declare_unverifiable(table, watched, self.confirmed_at, self.probe).await;
            }
        }
    }
}

/// Declares lost the locks held on server sessions the manager has closed, registered before
/// the close (a later lock on a new session that reuses the pid is not one of them), and
/// returns the others. The server may still hold the abandoned locks for a while (it has not
/// noticed the session is gone), but the manager can neither release nor confirm them, so
/// their holders are told now, without waiting for a probe that may be slow to answer.
async fn declare_abandoned<T: LockTable>(
    table: &T,
    watched: Vec<Watched>,
    closed: &[(i32, Instant)],
) -> Vec<Watched> {
    let mut kept = Vec::with_capacity(watched.len());
    for lock in watched {
        let abandoned = closed
            .iter()
            .any(|&(pid, at)| lock.pid == Some(pid) && lock.registered_at <= at);
        if abandoned {
            table
                .declare_lost(&lock.key, lock.generation, LossCause::SessionClosed)
                .await;
        } else {
            kept.push(lock);
        }
    }
    kept
}

/// Declares lost the locks not confirmed for longer than the interval plus the grace.
async fn declare_unverifiable<T: LockTable>(
    table: &T,
    watched: &[Watched],
    confirmed_at: Option<Instant>,
    probe: Probe,
) {
    let now = Instant::now();
    for watched in watched {
        let known = confirmed_at.map_or(watched.registered_at, |at| at.max(watched.registered_at));
        if now.duration_since(known) >= probe.interval + probe.grace {
            table
                .declare_lost(&watched.key, watched.generation, LossCause::Unverifiable)
                .await;
        }
    }
}

/// Asks the server which of `watched` it no longer holds.
async fn missing(
    conn: &mut Option<PgConnection>,
    options: &PgConnectOptions,
    watched: &[Watched],
    allow_standby: bool,
) -> Result<Vec<Watched>, sqlx::Error> {
    if conn.is_none() {
        *conn = Some(PgConnection::connect_with(options).await?);
    }
    let conn = conn.as_mut().expect("connected above");
    let pids: Vec<i32> = watched.iter().map(|w| w.pid.unwrap_or(0)).collect();
    let ids: Vec<i64> = watched.iter().map(|w| w.target.packed()).collect();
    let shared: Vec<bool> = watched.iter().map(|w| w.mode == LockMode::Shared).collect();
    let subids: Vec<i16> = watched.iter().map(|w| w.target.objsubid()).collect();
    let missing: Vec<i64> = sqlx::query_scalar(PROBE)
        .bind(pids)
        .bind(ids)
        .bind(shared)
        .bind(subids)
        .bind(allow_standby)
        .fetch_all(conn)
        .await?;
    Ok(missing
        .into_iter()
        .filter_map(|position| watched.get(usize::try_from(position - 1).ok()?).cloned())
        .collect())
}
