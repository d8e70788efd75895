//! A lock session: one pooled connection on which a manager takes and holds any number of
//! locks, and the task that owns it.
//!
//! A statement on the session runs in one of two ways:
//!
//! * **On the idle path**, by the caller itself, when nothing is queued for the session, no
//!   statement is in flight on it and it carries no lock but the caller's own: the caller
//!   borrows the connection ([`LockSession::borrow`]), runs its one statement and puts the
//!   connection back. No message goes through the task.
//!   If the caller goes away before the statement's outcome is settled (dropped mid-flight,
//!   its deadline passed, the server refused it), the guard it borrowed with hands the task a
//!   command to settle it before anything else runs on the session: the lock that statement
//!   may have taken is released if, and only if, the session holds it. A statement that
//!   broke the session hands the task the session to close.
//! * **Through the task**, when the session is busy: the caller sends a command and waits for
//!   the answer. The task runs every statement to completion whether or not its caller still
//!   waits, and unlocks at once a grant nobody is left to receive. Commands queued together
//!   run as one statement (`batch.rs`).
//!
//! Either way a dropped caller never leaves the connection half-way through a statement for
//! anyone else, never disturbs the other locks on the session, and never leaves a lock behind.
//!
//! The task also keeps the session heard: when no statement has been answered for the
//! heartbeat interval, it sends the cheapest exchange the protocol has. That keeps the server's
//! silence timeout from ending a healthy session, and is how the manager learns that a session,
//! and so every lock on it, is gone: the exchange fails or goes unanswered. A contended lock,
//! waited for on a session of its own, is held through such a session too, once granted
//! ([`LockSession::adopt`]).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | the handle, the idle path, leases |
//! | `link.rs` | the connection and the statements run on it, by either path |
//! | `task.rs` | the task: commands, settling, heartbeats, retirement |
//! | `batch.rs` | queued tries and unlocks run as one statement |

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::{Instant, timeout_at};

use super::statements::Statements;
use super::wait_session::PgSession;
use crate::core::Liveness;

mod batch;
mod link;
mod task;

use self::link::{Link, Watchdog};
use self::task::Task;
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
    /// Hear from the session before its lock is handed over (see [`Lease::confirm`]).
    Confirm {
        target: LockTarget,
        reply: oneshot::Sender<Result<Option<i64>, SessionError>>,
    },
    /// A statement on `target` run on the idle path was left unsettled: make sure the session
    /// does not hold `target` before anything else runs.
    Settle { target: LockTarget, mode: LockMode },
    /// A statement on the idle path broke the session: close it.
    Close,
}

/// State shared by a session's handles and its task.
struct Shared {
    /// Commands sent and not yet finished; the least busy session gets the next try, and the
    /// idle path is open only while this is zero.
    queued: AtomicUsize,
    /// Locks granted and not yet unlocked.
    held: AtomicUsize,
    /// False once the session retired or closed: it is handed out no more.
    unavailable: AtomicBool,
    /// Why the session ended, once it has: its locks went with it.
    ended: std::sync::OnceLock<LossCause>,
    /// The connection, while nobody runs a statement on it. Boxed: it changes hands twice per
    /// statement on the idle path, and a pointer is cheaper to move than the connection.
    spot: Mutex<Option<Box<Link>>>,
    /// Notified whenever a caller puts the connection back.
    returned: Notify,
    context: Arc<SessionContext>,
    /// When the session was last heard; shared with the guards of its locks.
    liveness: Arc<Liveness>,
    /// When the latest statement other than a heartbeat was sent, as a reading of `liveness`'s
    /// clock (one conversion serves both): how long the session has been idle.
    last_used: AtomicU64,
}

impl Shared {
    /// The parked connection, if it is parked.
    fn take_parked(&self) -> Option<Box<Link>> {
        crate::sync::lock(&self.spot).take()
    }

    /// Puts the connection back where the task and the callers find it; closes it instead
    /// when the session has ended meanwhile (it may still hold a lock, and nobody will use it
    /// again).
    fn park(&self, mut link: Box<Link>) {
        let mut spot = crate::sync::lock(&self.spot);
        if self.ended.get().is_some() {
            drop(spot);
            link.conn.mark_dirty();
            drop(link);
        } else {
            *spot = Some(link);
            drop(spot);
        }
        self.returned.notify_one();
    }
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
        Lease::new(session, target, mode)
    }

    fn spawn(
        id: u64,
        conn: PgSession,
        context: Arc<SessionContext>,
        events: Weak<dyn SessionEvents>,
        held: usize,
    ) -> Arc<LockSession> {
        let (commands, inbox) = mpsc::unbounded_channel();
        let pid = conn.pid;
        let silence = context.silence;
        let liveness = Arc::new(Liveness::new(conn.heard, silence.unwrap_or(Duration::MAX)));
        // Guards expire with the session only where losses are reported at all.
        let shared_liveness =
            (silence.is_some() && context.report_loss).then(|| Arc::clone(&liveness));
        let shared = Arc::new(Shared {
            queued: AtomicUsize::new(0),
            held: AtomicUsize::new(held),
            unavailable: AtomicBool::new(false),
            ended: std::sync::OnceLock::new(),
            spot: Mutex::new(Some(Box::new(Link::new(conn, &context.statements)))),
            returned: Notify::new(),
            context,
            liveness,
            last_used: AtomicU64::new(0),
        });
        Arc::new_cyclic(|me: &Weak<LockSession>| {
            let task = Task {
                id,
                link: None,
                timer: Watchdog::new(),
                last_active: Instant::now(),
                inbox,
                pending: None,
                me: me.clone(),
                shared: Arc::clone(&shared),
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

    /// The connection, for one statement on the idle path, only while all of these hold:
    ///
    /// * nothing is queued for the task, so nothing is overtaken, and no statement is in
    ///   flight;
    /// * the session carries no lock but the caller's own (none for a try, the one being
    ///   released for an unlock): a caller that stops being polled mid-statement then holds up
    ///   no other lock's heartbeat, and a statement left unsettled is settled exactly (whatever
    ///   the session holds of its target afterwards, that statement took);
    /// * for a new lock, the session is handed out, so its task is sure to keep it heard.
    fn borrow(&self, new_lock: bool) -> Option<Borrowed<'_>> {
        let mut spot = crate::sync::lock(&self.shared.spot);
        let own = usize::from(!new_lock);
        if self.shared.queued.load(Ordering::SeqCst) != 0
            || self.shared.held.load(Ordering::SeqCst) != own
            || (new_lock && !self.is_available())
        {
            return None;
        }
        let link = spot.take()?;
        Some(Borrowed {
            session: self,
            link: Some(link),
            unsettled: None,
        })
    }

    /// One try for the lock. With a deadline, stops waiting for the answer when it passes; a
    /// grant that arrives later is undone.
    ///
    /// Cancel safe: on the idle path, a try dropped before its outcome is settled is settled by
    /// the session's task before anything else runs on the session; through the task, the try
    /// runs to completion there and a grant nobody is left to receive is unlocked.
    pub(crate) async fn try_lock(
        self: &Arc<Self>,
        target: LockTarget,
        mode: LockMode,
        deadline: Option<Instant>,
    ) -> TryAnswer {
        if let Some(borrowed) = self.borrow(true) {
            return self.try_now(borrowed, target, mode, deadline).await;
        }
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

    /// The idle path of [`try_lock`](Self::try_lock).
    async fn try_now(
        self: &Arc<Self>,
        mut borrowed: Borrowed<'_>,
        target: LockTarget,
        mode: LockMode,
        deadline: Option<Instant>,
    ) -> TryAnswer {
        // Until the answer is in, a grant may be on its way: settled by the task if this
        // future is dropped, or the deadline passes.
        borrowed.unsettled = Some(Command::Settle { target, mode });
        let statement = borrowed.link().try_lock(&self.shared, target, mode);
        let answer = match deadline {
            Some(deadline) => timeout_at(deadline, statement)
                .await
                .map_err(|_| SessionError::Deadline)?,
            None => statement.await,
        };
        match answer {
            Ok((Some(true), token)) => {
                borrowed.unsettled = None;
                self.shared.held.fetch_add(1, Ordering::SeqCst);
                Ok(Some((Lease::new(Arc::clone(self), target, mode), token)))
            }
            Ok((Some(false), _)) => {
                borrowed.unsettled = None;
                Ok(None)
            }
            // The statement ran on another server session than the one set up: a
            // transaction pooler is in the way, and the session is of no use.
            Ok((None, _)) => {
                self.shared.unavailable.store(true, Ordering::SeqCst);
                borrowed.unsettled = Some(Command::Close);
                Err(SessionError::Pooled)
            }
            // Refused (a fenced try whose mint failed may hold the lock all the same): made
            // sure it is not held before the caller hears of it, within its deadline (past it,
            // the task does it).
            Err(err @ SessionError::Database(_)) => {
                let reconcile = borrowed.reconcile(target, mode);
                match deadline {
                    Some(deadline) => drop(timeout_at(deadline, reconcile).await),
                    None => reconcile.await,
                }
                Err(err)
            }
            Err(err) => {
                borrowed.unsettled = Some(Command::Close);
                Err(err)
            }
        }
    }
}

/// The connection of a session, borrowed for one statement on the idle path. Dropping it puts
/// the connection back and, when the statement's outcome was not settled, first hands the task
/// the command that settles it: queued before the connection is back, so no other caller can
/// borrow the connection before the task has run it (commands sent meanwhile run before it;
/// none can concern this lock's key, whose turn its caller still had).
struct Borrowed<'a> {
    session: &'a LockSession,
    link: Option<Box<Link>>,
    /// What the task must do if the borrower stops here.
    unsettled: Option<Command>,
}

impl Borrowed<'_> {
    fn link(&mut self) -> &mut Link {
        self.link
            .as_mut()
            .expect("a borrowed connection is put back on drop")
    }

    /// Releases `target` if, and only if, the session holds it, as the task would; the
    /// session is closed when that fails. If this is dropped first, the task does it.
    async fn reconcile(&mut self, target: LockTarget, mode: LockMode) {
        let shared = &self.session.shared;
        let done = self.link().reconcile(shared, target, mode).await;
        self.unsettled = match done {
            Ok(()) => None,
            Err(_) => Some(Command::Close),
        };
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(command) = self.unsettled.take() {
            // A session whose task has ended has closed its connection too (see `park`).
            let _ = self.session.send(command);
        }
        if let Some(link) = self.link.take() {
            self.session.shared.park(link);
        }
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
    fn new(session: Arc<LockSession>, target: LockTarget, mode: LockMode) -> Self {
        Lease {
            session,
            target,
            mode,
            armed: true,
        }
    }

    /// Forgets the lock without unlocking it (someone else takes care of it).
    fn disarm(mut self) {
        self.armed = false;
    }

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
    /// Cancel safe: on the idle path, an unlock dropped before its outcome is settled is
    /// completed by the session's task (which releases the lock if the session still holds
    /// it); through the task, it runs to completion there.
    pub(crate) async fn unlock(mut self) -> Result<bool, SessionError> {
        self.armed = false;
        let (target, mode) = (self.target, self.mode);
        let session = &self.session;
        if let Some(mut borrowed) = session.borrow(false) {
            // Whatever comes of it, this session no longer holds the lock for us.
            session.shared.held.fetch_sub(1, Ordering::SeqCst);
            borrowed.unsettled = Some(Command::Settle { target, mode });
            let result = borrowed.link().unlock(&session.shared, target, mode).await;
            match &result {
                Ok(_) => borrowed.unsettled = None,
                // Refused (a cancelled statement, a statement timeout): the lock may still be
                // held. Released for sure, or the session is closed, which frees it.
                Err(SessionError::Database(_)) => borrowed.reconcile(target, mode).await,
                Err(_) => borrowed.unsettled = Some(Command::Close),
            }
            return result;
        }
        let (reply, answer) = oneshot::channel();
        session.send(Command::Unlock {
            target,
            mode,
            reply: Some(reply),
        })?;
        answer.await.unwrap_or(Err(SessionError::Closed(None)))
    }

    /// Confirms on the server that the session still holds the lock (its backend answered),
    /// before the lock is handed to the next local holder; with fencing on, mints that
    /// holder's token in the same statement.
    ///
    /// Cancel safe: the statement runs to its end on the session's task; the lock stays held
    /// unless the session turns out to have ended, which the session's closing reports.
    pub(crate) async fn confirm(&self) -> Result<Option<i64>, SessionError> {
        let (reply, answer) = oneshot::channel();
        self.session.send(Command::Confirm {
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
