//! The lock sessions of one manager: at most a few, opened on demand, handed out least busy
//! first, retired when they have held nothing for a while.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use sqlx::PgPool;
use tokio::sync::{Notify, OnceCell};
use tokio::time::{Instant, timeout, timeout_at};

use super::lock_session::{Lease, LockSession, SessionContext, SessionEvents};
use super::monitor::Monitor;
use super::wait_session::{IdleSessions, PgSession, SetUp};
use crate::core::Budget;
use crate::sql::errors::Failure;
use crate::{LockMode, LockTarget};

pub(crate) struct SessionsConfig {
    /// At most this many lock sessions at once.
    pub(crate) max: usize,
    /// How long a set-up statement of a new session may go unanswered.
    pub(crate) statement_timeout: Duration,
    /// Whether sessions on a standby are accepted.
    pub(crate) allow_standby: bool,
}

pub(crate) struct LockSessions {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    config: SessionsConfig,
    context: Arc<SessionContext>,
    fencing_ready: Arc<OnceCell<()>>,
    /// Set once a lock session of this manager has proved the server's locks exclude.
    server_checked: OnceCell<super::server_check::ServerCheck>,
    monitor: Arc<Monitor>,
    budget: Arc<Budget>,
    /// Where a retired session's connection goes: straight back to the pool.
    returns: Arc<IdleSessions>,
    state: Mutex<State>,
    /// Notified whenever a session opens, fails to open, retires or closes.
    changed: Notify,
    next_id: AtomicU64,
}

#[derive(Default)]
struct State {
    live: Vec<Arc<LockSession>>,
    opening: usize,
    /// How many openings have started; each is numbered by this count.
    attempts: u64,
    /// The latest failed opening, by number.
    failure: Option<(u64, Failure)>,
}

impl LockSessions {
    pub(crate) fn new(
        pool: PgPool,
        config: SessionsConfig,
        context: Arc<SessionContext>,
        fencing_ready: Arc<OnceCell<()>>,
        monitor: Arc<Monitor>,
        budget: Arc<Budget>,
    ) -> Self {
        LockSessions {
            inner: Arc::new(Inner {
                pool,
                config,
                context,
                fencing_ready,
                server_checked: OnceCell::new(),
                monitor,
                budget,
                returns: IdleSessions::new(0, Duration::ZERO),
                state: Mutex::new(State::default()),
                changed: Notify::new(),
                next_id: AtomicU64::new(0),
            }),
        }
    }

    /// Takes over `session`, which waited for `target` and holds it now, as a lock session of
    /// its own: kept heard and watched like the others, and never handed out for other locks.
    pub(crate) fn adopt(&self, session: PgSession, target: LockTarget, mode: LockMode) -> Lease {
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let events: Weak<Inner> = Arc::downgrade(&self.inner);
        LockSession::adopt(
            id,
            session,
            Arc::clone(&self.inner.context),
            events,
            target,
            mode,
        )
    }

    /// The usual case of [`get`](Self::get), with no future to build: an open session, if
    /// there is one.
    pub(crate) fn open_one(&self) -> Option<Arc<LockSession>> {
        let mut state = self.inner.state();
        self.inner.pick(&mut state)
    }

    /// How many lock sessions are open.
    pub(crate) fn open_count(&self) -> usize {
        self.inner.state().live.len()
    }

    /// A lock session to run a try on: the least busy open one, without waiting. Opens one if
    /// none is open, and another in the background when all are busy and the cap allows.
    ///
    /// With a `deadline`, waits for a session until then and only then: an opening that fails
    /// for want of a connection (a full pool, a server refusing more clients) is started again
    /// while time remains, and the deadline's passing is [`Unavailable::Deadline`]. Without
    /// one, waits for the opening under way, which the pool's `acquire_timeout` bounds.
    ///
    /// Cancel safe: openings run on tasks of their own and complete either way.
    pub(crate) async fn get(
        &self,
        deadline: Option<Instant>,
    ) -> Result<Arc<LockSession>, Unavailable> {
        // Only openings started after this call count: an older one may have failed for a
        // reason that no longer holds.
        let mut attempts_before = None;
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.inner.state();
                let seen = *attempts_before.get_or_insert(state.attempts);
                if let Some(best) = self.inner.pick(&mut state) {
                    return Ok(best);
                }
                if let Some((n, failure)) = state.failure.as_ref().filter(|(n, _)| *n > seen) {
                    match deadline {
                        // The caller still has time: this failure is not an answer yet.
                        Some(d) if failure.is_transient() && Instant::now() < d => {
                            attempts_before = Some(*n);
                        }
                        // The deadline passed while no session could be had: a timeout.
                        Some(_) if failure.is_transient() => return Err(Unavailable::Deadline),
                        _ => return Err(Unavailable::Failed(failure.clone())),
                    }
                }
                if state.opening == 0 {
                    self.inner.open_in_background(&mut state);
                }
            }
            match deadline {
                Some(deadline) => {
                    if timeout_at(deadline, changed).await.is_err() {
                        return Err(Unavailable::Deadline);
                    }
                }
                None => changed.await,
            }
        }
    }
}

/// Why no lock session could be had.
#[derive(Debug)]
pub(crate) enum Unavailable {
    /// The caller's deadline passed first.
    Deadline,
    /// Opening one failed.
    Failed(Failure),
}

/// The default budget of held locks: as many as the pool's connections are entitled to in the
/// server's shared lock table, which PostgreSQL sizes at `max_locks_per_transaction` per
/// connection slot. Every pool's connections count against the server's `max_connections`,
/// so the default budgets of all managers together stay within the table's nominal size,
/// whatever the size of the fleet, and the table's spare room stays with the rest of the
/// database.
pub(crate) fn default_budget(pool: &PgPool, set_up: &SetUp) -> usize {
    let connections = pool.options().get_max_connections() as usize;
    set_up
        .max_locks_per_transaction
        .saturating_mul(connections.max(1))
}

/// How many locks a session carries before the manager opens another (up to the cap) to spread
/// them. PostgreSQL walks a session's whole local lock table at the end of every transaction,
/// so each statement on a session holding N locks costs O(N) on the server: about 0.03 ms with
/// none held and 1-2 ms with 10,000, measured on PostgreSQL 15.
pub(super) const SPREAD_AT: usize = 256;

impl State {
    /// The session with the fewest commands waiting, then the fewest locks; ties go to the
    /// oldest, so a quiet manager keeps to one session.
    fn least_busy(&self) -> Option<Arc<LockSession>> {
        self.live
            .iter()
            .min_by_key(|s| (s.queued(), s.held()))
            .cloned()
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        crate::sync::lock(&self.state)
    }

    /// The least busy open session, if one is open; opens another in the background when it
    /// is crowded and the cap allows.
    fn pick(self: &Arc<Self>, state: &mut State) -> Option<Arc<LockSession>> {
        state.live.retain(|session| session.is_available());
        let best = state.least_busy()?;
        let crowded = best.queued() > 0 || best.held() >= SPREAD_AT;
        if crowded && state.live.len() + state.opening < self.config.max {
            self.open_in_background(state);
        }
        Some(best)
    }

    fn open_in_background(self: &Arc<Self>, state: &mut State) {
        state.opening += 1;
        state.attempts += 1;
        drop(tokio::spawn(Arc::clone(self).open(state.attempts)));
    }

    async fn open(self: Arc<Self>, attempt: u64) {
        let opened = self.connect().await;
        {
            let mut state = self.state();
            state.opening -= 1;
            match opened {
                Ok(session) => state.live.push(session),
                Err(failure) => {
                    tracing::debug!(?failure, "could not open a lock session");
                    state.failure = Some((attempt, failure));
                }
            }
        }
        self.changed.notify_waiters();
    }

    /// Checks a connection out (within the pool's `acquire_timeout`), sets it up (each
    /// statement within the statement timeout) and starts its task.
    async fn connect(self: &Arc<Self>) -> std::result::Result<Arc<LockSession>, Failure> {
        let started = Instant::now();
        let conn = match self.pool.acquire().await {
            Ok(conn) => conn,
            Err(err) => {
                return Err(Failure::from_checkout(&self.pool, err, started.elapsed()).await);
            }
        };
        let mut session = PgSession::new(conn, Arc::clone(&self.returns));
        let statements = &self.context.statements;
        let bound = self.config.statement_timeout;
        let unanswered = || Failure::Connection {
            reason: format!("a new lock session's set-up went unanswered for {bound:?}"),
            transient: true,
        };
        let set_up = timeout(bound, session.set_up(&statements.settings))
            .await
            .map_err(|_| unanswered())?
            .map_err(|err| Failure::from_sqlx(&err))?;
        self.budget.set_default(default_budget(&self.pool, &set_up));
        let standby = set_up.standby;
        if standby && !self.config.allow_standby {
            // Closed, not pooled: a connection to a standby is of no use to this pool, and
            // one kept would be handed out again (a set-up session is not checked twice).
            session.mark_dirty();
            return Err(Failure::Standby);
        }
        if let Some(refused) = set_up.identity.refusal() {
            session.mark_dirty();
            return Err(refused);
        }
        // Once per manager, on its first lock session: the proof that the server's advisory
        // locks exclude (a second session of the server is refused a lock this one holds).
        let pid = session.pid;
        let options = self.pool.connect_options();
        let proved = self
            .server_checked
            .get_or_try_init(|| super::server_check::prove(session.conn(), pid, &options, bound));
        if let Err(failure) = proved.await {
            // It may hold the salted lock still: closed, not pooled.
            session.mark_dirty();
            return Err(failure);
        }
        if let Some(table) = &statements.fencing {
            let ready = self
                .fencing_ready
                .get_or_try_init(|| session.prepare_fencing_table(table));
            timeout(bound, ready).await.map_err(|_| unanswered())??;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let me: Weak<Inner> = Arc::downgrade(self);
        Ok(LockSession::start(
            id,
            session,
            Arc::clone(&self.context),
            me,
        ))
    }
}

impl SessionEvents for Inner {
    fn retired(&self, id: u64) {
        self.state().live.retain(|session| session.id != id);
        self.changed.notify_waiters();
    }

    fn closed(&self, id: u64) {
        self.state().live.retain(|session| session.id != id);
        self.changed.notify_waiters();
        // Its locks are out of the manager's hands: the monitor tells their holders.
        self.monitor.session_ended();
    }
}
