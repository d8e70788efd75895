//! The in-memory lock manager, a test double with the full contract.

use std::fmt;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;
use tokio::time::timeout_at;

use crate::core::{Backend, CommonOptions, Core, HandoffLimits, Request, Slots, Waits};
use crate::{LockKey, LockMode, LockTarget, LossCause, Result};

/// A [`LockManager`](crate::LockManager) that lives inside one process, for unit tests.
///
/// It follows the same contract as [`PostgresLockManager`](crate::PostgresLockManager): the
/// same key hashing, guards, deadlines (one immediate try for a zero timeout), registry,
/// holder id, spans and errors, and it passes the same conformance suite. Waiters are served
/// in FIFO order. Every acquisition carries a [fencing token](crate::LockInfo::fencing_token),
/// strictly increasing per key on its [`InMemoryLockServer`].
///
/// It is **not** a distributed lock: nothing is shared across processes and nothing survives
/// the process. Use it where your code takes an `Arc<dyn LockManager>` or a generic
/// `M: LockManager`, so tests run without PostgreSQL.
///
/// Each manager is one holder. Managers built on one [`InMemoryLockServer`] contend with each
/// other the way separate processes contend on one database (a lock-order cycle between them
/// fails one of its waits with [`Error::Deadlock`](crate::Error::Deadlock) within about a
/// second, as PostgreSQL managers' do), which lets a unit test play several replicas:
///
/// ```
/// use pglock::{Attempt, InMemoryLockManager, InMemoryLockServer};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> pglock::Result<()> {
/// let server = InMemoryLockServer::new();
/// let a = InMemoryLockManager::builder().server(&server).holder_id("a").build();
/// let b = InMemoryLockManager::builder().server(&server).holder_id("b").build();
///
/// let guard = a.acquire("leader:jobs", None).await?;
/// assert!(matches!(b.try_acquire("leader:jobs").await?, Attempt::Busy));
/// guard.release().await?;
/// assert!(matches!(b.try_acquire("leader:jobs").await?, Attempt::Acquired(_)));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct InMemoryLockManager {
    pub(crate) core: Arc<Core<MemoryBackend>>,
}

impl InMemoryLockManager {
    /// A manager on a server of its own, with a generated holder id.
    pub fn new() -> Self {
        Self::builder().build()
    }

    /// Configures a manager.
    pub fn builder() -> InMemoryLockManagerBuilder {
        InMemoryLockManagerBuilder {
            common: CommonOptions::default(),
            server: None,
        }
    }

    /// The most locks this manager may hold at once, if it was given a budget.
    pub fn lock_budget(&self) -> Option<usize> {
        self.core.lock_budget()
    }

    /// The server this manager takes its locks on.
    pub fn server(&self) -> &InMemoryLockServer {
        &self.core.backend.server
    }

    /// Makes this manager lose its lock on `key`, as if the server had dropped the session
    /// holding it, so tests can exercise code that must react to a lost lock.
    ///
    /// Exactly what [`PostgresLockManager`](crate::PostgresLockManager) does when it detects a
    /// lost lock happens here: the registry forgets the lock, the lock is freed for other
    /// holders, the guard's loss signal fires with [`LossCause::Simulated`](crate::LossCause),
    /// and the guard's release then fails with [`Error::LockLost`](crate::Error::LockLost).
    /// Returns false if this manager does not hold `key`.
    ///
    /// ```
    /// use pglock::{InMemoryLockManager, LossCause};
    ///
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let locks = InMemoryLockManager::new();
    /// let guard = locks.acquire("leader:jobs", None).await.unwrap();
    /// assert!(locks.simulate_loss("leader:jobs").await);
    /// assert_eq!(guard.loss_signal().lost().await, LossCause::Simulated);
    /// assert!(!locks.is_held("leader:jobs").await);
    /// assert!(guard.release().await.is_err());
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped, the lock is either untouched or fully lost.
    pub async fn simulate_loss(&self, key: impl Into<LockKey>) -> bool {
        self.core
            .declare_key_lost(&key.into(), LossCause::Simulated)
            .await
    }
}

impl Default for InMemoryLockManager {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryLockManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockManager")
            .field("holder_id", &self.core.holder_id())
            .field("held_lock_count", &self.core.held_lock_count())
            .finish_non_exhaustive()
    }
}

/// Builds an [`InMemoryLockManager`].
#[must_use = "a builder does nothing until `build` is called"]
pub struct InMemoryLockManagerBuilder {
    common: CommonOptions,
    server: Option<InMemoryLockServer>,
}

impl InMemoryLockManagerBuilder {
    /// How many locks the manager may hold at once; an acquisition beyond it fails with
    /// [`Error::BudgetExhausted`](crate::Error::BudgetExhausted), as with
    /// [`PostgresLockManagerBuilder::lock_budget`](crate::PostgresLockManagerBuilder::lock_budget),
    /// so code that handles a full budget can be tested without a server. Default: no limit.
    pub fn lock_budget(mut self, max_locks: usize) -> Self {
        self.common.lock_budget = Some(max_locks);
        self
    }

    /// The holder id stamped on every [`LockInfo`](crate::LockInfo). Default:
    /// `{host}:{pid}:{16 random hex digits}`, unique per process and per manager.
    pub fn holder_id(mut self, holder_id: impl Into<String>) -> Self {
        self.common.holder_id = Some(holder_id.into());
        self
    }

    /// Takes locks on `server`, shared with other managers. Default: a server of its own.
    pub fn server(mut self, server: &InMemoryLockServer) -> Self {
        self.server = Some(server.clone());
        self
    }

    crate::telemetry::telemetry_setters!(common.telemetry);

    /// Builds the manager.
    pub fn build(self) -> InMemoryLockManager {
        let backend = MemoryBackend {
            server: self.server.unwrap_or_default(),
        };
        let options = self.common.into_options(Some(HandoffLimits::DEFAULT));
        backend.server.probes.join(&options.waits);
        InMemoryLockManager {
            core: Arc::new(Core::new(backend, options)),
        }
    }
}

impl fmt::Debug for InMemoryLockManagerBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockManagerBuilder")
            .field("common", &self.common)
            .finish_non_exhaustive()
    }
}

/// The shared state that [`InMemoryLockManager`]s contend on, standing in for a database.
///
/// Cloning it gives another handle to the same server. Locks are keyed by
/// their [`LockTarget`](crate::LockTarget), as on PostgreSQL.
#[derive(Clone)]
pub struct InMemoryLockServer {
    locks: Arc<Mutex<Slots<LockTarget, tokio::sync::Semaphore>>>,
    /// The last fencing token minted per lock id; never reset, so tokens only grow.
    fences: Arc<Mutex<std::collections::HashMap<i64, i64>>>,
    /// Carries the probes that find lock-order cycles between its managers.
    probes: Arc<ProbeHub>,
}

impl InMemoryLockServer {
    /// An empty server.
    pub fn new() -> Self {
        InMemoryLockServer {
            locks: Arc::new(Mutex::new(Slots::new(|| {
                tokio::sync::Semaphore::new(SHARERS as usize)
            }))),
            fences: Arc::default(),
            probes: Arc::default(),
        }
    }

    fn mint(&self, lock_id: i64) -> i64 {
        let mut fences = crate::sync::lock(&self.fences);
        let token = fences.entry(lock_id).or_insert(0);
        *token += 1;
        *token
    }

    fn slot(&self, target: LockTarget) -> Arc<tokio::sync::Semaphore> {
        crate::sync::lock(&self.locks).get(&target)
    }
}

impl Default for InMemoryLockServer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for InMemoryLockServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("InMemoryLockServer").finish_non_exhaustive()
    }
}

/// How long a caller of an in-memory manager waits inside a critical section before its
/// manager probes for a cycle through the server's other managers: PostgreSQL's default
/// `deadlock_timeout`.
const DEADLOCK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// How often the hub looks for probes to send.
const PROBE_TICK: std::time::Duration = std::time::Duration::from_millis(50);

/// What carries probes between the managers of one server, as `LISTEN`/`NOTIFY` does between
/// PostgreSQL managers (see `core/cycles/`): a task that runs while any of them waits inside
/// a critical section.
#[derive(Default)]
struct ProbeHub {
    managers: Mutex<Vec<std::sync::Weak<Waits>>>,
    running: Mutex<bool>,
}

impl ProbeHub {
    /// Carries the probes of `waits` from now on.
    fn join(self: &Arc<Self>, waits: &Arc<Waits>) {
        crate::sync::lock(&self.managers).push(Arc::downgrade(waits));
        let hub = Arc::downgrade(self);
        waits.on_register(move || {
            if let Some(hub) = hub.upgrade() {
                hub.ensure_running();
            }
        });
    }

    fn ensure_running(self: &Arc<Self>) {
        let mut running = crate::sync::lock(&self.running);
        if !*running && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            *running = true;
            drop(runtime.spawn(Arc::clone(self).run()));
        }
    }

    /// Every tick, sends the probes due and delivers every probe to every manager, until
    /// nobody waits inside a section.
    async fn run(self: Arc<Self>) {
        loop {
            tokio::time::sleep(PROBE_TICK).await;
            let waits: Vec<Arc<Waits>> = {
                let mut managers = crate::sync::lock(&self.managers);
                managers.retain(|m| m.strong_count() > 0);
                managers
                    .iter()
                    .filter_map(std::sync::Weak::upgrade)
                    .collect()
            };
            {
                let mut running = crate::sync::lock(&self.running);
                if !waits.iter().any(|w| w.any()) {
                    *running = false;
                    return;
                }
            }
            let mut probes: Vec<String> = waits
                .iter()
                .flat_map(|w| w.due_probes(DEADLOCK_TIMEOUT))
                .collect();
            // A probe goes round a cycle in as many hops as the cycle has waits: bounded.
            let mut budget = 10_000usize;
            while let Some(probe) = probes.pop() {
                budget = budget.saturating_sub(1);
                if budget == 0 {
                    break;
                }
                for w in &waits {
                    let heard = w.on_probe(&probe, DEADLOCK_TIMEOUT);
                    probes.extend(heard.pass_on);
                    // Nobody outside the process speaks here: what came back is the server's
                    // own view.
                    for cycle in heard.to_confirm {
                        w.settle(cycle, true);
                    }
                }
            }
        }
    }
}

/// Each lock is a semaphore of this many permits: an exclusive holder takes them all, a shared
/// holder one. Tokio's semaphore queues waiters in FIFO order whatever they ask for, which
/// matches PostgreSQL's lock queue.
const SHARERS: u32 = 1 << 16;

fn permits(mode: LockMode) -> u32 {
    match mode {
        LockMode::Exclusive => SHARERS,
        LockMode::Shared => 1,
    }
}

pub(crate) struct MemoryBackend {
    server: InMemoryLockServer,
}

impl Backend for MemoryBackend {
    type Session = OwnedSemaphorePermit;

    async fn lock(&self, req: &Request<'_>) -> Result<(Self::Session, Option<i64>)> {
        let slot = self.server.slot(req.target);
        let n = permits(req.mode);
        let permit = match req.deadline {
            _ if req.is_immediate() => slot
                .try_acquire_many_owned(n)
                .map_err(|_| req.timed_out())?,
            Some(deadline) => timeout_at(deadline, slot.acquire_many_owned(n))
                .await
                .map_err(|_| req.timed_out())?
                .expect("lock semaphores are never closed"),
            None => slot
                .acquire_many_owned(n)
                .await
                .expect("lock semaphores are never closed"),
        };
        Ok((permit, Some(self.server.mint(req.lock_id))))
    }

    async fn try_lock(&self, req: &Request<'_>) -> Result<Option<(Self::Session, Option<i64>)>> {
        let slot = self.server.slot(req.target);
        Ok(slot
            .try_acquire_many_owned(permits(req.mode))
            .ok()
            .map(|permit| (permit, Some(self.server.mint(req.lock_id)))))
    }

    async fn confirm(
        &self,
        _key: &LockKey,
        target: LockTarget,
        _session: &mut Self::Session,
    ) -> Result<Option<i64>> {
        // A permit is held until dropped: there is no session to end unseen.
        Ok(Some(self.server.mint(target.packed())))
    }

    async fn unlock(
        &self,
        _key: &LockKey,
        _target: LockTarget,
        _mode: LockMode,
        session: Self::Session,
    ) -> Result<()> {
        drop(session);
        Ok(())
    }
}

/// The defaults `docs/defaults.md` documents, as the code has them (see `defaults_table`).
#[cfg(test)]
pub(crate) fn documented_defaults() -> Vec<(&'static str, String)> {
    let budget = InMemoryLockManager::new().lock_budget();
    vec![
        (
            "cycle check",
            format!("after {DEADLOCK_TIMEOUT:?} of waiting"),
        ),
        (
            "lock budget",
            budget.map_or("none".to_owned(), |n| n.to_string()),
        ),
    ]
}
