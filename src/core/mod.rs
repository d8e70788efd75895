//! The engine shared by every manager this crate ships: the per-key turn queue, the registry of
//! held locks, guards, spans. A `Backend` supplies only "take the lock on the shared server" and
//! "let it go", so the rules that make guards and cancellation safe are written once.

mod slots;
mod turn;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tracing::{Instrument, Span, field::Empty};

pub(crate) use self::slots::Slots;
use self::turn::{Handoff, Turn, TurnPermit};
use crate::telemetry::{self, outcome, via};
use crate::{
    Error, GuardBackend, LockGuard, LockInfo, LockMode, LossCause, LossSignal, Result, lock_id,
};

/// One acquisition request, as the backend sees it.
#[derive(Debug)]
pub(crate) struct Request<'a> {
    pub(crate) key: &'a str,
    pub(crate) lock_id: i64,
    pub(crate) mode: LockMode,
    /// What the caller asked for; `Some(ZERO)` means exactly one immediate attempt.
    pub(crate) timeout: Option<Duration>,
    /// `timeout` turned into an instant when the call started.
    pub(crate) deadline: Option<Instant>,
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

    /// Mints the fencing token of an acquisition that inherited `session` from the previous
    /// local holder (a handoff), so tokens keep increasing with every acquisition.
    fn refence(
        &self,
        _req: &Request<'_>,
        _session: &mut Self::Session,
    ) -> impl Future<Output = Result<Option<i64>>> + Send {
        async { Ok(None) }
    }

    /// Lets the lock go and confirms it.
    fn unlock(
        &self,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        session: Self::Session,
    ) -> impl Future<Output = Result<()>> + Send;

    /// The server-side process holding `session`'s lock, for loss detection.
    fn session_pid(_session: &Self::Session) -> Option<i32> {
        None
    }

    /// Called after every registration, so a backend can start watching for lost locks.
    fn watch(_core: &Arc<Core<Self>>)
    where
        Self: Sized,
    {
    }
}

/// A held lock as the loss detector sees it.
#[derive(Debug, Clone)]
pub(crate) struct Watched {
    pub(crate) key: String,
    pub(crate) generation: u64,
    pub(crate) lock_id: i64,
    pub(crate) mode: LockMode,
    pub(crate) pid: Option<i32>,
    /// When the lock was granted: the last moment it was known to be held, until a probe says
    /// so again.
    pub(crate) registered_at: Instant,
}

/// The await points of lock operations, named so tests can stop an operation at each of them
/// and cancel it there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]
pub enum Stage {
    /// Before waiting for the manager's own turn on the key.
    Turn,
    /// Before asking the server for the lock (pool checkout and the wait).
    Server,
    /// After the server granted the lock, before the registry records it.
    Register,
    /// After the registry forgot the lock, before the unlock is sent.
    Unlock,
}

/// A test hook awaited at every [`Stage`]; it may park the operation there.
#[cfg_attr(not(feature = "testing"), allow(unreachable_pub, dead_code))]
pub type Hook =
    Arc<dyn Fn(Stage, &str) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync + 'static>;

pub(crate) struct Options {
    pub(crate) metrics: crate::metrics::Metrics,
    pub(crate) holder_id: Option<String>,
    pub(crate) tracing: bool,
    pub(crate) hook: Option<Hook>,
    pub(crate) handoff: Option<HandoffLimits>,
}

/// When a holder releases while another task of the same manager waits for the key, the lock
/// goes straight to that task (its session never unlocks), at most `max_handoffs` times in a
/// row and for at most `max_hold` since the server granted it; then it goes back to the server
/// queue, so other processes waiting there get their turn.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HandoffLimits {
    pub(crate) max_handoffs: u32,
    pub(crate) max_hold: Duration,
}

impl HandoffLimits {
    pub(crate) const DEFAULT: HandoffLimits = HandoffLimits {
        max_handoffs: 16,
        max_hold: Duration::from_millis(10),
    };
}

pub(crate) struct Core<B: Backend> {
    pub(crate) backend: B,
    state: Mutex<State<B::Session>>,
    /// Mirrors `state.held.len()` for the synchronous `held_lock_count`; only changed under
    /// the state lock.
    held: AtomicUsize,
    metrics: crate::metrics::Metrics,
    generations: AtomicU64,
    holder_id: Option<String>,
    tracing: bool,
    hook: Option<Hook>,
    handoff: Option<HandoffLimits>,
}

struct State<S: Send + 'static> {
    held: HashMap<String, Held<S>>,
    /// One FIFO turn per key (see `turn.rs`).
    turns: Slots<String, Turn<S>>,
}

struct Held<S: Send + 'static> {
    generation: u64,
    lock_id: i64,
    mode: LockMode,
    signal: LossSignal,
    registered_at: Instant,
    /// When the server granted the lock this session holds (earlier than `registered_at` after
    /// a handoff) and how many handoffs it has been through.
    since: Instant,
    handoffs: u32,
    // Field order matters: the session (which may still hold the lock) goes before the turn,
    // so a local waiter never starts before the lock is at least being let go.
    session: S,
    turn: TurnPermit<S>,
}

/// A granted session about to be registered, with its history.
struct Granted<S: Send + 'static> {
    session: S,
    token: Option<i64>,
    since: Instant,
    handoffs: u32,
}

impl<S: Send + 'static> State<S> {
    fn turn(&mut self, key: &str) -> Arc<Turn<S>> {
        self.turns.get(key)
    }

    fn take_generation(&mut self, key: &str, generation: u64) -> Option<Held<S>> {
        match self.held.get(key) {
            Some(held) if held.generation == generation => self.held.remove(key),
            _ => None,
        }
    }
}

impl<B: Backend> Core<B> {
    pub(crate) fn new(backend: B, options: Options) -> Self {
        Core {
            backend,
            state: Mutex::new(State {
                held: HashMap::new(),
                turns: Slots::new(Turn::default),
            }),
            held: AtomicUsize::new(0),
            metrics: options.metrics,
            generations: AtomicU64::new(0),
            holder_id: options.holder_id,
            tracing: options.tracing,
            hook: options.hook,
            handoff: options.handoff,
        }
    }

    pub(crate) fn holder_id(&self) -> Option<&str> {
        self.holder_id.as_deref()
    }

    pub(crate) fn held_lock_count(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Mirrors the registry's size; only called with the state lock held.
    fn set_held(&self, count: usize) {
        let before = self.held.swap(count, Ordering::SeqCst);
        self.metrics.held(count as i64 - before as i64);
    }

    pub(crate) async fn is_held(&self, key: &str) -> bool {
        self.state.lock().await.held.contains_key(key)
    }

    async fn checkpoint(&self, stage: Stage, key: &str) {
        if let Some(hook) = &self.hook {
            hook(stage, key).await;
        }
    }

    pub(crate) async fn acquire(
        self: &Arc<Self>,
        key: &str,
        mode: LockMode,
        timeout: Option<Duration>,
    ) -> Result<LockGuard> {
        let lock_id = lock_id(key);
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::ACQUIRE_SPAN,
                { telemetry::KEY } = key,
                { telemetry::LOCK_ID } = lock_id,
                { telemetry::MODE } = mode.as_str(),
                { telemetry::TIMEOUT_MS } = Empty,
                { telemetry::HOLDER_ID } = self.holder_id(),
                { telemetry::OUTCOME } = Empty,
                { telemetry::WAITED_MS } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        if let Some(timeout) = timeout {
            span.record(telemetry::TIMEOUT_MS, duration_ms(timeout));
        }
        let mut recorder = Outcome::new(span.clone());
        let started = Instant::now();
        let result = self
            .acquire_traced(key, lock_id, mode, timeout, started)
            .instrument(span.clone())
            .await;
        let waited = started.elapsed();
        span.record(telemetry::WAITED_MS, duration_ms(waited));
        let ended = match &result {
            Ok(_) => outcome::ACQUIRED,
            Err(err) if err.is_timeout() => outcome::TIMEOUT,
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "lock acquisition failed");
                outcome::ERROR
            }
        };
        recorder.finish(ended, ended == outcome::ERROR);
        self.metrics
            .acquisition(telemetry::metrics::ACQUIRE, mode, ended, waited);
        result
    }

    async fn acquire_traced(
        self: &Arc<Self>,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        timeout: Option<Duration>,
        started: Instant,
    ) -> Result<LockGuard> {
        let deadline = timeout.map(|t| started + t);
        self.checkpoint(Stage::Turn, key).await;
        let turn = self.state.lock().await.turn(key);
        let (permit, handoff) = match timeout {
            Some(t) if t.is_zero() => {
                (turn.try_take().ok_or_else(|| Error::timeout(key, t))?, None)
            }
            _ => turn
                .take(mode, deadline)
                .await
                .ok_or_else(|| Error::timeout(key, timeout.unwrap_or_default()))?,
        };
        let request = Request {
            key,
            lock_id,
            mode,
            timeout,
            deadline,
        };
        let granted = match handoff {
            // The previous local holder handed its session over: the lock never left us.
            Some(mut handoff) => Granted {
                token: self.backend.refence(&request, &mut handoff.session).await?,
                session: handoff.session,
                since: handoff.since,
                handoffs: handoff.handoffs,
            },
            None => {
                self.checkpoint(Stage::Server, key).await;
                let (session, token) = self.backend.lock(&request).await?;
                Granted {
                    session,
                    token,
                    since: Instant::now(),
                    handoffs: 0,
                }
            }
        };
        self.checkpoint(Stage::Register, key).await;
        let info = self
            .info(key, lock_id, mode)
            .with_fencing_token(granted.token);
        let (generation, signal) = self.register(key, lock_id, mode, granted, permit).await;
        let guard = CoreGuard {
            core: Arc::clone(self),
            key: key.to_owned(),
            lock_id,
            generation,
            signal,
            armed: true,
        };
        Ok(LockGuard::new(info, Box::new(guard)))
    }

    pub(crate) async fn try_acquire(
        self: &Arc<Self>,
        key: &str,
        mode: LockMode,
    ) -> Result<Option<LockInfo>> {
        let lock_id = lock_id(key);
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::TRY_ACQUIRE_SPAN,
                { telemetry::KEY } = key,
                { telemetry::LOCK_ID } = lock_id,
                { telemetry::MODE } = mode.as_str(),
                { telemetry::HOLDER_ID } = self.holder_id(),
                { telemetry::OUTCOME } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let mut recorder = Outcome::new(span.clone());
        let started = Instant::now();
        let result = self
            .try_acquire_traced(key, lock_id, mode)
            .instrument(span.clone())
            .await;
        let ended = match &result {
            Ok(Some(_)) => outcome::ACQUIRED,
            Ok(None) => outcome::BUSY,
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "lock acquisition failed");
                outcome::ERROR
            }
        };
        recorder.finish(ended, ended == outcome::ERROR);
        self.metrics.acquisition(
            telemetry::metrics::TRY_ACQUIRE,
            mode,
            ended,
            started.elapsed(),
        );
        result
    }

    async fn try_acquire_traced(
        self: &Arc<Self>,
        key: &str,
        lock_id: i64,
        mode: LockMode,
    ) -> Result<Option<LockInfo>> {
        self.checkpoint(Stage::Turn, key).await;
        let turn = self.state.lock().await.turn(key);
        let Some(permit) = turn.try_take() else {
            return Ok(None);
        };
        self.checkpoint(Stage::Server, key).await;
        let request = Request {
            key,
            lock_id,
            mode,
            timeout: Some(Duration::ZERO),
            deadline: None,
        };
        let Some((session, token)) = self.backend.try_lock(&request).await? else {
            return Ok(None);
        };
        let granted = Granted {
            session,
            token,
            since: Instant::now(),
            handoffs: 0,
        };
        self.checkpoint(Stage::Register, key).await;
        let info = self.info(key, lock_id, mode).with_fencing_token(token);
        self.register(key, lock_id, mode, granted, permit).await;
        Ok(Some(info))
    }

    fn info(&self, key: &str, lock_id: i64, mode: LockMode) -> LockInfo {
        LockInfo::from_parts(key, lock_id, self.holder_id.clone(), mode)
    }

    async fn register(
        self: &Arc<Self>,
        key: &str,
        lock_id: i64,
        mode: LockMode,
        granted: Granted<B::Session>,
        turn: TurnPermit<B::Session>,
    ) -> (u64, LossSignal) {
        let generation = self.generations.fetch_add(1, Ordering::Relaxed) + 1;
        let signal = LossSignal::new();
        let held = Held {
            generation,
            lock_id,
            mode,
            signal: signal.clone(),
            registered_at: Instant::now(),
            since: granted.since,
            handoffs: granted.handoffs,
            session: granted.session,
            turn,
        };
        {
            let mut state = self.state.lock().await;
            // Holding the key's turn makes this the only live acquisition of the key here.
            let previous = state.held.insert(key.to_owned(), held);
            debug_assert!(previous.is_none(), "two live acquisitions of one key");
            self.set_held(state.held.len());
        }
        B::watch(self);
        (generation, signal)
    }

    /// The locks held right now, for the loss detector.
    pub(crate) async fn watched(&self) -> Vec<Watched> {
        let state = self.state.lock().await;
        state
            .held
            .iter()
            .map(|(key, held)| Watched {
                key: key.clone(),
                generation: held.generation,
                lock_id: held.lock_id,
                mode: held.mode,
                pid: B::session_pid(&held.session),
                registered_at: held.registered_at,
            })
            .collect()
    }

    /// Declares whatever acquisition of `key` is registered lost (see `declare_lost`).
    pub(crate) async fn declare_key_lost(&self, key: &str, cause: LossCause) -> bool {
        let generation = self
            .state
            .lock()
            .await
            .held
            .get(key)
            .map(|held| held.generation);
        match generation {
            Some(generation) => self.declare_lost(key, generation, cause).await,
            None => false,
        }
    }

    /// Declares the acquisition `generation` of `key` lost: the registry forgets it, its
    /// session is closed (never pooled), its signal fires and the next local waiter may start.
    /// Returns false when that acquisition is no longer registered.
    pub(crate) async fn declare_lost(&self, key: &str, generation: u64, cause: LossCause) -> bool {
        let held = {
            let mut state = self.state.lock().await;
            let held = state.take_generation(key, generation);
            self.set_held(state.held.len());
            // Fire the signal before the registry lock is released: whoever finds the entry
            // gone (a guard's release, an election's check) then also finds it lost.
            if let Some(held) = &held {
                held.signal.declare(cause.clone());
            }
            held
        };
        let Some(held) = held else {
            return false;
        };
        if self.tracing {
            let span = tracing::warn_span!(
                telemetry::LOST_SPAN,
                { telemetry::KEY } = key,
                { telemetry::LOCK_ID } = held.lock_id,
                { telemetry::MODE } = held.mode.as_str(),
                { telemetry::HOLDER_ID } = self.holder_id(),
                { telemetry::CAUSE } = %cause,
                otel.status_code = "ERROR",
            );
            tracing::warn!(parent: &span, %cause, "lock lost");
        }
        self.metrics.lost(&cause);
        // Dropping the entry closes its session (it is not known clean) and ends the turn.
        drop(held);
        true
    }

    /// Removes `key` from the registry, whoever acquired it.
    async fn forget(&self, key: &str) -> Option<Held<B::Session>> {
        let mut state = self.state.lock().await;
        let held = state.held.remove(key);
        self.set_held(state.held.len());
        held
    }

    /// Removes `key` from the registry only if it is still the acquisition `generation`.
    async fn forget_generation(&self, key: &str, generation: u64) -> Option<Held<B::Session>> {
        let mut state = self.state.lock().await;
        let held = state.take_generation(key, generation);
        self.set_held(state.held.len());
        held
    }

    pub(crate) async fn release(&self, key: &str) -> Result<()> {
        let (span, mut recorder) = self.release_span(key, via::KEY);
        let Some(held) = self.forget(key).instrument(span.clone()).await else {
            if self.tracing {
                span.record(telemetry::LOCK_ID, lock_id(key));
            }
            recorder.finish(outcome::NOT_HELD, false);
            return Err(Error::NotHeld {
                key: key.to_owned(),
            });
        };
        self.unlock(key, held, span, recorder).await
    }

    pub(crate) async fn release_all(&self) -> Result<usize> {
        let drained: Vec<(String, Held<B::Session>)> = {
            let mut state = self.state.lock().await;
            let drained = state.held.drain().collect();
            self.set_held(0);
            drained
        };
        // If this future is dropped part-way, the remaining entries drop with it and their
        // sessions close, which frees their locks on the server.
        let mut released = 0;
        for (key, held) in drained {
            let (span, recorder) = self.release_span(&key, via::RELEASE_ALL);
            if self.unlock(&key, held, span, recorder).await.is_ok() {
                released += 1;
            }
        }
        Ok(released)
    }

    async fn release_generation(
        &self,
        key: &str,
        generation: u64,
        how: &'static str,
    ) -> Result<bool> {
        let (span, mut recorder) = self.release_span(key, how);
        match self
            .forget_generation(key, generation)
            .instrument(span.clone())
            .await
        {
            Some(held) => self.unlock(key, held, span, recorder).await.map(|()| true),
            None => {
                if self.tracing {
                    span.record(telemetry::LOCK_ID, lock_id(key));
                }
                recorder.finish(outcome::ALREADY_RELEASED, false);
                Ok(false)
            }
        }
    }

    /// The release span; the lock id and mode are recorded once the entry is known.
    fn release_span(&self, key: &str, how: &'static str) -> (Span, Outcome) {
        let span = if self.tracing {
            tracing::info_span!(
                telemetry::RELEASE_SPAN,
                { telemetry::KEY } = key,
                { telemetry::LOCK_ID } = Empty,
                { telemetry::MODE } = Empty,
                { telemetry::HOLDER_ID } = self.holder_id(),
                { telemetry::RELEASE_VIA } = how,
                { telemetry::OUTCOME } = Empty,
                otel.status_code = Empty,
            )
        } else {
            Span::none()
        };
        let recorder = Outcome::new(span.clone());
        (span, recorder)
    }

    /// Lets go of a lock the registry has already forgotten: hands it to the next local waiter
    /// when the handoff limits allow, otherwise unlocks it on the server and then lets the next
    /// local waiter in.
    async fn unlock(
        &self,
        key: &str,
        held: Held<B::Session>,
        span: Span,
        mut recorder: Outcome,
    ) -> Result<()> {
        self.metrics
            .hold_time(held.mode, held.registered_at.elapsed());
        let Held {
            lock_id,
            mode,
            session,
            turn,
            since,
            handoffs,
            ..
        } = held;
        span.record(telemetry::LOCK_ID, lock_id);
        span.record(telemetry::MODE, mode.as_str());
        self.checkpoint(Stage::Unlock, key).await;
        let within_limits = self.handoff.is_some_and(|limits| {
            handoffs < limits.max_handoffs && since.elapsed() < limits.max_hold
        });
        let (turn, session) = if within_limits {
            let handoff = Handoff {
                session,
                mode,
                since,
                handoffs: handoffs + 1,
            };
            match turn.hand_over(handoff) {
                Ok(()) => {
                    recorder.finish(outcome::HANDED_OVER, false);
                    return Ok(());
                }
                Err((turn, handoff)) => (turn, handoff.session),
            }
        } else {
            (turn, session)
        };
        let result = self
            .backend
            .unlock(key, lock_id, mode, session)
            .instrument(span.clone())
            .await;
        drop(turn);
        match &result {
            Ok(()) => recorder.finish(outcome::RELEASED, false),
            Err(err) => {
                tracing::warn!(parent: &span, error = %err, "lock release unconfirmed");
                recorder.finish(outcome::ERROR, true);
            }
        }
        result
    }
}

/// A guard's handle on its acquisition in the registry.
struct CoreGuard<B: Backend> {
    core: Arc<Core<B>>,
    key: String,
    lock_id: i64,
    generation: u64,
    signal: LossSignal,
    /// False once the acquisition was handed to `release` or `leak`.
    armed: bool,
}

impl<B: Backend> std::fmt::Debug for CoreGuard<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CoreGuard")
            .field("key", &self.key)
            .field("generation", &self.generation)
            .field("armed", &self.armed)
            .finish()
    }
}

#[async_trait]
impl<B: Backend> GuardBackend for CoreGuard<B> {
    async fn release(mut self: Box<Self>) -> Result<bool> {
        let (span, mut recorder) = self.core.release_span(&self.key, via::GUARD);
        // Stay armed until the registry entry is out: if this future is dropped while waiting
        // for the registry, `Drop` still releases.
        let held = self
            .core
            .forget_generation(&self.key, self.generation)
            .instrument(span.clone())
            .await;
        self.armed = false;
        let Some(held) = held else {
            span.record(telemetry::LOCK_ID, self.lock_id);
            return match self.signal.cause() {
                Some(cause) => {
                    recorder.finish(outcome::LOST, true);
                    Err(Error::LockLost {
                        key: std::mem::take(&mut self.key),
                        cause,
                    })
                }
                None => {
                    recorder.finish(outcome::ALREADY_RELEASED, false);
                    Ok(false)
                }
            };
        };
        self.core
            .unlock(&self.key, held, span, recorder)
            .await
            .map(|()| true)
    }

    fn leak(mut self: Box<Self>) {
        self.armed = false;
    }

    fn loss_signal(&self) -> LossSignal {
        self.signal.clone()
    }
}

impl<B: Backend> Drop for CoreGuard<B> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let core = Arc::clone(&self.core);
        let key = std::mem::take(&mut self.key);
        let generation = self.generation;
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to unlock on: drop the entry, which closes its session and so frees
            // the lock on the server.
            if let Ok(mut state) = core.state.try_lock() {
                drop(state.take_generation(&key, generation));
                core.set_held(state.held.len());
            }
            return;
        };
        // Forget the entry now when the registry is free, so `is_held` and
        // `held_lock_count` reflect the drop at once; the unlock itself runs on a task.
        let forgotten = core.state.try_lock().ok().map(|mut state| {
            let held = state.take_generation(&key, generation);
            core.set_held(state.held.len());
            held
        });
        match forgotten {
            // Already released through the manager: nothing of ours is left.
            Some(None) => {}
            Some(Some(held)) => {
                runtime.spawn(async move {
                    let (span, recorder) = core.release_span(&key, via::DROP);
                    let _ = core.unlock(&key, held, span, recorder).await;
                });
            }
            None => {
                runtime.spawn(async move {
                    let _ = core.release_generation(&key, generation, via::DROP).await;
                });
            }
        }
    }
}

/// Records a span's outcome when an operation ends, and `cancelled` if it never does.
pub(crate) struct Outcome {
    span: Span,
    done: bool,
}

impl Outcome {
    fn new(span: Span) -> Self {
        Outcome { span, done: false }
    }

    fn finish(&mut self, outcome: &'static str, failed: bool) {
        self.span.record(telemetry::OUTCOME, outcome);
        if failed {
            self.span.record("otel.status_code", "ERROR");
        }
        self.done = true;
    }
}

impl Drop for Outcome {
    fn drop(&mut self) {
        if !self.done {
            self.span.record(telemetry::OUTCOME, outcome::CANCELLED);
        }
    }
}

fn duration_ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

/// Implements [`LockManager`](crate::LockManager) for a manager type that wraps
/// `core: Arc<Core<_>>`.
macro_rules! delegate_lock_manager {
    ($manager:ty) => {
        #[async_trait::async_trait]
        impl $crate::LockManager for $manager {
            async fn acquire(
                &self,
                key: &str,
                timeout: Option<std::time::Duration>,
            ) -> $crate::Result<$crate::LockGuard> {
                self.core
                    .acquire(key, $crate::LockMode::Exclusive, timeout)
                    .await
            }

            async fn try_acquire(&self, key: &str) -> $crate::Result<Option<$crate::LockInfo>> {
                self.core
                    .try_acquire(key, $crate::LockMode::Exclusive)
                    .await
            }

            async fn acquire_shared(
                &self,
                key: &str,
                timeout: Option<std::time::Duration>,
            ) -> $crate::Result<$crate::LockGuard> {
                self.core
                    .acquire(key, $crate::LockMode::Shared, timeout)
                    .await
            }

            async fn try_acquire_shared(
                &self,
                key: &str,
            ) -> $crate::Result<Option<$crate::LockInfo>> {
                self.core.try_acquire(key, $crate::LockMode::Shared).await
            }

            async fn release(&self, key: &str) -> $crate::Result<()> {
                self.core.release(key).await
            }

            async fn release_all(&self) -> $crate::Result<usize> {
                self.core.release_all().await
            }

            async fn is_held(&self, key: &str) -> bool {
                self.core.is_held(key).await
            }

            fn held_lock_count(&self) -> usize {
                self.core.held_lock_count()
            }

            fn holder_id(&self) -> Option<&str> {
                self.core.holder_id()
            }
        }
    };
}
pub(crate) use delegate_lock_manager;
