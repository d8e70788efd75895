//! The engine shared by every manager this crate ships: the per-key turn queue, the registry of
//! held locks, guards, spans. A `Backend` supplies only "take the lock on the shared server" and
//! "let it go", so the rules that make guards and cancellation safe are written once.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | the backend interface, the acquisition paths |
//! | `registry.rs` | held locks: register, list, release, release all, declare lost |
//! | `guard.rs` | a guard's handle on its registry entry |
//! | `turn.rs` | the per-key FIFO queue of one manager's tasks, and the in-process handoff |
//! | `slots.rs` | the table of per-key queues, which forgets keys nobody waits for |
//! | `budget.rs` | how many locks the manager may hold at once |
//! | `cycles/` | lock-order cycles: among the manager's own callers, and through others by probes |
//! | `options.rs` | what the engine is built with, and the part both managers' builders share |

mod budget;
mod cycles;
mod guard;
mod options;
mod registry;
#[cfg(test)]
mod sim;
mod slots;
mod turn;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use std::sync::{Mutex, MutexGuard};
use tokio::time::Instant;
use tracing::Instrument;

pub(crate) use self::budget::Budget;
use self::budget::Slot;
pub(crate) use self::cycles::{Cycle, Waits};
pub(crate) use self::guard::CoreGuard;
pub(crate) use self::options::{CommonOptions, HandoffLimits, Options};
pub(crate) use self::registry::Watched;
use self::registry::{Granted, State};
#[cfg(test)]
pub(crate) use self::sim::SimBackend;
pub(crate) use self::slots::Slots;
use self::turn::TurnPermit;
use crate::hooks::{Stage, StageHook};
pub(crate) use crate::loss::Liveness;
use crate::telemetry::outcome;
use crate::telemetry::spans::{self, Outcome};
use crate::wait::{AcquireOptions, Wait};
use crate::{Error, LockInfo, LockKey, LockMode, LockTarget, LossCause, LossSignal, Result};

/// The hasher of the engine's maps, keyed by [`LockKey`]s whose hash is their lock id: a
/// cheap, seeded mix instead of SipHash, which costs more than the rest of a lookup.
#[cfg(not(test))]
pub(crate) type FastHash = foldhash::fast::RandomState;
/// In the crate's own tests, a fixed seed: the simulation replays a seed only if every map
/// iterates in the same order on every run.
#[cfg(test)]
pub(crate) type FastHash = foldhash::fast::FixedState;

/// Whether the simulation planted `$bug` (see `sim/plant.rs`); always false outside the
/// crate's own tests, where the planting site compiles away.
macro_rules! planted {
    ($bug:ident) => {{
        #[cfg(test)]
        let planted = $crate::core::sim::is_planted($crate::core::sim::Bug::$bug);
        #[cfg(not(test))]
        let planted = false;
        planted
    }};
}
pub(crate) use planted;

/// A test hook's pause at one stage of an operation.
type Checkpoint = std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;

/// One acquisition request, as the backend sees it.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) key: &'a LockKey,
    pub(crate) target: LockTarget,
    /// `target` as one number (see `LockTarget::packed`): the fencing table's row.
    pub(crate) lock_id: i64,
    pub(crate) mode: LockMode,
    /// How long the caller will wait: the port's own form, from the caller to the backend
    /// (`Wait::No` and a zero `Wait::For` both make exactly one immediate attempt).
    pub(crate) wait: Wait,
    /// A `Wait::For` turned into an instant when the call started; `None` when there is no
    /// bound, or one too long to be represented (which is waited out like none).
    pub(crate) deadline: Option<Instant>,
}

impl Request<'_> {
    /// True for `try_acquire` and a zero timeout: one attempt, no waiting.
    pub(crate) fn is_immediate(&self) -> bool {
        match self.wait {
            Wait::No => true,
            Wait::For(timeout) => timeout.is_zero(),
            Wait::Forever => false,
        }
    }

    /// The timeout error of this request.
    pub(crate) fn timed_out(&self) -> Error {
        Error::Timeout {
            key: self.key.clone(),
            timeout: self.wait.bound().unwrap_or_default(),
        }
    }

    /// The key, as errors carry it.
    pub(crate) fn name(&self) -> LockKey {
        self.key.clone()
    }
}

/// A granted and registered acquisition, as the engine hands it to its manager: what the
/// public [`LockGuard`](crate::LockGuard) is made of (in `exit.rs`, above the engine, so that the
/// engine never names the public guard nor the guard the backends).
pub(crate) struct Acquired<B: Backend> {
    pub(crate) info: LockInfo,
    pub(crate) loss: LossSignal,
    pub(crate) guard: CoreGuard<B>,
}

/// What a manager needs from the shared lock server.
///
/// Native `async fn`s (not `async_trait`): the trait is only used generically, so its futures
/// are not boxed, which saves an allocation and a large copy per operation.
pub(crate) trait Backend: Send + Sync + 'static {
    /// Whatever keeps a granted lock alive. Dropping it must free the lock (possibly later, in
    /// the background), and must never let a resource that may still hold it be reused.
    type Session: Send + 'static;

    /// Waits for the lock as `req` says. Returns the session and, when the backend mints them,
    /// the acquisition's fencing token.
    fn lock(
        &self,
        req: &Request<'_>,
    ) -> impl Future<Output = Result<(Self::Session, Option<i64>)>> + Send;

    /// One attempt; `None` when someone else holds the lock.
    fn try_lock(
        &self,
        req: &Request<'_>,
    ) -> impl Future<Output = Result<Option<(Self::Session, Option<i64>)>>> + Send;

    /// Hears from the server that `session` still holds its lock, before the lock is handed
    /// to the next local holder (a handoff): the releasing holder's release is confirmed only
    /// then, as an unlock confirms it. When the backend mints fencing tokens, mints the next
    /// holder's in the same exchange, so tokens keep increasing with every acquisition.
    ///
    /// An error is the release's: the lock could not be vouched for, and `session` is dropped.
    fn confirm(
        &self,
        key: &LockKey,
        target: LockTarget,
        session: &mut Self::Session,
    ) -> impl Future<Output = Result<Option<i64>>> + Send;

    /// Lets the lock go and confirms it.
    fn unlock(
        &self,
        key: &LockKey,
        target: LockTarget,
        mode: LockMode,
        session: Self::Session,
    ) -> impl Future<Output = Result<()>> + Send;

    /// How long `session`'s lock can be trusted without hearing from the server again: the
    /// guard's loss signal fires as expired, at the latest when it is next looked at, once
    /// this has passed.
    fn liveness(_session: &Self::Session) -> Option<Arc<Liveness>> {
        None
    }

    /// Why `session` has ended, once it has: every lock on it went with it.
    fn ended(_session: &Self::Session) -> Option<LossCause> {
        None
    }

    /// Called after every registration, so a backend can start watching for lost locks;
    /// `session_ended`: the session of the lock just registered has already ended.
    fn watch(_core: &Arc<Core<Self>>, _session_ended: bool)
    where
        Self: Sized,
    {
    }
}

/// What a loss detector needs from a manager: the locks it holds, and a way to declare one
/// lost. Keeps the detector independent of the backend that feeds it.
pub(crate) trait LockTable: Send + Sync + 'static {
    /// The locks held right now whose sessions have ended.
    fn watched(&self) -> impl Future<Output = Vec<Watched>> + Send;

    /// Declares one acquisition lost; false when it is no longer registered.
    fn declare_lost(
        &self,
        key: &LockKey,
        generation: u64,
        cause: LossCause,
    ) -> impl Future<Output = bool> + Send;
}

impl<B: Backend> LockTable for Core<B> {
    fn watched(&self) -> impl Future<Output = Vec<Watched>> + Send {
        Core::watched(self)
    }

    fn declare_lost(
        &self,
        key: &LockKey,
        generation: u64,
        cause: LossCause,
    ) -> impl Future<Output = bool> + Send {
        Core::declare_lost(self, key, generation, cause)
    }
}

pub(crate) struct Core<B: Backend> {
    pub(crate) backend: B,
    /// A plain mutex: every critical section is a few map operations, never held across an
    /// await, and an async mutex cost more than the rest of the bookkeeping of a lock.
    state: Mutex<State<B::Session>>,
    /// Mirrors `state.held.len()` for the synchronous `held_lock_count`; only changed under
    /// the state lock.
    held: AtomicUsize,
    metrics: crate::telemetry::instruments::Metrics,
    generations: AtomicU64,
    holder_id: Arc<str>,
    tracing: bool,
    hook: Option<StageHook>,
    handoff: Option<HandoffLimits>,
    budget: Arc<Budget>,
    defer_drops: bool,
    /// The waits of callers inside critical sections, to break lock-order cycles.
    waits: Arc<Waits>,
}

impl<B: Backend> Core<B> {
    pub(crate) fn new(backend: B, options: Options) -> Self {
        Core {
            backend,
            state: Mutex::new(State::new()),
            held: AtomicUsize::new(0),
            metrics: options.metrics,
            generations: AtomicU64::new(0),
            holder_id: options.holder_id,
            tracing: options.tracing,
            hook: options.hook,
            handoff: options.handoff,
            budget: options.budget,
            defer_drops: options.defer_drops,
            waits: options.waits,
        }
    }

    pub(crate) fn holder_id(&self) -> &str {
        &self.holder_id
    }

    pub(crate) fn held_lock_count(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// The budget of held locks in force, once there is one.
    pub(crate) fn lock_budget(&self) -> Option<usize> {
        self.budget.limit()
    }

    /// A place in the budget for one more lock, asked for before the server is.
    fn reserve(&self, request: &Request<'_>) -> Result<Slot> {
        self.budget
            .reserve()
            .map_err(|(held, budget)| Error::BudgetExhausted {
                key: request.name(),
                held,
                budget,
            })
    }

    /// The registry, locked.
    fn state(&self) -> MutexGuard<'_, State<B::Session>> {
        crate::sync::lock(&self.state)
    }

    /// Mirrors the registry's size; only called with the state lock held.
    fn set_held(&self, count: usize) {
        let before = self.held.swap(count, Ordering::SeqCst);
        self.metrics.held(count as i64 - before as i64);
    }

    pub(crate) async fn is_held(&self, key: &LockKey) -> bool {
        self.state().held.contains_key(key)
    }

    /// The test hook's pause at `stage`, if a hook is installed. A plain function, so that
    /// without one (always, outside tests) no future is made at all:
    /// `if let Some(pause) = self.checkpoint(..) { pause.await }`.
    #[inline]
    fn checkpoint(&self, stage: Stage, key: &LockKey) -> Option<Checkpoint> {
        self.hook.as_ref().map(|hook| hook(stage, &key.to_string()))
    }

    pub(crate) async fn acquire(
        self: &Arc<Self>,
        key: &LockKey,
        mode: LockMode,
        wait: Wait,
    ) -> Result<Acquired<B>> {
        let target = key.target();
        let lock_id = target.packed();
        let timeout = wait.bound();
        let span = spans::acquire_span(self.tracing, key, lock_id, mode, timeout, self.holder_id());
        let observed = !span.is_none() || self.metrics.is_on();
        // The clock is read here only for a deadline, a span or a metric.
        let started = (observed || timeout.is_some()).then(Instant::now);
        let request = Request {
            key,
            target,
            lock_id,
            mode,
            wait,
            // A timeout too long for the clock (`Duration::MAX`) is waited out like none.
            deadline: timeout.zip(started).and_then(|(t, at)| at.checked_add(t)),
        };
        // Nobody reads the wait: a path of its own, with no recorder kept across the await.
        // (Folded into the path below, with its steps skipped, a cycle measured about 170
        // instructions more.)
        if !observed {
            let result = self.acquire_traced(&request).await;
            if let Err(err) = &result
                && !err.is_timeout()
            {
                spans::warn_failed(None, err, "lock acquisition failed");
            }
            return result;
        }
        let observed = Observed {
            span,
            metric: crate::telemetry::metrics::ACQUIRE,
            mode,
            started: started.unwrap_or_else(Instant::now),
        };
        observed
            .run(
                &self.metrics,
                self.acquire_traced(&request),
                |result| match result {
                    Ok(_) => outcome::ACQUIRED,
                    Err(err) if err.is_timeout() => outcome::TIMEOUT,
                    Err(_) => outcome::ERROR,
                },
            )
            .await
    }

    async fn acquire_traced(self: &Arc<Self>, request: &Request<'_>) -> Result<Acquired<B>> {
        // A caller inside sections of this manager holds keys while it waits: registered, so a
        // wait that would close a cycle fails at once, and one that closes a cycle through
        // other managers fails once probes have found it (see `cycles/`).
        let held = crate::scope::held_by(&self.holder_id);
        if held.is_empty() {
            return self.acquire_waiting(request).await;
        }
        let deadlock = |cycle| Error::Deadlock {
            key: request.name(),
            cycle,
        };
        let waiting = self
            .waits
            .register(request.key, request.mode, held)
            .map_err(deadlock)?;
        tokio::select! {
            biased;
            acquired = self.acquire_waiting(request) => acquired,
            cycle = waiting.closed_a_cycle() => Err(deadlock(cycle)),
        }
    }

    /// Waits for this manager's turn on the key, then for the lock.
    async fn acquire_waiting(self: &Arc<Self>, request: &Request<'_>) -> Result<Acquired<B>> {
        let key = request.key;
        if let Some(pause) = self.checkpoint(Stage::Turn, key) {
            pause.await;
        }
        let turn = self.state().turn(key);
        let (permit, handoff) = if request.is_immediate() {
            (turn.try_take().ok_or_else(|| request.timed_out())?, None)
        } else {
            turn.take(request.mode, request.deadline)
                .await
                .ok_or_else(|| request.timed_out())?
        };
        let granted = match handoff {
            // The previous local holder handed its session over, heard from on the server: the
            // lock never left us.
            Some(handoff) => Granted {
                token: handoff.token,
                session: handoff.session,
                slot: handoff.slot,
                since: handoff.since,
                handoffs: handoff.handoffs,
            },
            None => {
                let slot = self.reserve(request)?;
                if let Some(pause) = self.checkpoint(Stage::Server, key) {
                    pause.await;
                }
                let (session, token) = self.backend.lock(request).await?;
                Granted {
                    session,
                    slot,
                    token,
                    since: Instant::now(),
                    handoffs: 0,
                }
            }
        };
        if let Some(pause) = self.checkpoint(Stage::Register, key) {
            pause.await;
        }
        Ok(self.guard(request, granted, permit).await)
    }

    /// Registers a granted lock and hands out its guard.
    async fn guard(
        self: &Arc<Self>,
        request: &Request<'_>,
        granted: Granted<B::Session>,
        permit: TurnPermit<B::Session>,
    ) -> Acquired<B> {
        let info = self.info(request).with_fencing_token(granted.token);
        let (generation, signal) = self.register(request, granted, permit, info.clone()).await;
        let guard = CoreGuard {
            core: Arc::clone(self),
            key: request.key.clone(),
            lock_id: request.lock_id,
            generation,
            armed: true,
        };
        Acquired {
            info,
            loss: signal,
            guard,
        }
    }

    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        key: &LockKey,
        mode: LockMode,
    ) -> Result<Option<Acquired<B>>> {
        let target = key.target();
        let lock_id = target.packed();
        let span = spans::try_acquire_span(self.tracing, key, lock_id, mode, self.holder_id());
        let request = Request {
            key,
            target,
            lock_id,
            mode,
            wait: Wait::No,
            deadline: None,
        };
        if span.is_none() && !self.metrics.is_on() {
            // Nobody watches: no clock to read, nothing to record.
            let result = self.try_acquire_traced(&request).await;
            if let Err(err) = &result {
                spans::warn_failed(None, err, "lock acquisition failed");
            }
            return result;
        }
        let observed = Observed {
            span,
            metric: crate::telemetry::metrics::TRY_ACQUIRE,
            mode,
            started: Instant::now(),
        };
        observed
            .run(
                &self.metrics,
                self.try_acquire_traced(&request),
                |result| match result {
                    Ok(Some(_)) => outcome::ACQUIRED,
                    Ok(None) => outcome::BUSY,
                    Err(_) => outcome::ERROR,
                },
            )
            .await
    }

    async fn try_acquire_traced(
        self: &Arc<Self>,
        request: &Request<'_>,
    ) -> Result<Option<Acquired<B>>> {
        let key = request.key;
        if let Some(pause) = self.checkpoint(Stage::Turn, key) {
            pause.await;
        }
        let turn = self.state().turn(key);
        let Some(permit) = turn.try_take() else {
            return Ok(None);
        };
        let slot = self.reserve(request)?;
        if let Some(pause) = self.checkpoint(Stage::Server, key) {
            pause.await;
        }
        let Some((session, token)) = self.backend.try_lock(request).await? else {
            return Ok(None);
        };
        let granted = Granted {
            session,
            slot,
            token,
            since: Instant::now(),
            handoffs: 0,
        };
        if let Some(pause) = self.checkpoint(Stage::Register, key) {
            pause.await;
        }
        Ok(Some(self.guard(request, granted, permit).await))
    }

    fn info(&self, request: &Request<'_>) -> LockInfo {
        LockInfo::with_id(
            request.key.clone(),
            request.lock_id,
            request.mode,
            Arc::clone(&self.holder_id),
        )
    }

    /// The port's `lock`: an acquisition that waits, or one attempt.
    pub(crate) async fn lock(
        self: &Arc<Self>,
        key: &LockKey,
        options: AcquireOptions,
    ) -> Result<Option<Acquired<B>>> {
        match options.wait {
            Wait::No => self.try_acquire(key, options.mode).await,
            wait => self.acquire(key, options.mode, wait).await.map(Some),
        }
    }
}

/// An acquisition someone watches (a span, or metrics), as both `acquire` and `try_acquire`
/// report it: under its span, its wait and outcome recorded, and counted as `metric`.
struct Observed {
    span: tracing::Span,
    metric: &'static str,
    mode: LockMode,
    started: Instant,
}

impl Observed {
    async fn run<T>(
        self,
        metrics: &crate::telemetry::instruments::Metrics,
        acquisition: impl Future<Output = Result<T>>,
        ended: impl FnOnce(&Result<T>) -> &'static str,
    ) -> Result<T> {
        let mut recorder = Outcome::new(self.span.clone());
        // `Instrumented` costs a copy of the future and an enter and exit per poll, even of
        // `Span::none()`: skipped when nobody wants the span.
        let result = if self.span.is_none() {
            acquisition.await
        } else {
            acquisition.instrument(self.span).await
        };
        let waited = self.started.elapsed();
        // A field the span did not declare (a try's) is ignored.
        recorder.record(crate::telemetry::WAITED_MS, spans::duration_ms(waited));
        let ended = ended(&result);
        if let Err(err) = &result
            && ended == outcome::ERROR
        {
            spans::warn_failed(recorder.span(), err, "lock acquisition failed");
        }
        recorder.finish(ended, ended == outcome::ERROR);
        metrics.acquisition(self.metric, self.mode, ended, waited);
        result
    }
}
