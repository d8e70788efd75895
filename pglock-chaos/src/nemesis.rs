//! The nemesis: seeded, random, overlapping faults against the workers, their network and the
//! lock server, each recorded as a `fault` record from its injection to its heal.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rustix::process::Signal;
use sqlx::Connection;
use tokio::sync::{Mutex, OwnedMutexGuard, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::collect::Collector;
use crate::history::{Op, Outcome, Record, now_us};
use crate::rng::Rng;
use crate::workers::{Slot, Workers};

/// The kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// `kill -9` of a worker, which is then restarted.
    Kill,
    /// SIGSTOP of a worker for less than the silent-holder bound, then SIGCONT.
    PauseShort,
    /// SIGSTOP of a worker for longer than the silent-holder bound, then SIGCONT.
    PauseLong,
    /// `pg_terminate_backend` of a session holding an advisory lock.
    Terminate,
    /// An immediate stop of the lock server, then a start.
    Restart,
    /// A worker's proxy stops forwarding (sockets stay open), then resumes.
    Blackhole,
    /// A worker's proxy closes every connection.
    Reset,
    /// A worker's proxy delays what it forwards, for a while.
    Delay,
    /// The primary crashes and the standby is promoted; the proxies follow it.
    Failover,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Kill,
        FaultKind::PauseShort,
        FaultKind::PauseLong,
        FaultKind::Terminate,
        FaultKind::Restart,
        FaultKind::Blackhole,
        FaultKind::Reset,
        FaultKind::Delay,
        FaultKind::Failover,
    ];

    /// The kind's name, the `detail` of its records.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::PauseShort => "pause-short",
            FaultKind::PauseLong => "pause-long",
            FaultKind::Terminate => "terminate-backend",
            FaultKind::Restart => "server-restart",
            FaultKind::Blackhole => "partition-blackhole",
            FaultKind::Reset => "partition-reset",
            FaultKind::Delay => "partition-delay",
            FaultKind::Failover => "failover",
        }
    }
}

/// How often and how long faults are.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Between two fault starts, in ms.
    pub gap_ms: (u64, u64),
    /// At most this many faults at once.
    pub overlap: usize,
    /// A short pause, in ms: below the silent-holder bound.
    pub short_pause_ms: (u64, u64),
    /// A long pause: past the silent-holder bound (when there is one).
    pub long_pause: Duration,
    /// A blackhole or a delay, in ms.
    pub partition_ms: (u64, u64),
    /// A server's down time in a restart, in ms.
    pub down_ms: (u64, u64),
}

/// The nemesis of one run.
pub struct Nemesis {
    /// The lock server.
    pub cluster: Arc<Cluster>,
    /// The workers.
    pub workers: Arc<Workers>,
    /// Where faults are recorded.
    pub collector: Arc<Collector>,
    /// The kinds to use.
    pub kinds: Vec<FaultKind>,
    /// How often and how long.
    pub pace: Pace,
    /// Held while the server restarts, fails over or gets a new standby.
    pub server: Arc<Mutex<()>>,
}

/// A fault chosen, with what it holds while it lasts.
struct Plan {
    kind: FaultKind,
    slot: Option<Arc<Slot>>,
    _held: Option<OwnedMutexGuard<()>>,
    length: Duration,
    pick: u64,
}

impl Nemesis {
    /// Injects faults until `until`, each kind first once in a seeded order and then at
    /// random; then waits for every fault to heal. Returns how many of each kind it injected.
    pub async fn run(self: Arc<Self>, seed: u64, until: Instant) -> BTreeMap<FaultKind, u32> {
        let mut rng = Rng::new(seed);
        let mut pending = self.kinds.clone();
        let slots = Arc::new(Semaphore::new(self.pace.overlap));
        let mut faults = JoinSet::new();
        let mut counts = BTreeMap::new();
        while Instant::now() < until {
            let gap = rng.between(self.pace.gap_ms.0, self.pace.gap_ms.1);
            tokio::time::sleep(Duration::from_millis(gap)).await;
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                continue;
            };
            let Some(plan) = self.choose(&mut rng, &mut pending) else {
                continue;
            };
            *counts.entry(plan.kind).or_insert(0) += 1;
            let me = self.clone();
            faults.spawn(async move {
                me.inject(plan).await;
                drop(permit);
            });
        }
        let healed = tokio::time::timeout(Duration::from_secs(120), async {
            while faults.join_next().await.is_some() {}
        });
        if healed.await.is_err() {
            self.collector
                .problem("faults did not heal in time".to_owned());
        }
        counts
    }

    /// The next fault: a kind not yet injected if one can be now, else any that can.
    fn choose(&self, rng: &mut Rng, pending: &mut Vec<FaultKind>) -> Option<Plan> {
        if self.kinds.is_empty() {
            return None;
        }
        let start = if pending.is_empty() {
            0
        } else {
            rng.index(pending.len())
        };
        for i in 0..pending.len() {
            let kind = pending[(start + i) % pending.len()];
            if let Some(plan) = self.plan(rng, kind) {
                pending.retain(|k| *k != kind);
                return Some(plan);
            }
        }
        for _ in 0..4 {
            let kind = self.kinds[rng.index(self.kinds.len())];
            if let Some(plan) = self.plan(rng, kind) {
                return Some(plan);
            }
        }
        None
    }

    /// A plan for `kind` if its target is free now.
    fn plan(&self, rng: &mut Rng, kind: FaultKind) -> Option<Plan> {
        let pace = self.pace;
        let ms =
            |rng: &mut Rng, (low, high): (u64, u64)| Duration::from_millis(rng.between(low, high));
        let (slot, held, length) = match kind {
            FaultKind::Restart | FaultKind::Failover => {
                if kind == FaultKind::Failover && !self.cluster.has_standby() {
                    return None;
                }
                let held = self.server.clone().try_lock_owned().ok()?;
                (None, Some(held), ms(rng, pace.down_ms))
            }
            FaultKind::Terminate => (None, None, Duration::ZERO),
            _ => {
                let slot = self.workers.slots[rng.index(self.workers.slots.len())].clone();
                let held = slot.busy.clone().try_lock_owned().ok()?;
                let length = match kind {
                    FaultKind::PauseShort => ms(rng, pace.short_pause_ms),
                    FaultKind::PauseLong => pace.long_pause,
                    FaultKind::Blackhole | FaultKind::Delay => ms(rng, pace.partition_ms),
                    _ => ms(rng, (0, 300)),
                };
                (Some(slot), Some(held), length)
            }
        };
        Some(Plan {
            kind,
            slot,
            _held: held,
            length,
            pick: rng.next_u64(),
        })
    }

    /// Injects a fault, waits its length, heals it, and records it.
    async fn inject(&self, plan: Plan) {
        if let (Some(slot), FaultKind::PauseLong) = (&plan.slot, plan.kind) {
            self.until_holding(slot).await;
        }
        let start = now_us();
        let result = match (&plan.slot, plan.kind) {
            (Some(slot), kind) => self.on_worker(slot, kind, plan.length, plan.pick).await,
            (None, FaultKind::Terminate) => terminate(&self.cluster, plan.pick).await,
            (None, FaultKind::Restart) => self.restart(plan.length).await,
            (None, _) => self.fail_over().await,
        };
        // The detail is the kind alone: the checker groups faults by it.
        let (key, outcome) = match result {
            Ok(key) => (key, Outcome::Ok),
            Err(err) => {
                eprintln!("pglock-chaos: {} not injected: {err}", plan.kind.name());
                ("?".to_owned(), Outcome::Fail)
            }
        };
        self.collector.add(Record {
            process: "nemesis".to_owned(),
            task: 0,
            op: Op::Fault,
            key,
            start_us: start,
            end_us: now_us(),
            outcome,
            token: None,
            value: Some(plan.length.as_millis() as i64),
            detail: Some(plan.kind.name().to_owned()),
            holder: None,
            seq: None,
        });
    }

    async fn on_worker(
        &self,
        slot: &Slot,
        kind: FaultKind,
        length: Duration,
        pick: u64,
    ) -> Result<String, String> {
        let workers = &self.workers;
        match kind {
            FaultKind::Kill => {
                workers.kill(slot).await;
                tokio::time::sleep(length).await;
                if let Err(err) = workers.restart(slot).await {
                    // The run goes on a worker short: a problem with the run itself.
                    self.collector.problem(err.clone());
                    return Err(err);
                }
            }
            FaultKind::PauseShort | FaultKind::PauseLong => {
                workers.signal(slot, Signal::STOP).await;
                tokio::time::sleep(length).await;
                workers.signal(slot, Signal::CONT).await;
            }
            FaultKind::Blackhole => {
                slot.proxy.blackhole();
                tokio::time::sleep(length).await;
                slot.proxy.restore();
            }
            FaultKind::Reset => slot.proxy.reset(),
            _ => {
                slot.proxy.set_delay(Duration::from_millis(20 + pick % 200));
                tokio::time::sleep(length).await;
                slot.proxy.set_delay(Duration::ZERO);
            }
        }
        Ok(slot.name.clone())
    }

    /// Waits, for a second at most, until `slot`'s worker holds a lock on the primary (its
    /// sessions carry the tag `pglock:{worker}-{pid}`), so that a long pause freezes a holder
    /// and the silent-holder check has a case. The pause goes ahead either way.
    async fn until_holding(&self, slot: &Slot) {
        const HOLDING: &str = "SELECT EXISTS (SELECT 1 FROM pg_locks l \
             JOIN pg_stat_activity a USING (pid) \
             WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE $1)";
        let deadline = Instant::now() + Duration::from_secs(1);
        let url = self.cluster.primary().url();
        let connect = tokio::time::timeout_at(deadline, sqlx::PgConnection::connect(&url));
        let Ok(Ok(mut conn)) = connect.await else {
            return;
        };
        let tag = format!("pglock:{}-%", slot.name);
        while Instant::now() < deadline {
            let holding = sqlx::query_scalar(HOLDING).bind(&tag).fetch_one(&mut conn);
            match tokio::time::timeout_at(deadline, holding).await {
                Ok(Ok(false)) => tokio::time::sleep(Duration::from_millis(5)).await,
                _ => break,
            }
        }
        let _ = conn.close().await;
    }

    async fn restart(&self, down: Duration) -> Result<String, String> {
        let cluster = self.cluster.clone();
        blocking(move || cluster.crash_primary()).await?;
        tokio::time::sleep(down).await;
        let cluster = self.cluster.clone();
        blocking(move || cluster.restart_primary()).await?;
        Ok("server".to_owned())
    }

    /// Fails over; the fault heals once the proxies point at the new primary. A new standby
    /// is then made in the background, the server lock held until it is ready.
    async fn fail_over(&self) -> Result<String, String> {
        let cluster = self.cluster.clone();
        let port = blocking(move || cluster.fail_over()).await?;
        for slot in &self.workers.slots {
            slot.proxy.retarget(port);
            slot.proxy.reset();
        }
        let (cluster, server, collector) = (
            self.cluster.clone(),
            self.server.clone(),
            self.collector.clone(),
        );
        tokio::spawn(async move {
            let _held = server.lock_owned().await;
            if let Err(err) = blocking(move || cluster.rebuild_standby()).await {
                collector.problem(format!("no new standby after the failover: {err}"));
            }
        });
        Ok("server".to_owned())
    }
}

/// Ends one random session holding an advisory lock on the primary.
async fn terminate(cluster: &Cluster, pick: u64) -> Result<String, String> {
    let url = cluster.primary().url();
    let connect = tokio::time::timeout(Duration::from_secs(2), sqlx::PgConnection::connect(&url));
    let mut conn = connect
        .await
        .map_err(|_| "no connection in time".to_owned())?
        .map_err(|err| err.to_string())?;
    let pids: Vec<i32> = sqlx::query_scalar(
        "SELECT DISTINCT pid FROM pg_locks WHERE locktype = 'advisory' AND granted \
         AND pid <> pg_backend_pid() ORDER BY pid",
    )
    .fetch_all(&mut conn)
    .await
    .map_err(|err| err.to_string())?;
    if pids.is_empty() {
        return Ok("backend:none".to_owned());
    }
    let pid = pids[(pick % pids.len() as u64) as usize];
    sqlx::query("SELECT pg_terminate_backend($1)")
        .bind(pid)
        .execute(&mut conn)
        .await
        .map_err(|err| err.to_string())?;
    let _ = conn.close().await;
    Ok(format!("backend:{pid}"))
}

async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(err)) => Err(err.to_string()),
        Err(err) => Err(err.to_string()),
    }
}
