//! A lock session's connection, and the statements run on it.
//!
//! Whoever runs a statement holds the [`Link`]: the session's task, or a caller on the idle
//! path (see `LockSession::borrow`). Either way a statement is bounded the same way and its
//! answer settled the same way, so the two paths cannot drift apart.

use std::future::{Future, poll_fn};
use std::pin::{Pin, pin};
use std::sync::atomic::Ordering;
use std::task::Poll;
use std::time::Duration;

use sqlx::AssertSqlSafe;
use tokio::time::{Instant, Sleep};

use super::super::statements::{SessionStatements, Statements, target_args};
use super::super::wait_session::PgSession;
use super::{SessionError, Shared};
use crate::sql::errors::{breaks_connection, has_sqlstate};
use crate::{LockMode, LockTarget};

/// A granted flag (NULL on another server session than the one set up) and the fencing token
/// the try minted, if it mints one.
pub(super) type TryRow = (Option<bool>, Option<i64>);

/// The connection of a lock session and the timer that bounds its statements.
pub(super) struct Link {
    pub(super) conn: PgSession,
    watchdog: Watchdog,
    /// This session's tries and unlocks, its backend pid written in.
    statements: SessionStatements,
}

impl Link {
    pub(super) fn new(conn: PgSession, statements: &Statements) -> Self {
        Link {
            statements: statements.for_session(conn.pid),
            conn,
            watchdog: Watchdog::new(),
        }
    }

    /// When a statement sent at `sent` must have been answered: the statement timeout, or
    /// sooner the moment the server may end the session for its silence (a statement lost on a
    /// dead network leaves the session silent), after which its locks cannot be counted on.
    fn due(shared: &Shared, sent: Instant) -> Instant {
        let due = sent + shared.context.statement_timeout;
        shared
            .liveness
            .expires_at()
            .map_or(due, |expiry| due.min(expiry))
    }

    /// One try for `target`.
    pub(super) async fn try_lock(
        &mut self,
        shared: &Shared,
        target: LockTarget,
        mode: LockMode,
    ) -> Result<TryRow, SessionError> {
        let statement = self.statements.try_lock(mode, target);
        let args = target_args(target);
        let query = sqlx::query_as_with::<_, TryRow, _>(AssertSqlSafe(statement), args);
        let (sent, answer) = {
            let statement = pin!(query.fetch_one(self.conn.conn()));
            exchange(&mut self.watchdog, shared, statement).await
        };
        self.settle(shared, sent, answer)
    }

    /// Unlocks `target`: `Ok(false)` when the session did not hold it. Leaves the count of held
    /// locks to the caller.
    pub(super) async fn unlock(
        &mut self,
        shared: &Shared,
        target: LockTarget,
        mode: LockMode,
    ) -> Result<bool, SessionError> {
        let statement = self.statements.unlock(mode, target);
        let args = target_args(target);
        let query = sqlx::query_scalar_with::<_, Option<bool>, _>(AssertSqlSafe(statement), args);
        let (sent, answer) = {
            let statement = pin!(query.fetch_one(self.conn.conn()));
            exchange(&mut self.watchdog, shared, statement).await
        };
        self.settle(shared, sent, answer)?
            .ok_or(SessionError::Pooled)
    }

    /// Mints the next fencing token of `target`; `None` when fencing is off.
    async fn mint(
        &mut self,
        shared: &Shared,
        target: LockTarget,
    ) -> Result<Option<i64>, SessionError> {
        let Some(statement) = shared.context.statements.mint() else {
            return Ok(None);
        };
        let query = sqlx::query_scalar::<_, i64>(AssertSqlSafe(statement)).bind(target.packed());
        let (sent, answer) = {
            let statement = pin!(query.fetch_one(self.conn.conn()));
            exchange(&mut self.watchdog, shared, statement).await
        };
        self.settle(shared, sent, answer).map(Some)
    }

    /// Hears from this session's backend, so every lock on it was held until now; with
    /// fencing on, mints the next fencing token of `target` in the same statement.
    pub(super) async fn confirm(
        &mut self,
        shared: &Shared,
        target: LockTarget,
    ) -> Result<Option<i64>, SessionError> {
        if shared.context.statements.mint().is_some() {
            return self.mint(shared, target).await;
        }
        let query = sqlx::query_scalar::<_, i32>("SELECT pg_catalog.pg_backend_pid()");
        let (sent, answer) = {
            let statement = pin!(query.fetch_one(self.conn.conn()));
            exchange(&mut self.watchdog, shared, statement).await
        };
        if self.settle(shared, sent, answer)? == self.conn.pid {
            Ok(None)
        } else {
            shared.unavailable.store(true, Ordering::SeqCst);
            Err(SessionError::Pooled)
        }
    }

    /// Releases `target` in `mode` if, and only if, this session holds it. Also what brings a
    /// connection left half-way through a statement back in step: sqlx first reads what is
    /// left of the earlier statement's answer.
    pub(super) async fn reconcile(
        &mut self,
        shared: &Shared,
        target: LockTarget,
        mode: LockMode,
    ) -> Result<(), SessionError> {
        let sql = Statements::unlock_if_held(target, mode);
        let query = sqlx::query(AssertSqlSafe(sql));
        let (sent, answer) = {
            let statement = pin!(query.fetch_all(self.conn.conn()));
            exchange(&mut self.watchdog, shared, statement).await
        };
        self.settle(shared, sent, answer).map(|_| ())
    }

    /// Runs `statement` over `ids` and their modes (a batch); the answers in order.
    pub(super) async fn run_batch(
        &mut self,
        shared: &Shared,
        statement: &'static str,
        ids: Vec<i64>,
        modes: Vec<bool>,
    ) -> Result<Vec<Option<bool>>, SessionError> {
        let query = sqlx::query_scalar::<_, Option<bool>>(statement)
            .bind(self.conn.pid)
            .bind(ids)
            .bind(modes);
        let (sent, answer) = {
            let statement = pin!(query.fetch_all(self.conn.conn()));
            exchange(&mut self.watchdog, shared, statement).await
        };
        self.settle(shared, sent, answer)
    }

    /// One heartbeat within `answer_within`: `None` when it went unanswered.
    pub(super) async fn ping(
        &mut self,
        answer_within: Duration,
    ) -> Option<Result<(), sqlx::Error>> {
        let due = Instant::now() + answer_within;
        let ping = pin!(self.conn.ping());
        bounded(&mut self.watchdog, due, ping).await
    }

    /// Turns a statement's answer into a result, keeping the session only when the statement
    /// completed or the server refused it.
    /// `sent`: when the statement was sent; an answer means the server heard the session then.
    fn settle<T>(
        &mut self,
        shared: &Shared,
        sent: Instant,
        answer: Option<Result<T, sqlx::Error>>,
    ) -> Result<T, SessionError> {
        match answer {
            Some(Ok(value)) => {
                self.heard(shared, sent);
                Ok(value)
            }
            // The session's own prepared statements are missing (26000), or another client's
            // are on it (42P05): the statements run on server sessions of a transaction pooler.
            Some(Err(err)) if has_sqlstate(&err, "26000") || has_sqlstate(&err, "42P05") => {
                shared.unavailable.store(true, Ordering::SeqCst);
                Err(SessionError::Pooled)
            }
            Some(Err(err)) if !breaks_connection(&err) => {
                self.heard(shared, sent);
                Err(SessionError::Database(err))
            }
            // The session is done for: stop handing it out before anyone hears of it, so a
            // caller that retries is given another.
            Some(Err(err)) => {
                shared.unavailable.store(true, Ordering::SeqCst);
                Err(SessionError::Closed(Some(err)))
            }
            None => {
                shared.unavailable.store(true, Ordering::SeqCst);
                Err(SessionError::Unanswered(shared.context.statement_timeout))
            }
        }
    }

    /// The server answered a statement sent at `sent`: the connection is in step again, and
    /// the session (with every lock on it) was alive then.
    pub(super) fn heard(&mut self, shared: &Shared, sent: Instant) {
        self.conn.mark_clean();
        self.conn.heard = sent;
        let sent = shared.liveness.heard(sent);
        shared.last_used.fetch_max(sent, Ordering::AcqRel);
    }
}

/// Runs `statement` within the session's statement bound ([`Link::due`]); returns when it was
/// sent (an answer means the server heard the session then) and its answer, `None` when it
/// went unanswered.
///
/// The statement is pinned by the caller and passed by reference, here and to [`bounded`]: a
/// statement future moved down by value is stored again at every level, which made each
/// acquisition copy kilobytes of futures.
async fn exchange<T, F>(
    watchdog: &mut Watchdog,
    shared: &Shared,
    statement: Pin<&mut F>,
) -> (Instant, Option<Result<T, sqlx::Error>>)
where
    F: Future<Output = Result<T, sqlx::Error>>,
{
    // Read before the statement's first poll, which is when it is sent.
    let sent = Instant::now();
    let due = Link::due(shared, sent);
    (sent, bounded(watchdog, due, statement).await)
}

/// Runs `statement`, or gives up on it (`None`) once `due` has passed without an answer.
pub(super) async fn bounded<F: Future>(
    watchdog: &mut Watchdog,
    due: Instant,
    mut statement: Pin<&mut F>,
) -> Option<F::Output> {
    let mut timer = pin!(watchdog.until(due));
    poll_fn(|cx| {
        // The answer first: one that is in counts even when the bound has just passed.
        if let Poll::Ready(answer) = statement.as_mut().poll(cx) {
            return Poll::Ready(Some(answer));
        }
        timer.as_mut().poll(cx).map(|()| None)
    })
    .await
}

/// One timer for a series of time limits (statements' answers, an idle session's retirement).
/// It is re-armed only when it fires early or must fire sooner, not for every statement:
/// arming a timer per statement costs more than the statement's own client-side work.
pub(super) struct Watchdog {
    sleep: Pin<Box<Sleep>>,
}

impl Watchdog {
    pub(super) fn new() -> Self {
        Watchdog {
            sleep: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
        }
    }

    /// Completes once `due` has passed.
    pub(super) async fn until(&mut self, due: Instant) {
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
