//! Waiting for a contended lock: in the server's FIFO queue on a wait session of its own, with
//! the deadline enforced by the server, while the manager's connection cap has room for one;
//! beyond it, without a connection, woken by the doorbell (`doorbell.rs`) to try again, and
//! moved into the server's queue as soon as a wait session frees up.
//!
//! A process waits at most once per key at a time: the manager's other tasks that want the
//! key queue in-process behind it (see `core/turn.rs`).

use std::sync::Arc;
use std::time::Duration;

use sqlx::{AssertSqlSafe, Row};
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::{Instant, sleep_until, timeout, timeout_at};

use super::backend::PgBackend;
use super::lock_session::Lease;
use super::wait_session::PgSession;
use crate::core::Request;
use crate::sql::errors::{
    Failure, LOCK_NOT_AVAILABLE, connection_error, has_sqlstate, statement_error,
};
use crate::sql::{MAX_LOCK_TIMEOUT_MS, whole_ms};
use crate::{Error, Result};

/// A wait session's place under the manager's connection cap: a kept session, or a permit to
/// check one out of the pool.
pub(crate) enum WaitSlot {
    Kept(PgSession),
    Permit(OwnedSemaphorePermit),
}

impl PgBackend {
    /// Waits for a lock held elsewhere until it is granted or the request's deadline passes.
    ///
    /// Cancel safe: a wait in the server's queue closes its session when dropped; a wait
    /// without a connection unregisters from the doorbell, and its tries are cancel safe.
    pub(crate) async fn contend(&self, req: &Request<'_>) -> Result<(Lease, Option<i64>)> {
        // A wait inside a critical section may close a cycle through other managers.
        self.doorbell.carry_probes();
        let mut slot = self.free_wait_slot();
        let ring = slot.is_none().then(|| self.doorbell.ring(req.lock_id));
        loop {
            // A wait session kept free by another waiter that just finished counts too.
            let kept = self.idle.kept.notified();
            tokio::pin!(kept);
            kept.as_mut().enable();
            if slot.is_none() && ring.is_some() {
                slot = self.idle.take().map(WaitSlot::Kept);
            }
            if let Some(slot) = slot.take() {
                drop(ring);
                let (session, token) = self.wait(req, slot).await?;
                // From here on it is held like any other lock: kept heard and watched.
                return Ok((self.sessions.adopt(session, req.target, req.mode), token));
            }
            let ring = ring.as_ref().expect("a waiter without a slot rings");
            // Armed before the try: a wake-up while it is in flight is not missed.
            let woken = ring.woken();
            if let Some(granted) = self.try_on_lock_session(req).await? {
                return Ok(granted);
            }
            let deadline = async {
                match req.deadline {
                    Some(deadline) => sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                () = woken => {}
                // The oldest of the manager's waiters gets the next free wait session.
                permit = Arc::clone(&self.wait_slots).acquire_owned() => {
                    slot = permit.ok().map(WaitSlot::Permit);
                }
                () = &mut kept => {}
                () = deadline => return Err(req.timed_out()),
            }
        }
    }

    /// A wait session's place, if the cap has one free right now.
    fn free_wait_slot(&self) -> Option<WaitSlot> {
        if let Some(kept) = self.idle.take() {
            return Some(WaitSlot::Kept(kept));
        }
        let permit = Arc::clone(&self.wait_slots).try_acquire_owned().ok()?;
        Some(WaitSlot::Permit(permit))
    }

    /// Waits for the lock on a session of its own and returns that session, now holding it.
    /// A connection that turns out to have died while pooled is replaced while the deadline
    /// allows.
    async fn wait(
        &self,
        req: &Request<'_>,
        mut slot: WaitSlot,
    ) -> Result<(PgSession, Option<i64>)> {
        let mut retries = 2;
        loop {
            let mut session = match slot {
                WaitSlot::Kept(session) => session,
                WaitSlot::Permit(permit) => self.checkout(req, permit).await?,
            };
            let waited = match self.wait_on(&mut session, req).await {
                Ok(token) => self.confirm(&mut session, req).await.map(|()| token),
                Err(err) => Err(err),
            };
            match waited {
                Ok(token) => return Ok((session, token)),
                Err(Error::Connection { .. })
                    if retries > 0 && req.deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    retries -= 1;
                    let permit = session.take_permit().expect("a wait session has a permit");
                    slot = WaitSlot::Permit(permit);
                    tracing::debug!(key = %req.key, "retrying the wait on another connection");
                }
                Err(err) => return Err(err),
            }
        }
    }

    /// Makes sure a session granted its lock after a long wait is still there. The server
    /// counts a session's silence from the end of its last statement, which the client cannot
    /// date: it knows only when it sent it. After a wait shorter than half the silence timeout,
    /// that is recent enough; after a longer one (or one answered to a process frozen
    /// meanwhile, whose session the server may have ended after the grant), a ping dates the
    /// session's silence afresh, or finds it gone: then the lock is not held and the wait is
    /// made again while the deadline allows.
    async fn confirm(&self, session: &mut PgSession, req: &Request<'_>) -> Result<()> {
        let Some(silence) = self.silence else {
            return Ok(());
        };
        if session.heard.elapsed() < silence / 2 {
            return Ok(());
        }
        match timeout(self.release_timeout, session.ping()).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(err)) => Err(connection_error(req.key, err)),
            Err(_) => Err(Error::Connection {
                key: req.name(),
                reason: "a session granted its lock did not answer a ping".to_owned(),
                source: None,
            }),
        }
    }

    /// A pool checkout, holding `permit`: until the request's deadline, checking out again
    /// whenever the pool's own `acquire_timeout` runs out first; without a deadline, within
    /// the pool's `acquire_timeout`.
    async fn checkout(&self, req: &Request<'_>, permit: OwnedSemaphorePermit) -> Result<PgSession> {
        let mut permit = Some(permit);
        let started = Instant::now();
        loop {
            // sqlx's checkout future is several kilobytes: boxed, it does not bloat every
            // future that awaits a lock.
            let checkout = Box::pin(self.pool.acquire());
            let checked_out = match req.deadline {
                Some(deadline) => match timeout_at(deadline, checkout).await {
                    Ok(checked_out) => checked_out,
                    Err(_) => return Err(req.timed_out()),
                },
                None => checkout.await,
            };
            let err = match checked_out {
                Ok(conn) => {
                    let permit = permit.take().expect("checked out once");
                    return Ok(PgSession::new(conn, Arc::clone(&self.idle)).with_permit(permit));
                }
                Err(err) => err,
            };
            // Asking the server why is bounded by the deadline too.
            let diagnosis = Failure::from_checkout(&self.pool, err, started.elapsed());
            let failure = match req.deadline {
                Some(deadline) => match timeout_at(deadline, diagnosis).await {
                    Ok(failure) => failure,
                    Err(_) => return Err(req.timed_out()),
                },
                None => diagnosis.await,
            };
            match req.deadline {
                // The caller still has time, and waiting may help: check out again.
                Some(deadline) if failure.is_transient() && Instant::now() < deadline => {}
                // The deadline passed while the pool said no: that is the caller's timeout.
                Some(_) if failure.is_transient() => return Err(req.timed_out()),
                _ => return Err(failure.into_error(req.key)),
            }
        }
    }

    async fn wait_on(&self, session: &mut PgSession, req: &Request<'_>) -> Result<Option<i64>> {
        if !session.is_set_up() {
            let set_up = session.set_up(&self.statements.settings);
            let answered = match req.deadline {
                // A set-up cut short leaves the connection mid-statement: it is closed.
                Some(deadline) => timeout_at(deadline, set_up)
                    .await
                    .map_err(|_| req.timed_out())?,
                None => set_up.await,
            };
            let set_up = answered.map_err(|err| statement_error(req.key, err))?;
            self.budget
                .set_default(super::sessions::default_budget(&self.pool, &set_up));
            if set_up.standby && !self.allow_standby {
                // Closed, not kept: a kept session counts as set up, and would be waited on
                // without this check.
                session.mark_dirty();
                return Err(Failure::Standby.into_error(req.key));
            }
            if let Some(refused) = set_up.identity.refusal() {
                session.mark_dirty();
                return Err(refused.into_error(req.key));
            }
        }
        loop {
            let remaining = match req.deadline {
                None => None,
                Some(deadline) => {
                    // Round up, so the server never gives up before the deadline.
                    let left = deadline.saturating_duration_since(Instant::now());
                    match whole_ms(left) {
                        0 => return Err(req.timed_out()),
                        ms => Some(ms),
                    }
                }
            };
            // PostgreSQL takes at most about 24 days; a longer deadline waits in steps.
            let step = remaining.map(|ms| ms.min(MAX_LOCK_TIMEOUT_MS));
            match self.wait_step(session, req, step).await {
                Err(WaitEnd::TimedOut) if step < remaining => continue,
                Err(WaitEnd::TimedOut | WaitEnd::Unanswered) => return Err(req.timed_out()),
                Err(WaitEnd::Failed(err)) => return Err(err),
                Ok(token) => return Ok(token),
            }
        }
    }

    /// One wait message, bounded by the server's `lock_timeout` of `timeout_ms`.
    async fn wait_step(
        &self,
        session: &mut PgSession,
        req: &Request<'_>,
        timeout_ms: Option<u128>,
    ) -> std::result::Result<Option<i64>, WaitEnd> {
        let sql = self.statements.wait(
            req.target,
            req.mode,
            timeout_ms,
            (session.pid, session.server_version()),
        );
        let sent = Instant::now();
        let waiting = sqlx::raw_sql(AssertSqlSafe(sql)).fetch_all(session.conn());
        let answer = match timeout_ms {
            Some(ms) => {
                let server_deadline =
                    Instant::now() + Duration::from_millis(ms as u64) + self.answer_grace;
                match timeout_at(server_deadline, waiting).await {
                    Ok(answer) => answer,
                    // The server did not answer: the session (left dirty) is closed.
                    Err(_) => return Err(WaitEnd::Unanswered),
                }
            }
            None => waiting.await,
        };
        let fenced = self.statements.fencing.is_some();
        let parsed = answer.and_then(|rows| {
            let Some(row) = rows.first() else {
                return Ok(Waited::NoRow);
            };
            // NULL: the message ran on another server session than the one set up (a
            // transaction pooler), and took nothing.
            if row.try_get::<Option<String>, _>(1)?.is_none() {
                return Ok(Waited::Pooled);
            }
            let token = match (fenced, rows.get(1)) {
                (true, Some(row)) => Some(row.try_get::<i64, _>(0)?),
                (true, None) => return Ok(Waited::NoRow),
                (false, _) => None,
            };
            Ok(Waited::Granted(token))
        });
        match parsed {
            Ok(Waited::Granted(token)) => {
                session.heard = sent;
                Ok(token)
            }
            Ok(Waited::Pooled) => Err(WaitEnd::Failed(Error::TransactionPooling {
                key: req.name(),
            })),
            Ok(Waited::NoRow) => Err(WaitEnd::Failed(connection_error(
                req.key,
                sqlx::Error::Protocol("the lock statement returned no row".into()),
            ))),
            Err(err) if has_sqlstate(&err, LOCK_NOT_AVAILABLE) && timeout_ms.is_some() => {
                // Our lock_timeout fired while waiting: nothing was granted.
                session.mark_clean();
                Err(WaitEnd::TimedOut)
            }
            Err(err) => Err(WaitEnd::Failed(statement_error(req.key, err))),
        }
    }
}

/// What a wait message answered.
enum Waited {
    Granted(Option<i64>),
    Pooled,
    NoRow,
}

/// How one wait message ended without a grant.
enum WaitEnd {
    /// The server's `lock_timeout` ran out; the session is clean.
    TimedOut,
    /// The server did not answer within its `lock_timeout` plus a grace; the session is left
    /// mid-statement and is closed as it drops.
    Unanswered,
    Failed(Error),
}
