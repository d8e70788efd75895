//! One simulated world: managers on a simulated server, callers running random programs, a
//! nemesis, and the invariants checked as it runs.

use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::{Instant, sleep};

use super::rng::Rng;
use super::server::{Faults, SimBackend, SimServer, token_key};
use crate::core::{Budget, Core, HandoffLimits, Options};
use crate::{
    Error, HeldLock, LockGuard, LockKey, LockManager, LockManagerExt, LockMode, LossCause,
    LossSignal, Result,
};

/// The shape of every world: small, so keys are contended and seeds are cheap.
const MANAGERS: usize = 2;
const CALLERS: usize = 3;
pub(super) const OPS: usize = 6;
const KEYS: [&str; 3] = ["k0", "k1", "k2"];
pub(super) const BUDGET: usize = 3;
pub(super) const HANDOFF: HandoffLimits = HandoffLimits {
    max_handoffs: 2,
    max_hold: Duration::from_millis(40),
};
/// A world whose callers have not finished after this much simulated time is stuck.
const STUCK_AFTER: Duration = Duration::from_secs(120);

/// A manager of the simulated backend, as users hold one.
#[derive(Debug)]
pub(crate) struct SimManager {
    pub(crate) core: Arc<Core<SimBackend>>,
}

#[async_trait::async_trait]
impl LockManager for SimManager {
    async fn acquire_key(
        &self,
        key: &LockKey,
        options: crate::AcquireOptions,
    ) -> Result<crate::Attempt> {
        let acquired = self.core.lock(key, options).await?;
        Ok(crate::Attempt::from(acquired.map(LockGuard::from)))
    }
    async fn release_key(&self, key: &LockKey) -> Result<()> {
        self.core.release(key).await
    }
    async fn is_held_key(&self, key: &LockKey) -> bool {
        self.core.is_held(key).await
    }
    async fn release_all(&self) -> Result<usize> {
        self.core.release_all().await
    }
    async fn held_locks(&self) -> Vec<HeldLock> {
        self.core.held_locks().await
    }
    fn held_lock_count(&self) -> usize {
        self.core.held_lock_count()
    }
    fn holder_id(&self) -> &str {
        self.core.holder_id()
    }
}

impl std::fmt::Debug for Core<SimBackend> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("holder", &self.holder_id)
            .finish()
    }
}

/// What a caller asked for, which decides the errors it may meet.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Op {
    /// A wait for one key, with a deadline or not, inside a section or not.
    Acquire {
        deadline: bool,
        nested: bool,
    },
    /// One attempt.
    Try,
    /// Several keys, all or nothing.
    AcquireAll {
        deadline: bool,
    },
    /// A section's body run under its guard.
    Section,
    /// A guard's or a set's release.
    Release,
    /// `release(key)` after a leak.
    ReleaseKey,
    ReleaseAll,
}

/// What a caller believes it holds, from the acquisition's return until it lets go.
pub(super) struct Belief {
    pub(super) who: String,
    pub(super) key: LockKey,
    pub(super) mode: LockMode,
    pub(super) token: i64,
    pub(super) signal: LossSignal,
    /// The signal is a set's, which fires when any of its keys goes.
    pub(super) of_a_set: bool,
    pub(super) active: bool,
    /// When the acquisition returned: a lock whose session ended before is signalled by the
    /// detector as soon as it runs, which may be just after the caller got its guard.
    pub(super) since: Instant,
}

/// A caller waiting for a key inside its section on another, as the world sees it: from just
/// before the wait is asked until it returns (a superset of what the engine registers).
struct SectionWait {
    who: String,
    manager: usize,
    holding: (LockKey, LockMode),
    wants: (LockKey, LockMode),
}

/// Ends a section's wait, as the world sees it, when dropped (also when cancelled).
pub(crate) struct WaitingInSection {
    world: Arc<World>,
    who: String,
}

impl Drop for WaitingInSection {
    fn drop(&mut self) {
        crate::sync::lock(&self.world.section_waits).retain(|w| w.who != self.who);
    }
}

/// Ends a belief when dropped: the caller let go, or was cancelled.
pub(crate) struct Believing {
    world: Arc<World>,
    index: usize,
}

impl Drop for Believing {
    fn drop(&mut self) {
        crate::sync::lock(&self.world.beliefs)[self.index].active = false;
    }
}

pub(crate) struct World {
    pub(crate) rng: Arc<Rng>,
    pub(super) server: Arc<SimServer>,
    pub(super) managers: Vec<Arc<SimManager>>,
    pub(super) beliefs: Mutex<Vec<Belief>>,
    /// Keys a caller leaked into a manager's registry and has not released yet.
    leaked: Mutex<Vec<(usize, LockKey)>>,
    /// Callers waiting inside sections, to judge a `Deadlock` against.
    section_waits: Mutex<Vec<SectionWait>>,
    violation: Mutex<Option<String>>,
    trace: Mutex<Trace>,
    started: Instant,
    slack: Duration,
}

/// The world's trace: a running hash, and the lines themselves when asked for.
pub(crate) struct Trace {
    pub(crate) hash: u64,
    pub(crate) lines: Option<Vec<String>>,
    pub(crate) steps: u64,
}

impl World {
    pub(crate) fn new(seed: u64, keep_lines: bool) -> Arc<World> {
        let rng = Arc::new(Rng::new(seed));
        let max_delay_ms = rng.pick(&[0, 1, 3]);
        let faults = Faults {
            max_delay_ms,
            fail: rng.pick(&[0, 20, 80]),
            reply_lost: rng.pick(&[0, 20, 60]),
            stall: rng.pick(&[0, 10, 40]),
            stall_ms: rng.pick(&[5, 30]),
        };
        let server = SimServer::new(Arc::clone(&rng), faults);
        let managers = (0..MANAGERS)
            .map(|m| {
                let options = Options {
                    metrics: Default::default(),
                    holder_id: format!("m{m}").into(),
                    tracing: false,
                    hook: None,
                    handoff: Some(HANDOFF),
                    budget: Budget::new(Some(BUDGET), Default::default()),
                    defer_drops: rng.chance(500),
                    waits: Arc::default(),
                };
                let core = Arc::new(Core::new(server.backend(), options));
                Arc::new(SimManager { core })
            })
            .collect();
        let longest = faults.max_delay_ms.max(faults.stall_ms);
        Arc::new(World {
            rng,
            server,
            managers,
            beliefs: Mutex::default(),
            leaked: Mutex::default(),
            section_waits: Mutex::default(),
            violation: Mutex::default(),
            trace: Mutex::new(Trace {
                hash: 0xcbf2_9ce4_8422_2325,
                lines: keep_lines.then(Vec::new),
                steps: 0,
            }),
            started: Instant::now(),
            // An operation may overrun its deadline by the delays around one server reply,
            // and a set by those of letting its partial grant go.
            slack: Duration::from_millis(4 * longest + 1),
        })
    }

    /// Runs the world to its end and returns its first violation, if any.
    pub(crate) async fn run(self: &Arc<Self>) -> Option<String> {
        let callers: Vec<_> = (0..MANAGERS * CALLERS)
            .map(|n| tokio::spawn(super::callers::caller(Arc::clone(self), n % MANAGERS, n)))
            .collect();
        let checker = tokio::spawn(check_every_tick(Arc::clone(self)));
        let nemesis = tokio::spawn(nemesis(Arc::clone(self)));
        let finished = tokio::time::timeout(STUCK_AFTER, async {
            for caller in callers {
                if let Err(err) = caller.await {
                    return Err(format!("a caller panicked: {err}"));
                }
            }
            Ok(())
        })
        .await;
        nemesis.abort();
        match finished {
            Err(_) => self.violate(format!(
                "stuck: callers still running after {STUCK_AFTER:?} of simulated time"
            )),
            Ok(Err(panic)) => self.violate(panic),
            Ok(Ok(())) => {}
        }
        checker.abort();
        if self.violation().is_none() {
            self.check();
            self.settle().await;
        }
        self.violation()
    }

    pub(crate) fn violation(&self) -> Option<String> {
        crate::sync::lock(&self.violation).clone()
    }

    pub(crate) fn violate(&self, what: String) {
        let mut violation = crate::sync::lock(&self.violation);
        if violation.is_none() {
            let at = self.started.elapsed().as_micros();
            *violation = Some(format!("at {at} µs: {what}"));
        }
    }

    pub(crate) fn trace(&self) -> std::sync::MutexGuard<'_, Trace> {
        crate::sync::lock(&self.trace)
    }

    /// Adds a line to the trace, stamped with the simulated time.
    pub(crate) fn note(&self, line: std::fmt::Arguments<'_>) {
        let mut text = String::new();
        let _ = write!(text, "{:>8} ", self.started.elapsed().as_micros());
        let _ = text.write_fmt(line);
        let mut trace = self.trace();
        for byte in text.bytes() {
            trace.hash = (trace.hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
        }
        trace.steps += 1;
        if let Some(lines) = &mut trace.lines {
            lines.push(text);
        }
        drop(trace);
        // Every traced step is checked as it happens, not only on the clock's ticks.
        self.check();
    }

    pub(crate) fn manager(&self, m: usize) -> &SimManager {
        &self.managers[m]
    }

    pub(crate) fn key(&self) -> LockKey {
        LockKey::name(self.rng.pick(&KEYS))
    }

    pub(crate) fn two_keys(&self) -> [LockKey; 2] {
        let first = self.rng.below(KEYS.len() as u64) as usize;
        let second = (first + 1 + self.rng.below(KEYS.len() as u64 - 1) as usize) % KEYS.len();
        [LockKey::name(KEYS[first]), LockKey::name(KEYS[second])]
    }

    pub(crate) fn mode(&self) -> LockMode {
        if self.rng.chance(300) {
            LockMode::Shared
        } else {
            LockMode::Exclusive
        }
    }

    pub(crate) fn timeout(&self) -> Option<Duration> {
        match self.rng.below(6) {
            0 => None,
            1 => Some(Duration::ZERO),
            n => Some(Duration::from_millis(self.rng.below(8 * n) + 1)),
        }
    }

    /// How long a holder works under its lock.
    pub(crate) async fn work(&self) {
        let ms = self.rng.below(6);
        if ms == 0 {
            tokio::task::yield_now().await;
        } else {
            sleep(Duration::from_millis(ms)).await;
        }
    }

    /// Records that `who` believes it holds the lock `info` describes until the result drops.
    pub(crate) fn believe(
        self: &Arc<Self>,
        who: &str,
        info: &crate::LockInfo,
        signal: &LossSignal,
        of_a_set: bool,
    ) -> Believing {
        let token = info.fencing_token.unwrap_or_else(|| {
            self.violate(format!("{who} was granted {} without a token", info.key));
            0
        });
        let mut beliefs = crate::sync::lock(&self.beliefs);
        beliefs.push(Belief {
            who: who.to_owned(),
            key: info.key.clone(),
            mode: info.mode,
            token,
            signal: signal.clone(),
            of_a_set,
            active: true,
            since: Instant::now(),
        });
        let index = beliefs.len() - 1;
        drop(beliefs);
        // A belief is checked the moment it begins, so a hold of no time at all is looked at.
        self.check();
        Believing {
            world: Arc::clone(self),
            index,
        }
    }

    /// Whether the server ended the session `info`'s lock was granted on.
    pub(crate) fn session_ended(&self, info: &crate::LockInfo) -> bool {
        let state = self.server.state();
        let token = token_key(info.key.target().packed(), info.fencing_token.unwrap_or(0));
        state
            .token_session
            .get(&token)
            .is_some_and(|&session| state.sessions[session].ended.is_some())
    }

    /// Whether the server ended the session on which manager `m` registers `key` now (the one
    /// `release(key)` lets go of: a lock the caller leaked may have been lost, and the key
    /// taken again by another caller of the manager meanwhile).
    pub(crate) fn registered_session_ended(&self, m: usize, key: &LockKey) -> bool {
        let session = self.managers[m]
            .core
            .state()
            .held
            .get(key)
            .map(|held| held.session.id);
        let state = self.server.state();
        session.is_some_and(|id| state.sessions[id].ended.is_some())
    }

    /// A release that `who` was told was confirmed: its session must not have ended before the
    /// release was asked (`ended_before`), since the lock went with it.
    pub(crate) fn check_confirmed(&self, who: &str, key: &LockKey, ended_before: bool) {
        if ended_before {
            self.violate(format!(
                "{who} was told its release of {key} was confirmed, but its session had ended before"
            ));
        }
    }

    pub(crate) fn leaked(&self, m: usize, key: &LockKey, leaked: bool) {
        let mut keys = crate::sync::lock(&self.leaked);
        if leaked {
            keys.push((m, key.clone()));
        } else if let Some(at) = keys.iter().position(|(n, k)| *n == m && k == key) {
            keys.swap_remove(at);
        }
    }

    /// Deadlines are honoured: a bounded wait ends within its deadline plus the slack of one
    /// reply, and never reports a timeout before it.
    pub(crate) fn check_deadline<T>(
        &self,
        what: &str,
        timeout: Option<Duration>,
        started: Instant,
        result: &Result<T>,
        slack: Duration,
    ) {
        let Some(timeout) = timeout else {
            return;
        };
        let took = started.elapsed();
        if took > timeout + slack {
            self.violate(format!(
                "{what}: took {took:?} for a {timeout:?} deadline (slack {slack:?})"
            ));
        }
        if matches!(result, Err(err) if err.is_timeout()) && took < timeout {
            self.violate(format!(
                "{what}: timed out after {took:?}, before its {timeout:?} deadline"
            ));
        }
    }

    pub(crate) fn slack(&self) -> Duration {
        self.slack
    }

    /// Records that `who`, of manager `m`, waits for `wants` inside its section on `holding`,
    /// until the returned value drops.
    pub(crate) fn waiting_in_section(
        self: &Arc<Self>,
        who: &str,
        manager: usize,
        holding: (LockKey, LockMode),
        wants: (LockKey, LockMode),
    ) -> WaitingInSection {
        crate::sync::lock(&self.section_waits).push(SectionWait {
            who: who.to_owned(),
            manager,
            holding,
            wants,
        });
        WaitingInSection {
            world: Arc::clone(self),
            who: who.to_owned(),
        }
    }

    /// A `Deadlock` told to `who`, waiting inside a section: there must be a cycle among the
    /// section waits of its manager right now, from what it wants back to what it holds.
    pub(crate) fn check_deadlock(&self, what: &str, who: &str) {
        let waits = crate::sync::lock(&self.section_waits);
        let Some(victim) = waits.iter().find(|w| w.who == who) else {
            return self.violate(format!("{what}: a Deadlock outside any section's wait"));
        };
        let conflicts = |wanted: LockMode, held: LockMode| {
            wanted == LockMode::Exclusive || held == LockMode::Exclusive
        };
        let blocks = |wait: &SectionWait, (key, mode): &(LockKey, LockMode)| {
            wait.holding.0 == *key && conflicts(*mode, wait.holding.1)
        };
        let mut frontier = vec![&victim.wants];
        let mut seen = vec![victim.who.as_str()];
        while let Some(wanted) = frontier.pop() {
            if blocks(victim, wanted) && !std::ptr::eq(wanted, &victim.wants) {
                return;
            }
            for wait in waits.iter().filter(|w| w.manager == victim.manager) {
                if !seen.contains(&wait.who.as_str()) && blocks(wait, wanted) {
                    seen.push(wait.who.as_str());
                    frontier.push(&wait.wants);
                }
            }
        }
        self.violate(format!(
            "{what}: Deadlock, but no cycle among the section waits: {:?}",
            waits
                .iter()
                .map(|w| format!("{} holds {} wants {}", w.who, w.holding.0, w.wants.0))
                .collect::<Vec<_>>()
        ));
    }

    /// Errors a caller of `op` may meet in this world, derived from what it asked for;
    /// anything else is a violation.
    pub(crate) fn expect_error(&self, what: &str, err: &Error, op: Op) {
        let expected = match err {
            // Injected failures and lost replies can fail any call that reaches the server.
            Error::Connection { .. } => true,
            // Only a wait with a deadline times out; a try makes one attempt and says busy.
            Error::Timeout { .. } => matches!(
                op,
                Op::Acquire { deadline: true, .. } | Op::AcquireAll { deadline: true }
            ),
            // A wait inside a section may close a cycle with another caller's section.
            Error::Deadlock { .. } => matches!(op, Op::Acquire { nested: true, .. }),
            // Places are taken by every acquisition; gone when the budget is full.
            Error::BudgetExhausted { .. } => !matches!(op, Op::Release | Op::ReleaseAll),
            // Only a release by key asks about a lock another exit may have let go.
            Error::NotHeld { .. } => matches!(op, Op::ReleaseKey),
            // A release's unlock can fail or find the lock gone with its session.
            Error::ReleaseFailed { .. } => {
                matches!(
                    op,
                    Op::Release | Op::ReleaseKey | Op::ReleaseAll | Op::AcquireAll { .. }
                )
            }
            Error::LockLost { .. } => matches!(op, Op::Release | Op::ReleaseKey | Op::Section),
            _ => false,
        };
        if !expected {
            self.violate(format!("{what}: {err:?} cannot answer {op:?}"));
        }
    }

    /// After every caller is done: the leaked keys released, every background release run,
    /// then nothing may be held anywhere, and every key must be free for every manager.
    async fn settle(self: &Arc<Self>) {
        let leaked: Vec<_> = std::mem::take(&mut *crate::sync::lock(&self.leaked));
        self.server.quiet();
        for (m, key) in leaked {
            match self.managers[m].release(key.clone()).await {
                Ok(()) | Err(Error::NotHeld { .. }) | Err(Error::ReleaseFailed { .. }) => {}
                Err(err) => self.violate(format!("m{m} release({key}) at the end: {err:?}")),
            }
        }
        sleep(Duration::from_secs(1)).await;
        for (m, manager) in self.managers.iter().enumerate() {
            let held = manager.held_lock_count();
            let used = manager.core.budget.used();
            if held != 0 || used != 0 {
                self.violate(format!(
                    "m{m} with every caller gone: {held} registered, {used} budget places used"
                ));
            }
        }
        let live = self.server.live_sessions();
        if !live.is_empty() {
            self.violate(format!("with every caller gone the server holds {live:?}"));
        }
        for (m, manager) in self.managers.iter().enumerate() {
            for key in KEYS {
                match manager.acquire(key, Some(Duration::from_secs(1))).await {
                    Ok(guard) => drop(guard.release().await),
                    Err(err) => self.violate(format!("m{m} {key} at the end: {err:?}")),
                }
            }
        }
    }
}

async fn check_every_tick(world: Arc<World>) {
    loop {
        world.check();
        sleep(Duration::from_millis(1)).await;
    }
}

/// Ends a random live session now and then, as a server that terminates backends does.
async fn nemesis(world: Arc<World>) {
    let every = Duration::from_millis(world.rng.pick(&[3, 10, 1000]));
    loop {
        sleep(every).await;
        let live = world.server.live_sessions();
        if live.is_empty() {
            continue;
        }
        let id = live[world.rng.below(live.len() as u64) as usize];
        if world.server.end(id, LossCause::SessionClosed) {
            world.note(format_args!("nemesis ends session {id}"));
        }
    }
}
