//! A lock session: one pooled connection, owned by a task, on which a manager takes and holds
//! any number of locks.
//!
//! Callers never touch the connection. They send a command to the task that owns it and wait
//! for the answer. The task runs every statement to completion whether or not its caller still
//! waits, so a dropped caller cannot leave the connection half-way through a statement (which
//! would force it closed, and every other lock on it with it). When the caller of a granted
//! try has gone, the task unlocks at once, before its next command.
//!
//! The task also keeps the session heard: when no statement has been answered for the
//! heartbeat interval, it sends the cheapest exchange the protocol has. That keeps the server's
//! silence timeout from ending a healthy session, and is how the manager learns that a session,
//! and so every lock on it, is gone: the exchange fails or goes unanswered. A contended lock,
//! waited for on a session of its own, is held through such a task too, once granted
//! ([`LockSession::adopt`]).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use sqlx::AssertSqlSafe;
use std::pin::Pin;
use tokio::sync::{mpsc, oneshot};

use tokio::time::{Instant, Sleep, timeout_at};

use super::errors::{breaks_connection, has_sqlstate};
use super::statements::{Statements, target_args};
use super::wait_session::PgSession;
use crate::core::Liveness;

mod batch;
use crate::{LockMode, LockTarget, LossCause};

/// Why a command did not complete.
#[derive(Debug)]
pub(crate) enum SessionError {
    /// The server refused the statement; the session goes on.
    Database(sqlx::Error),
    /// The session has closed: its connection broke (`Some`), a statement went unanswered for
    /// the statement timeout, or it was already closed when the command arrived.
    Closed(Option<sqlx::Error>),
    /// A statement went unanswered for this long; the session was closed.
    Unanswered(Duration),
    /// The caller's deadline passed before the answer came (any grant is undone).
    Deadline,
    /// The statement ran on another server session than the one set up: the connection goes
    /// through a transaction-pooling proxy. Nothing was taken; the session was closed.
    Pooled,
}

/// What the task of every session needs to know, and whom it tells when it ends.
pub(crate) struct SessionContext {
    pub(crate) statements: Arc<Statements>,
    /// How long a statement may go unanswered before the session is closed.
    pub(crate) statement_timeout: Duration,
    /// How long a session holding no lock stays available before it retires.
    pub(crate) idle_timeout: Duration,
    /// How the task keeps its session heard, if it does.
    pub(crate) heartbeat: Option<Heartbeat>,
    /// The silence after which the server ends a session (`idle_session_timeout`), if set.
    pub(crate) silence: Option<Duration>,
    /// Whether lost locks are reported (the manager detects them).
    pub(crate) report_loss: bool,
}

/// How often a session that has gone unheard is pinged, and how long the answer may take.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Heartbeat {
    /// A session unheard for this long is pinged.
    pub(crate) every: Duration,
    /// A ping unanswered for this long gives the session up: its locks can no longer be
    /// confirmed ([`LossCause::Unverifiable`]).
    pub(crate) answer_within: Duration,
}

/// Told when a session stops being available.
pub(crate) trait SessionEvents: Send + Sync + 'static {
    /// The session holds nothing and has been idle: stop handing it out.
    fn retired(&self, id: u64);
    /// The session closed, and the locks it held went with it (see [`Lease::ended`]).
    fn closed(&self, id: u64);
}

/// A granted try's lease and fencing token, `None` when the lock is held elsewhere.
type TryAnswer = Result<Option<(Lease, Option<i64>)>, SessionError>;

enum Command {
    Try {
        target: LockTarget,
        mode: LockMode,
        reply: oneshot::Sender<TryAnswer>,
    },
    Unlock {
        target: LockTarget,
        mode: LockMode,
        reply: Option<oneshot::Sender<Result<bool, SessionError>>>,
    },
    Mint {
        target: LockTarget,
        reply: oneshot::Sender<Result<Option<i64>, SessionError>>,
    },
}

/// State shared by a session's handles and its task.
#[derive(Default)]
struct Shared {
    /// Commands sent and not yet finished; the least busy session gets the next try.
    queued: AtomicUsize,
    /// Locks granted and not yet unlocked.
    held: AtomicUsize,
    /// False once the session retired or closed: it is handed out no more.
    unavailable: AtomicBool,
    /// Why the session ended, once it has: its locks went with it.
    ended: std::sync::OnceLock<LossCause>,
}

/// A handle on a lock session.
pub(crate) struct LockSession {
    pub(crate) id: u64,
    pub(crate) pid: i32,
    commands: mpsc::UnboundedSender<Command>,
    shared: Arc<Shared>,
    /// How long its locks can be trusted unheard; `None` without a silence timeout.
    liveness: Option<Arc<Liveness>>,
}

impl LockSession {
    /// Starts the task owning `conn` (set up and clean) and returns its handle.
    pub(crate) fn start(
        id: u64,
        conn: PgSession,
        context: Arc<SessionContext>,
        events: Weak<dyn SessionEvents>,
    ) -> Arc<LockSession> {
        Self::spawn(id, conn, context, events, 0)
    }

    /// Takes over `conn`, a session that waited for `target` and now holds it, and returns the
    /// lease on it. The session carries no other lock and is handed out for nothing else; its
    /// task ends (returning the connection clean, or closing it) once the lease is gone.
    pub(crate) fn adopt(
        id: u64,
        conn: PgSession,
        context: Arc<SessionContext>,
        events: Weak<dyn SessionEvents>,
        target: LockTarget,
        mode: LockMode,
    ) -> Lease {
        let session = Self::spawn(id, conn, context, events, 1);
        session.shared.unavailable.store(true, Ordering::SeqCst);
        Lease {
            session,
            target,
            mode,
            armed: true,
        }
    }

    fn spawn(
        id: u64,
        conn: PgSession,
        context: Arc<SessionContext>,
        events: Weak<dyn SessionEvents>,
        held: usize,
    ) -> Arc<LockSession> {
        let (commands, inbox) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            held: AtomicUsize::new(held),
            ..Shared::default()
        });
        let pid = conn.pid;
        let silence = context.silence;
        let liveness = Arc::new(Liveness::new(conn.heard, silence.unwrap_or(Duration::MAX)));
        // Guards expire with the session only where losses are reported at all.
        let shared_liveness =
            (silence.is_some() && context.report_loss).then(|| Arc::clone(&liveness));
        Arc::new_cyclic(|me: &Weak<LockSession>| {
            let task = Task {
                id,
                conn,
                watchdog: Watchdog::new(),
                last_active: Instant::now(),
                liveness: Arc::clone(&liveness),
                inbox,
                pending: None,
                me: me.clone(),
                shared: Arc::clone(&shared),
                context,
                events,
            };
            drop(tokio::spawn(task.run()));
            LockSession {
                id,
                pid,
                commands,
                shared,
                liveness: shared_liveness,
            }
        })
    }

    pub(crate) fn is_available(&self) -> bool {
        !self.shared.unavailable.load(Ordering::SeqCst)
    }

    /// Commands waiting or running on this session.
    pub(crate) fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::SeqCst)
    }

    /// Locks held on this session.
    pub(crate) fn held(&self) -> usize {
        self.shared.held.load(Ordering::SeqCst)
    }

    fn send(&self, command: Command) -> Result<(), SessionError> {
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        self.commands.send(command).map_err(|_| {
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            SessionError::Closed(None)
        })
    }

    /// One try for the lock. With a deadline, stops waiting for the answer when it passes; a
    /// grant that arrives later is undone by the session's task.
    ///
    /// Cancel safe: the try runs to completion on the session's task, which unlocks a grant
    /// nobody is left to receive.
    pub(crate) async fn try_lock(
        &self,
        target: LockTarget,
        mode: LockMode,
        deadline: Option<Instant>,
    ) -> TryAnswer {
        let (reply, answer) = oneshot::channel();
        self.send(Command::Try {
            target,
            mode,
            reply,
        })?;
        let answer = match deadline {
            Some(deadline) => timeout_at(deadline, answer)
                .await
                .map_err(|_| SessionError::Deadline)?,
            None => answer.await,
        };
        answer.unwrap_or(Err(SessionError::Closed(None)))
    }
}

/// A lock granted on a lock session. Dropping it unlocks in the background.
pub(crate) struct Lease {
    session: Arc<LockSession>,
    target: LockTarget,
    mode: LockMode,
    armed: bool,
}

impl Lease {
    /// How long the lock can be trusted without hearing from its session again.
    pub(crate) fn liveness(&self) -> Option<Arc<Liveness>> {
        self.session.liveness.clone()
    }

    /// Why the lock's session ended, once it has.
    pub(crate) fn ended(&self) -> Option<LossCause> {
        self.session.shared.ended.get().cloned()
    }

    /// Unlocks and reports what the server said: `Ok(false)` when the session no longer held
    /// the lock.
    ///
    /// Cancel safe: the unlock runs to completion on the session's task either way.
    pub(crate) async fn unlock(mut self) -> Result<bool, SessionError> {
        self.armed = false;
        let (reply, answer) = oneshot::channel();
        self.session.send(Command::Unlock {
            target: self.target,
            mode: self.mode,
            reply: Some(reply),
        })?;
        answer.await.unwrap_or(Err(SessionError::Closed(None)))
    }

    /// Mints the next fencing token of the lock, on the session that holds it.
    ///
    /// Cancel safe: the token is minted or not; either way the lock stays held.
    pub(crate) async fn mint(&self) -> Result<Option<i64>, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.session.send(Command::Mint {
            target: self.target,
            reply,
        })?;
        answer.await.unwrap_or(Err(SessionError::Closed(None)))
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.armed {
            // Queued behind whatever the session runs now; nothing to wait for. If the session
            // has closed, the lock went with it.
            let _ = self.session.send(Command::Unlock {
                target: self.target,
                mode: self.mode,
                reply: None,
            });
        }
    }
}

impl std::fmt::Debug for Lease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lease")
            .field("session", &self.session.id)
            .field("pid", &self.session.pid)
            .field("target", &self.target)
            .field("mode", &self.mode)
            .finish()
    }
}

/// The task that owns a lock session's connection.
struct Task {
    id: u64,
    conn: PgSession,
    watchdog: Watchdog,
    /// When the last command finished.
    last_active: Instant,
    /// When the session was last heard, shared with the guards of its locks.
    liveness: Arc<Liveness>,
    inbox: mpsc::UnboundedReceiver<Command>,
    me: Weak<LockSession>,
    shared: Arc<Shared>,
    context: Arc<SessionContext>,
    events: Weak<dyn SessionEvents>,
    /// A command taken from the inbox while gathering a batch it did not belong to: the next
    /// to run.
    pending: Option<Command>,
}

/// The connection can no longer be used; the task ends and closes it.
struct Broken;

impl Drop for Task {
    fn drop(&mut self) {
        // However the task ends (its last handle gone, or its runtime shutting down), a
        // connection that may still hold a lock is closed, never pooled, and the holders of
        // those locks are told (a task that ended through `close` has told them already).
        if self.shared.held.load(Ordering::SeqCst) != 0 {
            self.conn.mark_dirty();
            if self.shared.ended.set(LossCause::SessionClosed).is_ok() {
                self.shared.unavailable.store(true, Ordering::SeqCst);
                if let Some(events) = self.events.upgrade() {
                    events.closed(self.id);
                }
            }
        }
    }
}

impl Task {
    async fn run(mut self) {
        loop {
            let command = match self.next().await {
                Ok(Some(command)) => command,
                // Every handle is gone, so every lease was unlocked: the connection goes back
                // to the pool as the task ends (see `Drop`).
                Ok(None) => return,
                Err(cause) => return self.close(cause),
            };
            let (outcome, ran) = self.execute_queued(command).await;
            self.last_active = Instant::now();
            self.shared.queued.fetch_sub(ran, Ordering::SeqCst);
            if outcome.is_err() {
                // A statement left unanswered past the session's silence bound: the server may
                // have ended the session for it.
                let cause = if self.liveness.expired() {
                    LossCause::Expired
                } else {
                    LossCause::SessionClosed
                };
                return self.close(cause);
            }
        }
    }

    /// The next command. Meanwhile, pings the session whenever it has gone unheard for the
    /// heartbeat interval, and retires it once it has held nothing for the idle timeout. Fails
    /// with the cause of the loss of its locks once the session is gone, or may be.
    async fn next(&mut self) -> Result<Option<Command>, LossCause> {
        loop {
            if self.liveness.expired() {
                // Unheard for longer than the server allows (the process was frozen, or
                // starved): the session may be gone, and its locks with it.
                return Err(LossCause::Expired);
            }
            if let Some(command) = self.pending.take() {
                return Ok(Some(command));
            }
            let held = self.shared.held.load(Ordering::SeqCst);
            let unavailable = self.shared.unavailable.load(Ordering::SeqCst);
            let idle_until =
                (held == 0 && !unavailable).then(|| self.last_active + self.context.idle_timeout);
            // A session is kept heard while it holds locks, and while it is offered for new
            // ones when the server would end it for its silence.
            let keep_heard = held > 0 || (!unavailable && self.context.silence.is_some());
            let ping_at = (self.context.heartbeat)
                .filter(|_| keep_heard)
                .map(|heartbeat| self.liveness.last_heard() + heartbeat.every);
            let Some(wake_at) = [idle_until, ping_at].into_iter().flatten().min() else {
                return Ok(self.inbox.recv().await);
            };
            tokio::select! {
                command = self.inbox.recv() => return Ok(command),
                () = self.watchdog.until(wake_at) => {}
            }
            if idle_until.is_some_and(|at| Instant::now() >= at) {
                self.retire();
            } else if ping_at.is_some_and(|at| Instant::now() >= at) {
                self.ping().await?;
            }
        }
    }

    fn retire(&mut self) {
        if self.shared.held.load(Ordering::SeqCst) == 0 && self.inbox.is_empty() {
            // Handles taken before this still work; the task ends with the last.
            self.shared.unavailable.store(true, Ordering::SeqCst);
            if let Some(events) = self.events.upgrade() {
                events.retired(self.id);
            }
        }
    }

    /// One heartbeat: the server's answer confirms the session and every lock on it.
    async fn ping(&mut self) -> Result<(), LossCause> {
        let Some(heartbeat) = self.context.heartbeat else {
            return Ok(());
        };
        if self.liveness.expired() {
            // Woken after a freeze: the silence is what ended the session, whatever a ping
            // would find now.
            return Err(LossCause::Expired);
        }
        let due = Instant::now() + heartbeat.answer_within;
        let answer = tokio::select! {
            biased;
            answer = self.conn.ping() => Some(answer),
            () = self.watchdog.until(due) => None,
        };
        match answer {
            Some(Ok(())) => {
                self.liveness.heard(self.conn.heard);
                Ok(())
            }
            // The server ended the session (terminated, restarted, timed out) or the network
            // did: its locks are free on the server.
            Some(Err(err)) => {
                tracing::debug!(pid = self.conn.pid, error = %err, "lock session heartbeat failed");
                Err(LossCause::NotOnServer)
            }
            // No answer: the locks may be given to someone else meanwhile.
            None => Err(LossCause::Unverifiable),
        }
    }

    /// When a statement sent now must have been answered: the statement timeout, or sooner
    /// the moment the server may end the session for its silence (a statement lost on a dead
    /// network leaves the session silent), after which its locks cannot be counted on.
    fn statement_due(&self) -> Instant {
        let due = Instant::now() + self.context.statement_timeout;
        self.liveness
            .expires_at()
            .map_or(due, |expiry| due.min(expiry))
    }

    fn heard(&mut self, sent: Instant) {
        self.conn.heard = sent;
        self.liveness.heard(sent);
    }

    fn close(mut self, cause: LossCause) {
        self.shared.unavailable.store(true, Ordering::SeqCst);
        // Recorded before anyone is told, so the locks registered from now on see it.
        let _ = self.shared.ended.set(cause);
        self.conn.mark_dirty();
        // Commands still queued are answered "closed" as their senders see the channel drop.
        self.inbox.close();
        if let Some(events) = self.events.upgrade() {
            events.closed(self.id);
        }
    }

    async fn execute(&mut self, command: Command) -> Result<(), Broken> {
        match command {
            Command::Try {
                target,
                mode,
                reply,
            } => self.try_lock(target, mode, reply).await,
            Command::Unlock {
                target,
                mode,
                reply,
            } => {
                let result = self.unlock(target, mode).await;
                let broken = match &result {
                    Err(
                        SessionError::Closed(_)
                        | SessionError::Unanswered(_)
                        | SessionError::Pooled,
                    ) => true,
                    // The server refused the unlock (a cancelled statement, a statement
                    // timeout): the lock may still be held. Released for sure, or the session
                    // is closed, which frees it.
                    Err(SessionError::Database(_)) => self.reconcile(target, mode).await.is_err(),
                    _ => false,
                };
                if let Some(reply) = reply {
                    let _ = reply.send(result);
                }
                if broken { Err(Broken) } else { Ok(()) }
            }
            Command::Mint { target, reply } => {
                let result = self.mint(target).await;
                let broken = matches!(
                    result,
                    Err(SessionError::Closed(_) | SessionError::Unanswered(_))
                );
                let _ = reply.send(result);
                if broken { Err(Broken) } else { Ok(()) }
            }
        }
    }

    async fn try_lock(
        &mut self,
        target: LockTarget,
        mode: LockMode,
        reply: oneshot::Sender<TryAnswer>,
    ) -> Result<(), Broken> {
        let statement = self.context.statements.try_lock(mode, target);
        let args = target_args(target, self.conn.pid);
        let query = sqlx::query_as_with::<_, (Option<bool>, Option<i64>), _>(
            AssertSqlSafe(statement),
            args,
        );
        let sent = Instant::now();
        let due = self.statement_due();
        let answer = bounded(&mut self.watchdog, due, query.fetch_one(self.conn.conn())).await;
        let (granted, token) = match self.settle(sent, answer) {
            Ok(row) => row,
            Err(SessionError::Database(err)) => {
                // A fenced try can fail after its lock was granted (the mint failed), and a
                // session lock survives the failed statement: make sure it is not held.
                self.reconcile(target, mode).await?;
                let _ = reply.send(Err(SessionError::Database(err)));
                return Ok(());
            }
            Err(err) => {
                let _ = reply.send(Err(err));
                return Err(Broken);
            }
        };
        let Some(granted) = granted else {
            let _ = reply.send(Err(SessionError::Pooled));
            return Err(Broken);
        };
        if !granted {
            let _ = reply.send(Ok(None));
            return Ok(());
        }
        if self.deliver(target, mode, token, reply) {
            Ok(())
        } else {
            self.undo(target, mode).await
        }
    }

    /// Hands a granted lock to its caller; false when nobody is left to receive it, and the
    /// lock must be taken back before anything else runs here.
    fn deliver(
        &mut self,
        target: LockTarget,
        mode: LockMode,
        token: Option<i64>,
        reply: oneshot::Sender<TryAnswer>,
    ) -> bool {
        self.shared.held.fetch_add(1, Ordering::SeqCst);
        let Some(session) = self.me.upgrade() else {
            // No handle left, so no caller is waiting.
            return false;
        };
        let lease = Lease {
            session,
            target,
            mode,
            armed: true,
        };
        match reply.send(Ok(Some((lease, token)))) {
            Ok(()) => true,
            Err(unsent) => {
                if let Ok(Some((mut lease, _))) = unsent {
                    lease.armed = false;
                }
                false
            }
        }
    }

    async fn undo(&mut self, target: LockTarget, mode: LockMode) -> Result<(), Broken> {
        match self.unlock(target, mode).await {
            Ok(_) => Ok(()),
            // Refused: make sure it is not held, or close the session, which frees it.
            Err(SessionError::Database(_)) => self.reconcile(target, mode).await,
            Err(_) => Err(Broken),
        }
    }

    async fn unlock(&mut self, target: LockTarget, mode: LockMode) -> Result<bool, SessionError> {
        let args = target_args(target, self.conn.pid);
        let query =
            sqlx::query_scalar_with::<_, Option<bool>, _>(Statements::unlock(mode, target), args);
        let sent = Instant::now();
        let due = self.statement_due();
        let answer = bounded(&mut self.watchdog, due, query.fetch_one(self.conn.conn())).await;
        // Whatever the server says, this session no longer holds the lock for us: either it
        // unlocked, or it did not hold it, or the session is about to close.
        self.shared.held.fetch_sub(1, Ordering::SeqCst);
        self.settle(sent, answer)?.ok_or(SessionError::Pooled)
    }

    async fn mint(&mut self, target: LockTarget) -> Result<Option<i64>, SessionError> {
        let Some(statement) = self.context.statements.mint() else {
            return Ok(None);
        };
        let query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(statement)).bind(target.packed());
        let sent = Instant::now();
        let due = self.statement_due();
        let answer = bounded(&mut self.watchdog, due, query.fetch_one(self.conn.conn())).await;
        self.settle(sent, answer).map(Some)
    }

    /// Releases `target` in `mode` if, and only if, this session holds it.
    async fn reconcile(&mut self, target: LockTarget, mode: LockMode) -> Result<(), Broken> {
        let sql = Statements::unlock_if_held(target, mode);
        let query = sqlx::query(AssertSqlSafe(sql));
        let sent = Instant::now();
        let due = self.statement_due();
        let answer = bounded(&mut self.watchdog, due, query.fetch_all(self.conn.conn())).await;
        self.settle(sent, answer).map(|_| ()).map_err(|_| Broken)
    }

    /// Turns a statement's answer into a result, keeping the session only when the statement
    /// completed or the server refused it.
    /// `sent`: when the statement was sent; an answer means the server heard the session then.
    fn settle<T>(
        &mut self,
        sent: Instant,
        answer: Option<Result<T, sqlx::Error>>,
    ) -> Result<T, SessionError> {
        match answer {
            Some(Ok(value)) => {
                self.conn.mark_clean();
                self.heard(sent);
                Ok(value)
            }
            // The session's own prepared statements are missing (26000), or another client's
            // are on it (42P05): the statements run on server sessions of a transaction pooler.
            Some(Err(err)) if has_sqlstate(&err, "26000") || has_sqlstate(&err, "42P05") => {
                self.shared.unavailable.store(true, Ordering::SeqCst);
                Err(SessionError::Pooled)
            }
            Some(Err(err)) if !breaks_connection(&err) => {
                self.conn.mark_clean();
                self.heard(sent);
                Err(SessionError::Database(err))
            }
            // The session is done for: stop handing it out before anyone hears of it, so a
            // caller that retries is given another.
            Some(Err(err)) => {
                self.shared.unavailable.store(true, Ordering::SeqCst);
                Err(SessionError::Closed(Some(err)))
            }
            None => {
                self.shared.unavailable.store(true, Ordering::SeqCst);
                Err(SessionError::Unanswered(self.context.statement_timeout))
            }
        }
    }
}

/// Runs `statement`, or gives up on it (`None`) once `due` has passed without an answer.
async fn bounded<T>(
    watchdog: &mut Watchdog,
    due: Instant,
    statement: impl std::future::Future<Output = T>,
) -> Option<T> {
    tokio::select! {
        biased;
        answer = statement => Some(answer),
        () = watchdog.until(due) => None,
    }
}

/// One timer for a task's time limits (a statement's answer, an idle session's retirement).
/// It is re-armed only when it fires early or must fire sooner, not for every statement:
/// arming a timer per statement costs more than the statement's own client-side work.
struct Watchdog {
    sleep: Pin<Box<Sleep>>,
}

impl Watchdog {
    fn new() -> Self {
        Watchdog {
            sleep: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
        }
    }

    /// Completes once `due` has passed.
    async fn until(&mut self, due: Instant) {
        if self.sleep.deadline() > due {
            self.sleep.as_mut().reset(due);
        }
        loop {
            self.sleep.as_mut().await;
            if Instant::now() >= due {
                return;
            }
            self.sleep.as_mut().reset(due);
        }
    }
}
