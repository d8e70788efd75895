//! A simulated lock server and the backend the engine runs on against it.
//!
//! The server holds exclusive and shared locks per target, one session per granted lock, and
//! the fencing tokens it minted. Every backend operation may be delayed (so replies of
//! different sessions arrive in any order), fail before it reaches the server, or lose its
//! reply after the server acted (the session is then ended, as a broken connection is); the
//! nemesis ends live sessions and stalls operations. All of it is drawn from the world's seeded
//! [`Rng`], on the runtime's paused clock.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, sleep, timeout_at};

use super::rng::Rng;
use crate::core::{Backend, Core, Request};
use crate::error::ReleaseFailure;
use crate::{Error, LockKey, LockMode, LockTarget, LossCause, Result};

/// How often, in thousandths, each fault strikes; drawn per world from its seed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Faults {
    /// Longest delay of one operation, before and after the server acts.
    pub(crate) max_delay_ms: u64,
    /// An operation fails before the server sees it.
    pub(crate) fail: u64,
    /// The server acts, and the reply is lost: the session ends.
    pub(crate) reply_lost: u64,
    /// An operation stalls for up to `stall_ms` before it goes on.
    pub(crate) stall: u64,
    pub(crate) stall_ms: u64,
}

/// One session: it holds at most one lock, as the engine's sessions do for a key.
#[derive(Debug)]
pub(crate) struct SessionRecord {
    pub(crate) manager: usize,
    pub(crate) target: i64,
    pub(crate) mode: LockMode,
    pub(crate) holding: bool,
    /// Why and when the server ended it, if it did while it held its lock.
    pub(crate) ended: Option<(LossCause, Instant)>,
}

#[derive(Debug, Default)]
pub(crate) struct Holders {
    pub(crate) exclusive: Option<usize>,
    pub(crate) shared: Vec<usize>,
}

#[derive(Default)]
pub(crate) struct ServerState {
    pub(crate) locks: BTreeMap<i64, Holders>,
    pub(crate) sessions: Vec<SessionRecord>,
    next_token: BTreeMap<i64, i64>,
    /// The session each fencing token was minted for.
    pub(crate) token_session: BTreeMap<i64, usize>,
    /// Each manager's loss detector, woken when one of its sessions ends.
    detectors: Vec<Arc<Notify>>,
}

pub(crate) struct SimServer {
    state: Mutex<ServerState>,
    /// Notified whenever a lock is freed: waiters look again.
    freed: Notify,
    pub(crate) rng: Arc<Rng>,
    faults: Faults,
    /// Set at the end of a world: no more faults.
    quiet: AtomicBool,
}

impl SimServer {
    pub(crate) fn new(rng: Arc<Rng>, faults: Faults) -> Arc<Self> {
        Arc::new(SimServer {
            state: Mutex::default(),
            freed: Notify::new(),
            rng,
            faults,
            quiet: AtomicBool::new(false),
        })
    }

    /// No more faults: the end of a world is judged on a quiet server.
    pub(crate) fn quiet(&self) {
        self.quiet.store(true, Ordering::SeqCst);
    }

    /// Whether a fault striking `per_mille` times in a thousand strikes now.
    fn strikes(&self, per_mille: u64) -> bool {
        !self.quiet.load(Ordering::SeqCst) && self.rng.chance(per_mille)
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, ServerState> {
        crate::sync::lock(&self.state)
    }

    /// A backend for a new manager of this server.
    pub(crate) fn backend(self: &Arc<Self>) -> SimBackend {
        let detector = Arc::new(Notify::new());
        let manager = {
            let mut state = self.state();
            state.detectors.push(Arc::clone(&detector));
            state.detectors.len() - 1
        };
        SimBackend {
            server: Arc::clone(self),
            manager,
            detector,
            detecting: AtomicBool::new(false),
        }
    }

    /// A delay (an await point for cancellations and reorderings), or a stall.
    async fn delay(&self) {
        let ms = if self.strikes(self.faults.stall) {
            self.rng.below(self.faults.stall_ms + 1)
        } else {
            self.rng.below(self.faults.max_delay_ms + 1)
        };
        if ms == 0 {
            tokio::task::yield_now().await;
        } else {
            sleep(Duration::from_millis(ms)).await;
        }
    }

    /// Grants `target` in `mode` to a new session if it is free for that mode.
    fn try_grant(&self, manager: usize, target: i64, mode: LockMode) -> Option<(usize, i64)> {
        let mut state = self.state();
        let holders = state.locks.entry(target).or_default();
        let free = match mode {
            LockMode::Exclusive => holders.exclusive.is_none() && holders.shared.is_empty(),
            LockMode::Shared => holders.exclusive.is_none(),
        };
        if !free {
            return None;
        }
        let id = state.sessions.len();
        let holders = state.locks.get_mut(&target).expect("made above");
        match mode {
            LockMode::Exclusive => holders.exclusive = Some(id),
            LockMode::Shared => holders.shared.push(id),
        }
        state.sessions.push(SessionRecord {
            manager,
            target,
            mode,
            holding: true,
            ended: None,
        });
        let token = mint(&mut state, target, id);
        Some((id, token))
    }

    /// Frees the lock of session `id`, if it still holds it.
    fn free(&self, id: usize) {
        let mut state = self.state();
        let record = &mut state.sessions[id];
        if !record.holding {
            return;
        }
        record.holding = false;
        let target = record.target;
        let holders = state
            .locks
            .get_mut(&target)
            .expect("a held lock has holders");
        if holders.exclusive == Some(id) {
            holders.exclusive = None;
        }
        holders.shared.retain(|&s| s != id);
        drop(state);
        self.freed.notify_waiters();
    }

    /// Ends session `id` from the server's side: its lock goes, and its manager's detector is
    /// woken. False when the session no longer held a lock.
    pub(crate) fn end(&self, id: usize, cause: LossCause) -> bool {
        let detector = {
            let mut state = self.state();
            let record = &mut state.sessions[id];
            if !record.holding {
                return false;
            }
            record.ended = Some((cause, Instant::now()));
            let manager = record.manager;
            Arc::clone(&state.detectors[manager])
        };
        self.free(id);
        detector.notify_one();
        true
    }

    /// The sessions that hold a lock right now.
    pub(crate) fn live_sessions(&self) -> Vec<usize> {
        let state = self.state();
        (0..state.sessions.len())
            .filter(|&id| state.sessions[id].holding)
            .collect()
    }

    fn failure(&self, key: &LockKey) -> Error {
        Error::Connection {
            key: key.clone(),
            reason: "simulated connection failure".into(),
            source: None,
        }
    }
}

fn mint(state: &mut ServerState, target: i64, session: usize) -> i64 {
    let next = state.next_token.entry(target).or_insert(0);
    *next += 1;
    let token = *next;
    state
        .token_session
        .insert(token_key(target, token), session);
    token
}

/// Tokens are per target; the map is keyed by both.
pub(crate) fn token_key(target: i64, token: i64) -> i64 {
    target.wrapping_mul(1_000_003).wrapping_add(token)
}

/// A granted lock's session; dropping it frees the lock, as closing a connection does.
pub(crate) struct SimSession {
    pub(crate) id: usize,
    server: Arc<SimServer>,
}

impl std::fmt::Debug for SimSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimSession({})", self.id)
    }
}

impl Drop for SimSession {
    fn drop(&mut self) {
        self.server.free(self.id);
    }
}

pub(crate) struct SimBackend {
    pub(crate) server: Arc<SimServer>,
    pub(crate) manager: usize,
    detector: Arc<Notify>,
    detecting: AtomicBool,
}

impl SimBackend {
    /// One attempt on the server, between two delays, with the faults of the world.
    async fn attempt(&self, req: &Request<'_>) -> Result<Option<(SimSession, Option<i64>)>> {
        let server = &self.server;
        server.delay().await;
        if server.strikes(server.faults.fail) {
            return Err(server.failure(req.key));
        }
        let Some((id, token)) = server.try_grant(self.manager, req.lock_id, req.mode) else {
            return Ok(None);
        };
        let session = SimSession {
            id,
            server: Arc::clone(server),
        };
        self.reply(req.key, session, token).await.map(Some)
    }

    /// The way back from the server: the reply may be lost (ending the session) or delayed.
    async fn reply(
        &self,
        key: &LockKey,
        session: SimSession,
        token: i64,
    ) -> Result<(SimSession, Option<i64>)> {
        let server = &self.server;
        if server.strikes(server.faults.reply_lost) {
            server.end(session.id, LossCause::SessionClosed);
            return Err(server.failure(key));
        }
        server.delay().await;
        Ok((session, Some(token)))
    }
}

impl Backend for SimBackend {
    type Session = SimSession;

    async fn lock(&self, req: &Request<'_>) -> Result<(SimSession, Option<i64>)> {
        let server = &self.server;
        server.delay().await;
        if server.strikes(server.faults.fail) {
            return Err(server.failure(req.key));
        }
        let (id, token) = loop {
            let freed = server.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(granted) = server.try_grant(self.manager, req.lock_id, req.mode) {
                break granted;
            }
            if req.is_immediate() {
                return Err(req.timed_out());
            }
            match req.deadline {
                Some(deadline) => timeout_at(deadline, freed)
                    .await
                    .map_err(|_| req.timed_out())?,
                None => freed.await,
            }
        };
        let session = SimSession {
            id,
            server: Arc::clone(server),
        };
        self.reply(req.key, session, token).await
    }

    async fn try_lock(&self, req: &Request<'_>) -> Result<Option<(SimSession, Option<i64>)>> {
        self.attempt(req).await
    }

    async fn confirm(
        &self,
        key: &LockKey,
        target: LockTarget,
        session: &mut SimSession,
    ) -> Result<Option<i64>> {
        let server = &self.server;
        server.delay().await;
        let token = {
            let mut state = server.state();
            if state.sessions[session.id].ended.is_some() {
                // As a statement on a connection the server closed: the release is unconfirmed.
                return Err(unconfirmed(key));
            }
            mint(&mut state, target.packed(), session.id)
        };
        server.delay().await;
        Ok(Some(token))
    }

    async fn unlock(
        &self,
        key: &LockKey,
        _target: LockTarget,
        _mode: LockMode,
        session: SimSession,
    ) -> Result<()> {
        let server = &self.server;
        server.delay().await;
        let ended = server.state().sessions[session.id].ended.is_some();
        if ended || server.strikes(server.faults.fail) {
            // Unconfirmed (the server closed the session, or the statement failed): the
            // session is closed rather than kept, which frees the lock.
            drop(session);
            return Err(unconfirmed(key));
        }
        drop(session);
        server.delay().await;
        Ok(())
    }

    fn ended(session: &SimSession) -> Option<LossCause> {
        let state = session.server.state();
        state.sessions[session.id]
            .ended
            .as_ref()
            .map(|(cause, _)| cause.clone())
    }

    fn watch(core: &Arc<Core<Self>>, session_ended: bool) {
        let backend = &core.backend;
        if !backend.detecting.swap(true, Ordering::SeqCst) {
            tokio::spawn(detect(Arc::downgrade(core), Arc::clone(&backend.detector)));
        }
        if session_ended {
            backend.detector.notify_one();
        }
    }
}

/// A release the server did not confirm.
fn unconfirmed(key: &LockKey) -> Error {
    Error::ReleaseFailed {
        key: key.clone(),
        reason: ReleaseFailure::SessionClosed,
        source: None,
    }
}

/// The loss detector: woken when a session of its manager ends (or a registration finds its
/// session already ended), it declares every registered lock on an ended session lost.
async fn detect(core: Weak<Core<SimBackend>>, woken: Arc<Notify>) {
    loop {
        woken.notified().await;
        let Some(core) = core.upgrade() else {
            return;
        };
        for lost in core.watched().await {
            core.declare_lost(&lost.key, lost.generation, lost.ended)
                .await;
        }
    }
}
